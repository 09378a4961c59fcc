//! Helpers for the transaction log's tests: a log in a temporary directory, and a full
//! snapshot of its contents that also checks the invariants between its tables.

use std::collections::BTreeMap;

use redb::{ReadableDatabase, ReadableTable};
use tempfile::TempDir;

use super::TxLog;
use super::expiry;
use super::tables::{CHECKPOINT, EXPIRY, PROCESSED, PROCESSED_COUNT, STATE, STATE_COUNT};

/// A log in a new temporary directory; keep the directory alive as long as the log.
pub(super) fn open_temp() -> (TempDir, TxLog) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (log, _) = TxLog::open(&dir.path().join("state")).expect("open log");
    (dir, log)
}

/// Everything a log holds, in comparable form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Snapshot {
    /// (partition, id) -> (offset, processed_at_ms).
    pub(super) processed: BTreeMap<(i32, String), (i64, i64)>,
    /// (partition, key) -> value.
    pub(super) state: BTreeMap<(i32, Vec<u8>), Vec<u8>>,
    /// partition -> checkpoint.
    pub(super) checkpoints: BTreeMap<i32, i64>,
}

impl Snapshot {
    /// Reads the whole log in one read transaction and panics if the expiry index or the
    /// counts disagree with the rows they describe.
    pub(super) fn of(log: &TxLog) -> Snapshot {
        let txn = log.db.begin_read().expect("read");
        let mut snapshot = Snapshot::default();
        for row in txn
            .open_table(PROCESSED)
            .expect("table")
            .iter()
            .expect("iter")
        {
            let (key, value) = row.expect("row");
            let (partition, id) = key.value();
            snapshot
                .processed
                .insert((partition, id.to_string()), value.value());
        }
        for row in txn.open_table(STATE).expect("table").iter().expect("iter") {
            let (key, value) = row.expect("row");
            let (partition, user_key) = key.value();
            snapshot
                .state
                .insert((partition, user_key.to_vec()), value.value().to_vec());
        }
        for row in txn
            .open_table(CHECKPOINT)
            .expect("table")
            .iter()
            .expect("iter")
        {
            let (key, value) = row.expect("row");
            snapshot.checkpoints.insert(key.value(), value.value());
        }

        let mut index = Vec::new();
        for row in txn.open_table(EXPIRY).expect("table").iter().expect("iter") {
            let (key, value) = row.expect("row");
            let (partition, at, number) = key.value();
            let ids = expiry::decode(value.value()).expect("an index row decodes");
            assert!(
                !ids.is_empty() && ids.len() <= expiry::IDS_PER_ROW,
                "index row {key:?} holds {} IDs",
                ids.len(),
                key = (partition, at, number)
            );
            index.extend(ids.into_iter().map(|id| (partition, at, id.to_string())));
        }
        index.sort();
        let mut expected_index: Vec<_> = snapshot
            .processed
            .iter()
            .map(|((partition, id), (_, at))| (*partition, *at, id.clone()))
            .collect();
        expected_index.sort();
        assert_eq!(
            index, expected_index,
            "expiry index disagrees with processed"
        );

        let counts = |definition| -> BTreeMap<i32, u64> {
            let table = txn.open_table(definition).expect("table");
            table
                .iter()
                .expect("iter")
                .map(|row| {
                    let (key, value) = row.expect("row");
                    (key.value(), value.value())
                })
                .collect()
        };
        assert_eq!(
            counts(PROCESSED_COUNT),
            count_by_partition(snapshot.processed.keys().map(|(p, _)| *p)),
            "processed_count disagrees with processed"
        );
        assert_eq!(
            counts(STATE_COUNT),
            count_by_partition(snapshot.state.keys().map(|(p, _)| *p)),
            "state_count disagrees with state"
        );
        snapshot
    }
}

/// How many times each partition occurs.
fn count_by_partition(partitions: impl Iterator<Item = i32>) -> BTreeMap<i32, u64> {
    let mut counts = BTreeMap::new();
    for partition in partitions {
        *counts.entry(partition).or_insert(0) += 1;
    }
    counts
}
