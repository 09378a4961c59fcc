//! Re-publishing dead-lettered records, exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::{ClientOptions, kafka_error};
use crate::wire::{
    DEAD_LETTER_HEADERS, DLQ_ERROR_CLASS, DLQ_SOURCE_OFFSET, DLQ_SOURCE_PARTITION,
    DLQ_SOURCE_TOPIC, DLQ_VALUE_OMITTED, REPLAYED_FROM,
};
use crate::{Error, Result};

/// Which dead letters to re-publish, and where.
#[derive(Debug, Clone)]
pub(crate) struct ReplayPlan {
    pub(crate) dead_letter_topic: String,
    pub(crate) group: String,
    pub(crate) transactional_id: String,
    pub(crate) target: Option<String>,
    pub(crate) error_class: Option<String>,
    pub(crate) offsets: Option<(i64, i64)>,
    pub(crate) timeout: Duration,
}

/// Reads the dead-letter topic from the replay group's committed offsets to its end and
/// re-publishes the records that match, with their original key, value and headers (those
/// dead-lettering added dropped, `onceflow-replayed-from` added). Each batch's records and the
/// group's offsets commit in one transaction, so a replay that is interrupted and run again
/// re-publishes nothing twice. Blocking. Returns (re-published, passed over).
pub(crate) fn replay_dead_letters(
    options: &ClientOptions,
    plan: &ReplayPlan,
) -> Result<(u64, u64)> {
    let topic = &plan.dead_letter_topic;
    let operation = format!("replay dead letters of `{topic}`");
    let consumer: BaseConsumer = options
        .config(&[
            ("group.id", &plan.group),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "true"),
            ("isolation.level", "read_committed"),
            ("auto.offset.reset", "earliest"),
            ("fetch.wait.max.ms", "10"),
        ])
        .create()
        .map_err(|e| kafka_error(&operation, e))?;
    let timeout_ms = plan.timeout.as_millis().to_string();
    let producer: BaseProducer = options
        .config_with_defaults(
            super::TRANSACTIONAL_DEFAULTS,
            &[
                ("transactional.id", &plan.transactional_id),
                ("enable.idempotence", "true"),
                ("transaction.timeout.ms", &timeout_ms),
            ],
        )
        .create()
        .map_err(|e| kafka_error(&operation, e))?;
    producer
        .init_transactions(plan.timeout)
        .map_err(|e| kafka_error("init_transactions", e))?;
    consumer
        .subscribe(&[topic])
        .map_err(|e| kafka_error(&operation, e))?;

    let (mut replayed, mut passed_over) = (0u64, 0u64);
    let mut at_end: BTreeSet<i32> = BTreeSet::new();
    let started = Instant::now();
    loop {
        let assigned: BTreeSet<i32> = consumer
            .assignment()
            .map(|list| list.elements().iter().map(|e| e.partition()).collect())
            .unwrap_or_default();
        if !assigned.is_empty() && assigned.is_subset(&at_end) {
            return Ok((replayed, passed_over));
        }
        if started.elapsed() > plan.timeout && assigned.is_empty() {
            return Err(Error::Timeout {
                what: operation,
                after: plan.timeout,
                detail: "no partition of the dead-letter topic was assigned".into(),
            });
        }
        // One batch: up to 500 records or 200 ms.
        let mut batch = Vec::new();
        let deadline = Instant::now() + Duration::from_millis(200);
        while batch.len() < 500 && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(50)) {
                None => {}
                Some(Ok(message)) => {
                    at_end.remove(&message.partition());
                    batch.push(message.detach());
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    at_end.insert(partition);
                }
                Some(Err(error)) => return Err(kafka_error(&operation, error)),
            }
        }
        if batch.is_empty() {
            continue;
        }
        producer
            .begin_transaction()
            .map_err(|e| kafka_error("begin_transaction", e))?;
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        for message in &batch {
            next.insert(message.partition(), message.offset() + 1);
            let header = |name: &str| {
                message.headers().and_then(|headers| {
                    headers
                        .iter()
                        .find(|h| h.key == name)
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
            };
            let class_matches = plan
                .error_class
                .as_deref()
                .is_none_or(|c| header(DLQ_ERROR_CLASS).as_deref() == Some(c));
            let offset_matches = plan
                .offsets
                .is_none_or(|(from, to)| (from..=to).contains(&message.offset()));
            let target = plan.target.clone().or_else(|| header(DLQ_SOURCE_TOPIC));
            let (true, true, Some(target)) = (class_matches, offset_matches, target) else {
                passed_over += 1;
                continue;
            };
            if let Some(size) = header(DLQ_VALUE_OMITTED) {
                // Its value was too large for the dead-letter topic; it is only at the
                // source offset now. Re-publishing the rest would be a different record.
                tracing::warn!(
                    dead_letter = %format!("{topic}/{}@{}", message.partition(), message.offset()),
                    source = ?(header(DLQ_SOURCE_TOPIC), header(DLQ_SOURCE_PARTITION), header(DLQ_SOURCE_OFFSET)),
                    bytes = %size,
                    "passed over: this dead letter has no value (it was over the size limit); \
                     re-publish it from its source offset"
                );
                passed_over += 1;
                continue;
            }
            // Back to the partition it came from, not where librdkafka's partitioner
            // would put its key: dedup and state are per input partition, and upstreams
            // partition in their own ways (Java's murmur2, explicit partitions).
            let source_partition = (header(DLQ_SOURCE_TOPIC).as_deref() == Some(target.as_str()))
                .then(|| header(DLQ_SOURCE_PARTITION))
                .flatten()
                .and_then(|p| p.parse::<i32>().ok());
            let mut headers = OwnedHeaders::new();
            if let Some(original) = message.headers() {
                for h in original
                    .iter()
                    .filter(|h| !DEAD_LETTER_HEADERS.contains(&h.key))
                {
                    headers = headers.insert(Header {
                        key: h.key,
                        value: h.value,
                    });
                }
            }
            let from = format!("{topic}/{}@{}", message.partition(), message.offset());
            headers = headers.insert(Header {
                key: REPLAYED_FROM,
                value: Some(from.as_bytes()),
            });
            let mut record = BaseRecord::<[u8], [u8]>::to(&target).headers(headers);
            if let Some(partition) = source_partition {
                record = record.partition(partition);
            }
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            if let Some(value) = message.payload() {
                record = record.payload(value);
            }
            producer
                .send(record)
                .map_err(|(e, _)| kafka_error(crate::Operation::produce(&target), e))?;
            replayed += 1;
        }
        let mut offsets = TopicPartitionList::new();
        for (partition, offset) in next {
            offsets
                .add_partition_offset(topic, partition, Offset::Offset(offset))
                .map_err(|e| kafka_error(&operation, e))?;
        }
        let metadata = consumer
            .group_metadata()
            .ok_or_else(|| Error::Broker("no group metadata".into()))?;
        producer
            .send_offsets_to_transaction(&offsets, &metadata, plan.timeout)
            .map_err(|e| kafka_error("send_offsets_to_transaction", e))?;
        // rust-rdkafka's commit_transaction flushes first, in 100 ms steps that each last
        // their whole 100 ms (see `OutputProducer::settle`): serve the delivery reports
        // until none is left, so that flush finds nothing.
        let settling = Instant::now();
        while producer.in_flight_count() > 0 && settling.elapsed() < plan.timeout {
            producer.poll(Duration::from_millis(1));
        }
        producer
            .commit_transaction(plan.timeout)
            .map_err(|e| kafka_error("commit_transaction", e))?;
        tracing::info!(replayed, passed_over, "dead letters re-published");
    }
}
