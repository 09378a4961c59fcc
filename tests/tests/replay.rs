//! Changelog replay against the real broker when the changelog is not "clean": another
//! producer's transaction left open on it (a killed previous owner with another instance
//! ID, a zombie). Replay must end at the group's stable committed offset, never at the
//! last stable offset an open transaction holds back (the guide's "Design").

use std::time::{Duration, Instant};

use onceflow::{Engine, EngineConfig, StatsSnapshot};
use onceflow_e2e::Operator;
use onceflow_e2e::sum::{self, Amount, Sum};
use onceflow_testkit::Kafka;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(90);

async fn setup(name: &str) -> Result<Operator, Box<dyn std::error::Error>> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    // One partition: the foreign transaction sits on the only changelog partition.
    Operator::new(name, 1).await
}

/// Runs an engine until `outputs` outputs are visible and the input is committed, then
/// stops it gracefully.
async fn run_until(
    s: &Operator,
    config: EngineConfig,
    outputs: usize,
) -> Result<StatsSnapshot, Box<dyn std::error::Error>> {
    run_to(s, config, &s.output, outputs).await
}

/// [`run_until`] with the outputs going to `output`.
async fn run_to(
    s: &Operator,
    mut config: EngineConfig,
    output: &str,
    outputs: usize,
) -> Result<StatsSnapshot, Box<dyn std::error::Error>> {
    config.output_topics = vec![output.to_owned()];
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Sum::new(output)));
    sum::wait_for_outputs(s.kafka, output, outputs, WITHIN).await?;
    sum::wait_for_caught_up(s.kafka, &s.group, &s.input, WITHIN).await?;
    shutdown.trigger();
    Ok(running.await??)
}

/// Opens a transaction of an unrelated producer on `topic` [0] with one record in it,
/// and leaves it open: what a killed owner with another transactional ID leaves behind.
/// The transaction lasts until the coordinator aborts it after `timeout`.
fn leave_transaction_open(kafka: &Kafka, topic: &str, timeout: Duration) -> BaseProducer {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .set("transactional.id", onceflow_testkit::unique_name("foreign"))
        .set("transaction.timeout.ms", timeout.as_millis().to_string())
        .create()
        .expect("foreign producer");
    producer
        .init_transactions(onceflow_e2e::CALL_TIMEOUT)
        .expect("init_transactions");
    producer.begin_transaction().expect("begin");
    producer
        .send(
            BaseRecord::to(topic)
                .partition(0)
                .key("s:never-committed")
                .payload("x"),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(onceflow_e2e::CALL_TIMEOUT).expect("flush");
    producer
}

/// The scenario of both tests below, on one partition: 200 events run by instance `a`;
/// a foreign transaction opens on the changelog (aborted by its coordinator after
/// `foreign_timeout`); 800 events run by `a`; then 400 new events and 100 re-sends of the
/// 800, run by instance `last`. Checks exactly once and the 100 skips; returns when the
/// foreign transaction was opened.
async fn open_transaction_then(
    name: &str,
    foreign_timeout: Duration,
    last: &str,
) -> Result<Instant, Box<dyn std::error::Error>> {
    let s = setup(name).await?;
    let first = sum::amounts(0, 200, 10);
    sum::produce(s.kafka, &s.input, &first).await?;
    run_until(&s, s.config("a"), 200).await?;

    let changelog = format!("{}-txlog", s.group);
    let _open = leave_transaction_open(s.kafka, &changelog, foreign_timeout);
    let opened = Instant::now();

    let second = sum::amounts(200, 800, 10);
    sum::produce(s.kafka, &s.input, &second).await?;
    run_until(&s, s.config("a"), 1_000).await?;

    let third = sum::amounts(1_000, 400, 10);
    let again: Vec<Amount> = second.iter().step_by(8).cloned().collect();
    assert_eq!(again.len(), 100);
    sum::produce(s.kafka, &s.input, &third).await?;
    sum::produce(s.kafka, &s.input, &again).await?;
    let stats = run_until(&s, s.config(last), 1_400).await?;

    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let all: Vec<Amount> = first.iter().chain(&second).chain(&third).cloned().collect();
    sum::assert_exactly_once(&all, &outputs);
    assert_eq!(stats.duplicates_skipped, 100);
    Ok(opened)
}

/// A graceful restart of the same instance while the foreign transaction is open. Before
/// the fix the restart took its own checkpoint (past the open transaction's last stable
/// offset) for "topic recreated", cleared the partition and rebuilt it only up to the
/// open transaction: the re-sends were output again and every key's sum was wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_foreign_transaction_on_the_changelog_loses_no_state_on_restart() -> TestResult {
    open_transaction_then("replay-open-txn", Duration::from_secs(600), "a").await?;
    Ok(())
}

/// A new instance (another instance ID, so an empty transaction log) takes the partition
/// over while the foreign transaction is open. Everything the first owner committed after
/// that transaction is hidden from `read_committed` until the coordinator aborts it;
/// replay must wait for it (the group's stable committed offset says how far the
/// changelog has to reach), not stop at the last stable offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_waits_for_an_open_foreign_transaction_before_processing() -> TestResult {
    let foreign_timeout = Duration::from_secs(12);
    let opened = open_transaction_then("replay-takeover", foreign_timeout, "b").await?;
    // It could only be right by waiting for the coordinator to abort the transaction.
    assert!(
        opened.elapsed() >= foreign_timeout,
        "done after {:?}, before the foreign transaction timed out",
        opened.elapsed()
    );
    Ok(())
}

/// A changelog record as onceflow writes it (`txlog/change.rs`): a dedup entry.
fn dedup_entry(id: &str, offset: i64) -> (Vec<u8>, Vec<u8>) {
    let mut value = vec![1u8];
    value.extend_from_slice(&offset.to_be_bytes());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    value.extend_from_slice(&now_ms.to_be_bytes());
    (format!("e:{id}").into_bytes(), value)
}

/// A changelog record as onceflow writes it: a batch's progress (the next input offset).
fn progress_record(next: i64) -> (Vec<u8>, Vec<u8>) {
    let mut value = vec![1u8];
    value.extend_from_slice(&next.to_be_bytes());
    (b"p:".to_vec(), value)
}

/// Item 5(a). A zombie whose `TxnOffsetCommit` the coordinator accepted commits *after*
/// the new owner started (KIP-447 allows it). The new owner must see what the zombie
/// committed: it reads the group's stable committed offsets first (waiting for the
/// zombie's transaction to end), then replays until the progress records reach them.
/// Before, it replayed to the end it could see at once, missed the zombie's dedup
/// entries, and processed the zombie's events again when they were re-sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_commits_after_the_new_owner_started_is_seen_by_its_replay() -> TestResult {
    use onceflow::Phase;
    use rdkafka::consumer::Consumer;
    use rdkafka::{Offset, TopicPartitionList};

    let s = setup("replay-zombie").await?;
    let first = sum::amounts(0, 100, 10);
    sum::produce(s.kafka, &s.input, &first).await?;
    run_until(&s, s.config("a"), 100).await?;

    // The zombie: ten more events, taken by a member of the group, processed in a
    // transaction whose offsets the coordinator accepts, not committed yet.
    let zombied = sum::amounts(100, 10, 10);
    sum::produce(s.kafka, &s.input, &zombied).await?;
    let member = onceflow_e2e::group_consumer(s.kafka, &s.group, &s.input, 10);
    let zombie = onceflow_e2e::transactional_producer(s.kafka, &format!("{}-zombie", s.group));
    zombie.begin_transaction()?;
    let changelog = format!("{}-txlog", s.group);
    let mut sums = sum::final_sums(&first);
    for (i, event) in zombied.iter().enumerate() {
        let total = sums.entry(event.key.clone()).or_default();
        *total += event.amount;
        let output = sum::Summed {
            id: event.id.clone(),
            key: event.key.clone(),
            amount: event.amount,
            sum: *total,
        };
        let value = serde_json::to_vec(&output)?;
        zombie
            .send(BaseRecord::to(&s.output).key(&event.key).payload(&value))
            .map_err(|(e, _)| e)?;
        let (key, entry) = dedup_entry(event.id.as_deref().unwrap_or_default(), 100 + i as i64);
        zombie
            .send(
                BaseRecord::to(&changelog)
                    .partition(0)
                    .key(&key)
                    .payload(&entry),
            )
            .map_err(|(e, _)| e)?;
        let state_key = format!("s:{}", event.key);
        let state = serde_json::to_vec(total)?;
        zombie
            .send(
                BaseRecord::to(&changelog)
                    .partition(0)
                    .key(&state_key)
                    .payload(&state),
            )
            .map_err(|(e, _)| e)?;
    }
    let (key, progress) = progress_record(110);
    zombie
        .send(
            BaseRecord::to(&changelog)
                .partition(0)
                .key(&key)
                .payload(&progress),
        )
        .map_err(|(e, _)| e)?;
    let mut offsets = TopicPartitionList::new();
    offsets.add_partition_offset(&s.input, 0, Offset::Offset(110))?;
    let metadata = member.group_metadata().ok_or("no group metadata")?;
    zombie.send_offsets_to_transaction(&offsets, &metadata, onceflow_e2e::CALL_TIMEOUT)?;
    // The zombie's member leaves; its transaction stays open.
    drop(member);

    // The new owner starts while the zombie's transaction is open.
    let engine = Engine::new(s.config("b"))?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(&s.output)));
    let deadline = Instant::now() + WITHIN;
    while stats.phase() == Phase::Starting {
        assert!(
            Instant::now() < deadline,
            "the new owner never got its partition"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    zombie.commit_transaction(onceflow_e2e::CALL_TIMEOUT)?;

    // The zombie's events again (duplicates), and new ones.
    let again: Vec<Amount> = zombied.clone();
    let later = sum::amounts(110, 90, 10);
    sum::produce(s.kafka, &s.input, &again).await?;
    sum::produce(s.kafka, &s.input, &later).await?;
    sum::wait_for_outputs(s.kafka, &s.output, 200, WITHIN).await?;
    sum::wait_for_caught_up(s.kafka, &s.group, &s.input, WITHIN).await?;
    shutdown.trigger();
    let snapshot = running.await??;

    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let all: Vec<Amount> = first
        .iter()
        .chain(&zombied)
        .chain(&later)
        .cloned()
        .collect();
    sum::assert_exactly_once(&all, &outputs);
    assert_eq!(snapshot.duplicates_skipped, 10);
    Ok(())
}

/// Deletes `topic` and waits until the cluster no longer reports it.
async fn delete_topic(kafka: &Kafka, topic: &str) -> TestResult {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .create()?;
    for result in admin.delete_topics(&[topic], &AdminOptions::new()).await? {
        result.map_err(|(topic, code)| format!("deleting {topic}: {code}"))?;
    }
    let deadline = Instant::now() + WITHIN;
    while kafka.topic_exists(topic).await? {
        assert!(
            Instant::now() < deadline,
            "{topic} still exists after {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// The same events with keys `prefix0`, `prefix1`, … instead of `k0`, `k1`, ….
fn keyed(prefix: &str, events: Vec<Amount>) -> Vec<Amount> {
    events
        .into_iter()
        .map(|mut event| {
            event.key = event.key.replacen('k', prefix, 1);
            event
        })
        .collect()
}

/// The changelog is deleted and created again while instance `a` is stopped (an
/// operator resetting the state), and instance `b` writes more to the new one than `a`'s
/// checkpoint. `a`'s transaction log then mirrors a topic that no longer exists, and a
/// checkpoint past the new topic's end is no longer there to tell: before the topic ID was
/// stored, `a` replayed the new topic from its old checkpoint, kept the old topic's state
/// and missed the new one's first records (seen failing: key k0's first output summed on
/// from the old topic's state, 83 where 4 was right). Now `a` sees another topic ID, forgets its log and
/// replays the new topic from the start: it agrees with `b`, as if started fresh.
///
/// `b` starts on an empty changelog while the group committed 200: the state of those
/// batches is gone, which only the operator can say is meant, so `b` is started with
/// `accept_changelog_behind` (without it, it stops: the test after this one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_changelog_is_told_by_its_topic_id_and_replayed_from_the_start() -> TestResult {
    let s = setup("replay-recreated").await?;
    let first = sum::amounts(0, 200, 10);
    sum::produce(s.kafka, &s.input, &first).await?;
    run_until(&s, s.config("a"), 200).await?;
    delete_topic(s.kafka, &format!("{}-txlog", s.group)).await?;

    // From here on the state starts from nothing: its outputs go to a topic of their own,
    // so the exactly-once check covers what the new changelog holds.
    let fresh = onceflow_testkit::unique_name("replay-recreated-fresh");
    s.kafka.create_topic(&fresh, 1).await?;
    // `b` writes keys x0..x4 first, then 400 events of keys y0..y9: the new changelog
    // grows past `a`'s checkpoint with the x keys only near its start.
    let second = keyed("x", sum::amounts(200, 100, 5));
    let third = keyed("y", sum::amounts(300, 400, 10));
    sum::produce(s.kafka, &s.input, &second).await?;
    sum::produce(s.kafka, &s.input, &third).await?;
    let mut reset = s.config("b");
    reset.accept_changelog_behind = true;
    run_to(&s, reset, &fresh, 500).await?;

    let last: Vec<Amount> = keyed("x", sum::amounts(700, 10, 1))
        .into_iter()
        .chain(sum::amounts(710, 10, 1))
        .collect();
    sum::produce(s.kafka, &s.input, &last).await?;
    run_to(&s, s.config("a"), &fresh, 520).await?;

    let outputs = sum::committed_outputs(s.kafka, &fresh).await?;
    let all: Vec<Amount> = second.iter().chain(&third).chain(&last).cloned().collect();
    sum::assert_exactly_once(&all, &outputs);
    Ok(())
}

/// Commits `offset` for `topic` [0] in `group` from outside the group, as an operator's
/// reset does; retried while the group still holds a member (until its session ends).
fn commit_by_hand(kafka: &Kafka, group: &str, topic: &str, offset: i64) -> TestResult {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut offsets = rdkafka::TopicPartitionList::new();
    offsets.add_partition_offset(topic, 0, rdkafka::Offset::Offset(offset))?;
    let deadline = Instant::now() + WITHIN;
    loop {
        match consumer.commit(&offsets, CommitMode::Sync) {
            Ok(()) => return Ok(()),
            Err(error) if Instant::now() < deadline => {
                tracing::info!(%error, "the group refused the commit; trying again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// The group's committed offset moved past what the changelog holds (a reset by hand):
/// processing on would start the partition's running sums from less than the committed
/// batches left. The instance stops with `ChangelogBehind`, naming the setting; started
/// with `accept_changelog_behind`, it goes on from the committed offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_moved_past_the_changelog_stop_the_instance_unless_accepted() -> TestResult {
    let s = setup("behind").await?;
    let inputs = sum::amounts(0, 200, 5);
    sum::produce(s.kafka, &s.input, &inputs[..100]).await?;
    run_until(&s, s.config("a"), 100).await?;
    sum::produce(s.kafka, &s.input, &inputs[100..]).await?;
    commit_by_hand(s.kafka, &s.group, &s.input, 150)?;

    let engine = Engine::new(s.config("a"))?;
    let stopped = tokio::time::timeout(WITHIN, engine.run(Sum::new(&s.output))).await?;
    match stopped {
        Err(onceflow::Error::ChangelogBehind {
            partition,
            committed,
            progress,
            ..
        }) => assert_eq!((partition, committed, progress), (0, 150, Some(100))),
        other => panic!("expected ChangelogBehind, got {other:?}"),
    }
    // Nothing was processed meanwhile.
    assert_eq!(sum::committed_outputs(s.kafka, &s.output).await?.len(), 100);

    let mut config = s.config("a");
    config.accept_changelog_behind = true;
    run_until(&s, config, 150).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let ids: Vec<&str> = outputs.iter().filter_map(|o| o.id.as_deref()).collect();
    let want: Vec<String> = (0..100).chain(150..200).map(|i| format!("e-{i}")).collect();
    assert_eq!(ids.len(), want.len());
    let want: std::collections::BTreeSet<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(
        ids.iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        want
    );
    Ok(())
}

/// A changelog that ends with an aborted transaction (a zombie's batch, a fence probe):
/// a `read_committed` reader gets no record past the last committed one, and its end is
/// past the abort marker. Replay ends only when its position reaches the last stable
/// offset (an end of partition reported short of it is read past), so this is the case
/// where the position must move over records it never returns: both the restarted owner
/// (reading from its checkpoint) and a new instance (from the start) get through it and
/// go on, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_ending_in_an_aborted_transaction_is_replayed_to_its_end() -> TestResult {
    let s = setup("replay-aborted-tail").await?;
    let inputs = sum::amounts(0, 300, 10);
    let changelog = format!("{}-txlog", s.group);
    let mut produced = 0;
    for (instance, upto) in [("a", 100), ("a", 200), ("b", 300)] {
        sum::produce(s.kafka, &s.input, &inputs[produced..upto]).await?;
        produced = upto;
        if upto > 100 {
            let foreign = leave_transaction_open(s.kafka, &changelog, Duration::from_secs(600));
            foreign.abort_transaction(onceflow_e2e::CALL_TIMEOUT)?;
        }
        let started = Instant::now();
        let stats = run_until(&s, s.config(instance), upto).await?;
        tracing::info!(instance, upto, took = ?started.elapsed(), replayed = stats.replayed_records, "run");
    }
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    sum::assert_exactly_once(&inputs, &outputs);
    Ok(())
}
