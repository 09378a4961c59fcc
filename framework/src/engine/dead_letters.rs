//! Records that cannot be processed: handled per `on_error` (dead-lettered, skipped, or
//! the instance stops), in the batch's transaction. The dead-letter record's contract
//! (its headers and error classes) lives here, in one place.
//!
//! Invariants:
//! - A dead letter is written in the same transaction as its input's offset: it exists
//!   exactly once, and is never marked processed (a later copy of the event is processed).
//! - A dead letter never fails its batch for its size: a copy over the topic's limit goes
//!   without its value, saying so in `onceflow-value-omitted`.

use crate::config::ErrorPolicy;
use crate::engine::batch::Batch;
use crate::engine::seams::{Outgoing, Sink, Source};
use crate::kafka;
use crate::{Error, Result};

/// Headers a dead-lettered record carries besides its own.
pub(crate) const DLQ_ERROR_CLASS: &str = "onceflow-error-class";
pub(crate) const DLQ_ERROR_MESSAGE: &str = "onceflow-error-message";
pub(crate) const DLQ_SOURCE_TOPIC: &str = "onceflow-source-topic";
pub(crate) const DLQ_SOURCE_PARTITION: &str = "onceflow-source-partition";
pub(crate) const DLQ_SOURCE_OFFSET: &str = "onceflow-source-offset";
pub(crate) const DLQ_SOURCE_TIMESTAMP: &str = "onceflow-source-timestamp";
pub(crate) const DLQ_PROCESSOR: &str = "onceflow-processor";
pub(crate) const DLQ_ATTEMPTS: &str = "onceflow-attempts";
pub(crate) const DLQ_AT: &str = "onceflow-dead-lettered-at";
/// Set (to the value's size in bytes) when the record's value was left out of its dead
/// letter because the copy would be over the topic's size limit; the value is still in
/// the source topic at the source offset, while that is retained.
pub(crate) const DLQ_VALUE_OMITTED: &str = "onceflow-value-omitted";
/// Why a record could not be processed: the `onceflow-error-class` of its dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureClass {
    /// The value does not decode into the processor's input type.
    Decode,
    /// The processor returned a permanent error.
    Permanent,
    /// The processor panicked.
    Panic,
    /// Transient failures outlasted `max_attempts` or `max_retry_time`.
    TransientExhausted,
    /// No event ID (or an empty one) while `require_event_id` is set.
    MissingEventId,
    /// An output over its topic's size limit.
    OutputTooLarge,
    /// A state value over the changelog's size limit.
    StateTooLarge,
    /// An event ID over the changelog's size limit.
    EventIdTooLarge,
    /// The broker refused a record it caused, for good.
    Rejected,
    /// Its transaction outlived `transaction_timeout` on its own.
    TransactionTimeout,
}

impl FailureClass {
    /// The class as written in `onceflow-error-class`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FailureClass::Decode => "decode",
            FailureClass::Permanent => "permanent",
            FailureClass::Panic => "panic",
            FailureClass::TransientExhausted => "transient-exhausted",
            FailureClass::MissingEventId => "missing-event-id",
            FailureClass::OutputTooLarge => "output-too-large",
            FailureClass::StateTooLarge => "state-too-large",
            FailureClass::EventIdTooLarge => "event-id-too-large",
            FailureClass::Rejected => "rejected",
            FailureClass::TransactionTimeout => "transaction-timeout",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Records of this batch that could not be processed.
pub(super) struct Failures<P> {
    pub(super) pending: Vec<P>,
    /// At most once: the dead letters, sent once the part is applied.
    pub(super) deferred: Vec<crate::processor::Output>,
    pub(super) dead_lettered: u64,
    pub(super) skipped: u64,
}

impl<S: Source, K: Sink<S>> Batch<'_, S, K> {
    /// Handles a record that cannot be processed, per `on_error`.
    pub(super) async fn fail(
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
