//! One record's processing, with no Kafka in it: decode, event ID, the dedup lookup, the
//! processor with its retries, and the size checks of what it produced. The result is a
//! [`Verdict`] the batch acts on (send, dead-letter, skip, split and wait).
//!
//! Invariants:
//! - A failed attempt leaves nothing: each attempt writes to its own overlay and output
//!   list, merged into the batch only by the batch, only on [`Verdict::Done`].
//! - A record whose outputs or changelog writes the broker would refuse for their size is
//!   failed here, before anything of it enters a transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::FutureExt;

use crate::config::{DeliveryMode, EngineConfig};
use crate::engine::batch::dead_letters::FailureClass;
use crate::event::Event;
use crate::kafka;
use crate::processor::{Context, Output, Processor, RecordMeta};
use crate::txlog::{Change, Overlay, View};
use crate::{Error, Result};

/// What the processing of one record is measured against.
pub(in crate::engine) struct Rules<'a> {
    pub(in crate::engine) config: &'a EngineConfig,
    pub(in crate::engine) declared: &'a BTreeSet<String>,
    pub(in crate::engine) changelog: &'a str,
    /// The largest record each output topic takes (key and value together).
    pub(in crate::engine) output_limits: &'a BTreeMap<String, usize>,
}

/// What a record is read against: the committed log as of the batch part's start, and
/// the batch's writes since.
pub(in crate::engine) struct Seen<'a> {
    pub(in crate::engine) view: View<'a>,
    /// Dedup entries processed before this are outside the window: not duplicates.
    pub(in crate::engine) window_start_ms: i64,
    /// The engine's clock at the batch part's start.
    pub(in crate::engine) now_ms: i64,
}

/// What to do with one record.
pub(in crate::engine) enum Verdict {
    /// Its event ID was processed within the window: skip it.
    Duplicate,
    /// Processed: send `outputs`, merge `writes`, mark `event_id` processed.
    Done {
        outputs: Vec<Output>,
        writes: Vec<(i32, Vec<Change>)>,
        event_id: Option<String>,
    },
    /// A transient failure with retry budget left, in exactly-once mode: commit what is
    /// done, wait this long with no transaction open, try again.
    Wait(Duration),
    /// It failed: handle it per `on_error`.
    Failed {
        class: FailureClass,
        error: Error,
        attempts: u32,
    },
}

impl Rules<'_> {
    /// Processes `record`: decode, event ID, dedup lookup, the processor (retried while
    /// it fails transiently, within budget), the size checks.
    pub(in crate::engine) async fn handle<P: Processor>(
        &self,
        processor: &mut P,
        record: &kafka::Record,
        seen: &Seen<'_>,
        retry: &mut Retry,
    ) -> Result<Verdict> {
        // A record that does not decode has no event ID to deduplicate by.
        let input: P::Input = match decode(processor, record) {
            Ok(input) => input,
            Err(error) => {
                return Ok(Verdict::Failed {
                    class: FailureClass::Decode,
                    error,
                    attempts: retry.attempt,
                });
            }
        };
        let event_id = match self.event_id(&input, record) {
            Ok(id) => id,
            Err((class, error)) => {
                return Ok(Verdict::Failed {
                    class,
                    error,
                    attempts: 1,
                });
            }
        };
        if let Some(id) = &event_id
            && seen
                .view
                .is_processed(record.partition, id, seen.window_start_ms)?
        {
            tracing::debug!(
                partition = record.partition,
                offset = record.offset,
                id,
                "duplicate skipped"
            );
            return Ok(Verdict::Duplicate);
        }
        let meta = RecordMeta {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            timestamp_ms: record.timestamp_ms,
            headers: record.headers.clone(),
            event_id: event_id.clone(),
        };
        let (outputs, writes) = match self
            .process_one(processor, input, record, &meta, seen, retry)
            .await
        {
            Processed::Done(outputs, writes) => (outputs, writes.into_changes()),
            Processed::Wait(delay) => return Ok(Verdict::Wait(delay)),
            Processed::Failed {
                class,
                error,
                attempts,
            } => {
                return Ok(Verdict::Failed {
                    class,
                    error,
                    attempts,
                });
            }
        };
        if let Some((class, error)) = self.oversized(event_id.as_deref(), &writes, &outputs) {
            return Ok(Verdict::Failed {
                class,
                error,
                attempts: 1,
            });
        }
        Ok(Verdict::Done {
            outputs,
            writes,
            event_id,
        })
    }

    /// librdkafka refuses a record over `message.max.bytes` when it is sent, which would
    /// fail the whole transaction again on every retry: so what a record produced is
    /// checked first and is this input's failure, before any of it enters the
    /// transaction. The same for what it adds to the changelog: a state value (or an
    /// event ID) over the changelog's limit would fail every transaction it is in.
    pub(in crate::engine) fn oversized(
        &self,
        event_id: Option<&str>,
        writes: &[(i32, Vec<Change>)],
        outputs: &[Output],
    ) -> Option<(FailureClass, Error)> {
        let limit = |topic: &str| self.output_limits.get(topic).copied().unwrap_or(usize::MAX);
        let changelog_limit = limit(self.changelog);
        // Sizes only: nothing is encoded (or copied) on this path, which every record takes.
        let oversized = event_id
            .map(|id| (FailureClass::EventIdTooLarge, Change::dedup_entry_len(id)))
            .into_iter()
            .chain(
                writes
                    .iter()
                    .flat_map(|(_, list)| list)
                    .map(|change| (FailureClass::StateTooLarge, change.encoded_len())),
            )
            .find(|(_, size)| *size > changelog_limit);
        if let Some((class, size)) = oversized {
            let what = match class {
                FailureClass::EventIdTooLarge => "its event ID",
                _ => "a state value it wrote",
            };
            let error = Error::Encode {
                what: format!("{what}, as a record of changelog `{}`", self.changelog),
                message: format!(
                    "{size} bytes, over the {changelog_limit} bytes the producer and the topic \
                     accept (message.max.bytes, max.message.bytes)"
                ),
                cause: None,
            };
            return Some((class, error));
        }
        let output = outputs.iter().find(|o| o.size() > limit(&o.topic))?;
        let error = Error::Encode {
            what: format!("a record for `{}`", output.topic),
            message: format!(
                "{} bytes, over the {} bytes the producer and the topic accept \
                 (message.max.bytes, max.message.bytes)",
                output.size(),
                limit(&output.topic)
            ),
            cause: None,
        };
        Some((FailureClass::OutputTooLarge, error))
    }

    /// The record's event ID: the event's own, else the configured header's. An empty ID
    /// is no ID (it would make every other empty-ID record a duplicate). Missing is a
    /// failure of the record only when IDs are required.
    fn event_id<E: Event>(
        &self,
        input: &E,
        record: &kafka::Record,
    ) -> std::result::Result<Option<String>, (FailureClass, Error)> {
        if let Some(id) = input.event_id().filter(|id| !id.is_empty()) {
            return Ok(Some(id));
        }
        let header = &self.config.event_id_header;
        match record.header(header).filter(|bytes| !bytes.is_empty()) {
            Some(bytes) => Ok(Some(header_event_id(bytes))),
            None if self.config.require_event_id => Err((
                FailureClass::MissingEventId,
                Error::processing(format!(
                    "no event ID (or an empty one) in the event and in header `{header}`"
                )),
            )),
            None => Ok(None),
        }
    }

    /// Runs the processor on one record. A transient failure is tried again, with
    /// exponential backoff and jitter, a fresh decode and nothing of the failed attempt
    /// kept, within `max_attempts` and `max_retry_time`: in exactly-once mode the wait is
    /// returned (`Verdict::Wait`) for the caller to take with no transaction open,
    /// otherwise it is taken here. A panic is a permanent failure.
    async fn process_one<P: Processor>(
        &self,
        processor: &mut P,
        input: P::Input,
        record: &kafka::Record,
        meta: &RecordMeta,
        seen: &Seen<'_>,
        retry: &mut Retry,
    ) -> Processed {
        let config = self.config;
        let mut input = Some(input);
        loop {
            let attempt = retry.attempt;
            let this_input = match input.take() {
                Some(input) => input,
                None => match decode(processor, record) {
                    Ok(input) => input,
                    Err(error) => {
                        return Processed::Failed {
                            class: FailureClass::Decode,
                            error,
                            attempts: attempt,
                        };
                    }
                },
            };
            let mut outputs = Vec::new();
            let mut layers = seen.view.record();
            let mut ctx = Context {
                meta,
                state: &mut layers,
                outputs: &mut outputs,
                declared_outputs: self.declared,
                renamed_outputs: &self.config.renamed_outputs,
                effects_topic: self.config.effects_topic.as_deref(),
                operator: &self.config.group,
                effects_recorded: 0,
                now_ms: seen.now_ms,
                timers: processor.uses_timers(),
                timer_lateness_ms: crate::timers::millis(config.timer_lateness),
            };
            let call = AssertUnwindSafe(processor.process(this_input, &mut ctx))
                .catch_unwind()
                .await;
            let error = match call {
                Ok(Ok(())) => return Processed::Done(outputs, layers.into_writes()),
                Ok(Err(error)) => error,
                Err(panic) => {
                    let message = panic_message(&*panic);
                    return Processed::Failed {
                        class: FailureClass::Panic,
                        error: Error::processing(format!("the processor panicked: {message}")),
                        attempts: attempt,
                    };
                }
            };
            if !error.is_retriable() {
                return Processed::Failed {
                    class: FailureClass::Permanent,
                    error,
                    attempts: attempt,
                };
            }
            let Some(delay) = retry.next_delay(config.max_retry_time) else {
                return Processed::Failed {
                    class: FailureClass::TransientExhausted,
                    error,
                    attempts: attempt,
                };
            };
            tracing::warn!(%error, attempt, partition = meta.partition, offset = meta.offset, ?delay, "transient failure; trying again");
            if config.delivery == DeliveryMode::ExactlyOnce {
                return Processed::Wait(delay);
            }
            tokio::time::sleep(delay).await;
        }
    }
}

/// What became of one record.
enum Processed {
    Done(Vec<Output>, Overlay),
    /// A transient failure with retry budget left: wait this long, then try again.
    Wait(Duration),
    Failed {
        class: FailureClass,
        error: Error,
        attempts: u32,
    },
}

/// One record's retry budget: its attempts and the backoff between them.
pub(in crate::engine) struct Retry {
    /// The attempt about to be made (1 for the first).
    pub(in crate::engine) attempt: u32,
    started: std::time::Instant,
    max_times: usize,
    /// Built at the first failure: most records never fail, and a record costs a few
    /// microseconds of CPU in all, so building a backoff for each showed in profiles.
    delays: Option<backon::ExponentialBackoff>,
}

impl Retry {
    /// The budget of a record whose first attempt starts at `started`.
    pub(in crate::engine) fn new(config: &EngineConfig, started: std::time::Instant) -> Self {
        Retry {
            attempt: 1,
            started,
            max_times: config.max_attempts.saturating_sub(1) as usize,
            delays: None,
        }
    }

    /// The wait before the next attempt, if the budget allows one (and counts it).
    fn next_delay(&mut self, max_retry_time: Duration) -> Option<Duration> {
        let max_times = self.max_times;
        let delay = self
            .delays
            .get_or_insert_with(|| {
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(20))
                    .with_max_delay(Duration::from_secs(2))
                    .with_jitter()
                    .with_max_times(max_times)
                    .build()
            })
            .next()?;
        if self.started.elapsed() + delay > max_retry_time {
            return None;
        }
        self.attempt += 1;
        Some(delay)
    }
}

/// The text form of an event ID taken from a header, lossless: UTF-8 as it is, anything
/// else (and text that starts with NUL, so the two never meet) as NUL, `x` and the bytes in
/// hex. Two different headers never give the same ID.
fn header_event_id(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.starts_with('\0') => text.to_owned(),
        _ => {
            let mut id = String::with_capacity(2 + 2 * bytes.len());
            id.push_str("\0x");
            for byte in bytes {
                id.push_str(&format!("{byte:02x}"));
            }
            id
        }
    }
}

pub(in crate::engine) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// `record`'s value decoded by the processor's codec ([`Processor::decode_input`]).
pub(in crate::engine) fn decode<P: Processor>(
    processor: &P,
    record: &kafka::Record,
) -> Result<P::Input> {
    processor
        .decode_input(record.value.as_deref().unwrap_or_default())
        .map_err(|message| Error::Decode {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            message,
            cause: None,
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn header_event_ids_are_lossless_and_never_collide() {
        assert_eq!(header_event_id(b"order-17"), "order-17");
        let ids = [
            header_event_id(&[0xff]),
            header_event_id(&[0xfe]),
            header_event_id(&[0xff, 0xfe]),
            // Text that looks like the encoded form gets encoded itself.
            header_event_id("\0xff".as_bytes()),
            header_event_id(b"\0"),
            header_event_id(b"xff"),
        ];
        let distinct: BTreeSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
        assert_eq!(ids[0], "\0xff");
    }
}
