//! Tests of the open log's reads and writes (opening itself is tested in `open.rs`).

use std::cell::Cell;
use std::collections::BTreeMap;

use super::*;
use crate::txlog::testutil::{Snapshot, open_temp};
use crate::txlog::{DEFAULT_CACHE_SIZE, DEFAULT_SYNC_INTERVAL, Opened};

thread_local! {
    /// Changes to let through before the next one fails, on this thread only.
    static FAIL_AFTER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Called by `apply` before each change: fails once the count set by [`fail_after`] runs out.
pub(super) fn inject_failure() -> std::result::Result<(), redb::Error> {
    FAIL_AFTER.with(|left| match left.get() {
        Some(0) => {
            left.set(None);
            Err(redb::Error::Corrupted("injected failure".into()))
        }
        Some(n) => {
            left.set(Some(n - 1));
            Ok(())
        }
        None => Ok(()),
    })
}

/// Makes the change after the next `n` ones fail.
fn fail_after(n: usize) {
    FAIL_AFTER.with(|left| left.set(Some(n)));
}

/// The sync interval of the engine's batches in these tests: the default.
const SYNC: Duration = DEFAULT_SYNC_INTERVAL;

fn processed(id: &str, offset: i64, at: i64) -> Change {
    Change::Processed {
        id: id.into(),
        offset,
        processed_at_ms: at,
    }
}

fn expired(id: &str) -> Change {
    Change::Expired { id: id.into() }
}

fn set(key: &str, value: &str) -> Change {
    Change::State {
        key: key.as_bytes().to_vec(),
        value: Some(value.as_bytes().to_vec()),
    }
}

fn delete(key: &str) -> Change {
    Change::State {
        key: key.as_bytes().to_vec(),
        value: None,
    }
}

#[test]
fn applied_changes_and_checkpoints_read_back() {
    let (_dir, log) = open_temp();
    assert_eq!(log.checkpoint(0).unwrap(), None);
    log.apply(&[
        (
            0,
            vec![processed("a", 5, 100), set("k", "v1"), set("gone", "x")],
            Some(3),
        ),
        (1, vec![processed("b", 6, 200)], None),
    ])
    .unwrap();
    log.apply(&[(0, vec![set("k", "v2"), delete("gone")], Some(7))])
        .unwrap();

    assert!(log.is_processed(0, "a").unwrap());
    assert!(
        !log.is_processed(1, "a").unwrap(),
        "entries belong to a partition"
    );
    assert!(log.is_processed(1, "b").unwrap());
    assert_eq!(log.state(0, b"k").unwrap(), Some(b"v2".to_vec()));
    assert_eq!(log.state(0, b"gone").unwrap(), None);
    assert_eq!(log.state(1, b"k").unwrap(), None);
    assert_eq!(log.checkpoint(0).unwrap(), Some(7));
    assert_eq!(log.checkpoint(1).unwrap(), None);
    Snapshot::of(&log);
}

#[test]
fn a_failed_apply_leaves_nothing_behind() {
    let (_dir, log) = open_temp();
    log.apply(&[(0, vec![set("k", "old")], Some(1))]).unwrap();
    let before = Snapshot::of(&log);
    let batch = [
        (0, vec![set("k", "new"), processed("a", 1, 1)], Some(2)),
        (1, vec![processed("b", 2, 2), set("j", "v")], Some(9)),
    ];

    // Fail on the last change, when everything before it has been written in redb.
    fail_after(3);
    let err = log.apply(&batch).unwrap_err();
    assert!(matches!(err, Error::State { .. }), "{err:?}");
    assert_eq!(Snapshot::of(&log), before);

    log.apply(&batch).unwrap();
    assert_eq!(log.state(0, b"k").unwrap(), Some(b"new".to_vec()));
    assert_eq!(log.state(1, b"j").unwrap(), Some(b"v".to_vec()));
    assert_eq!(log.checkpoint(1).unwrap(), Some(9));
}

#[test]
fn readers_see_a_batch_across_partitions_whole() {
    let (_dir, log) = open_temp();
    let batches = 40i64;
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for n in 1..=batches {
                let id = format!("id-{n}");
                log.apply(&[
                    (0, vec![processed(&id, n, n)], Some(n)),
                    (1, vec![processed(&id, n, n)], Some(n)),
                ])
                .unwrap();
            }
        });
        loop {
            // Read after checking, so that the last read sees every batch once it is done.
            let done = writer.is_finished();
            let stats = log.stats().unwrap();
            let last = match stats.as_slice() {
                [] => 0,
                [zero, one] => {
                    assert_eq!(zero.processed_entries, one.processed_entries, "{stats:?}");
                    assert_eq!(zero.checkpoint, one.checkpoint, "{stats:?}");
                    assert_eq!(zero.checkpoint, Some(zero.processed_entries as i64));
                    zero.processed_entries as i64
                }
                _ => panic!("one partition without the other: {stats:?}"),
            };
            if done {
                assert_eq!(last, batches);
                break;
            }
        }
    });
}

#[test]
fn reapplying_a_batch_changes_nothing() {
    let (_dir, log) = open_temp();
    let batch = [
        (
            0,
            vec![
                processed("a", 1, 10),
                processed("b", 2, 20),
                // Reprocessed later in the same batch: replaces the entry and its index row.
                processed("a", 3, 30),
                expired("b"),
                expired("never-seen"),
                set("k", "1"),
                delete("k"),
                set("k", "2"),
            ],
            Some(4),
        ),
        (3, vec![processed("c", 1, 5), set("x", "y")], Some(2)),
    ];
    log.apply(&batch).unwrap();
    let once = Snapshot::of(&log);
    assert_eq!(once.processed.get(&(0, "a".into())), Some(&(3, 30)));
    assert!(!once.processed.contains_key(&(0, "b".into())));
    assert_eq!(once.state.get(&(0, b"k".to_vec())), Some(&b"2".to_vec()));

    log.apply(&batch).unwrap();
    assert_eq!(Snapshot::of(&log), once);
    assert_eq!(log.stats().unwrap()[0].processed_entries, 1);
}

/// A log with entries processed at the given times in partition 0, and a few in partition 1.
fn log_with_times(times: &[i64]) -> (tempfile::TempDir, TxLog) {
    let (dir, log) = open_temp();
    let changes = times
        .iter()
        .map(|at| processed(&format!("t{at}"), *at, *at))
        .collect();
    let other = vec![processed("p1-old", 0, 0), processed("p1-new", 1, 1000)];
    log.apply(&[(0, changes, None), (1, other, None)]).unwrap();
    (dir, log)
}

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

#[test]
fn expiry_by_time_returns_the_oldest_first_and_expiring_removes_them() {
    let (_dir, log) = log_with_times(&[50, 10, 30, 20, 40]);
    assert_eq!(
        log.expired(0, 35, None, 100).unwrap(),
        ids(&["t10", "t20", "t30"])
    );
    assert_eq!(log.expired(0, 35, None, 2).unwrap(), ids(&["t10", "t20"]));
    assert_eq!(
        log.expired(0, 10, None, 100).unwrap(),
        ids(&[]),
        "strictly older"
    );
    assert_eq!(log.expired(2, i64::MAX, None, 100).unwrap(), ids(&[]));

    let due = log.expired(0, 35, None, 100).unwrap();
    let changes = due.iter().map(|id| expired(id)).collect();
    log.apply(&[(0, changes, None)]).unwrap();

    assert_eq!(log.expired(0, 35, None, 100).unwrap(), ids(&[]));
    assert!(!log.is_processed(0, "t10").unwrap());
    assert!(log.is_processed(0, "t40").unwrap());
    let stats = log.stats().unwrap();
    assert_eq!(
        (stats[0].processed_entries, stats[0].oldest_processed_at_ms),
        (2, Some(40))
    );
    assert_eq!(stats[1].processed_entries, 2, "partition 1 untouched");
    Snapshot::of(&log);
}

#[test]
fn expiry_by_count_returns_the_oldest_beyond_the_maximum() {
    let (_dir, log) = log_with_times(&[50, 10, 30, 20, 40]);
    assert_eq!(
        log.expired(0, i64::MIN, Some(3), 100).unwrap(),
        ids(&["t10", "t20"])
    );
    assert_eq!(log.expired(0, i64::MIN, Some(5), 100).unwrap(), ids(&[]));
    assert_eq!(
        log.expired(0, i64::MIN, Some(0), 3).unwrap(),
        ids(&["t10", "t20", "t30"])
    );
    // Either criterion expires an entry: the larger set wins.
    assert_eq!(
        log.expired(0, 15, Some(3), 100).unwrap(),
        ids(&["t10", "t20"])
    );
    assert_eq!(
        log.expired(0, 45, Some(3), 100).unwrap(),
        ids(&["t10", "t20", "t30", "t40"])
    );

    let due = log.expired(0, i64::MIN, Some(3), 100).unwrap();
    log.apply(&[(0, due.iter().map(|id| expired(id)).collect(), None)])
        .unwrap();
    assert_eq!(log.expired(0, i64::MIN, Some(3), 100).unwrap(), ids(&[]));
    assert_eq!(log.stats().unwrap()[0].processed_entries, 3);
    Snapshot::of(&log);
}

#[test]
fn clearing_a_partition_forgets_only_that_partition() {
    let (_dir, log) = open_temp();
    for partition in [0, 1, i32::MAX] {
        log.apply(&[(
            partition,
            vec![processed("a", 1, 1), set("k", "v")],
            Some(10),
        )])
        .unwrap();
    }
    log.clear_partition(0).unwrap();
    log.clear_partition(i32::MAX).unwrap();
    let snapshot = Snapshot::of(&log);
    assert_eq!(
        snapshot.processed.keys().map(|k| k.0).collect::<Vec<_>>(),
        [1]
    );
    assert_eq!(snapshot.state.keys().map(|k| k.0).collect::<Vec<_>>(), [1]);
    assert_eq!(snapshot.checkpoints, BTreeMap::from([(1, 10)]));
    assert_eq!(log.checkpoint(0).unwrap(), None);
    assert_eq!(log.expired(0, i64::MAX, None, 10).unwrap(), ids(&[]));
    assert_eq!(log.stats().unwrap().len(), 1);
}

#[test]
fn stats_describe_each_partition_in_order() {
    let (_dir, log) = open_temp();
    assert_eq!(log.stats().unwrap(), []);
    log.apply(&[
        (5, vec![set("a", "1"), set("b", "2")], None),
        (
            -2,
            vec![processed("x", 1, 70), processed("y", 2, 60)],
            Some(3),
        ),
        (9, vec![], Some(0)),
    ])
    .unwrap();
    let expected = vec![
        PartitionStats {
            partition: -2,
            processed_entries: 2,
            state_entries: 0,
            checkpoint: Some(3),
            oldest_processed_at_ms: Some(60),
        },
        PartitionStats {
            partition: 5,
            processed_entries: 0,
            state_entries: 2,
            checkpoint: None,
            oldest_processed_at_ms: None,
        },
        PartitionStats {
            partition: 9,
            processed_entries: 0,
            state_entries: 0,
            checkpoint: Some(0),
            oldest_processed_at_ms: None,
        },
    ];
    assert_eq!(log.stats().unwrap(), expected);
    assert_eq!(
        log.file_size().unwrap(),
        std::fs::metadata(log.path()).unwrap().len()
    );
    assert!(log.file_size().unwrap() > 0);
}

/// A changelog record: partition, key and value (`None`: tombstone).
type Record = (i32, Vec<u8>, Option<Vec<u8>>);

#[test]
fn replaying_the_encoded_records_rebuilds_the_same_log() {
    let history: Vec<(i32, Change)> = vec![
        (0, processed("a", 1, 10)),
        (0, set("k", "1")),
        (1, processed("a", 1, 11)),
        (0, processed("b", 2, 12)),
        (0, expired("a")),
        (1, set("k", "x")),
        (0, set("k", "2")),
        (1, delete("k")),
        (0, processed("a", 3, 13)),
        (0, expired("b")),
        (1, set("bin\0\u{ff}", "\0")),
    ];
    let direct = {
        let (_dir, log) = open_temp();
        for (partition, change) in &history {
            log.apply(&[(*partition, vec![change.clone()], None)])
                .unwrap();
        }
        Snapshot::of(&log)
    };

    let records: Vec<Record> = history
        .iter()
        .map(|(partition, change)| {
            let (key, value) = change.encode();
            (*partition, key, value)
        })
        .collect();
    let replay = |records: &[Record]| {
        let (_dir, log) = open_temp();
        for (n, (partition, key, value)) in records.iter().enumerate() {
            let what = format!("changelog record t/{partition}@{n}");
            let change = Change::decode(key, value.as_deref(), &what).unwrap();
            log.apply(&[(*partition, vec![change], Some(n as i64 + 1))])
                .unwrap();
        }
        let mut snapshot = Snapshot::of(&log);
        snapshot.checkpoints.clear();
        snapshot
    };
    assert_eq!(replay(&records), direct);

    // Compaction keeps only the last record per partition and key; replaying what is left
    // must give the same log.
    let mut last = BTreeMap::new();
    for (n, (partition, key, _)) in records.iter().enumerate() {
        last.insert((*partition, key.clone()), n);
    }
    let compacted: Vec<_> = records
        .iter()
        .enumerate()
        .filter(|(n, (partition, key, _))| last[&(*partition, key.clone())] == *n)
        .map(|(_, record)| record.clone())
        .collect();
    assert!(compacted.len() < records.len());
    assert_eq!(replay(&compacted), direct);
}

#[test]
fn the_log_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TxLog>();
}

#[test]
fn a_committed_batch_moves_the_checkpoint_only_over_records_that_follow_it() {
    let (_dir, log) = open_temp();
    let landed = |first, next| Some(Landed { first, next });
    let progress = |input_offset| Change::Progress { input_offset };
    // Replay left the checkpoint at 10, with no commit marker to expect.
    log.apply(&[(0, vec![], Some(10))]).unwrap();
    log.apply_committed(&[(0, vec![progress(5)], landed(10, 13))], true, SYNC)
        .unwrap();
    assert_eq!(log.checkpoint(0).unwrap(), Some(13));
    // After a committed transaction, one offset (its commit marker) may lie between.
    log.apply_committed(&[(0, vec![progress(7)], landed(14, 16))], true, SYNC)
        .unwrap();
    assert_eq!(log.checkpoint(0).unwrap(), Some(16));
    // Records nobody read lie before this batch's: the changes apply, the checkpoint stays.
    log.apply_committed(
        &[(0, vec![set("k", "v"), progress(9)], landed(20, 22))],
        true,
        SYNC,
    )
    .unwrap();
    assert_eq!(log.checkpoint(0).unwrap(), Some(16));
    assert_eq!(log.state(0, b"k").unwrap(), Some(b"v".to_vec()));
    assert_eq!(log.progress(0).unwrap(), Some(9));
    // Replay sets it past the markers it read: no marker to expect any more, so a
    // one-offset gap is a record nobody read.
    log.apply(&[(0, vec![], Some(25))]).unwrap();
    log.apply_committed(&[(0, vec![progress(11)], landed(26, 27))], true, SYNC)
        .unwrap();
    assert_eq!(log.checkpoint(0).unwrap(), Some(25));
    // Without transactions there are no markers: only a batch right at the checkpoint moves it.
    log.apply_committed(&[(0, vec![progress(12)], landed(25, 27))], false, SYNC)
        .unwrap();
    assert_eq!(log.checkpoint(0).unwrap(), Some(27));
    log.apply_committed(&[(0, vec![progress(13)], landed(28, 29))], false, SYNC)
        .unwrap();
    assert_eq!(log.checkpoint(0).unwrap(), Some(27));
    // A partition never replayed has no checkpoint to move.
    log.apply_committed(&[(1, vec![progress(1)], landed(0, 1))], true, SYNC)
        .unwrap();
    assert_eq!(log.checkpoint(1).unwrap(), None);

    log.clear_partition(0).unwrap();
    assert_eq!(log.progress(0).unwrap(), None);
    assert_eq!(log.checkpoint(0).unwrap(), None);
}

#[test]
fn a_lookup_honours_the_dedup_window() {
    let (_dir, log) = open_temp();
    log.apply(&[(
        0,
        vec![processed("old", 1, 1_000), processed("new", 2, 5_000)],
        None,
    )])
    .unwrap();
    let snapshot = log.snapshot().unwrap();
    assert!(!snapshot.is_processed(0, "old", 2_000).unwrap());
    assert!(snapshot.is_processed(0, "new", 2_000).unwrap());
    assert!(snapshot.is_processed(0, "old", 1_000).unwrap());
    assert!(!snapshot.is_processed(0, "absent", i64::MIN).unwrap());
}

#[test]
fn a_changelog_with_another_topic_id_empties_the_log() {
    let (_dir, log) = open_temp();
    assert_eq!(
        log.adopt_changelog("id-1").unwrap(),
        None,
        "a new file adopts"
    );
    log.apply(&[
        (0, vec![processed("a", 5, 100), set("k", "v")], Some(9)),
        (1, vec![processed("b", 6, 100)], Some(4)),
    ])
    .unwrap();
    assert_eq!(log.adopt_changelog("id-1").unwrap(), None, "the same topic");
    assert!(log.is_processed(0, "a").unwrap());

    assert_eq!(
        log.adopt_changelog("id-2").unwrap().as_deref(),
        Some("id-1")
    );
    let after = Snapshot::of(&log);
    assert_eq!(
        after,
        Snapshot::default(),
        "nothing of the old topic is left"
    );
    assert_eq!(log.checkpoint(0).unwrap(), None);
    assert_eq!(log.progress(1).unwrap(), None);
    // Adopted: the next start finds it the same.
    assert_eq!(log.adopt_changelog("id-2").unwrap(), None);
}

/// A log killed after `synced` applies were synced and `unsynced` more were not, reopened.
fn killed_after(
    interval: Duration,
    synced: &[Batch],
    unsynced: &[Batch],
) -> (tempfile::TempDir, TxLog) {
    let (dir, log) = open_temp();
    log.syncing().interval = interval;
    for batch in synced {
        log.apply(batch).unwrap();
    }
    log.sync().unwrap();
    assert!(log.synced());
    for batch in unsynced {
        log.apply(batch).unwrap();
    }
    log.kill().unwrap();
    let (log, opened) = TxLog::open(&dir.path().join("state")).unwrap();
    assert_eq!(
        opened,
        Opened::Existing,
        "a killed log opens, it is not rebuilt"
    );
    (dir, log)
}

type Batch = Vec<(i32, Vec<Change>, Option<i64>)>;

#[test]
fn a_killed_log_comes_back_at_its_last_sync_and_replay_brings_it_up_to_date() {
    let synced: Vec<Batch> = vec![
        vec![(0, vec![processed("a", 0, 100), set("k", "1")], Some(2))],
        vec![(1, vec![processed("b", 0, 100)], Some(1))],
    ];
    let unsynced: Vec<Batch> = vec![
        vec![(
            0,
            vec![processed("c", 1, 200), set("k", "2"), set("j", "x")],
            Some(5),
        )],
        vec![
            (0, vec![expired("a"), delete("j")], Some(7)),
            (1, vec![set("m", "y")], Some(3)),
        ],
    ];
    let (_all, whole) = open_temp();
    for batch in synced.iter().chain(&unsynced) {
        whole.apply(batch).unwrap();
    }
    let (_at_sync, at_sync) = open_temp();
    for batch in &synced {
        at_sync.apply(batch).unwrap();
    }

    let (_dir, log) = killed_after(Duration::from_secs(3600), &synced, &unsynced);
    // Consistent as of the sync (Snapshot::of checks the index and the counts): the
    // unsynced applies, checkpoints included, are gone as a whole.
    assert_eq!(Snapshot::of(&log), Snapshot::of(&at_sync));
    assert_eq!(log.checkpoint(0).unwrap(), Some(2));
    // What replay does: the records from each checkpoint on, again.
    for batch in &unsynced {
        log.apply(batch).unwrap();
    }
    assert_eq!(Snapshot::of(&log), Snapshot::of(&whole));
}

#[test]
fn applies_are_synced_once_the_oldest_unsynced_one_is_a_sync_interval_old() {
    let batch: Batch = vec![(0, vec![set("k", "v")], Some(1))];
    let (_dir, log) = open_temp();
    log.syncing().interval = Duration::ZERO;
    log.apply(&batch).unwrap();
    assert!(log.synced(), "a zero interval syncs every apply");

    log.syncing().interval = Duration::from_secs(3600);
    log.apply(&batch).unwrap();
    assert!(!log.synced(), "the first apply after a sync waits");
    log.apply(&batch).unwrap();
    assert!(!log.synced());
    let long_ago = std::time::Instant::now() - Duration::from_secs(7200);
    log.syncing().unsynced_since = Some(long_ago);
    log.apply(&batch).unwrap();
    assert!(
        log.synced(),
        "an apply a sync interval after the oldest unsynced one syncs"
    );

    // The engine's batches bring the configured interval, which replays use too.
    log.apply_committed(&[(0, vec![], None)], true, Duration::ZERO)
        .unwrap();
    assert!(log.synced());
    log.apply(&batch).unwrap();
    assert!(log.synced());

    // Writes other than applies are synced at once.
    log.syncing().interval = Duration::from_secs(3600);
    log.apply(&batch).unwrap();
    log.clear_partition(0).unwrap();
    assert!(log.synced());
}

#[test]
fn an_idle_log_is_synced_by_its_syncer() {
    let (_dir, log) = open_temp();
    log.syncing().interval = Duration::from_millis(20);
    log.apply(&[(0, vec![set("k", "v")], Some(1))]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !log.synced() {
        assert!(
            std::time::Instant::now() < deadline,
            "no sync 30 s after an apply with a 20 ms sync interval"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_log_closed_cleanly_keeps_its_unsynced_applies() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = TxLog::open(dir.path()).unwrap();
    log.syncing().interval = Duration::from_secs(3600);
    log.apply(&[(0, vec![set("k", "v")], Some(4))]).unwrap();
    assert!(!log.synced());
    drop(log);
    let (log, _) = TxLog::open(dir.path()).unwrap();
    assert_eq!(log.checkpoint(0).unwrap(), Some(4));
    assert_eq!(log.state(0, b"k").unwrap(), Some(b"v".to_vec()));
}

/// Tells the child test where its log is (set only in the child).
const KILLED_CHILD_DIR: &str = "ONCEFLOW_TEST_TXLOG_KILLED_CHILD";
/// The child's page cache in bytes, when not the default (set only in the child).
const KILLED_CHILD_CACHE: &str = "ONCEFLOW_TEST_TXLOG_KILLED_CHILD_CACHE";
/// Keys the child's unsynced apply writes.
const KILLED_CHILD_KEYS: usize = 20_000;

/// The child half of the next tests: applies, syncs, applies again (one key, or with a
/// small cache many more bytes than the cache holds), and is SIGKILLed before the second
/// apply is synced. Does nothing when run as a test of its own.
#[test]
fn killed_child() {
    let Some(dir) = std::env::var_os(KILLED_CHILD_DIR) else {
        return;
    };
    let cache = std::env::var(KILLED_CHILD_CACHE)
        .ok()
        .map(|bytes| bytes.parse::<usize>().unwrap());
    let (log, _) =
        TxLog::open_with_cache(Path::new(&dir), cache.unwrap_or(DEFAULT_CACHE_SIZE)).unwrap();
    log.syncing().interval = Duration::from_secs(3600);
    log.apply(&[(0, vec![set("k", "synced")], Some(1))])
        .unwrap();
    log.sync().unwrap();
    let mut unsynced = vec![set("k", "unsynced")];
    if cache.is_some() {
        let value = "v".repeat(200);
        unsynced.extend((0..KILLED_CHILD_KEYS).map(|i| set(&format!("key-{i:05}"), &value)));
        unsynced.extend((0..KILLED_CHILD_KEYS).map(|i| processed(&format!("id-{i:05}"), 1, 1)));
    }
    log.apply(&[(0, unsynced, Some(2))]).unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-9", &std::process::id().to_string()])
        .status();
    std::thread::sleep(Duration::from_secs(30));
    panic!("SIGKILL did not come");
}

/// Runs [`killed_child`] on `state`, with a page cache of `cache` bytes if given, and
/// checks that it was SIGKILLed.
fn run_killed_child(state: &Path, cache: Option<usize>) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "txlog::store::tests::killed_child",
            "--test-threads=1",
        ])
        .env(KILLED_CHILD_DIR, state)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(cache) = cache {
        child.env(KILLED_CHILD_CACHE, cache.to_string());
    }
    let status = child.status().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "the child was SIGKILLed: {status}"
        );
    }
}

/// What `TxLog::kill` stands for in the other tests, with a real process: killed between
/// two syncs, the file opens at its last sync.
#[test]
fn a_process_killed_between_syncs_leaves_its_log_at_the_last_sync() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    run_killed_child(&state, None);
    let (log, opened) = TxLog::open(&state).unwrap();
    assert_eq!(opened, Opened::Existing);
    assert_eq!(log.checkpoint(0).unwrap(), Some(1));
    assert_eq!(log.state(0, b"k").unwrap(), Some(b"synced".to_vec()));
}

/// With a cache far smaller than an unsynced apply (a 256 KiB cache, about 6 MB written),
/// redb writes pages of the unsynced commit to the file before the sync: a kill then
/// still leaves the file at its last sync, whole, and none of the unsynced keys in it.
#[test]
fn a_small_cache_overflowed_between_syncs_still_opens_at_the_last_sync() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cache = 256 << 10;
    run_killed_child(&state, Some(cache));
    let (log, opened) = TxLog::open_with_cache(&state, cache).unwrap();
    assert_eq!(opened, Opened::Existing, "the file opens as it is");
    assert_eq!(log.cache_size(), cache);
    assert_eq!(log.checkpoint(0).unwrap(), Some(1));
    assert_eq!(log.state(0, b"k").unwrap(), Some(b"synced".to_vec()));
    assert_eq!(log.state(0, b"key-00000").unwrap(), None);
    assert!(!log.is_processed(0, "id-19999").unwrap());
    let stats = log.stats().unwrap();
    assert_eq!(stats[0].state_entries, 1, "{stats:?}");
    assert_eq!(stats[0].processed_entries, 0, "{stats:?}");
    // The file takes the changes again, as a replay of the changelog would make them.
    let value = "v".repeat(200);
    let changes: Vec<Change> = (0..KILLED_CHILD_KEYS)
        .map(|i| set(&format!("key-{i:05}"), &value))
        .collect();
    log.apply(&[(0, changes, Some(2))]).unwrap();
    assert_eq!(
        log.stats().unwrap()[0].state_entries,
        KILLED_CHILD_KEYS as u64 + 1
    );
}

/// The rows of `partition`'s expiry index: (time, number of IDs), oldest first.
fn index_rows(log: &TxLog, partition: i32) -> Vec<(i64, usize)> {
    let txn = log.db.begin_read().unwrap();
    let index = txn.open_table(EXPIRY).unwrap();
    index
        .range(expiry::partition_rows(partition))
        .unwrap()
        .map(|row| {
            let (key, value) = row.unwrap();
            (key.value().1, expiry::decode(value.value()).unwrap().len())
        })
        .collect()
}

#[test]
fn a_batchs_entries_share_index_rows_which_fill_up_and_empty_in_parts() {
    let per_row = expiry::IDS_PER_ROW;
    let (_dir, log) = open_temp();
    let batch = |from: usize, to: usize, at: i64| -> Vec<Change> {
        (from..to)
            .map(|n| processed(&format!("e{n:04}"), n as i64, at))
            .collect()
    };
    // Two rows and a half at one time.
    let first = 2 * per_row + per_row / 2;
    log.apply(&[(0, batch(0, first, 100), None)]).unwrap();
    assert_eq!(
        index_rows(&log, 0),
        [(100, per_row), (100, per_row), (100, per_row / 2)]
    );
    // A later apply at the same time fills the last row, then starts another.
    log.apply(&[(0, batch(first, first + per_row, 100), None)])
        .unwrap();
    assert_eq!(
        index_rows(&log, 0),
        [
            (100, per_row),
            (100, per_row),
            (100, per_row),
            (100, per_row / 2)
        ]
    );
    // An older time sorts first, and expires first.
    log.apply(&[(0, batch(9000, 9002, 50), None)]).unwrap();
    let due = log.expired(0, 101, None, per_row + 1).unwrap();
    let mut expected = ids(&["e9000", "e9001"]);
    expected.extend((0..per_row - 1).map(|n| format!("e{n:04}")));
    assert_eq!(due, expected, "oldest first, then in the order processed");

    // Expiring part of a row rewrites it; expiring a whole one removes it.
    log.apply(&[(0, due.iter().map(|id| expired(id)).collect(), None)])
        .unwrap();
    assert_eq!(index_rows(&log, 0)[0], (100, 1));
    assert_eq!(index_rows(&log, 0).len(), 4);
    let total = first + per_row + 2;
    assert_eq!(
        log.stats().unwrap()[0].processed_entries as usize,
        total - due.len()
    );
    assert_eq!(log.stats().unwrap()[0].oldest_processed_at_ms, Some(100));
    Snapshot::of(&log);
}

#[test]
fn an_entry_processed_again_moves_to_its_new_time_and_replaying_it_moves_nothing() {
    let (_dir, log) = open_temp();
    let first = vec![processed("a", 1, 10), processed("b", 2, 10)];
    log.apply(&[(0, first.clone(), None)]).unwrap();
    // Past the window, "a" comes again: processed anew, at a later time.
    let again = vec![processed("a", 9, 20)];
    log.apply(&[(0, again.clone(), None)]).unwrap();
    assert_eq!(index_rows(&log, 0), [(10, 1), (20, 1)]);
    assert_eq!(log.expired(0, 15, None, 10).unwrap(), ids(&["b"]));
    // A replay of both batches (a crash before the checkpoint) changes nothing.
    let before = Snapshot::of(&log);
    log.apply(&[(0, [first, again].concat(), None)]).unwrap();
    assert_eq!(Snapshot::of(&log), before);
    assert_eq!(index_rows(&log, 0), [(10, 1), (20, 1)]);
    // Processed, expired and processed again within one apply: one entry, one row.
    log.apply(&[(
        0,
        vec![processed("c", 3, 30), expired("c"), processed("c", 4, 30)],
        None,
    )])
    .unwrap();
    assert_eq!(index_rows(&log, 0), [(10, 1), (20, 1), (30, 1)]);
    Snapshot::of(&log);
}

/// One change of the property test below: partition, ID, and a time for `Processed`
/// (`None`: expired).
#[derive(Debug, Clone)]
struct IndexOp {
    partition: i32,
    id: u8,
    at: Option<i64>,
}

fn index_op() -> impl proptest::strategy::Strategy<Value = IndexOp> {
    use proptest::prelude::*;
    (0..2i32, 0..10u8, proptest::option::weighted(0.7, 1..5i64))
        .prop_map(|(partition, id, at)| IndexOp { partition, id, at })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// However changes are grouped into applies, the expiry index holds exactly the
    /// entries, each under its time (`Snapshot::of` checks that after every apply), and
    /// expiry hands every entry back oldest first.
    #[test]
    fn the_expiry_index_follows_every_change_however_they_are_grouped(
        ops in proptest::collection::vec(index_op(), 0..80),
        cuts in proptest::collection::vec(0..80usize, 0..10),
    ) {
        let (_dir, log) = open_temp();
        let mut model: BTreeMap<(i32, String), (i64, i64)> = BTreeMap::new();
        let mut cuts = cuts;
        cuts.push(ops.len());
        cuts.sort_unstable();
        let mut from = 0;
        for cut in cuts {
            let to = cut.min(ops.len());
            if to < from {
                continue;
            }
            let mut batch: BTreeMap<i32, Vec<Change>> = BTreeMap::new();
            for (offset, op) in ops[from..to].iter().enumerate() {
                let id = format!("id{}", op.id);
                let changes = batch.entry(op.partition).or_default();
                match op.at {
                    Some(at) => {
                        let offset = (from + offset) as i64;
                        changes.push(processed(&id, offset, at));
                        model.insert((op.partition, id), (offset, at));
                    }
                    None => {
                        changes.push(expired(&id));
                        model.remove(&(op.partition, id));
                    }
                }
            }
            let batch: Vec<_> = batch.into_iter().map(|(p, c)| (p, c, None)).collect();
            log.apply(&batch).unwrap();
            proptest::prop_assert_eq!(&Snapshot::of(&log).processed, &model);
            from = to;
        }
        for partition in 0..2 {
            let due = log.expired(partition, i64::MAX, None, usize::MAX).unwrap();
            let times: Vec<i64> = due.iter().map(|id| model[&(partition, id.clone())].1).collect();
            proptest::prop_assert!(times.is_sorted(), "not oldest first: {:?}", times);
            let mut due = due;
            due.sort();
            let expected: Vec<String> = model
                .keys()
                .filter(|(p, _)| *p == partition)
                .map(|(_, id)| id.clone())
                .collect();
            proptest::prop_assert_eq!(due, expected);
        }
    }
}
