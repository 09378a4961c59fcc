//! Commits that answered with an error: whether the batch went through is settled by the
//! group's committed offsets (or by the changelog, when they lag), a timed-out commit by a
//! new producer, and the batch is counted as what it was. Then the floor such a catch-up
//! sets: records below it dropped, the first past it sought back to once, and the floor
//! forgotten with its partition.

use std::collections::BTreeSet;

use crate::config::DeliveryMode;
use crate::engine::recovery::Resync;
use crate::kafka::Record;
use crate::testing::kafka::{Call, FakeKafka, Kind, injected as kafka_error};
use crate::{Error, ErrorClass};

use super::batch_rig::{Rig, amount};

/// The batch rig's recovery, which only these tests use.
impl Rig {
    /// Recovers from `error` as the engine does, with partition 0 assigned and the
    /// calls so far cleared; returns the `Resync` it used, floors and all.
    async fn recover(&self, error: &Error) -> Resync<'_, FakeKafka, FakeKafka> {
        self.kafka.assign(&[0]);
        self.kafka.clear_calls();
        let resync = self.kafka.resync(&self.config, &self.stats);
        let mut producer = self.kafka.clone();
        crate::engine::recovery::recover(&resync, &self.kafka, &mut producer, &[0].into(), error)
            .await
            .expect("recovered");
        resync
    }

    /// Commits a batch at offset 0, fails the next one's commit and recovers: partition
    /// 0 has a floor at 1. Returns the `Resync` with it.
    async fn floor_after_a_failed_commit(&self) -> Resync<'_, FakeKafka, FakeKafka> {
        self.run(vec![amount(0, "a", 1)]).await.expect("batch");
        self.kafka
            .fail(Kind::Commit, None, 1, kafka_error(ErrorClass::Retriable));
        let error = self
            .run(vec![amount(1, "b", 2)])
            .await
            .expect_err("the commit failed");
        self.recover(&error).await
    }
}

/// A commit whose outcome the engine cannot know (its answer was an error, yet it went
/// through). Recovery assumes nothing: it reads the group's committed offsets, replays the
/// changelog up to them and moves there, the batch's end; nothing is processed twice.
#[tokio::test(start_paused = true)]
async fn a_commit_whose_outcome_is_unknown_is_settled_by_the_committed_offsets() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka
        .fail_after_applying(Kind::Commit, 1, kafka_error(ErrorClass::Retriable));
    let failed = rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)]).await;
    let error = failed.expect_err("the commit answered with an error");
    assert_eq!(rig.sums(), [1, 3], "and went through");

    rig.recover(&error).await;
    let calls = rig.kafka.calls();
    assert!(calls.contains(&Call::Restore(0, Some(2))), "{calls:?}");
    assert_eq!(
        calls.last(),
        Some(&Call::Seek(vec![(0, Some(2))])),
        "{calls:?}"
    );
    assert_eq!(rig.sums(), [1, 3]);
}

/// The counters of a batch whose commit answered with an error: counted as committed
/// when the committed offsets show it went through (its outputs are visible, and what it
/// skipped was skipped), as aborted when they show it did not. Before, a batch that went
/// through after all was counted as neither, and the broker tests' exact
/// `duplicates_skipped` failed whenever such a batch held a duplicate.
#[tokio::test(start_paused = true)]
async fn a_batch_that_went_through_after_all_is_counted_as_committed() {
    for went_through in [true, false] {
        let rig = Rig::new(DeliveryMode::ExactlyOnce);
        let failure = kafka_error(ErrorClass::Retriable);
        if went_through {
            rig.kafka.fail_after_applying(Kind::Commit, 1, failure);
        } else {
            rig.kafka.fail(Kind::Commit, None, 1, failure);
        }
        // "a" twice: the second is a duplicate.
        let records = vec![amount(0, "a", 1), amount(1, "a", 1), amount(2, "b", 2)];
        let error = rig.run(records).await.expect_err("the commit failed");
        rig.recover(&error).await;
        let s = rig.stats.snapshot();
        let counted = (
            s.records_in,
            s.outputs,
            s.duplicates_skipped,
            s.commits,
            s.aborts,
        );
        if went_through {
            assert_eq!(rig.sums(), [1, 3]);
            assert_eq!(counted, (3, 2, 1, 1, 0), "went through: {s:?}");
        } else {
            assert!(rig.sums().is_empty());
            assert_eq!(counted, (0, 0, 0, 0, 1), "aborted: {s:?}");
        }
    }
}

/// Fail closed (issue 40): a commit that timed out on the client but went through is
/// not retried or aborted on the same producer; a new producer takes over, and the
/// committed offsets show the batch committed: its outputs are visible once and it
/// counts as committed.
#[tokio::test(start_paused = true)]
async fn a_commit_that_timed_out_but_went_through_is_settled_by_a_new_producer() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka
        .fail_after_applying(Kind::Commit, 1, || Error::Kafka {
            operation: "commit_transaction".into(),
            code: crate::KafkaCode::OPERATION_TIMED_OUT,
            message: "Local: Timed out".into(),
            class: ErrorClass::Retriable,
            cause: None,
        });
    let error = rig
        .run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect_err("the commit timed out");
    rig.recover(&error).await;
    let calls = rig.kafka.calls();
    assert!(calls.contains(&Call::Renew), "{calls:?}");
    assert!(!calls.contains(&Call::Abort), "{calls:?}");
    assert_eq!(
        calls.last(),
        Some(&Call::Seek(vec![(0, Some(2))])),
        "{calls:?}"
    );
    assert_eq!(rig.sums(), [1, 3]);
    let s = rig.stats.snapshot();
    assert_eq!((s.commits, s.aborts), (1, 0), "{s:?}");
}

/// A commit that went through while the group's committed offsets still read the batch's
/// start (seen on the three-node cluster after a killed coordinator: the batch's records
/// came again, skipped only because their event IDs were in the log; records without an
/// ID would have been processed twice). The changelog, committed in the same transaction,
/// shows where the batch ended: recovery goes on from there, and counts the batch.
#[tokio::test(start_paused = true)]
async fn a_commit_the_changelog_shows_is_gone_past_when_the_offsets_lag() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka
        .fail_after_applying(Kind::Commit, 1, kafka_error(ErrorClass::Retriable));
    let error = rig
        .run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect_err("the commit answered with an error");
    rig.kafka.committed_offset_reads(0, 0);
    rig.kafka.progress_after_replay(0, 2);

    let resync = rig.recover(&error).await;
    let calls = rig.kafka.calls();
    assert_eq!(
        calls.last(),
        Some(&Call::Seek(vec![(0, Some(2))])),
        "{calls:?}"
    );
    let s = rig.stats.snapshot();
    assert_eq!((s.outputs, s.commits, s.aborts), (2, 1, 0), "{s:?}");
    // What a lagging consumer brings from below that point is not processed again.
    let mut records = vec![amount(0, "a", 1), amount(1, "b", 2), amount(2, "c", 3)];
    assert_eq!(resync.floors(), [0]);
    assert_eq!(resync.drop_committed(&mut records).below, 2);
    assert_eq!(rig.stats.snapshot().already_committed, 2);
    assert_eq!(records.iter().map(|r| r.offset).collect::<Vec<_>>(), [2]);
    // Once the partition is past its floor, the polls that follow are not looked at.
    assert!(resync.floors().is_empty(), "{:?}", resync.floors());
}

/// Hole G of issue 40: a partition's first record past its floor is sought back to
/// once (the consumer may have started past the committed offset); still past it after
/// the seek (transaction markers there), it is taken, and nothing loops.
#[tokio::test(start_paused = true)]
async fn a_first_record_past_the_floor_is_sought_back_to_once() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let resync = rig.floor_after_a_failed_commit().await;
    assert_eq!(resync.floors(), [0]);
    let offsets = |records: &[Record]| records.iter().map(|r| r.offset).collect::<Vec<_>>();

    let mut records = vec![amount(3, "c", 1), amount(4, "d", 1)];
    let placed = resync.drop_committed(&mut records);
    assert_eq!(placed.seek, [(0, Some(1))]);
    assert!(
        records.is_empty(),
        "not processed before the seek: {records:?}"
    );
    // Offsets 1 and 2 hold markers: the seek brings 3 first again.
    let mut records = vec![amount(3, "c", 1), amount(4, "d", 1)];
    let placed = resync.drop_committed(&mut records);
    assert!(
        placed.seek.is_empty() && placed.corrected == 0,
        "{placed:?}"
    );
    assert_eq!(offsets(&records), [3, 4]);
    assert!(resync.floors().is_empty());

    // A seek that finds what the consumer had started past is a correction.
    let error = {
        rig.kafka
            .fail(Kind::Commit, None, 1, kafka_error(ErrorClass::Retriable));
        rig.run(vec![amount(1, "b", 2)]).await.expect_err("failed")
    };
    let resync = rig.recover(&error).await;
    let mut records = vec![amount(3, "c", 1)];
    assert_eq!(resync.drop_committed(&mut records).seek, [(0, Some(1))]);
    let mut records = vec![amount(1, "b", 2), amount(2, "x", 1), amount(3, "c", 1)];
    let placed = resync.drop_committed(&mut records);
    assert_eq!((placed.below, placed.corrected), (0, 1), "{placed:?}");
    assert_eq!(offsets(&records), [1, 2, 3]);
}

/// The floor a catch-up sets goes with its partition: a revoked partition's is forgotten
/// (its next owner catches up and sets its own), so no poll after looks records up.
#[tokio::test(start_paused = true)]
async fn a_revoked_partition_forgets_its_floor() {
    use crate::kafka::{Polled, Rebalanced};

    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let resync = rig.floor_after_a_failed_commit().await;
    assert_eq!(resync.floors(), [0]);
    let mut owned: BTreeSet<i32> = [0].into();
    let mut polled = Polled {
        records: vec![amount(1, "b", 2)],
        rebalances: vec![Rebalanced::Revoked(vec![0])],
    };
    crate::engine::serve::follow(&resync, &rig.kafka, &mut owned, &mut polled)
        .await
        .expect("followed");
    assert!(owned.is_empty() && polled.records.is_empty());
    assert!(resync.floors().is_empty(), "{:?}", resync.floors());
}
