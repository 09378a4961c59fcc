//! A record the batch cannot process, handled per `on_error`: dead-lettered in the
//! batch's transaction, skipped, or the instance stops. The dead-letter record's contract
//! (its headers and error classes) is `dead_letters.rs`.

use super::dead_letters::FailureClass;
use super::{Batch, Failures};
use crate::config::ErrorPolicy;
use crate::engine::seams::{Outgoing, Sink, Source};
use crate::kafka;
use crate::wire::{
    DLQ_AT, DLQ_ATTEMPTS, DLQ_ERROR_CLASS, DLQ_ERROR_MESSAGE, DLQ_PROCESSOR, DLQ_SOURCE_OFFSET,
    DLQ_SOURCE_PARTITION, DLQ_SOURCE_TIMESTAMP, DLQ_SOURCE_TOPIC, DLQ_VALUE_OMITTED,
};
use crate::{Error, Result};

impl<S: Source, K: Sink<S>> Batch<'_, S, K> {
    /// Handles a record that cannot be processed, per `on_error`.
    pub(in crate::engine) async fn fail(
        &self,
        record: &kafka::Record,
        class: FailureClass,
        error: Error,
        attempts: u32,
        failed: &mut Failures<K::Pending>,
        now_ms: i64,
    ) -> Result<()> {
        let config = self.config;
        match config.on_error {
            ErrorPolicy::Stop => return Err(error),
            ErrorPolicy::Skip => {
                failed.skipped += 1;
                // Rate-limited like dead letters: a poison flood must not flood the logs.
                if failed.skipped <= 10 || failed.skipped.is_power_of_two() {
                    tracing::warn!(%error, %class, partition = record.partition, offset = record.offset, skipped = failed.skipped, "record skipped");
                }
            }
            ErrorPolicy::DeadLetter => {
                let topic = config.dead_letter_topic();
                let message = error.to_string();
                let partition = record.partition.to_string();
                let offset = record.offset.to_string();
                let timestamp = record
                    .timestamp_ms
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                let attempts_text = attempts.to_string();
                let at = now_ms.to_string();
                let mut headers: Vec<(&str, Option<&[u8]>)> = record
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_deref()))
                    .collect();
                headers.extend([
                    (DLQ_ERROR_CLASS, Some(class.as_str().as_bytes())),
                    (DLQ_ERROR_MESSAGE, Some(message.as_bytes())),
                    (DLQ_SOURCE_TOPIC, Some(record.topic.as_bytes())),
                    (DLQ_SOURCE_PARTITION, Some(partition.as_bytes())),
                    (DLQ_SOURCE_OFFSET, Some(offset.as_bytes())),
                    (DLQ_SOURCE_TIMESTAMP, Some(timestamp.as_bytes())),
                    (DLQ_PROCESSOR, Some(config.group.as_bytes())),
                    (DLQ_ATTEMPTS, Some(attempts_text.as_bytes())),
                    (DLQ_AT, Some(at.as_bytes())),
                ]);
                // A copy over the dead-letter topic's limit would fail the batch on every
                // retry: leave the value out (it is still at its source offset) and say so.
                let limit = self
                    .output_limits
                    .get(&topic)
                    .copied()
                    .unwrap_or(usize::MAX);
                let size = |value: Option<&[u8]>, headers: &[(&str, Option<&[u8]>)]| {
                    record.key.as_ref().map_or(0, Vec::len)
                        + value.map_or(0, <[u8]>::len)
                        + headers
                            .iter()
                            .map(|(name, value)| name.len() + value.map_or(0, <[u8]>::len))
                            .sum::<usize>()
                };
                let mut value = record.value.as_deref();
                let omitted = value.map_or(0, <[u8]>::len).to_string();
                if size(value, &headers) > limit {
                    value = None;
                    headers.push((DLQ_VALUE_OMITTED, Some(omitted.as_bytes())));
                    tracing::warn!(
                        topic,
                        partition = record.partition,
                        offset = record.offset,
                        bytes = %omitted,
                        limit,
                        "dead letter over the topic's size limit: its value is left out"
                    );
                }
                if self.config.delivery == crate::DeliveryMode::AtMostOnce {
                    // Sent after the part is applied, as its outputs are (see `commit`).
                    failed.deferred.push(crate::processor::Output {
                        topic: topic.clone(),
                        partition: None,
                        key: record.key.clone(),
                        value: value.map(<[u8]>::to_vec),
                        headers: headers
                            .iter()
                            .map(|(name, value)| ((*name).to_owned(), value.map(<[u8]>::to_vec)))
                            .collect(),
                        timestamp_ms: None,
                    });
                } else {
                    let pending = self
                        .producer
                        .send(Outgoing {
                            topic: &topic,
                            partition: None,
                            key: record.key.as_deref(),
                            value,
                            headers: &headers,
                            timestamp_ms: None,
                        })
                        .await?;
                    failed.pending.push(pending);
                }
                failed.dead_lettered += 1;
                if failed.dead_lettered <= 10 || failed.dead_lettered.is_power_of_two() {
                    tracing::warn!(%error, %class, topic, partition = record.partition, offset = record.offset, dead_lettered = failed.dead_lettered, "record dead-lettered");
                }
            }
        }
        // Not marked processed: it never was, so a later copy of it (a `dlq replay` after
        // a fix, or a duplicate) is processed, not skipped.
        Ok(())
    }
}
