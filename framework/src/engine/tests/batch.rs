//! A batch through the fake Kafka: the call order of each delivery mode, an error of each
//! class at each call of a transaction, dedup, the retry split after a transient failure
//! and the transaction-duration bound.

use std::time::Duration;

use crate::config::DeliveryMode;
use crate::testing::kafka::{Call, Kind, injected as kafka_error};
use crate::{Error, ErrorClass};

use super::batch_rig::{CHANGELOG, In, OUT, Rig, amount, record, shape};

#[tokio::test]
async fn exactly_once_writes_outputs_changelog_and_offsets_in_one_transaction() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect("batch");
    let calls = shape(&rig.kafka.calls());
    assert_eq!(calls.first().map(String::as_str), Some("begin"));
    assert_eq!(calls.last().map(String::as_str), Some("commit"));
    assert_eq!(
        calls[calls.len() - 2],
        "offsets [(0, 2)]",
        "offsets go in last: {calls:?}"
    );
    assert_eq!(calls.iter().filter(|c| *c == "send out").count(), 2);
    // The changelog: two dedup entries, one state key, one progress record.
    let changelog = rig.kafka.committed(CHANGELOG);
    assert_eq!(changelog.len(), 4, "{changelog:?}");
    assert_eq!(
        changelog.last().and_then(|r| r.key.clone()),
        Some(b"p:".to_vec())
    );
    assert_eq!(rig.sums(), [1, 3]);
    assert_eq!(rig.state("k"), Some(3));
    assert_eq!(rig.txlog.progress(0).expect("progress"), Some(2));
    assert_eq!(rig.kafka.committed_offsets(), [(0, 2)].into());
}

/// librdkafka's transactional error matrix, at each call of a transaction: whatever
/// fails, nothing of the batch is visible and nothing reaches the transaction log.
#[tokio::test]
async fn an_error_at_any_call_of_the_transaction_leaves_nothing_behind() {
    for kind in [Kind::Begin, Kind::Send, Kind::SendOffsets, Kind::Commit] {
        for class in [
            ErrorClass::Retriable,
            ErrorClass::Abortable,
            ErrorClass::Fatal,
            ErrorClass::Rejected,
        ] {
            let rig = Rig::new(DeliveryMode::ExactlyOnce);
            rig.kafka.fail(kind, None, 1, kafka_error(class));
            let result = rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)]).await;
            let error = result.expect_err(&format!("{kind:?} {class:?}: the batch went through"));
            assert_eq!(
                (error.is_retriable(), error.is_fatal(), error.is_rejection()),
                (
                    class == ErrorClass::Retriable,
                    class == ErrorClass::Fatal,
                    class == ErrorClass::Rejected
                ),
                "{kind:?} {class:?}: the class is kept: {error}"
            );
            assert!(rig.sums().is_empty(), "{kind:?} {class:?}: outputs visible");
            assert!(rig.kafka.committed(CHANGELOG).is_empty());
            assert!(rig.kafka.committed_offsets().is_empty());
            assert_eq!(rig.state("k"), None, "{kind:?} {class:?}: state applied");
            assert!(!rig.txlog.is_processed(0, "a").expect("read"));
        }
    }
}

#[tokio::test]
async fn at_least_once_writes_the_changelog_only_after_the_outputs_landed() {
    let rig = Rig::new(DeliveryMode::AtLeastOnce);
    rig.run(vec![amount(0, "a", 1)]).await.expect("batch");
    let calls = shape(&rig.kafka.calls());
    let first_changelog = calls
        .iter()
        .position(|c| c == "send g-txlog")
        .expect("changelog");
    let flush = calls.iter().position(|c| c == "flush").expect("flush");
    let output = calls.iter().position(|c| c == "send out").expect("output");
    assert!(output < flush && flush < first_changelog, "{calls:?}");
    assert_eq!(
        calls.last().map(String::as_str),
        Some("consumer commit [(0, 1)]")
    );

    // An output that fails to land: no dedup entry, no commit, so the retry processes it.
    let rig = Rig::new(DeliveryMode::AtLeastOnce);
    rig.kafka.fail(
        Kind::Landing,
        Some(OUT),
        1,
        kafka_error(ErrorClass::Rejected),
    );
    assert!(rig.run(vec![amount(0, "a", 1)]).await.is_err());
    let calls = shape(&rig.kafka.calls());
    assert!(!calls.iter().any(|c| c == "send g-txlog"), "{calls:?}");
    assert!(rig.kafka.committed_offsets().is_empty());
    assert!(!rig.txlog.is_processed(0, "a").expect("read"));
}

#[tokio::test]
async fn at_most_once_commits_offsets_before_it_processes() {
    let rig = Rig::new(DeliveryMode::AtMostOnce);
    rig.kafka
        .fail(Kind::Send, Some(OUT), 1, kafka_error(ErrorClass::Other));
    assert!(rig.run(vec![amount(0, "a", 1)]).await.is_err());
    let calls = shape(&rig.kafka.calls());
    assert_eq!(calls[0], "consumer commit [(0, 1)]", "{calls:?}");
    assert_eq!(rig.kafka.committed_offsets(), [(0, 1)].into());
}

#[tokio::test]
async fn duplicates_are_skipped_in_a_batch_and_after_it_and_empty_ids_are_no_ids() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.run(vec![amount(0, "a", 1), amount(1, "a", 1), amount(2, "", 5)])
        .await
        .expect("first");
    rig.run(vec![amount(3, "a", 1), amount(4, "", 5)])
        .await
        .expect("second");
    assert_eq!(rig.sums(), [1, 6, 11]);
    let stats = rig.stats.snapshot();
    assert_eq!(stats.duplicates_skipped, 2);
    assert_eq!(stats.without_event_id, 2);
}

#[tokio::test]
async fn a_transient_failure_commits_what_came_before_and_retries_in_a_new_transaction() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let failing = record(
        1,
        In {
            id: Some("b".into()),
            key: "k".into(),
            amount: 2,
            transient: 2,
            ..In::default()
        },
    );
    rig.run(vec![amount(0, "a", 1), failing, amount(2, "c", 3)])
        .await
        .expect("batch");
    let calls = shape(&rig.kafka.calls());
    let offsets: Vec<&String> = calls.iter().filter(|c| c.starts_with("offsets")).collect();
    // The first record alone, then (an empty part is aborted) the rest.
    assert_eq!(
        offsets.first().map(|s| s.as_str()),
        Some("offsets [(0, 1)]")
    );
    assert_eq!(offsets.last().map(|s| s.as_str()), Some("offsets [(0, 3)]"));
    assert!(calls.iter().any(|c| c == "abort"), "{calls:?}");
    assert_eq!(rig.sums(), [1, 3, 6]);
}

#[tokio::test]
async fn a_batch_commits_at_half_the_transaction_timeout() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.config.transaction_timeout = Duration::from_millis(60);
    let slow = |offset: i64, id: &str| {
        record(
            offset,
            In {
                id: Some(id.into()),
                key: "k".into(),
                amount: 1,
                slow_ms: 20,
                ..In::default()
            },
        )
    };
    rig.run(vec![slow(0, "a"), slow(1, "b"), slow(2, "c"), slow(3, "d")])
        .await
        .expect("batch");
    let commits = rig
        .kafka
        .calls()
        .iter()
        .filter(|c| **c == Call::Commit)
        .count();
    assert!(
        commits >= 2,
        "{commits} commit(s) for 80 ms of work and a 60 ms timeout"
    );
    assert_eq!(rig.sums(), [1, 2, 3, 4]);
}

#[tokio::test]
async fn a_fence_after_the_transaction_timeout_is_reported_as_a_timeout() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.config.transaction_timeout = Duration::from_millis(10);
    rig.kafka.fail(Kind::Commit, None, 1, || Error::Fenced {
        what: "transactional.id `g-a`".into(),
        detail: "PRODUCER_FENCED".into(),
    });
    let slow = record(
        0,
        In {
            id: Some("a".into()),
            key: "k".into(),
            amount: 1,
            slow_ms: 20,
            ..In::default()
        },
    );
    match rig.run(vec![slow]).await {
        Err(Error::TransactionTimedOut { timeout, .. }) => {
            assert_eq!(timeout, Duration::from_millis(10))
        }
        other => panic!("expected TransactionTimedOut, got {other:?}"),
    }
    // A fence in a transaction younger than the timeout is a real fence.
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka.fail(Kind::Commit, None, 1, || Error::Fenced {
        what: "transactional.id `g-a`".into(),
        detail: "PRODUCER_FENCED".into(),
    });
    assert!(matches!(
        rig.run(vec![amount(0, "a", 1)]).await,
        Err(Error::Fenced { .. })
    ));
}
