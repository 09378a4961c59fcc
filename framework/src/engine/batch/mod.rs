//! One batch: its records handled one by one (`record.rs` decides, this file sends), then
//! committed together (`commit.rs`). A transient failure splits the batch (what came
//! before commits, the wait holds no transaction open); a transaction open for half its
//! timeout commits what is done and goes on in a new one. A record it cannot process is
//! handled per `on_error` (`on_error.rs`; the dead letter's contract is `dead_letters.rs`); timers
//! due fire in a batch of their own (`timers.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{DeliveryMode, EngineConfig};
use crate::crash::crash_point;
use crate::engine::seams::{Outgoing, Sink, Source};
use crate::engine::stats::Stats;
use crate::kafka;
use crate::processor::Processor;
use crate::txlog::{Change, Overlay, Snapshot, TxLog, View};
use crate::{Error, Result};
use dead_letters::FailureClass;
use record::{Retry, Rules, Seen, Verdict};

mod commit;
pub(crate) mod dead_letters;
mod on_error;
pub(in crate::engine) mod record;
mod timers;

/// Records of this batch that could not be processed.
pub(super) struct Failures<P> {
    pub(super) pending: Vec<P>,
    /// At most once: the dead letters, sent once the part is applied.
    pub(super) deferred: Vec<crate::processor::Output>,
    pub(super) dead_lettered: u64,
    pub(super) skipped: u64,
}

/// One batch's surroundings (the producer is the one recovery may have renewed).
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
        self.open(&records).await?;
        let mut part = Part::new(self.txlog, config)?;
        let mut first = 0;
        let mut index = 0;
        // A transaction open longer than `transaction.timeout.ms` is aborted by its
        // coordinator: a slow batch commits what it has done at half of it.
        let bound = config.transaction_timeout / 2;
        let mut begun = std::time::Instant::now();
        let mut retry = Retry::new(config, begun);
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
                    // One clock read per record: the next one's start, and how long the
                    // transaction has been open.
                    let now = std::time::Instant::now();
                    retry = Retry::new(config, now);
                    if config.delivery == DeliveryMode::ExactlyOnce
                        && now.duration_since(begun) >= bound
                        && index < records.len()
                    {
                        tracing::debug!(
                            committed = index - first,
                            open_for = ?now.duration_since(begun),
                            "the transaction is open for half its timeout: committing what is done"
                        );
                        self.commit(&records[first..index], part)
                            .await
                            .map_err(|e| timed_out(e, begun))?;
                        part = Part::new(self.txlog, config)?;
                        first = index;
                        self.producer.begin()?;
                        begun = std::time::Instant::now();
                        // The commit is not the next record's time.
                        retry = Retry::new(config, begun);
                    }
                }
                Step::Wait(delay) => {
                    let done = &records[first..index];
                    if done.is_empty() {
                        self.producer.abort().await?;
                    } else {
                        self.commit(done, part).await?;
                        // After the apply: the new part reads what this one committed.
                        part = Part::new(self.txlog, config)?;
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
        if processor.uses_timers() {
            let partitions: BTreeSet<i32> = records.iter().map(|r| r.partition).collect();
            for partition in partitions {
                self.fire_due(
                    processor,
                    &mut part,
                    partition,
                    crate::TimerClock::WallClock,
                    None,
                )
                .await?;
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
        self.open(std::slice::from_ref(record)).await?;
        let mut part = Part::new(self.txlog, config)?;
        let now_ms = part.now_ms;
        self.fail(record, class, error, 1, &mut part.failed, now_ms)
            .await?;
        self.commit(std::slice::from_ref(record), part).await
    }

    /// Handles one record into `part`: skipped as a duplicate, processed (its outputs
    /// sent), or failed per `on_error`; or, in exactly-once mode, a transient failure to
    /// wait out and try again.
    async fn step<P: Processor>(
        &self,
        processor: &mut P,
        record: &kafka::Record,
        part: &mut Part<'_, K::Pending>,
        retry: &mut Retry,
    ) -> Result<Step> {
        let now_ms = part.now_ms;
        let rules = Rules {
            config: self.config,
            declared: self.declared,
            changelog: self.changelog,
            output_limits: self.output_limits,
        };
        let seen = Seen {
            view: View::new(&part.snapshot, &part.overlay),
            window_start_ms: part.window_start_ms,
            now_ms: part.now_ms,
        };
        let (outputs, writes, event_id) =
            match rules.handle(processor, record, &seen, retry).await? {
                Verdict::Done {
                    outputs,
                    writes,
                    event_id,
                } => (outputs, writes, event_id),
                Verdict::Duplicate => {
                    part.duplicates += 1;
                    return Ok(Step::Next);
                }
                Verdict::Wait(delay) => return Ok(Step::Wait(delay)),
                Verdict::Failed {
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
        if event_id.is_none() {
            self.count_without_id(record, part);
        }
        crash_point!(await "onceflow-after-process");
        #[cfg(debug_assertions)]
        let changed_state = writes.iter().any(|(_, changes)| {
            changes
                .iter()
                .any(|change| matches!(change, Change::State { .. }))
        });
        merge(&mut part.overlay, writes);
        self.send_outputs(outputs, part).await?;
        crash_point!(await "onceflow-after-produce");
        if let Some(id) = event_id {
            #[cfg(debug_assertions)]
            if changed_state {
                part.changed_state.push((record.partition, id.clone()));
            }
            part.overlay
                .mark_processed(record.partition, id, record.offset, now_ms);
        }
        if processor.uses_timers() {
            self.after_record(processor, record, part).await?;
        }
        Ok(Step::Next)
    }

    /// Sends what a record (or a timer) emitted into the open transaction.
    pub(super) async fn send_outputs(
        &self,
        outputs: Vec<crate::processor::Output>,
        part: &mut Part<'_, K::Pending>,
    ) -> Result<()> {
        if self.config.delivery == DeliveryMode::AtMostOnce {
            part.deferred_outputs += outputs.len() as u64;
            part.deferred.extend(outputs);
            return Ok(());
        }
        for output in outputs {
            part.outputs.push(self.send_output(&output).await?);
        }
        Ok(())
    }

    /// Sends one output (or dead letter) through the producer.
    pub(super) async fn send_output(
        &self,
        output: &crate::processor::Output,
    ) -> Result<K::Pending> {
        let headers: Vec<(&str, Option<&[u8]>)> = output
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_deref()))
            .collect();
        self.producer
            .send(Outgoing {
                topic: &output.topic,
                partition: output.partition,
                key: output.key.as_deref(),
                value: output.value.as_deref(),
                headers: &headers,
                timestamp_ms: output.timestamp_ms,
            })
            .await
    }

    /// Counts a record processed without an event ID; warns once per instance: a
    /// processor may mean it, but an upstream that stopped sending IDs should not go
    /// unnoticed.
    fn count_without_id(&self, record: &kafka::Record, part: &mut Part<'_, K::Pending>) {
        part.without_id += 1;
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
}

/// What the batch loop does after a record.
enum Step {
    Next,
    /// Commit what is done, wait this long with no transaction open, try the record again.
    Wait(Duration),
}

/// The records of a batch handled since its last commit, and what they produced.
pub(super) struct Part<'a, P> {
    /// The committed log as of the part's start: redb changes only when a part is applied.
    pub(super) snapshot: Snapshot<'a>,
    pub(super) overlay: Overlay,
    pub(super) outputs: Vec<P>,
    /// At most once: the outputs and dead letters, sent only once the part's changelog
    /// landed and it was applied (see `commit`).
    pub(super) deferred: Vec<crate::processor::Output>,
    /// Of `deferred`, the processor's outputs (the rest are dead letters).
    pub(super) deferred_outputs: u64,
    pub(super) duplicates: u64,
    /// Records processed without an event ID.
    pub(super) without_id: u64,
    pub(super) failed: Failures<P>,
    /// When the part started: the time of its dedup entries and expiries.
    pub(super) now_ms: i64,
    /// Timers fired in this part.
    pub(super) timers_fired: u64,
    /// Dedup entries processed before this are outside the window: not duplicates.
    pub(super) window_start_ms: i64,
    /// When the part started, for the stage timings (`onceflow_batch_stage_seconds`).
    pub(super) opened: std::time::Instant,
    /// For a part with no records (timers alone): the group's committed offsets it
    /// commits again, so that its transaction carries the group's metadata and is
    /// refused from an instance that lost its session.
    pub(super) standing: Vec<(i32, i64)>,
    /// The records with an event ID that changed state in this part (debug builds: the
    /// commit checks that each one's dedup entry goes with its changes).
    #[cfg(debug_assertions)]
    pub(super) changed_state: Vec<(i32, String)>,
}

impl<'a, P> Part<'a, P> {
    pub(super) fn new(txlog: &'a TxLog, config: &EngineConfig) -> Result<Self> {
        let now_ms = config.clock.now_ms();
        let window_ms = i64::try_from(config.dedup_window.as_millis()).unwrap_or(i64::MAX);
        Ok(Part {
            snapshot: txlog.snapshot()?,
            overlay: Overlay::new(),
            outputs: Vec::new(),
            deferred: Vec::new(),
            deferred_outputs: 0,
            duplicates: 0,
            without_id: 0,
            failed: Failures {
                pending: Vec::new(),
                deferred: Vec::new(),
                dead_lettered: 0,
                skipped: 0,
            },
            now_ms,
            timers_fired: 0,
            window_start_ms: now_ms.saturating_sub(window_ms),
            opened: std::time::Instant::now(),
            standing: Vec::new(),
            #[cfg(debug_assertions)]
            changed_state: Vec::new(),
        })
    }
}

/// Moves one record's writes into the batch's overlay.
pub(super) fn merge(batch: &mut Overlay, writes: Vec<(i32, Vec<Change>)>) {
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
