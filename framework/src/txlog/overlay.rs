//! [`Overlay`]: a batch's writes before they are committed.
//!
//! Reads during a batch consult the overlay first and the committed [`super::TxLog`] only
//! for what the batch has not touched, so a batch sees its own writes. The overlay is plain
//! memory: aborting a batch is dropping (or clearing) it, and committing one is
//! [`Overlay::into_changes`], whose changes go to the changelog and then to the log.

use std::collections::{BTreeMap, HashMap};

use super::Change;

/// The batch's uncommitted writes, read before the committed log (reads see own writes; dropping it leaves nothing).
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    /// Only partitions the batch wrote to have an entry.
    partitions: BTreeMap<i32, PartitionWrites>,
}

/// One partition's writes in a batch.
#[derive(Debug, Default)]
struct PartitionWrites {
    /// `Processed` and `Expired`, in the order they happened: replay must see the same order.
    events: Vec<Change>,
    /// The latest dedup status of each ID the batch touched: `true` processed, `false` expired.
    processed: HashMap<String, bool>,
    /// The last write per state key; earlier ones are overwritten anyway, so they need not
    /// reach the changelog.
    state: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Overlay {
    /// An overlay with no writes.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether the batch wrote nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// Some(Some(v)) written in this batch, Some(None) deleted in this batch, None untouched.
    pub(crate) fn get(&self, partition: i32, key: &[u8]) -> Option<Option<&[u8]>> {
        let value = self.partitions.get(&partition)?.state.get(key)?;
        Some(value.as_deref())
    }

    /// The batch's writes of `partition`'s state keys in `from..to`, in key order
    /// (`None`: deleted in this batch).
    pub(crate) fn state_range(
        &self,
        partition: i32,
        from: &[u8],
        to: &[u8],
    ) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let Some(writes) = self.partitions.get(&partition) else {
            return Vec::new();
        };
        if from >= to {
            return Vec::new();
        }
        writes
            .state
            .range::<[u8], _>((
                std::ops::Bound::Included(from),
                std::ops::Bound::Excluded(to),
            ))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }

    /// Sets state `key` of `partition` to `value`.
    pub(crate) fn put(&mut self, partition: i32, key: Vec<u8>, value: Vec<u8>) {
        self.writes(partition).state.insert(key, Some(value));
    }

    /// Deletes state `key` of `partition`.
    pub(crate) fn delete(&mut self, partition: i32, key: Vec<u8>) {
        self.writes(partition).state.insert(key, None);
    }

    /// Records that event `id` of `partition` was processed.
    pub(crate) fn mark_processed(
        &mut self,
        partition: i32,
        id: String,
        offset: i64,
        processed_at_ms: i64,
    ) {
        let writes = self.writes(partition);
        writes.processed.insert(id.clone(), true);
        writes.events.push(Change::Processed {
            id,
            offset,
            processed_at_ms,
        });
    }

    /// Whether the batch processed `id` (and did not expire it since). An ID the batch did
    /// not touch is `false` here; the committed log decides for it, see [`Self::processed`].
    pub(crate) fn is_processed(&self, partition: i32, id: &str) -> bool {
        self.processed(partition, id) == Some(true)
    }

    /// Some(true) processed in this batch, Some(false) expired in this batch, None untouched:
    /// unlike [`Self::is_processed`], tells an expiry in this batch from no change.
    pub(crate) fn processed(&self, partition: i32, id: &str) -> Option<bool> {
        self.partitions.get(&partition)?.processed.get(id).copied()
    }

    /// Records that the dedup entry `id` of `partition` expired.
    pub(crate) fn expire(&mut self, partition: i32, id: String) {
        let writes = self.writes(partition);
        writes.processed.insert(id.clone(), false);
        writes.events.push(Change::Expired { id });
    }

    /// The changes per partition (sorted by partition): Processed/Expired in the order they happened, and for state
    /// only the last write per key.
    pub(crate) fn into_changes(self) -> Vec<(i32, Vec<Change>)> {
        self.partitions
            .into_iter()
            .map(|(partition, writes)| {
                let mut changes = writes.events;
                changes.extend(
                    writes
                        .state
                        .into_iter()
                        .map(|(key, value)| Change::State { key, value }),
                );
                (partition, changes)
            })
            .collect()
    }

    #[cfg(test)]
    /// Forgets every write, as for an aborted batch.
    pub(crate) fn clear(&mut self) {
        self.partitions.clear();
    }

    /// The writes of `partition`, created on first use.
    fn writes(&mut self, partition: i32) -> &mut PartitionWrites {
        self.partitions.entry(partition).or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::txlog::TxLog;
    use crate::txlog::testutil::{Snapshot, open_temp};

    #[test]
    fn reads_see_own_writes_and_only_them() {
        let mut overlay = Overlay::new();
        assert!(overlay.is_empty());
        assert_eq!(overlay.get(0, b"k"), None);
        overlay.put(0, b"k".to_vec(), b"1".to_vec());
        overlay.put(0, b"k".to_vec(), b"2".to_vec());
        assert_eq!(overlay.get(0, b"k"), Some(Some(&b"2"[..])));
        assert_eq!(overlay.get(1, b"k"), None, "partitions are separate");
        overlay.delete(0, b"k".to_vec());
        assert_eq!(overlay.get(0, b"k"), Some(None));
        assert!(!overlay.is_empty());

        overlay.mark_processed(1, "a".into(), 7, 100);
        assert!(overlay.is_processed(1, "a"));
        assert!(!overlay.is_processed(0, "a"));
        overlay.expire(1, "a".into());
        assert!(!overlay.is_processed(1, "a"));
        assert_eq!(overlay.processed(1, "a"), Some(false));
        assert_eq!(overlay.processed(1, "b"), None);

        overlay.clear();
        assert!(overlay.is_empty());
        assert_eq!(overlay.get(0, b"k"), None);
        assert_eq!(overlay.processed(1, "a"), None);
    }

    #[test]
    fn changes_keep_event_order_and_the_last_state_write() {
        let mut overlay = Overlay::new();
        overlay.put(2, b"b".to_vec(), b"1".to_vec());
        overlay.mark_processed(2, "x".into(), 1, 10);
        overlay.expire(2, "old".into());
        overlay.put(2, b"b".to_vec(), b"2".to_vec());
        overlay.delete(2, b"a".to_vec());
        overlay.mark_processed(-1, "y".into(), 2, 20);
        overlay.expire(2, "x".into());

        let changes = overlay.into_changes();
        let expected = vec![
            (
                -1,
                vec![Change::Processed {
                    id: "y".into(),
                    offset: 2,
                    processed_at_ms: 20,
                }],
            ),
            (
                2,
                vec![
                    Change::Processed {
                        id: "x".into(),
                        offset: 1,
                        processed_at_ms: 10,
                    },
                    Change::Expired { id: "old".into() },
                    Change::Expired { id: "x".into() },
                    Change::State {
                        key: b"a".to_vec(),
                        value: None,
                    },
                    Change::State {
                        key: b"b".to_vec(),
                        value: Some(b"2".to_vec()),
                    },
                ],
            ),
        ];
        assert_eq!(changes, expected);
    }

    /// One step of a batch in the model test.
    #[derive(Debug, Clone)]
    enum Op {
        Put(i32, u8, u8),
        Delete(i32, u8),
        Get(i32, u8),
        Process(i32, u8, i64),
        Expire(i32, u8),
        IsProcessed(i32, u8),
    }

    fn key(k: u8) -> Vec<u8> {
        vec![b'k', k]
    }

    fn id(k: u8) -> String {
        format!("id-{k}")
    }

    fn op() -> impl Strategy<Value = Op> {
        let p = 0..2i32;
        let k = 0..4u8;
        prop_oneof![
            (p.clone(), k.clone(), any::<u8>()).prop_map(|(p, k, v)| Op::Put(p, k, v)),
            (p.clone(), k.clone()).prop_map(|(p, k)| Op::Delete(p, k)),
            (p.clone(), k.clone()).prop_map(|(p, k)| Op::Get(p, k)),
            (p.clone(), k.clone(), 0..1000i64).prop_map(|(p, k, t)| Op::Process(p, k, t)),
            (p.clone(), k.clone()).prop_map(|(p, k)| Op::Expire(p, k)),
            (p, k).prop_map(|(p, k)| Op::IsProcessed(p, k)),
        ]
    }

    /// What the log should hold: state, and the processed IDs with their times.
    #[derive(Debug, Clone, Default, PartialEq)]
    struct Model {
        state: BTreeMap<(i32, Vec<u8>), Vec<u8>>,
        processed: BTreeMap<(i32, String), (i64, i64)>,
    }

    impl Model {
        fn of(snapshot: &Snapshot) -> Model {
            Model {
                state: snapshot.state.clone(),
                processed: snapshot.processed.clone(),
            }
        }
    }

    /// Runs `ops` on `overlay` over `log`, checking every read against `model`, which it
    /// updates as the batch goes.
    fn run(ops: &[Op], overlay: &mut Overlay, log: &TxLog, model: &mut Model) {
        for (offset, op) in (0i64..).zip(ops) {
            match *op {
                Op::Put(p, k, v) => {
                    overlay.put(p, key(k), vec![v]);
                    model.state.insert((p, key(k)), vec![v]);
                }
                Op::Delete(p, k) => {
                    overlay.delete(p, key(k));
                    model.state.remove(&(p, key(k)));
                }
                Op::Get(p, k) => {
                    let seen = match overlay.get(p, &key(k)) {
                        Some(value) => value.map(<[u8]>::to_vec),
                        None => log.state(p, &key(k)).expect("read log"),
                    };
                    assert_eq!(seen.as_ref(), model.state.get(&(p, key(k))), "get {p}/{k}");
                }
                Op::Process(p, k, at) => {
                    overlay.mark_processed(p, id(k), offset, at);
                    model.processed.insert((p, id(k)), (offset, at));
                }
                Op::Expire(p, k) => {
                    overlay.expire(p, id(k));
                    model.processed.remove(&(p, id(k)));
                }
                Op::IsProcessed(p, k) => {
                    let seen = match overlay.processed(p, &id(k)) {
                        Some(processed) => processed,
                        None => log.is_processed(p, &id(k)).expect("read log"),
                    };
                    let expected = model.processed.contains_key(&(p, id(k)));
                    assert_eq!(seen, expected, "is_processed {p}/{k}");
                    if expected {
                        assert!(
                            overlay.is_processed(p, &id(k))
                                || log.is_processed(p, &id(k)).expect("read")
                        );
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn overlay_over_log_behaves_like_a_map(
            committed in proptest::collection::vec(op(), 0..12),
            ops in proptest::collection::vec(op(), 0..40),
            drop_instead_of_clear: bool,
        ) {
            let (_dir, log) = open_temp();
            // Commit a first batch, so reads have something under the overlay.
            let mut first = Overlay::new();
            run(&committed, &mut first, &log, &mut Model::default());
            let batch: Vec<_> = first.into_changes().into_iter().map(|(p, c)| (p, c, Some(1))).collect();
            log.apply(&batch).expect("commit first batch");
            let before = Snapshot::of(&log);
            let committed_model = Model::of(&before);

            // An aborted batch leaves the log as it was.
            let mut model = committed_model.clone();
            let mut overlay = Overlay::new();
            run(&ops, &mut overlay, &log, &mut model);
            if drop_instead_of_clear {
                drop(overlay);
            } else {
                overlay.clear();
                prop_assert!(overlay.is_empty());
            }
            prop_assert_eq!(&Snapshot::of(&log), &before);

            // A committed one makes the log equal the model.
            let mut model = committed_model;
            let mut overlay = Overlay::new();
            run(&ops, &mut overlay, &log, &mut model);
            let batch: Vec<_> = overlay.into_changes().into_iter().map(|(p, c)| (p, c, Some(2))).collect();
            log.apply(&batch).expect("commit batch");
            let after = Snapshot::of(&log);
            prop_assert_eq!(Model::of(&after), model);
        }
    }
}
