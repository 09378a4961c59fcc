//! Engine configuration: what to consume, where to write, how to batch and deliver.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Error, Result};

/// The consumer's partition assignment strategies: eager ones, which the engine's
/// rebalance handling relies on (`kafka/consumer.rs` sets it).
const EAGER_ASSIGNMENT: &str = "range,roundrobin";

/// How strongly effects are tied to input offsets (the guide's "Delivery modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeliveryMode {
    /// One Kafka transaction per batch: outputs, changelog and offsets commit together.
    #[default]
    ExactlyOnce,
    /// No transaction: offsets are committed after outputs are acknowledged. A crash in
    /// between re-processes the batch; events with an ID are still skipped (their dedup
    /// entries are in the changelog), events without one may be output twice.
    AtLeastOnce,
    /// Offsets are committed before the batch is processed. A crash while processing
    /// loses the rest of that batch; nothing is ever output twice.
    AtMostOnce,
}

impl DeliveryMode {
    /// Every mode, in the order the documentation lists them.
    const ALL: [DeliveryMode; 3] = [
        DeliveryMode::ExactlyOnce,
        DeliveryMode::AtLeastOnce,
        DeliveryMode::AtMostOnce,
    ];

    /// The mode's name in settings: `exactly-once`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeliveryMode::ExactlyOnce => "exactly-once",
            DeliveryMode::AtLeastOnce => "at-least-once",
            DeliveryMode::AtMostOnce => "at-most-once",
        }
    }
}

impl std::str::FromStr for DeliveryMode {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        DeliveryMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| Error::Config {
                key: "delivery".into(),
                value: text.into(),
                accepted: "exactly-once, at-least-once or at-most-once".into(),
            })
    }
}

/// What happens to an input record the processor cannot handle (it does not decode, the
/// processor fails permanently or panics, or a transient failure outlasts its retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorPolicy {
    /// Write it to the dead-letter topic, byte for byte with the reason in headers, in the
    /// same transaction as its offset; go on.
    #[default]
    DeadLetter,
    /// Count it, log it, and go on.
    Skip,
    /// Stop the instance without committing the batch.
    Stop,
}

impl ErrorPolicy {
    /// Every policy, in the order the documentation lists them.
    const ALL: [ErrorPolicy; 3] = [
        ErrorPolicy::DeadLetter,
        ErrorPolicy::Skip,
        ErrorPolicy::Stop,
    ];

    /// The policy's name in settings: `dead-letter`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorPolicy::DeadLetter => "dead-letter",
            ErrorPolicy::Skip => "skip",
            ErrorPolicy::Stop => "stop",
        }
    }
}

impl std::str::FromStr for ErrorPolicy {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        ErrorPolicy::ALL
            .into_iter()
            .find(|policy| policy.as_str() == text)
            .ok_or_else(|| Error::Config {
                key: "on_error".into(),
                value: text.into(),
                accepted: "dead-letter, skip or stop".into(),
            })
    }
}

/// A topic onceflow names after the consumer group unless one is configured. This is the
/// one place such names are made; `--help` and `verify-config` show [`GroupTopic::pattern`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupTopic {
    /// The changelog, `<group>-txlog`.
    Changelog,
    /// The dead letters, `<group>-dlq`.
    DeadLetters,
    /// The processor's effect intents, `<group>-effects`.
    Effects,
}

impl GroupTopic {
    /// The name with the group as a placeholder: `<group>-txlog`.
    pub(crate) const fn pattern(self) -> &'static str {
        match self {
            GroupTopic::Changelog => "<group>-txlog",
            GroupTopic::DeadLetters => "<group>-dlq",
            GroupTopic::Effects => "<group>-effects",
        }
    }

    /// The topic's name for `group`: `orders-txlog`.
    pub(crate) fn name(self, group: &str) -> String {
        self.pattern().replacen("<group>", group, 1)
    }
}

/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// Everything the engine needs to run one instance of an operator.
///
/// Its `Debug` output shows secret Kafka properties (`sasl.password`, `ssl.key.pem`, …) as
/// `[redacted]`.
#[derive(Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// `host:port[,host:port…]` of the cluster.
    pub bootstrap_servers: String,
    /// The consumer group: one group is one operator.
    pub group: String,
    /// This instance's ID, unique within the group and stable across restarts: the
    /// transactional ID is `<group>-<instance_id>`, so a restarted instance fences its
    /// previous incarnation.
    pub instance_id: String,
    /// The topic consumed.
    pub input_topic: String,
    /// Topics the processor may emit to; each must exist at start.
    pub output_topics: Vec<String>,
    /// Declared outputs renamed: the processor's name for an output (`invoices`, its
    /// `Self::INVOICES`) → the topic it goes to here (`prod.invoices`). A declared output
    /// not named here goes to the topic of its own name.
    pub renamed_outputs: std::collections::BTreeMap<String, String>,
    /// Where the transaction log lives: `<state_dir>/<group>/<instance_id>/`.
    pub state_dir: PathBuf,
    /// The changelog topic; default `<group>-txlog`.
    pub changelog_topic: Option<String>,
    /// A batch closes after this long (default 100 ms)…
    pub commit_interval: Duration,
    /// …or after this many input records (default 1000), whichever comes first.
    pub max_batch_records: usize,
    /// Delivery mode (default exactly-once).
    pub delivery: DeliveryMode,
    /// Dedup entries older than this expire (default 7 days).
    pub dedup_window: Duration,
    /// At most this many dedup entries per partition, oldest expiring first (default none).
    pub dedup_max_entries: Option<u64>,
    /// Header holding an event ID when the event itself has none.
    pub event_id_header: String,
    /// Treat a record without an event ID (none, or an empty one) as one
    /// that cannot be processed, instead of deduplicating it by offset only (default off).
    pub require_event_id: bool,
    /// Go on when a changelog partition's progress does not reach the group's committed
    /// offset of its input partition (default false: the instance stops with
    /// [`crate::Error::ChangelogBehind`]). For one start after the offsets were moved on
    /// purpose.
    pub accept_changelog_behind: bool,
    /// Replication factor of the changelog and dead-letter topics onceflow creates
    /// (default: the broker's `default.replication.factor`).
    pub changelog_replication_factor: Option<i32>,
    /// Bound on one Kafka transaction, and so on a hung commit and on how long a dead
    /// instance's open transaction stalls `read_committed` readers (default 10 s).
    pub transaction_timeout: Duration,
    /// How long the transaction log may keep a batch's apply in memory only before it is
    /// synced to disk (default 1 s; zero: every batch, one fsync each). A crash loses at
    /// most about this much of the log, and the next start replays it from the changelog.
    pub txlog_sync_interval: Duration,
    /// Bytes of memory the transaction log (redb) may keep as its page cache (default
    /// 16 MiB). More keeps more of a large log in memory; the rest is read from the
    /// operating system's page cache.
    pub txlog_cache_size: usize,
    /// Changelog partitions replayed at the same time when the instance catches up (at
    /// start, after a rebalance or a failed batch; default 1). A replay mostly waits on
    /// the broker, so 8 caught up 64 empty partitions in 3.9 s instead of 16.8 s; each
    /// one at the same time adds two Kafka clients, and 4–8 raised the benchmark's
    /// peak RSS by 12–18 MiB.
    pub replay_concurrency: usize,
    /// Any other librdkafka property, passed to every client unchanged.
    pub kafka_properties: Vec<(String, String)>,
    /// What to do with a record that cannot be processed (default: dead-letter it).
    pub on_error: ErrorPolicy,
    /// The dead-letter topic; default `<group>-dlq`.
    pub dead_letter_topic: Option<String>,
    /// Attempts at a record that fails transiently (default 5)…
    pub max_attempts: u32,
    /// …within at most this long (default 10 s); then it is handled per `on_error`.
    pub max_retry_time: Duration,
    /// The topic [`crate::Context::effect`] writes effect intents to, in the batch's
    /// transaction; `None` (the default): effects are off. See [`crate::effects`].
    pub effects_topic: Option<String>,
    /// How far behind its event time (the highest record timestamp processed) a
    /// partition's event-time timers fire: records up to this late still come before
    /// the timers they precede (default 0).
    pub timer_lateness: Duration,
    /// The wall clock of dedup entries: the system's, or a test driver's.
    pub(crate) clock: crate::clock::Clock,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("group", &self.group)
            .field("instance_id", &self.instance_id)
            .field("input_topic", &self.input_topic)
            .field("output_topics", &self.output_topics)
            .field("renamed_outputs", &self.renamed_outputs)
            .field("state_dir", &self.state_dir)
            .field("changelog_topic", &self.changelog_topic)
            .field("commit_interval", &self.commit_interval)
            .field("max_batch_records", &self.max_batch_records)
            .field("delivery", &self.delivery)
            .field("dedup_window", &self.dedup_window)
            .field("dedup_max_entries", &self.dedup_max_entries)
            .field("event_id_header", &self.event_id_header)
            .field("require_event_id", &self.require_event_id)
            .field("accept_changelog_behind", &self.accept_changelog_behind)
            .field(
                "changelog_replication_factor",
                &self.changelog_replication_factor,
            )
            .field("transaction_timeout", &self.transaction_timeout)
            .field("txlog_sync_interval", &self.txlog_sync_interval)
            .field("txlog_cache_size", &self.txlog_cache_size)
            .field("replay_concurrency", &self.replay_concurrency)
            .field(
                "kafka_properties",
                &crate::redact::Properties(&self.kafka_properties),
            )
            .field("on_error", &self.on_error)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("max_attempts", &self.max_attempts)
            .field("max_retry_time", &self.max_retry_time)
            .field("effects_topic", &self.effects_topic)
            .field("timer_lateness", &self.timer_lateness)
            .finish()
    }
}

impl EngineConfig {
    /// A configuration with the defaults for everything but what has none.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        group: impl Into<String>,
        instance_id: impl Into<String>,
        input_topic: impl Into<String>,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        EngineConfig {
            bootstrap_servers: bootstrap_servers.into(),
            group: group.into(),
            instance_id: instance_id.into(),
            input_topic: input_topic.into(),
            output_topics: Vec::new(),
            renamed_outputs: std::collections::BTreeMap::new(),
            state_dir: state_dir.into(),
            changelog_topic: None,
            commit_interval: Duration::from_millis(100),
            max_batch_records: 1000,
            delivery: DeliveryMode::ExactlyOnce,
            dedup_window: Duration::from_secs(7 * 24 * 3600),
            dedup_max_entries: None,
            event_id_header: crate::wire::EVENT_ID_HEADER.into(),
            require_event_id: false,
            accept_changelog_behind: false,
            changelog_replication_factor: None,
            // Kafka Streams' default under exactly-once: an instance that dies mid-batch
            // holds its open transaction, and every read_committed reader of its outputs,
            // this long. Batches commit at half of it, so only one record slower than this
            // is cut short (dead-lettered as `transaction-timeout`).
            transaction_timeout: Duration::from_secs(10),
            txlog_sync_interval: crate::txlog::DEFAULT_SYNC_INTERVAL,
            txlog_cache_size: crate::txlog::DEFAULT_CACHE_SIZE,
            replay_concurrency: 1,
            kafka_properties: Vec::new(),
            on_error: ErrorPolicy::DeadLetter,
            dead_letter_topic: None,
            max_attempts: 5,
            max_retry_time: Duration::from_secs(10),
            effects_topic: None,
            timer_lateness: Duration::ZERO,
            clock: crate::clock::Clock::System,
        }
    }

    /// Declares a topic the processor may emit to.
    pub fn output(mut self, topic: impl Into<String>) -> Self {
        self.output_topics.push(topic.into());
        self
    }

    /// Sends the processor's declared output `declared` to `topic`: the same binary runs
    /// against `staging.invoices` and `prod.invoices`, and `ctx.emit(Self::INVOICES, ..)`
    /// goes to the topic configured here.
    pub fn rename_output(mut self, declared: impl Into<String>, topic: impl Into<String>) -> Self {
        self.renamed_outputs.insert(declared.into(), topic.into());
        self
    }

    /// Sets the batch bounds.
    pub fn batching(mut self, commit_interval: Duration, max_batch_records: usize) -> Self {
        self.commit_interval = commit_interval;
        self.max_batch_records = max_batch_records;
        self
    }

    /// Sets the delivery mode.
    pub fn delivery(mut self, delivery: DeliveryMode) -> Self {
        self.delivery = delivery;
        self
    }

    /// Sets the dedup window and the per-partition entry limit.
    pub fn dedup(mut self, window: Duration, max_entries: Option<u64>) -> Self {
        self.dedup_window = window;
        self.dedup_max_entries = max_entries;
        self
    }

    /// Sets how long the transaction log may keep applies in memory only
    /// ([`EngineConfig::txlog_sync_interval`]).
    pub fn txlog_sync_interval(mut self, interval: Duration) -> Self {
        self.txlog_sync_interval = interval;
        self
    }

    /// Sets the transaction log's page cache, in bytes
    /// ([`EngineConfig::txlog_cache_size`]).
    pub fn txlog_cache_size(mut self, bytes: usize) -> Self {
        self.txlog_cache_size = bytes;
        self
    }

    /// Sets how many changelog partitions are replayed at the same time
    /// ([`EngineConfig::replay_concurrency`]).
    pub fn replay_concurrency(mut self, partitions: usize) -> Self {
        self.replay_concurrency = partitions;
        self
    }

    /// Passes a librdkafka property to every client.
    pub fn kafka(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka_properties.push((key.into(), value.into()));
        self
    }

    /// Requires every record to carry an event ID.
    pub fn require_event_id(mut self, required: bool) -> Self {
        self.require_event_id = required;
        self
    }

    /// Sets the policy for records that cannot be processed.
    pub fn on_error(mut self, policy: ErrorPolicy) -> Self {
        self.on_error = policy;
        self
    }

    /// Sets the retry budget of a record that fails transiently.
    pub fn retries(mut self, max_attempts: u32, max_retry_time: Duration) -> Self {
        self.max_attempts = max_attempts;
        self.max_retry_time = max_retry_time;
        self
    }

    /// Lets the processor record side effects ([`crate::Context::effect`]) on
    /// `<group>-effects`, created at start like the changelog; an executor applies them
    /// ([`crate::effects`]).
    pub fn with_effects(mut self) -> Self {
        self.effects_topic = Some(GroupTopic::Effects.name(&self.group));
        self
    }

    /// [`EngineConfig::with_effects`] on a topic of another name.
    pub fn effects_topic(mut self, topic: impl Into<String>) -> Self {
        self.effects_topic = Some(topic.into());
        self
    }

    /// The dead-letter topic name.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| GroupTopic::DeadLetters.name(&self.group))
    }

    /// The changelog topic name.
    pub fn changelog_topic(&self) -> String {
        self.changelog_topic
            .clone()
            .unwrap_or_else(|| GroupTopic::Changelog.name(&self.group))
    }

    /// The value of librdkafka property `key` in `kafka_properties` (the last one set).
    pub fn kafka_property(&self, key: &str) -> Option<&str> {
        self.kafka_properties
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, value)| value.as_str())
    }

    /// The producer's transactional ID.
    pub fn transactional_id(&self) -> String {
        format!("{}-{}", self.group, self.instance_id)
    }

    /// The directory of this instance's transaction log.
    pub fn instance_dir(&self) -> PathBuf {
        self.state_dir.join(&self.group).join(&self.instance_id)
    }

    /// Every problem with the configuration, one error per problem.
    pub fn problems(&self) -> Vec<Error> {
        let mut problems = Vec::new();
        let mut bad = |key: &str, value: String, accepted: &str| {
            problems.push(Error::Config {
                key: key.into(),
                value,
                accepted: accepted.into(),
            })
        };
        if self.bootstrap_servers.trim().is_empty() {
            bad(
                "brokers",
                String::new(),
                "host:port[,host:port…] of the Kafka cluster",
            );
        }
        for (key, value) in [
            ("group", &self.group),
            ("instance_id", &self.instance_id),
            ("input", &self.input_topic),
        ] {
            if !is_kafka_name(value) {
                bad(
                    key,
                    value.clone(),
                    "1–200 characters of a-z, A-Z, 0-9, '.', '_' and '-'",
                );
            }
        }
        if self.commit_interval.is_zero() || self.commit_interval >= self.transaction_timeout {
            bad(
                "commit_interval",
                format!("{:?}", self.commit_interval),
                "more than zero and less than the transaction timeout",
            );
        }
        if self.max_batch_records == 0 {
            bad(
                "max_batch_records",
                "0".into(),
                "a whole number of at least 1",
            );
        }
        if self.max_attempts == 0 {
            bad("max_attempts", "0".into(), "a whole number of at least 1");
        }
        if self.replay_concurrency == 0 {
            bad(
                "replay_concurrency",
                "0".into(),
                "a whole number of at least 1",
            );
        }
        // Retry waits hold no transaction open, but they do keep the consumer from polling:
        // keep them well inside `max.poll.interval.ms`, or the group evicts the instance.
        let poll_interval = self
            .kafka_property("max.poll.interval.ms")
            .and_then(|value| value.parse().ok())
            .map_or(DEFAULT_MAX_POLL_INTERVAL, Duration::from_millis);
        if self.max_retry_time >= poll_interval / 2 {
            bad(
                "max_retry_time",
                format!("{:?}", self.max_retry_time),
                &format!(
                    "less than half of max.poll.interval.ms ({poll_interval:?}): no poll happens \
                     while a record waits for its next attempt"
                ),
            );
        }
        // A batch ends at half the transaction timeout, plus the retries of the record it
        // was at; it polls only after it: a longer batch is taken out of the group in the
        // middle of its transaction.
        let longest_batch = self.transaction_timeout / 2 + self.max_retry_time;
        if longest_batch >= poll_interval && self.max_retry_time < poll_interval / 2 {
            bad(
                "transaction_timeout",
                format!("{:?}", self.transaction_timeout),
                &format!(
                    "one whose half plus max_retry_time ({:?}) is less than max.poll.interval.ms \
                     ({poll_interval:?}): a batch runs that long without polling",
                    self.max_retry_time
                ),
            );
        }
        if let Some(factor) = self.changelog_replication_factor
            && factor < 1
        {
            bad(
                "changelog_replication_factor",
                factor.to_string(),
                "a whole number of at least 1 (or unset: the broker's default)",
            );
        }
        if self.dedup_window.is_zero() {
            bad("dedup_window", "0s".into(), "a duration of more than zero");
        }
        for (key, value) in &self.kafka_properties {
            if [
                "transactional.id",
                "isolation.level",
                "enable.auto.commit",
                "enable.auto.offset.store",
                "group.id",
                "group.instance.id",
            ]
            .contains(&key.as_str())
            {
                bad(
                    key,
                    "(set)".into(),
                    "not settable: onceflow sets it to keep its guarantee",
                );
            }
            // Each breaks an assumption the engine's poll loop relies on.
            let refused = match (key.as_str(), value.trim()) {
                ("enable.partition.eof", "true") => Some(
                    "false (the default): end-of-partition events would interrupt every poll; \
                     onceflow needs none",
                ),
                ("enable.idempotence", "false") => Some(
                    "true (the default): without idempotence a retried produce can duplicate \
                     an output",
                ),
                ("acks", "0" | "1") => Some(
                    "all (the default): with fewer acks a committed output can be lost with a \
                     broker",
                ),
                // Set by the engine; any other value used to be overridden without a word.
                ("auto.offset.reset", other) if !other.eq_ignore_ascii_case("earliest") => Some(
                    "earliest (what onceflow sets): a group with no committed offset must start \
                     at the beginning, or the records before its start are never processed; to \
                     skip history on purpose, commit the group's offsets first",
                ),
                ("partition.assignment.strategy", other)
                    if other.replace(' ', "") != EAGER_ASSIGNMENT =>
                {
                    Some(
                        "range,roundrobin (what onceflow sets): the engine hands partitions over \
                         with eager rebalances; incremental (cooperative-sticky) ones are not \
                         supported yet",
                    )
                }
                _ => None,
            };
            if let Some(accepted) = refused {
                bad(key, value.clone(), accepted);
            }
        }
        // The producer's timeouts against the transaction's (issue 13): librdkafka sets
        // message.timeout.ms to transaction.timeout.ms unless told otherwise.
        if self.kafka_property("transaction.timeout.ms").is_some() {
            bad(
                "transaction.timeout.ms",
                "(set)".into(),
                "set through transaction_timeout (--transaction-timeout): the engine bounds \
                 its batches, commits and replay waits by it too",
            );
        }
        if self.delivery == DeliveryMode::ExactlyOnce {
            let millis = |key: &str| {
                self.kafka_property(key)
                    .and_then(|value| value.trim().parse::<u64>().ok())
                    .map(Duration::from_millis)
            };
            if let Some(timeout) = millis("message.timeout.ms")
                && timeout > self.transaction_timeout
            {
                bad(
                    "message.timeout.ms",
                    format!("{timeout:?}"),
                    &format!(
                        "at most transaction_timeout ({:?}): a record still being retried past \
                         it would outlive its transaction (librdkafka refuses it too)",
                        self.transaction_timeout
                    ),
                );
            }
        }
        problems
    }
}

fn is_kafka_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The first rename of an output `processor` does not declare, as the error it is: a
/// rename (`NAME=TOPIC`) names a declared output; a topic it does not declare is added
/// without `=`.
pub(crate) fn unknown_rename(
    renamed: &std::collections::BTreeMap<String, String>,
    declared: &[&str],
    processor: &str,
) -> Option<Error> {
    let (name, topic) = renamed
        .iter()
        .find(|(name, _)| !declared.contains(&name.as_str()))?;
    Some(Error::Config {
        key: "outputs".into(),
        value: format!("{name}={topic}"),
        accepted: format!(
            "a rename of an output processor `{processor}` declares ({}); a topic it does \
             not declare is added without `=`",
            if declared.is_empty() {
                "it declares none".to_owned()
            } else {
                declared.join(", ")
            }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_that_break_the_poll_loop_are_refused() {
        let base = EngineConfig::new("k:9092", "billing", "a", "orders", "/tmp/s");
        for (key, value) in [
            ("enable.partition.eof", "true"),
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("group.instance.id", "x"),
        ] {
            let problems = base.clone().kafka(key, value).problems();
            assert!(
                problems
                    .iter()
                    .any(|p| matches!(p, Error::Config { key: k, .. } if k == key)),
                "{key}={value}: {problems:?}"
            );
        }
        assert!(
            base.clone()
                .kafka("enable.partition.eof", "false")
                .problems()
                .is_empty()
        );
        assert!(base.clone().kafka("acks", "all").problems().is_empty());
        // Properties the engine sets itself: refused with the reason, unless the value is
        // the engine's own (they used to be overridden without a word).
        for (key, value) in [
            ("auto.offset.reset", "latest"),
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("partition.assignment.strategy", "range"),
        ] {
            let problems = base.clone().kafka(key, value).problems();
            assert!(
                matches!(&problems[..], [Error::Config { key: k, accepted, .. }]
                    if k == key && accepted.contains("what onceflow sets")),
                "{key}={value}: {problems:?}"
            );
        }
        assert!(
            base.clone()
                .kafka("auto.offset.reset", "earliest")
                .kafka("partition.assignment.strategy", "range, roundrobin")
                .problems()
                .is_empty()
        );
    }

    /// Issue 13: the producer's timeouts must fit inside the transaction's.
    #[test]
    fn producer_timeouts_longer_than_the_transaction_are_refused() {
        let base = EngineConfig::new("k:9092", "billing", "a", "orders", "/tmp/s");
        let keys = |config: EngineConfig| -> Vec<String> {
            config
                .problems()
                .into_iter()
                .map(|p| match p {
                    Error::Config { key, .. } => key,
                    other => panic!("{other}"),
                })
                .collect()
        };
        // The default transaction timeout is 10 s.
        assert_eq!(
            keys(base.clone().kafka("message.timeout.ms", "30000")),
            ["message.timeout.ms"]
        );
        assert_eq!(
            keys(base.clone().kafka("transaction.timeout.ms", "5000")),
            ["transaction.timeout.ms"]
        );
        assert!(keys(base.clone().kafka("message.timeout.ms", "10000")).is_empty());
        // A produce request's own timeout is bounded by the record's (librdkafka retries
        // it until message.timeout.ms): any value is fine.
        assert!(keys(base.clone().kafka("request.timeout.ms", "30000")).is_empty());
        // Without transactions nothing outlives a transaction.
        let at_least_once = base.delivery(DeliveryMode::AtLeastOnce);
        assert!(keys(at_least_once.kafka("message.timeout.ms", "30000")).is_empty());
    }

    #[test]
    fn defaults_match_the_documentation() {
        let config = EngineConfig::new("k:9092", "billing", "a", "orders", "/tmp/s");
        assert_eq!(config.commit_interval, Duration::from_millis(100));
        assert_eq!(config.max_batch_records, 1000);
        assert_eq!(config.delivery, DeliveryMode::ExactlyOnce);
        assert_eq!(config.changelog_topic(), "billing-txlog");
        assert_eq!(config.transactional_id(), "billing-a");
        assert_eq!(config.instance_dir(), PathBuf::from("/tmp/s/billing/a"));
        assert!(config.problems().is_empty());
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let config = EngineConfig::new("", "bad group", "a", "orders", "/tmp/s")
            .batching(Duration::ZERO, 0)
            .kafka("isolation.level", "read_uncommitted");
        assert_eq!(
            problem_keys(&config),
            [
                "brokers",
                "group",
                "commit_interval",
                "max_batch_records",
                "isolation.level"
            ]
        );
    }

    /// The keys of `config`'s problems, in order.
    fn problem_keys(config: &EngineConfig) -> Vec<String> {
        config
            .problems()
            .into_iter()
            .map(|e| match e {
                Error::Config { key, .. } => key,
                other => panic!("{other}"),
            })
            .collect()
    }

    #[test]
    fn replays_go_one_at_a_time_unless_configured_and_never_none_at_a_time() {
        let base = EngineConfig::new("k:9092", "billing", "a", "orders", "/tmp/s");
        assert_eq!(base.replay_concurrency, 1);
        assert!(problem_keys(&base.clone().replay_concurrency(8)).is_empty());
        assert_eq!(
            problem_keys(&base.replay_concurrency(0)),
            ["replay_concurrency"]
        );
    }

    #[test]
    fn retry_time_is_bounded_by_the_poll_interval_not_the_transaction_timeout() {
        let base = EngineConfig::new("k:9092", "billing", "a", "orders", "/tmp/s");
        // Waits hold no transaction open: longer than the transaction timeout is fine…
        let long = base.clone().retries(5, Duration::from_secs(100));
        assert!(long.problems().is_empty(), "{:?}", long.problems());
        // …but not half of max.poll.interval.ms (default 300 s, or the property's value).
        assert_eq!(
            base.clone()
                .retries(5, Duration::from_secs(150))
                .problems()
                .len(),
            1
        );
        let problems = long.kafka("max.poll.interval.ms", "60000").problems();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].to_string().contains("60s"), "{}", problems[0]);
    }

    #[test]
    fn the_longest_batch_fits_in_the_poll_interval() {
        let base = EngineConfig::new("k:9092", "billing", "a", "orders", "/tmp/s")
            .retries(3, Duration::from_secs(1))
            .kafka("max.poll.interval.ms", "10000");
        assert!(base.problems().is_empty(), "{:?}", base.problems());
        let mut long = base.clone();
        // 9 s of batch and 1 s of a record's retries: the member would be evicted.
        long.transaction_timeout = Duration::from_secs(18);
        let problems = long.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].to_string().contains("transaction_timeout"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn group_topics_are_named_after_the_group_as_their_pattern_says() {
        let config = EngineConfig::new("k:9092", "billing", "a", "orders", "/tmp/s");
        assert_eq!(config.dead_letter_topic(), "billing-dlq");
        assert_eq!(
            config.clone().with_effects().effects_topic.as_deref(),
            Some("billing-effects")
        );
        assert_eq!(GroupTopic::Changelog.pattern(), "<group>-txlog");
    }

    #[test]
    fn every_mode_and_policy_parses_from_its_own_name() {
        for mode in DeliveryMode::ALL {
            assert_eq!(mode.as_str().parse::<DeliveryMode>().ok(), Some(mode));
        }
        for policy in ErrorPolicy::ALL {
            assert_eq!(policy.as_str().parse::<ErrorPolicy>().ok(), Some(policy));
        }
    }

    #[test]
    fn delivery_modes_parse_and_reject_with_the_accepted_values() {
        assert_eq!(
            "at-least-once".parse::<DeliveryMode>().ok(),
            Some(DeliveryMode::AtLeastOnce)
        );
        let error = "twice"
            .parse::<DeliveryMode>()
            .expect_err("bad mode")
            .to_string();
        assert!(
            error.contains("exactly-once, at-least-once or at-most-once"),
            "{error}"
        );
    }
}
