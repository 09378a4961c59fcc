//! The transaction protocol of a batch, with the delivery mode matched here only: what
//! each mode does before the records are processed ([`Batch::open`]) and how their
//! outputs, changelog and offsets are made durable ([`Batch::commit`]), then the apply to
//! the transaction log.
//!
//! ```text
//!  exactly-once   begin ─ (records) ─ changelog ─ send offsets ─ commit ─ changelog acks
//!  at-least-once        ─ (records) ─ outputs landed ─ changelog landed ─ consumer commit
//!  at-most-once   consumer commit ─ (records) ─ outputs and changelog landed
//!                                            ─► apply to redb with the changelog offsets
//! ```
//!
//! Invariants:
//! - redb is changed only after the batch is durable, and only with the changelog offsets
//!   it reached.
//! - At least once writes a dedup entry only after the outputs and the state changes it
//!   stands for landed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "failpoints")]
use crate::Error;
use crate::Result;
use crate::config::DeliveryMode;
use crate::crash::crash_point;
use crate::engine::batch::{Batch, Part};
use crate::engine::changelog;
use crate::engine::seams::{Landing, Outgoing, Sink, Source};
use crate::engine::stats::Tally;
use crate::kafka;
use crate::txlog::{Change, Landed, Overlay};

/// Dedup entries expired per partition per batch, at most: expiry keeps pace with load
/// without making any one batch large.
const EXPIRE_PER_BATCH: usize = 1_000;

impl<S: Source, K: Sink<S>> Batch<'_, S, K> {
    /// What the delivery mode does before `records` are processed: exactly once opens
    /// the transaction, at most once commits their offsets.
    pub(in crate::engine) async fn open(&self, records: &[kafka::Record]) -> Result<()> {
        match self.config.delivery {
            DeliveryMode::ExactlyOnce => self.producer.begin(),
            // A batch of timers alone has no offsets to commit.
            DeliveryMode::AtMostOnce if records.is_empty() => Ok(()),
            DeliveryMode::AtMostOnce => self.consumer.commit(next_offsets(records)).await,
            DeliveryMode::AtLeastOnce => Ok(()),
        }
    }

    /// Commits `records`, handled into `part`: outputs, changelog and offsets together (or
    /// per the delivery mode), then applies the part to the transaction log.
    pub(in crate::engine) async fn commit(
        &self,
        records: &[kafka::Record],
        mut part: Part<'_, K::Pending>,
    ) -> Result<()> {
        // Nothing reads through the snapshot any more; let redb reuse what it pins.
        drop(part.snapshot);
        let mut stages = Stages::start(part.opened);
        let config = self.config;
        let next_offsets = if records.is_empty() {
            std::mem::take(&mut part.standing)
        } else {
            next_offsets(records)
        };
        let outputs = part.outputs.len() as u64 + part.deferred_outputs;
        let mut deferred = std::mem::take(&mut part.deferred);
        deferred.append(&mut part.failed.deferred);
        let mut pending_outputs = std::mem::take(&mut part.outputs);
        pending_outputs.append(&mut part.failed.pending);
        let mut overlay = std::mem::take(&mut part.overlay);
        self.expire(&mut overlay, &next_offsets, part.now_ms)?;

        let mut changes = if overlay.is_empty() {
            Vec::new()
        } else {
            overlay.into_changes()
        };
        #[cfg(debug_assertions)]
        check_entries_beside_state(&changes, &part.changed_state);
        changelog::add_progress(&mut changes, &next_offsets);
        // Where the changelog records landed, once acknowledged (with the transaction's
        // commit at the latest).
        let mut landed: BTreeMap<i32, Landed> = BTreeMap::new();
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
            // Nothing fences at least once's changelog: an instance that lost its
            // session without knowing yet (a zombie) would write the state of records
            // its successor already did over the successor's newer state, and the next
            // replay would end at the older one: the successor's changes lost, or the
            // replay behind the committed offsets (found by the group simulation of
            // issue 40). So the group checks the batch's generation first: a commit of
            // the offsets it has committed, which moves nothing, is refused from a
            // member of an older generation. Not checked: a partition the group has
            // never committed an offset of, and the time between this commit and the
            // changelog's landing; exactly once leaves no such window.
            let standing = if records.is_empty() {
                next_offsets.clone()
            } else {
                let partitions = first_offsets(records).into_iter().map(|(p, _)| p);
                let committed = self.consumer.committed(partitions.collect()).await?;
                committed
                    .into_iter()
                    .filter_map(|(partition, offset)| offset.map(|offset| (partition, offset)))
                    .collect()
            };
            if !standing.is_empty() {
                self.consumer.commit(standing).await?;
            }
        }
        let mut pending_changelog: Vec<(i32, K::Pending)> = Vec::new();
        // At least once sends outside a transaction, so any record of the changelog may
        // land while one sent before it fails: a dedup entry that landed without the
        // state changes of its record would make the record's next delivery a duplicate
        // and lose its changes for good (hole C of issue 40). So the state changes (and
        // expiries) land first, and only then the dedup entries and progress: a failure
        // in between makes the records come again and do their work twice, which at
        // least once allows. Exactly once sends them all in one transaction.
        let waves: &[Option<Wave>] = if config.delivery == DeliveryMode::AtLeastOnce {
            &[Some(Wave::State), Some(Wave::Entries)]
        } else {
            &[None]
        };
        for wave in waves {
            for (partition, list) in &changes {
                for change in list {
                    if wave.is_some_and(|wave| Wave::of(change) != wave) {
                        continue;
                    }
                    let (key, value) = change.encode();
                    let pending = self
                        .producer
                        .send(Outgoing {
                            topic: self.changelog,
                            partition: Some(*partition),
                            key: Some(&key),
                            value: value.as_deref(),
                            headers: &[],
                            timestamp_ms: None,
                        })
                        .await?;
                    pending_changelog.push((*partition, pending));
                }
            }
            if *wave == Some(Wave::State) {
                self.producer.flush().await?;
                for (partition, pending) in pending_changelog.drain(..) {
                    let (_, offset) = pending.landed().await?;
                    Landed::extend(&mut landed, partition, offset);
                }
            }
        }

        // Counted once the batch is known to have committed: here, or by recovery when
        // the commit answers with an error yet went through.
        let tally = Tally {
            records_in: records.len() as u64,
            outputs,
            duplicates_skipped: part.duplicates,
            expired_entries: changes
                .iter()
                .flat_map(|(_, list)| list)
                .filter(|c| matches!(c, Change::Expired { .. }))
                .count() as u64,
            dead_lettered: part.failed.dead_lettered,
            skipped: part.failed.skipped,
            without_event_id: part.without_id,
            timers_fired: part.timers_fired,
        };
        // A part of timers alone commits the offsets the group already has: where the
        // partitions are after a failure cannot tell whether it went through, so it
        // counts as aborted then (its timers, if it did commit, are not counted).
        let ends = if records.is_empty() {
            Vec::new()
        } else {
            next_offsets.clone()
        };
        self.stats.committing(ends, tally);

        crash_point!(await "onceflow-before-send-offsets");
        // An abortable failure on demand, for the tests of the abort-and-go-on path.
        #[cfg(feature = "failpoints")]
        if fail::eval("onceflow-fail-batch", |_| ()).is_some() {
            return Err(Error::Timeout {
                what: "the batch (failpoint onceflow-fail-batch)".into(),
                after: Duration::ZERO,
                detail: "injected failure".into(),
            });
        }
        let committing = Instant::now();
        let mut await_changelog = async |pending_changelog: Vec<(i32, K::Pending)>| -> Result<()> {
            for (partition, pending) in pending_changelog {
                let (_, offset) = pending.landed().await?;
                Landed::extend(&mut landed, partition, offset);
            }
            Ok(())
        };
        match config.delivery {
            DeliveryMode::ExactlyOnce => {
                let offsets = Instant::now();
                if !next_offsets.is_empty() {
                    self.producer
                        .send_offsets(self.consumer, &config.input_topic, next_offsets.clone())
                        .await?;
                }
                stages.record("offsets", offsets);
                crash_point!(await "onceflow-before-commit");
                let commit = Instant::now();
                self.producer.commit().await?;
                stages.record("commit", commit);
                await_changelog(pending_changelog).await?;
            }
            DeliveryMode::AtLeastOnce => {
                let commit = Instant::now();
                self.producer.flush().await?;
                await_changelog(pending_changelog).await?;
                stages.record("commit", commit);
                crash_point!(await "onceflow-before-commit");
                let offsets = Instant::now();
                if !next_offsets.is_empty() {
                    self.consumer.commit(next_offsets.clone()).await?;
                }
                stages.record("offsets", offsets);
            }
            DeliveryMode::AtMostOnce => {
                self.producer.flush().await?;
                await_changelog(pending_changelog).await?;
            }
        }
        crash_point!(await "onceflow-after-commit-before-apply");
        metrics::histogram!("onceflow_commit_seconds").record(committing.elapsed().as_secs_f64());

        let applied: Vec<(i32, Vec<Change>, Option<Landed>)> = changes
            .into_iter()
            .map(|(partition, list)| {
                let span = landed.get(&partition).copied();
                (partition, list, span)
            })
            .collect();
        let txlog = Arc::clone(self.txlog);
        let transactional = config.delivery == DeliveryMode::ExactlyOnce;
        let sync_interval = config.txlog_sync_interval;
        let apply = Instant::now();
        crate::blocking::blocking("apply the batch to the transaction log", move || {
            txlog.apply_committed(&applied, transactional, sync_interval)
        })
        .await?;
        stages.record("apply", apply);

        self.stats.committed();
        // At most once sends its outputs and dead letters only now: the part's changelog
        // landed and it was applied, so nothing that produced them (a timer's firing,
        // above all: at most once has committed the offsets of records before it
        // processed them, but a timer is state) can happen again after a crash or in
        // another instance. A crash before they land loses them, which at most once
        // allows. (Found by the group simulation of issue 40: a timer's reminder twice
        // after a crash between its sent output and its recorded removal.)
        if !deferred.is_empty() {
            self.send_deferred(deferred).await?;
        }
        metrics::histogram!("onceflow_batch_records").record(records.len() as f64);
        tracing::debug!(
            records = records.len(),
            from = ?first_offsets(records),
            to = ?next_offsets,
            outputs,
            duplicates = part.duplicates,
            handle_ms = stages.handle.as_secs_f64() * 1e3,
            offsets_ms = stages.timed[0],
            commit_ms = stages.timed[1],
            apply_ms = stages.timed[2],
            total_commit_ms = stages.commit_started.elapsed().as_secs_f64() * 1e3,
            "batch committed"
        );
        Ok(())
    }

    /// Sends at most once's outputs and dead letters, and waits until they landed.
    async fn send_deferred(&self, deferred: Vec<crate::processor::Output>) -> Result<()> {
        let mut pending = Vec::with_capacity(deferred.len());
        for output in &deferred {
            pending.push(self.send_output(output).await?);
        }
        self.producer.flush().await?;
        for landing in pending {
            landing.landed().await?;
        }
        Ok(())
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

/// Self-check of debug builds: every record with an event ID that changed state has its
/// dedup entry among the changes its state changes are sent and applied with, and no
/// expiry of that entry after it. A state change applied without its record's entry
/// (or the entry without the change) is how a record is done twice or lost for good.
#[cfg(debug_assertions)]
fn check_entries_beside_state(changes: &[(i32, Vec<Change>)], changed_state: &[(i32, String)]) {
    for (partition, id) in changed_state {
        let last = changes
            .iter()
            .filter(|(p, _)| p == partition)
            .flat_map(|(_, list)| list)
            .rfind(|change| match change {
                Change::Processed { id: entry, .. } | Change::Expired { id: entry } => entry == id,
                _ => false,
            });
        assert!(
            matches!(last, Some(Change::Processed { .. })),
            "the dedup entry of {id} (partition {partition}) does not go with its state \
             changes: {last:?}"
        );
    }
}

/// The two waves in which at least once sends a batch's changelog: what a record changed
/// (state, expiries), then the dedup entries that say it was done (and the progress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wave {
    State,
    Entries,
}

impl Wave {
    fn of(change: &Change) -> Wave {
        match change {
            Change::Processed { .. } | Change::Progress { .. } => Wave::Entries,
            Change::State { .. } | Change::Expired { .. } => Wave::State,
        }
    }
}

/// The stages of a batch, timed into `onceflow_batch_stage_seconds{stage}`: `handle` (its
/// records, from the part's start to its commit), `offsets` (sent to the transaction, or
/// committed by the consumer), `commit` (the transaction's commit, or the outputs and
/// changelog landing) and `apply` (to the transaction log).
struct Stages {
    handle: Duration,
    commit_started: Instant,
    /// `offsets`, `commit` and `apply`, in milliseconds, for the batch's debug event.
    timed: [f64; 3],
}

impl Stages {
    fn start(opened: Instant) -> Self {
        let handle = opened.elapsed();
        metrics::histogram!("onceflow_batch_stage_seconds", "stage" => "handle")
            .record(handle.as_secs_f64());
        Stages {
            handle,
            commit_started: Instant::now(),
            timed: [0.0; 3],
        }
    }

    fn record(&mut self, stage: &'static str, since: Instant) {
        let took = since.elapsed().as_secs_f64();
        metrics::histogram!("onceflow_batch_stage_seconds", "stage" => stage).record(took);
        let slot = match stage {
            "offsets" => 0,
            "commit" => 1,
            _ => 2,
        };
        self.timed[slot] = took * 1e3;
    }
}

/// The offset of the first record of each partition: where the batch began (for its
/// debug event, and at least once's generation check).
fn first_offsets(records: &[kafka::Record]) -> Vec<(i32, i64)> {
    let mut first = BTreeMap::new();
    for record in records {
        first.entry(record.partition).or_insert(record.offset);
    }
    first.into_iter().collect()
}

/// The offset after the last record of each partition: what the group commits.
pub(in crate::engine) fn next_offsets(records: &[kafka::Record]) -> Vec<(i32, i64)> {
    let mut next = BTreeMap::new();
    for record in records {
        next.insert(record.partition, record.offset + 1);
    }
    next.into_iter().collect()
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::check_entries_beside_state;
    use crate::txlog::Change;

    fn state() -> Change {
        Change::State {
            key: b"k".to_vec(),
            value: Some(b"1".to_vec()),
        }
    }

    fn entry(id: &str) -> Change {
        Change::Processed {
            id: id.into(),
            offset: 0,
            processed_at_ms: 0,
        }
    }

    #[test]
    fn a_dedup_entry_beside_its_state_changes_passes_the_self_check() {
        check_entries_beside_state(&[(0, vec![entry("x"), state()])], &[(0, "x".into())]);
    }

    #[test]
    #[should_panic(expected = "does not go with its state changes")]
    fn state_changes_without_their_dedup_entry_fail_the_self_check() {
        check_entries_beside_state(
            &[(0, vec![state()]), (1, vec![entry("x")])],
            &[(0, "x".into())],
        );
    }

    #[test]
    #[should_panic(expected = "does not go with its state changes")]
    fn an_entry_expired_in_the_same_batch_fails_the_self_check() {
        check_entries_beside_state(
            &[(
                0,
                vec![entry("x"), state(), Change::Expired { id: "x".into() }],
            )],
            &[(0, "x".into())],
        );
    }
}
