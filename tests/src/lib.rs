//! End-to-end tests of onceflow against a real Apache Kafka broker, and conformance tests
//! of the broker itself (`tests/broker_*.rs`). The broker comes from `onceflow_testkit`;
//! this crate adds the raw-client helpers the broker conformance tests need.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use onceflow_testkit::{Kafka, Record};
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

/// Sends the warnings of engines run inside the test (at `RUST_LOG`, or `onceflow=warn`) to
/// the test's captured output, so a failing test prints them. Once per test binary.
pub fn test_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "onceflow=warn".into()),
        )
        .try_init();
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

pub mod buckets;
pub mod child;
pub mod effects;
pub mod harness;
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
        Operator::on(onceflow_testkit::kafka().await, name, partitions).await
    }

    /// The same on `kafka` (the three-node cluster, say).
    pub async fn on(
        kafka: &'static Kafka,
        name: &str,
        partitions: i32,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let input = onceflow_testkit::unique_name(&format!("{name}-in"));
        let output = onceflow_testkit::unique_name(&format!("{name}-out"));
        kafka.create_topic(&input, partitions).await?;
        kafka.create_topic(&output, partitions).await?;
        Ok(Operator {
            kafka,
            input,
            output,
            group: onceflow_testkit::unique_name(name),
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

/// A record as a [`Watcher`] saw it: partition, offset, value.
type Seen = (i32, i64, Option<Vec<u8>>);

/// A `read_committed` reader of a topic that runs while a test's faults happen (issue 13:
/// "a concurrent reader during the faults"), on a thread of its own. What it saw must be,
/// partition by partition, the same records in the same order as a final read: an
/// aborted record, or one that a later abort took back, would show up as a difference.
#[derive(Debug)]
pub struct Watcher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl Watcher {
    /// Starts reading every partition of `topic` from its beginning.
    pub fn start(kafka: &Kafka, topic: &str, partitions: i32) -> Watcher {
        use rdkafka::message::Message;
        use std::sync::atomic::Ordering;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", kafka.bootstrap_servers())
            .set("group.id", onceflow_testkit::unique_name("watcher"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("watcher");
        let mut assignment = rdkafka::TopicPartitionList::new();
        for partition in 0..partitions {
            assignment
                .add_partition_offset(topic, partition, rdkafka::Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&assignment).expect("assign");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let thread = {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match consumer.poll(Duration::from_millis(100)) {
                        Some(Ok(message)) => seen.lock().expect("seen").push((
                            message.partition(),
                            message.offset(),
                            message.payload().map(<[u8]>::to_vec),
                        )),
                        // Broker faults reach a reader as transient errors; it reads on.
                        Some(Err(error)) if error.rdkafka_error_code().is_some() => {}
                        Some(Err(error)) => return Err(error.to_string()),
                        None => {}
                    }
                }
                Ok(())
            })
        };
        Watcher { stop, seen, thread }
    }

    /// Waits (at most `within`) until the watcher has read `count` records, stops it, and
    /// checks what it read against `last`, a final `read_committed` read of the topic.
    pub fn finish(self, count: usize, within: Duration, last: &[Record]) {
        let deadline = Instant::now() + within;
        while self.seen.lock().expect("seen").len() < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .join()
            .expect("watcher thread")
            .expect("watcher read");
        let mut seen = std::mem::take(&mut *self.seen.lock().expect("seen"));
        seen.sort_by_key(|(partition, _, _)| *partition); // stable: offsets stay in order
        let last: Vec<Seen> = last
            .iter()
            .map(|r| (r.partition, r.offset, r.value.clone()))
            .collect();
        assert_eq!(
            seen.len(),
            last.len(),
            "the concurrent reader saw {} records, the final read {}",
            seen.len(),
            last.len()
        );
        if let Some(at) = seen.iter().zip(&last).position(|(a, b)| a != b) {
            panic!(
                "the concurrent reader and the final read differ at partition {} offset {}",
                seen[at].0, seen[at].1
            );
        }
    }
}

/// Waits (at most `within`) until `group` is stable with `members` members, as the group
/// coordinator reports it; panics with what it last saw otherwise.
pub fn wait_for_members(kafka: &Kafka, group: &str, members: usize, within: Duration) {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .create()
        .expect("admin consumer");
    let deadline = Instant::now() + within;
    let mut last = String::from("nothing");
    while Instant::now() < deadline {
        if let Ok(list) = client.fetch_group_list(Some(group), Duration::from_secs(5))
            && let Some(found) = list.groups().first()
        {
            if found.state() == "Stable" && found.members().len() == members {
                return;
            }
            last = format!("{} with {} members", found.state(), found.members().len());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("group {group} not stable with {members} members after {within:?}: {last}");
}

/// Waits (at most `within`) until `topic` holds `count` records visible to
/// `read_committed`; fails with how many it saw.
pub async fn wait_for_records(
    kafka: &Kafka,
    topic: &str,
    count: usize,
    within: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + within;
    loop {
        let seen = kafka
            .read_to_end(topic, onceflow_testkit::Isolation::ReadCommitted)
            .await?
            .len();
        if seen >= count {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "{seen} of {count} records on `{topic}` after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The local transaction of the half-message tests: inserts order `id` into the table
/// `orders (id, total)` and commits, or rolls back.
pub async fn insert_order(
    pool: &onceflow::outbox::sqlx::PgPool,
    id: &str,
    total: i64,
    commit: bool,
) {
    use onceflow::outbox::sqlx;
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("INSERT INTO orders (id, total) VALUES ($1, $2)")
        .bind(id)
        .bind(total)
        .execute(&mut *tx)
        .await
        .expect("insert");
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
}
