//! Counters the engine keeps, readable while it runs.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Live counters of one engine.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) records_in: AtomicU64,
    pub(crate) outputs: AtomicU64,
    pub(crate) duplicates_skipped: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) aborts: AtomicU64,
    pub(crate) replayed_records: AtomicU64,
    pub(crate) expired_entries: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) without_event_id: AtomicU64,
    pub(crate) assignments: AtomicU64,
    pub(crate) timers_fired: AtomicU64,
    pub(crate) already_committed: AtomicU64,
    pub(crate) producers_replaced: AtomicU64,
    phase: AtomicU8,
    /// The batch being committed: counted when it commits, or when recovery settles
    /// whether its failed commit went through ([`Stats::settle`]).
    in_doubt: Mutex<Option<InDoubt>>,
}

/// What one batch adds to the counters once it is known to have committed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tally {
    pub(crate) records_in: u64,
    pub(crate) outputs: u64,
    pub(crate) duplicates_skipped: u64,
    pub(crate) expired_entries: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) skipped: u64,
    pub(crate) without_event_id: u64,
    pub(crate) timers_fired: u64,
}

/// A batch whose commit is under way: where it ends in each of its partitions (the
/// offsets it commits for the group) and what it adds to the counters.
#[derive(Debug)]
struct InDoubt {
    ends: Vec<(i32, i64)>,
    tally: Tally,
}

/// Where an engine is in its life, for readiness checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// Opening the transaction log, checking topics, joining the group.
    Starting,
    /// Replaying the changelog of partitions it was given: not processing yet.
    Replaying,
    /// Replaying, and waiting for another producer's open transaction on the changelog
    /// to end: committed records after it are hidden until then.
    WaitingForTransaction,
    /// Processing.
    Running,
    /// Stopped, as asked or on an error.
    Stopped,
}

/// A copy of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Input records in committed batches (a batch whose commit answered with an error
    /// but went through is counted once recovery learns it from the committed offsets).
    pub records_in: u64,
    /// Output records in committed batches.
    pub outputs: u64,
    /// Inputs skipped because their event ID was already processed, in committed batches.
    pub duplicates_skipped: u64,
    /// Batches committed.
    pub commits: u64,
    /// Batches aborted and rewound (not those whose commit went through after all).
    pub aborts: u64,
    /// Changelog records replayed into the transaction log.
    pub replayed_records: u64,
    /// Dedup entries expired.
    pub expired_entries: u64,
    /// Inputs written to the dead-letter topic, in committed batches.
    pub dead_lettered: u64,
    /// Inputs that failed and were skipped (policy `skip`), in committed batches.
    pub skipped: u64,
    /// Inputs processed without an event ID (none, or an empty one), so not
    /// deduplicated by ID, in committed batches.
    pub without_event_id: u64,
    /// Rebalances that gave this instance partitions (each is followed by a changelog
    /// replay). One per start in a stable group: more mean the member was taken out of
    /// the group and joined again.
    pub assignments: u64,
    /// Timers that fired ([`crate::Processor::on_timer`]), in committed batches.
    pub timers_fired: u64,
    /// Records polled again from below where catching up found their partition must go
    /// on from (the changelog shows them committed; the consumer's position lagged),
    /// dropped without being processed. Exactly-once mode only.
    pub already_committed: u64,
    /// Transactional producers replaced by recovery (exactly-once): after a timed-out
    /// transactional request (never used again: it fails closed), a transaction aborted
    /// under the producer, a failed abort, or a fence taken for the instance's own.
    pub producers_replaced: u64,
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StatsSnapshot {
            records_in: get(&self.records_in),
            outputs: get(&self.outputs),
            duplicates_skipped: get(&self.duplicates_skipped),
            commits: get(&self.commits),
            aborts: get(&self.aborts),
            replayed_records: get(&self.replayed_records),
            expired_entries: get(&self.expired_entries),
            dead_lettered: get(&self.dead_lettered),
            skipped: get(&self.skipped),
            without_event_id: get(&self.without_event_id),
            assignments: get(&self.assignments),
            timers_fired: get(&self.timers_fired),
            already_committed: get(&self.already_committed),
            producers_replaced: get(&self.producers_replaced),
        }
    }

    /// Where the engine is: ready to process only in [`Phase::Running`].
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::SeqCst) {
            0 => Phase::Starting,
            1 => Phase::Replaying,
            2 => Phase::Running,
            4 => Phase::WaitingForTransaction,
            _ => Phase::Stopped,
        }
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        let value = match phase {
            Phase::Starting => 0,
            Phase::Replaying => 1,
            Phase::Running => 2,
            Phase::Stopped => 3,
            Phase::WaitingForTransaction => 4,
        };
        self.phase.store(value, Ordering::SeqCst);
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The batch ending at `ends` (its next offset per partition) is about to commit:
    /// its `tally` waits for [`Stats::committed`] or [`Stats::settle`].
    pub(crate) fn committing(&self, ends: Vec<(i32, i64)>, tally: Tally) {
        *self.in_doubt.lock().unwrap_or_else(|e| e.into_inner()) = Some(InDoubt { ends, tally });
    }

    /// The batch being committed committed: counted.
    pub(crate) fn committed(&self) {
        if let Some(batch) = self.take_in_doubt() {
            self.count(&batch.tally);
        }
    }

    /// Recovery from a failed batch moved the partitions to `positions` (the group's
    /// committed offsets; `None` when it moved nowhere, or failed). The batch committed
    /// after all if every partition it ends in is now at its end: a batch starts at the
    /// committed offset and takes at least one record of each of its partitions, so an
    /// aborted one leaves them short of it. Otherwise, or when the failure came before
    /// any commit was tried, the batch counts as aborted.
    pub(crate) fn settle(&self, positions: Option<&[(i32, Option<i64>)]>) {
        let batch = self.take_in_doubt();
        let went_through = match (&batch, positions) {
            (Some(batch), Some(positions)) if !batch.ends.is_empty() => batch
                .ends
                .iter()
                .all(|(partition, end)| positions.contains(&(*partition, Some(*end)))),
            _ => false,
        };
        match batch {
            Some(batch) if went_through => {
                tracing::info!(
                    ends = ?batch.ends,
                    "the failed batch's commit went through after all: counted as committed"
                );
                self.count(&batch.tally);
            }
            _ => Self::add(&self.aborts, 1),
        }
    }

    fn take_in_doubt(&self) -> Option<InDoubt> {
        self.in_doubt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn count(&self, tally: &Tally) {
        Self::add(&self.records_in, tally.records_in);
        Self::add(&self.outputs, tally.outputs);
        Self::add(&self.duplicates_skipped, tally.duplicates_skipped);
        Self::add(&self.expired_entries, tally.expired_entries);
        Self::add(&self.dead_lettered, tally.dead_lettered);
        Self::add(&self.skipped, tally.skipped);
        Self::add(&self.without_event_id, tally.without_event_id);
        Self::add(&self.timers_fired, tally.timers_fired);
        Self::add(&self.commits, 1);
    }
}

/// Asks a running engine to stop after its current batch: it commits that batch, leaves
/// the group and releases its state.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// Asks the engine to stop.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn is_triggered(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
