//! Exactly-once holes seen under ordinary failures, each shown against the real broker:
//! event IDs that are not IDs, the dedup window, records the broker refuses for good,
//! slow batches, the order of writes in at-least-once mode, compressed input, and a batch
//! damaged on the broker's disk.

use std::time::Duration;

use onceflow::{DeliveryMode, Engine, EngineConfig, Error, StatsSnapshot};
use onceflow_e2e::Operator;
use onceflow_e2e::poison::{Behaviour, Order, Picky};
use onceflow_e2e::sum::{self, Amount, Sum};
use onceflow_testkit::{Isolation, Kafka, OutgoingRecord, Record};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(90);

async fn setup(name: &str, partitions: i32) -> Result<Operator, Box<dyn std::error::Error>> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    Operator::new(name, partitions).await
}

/// Runs `processor` until the group has committed the whole input, then stops it.
async fn run_to_end<P: onceflow::Processor>(
    s: &Operator,
    config: EngineConfig,
    processor: P,
) -> Result<StatsSnapshot, Box<dyn std::error::Error>> {
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(processor));
    let caught_up = sum::wait_for_caught_up(s.kafka, &s.group, &s.input, WITHIN).await;
    shutdown.trigger();
    let stats = running.await??;
    caught_up?;
    Ok(stats)
}

fn amount(id: Option<&str>, key: &str, amount: i64) -> Amount {
    Amount {
        id: id.map(str::to_owned),
        key: key.into(),
        amount,
        anonymous: false,
    }
}

fn keyed(event: &Amount) -> OutgoingRecord {
    OutgoingRecord::keyed(event.key.clone(), serde_json::to_vec(event).expect("json"))
}

fn order(i: usize, behaviour: Behaviour) -> Order {
    Order {
        id: format!("o-{i}"),
        key: "k".into(),
        behaviour,
    }
}

async fn produce_orders(s: &Operator, orders: &[Order]) -> TestResult {
    let records = orders
        .iter()
        .map(|o| OutgoingRecord::keyed(o.key.clone(), serde_json::to_vec(o).expect("json")));
    s.kafka.produce(&s.input, records).await?;
    Ok(())
}

/// The order IDs on the output topic under `read_committed`, in offset order.
async fn output_ids(s: &Operator) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let outputs = s
        .kafka
        .read_to_end(&s.output, Isolation::ReadCommitted)
        .await?;
    Ok(outputs
        .iter()
        .filter(|r| r.value.as_ref().is_some_and(|v| v.len() < 100))
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()))
        .collect::<Result<_, _>>()?)
}

async fn dead_letters(s: &Operator) -> Result<Vec<Record>, Box<dyn std::error::Error>> {
    let dlq = format!("{}-dlq", s.group);
    Ok(s.kafka.read_to_end(&dlq, Isolation::ReadCommitted).await?)
}

fn header(record: &Record, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).unwrap_or_default()).into_owned()
}

/// Item 2. Five events whose ID is `""`: before, the first was processed and the other
/// four skipped as its duplicates, silently. An empty ID is no ID: all five are
/// processed (not deduplicated by ID) and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_event_id_is_no_id() -> TestResult {
    let s = setup("holes-empty-id", 1).await?;
    let events: Vec<Amount> = (1..=5).map(|i| amount(Some(""), "k", i)).collect();
    s.kafka.produce(&s.input, events.iter().map(keyed)).await?;
    let stats = run_to_end(&s, s.config("a"), Sum::new(&s.output)).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let sums: Vec<i64> = outputs.iter().map(|o| o.sum).collect();
    assert_eq!(sums, [1, 3, 6, 10, 15]);
    assert_eq!(stats.duplicates_skipped, 0);
    assert_eq!(stats.without_event_id, 5);

    // With IDs required, the same records are dead-lettered as missing their ID.
    let s = setup("holes-empty-id-required", 1).await?;
    s.kafka.produce(&s.input, events.iter().map(keyed)).await?;
    let stats = run_to_end(
        &s,
        s.config("a").require_event_id(true),
        Sum::new(&s.output),
    )
    .await?;
    assert_eq!(stats.dead_lettered, 5);
    let dead = dead_letters(&s).await?;
    assert!(
        dead.iter()
            .all(|r| header(r, "onceflow-error-class") == "missing-event-id"),
        "{dead:?}"
    );
    Ok(())
}

/// Item 10. Header event IDs that are not UTF-8 went through a lossy conversion, so
/// `\xff` and `\xfe` both became U+FFFD and the second was skipped as a duplicate of the
/// first. They are two IDs; a real re-send of one is still a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_event_ids_that_are_not_utf8_do_not_collide() -> TestResult {
    let s = setup("holes-binary-id", 1).await?;
    let first = amount(None, "k", 1);
    let second = amount(None, "k", 2);
    let records = [
        keyed(&first).header("onceflow-event-id", vec![0xff]),
        keyed(&second).header("onceflow-event-id", vec![0xfe]),
        // The first again: a duplicate.
        keyed(&first).header("onceflow-event-id", vec![0xff]),
    ];
    s.kafka.produce(&s.input, records).await?;
    let stats = run_to_end(&s, s.config("a"), Sum::new(&s.output)).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let sums: Vec<i64> = outputs.iter().map(|o| o.sum).collect();
    assert_eq!(sums, [1, 3]);
    assert_eq!(stats.duplicates_skipped, 1);
    Ok(())
}

/// Item 13. An ID re-sent after the dedup window is a new event, even while its old
/// entry still waits for lazy expiry (before, it was skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_re_sent_after_the_dedup_window_is_processed() -> TestResult {
    let s = setup("holes-window", 1).await?;
    let config = || s.config("a").dedup(Duration::from_secs(2), None);
    let event = amount(Some("e-1"), "k", 5);
    s.kafka.produce(&s.input, [keyed(&event)]).await?;
    run_to_end(&s, config(), Sum::new(&s.output)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.kafka.produce(&s.input, [keyed(&event)]).await?;
    let stats = run_to_end(&s, config(), Sum::new(&s.output)).await?;
    let sums: Vec<i64> = sum::committed_outputs(s.kafka, &s.output)
        .await?
        .iter()
        .map(|o| o.sum)
        .collect();
    assert_eq!(sums, [5, 10]);
    assert_eq!(stats.duplicates_skipped, 0);
    Ok(())
}

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

/// Items 4 and 8. A handler taking 150 ms per record with a 5 s transaction timeout and
/// 1 s commit interval: before, a batch outlived the timeout, the coordinator aborted it
/// and the instance stopped as "fenced" by an instance that did not exist. Now a batch
/// commits what it has done at half the timeout. (The coordinator looks for timed-out
/// transactions every 10 s by default, so the batch must take well over 5 s + 10 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_batch_commits_within_the_transaction_timeout() -> TestResult {
    let s = setup("holes-slow", 1).await?;
    let orders: Vec<Order> = (0..150).map(|i| order(i, Behaviour::Slow(150))).collect();
    produce_orders(&s, &orders).await?;
    let mut config = s.config("a").batching(Duration::from_secs(1), 1_000);
    config.transaction_timeout = Duration::from_secs(5);
    let stats = run_to_end(&s, config, Picky::new(&s.output)).await?;
    let want: Vec<String> = (0..150).map(|i| format!("o-{i}")).collect();
    assert_eq!(output_ids(&s).await?, want);
    assert_eq!(stats.aborts, 0);
    Ok(())
}

/// Item 6. A property that breaks the engine's poll loop is refused at start, with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_property_that_breaks_the_poll_loop_is_refused() -> TestResult {
    let s = setup("holes-eof", 1).await?;
    for (key, value) in [
        ("enable.partition.eof", "true"),
        ("enable.idempotence", "false"),
        ("acks", "1"),
    ] {
        let refused = Engine::new(s.config("a").kafka(key, value));
        match refused {
            Err(Error::Config { key: refused, .. }) => assert_eq!(refused, key),
            other => panic!("{key}={value}: expected a configuration error, got {other:?}"),
        }
    }
    Ok(())
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

/// Item 11. A changelog that is not compacted would delete dedup entries and state still
/// in use: refused at start, with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_that_is_not_compacted_is_refused() -> TestResult {
    let s = setup("holes-not-compacted", 1).await?;
    let changelog = format!("{}-txlog", s.group);
    s.kafka
        .create_topic_with(&changelog, 1, &[("cleanup.policy", "delete")])
        .await?;
    let engine = Engine::new(s.config("a"))?;
    match engine.run(Sum::new(&s.output)).await {
        Err(Error::Config { key, accepted, .. }) => {
            assert_eq!(key, "changelog_topic");
            assert!(accepted.contains("cleanup.policy=compact"), "{accepted}");
        }
        other => panic!("expected the changelog to be refused, got {other:?}"),
    }
    Ok(())
}

/// Input compressed with each codec Kafka producers use is processed exactly once, and
/// the engine writes its outputs and changelog with it too. Until librdkafka was built
/// with zstd, a zstd batch failed to decompress on every fetch (a warning every 500 ms):
/// its partition never moved, and nothing said why but the log. A state directory wiped
/// after the run comes back from the compressed changelog: the same events again are
/// duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_compressed_with_any_codec_is_processed_exactly_once() -> TestResult {
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let s = setup(&format!("codec-{codec}"), 2).await?;
        let compressed = Kafka::connect_with(
            s.kafka.bootstrap_servers(),
            &[("compression.type", codec), ("linger.ms", "50")],
        );
        let inputs = sum::amounts(0, 500, 10);
        sum::produce(&compressed, &s.input, &inputs).await?;
        let config = || s.config("a").kafka("compression.type", codec);
        let stats = run_to_end(&s, config(), Sum::new(&s.output)).await?;
        assert_eq!(stats.outputs, inputs.len() as u64, "{codec}");
        sum::assert_exactly_once(&inputs, &sum::committed_outputs(s.kafka, &s.output).await?);

        std::fs::remove_dir_all(s.state.path().join(&s.group))?;
        sum::produce(&compressed, &s.input, &inputs).await?;
        let again = run_to_end(&s, config(), Sum::new(&s.output)).await?;
        assert!(again.replayed_records > 0, "{codec}: {again:?}");
        assert_eq!(again.duplicates_skipped, inputs.len() as u64, "{codec}");
        sum::assert_exactly_once(&inputs, &sum::committed_outputs(s.kafka, &s.output).await?);
    }
    Ok(())
}

/// A batch damaged on the broker's disk is neither processed nor polled past.
/// - Before, with librdkafka's default (`check.crcs` off), the damaged record reached the
///   processor as other data: 60 outputs for 60 inputs, one of them for an event `#-25`
///   that was never sent.
/// - With CRCs checked but consumer errors only logged, as the engine did, librdkafka
///   skipped the batch. It then misread the bytes after it as a batch at offset
///   39,601,396,991,611, found that out of range, and reset the partition to its
///   beginning, again and again, with a warning each time. Had it read on correctly,
///   the next commit would have moved past records never processed.
/// - The input consumer now checks CRCs by default and the instance stops at the error,
///   with nothing past the damage committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_damaged_on_the_brokers_disk_stops_the_instance() -> TestResult {
    let s = setup("bit-rot", 1).await?;
    // Three batches, one write each: the second is damaged.
    let batches = [
        sum::amounts(0, 20, 5),
        sum::amounts(20, 20, 5),
        sum::amounts(40, 20, 5),
    ];
    for batch in &batches {
        sum::produce(s.kafka, &s.input, batch).await?;
    }
    s.kafka.corrupt(&s.input, 0, "e-25").await?;

    let engine = Engine::new(s.config("a"))?;
    let shutdown = engine.shutdown_handle();
    let mut running = tokio::spawn(engine.run(Sum::new(&s.output)));
    let ended = tokio::time::timeout(WITHIN, &mut running).await;
    let committed = s.kafka.committed_offsets(&s.group, &s.input).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let Ok(ended) = ended else {
        shutdown.trigger();
        let _ = running.await;
        panic!(
            "the instance went on past the damaged batch: committed {committed:?}, {} outputs",
            outputs.len()
        );
    };
    let error = ended?.expect_err("the instance stopped without an error");
    assert!(error.is_fatal(), "{error}");
    assert!(
        error.to_string().contains("could not read a batch"),
        "{error}"
    );
    // Nothing at or past the damaged batch (offsets 20..40) is committed or output.
    let at = committed.get(&0).copied().flatten().unwrap_or(0);
    assert!(at <= 20, "committed past the damaged batch: {committed:?}");
    let first: Vec<Amount> = batches[0].iter().take(at as usize).cloned().collect();
    sum::assert_exactly_once(&first, &outputs);
    Ok(())
}
