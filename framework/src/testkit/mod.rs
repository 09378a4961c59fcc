//! Kafka for tests: a real Apache Kafka broker and the helpers tests need around it.
//!
//! ```no_run
//! # async fn demo() -> onceflow::Result<()> {
//! use onceflow::testkit::{self, Isolation, OutgoingRecord};
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

mod broker;
mod cluster;
mod pki;
mod postgres;
mod secure;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Result;
use crate::kafka::{self as client, ClientOptions};
pub use crate::kafka::{Isolation, OutgoingRecord, Record};
pub use broker::{KAFKA_VERSION, KeptBroker, LOCAL_IMAGE, OFFICIAL_IMAGE, kafka};
pub use cluster::{Cluster, cluster};
pub use pki::{CLIENT_COMMON_NAME, CertifiedKeyPem, TestPki};
pub use postgres::{Postgres, postgres};
pub use secure::{ALLOWED_PREFIX, LOCKED_PREFIX, SecureKafka, TestUser, secure_kafka};

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
) -> std::result::Result<(), E>
where
    P: FnMut() -> PF,
    PF: Future<Output = std::result::Result<(), E>>,
    U: FnMut() -> UF,
    UF: Future<Output = std::result::Result<(), E>>,
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

/// A broker the tests can talk to.
#[derive(Debug)]
pub struct Kafka {
    options: ClientOptions,
    broker: broker::Broker,
}

impl Kafka {
    /// A handle on a broker that is already running (nothing is started or checked).
    pub fn connect(bootstrap_servers: impl Into<String>) -> Kafka {
        Kafka::connect_with(bootstrap_servers, &[])
    }

    /// A handle on a broker that is already running whose clients (the producer of
    /// [`Kafka::produce`], the readers) are given `properties`, `compression.type` for one.
    pub fn connect_with(
        bootstrap_servers: impl Into<String>,
        properties: &[(&str, &str)],
    ) -> Kafka {
        let properties: Vec<(String, String)> = properties
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        Kafka {
            options: ClientOptions::with_properties(bootstrap_servers, &properties),
            broker: broker::Broker::External,
        }
    }

    /// Whether `topic` exists.
    pub async fn topic_exists(&self, topic: &str) -> Result<bool> {
        Ok(
            client::partition_count(&self.options, topic, DEFAULT_TIMEOUT)
                .await?
                .is_some(),
        )
    }

    /// `host:port` to give clients as `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> &str {
        &self.options.bootstrap_servers
    }

    /// Creates a topic with `partitions` partitions and waits until each has a leader.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        self.create_topic_with(name, partitions, &[]).await
    }

    /// Creates a topic with topic-level `configs` (e.g. `("cleanup.policy", "compact")`).
    pub async fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> Result<()> {
        client::create_topic(&self.options, name, partitions, configs, DEFAULT_TIMEOUT).await
    }

    /// Sets topic-level configuration `name` = `value` on an existing topic (e.g. lower
    /// `max.message.bytes` under a running processor).
    pub async fn alter_topic_config(&self, topic: &str, name: &str, value: &str) -> Result<()> {
        client::alter_topic_config(&self.options, topic, name, value, DEFAULT_TIMEOUT).await
    }

    /// Writes records with an idempotent producer and returns where each landed
    /// (`(partition, offset)`, in order).
    pub async fn produce(
        &self,
        topic: &str,
        records: impl IntoIterator<Item = OutgoingRecord>,
    ) -> Result<Vec<(i32, i64)>> {
        client::produce(
            &self.options,
            topic,
            records.into_iter().collect(),
            DEFAULT_TIMEOUT,
        )
        .await
    }

    /// Reads `topic` from the beginning to its current end under `isolation`, in
    /// partition then offset order.
    pub async fn read_to_end(&self, topic: &str, isolation: Isolation) -> Result<Vec<Record>> {
        client::read_to_end(&self.options, topic, isolation, DEFAULT_TIMEOUT).await
    }

    /// Each partition of `topic` with its last stable offset and high watermark: one
    /// whose last stable offset stays below its high watermark has a transaction open
    /// (or hanging) that every `read_committed` reader stops at.
    pub async fn stable_ends(&self, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>> {
        client::stable_ends(&self.options, topic, DEFAULT_TIMEOUT).await
    }

    /// The offsets `group` has committed on each partition of `topic`.
    pub async fn committed_offsets(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<BTreeMap<i32, Option<i64>>> {
        client::committed_offsets(&self.options, group, topic, DEFAULT_TIMEOUT).await
    }

    /// Bit rot on the broker's disk: overwrites the first byte of the first stored copy of
    /// `needle` (letters, digits, `-`, `_`, `.`) in the log of `topic`'s `partition`, so
    /// the batch holding it fails its CRC when read. Returns the byte's position in its
    /// segment. Only possible on a broker the testkit started.
    pub async fn corrupt(&self, topic: &str, partition: i32, needle: &str) -> Result<u64> {
        self.broker.corrupt(topic, partition, needle).await
    }

    /// Freezes the broker (every client request goes unanswered) until [`Kafka::unpause`].
    /// Only possible on a broker the testkit started.
    pub async fn pause(&self) -> Result<()> {
        self.broker.pause().await
    }

    /// Lets a paused broker go on.
    pub async fn unpause(&self) -> Result<()> {
        self.broker.unpause().await
    }

    /// `true` when the testkit started this broker (and so can pause it).
    pub fn is_managed(&self) -> bool {
        self.broker.is_managed()
    }

    /// The last `lines` lines the broker logged, for failure messages.
    pub async fn log_tail(&self, lines: usize) -> String {
        self.broker.log_tail(lines).await
    }

    /// Leaves the broker running when this process exits, instead of removing its
    /// container, so that later programs can use it (the quickstart's `--keep-broker`).
    /// The container is named `name`, and whoever keeps it removes it:
    /// `docker rm -f <name>`. It goes on advertising [`Kafka::bootstrap_servers`], a
    /// port on this machine. `Ok(None)` when the testkit did not start the broker.
    ///
    /// # Errors
    /// When the container cannot be named `name` (a container of that name exists, a
    /// broker kept earlier perhaps); it is then removed at exit as usual.
    pub async fn keep_running(&self, name: &str) -> Result<Option<KeptBroker>> {
        self.broker
            .keep_running(name, self.bootstrap_servers())
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A pause that fails with `errors` in turn, then succeeds; counts the unpauses.
    async fn pause_failing(errors: &[&str]) -> (std::result::Result<(), String>, usize, usize) {
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
