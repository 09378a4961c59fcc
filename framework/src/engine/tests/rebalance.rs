//! Rebalances while the consumer is held: handed on to the engine's loop, the partitions
//! they moved not sought, an assignment caught up before its records while the group
//! moves it again, and the records a held consumer gets followed in the order they came.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::ErrorClass;
use crate::config::DeliveryMode;
use crate::engine::recovery::recover;
use crate::kafka::{Polled, Rebalanced};
use crate::testing::kafka::{Call, injected as kafka};

use super::recovery_rig::Rig;

/// A partition revoked while the consumer is held is not sought (its new owner reads it
/// from the committed offset), and neither is one revoked and assigned back (the
/// engine's loop catches it up for its new assignment, whose records may already be
/// among the held polls: a seek would make them come twice; the simulation found a
/// refused record dead-lettered twice that way). The others are.
#[tokio::test(start_paused = true)]
async fn a_rebalance_while_held_is_handed_on_and_partitions_it_moved_are_not_sought() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    // Each replay takes 2 s: the held consumer is polled meanwhile, and the group takes
    // partitions 1 and 2 away and gives 2 back; 0 stays.
    rig.kafka.restore_takes(Duration::from_secs(2));
    rig.kafka.serve_while_held(vec![
        vec![Rebalanced::Revoked(vec![1, 2])],
        vec![Rebalanced::Assigned(vec![2])],
    ]);
    rig.kafka.assign(&[0, 2]);
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let mut producer = rig.kafka.clone();
    let owned: BTreeSet<i32> = [0, 1, 2].into();
    recover(
        &resync,
        &rig.kafka,
        &mut producer,
        &owned,
        &kafka(ErrorClass::Abortable)(),
    )
    .await
    .expect("recovered");
    let calls = rig.kafka.calls();
    assert_eq!(
        calls.last(),
        Some(&Call::Seek(vec![(0, Some(10))])),
        "{calls:?}"
    );
    let rebalances: Vec<Rebalanced> = resync
        .take_held()
        .into_iter()
        .flat_map(|polled| polled.rebalances)
        .collect();
    assert_eq!(
        rebalances,
        [
            Rebalanced::Revoked(vec![1, 2]),
            Rebalanced::Assigned(vec![2])
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_assignment_is_caught_up_before_its_records_and_a_rebalance_meanwhile_is_followed() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    // Longer than HOLD_AFTER_ASSIGNMENT, so the consumer is held and polled.
    rig.kafka.restore_takes(Duration::from_secs(6));
    // While partition 0 replays, the group takes it away and gives it back.
    rig.kafka.serve_while_held(vec![vec![
        Rebalanced::Revoked(vec![0]),
        Rebalanced::Assigned(vec![0]),
    ]]);
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let early = crate::kafka::Record {
        topic: "in".into(),
        partition: 0,
        offset: 10,
        key: None,
        value: None,
        headers: Vec::new(),
        timestamp_ms: None,
    };
    let mut polled = Polled {
        records: vec![early],
        rebalances: vec![Rebalanced::Assigned(vec![0])],
    };
    let mut owned = BTreeSet::new();
    crate::engine::serve::follow(&resync, &rig.kafka, &mut owned, &mut polled)
        .await
        .expect("followed");
    assert_eq!(owned, [0].into());
    // Polled before the revocation: the new assignment reads it again.
    assert!(polled.records.is_empty(), "{:?}", polled.records);
    let catch_up = [
        Call::Committed(vec![0]),
        Call::Restore(0, Some(10)),
        Call::Hold,
        Call::Release,
    ];
    assert_eq!(rig.kafka.calls(), [catch_up.clone(), catch_up].concat());
    assert_eq!(rig.stats.snapshot().assignments, 2);
}

fn record(partition: i32, offset: i64) -> crate::kafka::Record {
    crate::kafka::Record {
        topic: "in".into(),
        partition,
        offset,
        key: None,
        value: None,
        headers: Vec::new(),
        timestamp_ms: None,
    }
}

/// Hole A of issue 40: a held consumer's polls were merged, records apart from
/// rebalances, so a held revocation of partition 0 also dropped the records 0 got after
/// it was assigned back. The consumer's position was past them, the next record passed
/// the floor, and they were never processed: the next commit moved past them. What a
/// held consumer brings is followed in the order it came.
#[tokio::test(start_paused = true)]
async fn records_a_held_consumer_gets_after_a_partition_comes_back_are_kept() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    // Longer than HOLD_AFTER_ASSIGNMENT, so the consumer is held and polled.
    rig.kafka.restore_takes(Duration::from_secs(6));
    // While partition 1 replays, the group takes 0 away, gives it back, and 0's records
    // from its committed offset (10) come in before its pause.
    rig.kafka.poll_while_held(vec![
        Polled {
            records: Vec::new(),
            rebalances: vec![Rebalanced::Revoked(vec![0])],
        },
        Polled {
            records: vec![record(0, 10), record(0, 11)],
            rebalances: vec![Rebalanced::Assigned(vec![0])],
        },
    ]);
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let mut polled = Polled {
        records: vec![record(0, 9)],
        rebalances: vec![Rebalanced::Assigned(vec![1])],
    };
    let mut owned = BTreeSet::from([0]);
    crate::engine::serve::follow(&resync, &rig.kafka, &mut owned, &mut polled)
        .await
        .expect("followed");
    assert_eq!(owned, [0, 1].into());
    let kept: Vec<(i32, i64)> = polled
        .records
        .iter()
        .map(|r| (r.partition, r.offset))
        .collect();
    assert_eq!(
        kept,
        [(0, 10), (0, 11)],
        "0's record from before it was revoked goes; those after it came back stay"
    );
}
