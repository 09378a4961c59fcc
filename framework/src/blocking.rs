//! The one blocking boundary.
//!
//! librdkafka's transaction calls, metadata look-ups and synchronous consumer polls block
//! the calling thread for up to their timeout. They run here, on tokio's blocking pool,
//! never on a worker thread (a worker stalled on `commit_transaction` stalls every task
//! scheduled on it).

use crate::{Error, Result};

/// Runs `call` on the blocking pool and returns its result. `operation` names the call in
/// errors.
pub(crate) async fn blocking<T, F>(operation: &str, call: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    // A test driver's engine runs its blocking work (redb applies, over the in-memory
    // Kafka) in place: on the paused clock a wait for the blocking pool lets timers fire
    // early, and one seed of the simulation would not replay one schedule exactly.
    #[cfg(feature = "testing")]
    if crate::crash::in_driver() {
        return call();
    }
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|join_error| Error::Blocking {
            operation: operation.to_owned(),
            message: join_error.to_string(),
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn runs_off_the_calling_thread_and_returns_the_result() {
        let caller = std::thread::current().id();
        let (ran_on, value) = blocking("probe", || Ok((std::thread::current().id(), 7)))
            .await
            .expect("blocking call");
        assert_ne!(ran_on, caller);
        assert_eq!(value, 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panicking_call_becomes_an_error_naming_it() {
        let result: Result<()> = blocking("exploding call", || panic!("boom")).await;
        let text = result.expect_err("panic must surface").to_string();
        assert!(text.contains("exploding call"), "{text}");
    }
}
