//! The promises exactly-once depends on, checked against the broker under test.
//!
//! onceflow is only as exactly-once as the broker's transactions. Each test here fails on
//! a broker that breaks one promise (look-alike brokers have been seen to leak aborted
//! records to `read_committed` readers, which the first test catches). The idempotent
//! producer's promise needs a broker the test can freeze, so it has a binary of its own
//! (`broker_idempotence.rs`).
//!
//! Raw client calls block; these tests make them inside `block_in_place`.

use std::collections::BTreeMap;

use onceflow_e2e::*;
use onceflow_testkit::{self as testkit, Isolation, OutgoingRecord};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::block_in_place;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// 1. Committed records are visible to `read_committed`; aborted ones are not, but are to
///    `read_uncommitted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_records_are_visible_and_aborted_ones_only_uncommitted() -> TestResult {
    let kafka = testkit::kafka().await;
    let topic = testkit::unique_name("conformance-visibility");
    kafka.create_topic(&topic, 3).await?;
    let committed = values("committed", 30);
    let aborted = values("aborted", 30);

    block_in_place(|| -> TestResult {
        let producer = transactional_producer(kafka, &testkit::unique_name("txn"));
        producer.begin_transaction()?;
        send_all(&producer, &topic, &committed);
        producer.commit_transaction(CALL_TIMEOUT)?;
        producer.begin_transaction()?;
        send_all(&producer, &topic, &aborted);
        producer.abort_transaction(CALL_TIMEOUT)?;
        Ok(())
    })?;

    let read_committed = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
    assert_eq!(
        read_committed.len(),
        committed.len(),
        "read_committed saw {read_committed:?}"
    );
    assert_eq!(value_set(&read_committed), set_of([committed.as_slice()]));

    let read_uncommitted = kafka
        .read_to_end(&topic, Isolation::ReadUncommitted)
        .await?;
    assert_eq!(
        value_set(&read_uncommitted),
        set_of([committed.as_slice(), aborted.as_slice()])
    );
    Ok(())
}

/// 2. Offsets sent with `send_offsets_to_transaction` become the group's committed offsets
///    on commit and are unchanged by an abort; a transaction of offsets alone commits them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_offsets_commit_with_the_transaction_only() -> TestResult {
    let kafka = testkit::kafka().await;
    let input = testkit::unique_name("conformance-offsets-in");
    let output = testkit::unique_name("conformance-offsets-out");
    let group = testkit::unique_name("group");
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let inputs = values("input", 30)
        .into_iter()
        .map(|v| OutgoingRecord::keyed(v.clone(), v));
    kafka.produce(&input, inputs).await?;

    let offsets_at = |offset: i64| {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&input, 0, Offset::Offset(offset))
            .expect("offset list");
        list
    };
    let consumer = block_in_place(|| group_consumer(kafka, &group, &input, 10));
    let producer = block_in_place(|| transactional_producer(kafka, &testkit::unique_name("txn")));
    let metadata = consumer
        .group_metadata()
        .ok_or("consumer has no group metadata")?;

    // Outputs and offsets in one transaction that commits.
    block_in_place(|| -> TestResult {
        producer.begin_transaction()?;
        send_all(&producer, &output, &values("first", 10));
        producer.send_offsets_to_transaction(&offsets_at(10), &metadata, CALL_TIMEOUT)?;
        producer.commit_transaction(CALL_TIMEOUT)?;
        Ok(())
    })?;
    assert_eq!(
        kafka.committed_offsets(&group, &input).await?,
        BTreeMap::from([(0, Some(10))])
    );

    // The same in a transaction that aborts: the committed offset stays.
    block_in_place(|| -> TestResult {
        producer.begin_transaction()?;
        send_all(&producer, &output, &values("second", 10));
        producer.send_offsets_to_transaction(&offsets_at(20), &metadata, CALL_TIMEOUT)?;
        producer.abort_transaction(CALL_TIMEOUT)?;
        Ok(())
    })?;
    assert_eq!(
        kafka.committed_offsets(&group, &input).await?,
        BTreeMap::from([(0, Some(10))])
    );

    // Offsets alone (a batch whose records were all duplicates): still committed.
    block_in_place(|| -> TestResult {
        producer.begin_transaction()?;
        producer.send_offsets_to_transaction(&offsets_at(25), &metadata, CALL_TIMEOUT)?;
        producer.commit_transaction(CALL_TIMEOUT)?;
        Ok(())
    })?;
    assert_eq!(
        kafka.committed_offsets(&group, &input).await?,
        BTreeMap::from([(0, Some(25))])
    );

    let outputs = kafka.read_to_end(&output, Isolation::ReadCommitted).await?;
    assert_eq!(
        value_set(&outputs),
        set_of([values("first", 10).as_slice()])
    );
    Ok(())
}

/// 3. A second producer with the same `transactional.id` fences the first: the first gets
///    a fatal fenced error, and its open transaction never becomes visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_producer_fences_the_old_one_and_its_open_transaction() -> TestResult {
    let kafka = testkit::kafka().await;
    let topic = testkit::unique_name("conformance-fencing");
    let transactional_id = testkit::unique_name("txn");
    kafka.create_topic(&topic, 1).await?;
    let zombie_values = values("zombie", 10);
    let successor_values = values("successor", 10);

    let zombie_error = block_in_place(|| -> Result<KafkaError, Box<dyn std::error::Error>> {
        let zombie = transactional_producer(kafka, &transactional_id);
        zombie.begin_transaction()?;
        send_all(&zombie, &topic, &zombie_values);

        let successor = transactional_producer(kafka, &transactional_id);

        let error = match zombie.commit_transaction(CALL_TIMEOUT) {
            Ok(()) => return Err("the fenced producer committed its transaction".into()),
            Err(error) => error,
        };
        successor.begin_transaction()?;
        send_all(&successor, &topic, &successor_values);
        successor.commit_transaction(CALL_TIMEOUT)?;
        Ok(error)
    })?;

    let KafkaError::Transaction(rd) = &zombie_error else {
        panic!("expected a transaction error, got {zombie_error:?}");
    };
    assert!(
        rd.is_fatal(),
        "fencing must be fatal, got {rd:?} ({})",
        rd.name()
    );
    assert!(
        matches!(
            rd.code(),
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        ),
        "expected a fenced error, got {} ({rd})",
        rd.name()
    );

    let committed = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
    assert_eq!(value_set(&committed), set_of([successor_values.as_slice()]));
    // The zombie's records did reach the log; the broker aborted them when it fenced.
    let everything = kafka
        .read_to_end(&topic, Isolation::ReadUncommitted)
        .await?;
    assert!(value_set(&everything).is_superset(&set_of([zombie_values.as_slice()])));
    Ok(())
}

/// 4. A `read_committed` reader stops at an open transaction (the last stable offset),
///    even with committed records after it, and moves on once it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_stops_at_an_open_transaction_until_it_commits() -> TestResult {
    let kafka = testkit::kafka().await;
    let topic = testkit::unique_name("conformance-lso");
    kafka.create_topic(&topic, 1).await?;
    let before = values("before", 5);
    let open = values("open", 5);
    let after: Vec<String> = values("after", 5);

    let producer = block_in_place(|| -> Result<_, Box<dyn std::error::Error>> {
        let producer = transactional_producer(kafka, &testkit::unique_name("txn"));
        producer.begin_transaction()?;
        send_all(&producer, &topic, &before);
        producer.commit_transaction(CALL_TIMEOUT)?;
        producer.begin_transaction()?;
        send_all(&producer, &topic, &open);
        Ok(producer)
    })?;
    // Non-transactional records written after the open transaction began.
    kafka
        .produce(
            &topic,
            after
                .iter()
                .map(|v| OutgoingRecord::keyed(v.clone(), v.clone())),
        )
        .await?;

    let while_open = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
    assert_eq!(
        value_set(&while_open),
        set_of([before.as_slice()]),
        "read past the open transaction"
    );
    let uncommitted = kafka
        .read_to_end(&topic, Isolation::ReadUncommitted)
        .await?;
    assert_eq!(uncommitted.len(), before.len() + open.len() + after.len());

    block_in_place(|| producer.commit_transaction(CALL_TIMEOUT))?;
    let after_commit = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
    assert_eq!(
        value_set(&after_commit),
        set_of([before.as_slice(), open.as_slice(), after.as_slice()])
    );
    Ok(())
}
