//! Bad input never stops or loses anything: every input is processed, skipped as a
//! duplicate, or dead-lettered exactly once with its reason (the guide's "The guarantee", point 3).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use onceflow::{Engine, EngineConfig, ErrorPolicy, StatsSnapshot};
use onceflow_e2e::Operator;
use onceflow_e2e::poison::{Behaviour, Order, Picky};
use onceflow_testkit::{self as testkit, Isolation, OutgoingRecord, Record};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(120);

/// The operator under test, with this file's helpers.
struct Setup(Operator);

impl std::ops::Deref for Setup {
    type Target = Operator;
    fn deref(&self) -> &Operator {
        &self.0
    }
}

async fn setup(name: &str, partitions: i32) -> Result<Setup, Box<dyn std::error::Error>> {
    onceflow_e2e::test_logs();
    Ok(Setup(Operator::new(name, partitions).await?))
}

impl Setup {
    fn config(&self) -> EngineConfig {
        self.0.config("a")
    }

    fn dlq(&self) -> String {
        format!("{}-dlq", self.group)
    }

    /// Writes `orders` to the input, keyed by their key.
    async fn produce(&self, orders: &[Order]) -> Result<(), Box<dyn std::error::Error>> {
        let records = orders
            .iter()
            .map(|o| OutgoingRecord::keyed(o.key.clone(), json(o)));
        self.kafka.produce(&self.input, records).await?;
        Ok(())
    }

    /// The order IDs on the output topic, under `read_committed`, in offset order.
    async fn output_ids(&self) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let outputs = self
            .kafka
            .read_to_end(&self.output, Isolation::ReadCommitted)
            .await?;
        Ok(outputs
            .iter()
            .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()))
            .collect::<Result<_, _>>()?)
    }

    /// Orders o-0, o-1 and o-2 came out once each, in order, and nothing was
    /// dead-lettered (not even in an aborted transaction).
    async fn assert_all_out_none_dead(&self, stats: &StatsSnapshot) -> TestResult {
        assert_eq!(self.output_ids().await?, ["o-0", "o-1", "o-2"]);
        assert_eq!(stats.dead_lettered, 0);
        let dead = self
            .kafka
            .read_to_end(&self.dlq(), Isolation::ReadUncommitted)
            .await?;
        assert!(dead.is_empty(), "{dead:?}");
        Ok(())
    }

    /// Runs until the group has committed the whole input, then stops.
    async fn run(&self, config: EngineConfig) -> Result<StatsSnapshot, Box<dyn std::error::Error>> {
        let engine = Engine::new(config)?;
        let shutdown = engine.shutdown_handle();
        let mut running = tokio::spawn(engine.run(Picky::new(&self.output)));
        self.caught_up_or_stopped(&mut running).await?;
        shutdown.trigger();
        Ok(running.await??)
    }

    /// Waits until the group has caught up with the input; if the engine stops first,
    /// fails with what it stopped with. (CI saw `replayed_dead_letters_…` wait out
    /// `WITHIN` three records short on one partition, 2026-12-04, and the engine's own
    /// result was never printed: the wait's panic came first.)
    async fn caught_up_or_stopped(
        &self,
        running: &mut tokio::task::JoinHandle<onceflow::Result<StatsSnapshot>>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let wait =
            onceflow_e2e::sum::wait_for_caught_up(self.kafka, &self.group, &self.input, WITHIN);
        tokio::select! {
            caught_up = wait => Ok(caught_up?),
            stopped = running => panic!("the engine stopped before it caught up: {stopped:?}"),
        }
    }
}

fn order(i: usize, behaviour: Behaviour) -> Order {
    Order {
        id: format!("o-{i}"),
        key: format!("k{}", i % 13),
        behaviour,
    }
}

fn json(order: &Order) -> Vec<u8> {
    serde_json::to_vec(order).expect("json")
}

fn header(record: &Record, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).unwrap_or_default()).into_owned()
}

/// 1. A mixed stream of 10,000 records with about 1% poison of every class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_stream_dead_letters_each_poison_record_exactly_once() -> TestResult {
    let s = setup("poison-mixed", 3).await?;
    let mut records = Vec::new();
    let mut good = BTreeSet::new();
    let mut poison: BTreeMap<Vec<u8>, &str> = BTreeMap::new(); // value -> expected class
    for i in 0..10_000 {
        let key = format!("k{}", i % 13);
        let (value, class) = match i % 100 {
            17 => (format!("{{not json {i}").into_bytes(), Some("decode")),
            29 => (
                format!("{{\"shape\":\"wrong\",\"n\":{i}}}").into_bytes(),
                Some("decode"),
            ),
            // Empty, then blank values of growing length: nothing to decode.
            41 => (b" ".repeat(i / 100), Some("decode")),
            53 => (
                vec![0xff, 0xfe, b'{', (i % 251) as u8, (i / 251) as u8],
                Some("decode"),
            ),
            67 => (json(&order(i, Behaviour::Permanent)), Some("permanent")),
            79 => (json(&order(i, Behaviour::Panic)), Some("panic")),
            _ => {
                good.insert(format!("o-{i}"));
                (json(&order(i, Behaviour::Fine)), None)
            }
        };
        if let Some(class) = class {
            assert!(
                poison.insert(value.clone(), class).is_none(),
                "poison values must be distinct"
            );
        }
        records.push(OutgoingRecord::keyed(key, value).header("trace", format!("t-{i}")));
    }
    s.kafka.produce(&s.input, records).await?;
    let stats = s.run(s.config()).await?;

    // Good records: output exactly once.
    let outputs = s
        .kafka
        .read_to_end(&s.output, Isolation::ReadCommitted)
        .await?;
    let mut seen = BTreeMap::new();
    for output in &outputs {
        *seen
            .entry(serde_json::from_slice::<String>(
                output.value.as_deref().unwrap_or_default(),
            )?)
            .or_insert(0) += 1;
    }
    assert!(seen.values().all(|n| *n == 1), "an output twice");
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), good);

    // Poison: each exactly once in the dead-letter topic, byte for byte, with its reason.
    let dead = s
        .kafka
        .read_to_end(&s.dlq(), Isolation::ReadCommitted)
        .await?;
    assert_eq!(
        dead.len(),
        poison.len(),
        "dead-lettered {} of {}",
        dead.len(),
        poison.len()
    );
    for record in &dead {
        let value = record.value.clone().unwrap_or_default();
        let class = poison
            .get(&value)
            .unwrap_or_else(|| panic!("unexpected dead letter {value:?}"));
        assert_eq!(header(record, "onceflow-error-class"), *class);
        assert!(!header(record, "onceflow-error-message").is_empty());
        assert_eq!(header(record, "onceflow-source-topic"), s.input);
        let offset: i64 = header(record, "onceflow-source-offset").parse()?;
        let partition: i32 = header(record, "onceflow-source-partition").parse()?;
        assert!(offset >= 0 && (0..3).contains(&partition));
        assert_eq!(header(record, "onceflow-attempts"), "1");
        assert_eq!(header(record, "onceflow-processor"), s.group);
        assert!(
            header(record, "trace").starts_with("t-"),
            "original headers kept"
        );
        assert!(record.key.is_some(), "original key kept");
    }
    let distinct: BTreeSet<Vec<u8>> = dead
        .iter()
        .map(|r| r.value.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        distinct.len(),
        dead.len(),
        "a poison record dead-lettered twice"
    );

    assert_eq!(stats.records_in, 10_000);
    assert_eq!(
        stats.records_in,
        stats.outputs + stats.duplicates_skipped + stats.dead_lettered
    );
    assert_eq!(stats.dead_lettered, poison.len() as u64);
    Ok(())
}

/// 2. A transient failure that succeeds on the third attempt is processed once and is
///    not dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_that_recovers_is_processed_once() -> TestResult {
    let s = setup("poison-transient-ok", 1).await?;
    let orders = [
        order(0, Behaviour::Fine),
        order(1, Behaviour::Transient(3)),
        order(2, Behaviour::Fine),
    ];
    s.produce(&orders).await?;
    let stats = s.run(s.config()).await?;
    s.assert_all_out_none_dead(&stats).await
}

/// 2b. A retry wait holds no transaction open: what came before the failing record
///     commits before the wait, and waits longer than the transaction timeout do no harm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_wait_commits_what_came_before_and_holds_no_transaction_open() -> TestResult {
    let s = setup("poison-transient-wait", 1).await?;
    let orders = [
        order(0, Behaviour::Fine),
        // Nine waits of 20 ms doubling to 2 s: over 6 s in all, twice the timeout below.
        order(1, Behaviour::Transient(10)),
        order(2, Behaviour::Fine),
    ];
    s.produce(&orders).await?;
    let mut config = s.config().retries(12, Duration::from_secs(60));
    config.transaction_timeout = Duration::from_secs(3);
    let first_seen = async {
        let deadline = std::time::Instant::now() + WITHIN;
        loop {
            let ids = s.output_ids().await?;
            if !ids.is_empty() {
                return Ok::<_, Box<dyn std::error::Error>>(ids);
            }
            if std::time::Instant::now() > deadline {
                return Err("no output became visible".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (stats, first_seen) = tokio::join!(s.run(config), first_seen);
    let (stats, first_seen) = (stats?, first_seen?);
    // In one transaction with the retried record, o-0 would appear together with o-1.
    assert_eq!(first_seen, ["o-0"], "o-0 commits before o-1's retries end");
    assert_eq!(stats.aborts, 0, "no transaction outlived its timeout");
    s.assert_all_out_none_dead(&stats).await
}

/// 3. A transient failure that never recovers is dead-lettered after the configured
///    attempts, and the records after it are processed (in order, after it: a partition's
///    records are handled one at a time, so key order holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_that_never_recovers_is_dead_lettered_after_its_attempts() -> TestResult
{
    let s = setup("poison-transient-never", 1).await?;
    let orders = [
        order(0, Behaviour::Fine),
        order(1, Behaviour::Transient(0)),
        order(2, Behaviour::Fine),
    ];
    s.produce(&orders).await?;
    let stats = s
        .run(s.config().retries(4, Duration::from_secs(20)))
        .await?;
    let ids: Vec<String> = s.output_ids().await?;
    assert_eq!(ids, ["o-0", "o-2"]);
    let dead = s
        .kafka
        .read_to_end(&s.dlq(), Isolation::ReadCommitted)
        .await?;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        header(&dead[0], "onceflow-error-class"),
        "transient-exhausted"
    );
    assert_eq!(header(&dead[0], "onceflow-attempts"), "4");
    assert_eq!(dead[0].value.as_deref(), Some(json(&orders[1]).as_slice()));
    assert_eq!(stats.dead_lettered, 1);
    Ok(())
}

/// The other policies: `skip` counts and goes on without a dead-letter topic; `stop`
/// stops the instance without committing the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_goes_on_and_stop_stops_without_committing() -> TestResult {
    let s = setup("poison-skip", 1).await?;
    let orders = [
        order(0, Behaviour::Fine),
        order(1, Behaviour::Permanent),
        order(2, Behaviour::Fine),
    ];
    s.produce(&orders).await?;
    let stats = s.run(s.config().on_error(ErrorPolicy::Skip)).await?;
    assert_eq!(
        (stats.outputs, stats.skipped, stats.dead_lettered),
        (2, 1, 0)
    );

    let t = setup("poison-stop", 1).await?;
    t.produce(&orders).await?;
    let result = Engine::new(t.config().on_error(ErrorPolicy::Stop))?
        .run(Picky::new(&t.output))
        .await;
    let error = result.expect_err("must stop");
    assert!(error.to_string().contains("o-1 refused"), "{error}");
    assert!(
        t.kafka
            .read_to_end(&t.output, Isolation::ReadUncommitted)
            .await?
            .iter()
            .all(|r| r.value.is_some())
    );
    assert!(
        t.kafka
            .read_to_end(&t.output, Isolation::ReadCommitted)
            .await?
            .is_empty(),
        "the failed batch committed"
    );
    assert_eq!(
        t.kafka.committed_offsets(&t.group, &t.input).await?,
        BTreeMap::from([(0, None)])
    );
    Ok(())
}

/// With IDs required, a record whose ID is missing or malformed is dead-lettered with
/// that reason; one with the ID in the header is processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_event_id_that_is_missing_or_empty_is_dead_lettered() -> TestResult {
    use onceflow_e2e::sum::{Amount, Sum};

    let s = setup("poison-id", 1).await?;
    let amount = |i: i64| {
        serde_json::to_vec(&Amount {
            id: None,
            key: "k".into(),
            amount: i,
            anonymous: false,
        })
        .expect("json")
    };
    let records = vec![
        OutgoingRecord::keyed("k", amount(1)).header("onceflow-event-id", "e-1"),
        OutgoingRecord::keyed("k", amount(2)),
        // Not UTF-8, but an ID all the same (kept byte for byte).
        OutgoingRecord::keyed("k", amount(3)).header("onceflow-event-id", vec![0xffu8, 0xfe]),
        OutgoingRecord::keyed("k", amount(4)).header("onceflow-event-id", "e-1"),
        OutgoingRecord::keyed("k", amount(5)).header("onceflow-event-id", ""),
    ];
    s.kafka.produce(&s.input, records).await?;
    let engine = Engine::new(s.config().require_event_id(true))?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Sum::new(&s.output)));
    onceflow_e2e::sum::wait_for_caught_up(s.kafka, &s.group, &s.input, WITHIN).await?;
    shutdown.trigger();
    let stats = running.await??;
    assert_eq!(
        (stats.outputs, stats.dead_lettered, stats.duplicates_skipped),
        (2, 2, 1)
    );
    let dead = s
        .kafka
        .read_to_end(&s.dlq(), Isolation::ReadCommitted)
        .await?;
    let classes: Vec<String> = dead
        .iter()
        .map(|r| header(r, "onceflow-error-class"))
        .collect();
    assert_eq!(classes, ["missing-event-id", "missing-event-id"]);
    Ok(())
}

/// 5. Replaying the dead letters after fixing the processor: the records come through
///    exactly once, and a second replay re-publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_dead_letters_come_through_once_after_the_fix() -> TestResult {
    use onceflow::DeadLetterReplay;

    let s = setup("poison-replay", 2).await?;
    let orders: Vec<Order> = (0..40)
        .map(|i| {
            order(
                i,
                if i % 10 == 3 {
                    Behaviour::Permanent
                } else {
                    Behaviour::Fine
                },
            )
        })
        .collect();
    s.produce(&orders).await?;
    let before = s.run(s.config()).await?;
    assert_eq!((before.outputs, before.dead_lettered), (36, 4));

    // A filter that matches nothing, in its own group, passes everything over.
    let none = DeadLetterReplay::new(&s.config())
        .group(format!("{}-probe", s.group))
        .error_class("panic")
        .run()
        .await?;
    assert_eq!((none.replayed, none.passed_over), (0, 4));

    let replay = DeadLetterReplay::new(&s.config())
        .error_class("permanent")
        .run()
        .await?;
    assert_eq!(replay.replayed, 4);
    let again = DeadLetterReplay::new(&s.config()).run().await?;
    assert_eq!(again.replayed, 0, "a second replay re-published records");

    // The fixed processor takes the re-published records like new ones.
    let engine = Engine::new(s.config())?;
    let shutdown = engine.shutdown_handle();
    let mut running = tokio::spawn(engine.run(Picky::fixed(&s.output)));
    s.caught_up_or_stopped(&mut running).await?;
    shutdown.trigger();
    let after = running.await??;
    assert_eq!((after.outputs, after.dead_lettered), (4, 0));

    let mut ids: Vec<String> = s.output_ids().await?;
    ids.sort();
    let mut expected: Vec<String> = orders.iter().map(|o| o.id.clone()).collect();
    expected.sort();
    assert_eq!(ids, expected, "every order exactly once");
    let replayed = s
        .kafka
        .read_to_end(&s.input, Isolation::ReadCommitted)
        .await?;
    assert_eq!(
        replayed
            .iter()
            .filter(|r| r.header("onceflow-replayed-from").is_some())
            .count(),
        4
    );
    Ok(())
}

/// An output over what the producer (`message.max.bytes`) or the topic
/// (`max.message.bytes`) accepts fails its input (dead-lettered as `output-too-large`)
/// instead of failing every retry of the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_too_large_for_the_producer_or_the_topic_dead_letters_its_input() -> TestResult {
    // Over the producer's limit (librdkafka's default, 1,000,000 bytes).
    let s = setup("poison-huge", 1).await?;
    let orders = [
        order(0, Behaviour::Fine),
        order(1, Behaviour::Huge(1_500_000)),
        order(2, Behaviour::Fine),
    ];
    s.produce(&orders).await?;
    let stats = s.run(s.config()).await?;
    assert_eq!(
        (stats.outputs, stats.dead_lettered, stats.aborts),
        (2, 1, 0)
    );
    let dead = s
        .kafka
        .read_to_end(&s.dlq(), Isolation::ReadCommitted)
        .await?;
    assert_eq!(header(&dead[0], "onceflow-error-class"), "output-too-large");
    let outputs = s
        .kafka
        .read_to_end(&s.output, Isolation::ReadUncommitted)
        .await?;
    assert_eq!(
        outputs.len(),
        2,
        "nothing of the failed input entered the transaction"
    );

    // Over the topic's own, smaller limit: 60 kB does not fit in 50 kB, 10 kB does.
    let kafka = testkit::kafka().await;
    let t = Setup(Operator {
        kafka,
        input: testkit::unique_name("poison-small-in"),
        output: testkit::unique_name("poison-small-out"),
        group: testkit::unique_name("poison-small"),
        state: tempfile::tempdir()?,
    });
    kafka.create_topic(&t.input, 1).await?;
    kafka
        .create_topic_with(&t.output, 1, &[("max.message.bytes", "50000")])
        .await?;
    let orders = [
        order(0, Behaviour::Huge(10_000)),
        order(1, Behaviour::Huge(60_000)),
        order(2, Behaviour::Fine),
    ];
    kafka
        .produce(
            &t.input,
            orders
                .iter()
                .map(|o| OutgoingRecord::keyed(o.key.clone(), json(o))),
        )
        .await?;
    let stats = t.run(t.config()).await?;
    assert_eq!(
        (stats.outputs, stats.dead_lettered, stats.aborts),
        (3, 1, 0)
    );
    Ok(())
}
