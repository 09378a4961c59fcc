//! One batch: process every record, then commit outputs, changelog and offsets together.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::panic::AssertUnwindSafe;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::FutureExt;

use crate::config::{DeliveryMode, EngineConfig};
use crate::engine::dead_letters::{FailureClass, Failures};
use crate::engine::seams::{Landing, Outgoing, Sink, Source};
use crate::engine::stats::Stats;
use crate::engine::{changelog, crash_point};
use crate::event::{Codec, Event, Json};
use crate::kafka;
use crate::processor::{Context, Output, Processor, RecordMeta};
use crate::txlog::{Change, Landed, Overlay, Snapshot, TxLog};
use crate::{Error, Result};

/// Dedup entries expired per partition per batch, at most: expiry keeps pace with load
/// without making any one batch large.
const EXPIRE_PER_BATCH: usize = 1_000;

pub(super) struct Batch<'a, S, K> {
    pub(super) config: &'a EngineConfig,
    pub(super) consumer: &'a S,
    pub(super) producer: &'a K,
    pub(super) txlog: &'a Arc<TxLog>,
    pub(super) stats: &'a Arc<Stats>,
    pub(super) declared: &'a BTreeSet<String>,
    pub(super) changelog: &'a str,
    /// The largest record each output topic takes (key and value together).
    pub(super) output_limits: &'a BTreeMap<String, usize>,
}

impl<S: Source, K: Sink<S>> Batch<'_, S, K> {
    /// Processes `records` and commits the result. On error nothing of the uncommitted
    /// part is committed (exactly-once) and the caller aborts and rewinds.
    ///
    /// In exactly-once mode a record that fails transiently splits the batch: what came
    /// before it commits, the backoff wait runs with no transaction open, and a new
    /// transaction takes the record's next attempt and the rest of the batch. So no wait
    /// counts against `transaction.timeout.ms`, and finished work is not held back by it.
    pub(super) async fn run<P: Processor>(
        &self,
        processor: &mut P,
        records: Vec<kafka::Record>,
    ) -> Result<()> {
        let config = self.config;
        match config.delivery {
            DeliveryMode::ExactlyOnce => self.producer.begin()?,
            DeliveryMode::AtMostOnce => self.consumer.commit(next_offsets(&records)).await?,
            DeliveryMode::AtLeastOnce => {}
        }
        let mut part = Part::new(self.txlog, config.dedup_window)?;
        let mut first = 0;
        let mut index = 0;
        let mut retry = Retry::new(config);
        // A transaction open longer than `transaction.timeout.ms` is aborted by its
        // coordinator: a slow batch commits what it has done at half of it.
        let bound = config.transaction_timeout / 2;
        let mut begun = std::time::Instant::now();
        let timed_out = |error: Error, begun: std::time::Instant| match error {
            Error::Fenced { detail, .. }
                if config.delivery == DeliveryMode::ExactlyOnce
                    && begun.elapsed() >= config.transaction_timeout =>
            {
                Error::TransactionTimedOut {
                    open_for: begun.elapsed(),
                    timeout: config.transaction_timeout,
                    detail,
                }
            }
            other => other,
        };
        while let Some(record) = records.get(index) {
            let step = self
                .step(processor, record, &mut part, &mut retry)
                .await
                .map_err(|e| timed_out(e, begun))?;
            match step {
                Step::Next => {
                    index += 1;
                    retry = Retry::new(config);
                    if config.delivery == DeliveryMode::ExactlyOnce
                        && begun.elapsed() >= bound
                        && index < records.len()
                    {
                        tracing::debug!(
                            committed = index - first,
                            open_for = ?begun.elapsed(),
                            "the transaction is open for half its timeout: committing what is done"
                        );
                        self.commit(&records[first..index], part)
                            .await
                            .map_err(|e| timed_out(e, begun))?;
                        part = Part::new(self.txlog, config.dedup_window)?;
                        first = index;
                        self.producer.begin()?;
                        begun = std::time::Instant::now();
                    }
                }
                Step::Wait(delay) => {
                    let done = &records[first..index];
                    if done.is_empty() {
                        self.producer.abort().await?;
                    } else {
                        self.commit(done, part).await?;
                        // After the apply: the new part reads what this one committed.
                        part = Part::new(self.txlog, config.dedup_window)?;
                    }
                    first = index;
                    tracing::debug!(
                        partition = record.partition,
                        offset = record.offset,
                        committed = done.len(),
                        ?delay,
                        "committed the records before a transient failure; waiting with no transaction open"
                    );
                    tokio::time::sleep(delay).await;
                    self.producer.begin()?;
                    begun = std::time::Instant::now();
                }
            }
        }
        self.commit(&records[first..], part)
            .await
            .map_err(|e| timed_out(e, begun))
    }

    /// Handles `record`, which fails every transaction it is in, per `on_error` in a
    /// transaction of its own (dead-lettered with `class`, skipped, or the instance stops),
    /// and commits its offset.
    pub(super) async fn fail_alone(
        &self,
        record: &kafka::Record,
        class: FailureClass,
        error: Error,
    ) -> Result<()> {
        let config = self.config;
        match config.delivery {
            DeliveryMode::ExactlyOnce => self.producer.begin()?,
            DeliveryMode::AtMostOnce => {
                self.consumer
                    .commit(next_offsets(std::slice::from_ref(record)))
                    .await?
            }
            DeliveryMode::AtLeastOnce => {}
        }
        let mut part = Part::new(self.txlog, config.dedup_window)?;
        let now_ms = part.now_ms;
        self.fail(record, class, error, 1, &mut part.failed, now_ms)
            .await?;
        self.commit(std::slice::from_ref(record), part).await
    }

    /// Handles one record into `part`: skipped as a duplicate, processed, or failed per
    /// `on_error`; or, in exactly-once mode, a transient failure to wait out and try again.
    async fn step<P: Processor>(
        &self,
        processor: &mut P,
        record: &kafka::Record,
        part: &mut Part<'_, K::Pending>,
        retry: &mut Retry,
    ) -> Result<Step> {
        let now_ms = part.now_ms;
        // A record that does not decode has no event ID to deduplicate by.
        let input: P::Input = match decode(record) {
            Ok(input) => input,
            Err(error) => {
                self.fail(
                    record,
                    FailureClass::Decode,
                    error,
                    retry.attempt,
                    &mut part.failed,
                    now_ms,
                )
                .await?;
                return Ok(Step::Next);
            }
        };
        let event_id = match self.event_id(&input, record) {
            Ok(id) => id,
            Err((class, error)) => {
                self.fail(record, class, error, 1, &mut part.failed, now_ms)
                    .await?;
                return Ok(Step::Next);
            }
        };
        if let Some(id) = &event_id
            && (part.overlay.is_processed(record.partition, id)
                || part
                    .snapshot
                    .is_processed(record.partition, id, part.window_start_ms)?)
        {
            tracing::debug!(
                partition = record.partition,
                offset = record.offset,
                id,
                "duplicate skipped"
            );
            part.duplicates += 1;
            return Ok(Step::Next);
        }
        if event_id.is_none() {
            part.without_id += 1;
            // Once per instance: a processor may mean it, but an upstream that stopped
            // sending IDs should not go unnoticed.
            if part.without_id == 1
                && self
                    .stats
                    .without_event_id
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 0
            {
                tracing::warn!(
                    partition = record.partition,
                    offset = record.offset,
                    header = %self.config.event_id_header,
                    "a record without an event ID (none, or an empty one): processed, but \
                     not deduplicated by ID (counted in onceflow_records_without_event_id_total; \
                     require_event_id dead-letters such records instead)"
                );
            }
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
            .process_one(processor, input, record, &meta, part, retry)
            .await
        {
            Processed::Done(outputs, writes) => (outputs, writes),
            Processed::Wait(delay) => return Ok(Step::Wait(delay)),
            Processed::Failed {
                class,
                error,
                attempts,
            } => {
                if error.is_fatal() {
                    return Err(error);
                }
                self.fail(record, class, error, attempts, &mut part.failed, now_ms)
                    .await?;
                return Ok(Step::Next);
            }
        };
        // librdkafka refuses a record over `message.max.bytes` when it is sent, which
        // would fail the whole transaction again on every retry: check first, and treat
        // it as this input's failure, before any of its outputs enters the transaction.
        let limit = |topic: &str| self.output_limits.get(topic).copied().unwrap_or(usize::MAX);
        // The same for what the record adds to the changelog: a state value (or an event
        // ID) over the changelog's limit would fail every transaction it is in.
        let writes = writes.into_changes();
        let changelog_limit = limit(self.changelog);
        // Sizes only: nothing is encoded (or copied) on this path, which every record takes.
        let oversized = event_id
            .as_deref()
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
            };
            self.fail(record, class, error, 1, &mut part.failed, now_ms)
                .await?;
            return Ok(Step::Next);
        }
        if let Some(output) = outputs.iter().find(|o| o.size() > limit(&o.topic)) {
            let error = Error::Encode {
                what: format!("a record for `{}`", output.topic),
                message: format!(
                    "{} bytes, over the {} bytes the producer and the topic accept \
                     (message.max.bytes, max.message.bytes)",
                    output.size(),
                    limit(&output.topic)
                ),
            };
            self.fail(
                record,
                FailureClass::OutputTooLarge,
                error,
                1,
                &mut part.failed,
                now_ms,
            )
            .await?;
            return Ok(Step::Next);
        }
        crash_point!("onceflow-after-process");
        merge(&mut part.overlay, writes);
        for output in outputs {
            part.outputs.push(
                self.producer
                    .send(Outgoing {
                        topic: &output.topic,
                        partition: None,
                        key: output.key.as_deref(),
                        value: Some(&output.value),
                        headers: &[],
                    })
                    .await?,
            );
        }
        crash_point!("onceflow-after-produce");
        if let Some(id) = event_id {
            part.overlay
                .mark_processed(record.partition, id, record.offset, now_ms);
        }
        Ok(Step::Next)
    }

    /// Commits `records`, handled into `part`: outputs, changelog and offsets together (or
    /// per the delivery mode), then applies the part to the transaction log.
    async fn commit(
        &self,
        records: &[kafka::Record],
        mut part: Part<'_, K::Pending>,
    ) -> Result<()> {
        // Nothing reads through the snapshot any more; let redb reuse what it pins.
        drop(part.snapshot);
        let config = self.config;
        let next_offsets = next_offsets(records);
        let outputs = part.outputs.len() as u64;
        let mut pending_outputs = std::mem::take(&mut part.outputs);
        pending_outputs.append(&mut part.failed.pending);
        let mut overlay = std::mem::take(&mut part.overlay);
        self.expire(&mut overlay, &next_offsets, part.now_ms)?;

        let mut changes = if overlay.is_empty() {
            Vec::new()
        } else {
            overlay.into_changes()
        };
        changelog::add_progress(&mut changes, &next_offsets);
        // At least once has no transaction to make outputs and dedup entries land
        // together: the outputs and dead letters must have landed before any dedup entry
        // is written, or a failed output would leave its input marked processed (and its
        // retry skipped as a duplicate). So: outputs landed, then the changelog, then the
        // consumer commit.
        if config.delivery == DeliveryMode::AtLeastOnce {
            self.producer.flush().await?;
            for pending in pending_outputs.drain(..) {
                pending.landed().await?;
            }
        }
        let mut pending_changelog: Vec<(i32, K::Pending)> = Vec::new();
        for (partition, list) in &changes {
            for change in list {
                let (key, value) = change.encode();
                let pending = self
                    .producer
                    .send(Outgoing {
                        topic: self.changelog,
                        partition: Some(*partition),
                        key: Some(&key),
                        value: value.as_deref(),
                        headers: &[],
                    })
                    .await?;
                pending_changelog.push((*partition, pending));
            }
        }

        crash_point!("onceflow-before-send-offsets");
        // An abortable failure on demand, for the tests of the abort-and-go-on path.
        #[cfg(feature = "failpoints")]
        if fail::eval("onceflow-fail-batch", |_| ()).is_some() {
            return Err(Error::Timeout {
                what: "the batch (failpoint onceflow-fail-batch)".into(),
                after: Duration::ZERO,
                detail: "injected failure".into(),
            });
        }
        let committing = std::time::Instant::now();
        // Where the changelog records landed, once acknowledged (with the transaction's
        // commit at the latest).
        let mut landed: BTreeMap<i32, Landed> = BTreeMap::new();
        let mut await_changelog = async |pending_changelog: Vec<(i32, K::Pending)>| -> Result<()> {
            for (partition, pending) in pending_changelog {
                let (_, offset) = pending.landed().await?;
                let span = landed.entry(partition).or_insert(Landed {
                    first: offset,
                    next: offset + 1,
                });
                span.first = span.first.min(offset);
                span.next = span.next.max(offset + 1);
            }
            Ok(())
        };
        match config.delivery {
            DeliveryMode::ExactlyOnce => {
                self.producer
                    .send_offsets(self.consumer, &config.input_topic, next_offsets.clone())
                    .await?;
                crash_point!("onceflow-before-commit");
                self.producer.commit().await?;
                await_changelog(pending_changelog).await?;
            }
            DeliveryMode::AtLeastOnce => {
                self.producer.flush().await?;
                await_changelog(pending_changelog).await?;
                crash_point!("onceflow-before-commit");
                self.consumer.commit(next_offsets.clone()).await?;
            }
            DeliveryMode::AtMostOnce => {
                self.producer.flush().await?;
                await_changelog(pending_changelog).await?;
            }
        }
        crash_point!("onceflow-after-commit-before-apply");
        metrics::histogram!("onceflow_commit_seconds").record(committing.elapsed().as_secs_f64());

        let expired: u64 = changes
            .iter()
            .flat_map(|(_, list)| list)
            .filter(|c| matches!(c, Change::Expired { .. }))
            .count() as u64;
        let applied: Vec<(i32, Vec<Change>, Option<Landed>)> = changes
            .into_iter()
            .map(|(partition, list)| {
                let span = landed.get(&partition).copied();
                (partition, list, span)
            })
            .collect();
        let txlog = Arc::clone(self.txlog);
        let transactional = config.delivery == DeliveryMode::ExactlyOnce;
        kafka::blocking("apply the batch to the transaction log", move || {
            txlog.apply_committed(&applied, transactional)
        })
        .await?;

        Stats::add(&self.stats.records_in, records.len() as u64);
        Stats::add(&self.stats.outputs, outputs);
        Stats::add(&self.stats.duplicates_skipped, part.duplicates);
        Stats::add(&self.stats.expired_entries, expired);
        Stats::add(&self.stats.dead_lettered, part.failed.dead_lettered);
        Stats::add(&self.stats.skipped, part.failed.skipped);
        Stats::add(&self.stats.without_event_id, part.without_id);
        Stats::add(&self.stats.commits, 1);
        metrics::histogram!("onceflow_batch_records").record(records.len() as f64);
        tracing::debug!(
            records = records.len(),
            outputs,
            duplicates = part.duplicates,
            "batch committed"
        );
        Ok(())
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
    /// returned (`Processed::Wait`) for the caller to take with no transaction open,
    /// otherwise it is taken here. A panic is a permanent failure.
    async fn process_one<P: Processor>(
        &self,
        processor: &mut P,
        input: P::Input,
        record: &kafka::Record,
        meta: &RecordMeta,
        part: &Part<'_, K::Pending>,
        retry: &mut Retry,
    ) -> Processed {
        let config = self.config;
        let mut input = Some(input);
        loop {
            let attempt = retry.attempt;
            let this_input = match input.take() {
                Some(input) => input,
                None => match decode(record) {
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
            let mut writes = Overlay::new();
            let mut ctx = Context {
                meta,
                overlay: &mut writes,
                batch: &part.overlay,
                txlog: &part.snapshot,
                outputs: &mut outputs,
                declared_outputs: self.declared,
            };
            let call = AssertUnwindSafe(processor.process(this_input, &mut ctx))
                .catch_unwind()
                .await;
            let error = match call {
                Ok(Ok(())) => return Processed::Done(outputs, writes),
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

    /// Adds this batch's share of dedup expiries to the overlay.
    fn expire(&self, overlay: &mut Overlay, partitions: &[(i32, i64)], now_ms: i64) -> Result<()> {
        let window_ms = i64::try_from(self.config.dedup_window.as_millis()).unwrap_or(i64::MAX);
        let older_than = now_ms.saturating_sub(window_ms);
        for (partition, _) in partitions {
            for id in self.txlog.expired(
                *partition,
                older_than,
                self.config.dedup_max_entries,
                EXPIRE_PER_BATCH,
            )? {
                if !overlay.is_processed(*partition, &id) {
                    overlay.expire(*partition, id);
                }
            }
        }
        Ok(())
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

/// What the batch loop does after a record.
enum Step {
    Next,
    /// Commit what is done, wait this long with no transaction open, try the record again.
    Wait(Duration),
}

/// The records of a batch handled since its last commit, and what they produced.
struct Part<'a, P> {
    /// The committed log as of the part's start: redb changes only when a part is applied.
    snapshot: Snapshot<'a>,
    overlay: Overlay,
    outputs: Vec<P>,
    duplicates: u64,
    /// Records processed without an event ID.
    without_id: u64,
    failed: Failures<P>,
    /// When the part started: the time of its dedup entries and expiries.
    now_ms: i64,
    /// Dedup entries processed before this are outside the window: not duplicates.
    window_start_ms: i64,
}

impl<'a, P> Part<'a, P> {
    fn new(txlog: &'a TxLog, dedup_window: Duration) -> Result<Self> {
        let now_ms = now_ms();
        let window_ms = i64::try_from(dedup_window.as_millis()).unwrap_or(i64::MAX);
        Ok(Part {
            snapshot: txlog.snapshot()?,
            overlay: Overlay::new(),
            outputs: Vec::new(),
            duplicates: 0,
            without_id: 0,
            failed: Failures {
                pending: Vec::new(),
                dead_lettered: 0,
                skipped: 0,
            },
            now_ms,
            window_start_ms: now_ms.saturating_sub(window_ms),
        })
    }
}

/// One record's retry budget: its attempts and the backoff between them.
struct Retry {
    /// The attempt about to be made (1 for the first).
    attempt: u32,
    started: std::time::Instant,
    delays: backon::ExponentialBackoff,
}

impl Retry {
    fn new(config: &EngineConfig) -> Self {
        Retry {
            attempt: 1,
            started: std::time::Instant::now(),
            delays: ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(20))
                .with_max_delay(Duration::from_secs(2))
                .with_jitter()
                .with_max_times(config.max_attempts.saturating_sub(1) as usize)
                .build(),
        }
    }

    /// The wait before the next attempt, if the budget allows one (and counts it).
    fn next_delay(&mut self, max_retry_time: Duration) -> Option<Duration> {
        let delay = self.delays.next()?;
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

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

fn decode<T: serde::de::DeserializeOwned>(record: &kafka::Record) -> Result<T> {
    Json.decode(record.value.as_deref().unwrap_or_default())
        .map_err(|message| Error::Decode {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            message,
        })
}

/// Moves one record's writes into the batch's overlay.
fn merge(batch: &mut Overlay, writes: Vec<(i32, Vec<Change>)>) {
    for (partition, changes) in writes {
        for change in changes {
            match change {
                Change::State {
                    key,
                    value: Some(value),
                } => batch.put(partition, key, value),
                Change::State { key, value: None } => batch.delete(partition, key),
                Change::Processed {
                    id,
                    offset,
                    processed_at_ms,
                } => batch.mark_processed(partition, id, offset, processed_at_ms),
                Change::Expired { id } => batch.expire(partition, id),
                // A processor's writes never record progress; the batch does, at commit.
                Change::Progress { .. } => {}
            }
        }
    }
}

/// The offset after the last record of each partition: what the group commits.
fn next_offsets(records: &[kafka::Record]) -> Vec<(i32, i64)> {
    let mut next = BTreeMap::new();
    for record in records {
        next.insert(record.partition, record.offset + 1);
    }
    next.into_iter().collect()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
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
