//! The transaction log: a durable, local cache of an instance's compacted changelog topic.
//!
//! Every batch the engine processes produces [`Change`]s per input partition: the event IDs
//! it processed (so duplicates are skipped later), dedup entries that expired, and state
//! writes. The batch collects them in an [`Overlay`], which reads see before the log. On
//! commit the changes go to the changelog (through the Kafka transaction, as [`Change::encode`]
//! records) and are then applied to the redb file with [`TxLog::apply`], together with the
//! changelog offset up to which the file now reflects the topic.
//!
//! ```text
//!   batch ──► Overlay ──into_changes──► Vec<Change> ──encode──► changelog partition p
//!               │ (reads: overlay first,                           (compacted, Kafka txn)
//!               ▼  then the log)                                          │
//!   TxLog (txlog.redb) ◄──────────── apply(changes, checkpoint) ◄──decode─┘ replay
//!     meta              "format_version" -> 2
//!     processed         (p, id)              -> (offset, processed_at_ms)
//!     expiry            (p, processed_at_ms, n) -> ids       expiry index, ≤ 512 IDs a row
//!     processed_count   p -> n                               count-based expiry
//!     state             (p, key)             -> value
//!     state_count       p -> n                               stats without a scan
//!     checkpoint        p -> next changelog offset to read
//!     marker_follows    p -> ()   the checkpoint is right after the engine's own commit
//!     progress          p -> next input offset the applied batches reached
//! ```
//!
//! This module knows nothing of Kafka: it deals in bytes, partitions and offsets.
//!
//! Invariants:
//!
//! - The file is a cache: anything in it can be rebuilt by replaying the changelog, so a
//!   corrupt or foreign file is moved aside and replaced rather than repaired.
//! - `processed`, `expiry` and `processed_count` agree after every commit: each processed
//!   entry is in exactly one index row, that of its time, and the count is the number of
//!   entries.
//! - Applying a change is idempotent and last-write-wins per changelog key, so replaying
//!   records already applied (a crash between commit and checkpoint) changes nothing, and
//!   compaction, which keeps only the last record per key, cannot change the outcome.
//! - One [`TxLog::apply`] is one redb transaction: a checkpoint is never visible without
//!   the changes up to it. It is durable within the sync interval (`store.rs`): a file that
//!   comes back at an earlier commit after a crash is a log with older checkpoints, which
//!   the next replay brings up to date.
//! - A checkpoint never moves over changelog records that were not applied: an engine's
//!   own batch moves it only when its records directly follow it
//!   ([`TxLog::apply_committed`]); anything else is left for the next replay to read.
//! - No redb type leaves this module; no bad data makes it panic.

mod change;
mod expiry;
mod layers;
mod open;
mod overlay;
mod store;
mod sync;
mod tables;
#[cfg(test)]
mod testutil;

pub(crate) use change::Change;
pub(crate) use layers::View;
pub(crate) use open::{DEFAULT_CACHE_SIZE, check_private};
pub(crate) use overlay::Overlay;
pub(crate) use store::{Landed, Snapshot, TxLog};
pub(crate) use sync::DEFAULT_SYNC_INTERVAL;

/// Version of the table layout; a file holding another is rebuilt from the changelog.
/// 2: the expiry index holds a row per time, not per entry (`expiry.rs`).
pub(crate) const FORMAT_VERSION: u32 = 2;

/// Name of the redb file inside the instance's state directory.
pub(crate) const TXLOG_FILE: &str = "txlog.redb";

/// How [`TxLog::open`] found the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Opened {
    /// There was no file (or an empty one): every partition must be replayed.
    Fresh,
    /// The file was ours and current: replay each partition from its checkpoint.
    Existing,
    /// The file was unusable and was moved aside; a new one was created.
    Rebuilt {
        /// Why the old file was unusable, and where it was moved.
        reason: String,
    },
}

/// What the log holds for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionStats {
    /// The input (and changelog) partition.
    pub(crate) partition: i32,
    /// Number of dedup entries.
    pub(crate) processed_entries: u64,
    /// Number of state keys.
    pub(crate) state_entries: u64,
    /// The next changelog offset to read, if the partition was ever replayed.
    pub(crate) checkpoint: Option<i64>,
    /// When the oldest dedup entry was processed, in ms since the Unix epoch.
    pub(crate) oldest_processed_at_ms: Option<i64>,
}
