//! The test driver gives what the broker gives: the same scenarios run through
//! `onceflow::testing::TestDriver` and through the engine against the real broker must
//! place the inputs alike, and give the same outputs partition by partition, the same
//! dead letters, committed offsets and counters. Batches are cut differently (the broker
//! run's depend on timing), so what depends on batch boundaries (commits) is not compared.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow::testing::TestDriver;
use onceflow::{Engine, EngineConfig, ErrorPolicy, StatsSnapshot};
use onceflow_e2e::Operator;
use onceflow_e2e::sum::{self, Sum};
use onceflow_testkit::{Isolation, OutgoingRecord, Record};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const PARTITIONS: i32 = 4;
const WITHIN: Duration = Duration::from_secs(90);

/// What a run is compared by.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// Where each input landed.
    placed: Vec<(i32, i64)>,
    /// Per output partition, the records' keys and values in order.
    outputs: BTreeMap<i32, Vec<(String, String)>>,
    /// Dead letters: partition, key, value, and the headers that say why and from where.
    dead_letters: Vec<(i32, String, String, Vec<Option<String>>)>,
    /// The group's committed offset per input partition.
    committed: BTreeMap<i32, Option<i64>>,
    /// The counters that do not depend on how batches were cut.
    counters: [u64; 6],
}

fn counters(stats: &StatsSnapshot) -> [u64; 6] {
    [
        stats.records_in,
        stats.outputs,
        stats.duplicates_skipped,
        stats.dead_lettered,
        stats.skipped,
        stats.without_event_id,
    ]
}

fn outputs(records: &[Record]) -> BTreeMap<i32, Vec<(String, String)>> {
    let mut by_partition: BTreeMap<i32, Vec<(String, String)>> = BTreeMap::new();
    for record in records {
        by_partition
            .entry(record.partition)
            .or_default()
            .push((record.key_str(), record.value_str()));
    }
    by_partition
}

fn dead_letters(records: &[Record]) -> Vec<(i32, String, String, Vec<Option<String>>)> {
    const WHY: [&str; 5] = [
        "onceflow-error-class",
        "onceflow-error-message",
        "onceflow-source-partition",
        "onceflow-source-offset",
        "onceflow-attempts",
    ];
    records
        .iter()
        .map(|r| {
            let why = WHY
                .iter()
                .map(|name| {
                    r.header(name)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
                .collect();
            (r.partition, r.key_str(), r.value_str(), why)
        })
        .collect()
}

/// 1,000 events over 20 keys; one in ten sent twice (the copy deduplicated), one in
/// fifty without an ID (deduplicated by offset only, so its copy is processed), one in
/// a hundred refused by the processor (a negative amount: dead-lettered).
fn scenario() -> Vec<OutgoingRecord> {
    let mut records = Vec::new();
    for (i, mut event) in sum::amounts(0, 1_000, 20).into_iter().enumerate() {
        if i % 50 == 3 {
            event.id = None;
        }
        if i % 100 == 42 {
            event.amount = -1;
        }
        let record =
            OutgoingRecord::keyed(event.key.clone(), serde_json::to_vec(&event).expect("json"));
        if i % 10 == 5 {
            records.push(record.clone());
        }
        records.push(record);
    }
    records
}

fn configured(config: EngineConfig, output: &str, policy: ErrorPolicy) -> EngineConfig {
    let mut config = config.output(output);
    config.on_error = policy;
    config
}

async fn on_the_broker(
    policy: ErrorPolicy,
    records: &[OutgoingRecord],
) -> Result<Seen, Box<dyn std::error::Error>> {
    let op = Operator::new("parity", PARTITIONS).await?;
    let placed = op.kafka.produce(&op.input, records.to_vec()).await?;
    let config = configured(op.config("a"), &op.output, policy);
    let dead_letter_topic = config.dead_letter_topic();
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Sum::new(&op.output)));
    sum::wait_for_caught_up(op.kafka, &op.group, &op.input, WITHIN).await?;
    shutdown.trigger();
    let stats = running.await??;
    let outputs = outputs(
        &op.kafka
            .read_to_end(&op.output, Isolation::ReadCommitted)
            .await?,
    );
    let dead = match policy {
        ErrorPolicy::DeadLetter => dead_letters(
            &op.kafka
                .read_to_end(&dead_letter_topic, Isolation::ReadCommitted)
                .await?,
        ),
        _ => Vec::new(),
    };
    Ok(Seen {
        placed,
        outputs,
        dead_letters: dead,
        committed: op.kafka.committed_offsets(&op.group, &op.input).await?,
        counters: counters(&stats),
    })
}

async fn in_the_driver(
    policy: ErrorPolicy,
    records: &[OutgoingRecord],
) -> Result<Seen, Box<dyn std::error::Error>> {
    // The same names as the broker run's where they show in what is compared.
    let output = "sums";
    let mut driver = TestDriver::new(Sum::new(output))
        .configure(|config| configured(config, output, policy))
        .input_partitions(PARTITIONS)
        .topic_partitions(output, PARTITIONS);
    let placed = records
        .iter()
        .map(|r| driver.pipe_record(r.clone()))
        .collect();
    driver.process().await?;
    Ok(Seen {
        placed,
        outputs: outputs(&driver.output(output)),
        dead_letters: dead_letters(&driver.dead_letters()),
        committed: (0..PARTITIONS)
            .map(|p| (p, driver.committed_offset(p)))
            .collect(),
        counters: counters(&driver.stats()),
    })
}

/// Fails naming the first place `driven` and `brokered` differ (lists are long).
fn same<T: PartialEq + std::fmt::Debug>(driven: &[T], brokered: &[T], what: &str) {
    if let Some(at) =
        (0..driven.len().max(brokered.len())).find(|i| driven.get(*i) != brokered.get(*i))
    {
        panic!(
            "{what} differ at {at} (driver {} long, broker {}): driver {:?}, broker {:?}",
            driven.len(),
            brokered.len(),
            driven.get(at),
            brokered.get(at)
        );
    }
}

async fn same_in_both(policy: ErrorPolicy) -> TestResult {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let records = scenario();
    let driven = in_the_driver(policy, &records).await?;
    let brokered = on_the_broker(policy, &records).await?;
    // The dead letters' partitions depend on the dead-letter topic's partition count,
    // which the broker run's engine chose when it created the topic: compare by content.
    let strip = |seen: &Seen| {
        let mut dead: Vec<_> = seen
            .dead_letters
            .iter()
            .map(|(_, k, v, why)| (k.clone(), v.clone(), why.clone()))
            .collect();
        dead.sort();
        dead
    };
    same(&driven.placed, &brokered.placed, "inputs placed");
    for partition in 0..PARTITIONS {
        let none = Vec::new();
        let get = |seen: &Seen| seen.outputs.get(&partition).unwrap_or(&none).clone();
        same(
            &get(&driven),
            &get(&brokered),
            &format!("outputs of partition {partition}"),
        );
    }
    assert_eq!(strip(&driven), strip(&brokered), "dead letters differ");
    assert_eq!(
        driven.committed, brokered.committed,
        "committed offsets differ"
    );
    assert_eq!(
        driven.counters, brokered.counters,
        "counters differ (records in, outputs, duplicates, dead-lettered, skipped, without ID)"
    );
    // And the scenario did what it says.
    assert_eq!(driven.counters[2], 100, "one copy in ten skipped");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_dedup_and_partitioning_are_the_brokers() -> TestResult {
    same_in_both(ErrorPolicy::DeadLetter).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_refused_records_is_the_brokers() -> TestResult {
    same_in_both(ErrorPolicy::Skip).await
}
