//! Contenders a and b: the same work written straight on rdkafka, no framework.
//!
//! - a (`raw`): consume → produce, no transaction, offsets auto-committed. What the
//!   broker and librdkafka do with nothing in the way: the limit.
//! - b (`txn`): the canonical transactional loop: poll a batch for one commit interval
//!   (or up to `max_batch` records), produce its outputs, `send_offsets_to_transaction`
//!   with the consumer's group metadata, `commit_transaction`. State in memory.
//!
//! Both run until killed; the driver measures them from outside.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::workload::{Input, Output};

/// Where a raw contender reads and writes.
#[derive(Debug, Clone)]
pub struct RawArgs {
    /// Bootstrap servers.
    pub brokers: String,
    /// Input topic.
    pub input: String,
    /// Output topic.
    pub output: String,
    /// Consumer group (and transactional ID prefix).
    pub group: String,
    /// Transaction length (b only).
    pub commit_interval: Duration,
    /// Records per transaction at most (b only).
    pub max_batch: usize,
}

fn consumer(args: &RawArgs, transactional: bool) -> Result<BaseConsumer, KafkaError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", &args.group)
        .set("auto.offset.reset", "earliest")
        .set(
            "enable.auto.commit",
            if transactional { "false" } else { "true" },
        )
        .set("isolation.level", "read_committed")
        .create()?;
    consumer.subscribe(&[&args.input])?;
    Ok(consumer)
}

/// Decodes `payload`, adds it to its key's sum, serializes the output.
fn handle(sums: &mut HashMap<String, i64>, payload: &[u8]) -> Option<(String, Vec<u8>)> {
    let input: Input = serde_json::from_slice(payload).ok()?;
    let sum = sums.entry(input.key.clone()).or_insert(0);
    *sum += input.amount;
    let key = input.key.clone();
    let output = Output::of(input, *sum);
    Some((
        key,
        serde_json::to_vec(&output).expect("an output serializes"),
    ))
}

fn send(producer: &BaseProducer, topic: &str, key: &str, value: &[u8]) -> Result<(), KafkaError> {
    let mut record = BaseRecord::<str, [u8]>::to(topic).key(key).payload(value);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(1));
            }
            Err((error, _)) => return Err(error),
        }
    }
}

/// Contender a.
pub fn run_plain(args: &RawArgs) -> Result<(), KafkaError> {
    let consumer = consumer(args, false)?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "5")
        .create()?;
    let mut sums = HashMap::new();
    loop {
        producer.poll(Duration::ZERO);
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message?;
        if let Some((key, value)) = handle(&mut sums, message.payload().unwrap_or_default()) {
            send(&producer, &args.output, &key, &value)?;
        }
    }
}

/// Contender b.
pub fn run_transactional(args: &RawArgs) -> Result<(), KafkaError> {
    let consumer = consumer(args, true)?;
    let timeout = Duration::from_secs(30);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("transactional.id", format!("{}-raw", args.group))
        .set("linger.ms", "5")
        .create()?;
    producer.init_transactions(timeout)?;
    let mut sums = HashMap::new();
    loop {
        let started = Instant::now();
        let mut next_offsets: HashMap<(String, i32), i64> = HashMap::new();
        let mut in_batch = 0usize;
        producer.begin_transaction()?;
        while in_batch < args.max_batch {
            let left = args.commit_interval.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            producer.poll(Duration::ZERO);
            let Some(message) = consumer.poll(left) else {
                break;
            };
            let message = message?;
            if let Some((key, value)) = handle(&mut sums, message.payload().unwrap_or_default()) {
                send(&producer, &args.output, &key, &value)?;
            }
            next_offsets.insert(
                (message.topic().to_owned(), message.partition()),
                message.offset() + 1,
            );
            in_batch += 1;
        }
        if !next_offsets.is_empty() {
            let mut offsets = TopicPartitionList::new();
            for ((topic, partition), offset) in &next_offsets {
                offsets.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
            }
            let metadata = consumer
                .group_metadata()
                .ok_or(KafkaError::Global(RDKafkaErrorCode::State))?;
            producer.send_offsets_to_transaction(&offsets, &metadata, timeout)?;
        }
        // rust-rdkafka's `commit_transaction` flushes first, and its flush costs 100 ms
        // whenever a record is still in flight (it polls in 100 ms steps, and a poll
        // returns only when its timeout is over). Serving the delivery reports until none
        // is left first, as a loop written with that in mind does, saves it.
        let settling = Instant::now();
        while producer.in_flight_count() > 0 && settling.elapsed() < timeout {
            producer.poll(Duration::from_millis(1));
        }
        producer.commit_transaction(timeout)?;
    }
}
