//! How the engine waits before trying again: a call that failed transiently (a broker
//! slow or briefly away) and a batch that failed.

use std::time::Duration;

use crate::Result;

/// The pause after the `failures`-th failed batch in a row: 100 ms, doubling, at most 5 s.
pub(super) fn abort_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    Duration::from_millis(100 * (1 << doublings)).min(Duration::from_secs(5))
}

/// How long recovery after a failed batch goes on trying a call that fails retriably
/// (a new producer, the group's committed offsets) before the instance stops. A cluster
/// recovering from a fault can take a minute or more: a transaction coordinator that
/// moved loads its state first, and refuses a new producer (`CONCURRENT_TRANSACTIONS`)
/// while the old one's transaction is still being ended. The cluster test's isolated
/// coordinator once kept `init_transactions` timing out for over a minute, which five
/// attempts did not outlast. The consumer is held meanwhile, so the group keeps the
/// instance's partitions. A start waits as long for its first producer
/// (`recovery::first_producer`).
pub(crate) const RECOVERY_PATIENCE: Duration = Duration::from_secs(300);

/// The longest pause between two attempts of [`retry_transient_for`].
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Runs `call` again while it fails with a retriable error (a broker that is slow or
/// briefly away), with growing pauses, at most five times in all.
pub(crate) async fn retry_transient<T, F, Fut>(what: &str, call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    retry_transient_for(what, Duration::ZERO, call).await
}

/// [`retry_transient`], and past its five attempts for as long as `patience` allows (from
/// the first attempt), pausing 500 ms, doubling, at most [`MAX_PAUSE`]. The warnings are
/// rate-limited: the first five, then every power of two.
pub(crate) async fn retry_transient_for<T, F, Fut>(
    what: &str,
    patience: Duration,
    mut call: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(500);
    let mut attempt: u32 = 1;
    loop {
        match call().await {
            Err(error)
                if error.is_retriable()
                    && (attempt < 5 || started.elapsed() + pause <= patience) =>
            {
                if attempt <= 5 || attempt.is_power_of_two() {
                    tracing::warn!(%error, attempt, ?pause, waited = ?started.elapsed(), "{what} failed; trying again");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
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
