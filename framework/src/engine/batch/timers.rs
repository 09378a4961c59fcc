//! Firing timers (`crate::timers` keeps them): inside a batch's transaction, through the
//! batch's overlay, like a record.
//!
//! ```text
//!  record processed ─► event time = max(event time, its timestamp) ─► event-time timers
//!                      due ≤ event time − timer_lateness fire, in due order
//!  end of a batch, or a poll with no records ─► wall-clock timers due ≤ now fire
//!  a timer fires: its entry deleted + on_timer's writes and outputs, in one overlay layer
//! ```
//!
//! Invariants:
//! - A timer's removal and what its handler did enter the batch together; a handler that
//!   fails leaves only the removal and the failure's handling (`on_error`), so a timer
//!   that always fails cannot stall its partition.
//! - Event-time timers fire right after the record that moved the event time past them,
//!   before the next record: where batches are cut does not change what a timer sees.
//! - At most [`MAX_FIRINGS`] timers fire per partition per pass: a handler that
//!   schedules itself again as already due cannot loop for ever.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use crate::engine::batch::dead_letters::FailureClass;
use crate::engine::batch::record::Rules;
use crate::engine::batch::{Batch, Part, merge};
use crate::engine::seams::{Sink, Source};
use crate::kafka;
use crate::processor::{Context, Processor, RecordMeta};
use crate::timers::{self, Timer, TimerClock};
use crate::txlog::View;
use crate::wire::DLQ_TIMER;
use crate::{Error, Result};

/// Timers fired per partition per pass, at most (the rest fire in the next).
const MAX_FIRINGS: usize = 10_000;
/// Due timers read per range read.
const READ_AHEAD: usize = 64;

impl<S: Source, K: Sink<S>> Batch<'_, S, K> {
    /// After `record` was processed: its partition's event time moves to its timestamp
    /// if that is later, and the event-time timers now due fire.
    pub(in crate::engine) async fn after_record<P: Processor>(
        &self,
        processor: &mut P,
        record: &kafka::Record,
        part: &mut Part<'_, K::Pending>,
    ) -> Result<()> {
        let partition = record.partition;
        let current = timers::event_time(
            &View::new(&part.snapshot, &part.overlay).record(),
            partition,
        )?;
        let event_time = match (current, record.timestamp_ms) {
            (Some(current), Some(at)) if at > current => Some(at),
            (None, Some(at)) => Some(at),
            (current, _) => current,
        };
        if event_time != current
            && let Some(at) = event_time
        {
            let value = serde_json::to_vec(&at).unwrap_or_default();
            part.overlay
                .put(partition, timers::EVENT_TIME.to_vec(), value);
        }
        if let Some(at) = event_time {
            let up_to = at.saturating_sub(timers::millis(self.config.timer_lateness));
            self.fire_due(
                processor,
                part,
                partition,
                TimerClock::EventTime,
                Some(up_to),
            )
            .await?;
        }
        Ok(())
    }

    /// Fires `partition`'s timers of `clock` due at or before `up_to` (wall clock: the
    /// part's start when `None`), in due order; how many fired or failed.
    pub(in crate::engine) async fn fire_due<P: Processor>(
        &self,
        processor: &mut P,
        part: &mut Part<'_, K::Pending>,
        partition: i32,
        clock: TimerClock,
        up_to: Option<i64>,
    ) -> Result<usize> {
        let up_to = up_to.unwrap_or(part.now_ms);
        let (from, to) = timers::due_range(clock, up_to);
        let mut fired = 0;
        while fired < MAX_FIRINGS {
            let due = View::new(&part.snapshot, &part.overlay)
                .state_range(partition, &from, &to, READ_AHEAD)?;
            if due.is_empty() {
                break;
            }
            for (entry, _) in due {
                let Some(timer) = timers::parse_due_entry(&entry, partition) else {
                    return Err(Error::Corrupt {
                        what: format!("a timer entry of partition {partition}"),
                        message: format!("{:?} does not parse", String::from_utf8_lossy(&entry)),
                        cause: None,
                    });
                };
                self.fire(processor, part, timer).await?;
                fired += 1;
            }
        }
        if fired >= MAX_FIRINGS {
            tracing::warn!(
                partition,
                fired,
                "many timers due at once: the rest fire in the next batch"
            );
        }
        Ok(fired)
    }

    /// Fires one timer into `part`: its removal with what `on_timer` did, or, when the
    /// handler fails, its removal and the failure handled per `on_error`.
    async fn fire<P: Processor>(
        &self,
        processor: &mut P,
        part: &mut Part<'_, K::Pending>,
        timer: Timer,
    ) -> Result<()> {
        let config = self.config;
        let partition = timer.partition;
        let meta = RecordMeta {
            topic: config.input_topic.clone(),
            partition,
            offset: -1,
            timestamp_ms: Some(timer.due_ms),
            headers: Vec::new(),
            // What effects' idempotency keys are made of: one per firing.
            event_id: Some(format!("timer:{}@{}", timer.key, timer.due_ms)),
        };
        let view = View::new(&part.snapshot, &part.overlay);
        let mut layers = view.record();
        timers::remove_fired(&mut layers, &timer)?;
        let mut outputs = Vec::new();
        let mut ctx = Context {
            meta: &meta,
            state: &mut layers,
            outputs: &mut outputs,
            declared_outputs: self.declared,
            renamed_outputs: &config.renamed_outputs,
            effects_topic: config.effects_topic.as_deref(),
            operator: &config.group,
            effects_recorded: 0,
            now_ms: part.now_ms,
            timers: true,
            timer_lateness_ms: timers::millis(config.timer_lateness),
        };
        let call = AssertUnwindSafe(processor.on_timer(timer.clone(), &mut ctx))
            .catch_unwind()
            .await;
        let failure = match call {
            Ok(Ok(())) => None,
            Ok(Err(error)) if error.is_fatal() => return Err(error),
            Ok(Err(error)) => Some((FailureClass::Permanent, error)),
            Err(panic) => Some((
                FailureClass::Panic,
                Error::processing(format!(
                    "on_timer panicked: {}",
                    crate::engine::batch::record::panic_message(&*panic)
                )),
            )),
        };
        let writes = layers.into_writes().into_changes();
        let rules = Rules {
            config,
            declared: self.declared,
            changelog: self.changelog,
            output_limits: self.output_limits,
        };
        let failure = failure.or_else(|| rules.oversized(None, &writes, &outputs));
        part.timers_fired += 1;
        match failure {
            None => {
                merge(&mut part.overlay, writes);
                self.send_outputs(outputs, part).await
            }
            Some((class, error)) => {
                // The timer goes (it would fail again), the failure per `on_error`.
                let mut removal = View::new(&part.snapshot, &part.overlay).record();
                timers::remove_fired(&mut removal, &timer)?;
                let removed = removal.into_writes().into_changes();
                merge(&mut part.overlay, removed);
                let record = timer_record(&config.input_topic, &timer);
                let now_ms = part.now_ms;
                self.fail(&record, class, error, 1, &mut part.failed, now_ms)
                    .await
            }
        }
    }

    /// A batch of timers alone, for a poll that brought no records: the wall-clock
    /// timers of `partitions` that are due fire in one transaction. Nothing is begun
    /// when none is due.
    pub(in crate::engine) async fn run_timers<P: Processor>(
        &self,
        processor: &mut P,
        partitions: &BTreeSet<i32>,
    ) -> Result<()> {
        let now = self.config.clock.now_ms();
        let due: Vec<i32> = {
            let snapshot = self.txlog.snapshot()?;
            let overlay = crate::txlog::Overlay::new();
            let view = View::new(&snapshot, &overlay);
            let (from, to) = timers::due_range(TimerClock::WallClock, now);
            let mut due = Vec::new();
            for partition in partitions {
                if !view.state_range(*partition, &from, &to, 1)?.is_empty() {
                    due.push(*partition);
                }
            }
            due
        };
        if due.is_empty() {
            return Ok(());
        }
        // A transaction with no input offsets is never checked against the group's
        // generation (KIP-447): an instance that lost its session would commit the
        // timers its successor fires too (hole D of issue 40, seen against the broker:
        // 20 reminders twice). So it commits the group's committed offsets of these
        // partitions again, which the group refuses from a member of an older generation.
        // At least once commits them too, first, for the same reason (see `commit`), and
        // at most once before it fires anything (as it commits a batch's offsets before
        // processing its records).
        // Never older than the transaction log's progress: the group's answer can lag a
        // batch whose commit is in doubt, and committing it again would move the group's
        // offset back over that batch, whose records would be done again (found by the
        // simulation of issue 40: a refused record's dead letter twice). Exactly once
        // writes the progress in the batch's transaction and at most once after it
        // committed the offsets, so the group may go on from it. Not at least once: it
        // sends the progress outside a transaction, beside the batch's dedup entries,
        // and it may land while one of them does not (a send that timed out); going on
        // from it would leave that record's entry missing for good, where doing the
        // batch again (all a lagging answer costs) is at least once's promise (seed
        // 19387 of the soak).
        let at_least_once = self.config.delivery == crate::DeliveryMode::AtLeastOnce;
        let standing = {
            let committed = self.consumer.committed(due.clone()).await?;
            let mut standing: Vec<(i32, i64)> = Vec::with_capacity(committed.len());
            for (partition, offset) in committed {
                let progress = if at_least_once {
                    None
                } else {
                    self.txlog.progress(partition)?
                };
                if let Some(offset) = offset.max(progress) {
                    standing.push((partition, offset));
                }
            }
            if standing.is_empty() {
                tracing::warn!(
                    partitions = ?due,
                    "wall-clock timers are due on partitions the group has committed no \
                     offset for: they fire with the next record, in its batch"
                );
                return Ok(());
            }
            standing
        };
        if self.config.delivery == crate::DeliveryMode::AtMostOnce {
            self.consumer.commit(standing.clone()).await?;
        }
        self.open(&[]).await?;
        let mut part = Part::new(self.txlog, self.config)?;
        part.standing = standing;
        for partition in due {
            self.fire_due(processor, &mut part, partition, TimerClock::WallClock, None)
                .await?;
        }
        self.commit(&[], part).await
    }
}

/// A failed timer as the record its dead letter copies: the timer's key as the key,
/// the timer as JSON as the value, and an `onceflow-timer` header.
fn timer_record(input: &str, timer: &Timer) -> kafka::Record {
    let value = serde_json::json!({
        "timer": timer.key,
        "due_ms": timer.due_ms,
        "clock": match timer.clock {
            TimerClock::WallClock => "wall-clock",
            TimerClock::EventTime => "event-time",
        },
    });
    kafka::Record {
        topic: input.to_owned(),
        partition: timer.partition,
        offset: -1,
        key: Some(timer.key.clone().into_bytes()),
        value: Some(value.to_string().into_bytes()),
        headers: vec![(DLQ_TIMER.to_owned(), Some(timer.key.clone().into_bytes()))],
        timestamp_ms: Some(timer.due_ms),
    }
}
