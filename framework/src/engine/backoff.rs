//! How the engine waits before trying again: a call that failed transiently (a broker
//! slow or briefly away) and a batch that failed.

use std::time::Duration;

use crate::Result;

/// The pause after the `failures`-th failed batch in a row: 100 ms, doubling, at most 5 s.
pub(super) fn abort_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    Duration::from_millis(100 * (1 << doublings)).min(Duration::from_secs(5))
}

/// Runs `call` again while it fails with a retriable error (a broker that is slow or
/// briefly away), with growing pauses, at most five times in all.
pub(crate) async fn retry_transient<T, F, Fut>(what: &str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut pause = Duration::from_millis(500);
    let mut attempt = 1;
    loop {
        match call().await {
            Err(error) if error.is_retriable() && attempt < 5 => {
                tracing::warn!(%error, attempt, ?pause, "{what} failed; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::Error;

    fn transient() -> Error {
        Error::Timeout {
            what: "x".into(),
            after: Duration::ZERO,
            detail: String::new(),
        }
    }

    #[test]
    fn failed_batches_back_off_up_to_five_seconds() {
        use std::time::Duration;
        assert_eq!(abort_backoff(1), Duration::from_millis(100));
        assert_eq!(abort_backoff(2), Duration::from_millis(200));
        assert_eq!(abort_backoff(30), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn retriable_failures_are_retried_five_times_at_most() {
        let calls = AtomicU32::new(0);
        let recovered = retry_transient("test", || async {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n < 3 { Err(transient()) } else { Ok(n) }
        })
        .await;
        assert_eq!(recovered.ok(), Some(3));

        calls.store(0, Ordering::SeqCst);
        let never: Result<()> = retry_transient("test", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(transient())
        })
        .await;
        assert!(never.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5);

        calls.store(0, Ordering::SeqCst);
        let fatal: Result<()> = retry_transient("test", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Error::processing("no"))
        })
        .await;
        assert!(fatal.is_err());
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "a non-retriable error is not retried"
        );
    }
}
