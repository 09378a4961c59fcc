//! Re-publishing dead-lettered records, exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;

use super::types::to_record;
use super::{ClientOptions, GroupMetadata, Linger, Producer, Record, kafka_error};
use crate::blocking::blocking;
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
/// group's offsets commit in one transaction (the engine's [`Producer`]), so a replay that
/// is interrupted and run again re-publishes nothing twice. Returns (re-published, passed
/// over).
pub(crate) async fn replay_dead_letters(
    options: &ClientOptions,
    plan: &ReplayPlan,
) -> Result<(u64, u64)> {
    let topic = &plan.dead_letter_topic;
    let operation = format!("replay dead letters of `{topic}`");
    let consumer: Arc<BaseConsumer> = Arc::new(
        options
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
            .map_err(|e| kafka_error(&operation, e))?,
    );
    let producer = Producer::transactional(
        options,
        &plan.transactional_id,
        plan.timeout,
        Linger::Batches,
    )
    .await?;
    consumer
        .subscribe(&[topic])
        .map_err(|e| kafka_error(&operation, e))?;

    let (mut replayed, mut passed_over) = (0u64, 0u64);
    let mut at_end: BTreeSet<i32> = BTreeSet::new();
    let started = Instant::now();
    loop {
        let polling = Arc::clone(&consumer);
        let polled = {
            let operation = operation.clone();
            blocking("poll the dead letters", move || {
                poll_batch(&polling, &operation)
            })
            .await?
        };
        let assigned = polled.assigned;
        for (partition, ended) in polled.ended {
            if ended {
                at_end.insert(partition);
            } else {
                at_end.remove(&partition);
            }
        }
        let batch = polled.records;
        if batch.is_empty() {
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
            continue;
        }
        producer.begin()?;
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        let mut pending = Vec::with_capacity(batch.len());
        for message in &batch {
            next.insert(message.partition, message.offset + 1);
            let header = |name: &str| {
                message
                    .header(name)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            let class_matches = plan
                .error_class
                .as_deref()
                .is_none_or(|c| header(DLQ_ERROR_CLASS).as_deref() == Some(c));
            let offset_matches = plan
                .offsets
                .is_none_or(|(from, to)| (from..=to).contains(&message.offset));
            let target = plan.target.clone().or_else(|| header(DLQ_SOURCE_TOPIC));
            let (true, true, Some(target)) = (class_matches, offset_matches, target) else {
                passed_over += 1;
                continue;
            };
            if let Some(size) = header(DLQ_VALUE_OMITTED) {
                // Its value was too large for the dead-letter topic; it is only at the
                // source offset now. Re-publishing the rest would be a different record.
                tracing::warn!(
                    dead_letter = %format!("{topic}/{}@{}", message.partition, message.offset),
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
            let from = format!("{topic}/{}@{}", message.partition, message.offset);
            let mut headers: Vec<(&str, Option<&[u8]>)> = message
                .headers
                .iter()
                .filter(|(name, _)| !DEAD_LETTER_HEADERS.contains(&name.as_str()))
                .map(|(name, value)| (name.as_str(), value.as_deref()))
                .collect();
            headers.push((REPLAYED_FROM, Some(from.as_bytes())));
            pending.push(
                producer
                    .send_with_headers(
                        &target,
                        source_partition,
                        message.key.as_deref(),
                        message.value.as_deref(),
                        &headers,
                        None,
                    )
                    .await?,
            );
            replayed += 1;
        }
        for sent in pending {
            sent.landed().await?;
        }
        producer
            .send_offsets_of(
                GroupMetadata::of(&*consumer)?,
                topic,
                next.into_iter().collect(),
            )
            .await?;
        producer.commit().await?;
        tracing::info!(replayed, passed_over, "dead letters re-published");
    }
}

/// What one poll of the dead letters found: up to 500 records or 200 ms of them, whether
/// each partition it heard of was at its end after them, and the partitions assigned.
struct Batch {
    records: Vec<Record>,
    ended: BTreeMap<i32, bool>,
    assigned: BTreeSet<i32>,
}

fn poll_batch(consumer: &BaseConsumer, operation: &str) -> Result<Batch> {
    let mut batch = Batch {
        records: Vec::new(),
        ended: BTreeMap::new(),
        assigned: BTreeSet::new(),
    };
    let deadline = Instant::now() + Duration::from_millis(200);
    while batch.records.len() < 500 && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(50)) {
            None => {}
            Some(Ok(message)) => {
                let record = to_record(&message);
                batch.ended.insert(record.partition, false);
                batch.records.push(record);
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                batch.ended.insert(partition, true);
            }
            Some(Err(error)) => return Err(kafka_error(operation, error)),
        }
        // A partition at its end with nothing more: the batch is what there is.
        if batch.records.is_empty() && !batch.ended.is_empty() {
            break;
        }
    }
    batch.assigned = consumer
        .assignment()
        .map(|list| list.elements().iter().map(|e| e.partition()).collect())
        .unwrap_or_default();
    Ok(batch)
}
