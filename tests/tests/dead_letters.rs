//! Dead letters against the real broker: a record that can never be written (a state
//! value over the changelog's limit, an output the broker refuses for good) is found
//! and dead-lettered with its reason while the records beside it go on, in every
//! delivery mode; and `dlq replay` sends a dead letter back where it came from, with its
//! event ID, so a later copy is a duplicate.

use std::time::Duration;

use onceflow::{DeliveryMode, Engine};
use onceflow_e2e::harness::{
    WITHIN, dead_letters, header, order, output_ids, produce_orders, run_to_end, setup,
};
use onceflow_e2e::poison::{Behaviour, Order, Picky};
use onceflow_e2e::sum;
use onceflow_testkit::{Isolation, OutgoingRecord};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Item 3. A state value over `message.max.bytes` failed the changelog write of every
/// transaction it was in: the partition stalled for ever, nothing dead-lettered. Now the
/// record is dead-lettered with its reason and the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_value_over_the_size_limit_is_dead_lettered_not_retried_for_ever() -> TestResult {
    let s = setup("holes-huge-state", 1).await?;
    let orders: Vec<Order> = (0..5)
        .map(|i| match i {
            2 => order(i, Behaviour::HugeState(1_500_000)),
            _ => order(i, Behaviour::Fine),
        })
        .collect();
    produce_orders(&s, &orders).await?;
    let stats = run_to_end(&s, s.config("a"), Picky::new(&s.output)).await?;
    assert_eq!(output_ids(&s).await?, ["o-0", "o-1", "o-3", "o-4"]);
    let dead = dead_letters(&s).await?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(header(&dead[0], "onceflow-error-class"), "state-too-large");
    assert_eq!(stats.dead_lettered, 1);
    Ok(())
}

/// Items 7 and 9. The output topic's `max.message.bytes` is lowered under a running
/// processor, then one order emits 5 kB. Before: exactly-once aborted the batch for ever
/// (the two small orders beside it never came out either); at-least-once wrote the dedup
/// entries with the failed outputs, so after the rewind all three were "duplicates" and
/// lost. Now the record that fails is found and dead-lettered, the others come out.
async fn a_record_the_broker_refuses_is_found_and_dead_lettered(
    name: &str,
    delivery: DeliveryMode,
) -> TestResult {
    let s = setup(name, 1).await?;
    produce_orders(&s, &[order(0, Behaviour::Fine)]).await?;
    let engine = Engine::new(s.config("a").delivery(delivery))?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Picky::new(&s.output)));
    sum::wait_for_caught_up(s.kafka, &s.group, &s.input, WITHIN).await?;

    s.kafka
        .alter_topic_config(&s.output, "max.message.bytes", "1000")
        .await?;
    // Let the broker apply it before the records arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    produce_orders(
        &s,
        &[
            order(1, Behaviour::Fine),
            order(2, Behaviour::Huge(5_000)),
            order(3, Behaviour::Fine),
        ],
    )
    .await?;
    let caught_up = sum::wait_for_caught_up(s.kafka, &s.group, &s.input, WITHIN).await;
    shutdown.trigger();
    let stats = running.await??;
    caught_up?;

    let mut ids = output_ids(&s).await?;
    if delivery == DeliveryMode::AtLeastOnce {
        // At least once: an attempt that failed may have left the others' outputs.
        ids.dedup();
        ids.sort();
        ids.dedup();
    }
    assert_eq!(ids, ["o-0", "o-1", "o-3"], "outputs");
    let dead = dead_letters(&s).await?;
    let dead_ids: Vec<String> = dead
        .iter()
        .map(|r| serde_json::from_slice::<Order>(r.value.as_deref().unwrap_or_default()))
        .map(|o| o.map(|o| o.id))
        .collect::<Result<_, _>>()?;
    assert_eq!(dead_ids, ["o-2"]);
    assert_eq!(header(&dead[0], "onceflow-error-class"), "rejected");
    assert_eq!(
        stats.duplicates_skipped, 0,
        "nothing was taken for a duplicate"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_dead_letters_a_record_the_broker_refuses() -> TestResult {
    a_record_the_broker_refuses_is_found_and_dead_lettered(
        "holes-refused-eo",
        DeliveryMode::ExactlyOnce,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_loses_nothing_when_an_output_is_refused() -> TestResult {
    a_record_the_broker_refuses_is_found_and_dead_lettered(
        "holes-refused-alo",
        DeliveryMode::AtLeastOnce,
    )
    .await
}

/// Item 14. `dlq replay` re-published through librdkafka's partitioner, so a record an
/// upstream wrote to an explicit partition came back elsewhere, away from its dedup log
/// and state. It goes back to the partition it came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_re_publishes_to_the_source_partition() -> TestResult {
    let s = setup("holes-dlq-partition", 3).await?;
    // Same key, three partitions: at most one of them is where the key hashes.
    let records = (0..3).map(|p| {
        let refused = order(p as usize, Behaviour::Permanent);
        OutgoingRecord::keyed("k", serde_json::to_vec(&refused).expect("json")).to_partition(p)
    });
    s.kafka.produce(&s.input, records).await?;
    let stats = run_to_end(&s, s.config("a"), Picky::new(&s.output)).await?;
    assert_eq!(stats.dead_lettered, 3);

    let replay = onceflow::DeadLetterReplay::new(&s.config("a"))
        .run()
        .await?;
    assert_eq!(replay.replayed, 3);
    let input = s
        .kafka
        .read_to_end(&s.input, Isolation::ReadCommitted)
        .await?;
    let mut moved = Vec::new();
    for record in input
        .iter()
        .filter(|r| r.header("onceflow-replayed-from").is_some())
    {
        let order: Order = serde_json::from_slice(record.value.as_deref().unwrap_or_default())?;
        let source = format!("o-{}", record.partition);
        if order.id != source {
            moved.push((order.id, record.partition));
        }
    }
    assert!(
        moved.is_empty(),
        "re-published to another partition: {moved:?}"
    );
    Ok(())
}

/// `dlq replay` dropped every `onceflow-*` header of the dead-lettered record, the event
/// ID header (`onceflow-event-id`, the default `event_id_header`) among them: the
/// replayed record lost its ID, was processed without a dedup entry, and a later copy of
/// the same event from upstream was processed a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_letter_keeps_its_event_id_so_a_later_copy_is_a_duplicate() -> TestResult {
    let s = setup("holes-dlq-event-id", 1).await?;
    // The ID only in the header: the event's own is empty, which is no ID.
    let record = |behaviour: Behaviour| {
        let order = Order {
            id: String::new(),
            key: "k".into(),
            behaviour,
        };
        OutgoingRecord::keyed("k", serde_json::to_vec(&order).expect("json"))
            .header("onceflow-event-id", "payment-1")
    };
    s.kafka
        .produce(&s.input, [record(Behaviour::Permanent)])
        .await?;
    let before = run_to_end(&s, s.config("a"), Picky::new(&s.output)).await?;
    assert_eq!(before.dead_lettered, 1);

    let replay = onceflow::DeadLetterReplay::new(&s.config("a"))
        .run()
        .await?;
    assert_eq!(replay.replayed, 1);
    let input = s
        .kafka
        .read_to_end(&s.input, Isolation::ReadCommitted)
        .await?;
    let replayed = input
        .iter()
        .find(|r| r.header("onceflow-replayed-from").is_some())
        .expect("the replayed record");
    assert_eq!(
        replayed.header("onceflow-event-id"),
        Some(&b"payment-1"[..]),
        "the replayed record lost its event ID"
    );
    // The same event again from upstream, after the replay: a duplicate of the replayed one.
    s.kafka.produce(&s.input, [record(Behaviour::Fine)]).await?;
    let after = run_to_end(&s, s.config("a"), Picky::fixed(&s.output)).await?;
    assert_eq!(
        (after.outputs, after.duplicates_skipped),
        (1, 1),
        "the replayed record and the later copy of the same event"
    );
    Ok(())
}
