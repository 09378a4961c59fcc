//! The transaction log's hot path, for `onceflow-bench`'s micro-benchmarks only
//! (feature `bench-internals`). Not public API: it may change in any release.
//!
//! Thin wrappers over the crate-private [`TxLog`](crate::txlog::TxLog) and
//! [`Overlay`](crate::txlog::Overlay), so that the benchmarks measure the engine's own
//! code rather than a copy of it.

use std::path::Path;

use crate::Result;
use crate::txlog::{self, Change};

/// A transaction log file (`txlog.redb`) in a directory.
#[derive(Debug)]
pub struct TxLog(txlog::TxLog);

impl TxLog {
    /// Opens or creates the log in `dir`.
    pub fn open(dir: &Path) -> Result<TxLog> {
        Ok(TxLog(txlog::TxLog::open(dir)?.0))
    }

    /// The log as of now, as the engine reads it during a batch (one redb read
    /// transaction for all of the batch's lookups).
    pub fn snapshot(&self) -> Result<Snapshot<'_>> {
        Ok(Snapshot(self.0.snapshot()?))
    }

    /// Applies a batch's overlay in one redb transaction, as after a commit (synced to
    /// disk only every sync interval, as the engine's applies are).
    pub fn apply(&self, overlay: Overlay) -> Result<()> {
        let batch: Vec<(i32, Vec<Change>, Option<i64>)> = overlay
            .0
            .into_changes()
            .into_iter()
            .map(|(partition, changes)| (partition, changes, None))
            .collect();
        self.0.apply(&batch)
    }
}

/// The log as of one moment; drop it before the next [`TxLog::apply`].
#[derive(Debug)]
pub struct Snapshot<'a>(txlog::Snapshot<'a>);

impl Snapshot<'_> {
    /// Whether `id` is in `partition`'s dedup log.
    pub fn is_processed(&self, partition: i32, id: &str) -> Result<bool> {
        self.0.is_processed(partition, id, i64::MIN)
    }

    /// `partition`'s state value under `key`.
    pub fn state(&self, partition: i32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.0.state(partition, key)
    }
}

/// A batch's writes, read before the log.
#[derive(Debug)]
pub struct Overlay(txlog::Overlay);

impl Default for Overlay {
    fn default() -> Self {
        Overlay(txlog::Overlay::new())
    }
}

impl Overlay {
    /// Some(Some(value)) written in this batch, Some(None) deleted, None untouched.
    pub fn get(&self, partition: i32, key: &[u8]) -> Option<Option<&[u8]>> {
        self.0.get(partition, key)
    }

    /// Sets state `key` of `partition`.
    pub fn put(&mut self, partition: i32, key: Vec<u8>, value: Vec<u8>) {
        self.0.put(partition, key, value);
    }

    /// Records that event `id` was processed.
    pub fn mark_processed(&mut self, partition: i32, id: String, offset: i64, at_ms: i64) {
        self.0.mark_processed(partition, id, offset, at_ms);
    }

    /// Some(true) processed in this batch, Some(false) expired, None untouched.
    pub fn processed(&self, partition: i32, id: &str) -> Option<bool> {
        self.0.processed(partition, id)
    }
}
