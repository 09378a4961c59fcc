//! Recovery after a failed batch, librdkafka's own transaction suite as the model (its
//! `0105-transactions_mock`): the abort, a failed abort (a new producer, unless a
//! successor took the instance's place), a timed-out transaction or transactional
//! request, a transaction aborted under the producer, a producer stuck in a call, reading
//! the group's committed offsets and seeking (retried), and waiting for a new producer, or
//! a start's first one, while the cluster recovers.

use std::time::Duration;

use crate::config::DeliveryMode;
use crate::testing::kafka::{Call, FakeKafka, Kind, injected as kafka};
use crate::{Error, ErrorClass};

use super::recovery_rig::{Rig, assert_caught_up_after, fenced};

#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_aborted_caught_up_with_the_committed_offsets_and_rewound() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.recover(&kafka(ErrorClass::Abortable)())
        .await
        .expect("recovered");
    assert_caught_up_after(&rig, &[Call::Hold, Call::Abort]);
}

#[tokio::test(start_paused = true)]
async fn reading_committed_offsets_and_seeking_are_retried_then_given_up() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka
        .fail(Kind::Committed, None, 1, kafka(ErrorClass::Retriable));
    rig.kafka
        .fail(Kind::Committed, None, 2, kafka(ErrorClass::Retriable));
    rig.kafka
        .fail(Kind::Seek, None, 1, kafka(ErrorClass::Retriable));
    rig.recover(&kafka(ErrorClass::Abortable)())
        .await
        .expect("recovered after retries");
    let calls = rig.kafka.calls();
    let count = |f: fn(&Call) -> bool| calls.iter().filter(|c| f(c)).count();
    assert_eq!(count(|c| matches!(c, Call::Committed(_))), 3, "{calls:?}");
    assert_eq!(count(|c| matches!(c, Call::Seek(_))), 2, "{calls:?}");

    // Failures past the recovery's patience: an error, and no seek anywhere (never "to
    // the beginning").
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    for nth in 1..=1_000 {
        rig.kafka
            .fail(Kind::Committed, None, nth, kafka(ErrorClass::Retriable));
    }
    let failed = rig.recover(&kafka(ErrorClass::Abortable)()).await;
    assert!(failed.is_err());
    let calls = rig.kafka.calls();
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Seek(_))),
        "{calls:?}"
    );
    assert_eq!(
        calls.last(),
        Some(&Call::Release),
        "the hold ends: {calls:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_abort_makes_a_new_producer_before_catching_up() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka
        .fail(Kind::Abort, None, 1, kafka(ErrorClass::Other));
    rig.recover(&kafka(ErrorClass::Abortable)())
        .await
        .expect("recovered");
    assert_caught_up_after(&rig, &[Call::Hold, Call::Abort, Call::Renew]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_abort_of_a_replaced_instance_stops_without_fencing_its_successor() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka
        .fail(Kind::Abort, None, 1, kafka(ErrorClass::Other));
    rig.kafka.raise_fatal(fenced);
    let stopped = rig.recover(&kafka(ErrorClass::Abortable)()).await;
    assert!(
        matches!(stopped, Err(Error::Fenced { .. })),
        "{:?}",
        stopped.err()
    );
    // A new producer under the same transactional ID would fence the successor.
    assert_eq!(rig.kafka.calls(), [Call::Hold, Call::Abort, Call::Release]);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_transaction_makes_a_new_producer_without_aborting() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    let timed_out = timed_out();
    rig.recover(&timed_out).await.expect("recovered");
    assert_caught_up_after(&rig, &[Call::Hold, Call::Renew]);

    // Unless a successor took the instance's place.
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.kafka.raise_fatal(fenced);
    assert!(matches!(
        rig.recover(&timed_out).await,
        Err(Error::Fenced { .. })
    ));
    assert!(!rig.kafka.calls().contains(&Call::Renew));
}

#[tokio::test(start_paused = true)]
async fn at_most_once_does_not_rewind() {
    // At most once committed the batch's offsets before processing it.
    let rig = Rig::new(DeliveryMode::AtMostOnce).await;
    rig.recover(&kafka(ErrorClass::Retriable)())
        .await
        .expect("recovered");
    assert_eq!(rig.kafka.calls(), [Call::Hold, Call::Release]);
}

/// A new producer that cannot be had for a minute (the cluster test's isolated
/// transaction coordinator: `init_transactions` timed out five times in a row, about 10 s
/// each, while the coordinator came back) is waited for: the instance does not stop on a
/// retriable error while the cluster recovers. Past `RECOVERY_PATIENCE` it does.
#[tokio::test(start_paused = true)]
async fn a_new_producer_is_waited_for_while_the_cluster_recovers() {
    use crate::engine::backoff::RECOVERY_PATIENCE;
    let timed_out = timed_out();
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    for nth in 1..=12 {
        rig.kafka
            .fail(Kind::Renew, None, nth, kafka(ErrorClass::Retriable));
    }
    rig.recover(&timed_out).await.expect("recovered");
    let renewed = rig
        .kafka
        .calls()
        .iter()
        .filter(|c| **c == Call::Renew)
        .count();
    assert_eq!(renewed, 13, "12 failures, then the new producer");

    // A cluster that never comes back: the instance stops, within the patience.
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    for nth in 1..=1_000 {
        rig.kafka
            .fail(Kind::Renew, None, nth, kafka(ErrorClass::Retriable));
    }
    let started = tokio::time::Instant::now();
    assert!(rig.recover(&timed_out).await.is_err());
    let waited = started.elapsed();
    assert!(
        waited <= RECOVERY_PATIENCE && waited >= RECOVERY_PATIENCE - Duration::from_secs(5),
        "gave up after {waited:?}"
    );
}

/// A start waits for its first producer as recovery does (CI's fault matrix: an instance
/// restarted while its transaction coordinator's node was away stopped on the first
/// `init_transactions` timeout); past `RECOVERY_PATIENCE` it stops, and a fatal error
/// (no right to the transactional ID) stops it at once.
#[tokio::test(start_paused = true)]
async fn a_start_waits_for_its_first_producer_while_the_cluster_recovers() {
    use crate::engine::backoff::RECOVERY_PATIENCE;
    use crate::engine::recovery::first_producer;
    let renewals = |fake: &FakeKafka| fake.calls().iter().filter(|c| **c == Call::Renew).count();
    let fake = FakeKafka::default();
    for nth in 1..=12 {
        fake.fail(Kind::Renew, None, nth, kafka(ErrorClass::Retriable));
    }
    first_producer(&fake)
        .await
        .expect("the producer, once the cluster is back");
    assert_eq!(renewals(&fake), 13, "12 failures, then the producer");

    let fake = FakeKafka::default();
    for nth in 1..=1_000 {
        fake.fail(Kind::Renew, None, nth, kafka(ErrorClass::Retriable));
    }
    let started = tokio::time::Instant::now();
    assert!(first_producer(&fake).await.is_err());
    let waited = started.elapsed();
    assert!(
        waited <= RECOVERY_PATIENCE && waited >= RECOVERY_PATIENCE - Duration::from_secs(5),
        "gave up after {waited:?}"
    );

    let fake = FakeKafka::default();
    fake.fail(Kind::Renew, None, 1, kafka(ErrorClass::Fatal));
    assert!(first_producer(&fake).await.is_err());
    assert_eq!(renewals(&fake), 1, "a fatal error is not tried again");
}

/// The coordinator aborted the transaction under the producer (it timed out).
fn timed_out() -> Error {
    Error::TransactionTimedOut {
        open_for: Duration::from_secs(11),
        timeout: Duration::from_secs(10),
        detail: "epoch bumped".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_transaction_aborted_under_the_producer_renews_it_and_the_instance_goes_on() {
    use crate::engine::recovery::stops_the_instance;

    // What librdkafka raises after the coordinator moved and aborted the transaction.
    let lost = Error::Kafka {
        operation: "begin_transaction".into(),
        code: crate::KafkaCode::INVALID_TRANSACTIONAL_STATE,
        message: "invalid state".into(),
        class: ErrorClass::Fatal,
        cause: None,
    };
    assert!(!stops_the_instance(&lost));
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    rig.recover(&lost).await.expect("recovered");
    assert_caught_up_after(&rig, &[Call::Hold, Call::Renew]);
    // A fence is recovery's to decide (a successor or not): after recovery it does not
    // stop the instance by itself.
    assert!(!stops_the_instance(&fenced()));
}

/// A transactional request that timed out on the client.
fn request_timed_out(call: &str) -> Error {
    Error::Kafka {
        operation: call.into(),
        code: crate::KafkaCode::OPERATION_TIMED_OUT,
        message: "Local: Timed out".into(),
        class: ErrorClass::Retriable,
        cause: None,
    }
}

/// Fail closed (issue 40): librdkafka has no Transactions V2 (KIP-890 part 2), so a
/// request of an old transaction that timed out on the client can still land in a later
/// one of the same producer epoch. After any timed-out transactional request the
/// producer is not used again, not even to abort: a new one (whose initialisation bumps
/// the epoch and ends the transaction as the coordinator had it) takes over, and the
/// committed offsets say where the batch ended.
#[tokio::test(start_paused = true)]
async fn a_timed_out_transactional_request_replaces_the_producer_without_using_it_again() {
    for call in [
        "commit_transaction",
        "send_offsets_to_transaction",
        "produce",
    ] {
        let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
        rig.recover(&request_timed_out(call))
            .await
            .expect("recovered");
        assert_caught_up_after(&rig, &[Call::Hold, Call::Renew]);
        assert_eq!(rig.stats.snapshot().producers_replaced, 1);
    }
    // At least once has no transaction and no transactional ID: it rewinds as before.
    let rig = Rig::new(DeliveryMode::AtLeastOnce).await;
    rig.recover(&request_timed_out("flush"))
        .await
        .expect("recovered");
    assert!(!rig.kafka.calls().contains(&Call::Renew));
}

#[tokio::test(start_paused = true)]
async fn a_producer_stuck_in_a_call_is_replaced_without_asking_it_to_abort() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce).await;
    let stuck = Error::ProducerStuck {
        call: "send_offsets_to_transaction".into(),
        after: Duration::from_secs(25),
    };
    assert!(!crate::engine::recovery::stops_the_instance(&stuck));
    rig.recover(&stuck).await.expect("recovered");
    // An abort would queue behind the stuck call.
    assert_caught_up_after(&rig, &[Call::Hold, Call::Renew]);
}
