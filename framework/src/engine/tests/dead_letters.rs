//! Dead letters: a state value over the changelog's size limit, a dead letter over its own
//! limit, the headers dead-lettering adds (which `dlq replay` drops), and a record the
//! broker refused, dead-lettered alone in its own transaction.

use crate::ErrorClass;
use crate::config::DeliveryMode;
use crate::testing::kafka::injected as kafka_error;

use super::batch_rig::{CHANGELOG, DLQ, In, Rig, amount, record, shape};

#[tokio::test]
async fn a_state_value_over_the_changelog_limit_is_dead_lettered_before_the_transaction() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.limits.insert(CHANGELOG.into(), 200);
    let big = record(
        1,
        In {
            id: Some("b".into()),
            key: "k".into(),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    rig.run(vec![amount(0, "a", 1), big, amount(2, "c", 3)])
        .await
        .expect("batch");
    assert_eq!(rig.sums(), [1, 4], "the big record changed nothing");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header("onceflow-error-class").as_deref(),
        Some("state-too-large")
    );
    assert_eq!(rig.stats.snapshot().dead_lettered, 1);
}

#[tokio::test]
async fn a_dead_letter_over_its_limit_goes_without_its_value() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.limits.insert(DLQ.into(), 600);
    rig.limits.insert(CHANGELOG.into(), 200);
    let big = record(
        0,
        In {
            id: Some("b".into()),
            key: "k".repeat(300),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    rig.run(vec![big]).await.expect("batch");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value, None);
    assert!(dead[0].header("onceflow-value-omitted").is_some());
}

/// `dlq replay` drops the headers dead-lettering adds (`wire::DEAD_LETTER_HEADERS`) and
/// keeps the record's own, its event ID header above all: each header of a dead letter
/// (one over its limit, so it has them all but the timer's) is one or the other.
#[tokio::test]
async fn a_replay_drops_every_header_dead_lettering_adds_and_no_other() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.limits.insert(DLQ.into(), 900);
    rig.limits.insert(CHANGELOG.into(), 200);
    let mut big = record(
        0,
        In {
            key: "k".repeat(300),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    let id_header = crate::wire::EVENT_ID_HEADER.to_owned();
    big.headers = vec![
        (id_header.clone(), Some(b"b".to_vec())),
        ("trace".into(), None),
    ];
    rig.run(vec![big]).await.expect("batch");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    let mut added = Vec::new();
    for (name, _) in &dead[0].headers {
        let own = *name == id_header || name == "trace";
        assert_eq!(
            crate::wire::DEAD_LETTER_HEADERS.contains(&name.as_str()),
            !own,
            "{name}: a replay must drop what dead-lettering added and keep the rest"
        );
        if !own {
            added.push(name.as_str());
        }
    }
    assert_eq!(
        added.len() + 2,
        crate::wire::DEAD_LETTER_HEADERS.len(),
        "all but the timer's and the replay's own mark: {added:?}"
    );
}

#[tokio::test]
async fn a_record_failed_alone_is_dead_lettered_with_its_offset_in_its_own_transaction() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let refused = amount(7, "x", 1);
    rig.batch()
        .fail_alone(
            &refused,
            crate::engine::batch::dead_letters::FailureClass::Rejected,
            kafka_error(ErrorClass::Rejected)(),
        )
        .await
        .expect("dead-lettered");
    let calls = shape(&rig.kafka.calls());
    assert_eq!(calls.first().map(String::as_str), Some("begin"));
    assert!(calls.contains(&"offsets [(0, 8)]".to_owned()), "{calls:?}");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header("onceflow-error-class").as_deref(),
        Some("rejected")
    );
    assert_eq!(
        dead[0].header("onceflow-source-offset").as_deref(),
        Some("7")
    );
    assert!(
        !rig.txlog.is_processed(0, "x").expect("read"),
        "a dead letter is not processed"
    );
}
