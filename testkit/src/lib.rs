//! Kafka for tests: a real Apache Kafka broker and the helpers tests need around it.
//!
//! ```no_run
//! # async fn demo() -> onceflow_testkit::Result<()> {
//! use onceflow_testkit::{self as testkit, Isolation, OutgoingRecord};
//!
//! let kafka = testkit::kafka().await; // one broker per test binary, started on first use
//! let topic = testkit::unique_name("orders");
//! kafka.create_topic(&topic, 3).await?;
//! kafka.produce(&topic, vec![OutgoingRecord::keyed("customer-1", "{\"amount\":5}")]).await?;
//! let seen = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
//! assert_eq!(seen.len(), 1);
//! # Ok(()) }
//! ```
//!
//! Which broker:
//!
//! - `ONCEFLOW_TEST_BOOTSTRAP=host:port` uses a broker that is already running, and starts
//!   nothing.
//! - Otherwise a single-node KRaft broker (combined broker and controller) is started with
//!   testcontainers from `ONCEFLOW_KAFKA_IMAGE`. When that is unset, the image built here
//!   by `docker/kafka/build.sh` ([`LOCAL_IMAGE`]) is used if it exists, else the official
//!   [`OFFICIAL_IMAGE`]. The container is removed when the test binary exits, unless
//!   [`Kafka::keep_running`] was called.
//!
//! Every test should take its own names from [`unique_name`] (topics, groups,
//! transactional IDs), so tests sharing the broker never see each other's data.
//!
//! Also here: a three-node cluster on its own Docker network with faults
//! ([`cluster`]), a broker that requires SASL and TLS ([`secure_kafka`]), test
//! certificates ([`TestPki`]) and a real PostgreSQL server ([`postgres`]).
//!
//! This crate is apart from `onceflow`, so the product carries no testcontainers, no Java
//! and no `unsafe`. Its records are those of onceflow's broker-free test driver
//! ([`onceflow::testing`]), so a test compares what the driver and the broker produce with
//! one type.

mod broker;
mod client;
mod cluster;
mod error;
mod pki;
mod postgres;
mod read;
mod secure;
mod write;

use std::time::Duration;

pub use broker::{KAFKA_VERSION, Kafka, KeptBroker, LOCAL_IMAGE, OFFICIAL_IMAGE, kafka};
pub use cluster::{Cluster, cluster};
pub use error::{Error, Result};
pub use onceflow::testing::{OutgoingRecord, Record};
pub use pki::{CLIENT_COMMON_NAME, CertifiedKeyPem, TestPki};
pub use postgres::{Postgres, postgres};
pub use secure::{ALLOWED_PREFIX, LOCKED_PREFIX, SecureKafka, TestUser, secure_kafka};

/// Which records a reader sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only records of committed transactions (and non-transactional ones), up to the last
    /// stable offset: what every consumer of onceflow's output should use.
    ReadCommitted,
    /// Every record written, including those of open and aborted transactions.
    ReadUncommitted,
}

impl Isolation {
    fn as_config(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}
/// How long helpers wait for the broker before they fail with what they saw.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A name no other test uses: `prefix` followed by a random suffix.
pub fn unique_name(prefix: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &random[..12])
}

/// Times a pause is tried when the container's freezer cannot freeze it in time.
const PAUSE_TRIES: u32 = 5;

/// Pauses a container with `pause`, trying again (at most [`PAUSE_TRIES`] times, 500 ms
/// apart) when runc's cgroup freezer gave up ("unable to freeze"): on a loaded machine
/// freezing is a race that runc's maintainers leave to the caller to retry (seen here on
/// the 2-core machine in 1 of 7 runs of a cluster test). Between tries `unpause` is asked
/// for, in case the failed freeze completed after runc gave up. Any other error, or the
/// last, is returned.
pub(crate) async fn pause_with_retries<P, PF, U, UF, E>(
    mut pause: P,
    mut unpause: U,
) -> Result<(), E>
where
    P: FnMut() -> PF,
    PF: Future<Output = Result<(), E>>,
    U: FnMut() -> UF,
    UF: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut tries = 1;
    loop {
        match pause().await {
            Ok(()) => return Ok(()),
            Err(error) if tries < PAUSE_TRIES && error.to_string().contains("unable to freeze") => {
                eprintln!(
                    "testkit: the freezer could not pause the container ({error}); trying again ({tries} of {PAUSE_TRIES} failed)"
                );
                tries += 1;
                let _ = unpause().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A pause that fails with `errors` in turn, then succeeds; counts the unpauses.
    async fn pause_failing(errors: &[&str]) -> (Result<(), String>, usize, usize) {
        let (pauses, unpauses) = (Cell::new(0), Cell::new(0));
        let result = pause_with_retries(
            || {
                let n = pauses.get();
                pauses.set(n + 1);
                let outcome = errors.get(n).map_or(Ok(()), |e| Err((*e).to_owned()));
                async move { outcome }
            },
            || {
                unpauses.set(unpauses.get() + 1);
                async { Err::<(), String>("container not paused".into()) }
            },
        )
        .await;
        (result, pauses.get(), unpauses.get())
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_the_freezer_refused_is_tried_again_and_other_errors_are_not() {
        let freeze = "OCI runtime pause failed: unable to freeze: unknown";
        assert_eq!(pause_failing(&[freeze, freeze]).await, (Ok(()), 3, 2));
        assert_eq!(
            pause_failing(&["no such container"]).await,
            (Err("no such container".into()), 1, 0)
        );
        let (result, pauses, _) = pause_failing(&[freeze; 9]).await;
        assert_eq!((result, pauses), (Err(freeze.into()), PAUSE_TRIES as usize));
    }
}
