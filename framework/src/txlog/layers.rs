//! The layered read a batch and each of its records see: the committed log as of the
//! batch's start (a [`Snapshot`]), the batch's writes since (an [`Overlay`]), and, for the
//! record being processed, its own writes on top (a savepoint: merged into the batch only
//! when the processor succeeds, dropped when it fails).
//!
//! ```text
//!   read(p, key):  record's writes ─► batch's writes ─► committed snapshot
//!   write:         record's writes only
//! ```
//!
//! The processor's `State` reads and writes through [`Layers`] as a
//! [`crate::state::StateStore`]; it knows nothing of the layers.

use super::{Overlay, Snapshot};
use crate::Result;
use crate::state::StateStore;

/// What a batch reads through: the committed log as of its start (or its last split),
/// and its own writes since.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    committed: &'a Snapshot<'a>,
    batch: &'a Overlay,
}

impl<'a> View<'a> {
    /// The batch's view: `batch` over `committed`.
    pub(crate) fn new(committed: &'a Snapshot<'a>, batch: &'a Overlay) -> Self {
        Self { committed, batch }
    }

    /// Whether event `id` of `partition` was processed: by this batch, or committed at or
    /// after `window_start_ms` (older entries are outside the dedup window, even before
    /// expiry removes them).
    pub(crate) fn is_processed(
        &self,
        partition: i32,
        id: &str,
        window_start_ms: i64,
    ) -> Result<bool> {
        Ok(self.batch.is_processed(partition, id)
            || self
                .committed
                .is_processed(partition, id, window_start_ms)?)
    }

    /// `partition`'s state entries with keys in `from..to` as the batch sees them (its
    /// writes over the committed log), in key order, the first `limit`.
    pub(crate) fn state_range(
        &self,
        partition: i32,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let written = self.batch.state_range(partition, from, to);
        // Enough committed entries that `limit` remain after the batch's deletions.
        let committed =
            self.committed
                .state_range(partition, from, to, limit.saturating_add(written.len()))?;
        let mut merged: std::collections::BTreeMap<Vec<u8>, Vec<u8>> =
            committed.into_iter().collect();
        for (key, value) in written {
            match value {
                Some(value) => merged.insert(key, value),
                None => merged.remove(&key),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    /// A savepoint for one record: its writes go to a layer of their own.
    pub(crate) fn record(self) -> Layers<'a> {
        Layers {
            record: Overlay::new(),
            view: self,
        }
    }
}

/// One record's writes over its batch's [`View`].
pub(crate) struct Layers<'a> {
    record: Overlay,
    view: View<'a>,
}

impl Layers<'_> {
    /// The record's writes, for the batch to merge when the record succeeded.
    pub(crate) fn into_writes(self) -> Overlay {
        self.record
    }
}

impl StateStore for Layers<'_> {
    fn get(&self, partition: i32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self
            .record
            .get(partition, key)
            .or_else(|| self.view.batch.get(partition, key))
        {
            Some(written) => Ok(written.map(<[u8]>::to_vec)),
            None => self.view.committed.state(partition, key),
        }
    }

    fn put(&mut self, partition: i32, key: Vec<u8>, value: Vec<u8>) {
        self.record.put(partition, key, value);
    }

    fn delete(&mut self, partition: i32, key: Vec<u8>) {
        self.record.delete(partition, key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txlog::Change;
    use crate::txlog::testutil::open_temp;

    #[test]
    fn reads_see_the_record_then_the_batch_then_the_committed_log() {
        let (_dir, log) = open_temp();
        let state = |key: &str, value: Option<&str>| Change::State {
            key: key.as_bytes().to_vec(),
            value: value.map(|v| v.as_bytes().to_vec()),
        };
        log.apply(&[(
            0,
            vec![state("a", Some("committed")), state("b", Some("committed"))],
            Some(1),
        )])
        .expect("apply");
        let snapshot = log.snapshot().expect("snapshot");
        let mut batch = Overlay::new();
        batch.put(0, b"b".to_vec(), b"batch".to_vec());
        batch.delete(0, b"c".to_vec());
        let mut layers = View::new(&snapshot, &batch).record();
        layers.put(0, b"c".to_vec(), b"record".to_vec());
        let get = |layers: &Layers<'_>, key: &str| {
            layers
                .get(0, key.as_bytes())
                .expect("get")
                .map(|v| String::from_utf8(v).expect("utf-8"))
        };
        assert_eq!(get(&layers, "a").as_deref(), Some("committed"));
        assert_eq!(get(&layers, "b").as_deref(), Some("batch"));
        assert_eq!(get(&layers, "c").as_deref(), Some("record"));
        layers.delete(0, b"a".to_vec());
        assert_eq!(
            get(&layers, "a"),
            None,
            "a record's delete hides the log's value"
        );
        // Another partition sees none of it.
        assert_eq!(layers.get(1, b"c").expect("get"), None);
        // Only the record's own writes leave with it.
        let writes = layers.into_writes();
        assert_eq!(writes.get(0, b"c"), Some(Some(&b"record"[..])));
        assert_eq!(writes.get(0, b"a"), Some(None));
        assert_eq!(writes.get(0, b"b"), None);
    }
}
