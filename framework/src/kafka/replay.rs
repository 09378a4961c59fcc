//! Reading one changelog partition from a checkpoint to its end.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::{ClientOptions, Record, kafka_error, types::to_record};
use crate::{Error, Result};

/// Reads `topic` [`partition`] under `read_committed` from `from` (the beginning when
/// `None`) to its last stable offset, handing records to `apply` in chunks of at most
/// `chunk` records, with the partition's last stable offset at the start (for progress).
/// Blocking: call it inside [`super::blocking`].
///
/// Returns the next offset to read after what was read. A checkpoint past the end of the
/// partition (the topic was recreated or truncated) is [`Error::Corrupt`].
pub(crate) fn read_partition(
    options: &ClientOptions,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    chunk: usize,
    timeout: Duration,
    mut apply: impl FnMut(Vec<Record>, i64) -> Result<()>,
) -> Result<i64> {
    let operation = format!("replay `{topic}` [{partition}]");
    // librdkafka needs a group to assign partitions, though this reader commits nothing.
    // Named after the changelog (`<group>-txlog`), a prefixed ACL on the operator's group
    // name covers it on a secured cluster.
    let group = format!("{topic}-replay");
    let consumer: BaseConsumer = options
        .config(&[
            ("group.id", &group),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "true"),
            // Reaching the end is the goal: do not let the broker hold an empty fetch.
            ("fetch.wait.max.ms", "10"),
            ("isolation.level", "read_committed"),
            ("auto.offset.reset", "earliest"),
        ])
        .create()
        .map_err(|e| kafka_error(&operation, e))?;
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(|e| kafka_error(format!("{operation}: watermarks"), e))?;
    let start = match from {
        Some(offset) if offset > high => {
            return Err(Error::Corrupt {
                what: format!("checkpoint of `{topic}` [{partition}]"),
                message: format!(
                    "the checkpoint ({offset}) is past the end of the changelog ({high}): \
                     the topic was recreated or truncated"
                ),
            });
        }
        Some(offset) => Offset::Offset(offset.max(low)),
        None => Offset::Beginning,
    };
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, start)
        .map_err(|e| kafka_error(&operation, e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| kafka_error(&operation, e))?;

    let mut next = from.unwrap_or(low).max(low);
    let mut pending = Vec::with_capacity(chunk);
    let mut last_progress = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            None => {
                if last_progress.elapsed() > timeout {
                    return Err(Error::Timeout {
                        what: operation,
                        after: timeout,
                        detail: format!("stuck at offset {next} of {high}"),
                    });
                }
            }
            Some(Ok(message)) => {
                let record = to_record(&message);
                next = record.offset + 1;
                pending.push(record);
                last_progress = Instant::now();
                if pending.len() >= chunk {
                    apply(std::mem::take(&mut pending), high)?;
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(error)) => {
                // Connections come back by themselves (a broker restarting, a network
                // blip): keep polling until the deadline rather than fail at once.
                let error = kafka_error(&operation, error);
                if !error.is_retriable() {
                    return Err(error);
                }
                tracing::debug!(%error, "transient error while reading; polling on");
            }
        }
    }
    if !pending.is_empty() {
        apply(pending, high)?;
    }
    // The position after end-of-partition may lie past the last record (commit markers).
    if let Ok(position) = consumer.position()
        && let Some(Offset::Offset(offset)) = position
            .find_partition(topic, partition)
            .map(|element| element.offset())
    {
        next = next.max(offset);
    }
    Ok(next)
}
