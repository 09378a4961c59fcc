//! Timers against the real broker, across partition moves: instance a works alone, b
//! joins (the partitions split: b replays a's changelog, its pending timers included),
//! then a stops (every partition moves to b). Every bucket of event time is emitted
//! exactly once, with its exact sum, in order per key.

use std::time::Duration;

use onceflow::Engine;
use onceflow_e2e::buckets::{Buckets, Closed, OUT, assert_buckets, at, tick, ticks};
use onceflow_e2e::{Operator, wait_for_members};
use onceflow_testkit::{Isolation, OutgoingRecord};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_fire_once_in_order_across_partition_moves() -> TestResult {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let op = Operator::new("timers", 4).await?;
    let kafka = op.kafka;
    let base = 1_767_225_600_000;
    let (mut records, mut expected) = ticks(base);
    // Then every key's event time moves past the last bucket (its own bucket stays open).
    for n in 0..4 {
        let key = format!("k{n}");
        records.push(at(&tick(1_000 + n, &key, 0), base + 100_000));
        expected.entry((key, (base + 100_000) / 1_000)).or_default();
    }
    // Cut at bucket boundaries: the buckets open at each move get no record after it, so
    // only the timers the new owner replayed from the changelog can close them.
    let before =
        |end_ms: i64| move |r: &OutgoingRecord| r.timestamp_ms.is_some_and(|t| t < base + end_ms);
    let first: Vec<OutgoingRecord> = records
        .iter()
        .filter(|r| before(5_000)(r))
        .cloned()
        .collect();
    let second: Vec<OutgoingRecord> = records
        .iter()
        .filter(|r| !before(5_000)(r) && before(11_000)(r))
        .cloned()
        .collect();
    let third: Vec<OutgoingRecord> = records
        .iter()
        .filter(|r| !before(11_000)(r))
        .cloned()
        .collect();
    let mut parts = vec![first, second, third];
    let config = |instance: &str| op.config(instance).rename_output(OUT, &op.output);

    kafka.produce(&op.input, parts.remove(0)).await?;
    let a = Engine::new(config("a"))?;
    let stop_a = a.shutdown_handle();
    let a = tokio::spawn(a.run(Buckets::default()));
    onceflow_e2e::sum::wait_for_caught_up(kafka, &op.group, &op.input, WITHIN).await?;

    let b = Engine::new(config("b"))?;
    let stop_b = b.shutdown_handle();
    let b = tokio::spawn(b.run(Buckets::default()));
    let (group, kafka_ref) = (op.group.clone(), kafka);
    tokio::task::spawn_blocking(move || wait_for_members(kafka_ref, &group, 2, WITHIN)).await?;
    kafka.produce(&op.input, parts.remove(0)).await?;
    onceflow_e2e::sum::wait_for_caught_up(kafka, &op.group, &op.input, WITHIN).await?;

    stop_a.trigger();
    let a_stats = a.await??;
    kafka.produce(&op.input, parts.remove(0)).await?;
    onceflow_e2e::sum::wait_for_caught_up(kafka, &op.group, &op.input, WITHIN).await?;
    stop_b.trigger();
    let b_stats = b.await??;

    let closed: Vec<Closed> = kafka
        .read_to_end(&op.output, Isolation::ReadCommitted)
        .await?
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("json"))
        .collect();
    assert_buckets(&closed, &expected, "across moves");
    assert_eq!(
        a_stats.timers_fired + b_stats.timers_fired,
        closed.len() as u64,
        "timers fired: a {}, b {}",
        a_stats.timers_fired,
        b_stats.timers_fired
    );
    assert!(
        b_stats.replayed_records > 0,
        "b took over partitions by replaying a's changelog"
    );
    Ok(())
}
