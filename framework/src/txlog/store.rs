//! [`TxLog`]: reads and atomic, idempotent writes of the redb transaction log.
//!
//! Opening (and rebuilding a damaged file) is in `open.rs`; this file holds what an open log
//! does. Every read runs in its own redb read transaction, and every write in one write
//! transaction, so a reader never sees half a batch.
//!
//! Applies are not synced to the disk one by one: the changelog is the source of truth,
//! and a commit the disk never saw is one the next replay applies again.
//!
//! ```text
//!  apply  apply  apply  apply  apply ─── … ─►  time
//!    D      n      n      n      D            D: durable (Durability::Immediate, an fsync)
//!    │◄─ sync interval ──►│      │            n: in memory only (Durability::None), until
//!    └ checkpoint c1             └ c5            the next D makes it, and all before, durable
//!
//!  killed after the 4th apply: the file opens at c1 ─► the assignment's catch-up replays the
//!  changelog from c1 to the group's committed offset, so applies 2 to 4 are applied again
//! ```
//!
//! Invariants:
//! - A commit is durable about `sync interval` after it was made at the latest (zero:
//!   every commit is durable): the first write once the oldest unsynced commit is that old
//!   commits durably, or the syncer thread does when no write comes (`sync.rs`); closing
//!   syncs too ([`TxLog::sync`], and redb's own close). Writes other than applies (a
//!   changelog adopted, a partition cleared) are durable at once.
//! - Durability is all redb relaxes: every commit is visible to every reader of this
//!   process as soon as it returns. The log is older than what the engine applied only
//!   after the process died, and then nothing of the engine's memory is left (no overlay,
//!   no batch in flight, no owned partition) to disagree with it.
//! - A file that comes back at an earlier commit is consistent as of that commit: each
//!   commit holds a batch's changes together with its checkpoint, `marker_follows`,
//!   progress and counts. So it is a log whose checkpoints are older, which is what a crash
//!   between a Kafka commit and its apply leaves too: the next replay reads from each
//!   checkpoint, re-applies the records since (idempotent, last write wins per key) and goes
//!   on until the progress records reach the group's committed offset. `marker_follows`
//!   only lets a later batch of the engine's own move a checkpoint that its own apply set;
//!   after a restart the replay sets every checkpoint (and clears the mark) first.
//! - What the engine does need of a file on disk: that the changelog still holds, past each
//!   checkpoint, every record since. Compaction keeps the last record per key, which gives
//!   the same outcome; a tombstone is removed only `delete.retention.ms` after compaction
//!   reached it, far longer than any sync interval (an idle log is synced too, so a
//!   checkpoint on disk is never much older than the last apply).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, Table, WriteTransaction,
};

use super::expiry::{self, Edits, Index};
use super::sync::{Durable, Shared, Syncer, Syncing};
use super::tables::{
    CHANGELOG_ID_KEY, CHECKPOINT, EXPIRY, IN_STEP, MARKER_FOLLOWS, PROCESSED, PROCESSED_COUNT,
    PROGRESS, SOURCE, STATE, STATE_COUNT, partition_range, state_error,
};
use super::{Change, PartitionStats};
use crate::{Error, Result};

/// The redb transaction log of one instance.
pub(crate) struct TxLog {
    /// The open file; redb serialises write transactions and lets reads run beside them.
    pub(super) db: Arc<Database>,
    /// Where the file is, for errors and [`TxLog::file_size`].
    pub(super) path: PathBuf,
    /// Bytes of redb's page cache, as opened.
    cache_size: usize,
    /// Which commits are not durable yet, and when the next must be (`sync.rs`).
    shared: Arc<Shared>,
    /// Syncs what is unsynced when no write comes to do it.
    syncer: Syncer,
    /// The time of [`TxLog::in_step_since`] (the engine's clock; a test's in the driver).
    clock: std::sync::Mutex<crate::clock::Clock>,
}

impl fmt::Debug for TxLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxLog")
            .field("path", &self.path)
            .field("cache_size", &self.cache_size)
            .finish_non_exhaustive()
    }
}

/// Where a committed batch's changelog records landed in one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Landed {
    /// Offset of the first record.
    pub(crate) first: i64,
    /// The offset after the last record.
    pub(crate) next: i64,
}

impl Landed {
    /// Widens `partition`'s span in `spans` to take in a record landed at `offset`.
    pub(crate) fn extend(spans: &mut BTreeMap<i32, Landed>, partition: i32, offset: i64) {
        let span = spans.entry(partition).or_insert(Landed {
            first: offset,
            next: offset + 1,
        });
        span.first = span.first.min(offset);
        span.next = span.next.max(offset + 1);
    }
}

/// The log as of one moment (see [`TxLog::snapshot`]). Hold it no longer than the reads of
/// one batch: while it lives, redb cannot reuse the pages later writes free.
pub(crate) struct Snapshot<'a> {
    log: &'a TxLog,
    processed: redb::ReadOnlyTable<(i32, &'static str), (i64, i64)>,
    state: redb::ReadOnlyTable<(i32, &'static [u8]), &'static [u8]>,
}

impl fmt::Debug for Snapshot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("path", &self.log.path)
            .finish_non_exhaustive()
    }
}

impl Snapshot<'_> {
    /// Whether `id` has a dedup entry in `partition` processed at or after
    /// `not_before_ms`: an older entry is outside the dedup window even before expiry
    /// removes it, so it no longer makes a duplicate.
    pub(crate) fn is_processed(
        &self,
        partition: i32,
        id: &str,
        not_before_ms: i64,
    ) -> Result<bool> {
        let found = self
            .processed
            .get((partition, id))
            .map_err(|e| self.log.error("looking up a processed event", e))?;
        Ok(found.is_some_and(|guard| guard.value().1 >= not_before_ms))
    }

    /// The value of state `key` in `partition`.
    pub(crate) fn state(&self, partition: i32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let found = self
            .state
            .get((partition, key))
            .map_err(|e| self.log.error("reading state", e))?;
        Ok(found.map(|guard| guard.value().to_vec()))
    }
    /// State entries of `partition` with keys in `from..to`, in key order, at most `limit`.
    pub(crate) fn state_range(
        &self,
        partition: i32,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let doing = "reading a range of state";
        let range = self
            .state
            .range::<(i32, &[u8])>((partition, from)..(partition, to))
            .map_err(|e| self.log.error(doing, e))?;
        let mut entries = Vec::new();
        for entry in range.take(limit) {
            let (key, value) = entry.map_err(|e| self.log.error(doing, e))?;
            entries.push((key.value().1.to_vec(), value.value().to_vec()));
        }
        Ok(entries)
    }
}

impl TxLog {
    /// The log of the open file `db` at `path`: nothing unsynced yet.
    pub(super) fn new(db: Database, path: PathBuf, cache_size: usize) -> TxLog {
        let db = Arc::new(db);
        let shared = Shared::new();
        let syncer = Syncer::start(&db, &path, &shared);
        TxLog {
            db,
            path,
            cache_size,
            shared,
            syncer,
            clock: std::sync::Mutex::default(),
        }
    }

    /// The log reads the time it is in step with its changelog from `clock`.
    pub(crate) fn use_clock(&self, clock: crate::clock::Clock) {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = clock;
    }

    fn now_ms(&self) -> i64 {
        self.clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .now_ms()
    }

    /// When `partition` was last in step with its changelog (ms since the epoch; see
    /// `IN_STEP`): `None` when it never was, as far as this file knows.
    pub(crate) fn in_step_since(&self, partition: i32) -> Result<Option<i64>> {
        let doing = "reading when a partition was in step with its changelog";
        let txn = self.read(doing)?;
        let table = txn.open_table(IN_STEP).map_err(|e| self.error(doing, e))?;
        let found = table.get(partition).map_err(|e| self.error(doing, e))?;
        Ok(found.map(|guard| guard.value()))
    }

    /// Whether `partition`'s log may have missed deletions its changelog no longer holds:
    /// it has a checkpoint, and it has not been in step with the changelog for half of
    /// `tombstones_kept` (the changelog's `delete.retention.ms`; half, so that clocks
    /// that differ between this instance and the brokers cannot make it too late), or
    /// never as far as the file knows. Compaction removes a value and, that long after,
    /// the tombstone that deleted it; a replay from an older checkpoint would never see
    /// the deletion (hole E of issue 40: a total of 6 instead of 1). `Some` says how
    /// long it has been out of step (`None` inside: unknown).
    pub(crate) fn may_have_missed_deletions(
        &self,
        partition: i32,
        tombstones_kept: Duration,
    ) -> Result<Option<Option<Duration>>> {
        if self.checkpoint(partition)?.is_none() {
            return Ok(None);
        }
        let Some(since) = self.in_step_since(partition)? else {
            return Ok(Some(None));
        };
        let apart = Duration::from_millis(u64::try_from(self.now_ms() - since).unwrap_or(0));
        Ok((apart >= tombstones_kept / 2).then_some(Some(apart)))
    }

    /// `partition` is in step with its changelog now: a replay read every record up to
    /// where it must go on from.
    pub(crate) fn mark_in_step(&self, partition: i32) -> Result<()> {
        let now = self.now_ms();
        self.write(
            "recording that a partition is in step with its changelog",
            Durable::Soon,
            |txn| {
                txn.open_table(IN_STEP)?.insert(partition, now)?;
                Ok(())
            },
        )
    }

    /// Path of the redb file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of memory redb may keep as its page cache for this file.
    pub(crate) fn cache_size(&self) -> usize {
        self.cache_size
    }

    /// The next changelog offset to read for `partition` (None: never replayed).
    pub(crate) fn checkpoint(&self, partition: i32) -> Result<Option<i64>> {
        let doing = "reading a checkpoint";
        let txn = self.read(doing)?;
        let table = txn
            .open_table(CHECKPOINT)
            .map_err(|e| self.error(doing, e))?;
        let found = table.get(partition).map_err(|e| self.error(doing, e))?;
        Ok(found.map(|guard| guard.value()))
    }

    /// Whether `id` has a dedup entry in `partition`, however old (one read; the engine
    /// reads through a [`Snapshot`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn is_processed(&self, partition: i32, id: &str) -> Result<bool> {
        self.snapshot()?.is_processed(partition, id, i64::MIN)
    }

    /// The input offset the batches applied so far reached in `partition` (their last
    /// [`Change::Progress`]), if any batch recorded one.
    pub(crate) fn progress(&self, partition: i32) -> Result<Option<i64>> {
        let doing = "reading the progress of a partition";
        let txn = self.read(doing)?;
        let table = txn.open_table(PROGRESS).map_err(|e| self.error(doing, e))?;
        let found = table.get(partition).map_err(|e| self.error(doing, e))?;
        Ok(found.map(|guard| guard.value()))
    }

    /// A consistent view of the dedup entries and the state as of now, in one redb read
    /// transaction: what a batch reads between two applies, without a new read
    /// transaction and table per lookup (the largest CPU cost of the batch loop).
    pub(crate) fn snapshot(&self) -> Result<Snapshot<'_>> {
        let doing = "opening a read snapshot";
        let txn = self.read(doing)?;
        let processed = txn
            .open_table(PROCESSED)
            .map_err(|e| self.error(doing, e))?;
        let state = txn.open_table(STATE).map_err(|e| self.error(doing, e))?;
        Ok(Snapshot {
            log: self,
            processed,
            state,
        })
    }

    /// The committed value of state `key` in `partition` (one read, as above).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn state(&self, partition: i32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.snapshot()?.state(partition, key)
    }

    /// Applies changelog records read by replay: each partition's changes in order, and
    /// its checkpoint (when Some) set to the offset after them, in ONE redb write
    /// transaction, durable within the sync interval of the engine's last batch. Either
    /// everything applies or nothing does.
    pub(crate) fn apply(&self, batch: &[(i32, Vec<Change>, Option<i64>)]) -> Result<()> {
        let nothing = batch
            .iter()
            .all(|(_, changes, checkpoint)| changes.is_empty() && checkpoint.is_none());
        if nothing {
            // Even a commit that is not synced costs a write transaction.
            return Ok(());
        }
        let doing = "applying a batch to the transaction log";
        self.write(doing, Durable::Soon, |txn| {
            let mut writer = Writer::open(txn)?;
            for (partition, changes, checkpoint) in batch {
                writer.apply_all(*partition, changes)?;
                if let Some(offset) = checkpoint {
                    writer.checkpoint.insert(*partition, *offset)?;
                    writer.marker_follows.remove(*partition)?;
                }
            }
            writer.finish()
        })
    }

    /// Applies a batch the engine itself just committed, like [`TxLog::apply`], with where
    /// its changelog records landed in each partition. The checkpoint moves past them only
    /// when they directly follow it (with room for one commit marker when the checkpoint
    /// was set by the previous committed transaction): otherwise records the engine has
    /// not read lie in between (another producer's, or an aborted batch's), and the
    /// checkpoint stays where it is so the next replay reads them. Re-reading the
    /// engine's own records then is harmless: applying a change is idempotent.
    ///
    /// `transactional`: the records were committed in a transaction, so a commit marker
    /// follows them. `sync_interval`: the engine's `txlog_sync_interval`, how long this
    /// apply (and the replays after it) may stay in memory only.
    pub(crate) fn apply_committed(
        &self,
        batch: &[(i32, Vec<Change>, Option<Landed>)],
        transactional: bool,
        sync_interval: Duration,
    ) -> Result<()> {
        let doing = "applying a committed batch to the transaction log";
        {
            let mut syncing = self.syncing();
            if syncing.interval != sync_interval {
                syncing.interval = sync_interval;
                self.shared.wake();
            }
        }
        let now = self.now_ms();
        self.write(doing, Durable::Soon, |txn| {
            let mut writer = Writer::open(txn)?;
            let mut in_step = txn.open_table(IN_STEP)?;
            for (partition, changes, landed) in batch {
                writer.apply_all(*partition, changes)?;
                let Some(landed) = landed else { continue };
                let current = writer.checkpoint.get(*partition)?.map(|g| g.value());
                let marker = writer.marker_follows.get(*partition)?.is_some();
                let follows = current
                    .is_some_and(|at| landed.first >= at && landed.first <= at + i64::from(marker));
                if follows {
                    writer.checkpoint.insert(*partition, landed.next)?;
                    // Nothing lies past the new checkpoint but what comes after now.
                    in_step.insert(*partition, now)?;
                    if transactional {
                        writer.marker_follows.insert(*partition, ())?;
                    } else {
                        writer.marker_follows.remove(*partition)?;
                    }
                } else {
                    tracing::debug!(
                        partition,
                        checkpoint = ?current,
                        first = landed.first,
                        "changelog records not read lie before this batch's; the checkpoint stays"
                    );
                }
            }
            writer.finish()
        })
    }

    /// IDs of `partition`'s dedup entries to expire, oldest first, at most `limit`: every entry processed before
    /// `older_than_ms`, plus the oldest ones beyond `max_entries` entries when that is Some.
    pub(crate) fn expired(
        &self,
        partition: i32,
        older_than_ms: i64,
        max_entries: Option<u64>,
        limit: usize,
    ) -> Result<Vec<String>> {
        let doing = "finding expired dedup entries";
        let txn = self.read(doing)?;
        let count =
            read_count(&txn, PROCESSED_COUNT, partition).map_err(|e| self.error(doing, e))?;
        let excess = max_entries.map_or(0, |max| count.saturating_sub(max));
        let index = txn.open_table(EXPIRY).map_err(|e| self.error(doing, e))?;
        let rows = index
            .range(expiry::partition_rows(partition))
            .map_err(|e| self.error(doing, e))?;
        let mut ids = Vec::new();
        'rows: for row in rows {
            let (key, value) = row.map_err(|e| self.error(doing, e))?;
            let (_, processed_at_ms, _) = key.value();
            for id in expiry::decode(value.value()).map_err(|e| self.error(doing, e))? {
                // The index is sorted by time, so once an entry is neither beyond the
                // count nor too old, no later one is either.
                let beyond_count = (ids.len() as u64) < excess;
                if ids.len() >= limit || (!beyond_count && processed_at_ms >= older_than_ms) {
                    break 'rows;
                }
                ids.push(id.to_owned());
            }
        }
        Ok(ids)
    }

    /// Records that the file mirrors the changelog whose topic ID is `id`. When it was
    /// built from another (the changelog was deleted and created again), everything in it
    /// is forgotten in the same transaction: nothing of it is in the topic any more, and a
    /// checkpoint into the new topic would skip its first records. Returns the ID it was
    /// built from, if that was another.
    pub(crate) fn adopt_changelog(&self, id: &str) -> Result<Option<String>> {
        let mut was = None;
        self.write("recording the changelog's topic ID", Durable::Now, |txn| {
            let mut source = txn.open_table(SOURCE)?;
            let stored = source.get(CHANGELOG_ID_KEY)?.map(|g| g.value().to_owned());
            match stored {
                Some(stored) if stored == id => return Ok(()),
                Some(stored) => {
                    txn.open_table(PROCESSED)?.retain(|_, _| false)?;
                    txn.open_table(EXPIRY)?.retain(|_, _| false)?;
                    txn.open_table(STATE)?.retain(|_, _| false)?;
                    txn.open_table(PROCESSED_COUNT)?.retain(|_, _| false)?;
                    txn.open_table(STATE_COUNT)?.retain(|_, _| false)?;
                    txn.open_table(CHECKPOINT)?.retain(|_, _| false)?;
                    txn.open_table(MARKER_FOLLOWS)?.retain(|_, _| false)?;
                    txn.open_table(PROGRESS)?.retain(|_, _| false)?;
                    was = Some(stored);
                }
                None => {}
            }
            source.insert(CHANGELOG_ID_KEY, id)?;
            Ok(())
        })?;
        Ok(was)
    }

    /// Forgets every entry, state and checkpoint of `partition` (used when its changelog must be replayed from scratch).
    pub(crate) fn clear_partition(&self, partition: i32) -> Result<()> {
        self.write(
            "clearing a partition of the transaction log",
            Durable::Now,
            |txn| {
                txn.open_table(PROCESSED)?
                    .retain_in(partition_range(partition, |p| (p, "")), |_, _| false)?;
                txn.open_table(EXPIRY)?
                    .retain_in(expiry::partition_rows(partition), |_, _| false)?;
                let empty: &[u8] = &[];
                txn.open_table(STATE)?
                    .retain_in(partition_range(partition, |p| (p, empty)), |_, _| false)?;
                txn.open_table(PROCESSED_COUNT)?.remove(partition)?;
                txn.open_table(STATE_COUNT)?.remove(partition)?;
                txn.open_table(CHECKPOINT)?.remove(partition)?;
                txn.open_table(MARKER_FOLLOWS)?.remove(partition)?;
                txn.open_table(PROGRESS)?.remove(partition)?;
                txn.open_table(IN_STEP)?.remove(partition)?;
                Ok(())
            },
        )
    }

    /// Per-partition statistics (sorted by partition), for `inspect` and metrics.
    pub(crate) fn stats(&self) -> Result<Vec<PartitionStats>> {
        let doing = "reading transaction log statistics";
        let txn = self.read(doing)?;
        let stats = collect_stats(&txn).map_err(|e| self.error(doing, e))?;
        Ok(stats)
    }

    /// Size of the redb file in bytes.
    pub(crate) fn file_size(&self) -> Result<u64> {
        let metadata = std::fs::metadata(&self.path).map_err(|e| Error::State {
            path: self.path.clone(),
            message: format!(
                "reading the file size failed: {e}; check that the state directory was not removed"
            ),
            cause: Some(Box::new(e)),
        })?;
        Ok(metadata.len())
    }

    /// Begins a read transaction.
    fn read(&self, doing: &str) -> Result<ReadTransaction> {
        self.db.begin_read().map_err(|e| self.error(doing, e))
    }

    /// Makes every commit so far durable (one fsync), if one is not: before the log
    /// closes, or wherever losing even the last sync interval's applies would cost a
    /// replay worth avoiding.
    pub(crate) fn sync(&self) -> Result<()> {
        if self.syncing().unsynced_since.is_none() {
            return Ok(());
        }
        // An empty durable commit: redb makes a non-durable commit durable only by a
        // durable one after it.
        self.write("syncing the transaction log to disk", Durable::Now, |_| {
            Ok(())
        })
    }

    /// Closes the log as a killed process leaves it, for the tests of what a crash loses:
    /// the file as far as it was written, without the close's sync, so that it opens again
    /// as of its last durable commit. (The file is copied as it is, the log closed, which
    /// syncs the original, and the copy put in its place.)
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn kill(mut self) -> Result<()> {
        self.syncer.stop();
        let path = self.path.clone();
        let copy = path.with_extension("redb.killed");
        let failed = |doing: &str, e: std::io::Error| Error::State {
            path: path.clone(),
            message: format!("{doing} failed: {e}"),
            cause: Some(Box::new(e)),
        };
        std::fs::copy(&path, &copy).map_err(|e| failed("copying the file as it is", e))?;
        drop(self);
        std::fs::rename(&copy, &path).map_err(|e| failed("putting the copy in its place", e))
    }

    /// Whether every commit so far is durable.
    #[cfg(test)]
    pub(super) fn synced(&self) -> bool {
        self.syncing().unsynced_since.is_none()
    }

    /// Runs `body` in a write transaction and commits it, durably when `durable` says so
    /// (see [`Syncing`]); on any error nothing of it is kept, since dropping an
    /// uncommitted redb transaction aborts it.
    fn write(
        &self,
        doing: &str,
        durable: Durable,
        body: impl FnOnce(&WriteTransaction) -> std::result::Result<(), redb::Error>,
    ) -> Result<()> {
        let mut syncing = self.syncing();
        let now = syncing.durable_now(durable);
        let mut txn = self.db.begin_write().map_err(|e| self.error(doing, e))?;
        let durability = if now {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability)
            .map_err(|e| self.error(doing, e))?;
        body(&txn).map_err(|e| self.error(doing, e))?;
        txn.commit().map_err(|e| self.error(doing, e))?;
        let starts_the_clock = !now && syncing.unsynced_since.is_none();
        syncing.committed(now);
        if starts_the_clock {
            self.shared.wake();
        }
        Ok(())
    }

    /// The record of unsynced commits, held through a write's commit.
    fn syncing(&self) -> MutexGuard<'_, Syncing> {
        self.shared.lock()
    }

    /// An [`Error::State`] about this file.
    fn error(&self, doing: &str, err: impl Into<redb::Error>) -> Error {
        state_error(&self.path, doing, err)
    }
}

impl Drop for TxLog {
    /// Closing syncs what is not durable yet (redb's own close would too, but could only
    /// log its failure through a logger redb is not given).
    fn drop(&mut self) {
        self.syncer.stop();
        if let Err(error) = self.sync() {
            tracing::warn!(
                %error,
                "the transaction log's last applies may be lost; the next start replays them"
            );
        }
    }
}

/// The tables a batch writes, open in one write transaction, and the count and expiry
/// index changes so far (written once each, by [`Writer::finish`]). `'c`: the changes.
struct Writer<'txn, 'c> {
    txn: &'txn WriteTransaction,
    processed: Table<'txn, (i32, &'static str), (i64, i64)>,
    index: Index<'txn>,
    edits: Edits<'c>,
    state: Table<'txn, (i32, &'static [u8]), &'static [u8]>,
    checkpoint: Table<'txn, i32, i64>,
    marker_follows: Table<'txn, i32, ()>,
    progress: Table<'txn, i32, i64>,
    /// Per partition: change in the number of dedup entries, and of state keys.
    deltas: BTreeMap<i32, (i64, i64)>,
}

impl<'txn, 'c> Writer<'txn, 'c> {
    /// Opens the tables in `txn`.
    fn open(txn: &'txn WriteTransaction) -> std::result::Result<Self, redb::Error> {
        Ok(Writer {
            txn,
            processed: txn.open_table(PROCESSED)?,
            index: txn.open_table(EXPIRY)?,
            edits: Edits::default(),
            state: txn.open_table(STATE)?,
            checkpoint: txn.open_table(CHECKPOINT)?,
            marker_follows: txn.open_table(MARKER_FOLLOWS)?,
            progress: txn.open_table(PROGRESS)?,
            deltas: BTreeMap::new(),
        })
    }

    /// Applies `changes` to `partition`, in order.
    fn apply_all(
        &mut self,
        partition: i32,
        changes: &'c [Change],
    ) -> std::result::Result<(), redb::Error> {
        for change in changes {
            #[cfg(test)]
            tests::inject_failure()?;
            self.apply(partition, change)?;
        }
        Ok(())
    }

    /// Applies one change. Replacing an entry moves it in the expiry index only if its time
    /// changed, and removing an absent one does nothing, which is what makes replay
    /// idempotent.
    fn apply(
        &mut self,
        partition: i32,
        change: &'c Change,
    ) -> std::result::Result<(), redb::Error> {
        match change {
            Change::Processed {
                id,
                offset,
                processed_at_ms,
            } => {
                let old = self
                    .processed
                    .insert((partition, id.as_str()), (*offset, *processed_at_ms))?
                    .map(|guard| guard.value());
                match old {
                    Some((_, old_at)) if old_at == *processed_at_ms => {}
                    Some((_, old_at)) => {
                        self.edits.remove(partition, old_at, id);
                        self.edits.add(partition, *processed_at_ms, id);
                    }
                    None => {
                        self.delta(partition).0 += 1;
                        self.edits.add(partition, *processed_at_ms, id);
                    }
                }
            }
            Change::Expired { id } => {
                let old = self
                    .processed
                    .remove((partition, id.as_str()))?
                    .map(|guard| guard.value());
                if let Some((_, old_at)) = old {
                    self.edits.remove(partition, old_at, id);
                    self.delta(partition).0 -= 1;
                }
            }
            Change::State {
                key,
                value: Some(value),
            } => {
                let added = self
                    .state
                    .insert((partition, key.as_slice()), value.as_slice())?
                    .is_none();
                if added {
                    self.delta(partition).1 += 1;
                }
            }
            Change::State { key, value: None } => {
                let removed = self.state.remove((partition, key.as_slice()))?.is_some();
                if removed {
                    self.delta(partition).1 -= 1;
                }
            }
            Change::Progress { input_offset } => {
                self.progress.insert(partition, *input_offset)?;
            }
        }
        Ok(())
    }

    /// The count changes of `partition`.
    fn delta(&mut self, partition: i32) -> &mut (i64, i64) {
        self.deltas.entry(partition).or_default()
    }

    /// Writes the expiry index's rows and the counts, once per row and partition rather
    /// than once per change.
    fn finish(mut self) -> std::result::Result<(), redb::Error> {
        self.edits.write(&mut self.index)?;
        let mut processed_counts = self.txn.open_table(PROCESSED_COUNT)?;
        let mut state_counts = self.txn.open_table(STATE_COUNT)?;
        for (partition, (processed, state)) in self.deltas {
            add_to_count(&mut processed_counts, partition, processed)?;
            add_to_count(&mut state_counts, partition, state)?;
        }
        Ok(())
    }
}

/// Adds `delta` to the count of `partition`, removing the row when it reaches zero.
fn add_to_count(
    counts: &mut Table<'_, i32, u64>,
    partition: i32,
    delta: i64,
) -> std::result::Result<(), redb::Error> {
    if delta == 0 {
        return Ok(());
    }
    let old = counts.get(partition)?.map_or(0, |guard| guard.value());
    let new = adjust(old, delta, partition);
    if new == 0 {
        counts.remove(partition)?;
    } else {
        counts.insert(partition, new)?;
    }
    Ok(())
}

/// `count + delta`, held at zero if the stored count was somehow too low.
fn adjust(count: u64, delta: i64, partition: i32) -> u64 {
    let new = i128::from(count) + i128::from(delta);
    if new < 0 {
        // The counts are only a cache of the row counts; a wrong one must not stop
        // processing, but it is worth knowing about.
        tracing::warn!(
            partition,
            count,
            delta,
            "transaction log entry count would go negative; keeping 0"
        );
    }
    u64::try_from(new.max(0)).unwrap_or(u64::MAX)
}

/// The count stored for `partition` in `definition`, 0 when absent.
fn read_count(
    txn: &ReadTransaction,
    definition: redb::TableDefinition<'_, i32, u64>,
    partition: i32,
) -> std::result::Result<u64, redb::Error> {
    let table = txn.open_table(definition)?;
    let found = table.get(partition)?;
    Ok(found.map_or(0, |guard| guard.value()))
}

/// [`TxLog::stats`] within one read transaction, so the numbers agree with each other.
fn collect_stats(txn: &ReadTransaction) -> std::result::Result<Vec<PartitionStats>, redb::Error> {
    let mut partitions = BTreeSet::new();
    for definition in [PROCESSED_COUNT, STATE_COUNT] {
        for row in txn.open_table(definition)?.iter()? {
            partitions.insert(row?.0.value());
        }
    }
    for row in txn.open_table(CHECKPOINT)?.iter()? {
        partitions.insert(row?.0.value());
    }
    let checkpoints = txn.open_table(CHECKPOINT)?;
    let index = txn.open_table(EXPIRY)?;
    let mut stats = Vec::with_capacity(partitions.len());
    for partition in partitions {
        let oldest = index
            .range(expiry::partition_rows(partition))?
            .next()
            .transpose()?
            .map(|(key, _)| key.value().1);
        stats.push(PartitionStats {
            partition,
            processed_entries: read_count(txn, PROCESSED_COUNT, partition)?,
            state_entries: read_count(txn, STATE_COUNT, partition)?,
            checkpoint: checkpoints.get(partition)?.map(|guard| guard.value()),
            oldest_processed_at_ms: oldest,
        });
    }
    Ok(stats)
}

#[cfg(test)]
mod tests;
