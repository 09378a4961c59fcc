//! Fences: of the producer, with a successor in the group or none; of the consumer's
//! static membership, with a live member under the instance ID or none, the group
//! described or not; of both; the budget of fences an instance takes for its own; and
//! joining the group again after one.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::config::DeliveryMode;
use crate::engine::recovery::{Resync, recover};
use crate::kafka::Holder;
use crate::testing::kafka::{Call, FAKE_SESSION_TIMEOUT, FakeKafka, Kind, injected as kafka};
use crate::{Error, ErrorClass};

use super::recovery_rig::{Rig, assert_caught_up_after, fenced};

fn producer_fenced() -> Error {
    Error::Fenced {
        what: "transactional.id `g-a`".into(),
        detail: "Failed to end transaction: Local: This instance has been fenced".into(),
    }
}

/// The cluster test saw it: the transaction coordinator killed, the producer's epoch bump
/// reached it but its answer did not, and the new coordinator fenced the producer. No
/// successor: the group membership stands, so a new producer takes over.
#[tokio::test(start_paused = true)]
async fn a_fence_with_no_successor_in_the_group_makes_a_new_producer() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    let started = tokio::time::Instant::now();
    let resync = rig.recover(&producer_fenced()).await.expect("recovered");
    assert!(started.elapsed() >= crate::engine::recovery::FENCE_GRACE);
    assert!(!resync.producer_fenced(), "replaced");
    assert_caught_up_after(&rig, &[Call::Hold, Call::Renew]);

    // The same when the abort is what reports the fence.
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka.fail(Kind::Abort, None, 1, producer_fenced);
    rig.recover(&kafka(ErrorClass::Abortable)())
        .await
        .expect("recovered");
    assert_caught_up_after(&rig, &[Call::Hold, Call::Abort, Call::Renew]);
}

/// A successor joined under the instance ID: the consumer hears of it within the grace,
/// and the instance stops without a new producer (which would fence the successor).
#[tokio::test(start_paused = true)]
async fn a_fence_with_the_member_replaced_stops_without_a_new_producer() {
    for cause_in_abort in [false, true] {
        let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
        rig.kafka.raise_fatal_in(Duration::from_secs(3), fenced);
        let cause = if cause_in_abort {
            rig.kafka.fail(Kind::Abort, None, 1, producer_fenced);
            kafka(ErrorClass::Abortable)()
        } else {
            producer_fenced()
        };
        let resync = rig.kafka.resync(&rig.config, &rig.stats);
        let mut producer = rig.kafka.clone();
        let owned: BTreeSet<i32> = [0, 1].into();
        match recover(&resync, &rig.kafka, &mut producer, &owned, &cause).await {
            Err(Error::Fenced { what, .. }) => assert!(what.contains("group.instance.id")),
            other => panic!("expected the consumer's fence, got {:?}", other.err()),
        }
        // Both fenced: the engine's loop must not join the group again either.
        assert!(resync.producer_fenced());
        assert!(
            !rig.kafka.calls().contains(&Call::Renew),
            "{:?}",
            rig.kafka.calls()
        );
        assert_eq!(rig.kafka.calls().last(), Some(&Call::Release));
    }
}

/// The consumer's static membership fenced; what the engine's loop decides with it.
async fn after_member_fenced(
    rig: &Rig,
    resync: &Resync<'_, FakeKafka, FakeKafka>,
) -> crate::Result<()> {
    let mut producer = rig.kafka.clone();
    resync
        .after_member_fenced(&rig.kafka, &mut producer, "changelog", fenced())
        .await
}

fn under(member: Option<&str>) -> Holder {
    Holder {
        member: member.map(str::to_owned),
        stable: true,
    }
}

/// The fault matrix saw it (CI, 2026-12-02, after the coordinators were restarted): the
/// consumer's static membership fenced, the producer too, and no successor anywhere.
/// The instance had stopped, taking that for a successor. Now: the member left under
/// the instance ID goes with the session (nobody heartbeats for it), so no successor:
/// a new producer, and the group joined again.
#[tokio::test(start_paused = true)]
async fn both_fenced_with_no_live_member_under_the_instance_id_makes_a_new_producer_and_joins_again()
 {
    // The producer's fence found by the loop's probe...
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka.fence_producer();
    rig.kafka.describe_group_as(vec![
        under(Some("a-left")),
        under(Some("a-left")),
        under(None),
    ]);
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let started = tokio::time::Instant::now();
    after_member_fenced(&rig, &resync)
        .await
        .expect("joins again");
    assert!(started.elapsed() < FAKE_SESSION_TIMEOUT);
    let members = [Call::Members, Call::Members, Call::Members];
    let want: Vec<Call> = [Call::Probe]
        .into_iter()
        .chain(members)
        .chain([Call::Renew])
        .collect();
    assert_eq!(rig.kafka.calls(), want);
    assert!(!resync.producer_fenced());

    // ...or first, by a batch, with the consumer fenced during the grace.
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka.raise_fatal_in(Duration::from_secs(3), fenced);
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let mut producer = rig.kafka.clone();
    let owned: BTreeSet<i32> = [0, 1].into();
    let stopped = recover(
        &resync,
        &rig.kafka,
        &mut producer,
        &owned,
        &producer_fenced(),
    )
    .await;
    assert!(matches!(stopped, Err(Error::Fenced { .. })), "{stopped:?}");
    rig.kafka.clear_calls();
    after_member_fenced(&rig, &resync)
        .await
        .expect("joins again");
    assert_eq!(rig.kafka.calls(), [Call::Members, Call::Renew]);
}

/// A successor joined under the instance ID (its producer fenced this one's): its member
/// outlives the session, and the instance stops without a new producer (which would
/// fence the successor's). A rebalance under way is waited out first.
#[tokio::test(start_paused = true)]
async fn a_live_member_under_the_instance_id_stops_the_instance_without_a_new_producer() {
    for settling in [false, true] {
        let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
        rig.kafka.fence_producer();
        let mut holders = vec![under(Some("a-successor"))];
        if settling {
            let rebalancing = Holder {
                stable: false,
                ..under(Some("a-successor"))
            };
            holders = vec![rebalancing; 30];
            holders.push(under(Some("a-successor")));
        }
        rig.kafka.describe_group_as(holders);
        let resync = rig.kafka.resync(&rig.config, &rig.stats);
        let started = tokio::time::Instant::now();
        let stopped = after_member_fenced(&rig, &resync).await;
        assert!(matches!(stopped, Err(Error::Fenced { .. })), "{stopped:?}");
        let waited = started.elapsed();
        assert!(waited >= FAKE_SESSION_TIMEOUT, "{waited:?}");
        assert!(waited < FAKE_SESSION_TIMEOUT * 2 || settling, "{waited:?}");
        assert!(waited >= Duration::from_secs(30) || !settling, "{waited:?}");
        assert!(!rig.kafka.calls().contains(&Call::Renew));
    }
}

/// Only the consumer fenced: the group is joined again at once, with a new producer
/// (see the next test for why); the group is not described.
#[tokio::test(start_paused = true)]
async fn only_the_consumer_fenced_joins_again_at_once() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka
        .describe_group_as(vec![under(Some("a-successor"))]);
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    after_member_fenced(&rig, &resync)
        .await
        .expect("joins again");
    assert_eq!(rig.kafka.calls(), [Call::Probe, Call::Renew]);
}

/// Both fenced and the group's coordinator does not answer (described five times): a
/// successor is likely, and the instance stops without a new producer.
#[tokio::test(start_paused = true)]
async fn both_fenced_with_the_group_undescribed_stops_the_instance() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    for nth in 1..=5 {
        rig.kafka
            .fail(Kind::Members, None, nth, kafka(ErrorClass::Retriable));
    }
    rig.kafka.fence_producer();
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let stopped = after_member_fenced(&rig, &resync).await;
    assert!(stopped.is_err());
    let calls = rig.kafka.calls();
    assert_eq!(calls.iter().filter(|c| **c == Call::Members).count(), 5);
    assert!(!calls.contains(&Call::Renew));
}

/// Two instances with one instance ID fence each other: each takes a few fences for its
/// own, then stops, saying why.
#[tokio::test(start_paused = true)]
async fn fences_past_the_budget_stop_the_instance() {
    use crate::engine::recovery::state::{FENCE_WINDOW, MAX_FENCES};
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let owned: BTreeSet<i32> = [0, 1].into();
    let mut producer = rig.kafka.clone();
    for _ in 0..MAX_FENCES {
        recover(
            &resync,
            &rig.kafka,
            &mut producer,
            &owned,
            &producer_fenced(),
        )
        .await
        .expect("within the budget");
    }
    match recover(
        &resync,
        &rig.kafka,
        &mut producer,
        &owned,
        &producer_fenced(),
    )
    .await
    {
        Err(Error::Fenced { detail, .. }) => {
            assert!(detail.contains("another instance"), "{detail}")
        }
        other => panic!("expected a fence, got {other:?}"),
    }
    let renewed = |rig: &Rig| {
        rig.kafka
            .calls()
            .iter()
            .filter(|c| **c == Call::Renew)
            .count()
    };
    assert_eq!(renewed(&rig), MAX_FENCES);
    // The budget is per window: after it, a fence is taken for the instance's own again.
    tokio::time::sleep(FENCE_WINDOW).await;
    recover(
        &resync,
        &rig.kafka,
        &mut producer,
        &owned,
        &producer_fenced(),
    )
    .await
    .expect("a new window");
    assert_eq!(renewed(&rig), MAX_FENCES + 1);
}

/// Found by the simulation of issue 40, once its consumers could be fenced while held: a
/// fence of the consumer's static membership ended a hold half-way through undoing a
/// failed batch, its transaction still open, and the engine joined the group again with
/// that producer, whose next begin was refused (the fake's assertion "begin inside an
/// open transaction"); the open transaction would have held the changelog's last stable
/// offset until it timed out. Joining again after a fence of the consumer alone makes a
/// new producer, whose initialisation aborts what the old one left open.
#[tokio::test]
async fn a_rejoin_after_the_consumer_alone_was_fenced_ends_what_the_hold_left_open() {
    use crate::engine::seams::Sink;

    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    let resync = rig.kafka.resync(&rig.config, &rig.stats);
    let mut producer = rig.kafka.clone();
    // A failed batch's transaction, which the given-up undo never aborted.
    producer.begin().expect("begin");
    resync
        .after_member_fenced(&rig.kafka, &mut producer, "g-txlog", fenced())
        .await
        .expect("joins the group again");
    assert!(
        rig.kafka.calls().contains(&Call::Renew),
        "joined again with the producer whose transaction is open: {:?}",
        rig.kafka.calls()
    );
    producer.begin().expect("the next batch begins");
}
