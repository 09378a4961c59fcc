//! End-to-end tests of onceflow against a real Apache Kafka broker, and conformance tests
//! of the broker itself (`tests/broker_*.rs`). The broker comes from `onceflow::testkit`;
//! this crate adds the raw-client helpers the broker conformance tests need.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use onceflow::testkit::{Kafka, Record};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// How long a raw client call may block in these tests.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A transactional producer with `transactional_id`, `init_transactions` already done.
pub fn transactional_producer(kafka: &Kafka, transactional_id: &str) -> BaseProducer {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .set("transactional.id", transactional_id)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("transactional producer");
    producer
        .init_transactions(CALL_TIMEOUT)
        .expect("init_transactions");
    producer
}

/// Sends `values` (keyed by themselves) to `topic` and waits until the broker has them.
pub fn send_all(producer: &BaseProducer, topic: &str, values: &[String]) {
    for value in values {
        producer
            .send(BaseRecord::to(topic).key(value).payload(value))
            .unwrap_or_else(|(e, _)| panic!("enqueue {value}: {e}"));
    }
    producer.flush(CALL_TIMEOUT).expect("flush");
}

/// A consumer in `group`, subscribed to `topic`, that has consumed `count` records (so it
/// holds an assignment and a generation, as a processor's consumer does).
pub fn group_consumer(kafka: &Kafka, group: &str, topic: &str, count: usize) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .expect("group consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + CALL_TIMEOUT;
    let mut consumed = 0;
    while consumed < count {
        assert!(
            Instant::now() < deadline,
            "consumed only {consumed} of {count} records from {topic}"
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => consumed += 1,
            Some(Err(e)) => panic!("consume {topic}: {e}"),
            None => {}
        }
    }
    consumer
}

/// `n` distinct values `prefix-0` … `prefix-(n-1)`.
pub fn values(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The values of `records`, as a set of strings.
pub fn value_set(records: &[Record]) -> BTreeSet<String> {
    records.iter().map(Record::value_str).collect()
}

/// The union of value lists, as a set.
pub fn set_of<'a>(lists: impl IntoIterator<Item = &'a [String]>) -> BTreeSet<String> {
    lists.into_iter().flatten().cloned().collect()
}

pub mod child;
pub mod poison;
pub mod sum;

/// What one engine test needs on the broker: its own input and output topics, group and
/// state directory.
#[derive(Debug)]
pub struct Operator {
    /// The shared broker.
    pub kafka: &'static Kafka,
    /// Input topic.
    pub input: String,
    /// Output topic.
    pub output: String,
    /// Consumer group.
    pub group: String,
    /// State directory root (removed when dropped).
    pub state: tempfile::TempDir,
}

impl Operator {
    /// Fresh names for `name`, and input and output topics with `partitions` partitions.
    pub async fn new(name: &str, partitions: i32) -> Result<Self, Box<dyn std::error::Error>> {
        Operator::on(onceflow::testkit::kafka().await, name, partitions).await
    }

    /// The same on `kafka` (the three-node cluster, say).
    pub async fn on(
        kafka: &'static Kafka,
        name: &str,
        partitions: i32,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let input = onceflow::testkit::unique_name(&format!("{name}-in"));
        let output = onceflow::testkit::unique_name(&format!("{name}-out"));
        kafka.create_topic(&input, partitions).await?;
        kafka.create_topic(&output, partitions).await?;
        Ok(Operator {
            kafka,
            input,
            output,
            group: onceflow::testkit::unique_name(name),
            state: tempfile::tempdir()?,
        })
    }

    /// An engine configuration for instance `instance` of this operator (a short session
    /// timeout, so the tests see dead instances replaced quickly).
    pub fn config(&self, instance: &str) -> onceflow::EngineConfig {
        onceflow::EngineConfig::new(
            self.kafka.bootstrap_servers(),
            &self.group,
            instance,
            &self.input,
            self.state.path(),
        )
        .output(&self.output)
        .kafka("session.timeout.ms", "6000")
    }
}
