//! Crashes, kills and rebalances: the `sum_processor` binary runs as child processes
//! that are killed (SIGKILL, or `abort()` at a named crash point) and restarted; an
//! independent `read_committed` reader then checks every input was output exactly once
//! with the exact running sums.

use std::time::{Duration, Instant};

use onceflow_e2e::child::{Instance, wipe};
use onceflow_e2e::sum::{self, Amount};
use onceflow_testkit::{self as testkit, Kafka};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(180);

async fn instance(
    kafka: &Kafka,
    name: &str,
    partitions: i32,
    state: &tempfile::TempDir,
) -> Result<Instance, Box<dyn std::error::Error>> {
    let input = testkit::unique_name(&format!("{name}-in"));
    let output = testkit::unique_name(&format!("{name}-out"));
    kafka.create_topic(&input, partitions).await?;
    kafka.create_topic(&output, partitions).await?;
    Ok(Instance {
        binary: env!("CARGO_BIN_EXE_sum_processor").into(),
        brokers: kafka.bootstrap_servers().to_owned(),
        group: testkit::unique_name(name),
        instance: "a".into(),
        input,
        output,
        state_dir: state.path().to_owned(),
        env: Vec::new(),
        user: None,
    })
}

async fn finish_and_check(kafka: &Kafka, instance: &Instance, inputs: &[Amount]) -> TestResult {
    let running = instance.spawn();
    // Outputs visible before the restart do not prove the restarted instance did its part:
    // wait until it has committed the whole input.
    let caught_up = sum::wait_for_caught_up(kafka, &instance.group, &instance.input, WITHIN).await;
    running.stop(WITHIN);
    caught_up?;
    let outputs = sum::committed_outputs(kafka, &instance.output).await?;
    sum::assert_exactly_once(inputs, &outputs);
    Ok(())
}

/// 2. A crash at each named point of the batch cycle, then a restart: exactly once,
///    state exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_point_of_the_batch_cycle_loses_and_doubles_nothing() -> TestResult {
    let kafka = testkit::kafka().await;
    // Points passed once per record crash at the fourth record; points passed once per
    // batch crash in the second batch (2,000 records make two batches of 1,000), after the
    // first one committed.
    for (point, passes) in [
        ("onceflow-after-process", 3),
        ("onceflow-after-produce", 3),
        ("onceflow-before-send-offsets", 1),
        ("onceflow-before-commit", 1),
        ("onceflow-after-commit-before-apply", 1),
    ] {
        let state = tempfile::tempdir()?;
        let base = instance(kafka, "crash-point", 2, &state).await?;
        let inputs = sum::amounts(0, 2_000, 10);
        sum::produce(kafka, &base.input, &inputs).await?;

        // Pass the point a few times, then crash there.
        let mut crashing = base
            .with_env("FAILPOINTS", &format!("{point}={passes}*off->return"))
            .spawn();
        let status = crashing.wait(Duration::from_secs(60));
        assert!(!status.success(), "{point}: expected a crash, got {status}");
        finish_and_check(kafka, &base, &inputs)
            .await
            .map_err(|e| format!("{point}: {e}"))?;
    }
    Ok(())
}

/// 2 (replay). A crash after commit and before the redb apply leaves redb behind the
///    changelog; a crash during the replay that repairs it; then a clean restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_replay_is_repaired_by_the_next_replay() -> TestResult {
    let kafka = testkit::kafka().await;
    let state = tempfile::tempdir()?;
    let base = instance(kafka, "crash-replay", 1, &state).await?;
    let inputs = sum::amounts(0, 3_000, 10);
    sum::produce(kafka, &base.input, &inputs).await?;

    let mut first = base
        .with_env(
            "FAILPOINTS",
            "onceflow-after-commit-before-apply=1*off->return",
        )
        .spawn();
    assert!(!first.wait(WITHIN).success());
    let mut second = base
        .with_env("FAILPOINTS", "onceflow-during-replay=return")
        .spawn();
    assert!(
        !second.wait(WITHIN).success(),
        "the replay crash point was not reached"
    );
    finish_and_check(kafka, &base, &inputs).await
}

/// A small deterministic generator, so a failing run can be repeated with its seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

/// 3. Twenty SIGKILLs at random moments during a 50,000-event run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sigkills_during_fifty_thousand_events() -> TestResult {
    let kafka = testkit::kafka().await;
    let state = tempfile::tempdir()?;
    let base = instance(kafka, "sigkill", 4, &state).await?;
    let inputs = sum::amounts(0, 50_000, 100);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    eprintln!("sigkill seed {seed}");
    let mut random = Lcg(seed);

    // Input keeps arriving while the processor is killed and restarted.
    let producer_input = inputs.clone();
    let topic = base.input.clone();
    let feeding = tokio::spawn(async move {
        for chunk in producer_input.chunks(2_500) {
            sum::produce(kafka, &topic, chunk).await.expect("produce");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let started = Instant::now();
    for kill in 0..20 {
        let running = base.spawn();
        tokio::time::sleep(Duration::from_millis(300 + random.next(1_500))).await;
        running.kill();
        eprintln!("kill {} at {:?}", kill + 1, started.elapsed());
    }
    feeding.await?;
    finish_and_check(kafka, &base, &inputs).await?;
    eprintln!(
        "20 SIGKILLs and 50,000 events exactly once in {:?}",
        started.elapsed()
    );
    Ok(())
}

/// 6. Rebalance: two instances, a third joins mid-stream, then one is SIGKILLed: exactly
///    once, state exact (state moves between instances through the changelog).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_joining_and_dying_move_state_through_the_changelog() -> TestResult {
    let kafka = testkit::kafka().await;
    let disks = [
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
    ];
    let a = instance(kafka, "rebalance", 6, &disks[0]).await?;
    let b = Instance {
        instance: "b".into(),
        state_dir: disks[1].path().to_owned(),
        ..a.clone()
    };
    let c = Instance {
        instance: "c".into(),
        state_dir: disks[2].path().to_owned(),
        ..a.clone()
    };
    let inputs = sum::amounts(0, 30_000, 60);
    let (first, rest) = inputs.split_at(10_000);
    let (second, third) = rest.split_at(10_000);

    sum::produce(kafka, &a.input, first).await?;
    let running_a = a.spawn();
    let running_b = b.spawn();
    sum::wait_for_outputs(kafka, &a.output, 5_000, WITHIN).await?;
    sum::produce(kafka, &a.input, second).await?;
    let running_c = c.spawn();
    sum::wait_for_outputs(kafka, &a.output, 15_000, WITHIN).await?;
    running_b.kill();
    sum::produce(kafka, &a.input, third).await?;
    let outputs = sum::wait_for_outputs(kafka, &a.output, inputs.len(), WITHIN).await;
    running_a.stop(WITHIN);
    running_c.stop(WITHIN);
    sum::assert_exactly_once(&inputs, &outputs?);
    Ok(())
}

/// 7 (across processes). A wiped state directory between runs, and then a corrupt
///    transaction log file: state and dedup come back from the changelog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_state_dir_between_runs_is_rebuilt() -> TestResult {
    let kafka = testkit::kafka().await;
    let state = tempfile::tempdir()?;
    let base = instance(kafka, "wipe", 2, &state).await?;
    let first = sum::amounts(0, 1_000, 10);
    sum::produce(kafka, &base.input, &first).await?;
    let running = base.spawn();
    sum::wait_for_outputs(kafka, &base.output, first.len(), WITHIN).await?;
    running.stop(WITHIN);

    wipe(&base.instance_dir());
    let second = sum::amounts(1_000, 1_000, 10);
    sum::produce(kafka, &base.input, &first[..100]).await?; // duplicates
    sum::produce(kafka, &base.input, &second).await?;
    let running = base.spawn();
    sum::wait_for_caught_up(kafka, &base.group, &base.input, WITHIN).await?;
    let counters = running.stop(WITHIN);
    assert_eq!(counters["duplicates_skipped"], 100, "{counters}");

    // A corrupt file (here: overwritten with garbage) is detected, set aside and rebuilt.
    let file = base.instance_dir().join("txlog.redb");
    let size = std::fs::metadata(&file)?.len() as usize;
    std::fs::write(&file, vec![0xA5u8; size])?;
    let third = sum::amounts(2_000, 1_000, 10);
    sum::produce(kafka, &base.input, &second[..50]).await?; // duplicates
    sum::produce(kafka, &base.input, &third).await?;
    let running = base.spawn();
    sum::wait_for_caught_up(kafka, &base.group, &base.input, WITHIN).await?;
    let counters = running.stop(WITHIN);
    assert_eq!(counters["duplicates_skipped"], 50, "{counters}");
    let set_aside = std::fs::read_dir(base.instance_dir())?
        .filter_map(|entry| entry.ok())
        .any(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("txlog.redb.corrupt-")
        });
    assert!(set_aside, "the corrupt file was not kept aside");

    let all: Vec<Amount> = first.iter().chain(&second).chain(&third).cloned().collect();
    let outputs = sum::committed_outputs(kafka, &base.output).await?;
    sum::assert_exactly_once(&all, &outputs);
    Ok(())
}

/// 9. At-least-once: a crash after the outputs were written and before the offsets were
///    committed re-processes the batch. Events with an ID are still not output twice
///    (their dedup entries reached the changelog with the outputs); events without one
///    are output again. Nothing is lost either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_duplicates_only_events_without_an_id_after_a_crash() -> TestResult {
    let kafka = testkit::kafka().await;
    for with_ids in [true, false] {
        let state = tempfile::tempdir()?;
        let base = instance(kafka, "alo-crash", 1, &state)
            .await?
            .with_env("SUM_DELIVERY", "at-least-once");
        let mut inputs = sum::amounts(0, 2_000, 10);
        if !with_ids {
            inputs.iter_mut().for_each(|a| a.id = None);
        }
        sum::produce(kafka, &base.input, &inputs).await?;
        let mut crashing = base
            .with_env("FAILPOINTS", "onceflow-before-commit=1*off->return")
            .spawn();
        assert!(!crashing.wait(Duration::from_secs(60)).success());
        let running = base.spawn();
        sum::wait_for_caught_up(kafka, &base.group, &base.input, WITHIN).await?;
        running.stop(WITHIN);
        let outputs = sum::committed_outputs(kafka, &base.output).await?;
        if with_ids {
            sum::assert_exactly_once(&inputs, &outputs);
        } else {
            assert!(
                outputs.len() > inputs.len(),
                "no event of the crashed batch was output twice"
            );
            assert!(
                outputs.len() <= inputs.len() + 1_000,
                "more than one batch output twice"
            );
        }
    }
    Ok(())
}

/// An instance that dies mid-batch and never comes back holds its open transaction, and
/// with it every `read_committed` reader of its outputs, until the coordinator aborts it:
/// `transaction_timeout` plus up to one sweep of the coordinator (every 10 s). With the old
/// default of 60 s a reader waited over a minute; the default is now 10 s. A successor
/// with another instance ID (its start aborts nothing of the dead one's) takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instance_stalls_readers_of_its_outputs_only_for_the_transaction_timeout()
-> TestResult {
    let kafka = testkit::kafka().await;
    let state = tempfile::tempdir()?;
    let base = instance(kafka, "stall", 1, &state).await?;
    let inputs = sum::amounts(0, 2_000, 10);
    sum::produce(kafka, &base.input, &inputs).await?;
    // The second batch's outputs and offsets are in its transaction when it dies.
    let mut dying = base
        .with_env("FAILPOINTS", "onceflow-before-commit=1*off->return")
        .spawn();
    assert!(!dying.wait(Duration::from_secs(60)).success());
    let died = Instant::now();

    let mut successor = base.clone();
    successor.instance = "b".into();
    let running = successor.spawn();
    sum::wait_for_outputs(kafka, &base.output, inputs.len(), WITHIN).await?;
    let stall = died.elapsed();
    let caught_up = sum::wait_for_caught_up(kafka, &base.group, &base.input, WITHIN).await;
    running.stop(WITHIN);
    caught_up?;
    let outputs = sum::committed_outputs(kafka, &base.output).await?;
    sum::assert_exactly_once(&inputs, &outputs);

    // The default's promise: 10 s, the coordinator's 10 s sweep, and slack for the
    // successor's join and replay. (With the old 60 s default: over a minute.)
    let timeout = onceflow::EngineConfig::new("k:9092", "g", "a", "in", "/tmp").transaction_timeout;
    eprintln!(
        "every output visible {stall:?} after the instance died (transaction_timeout {timeout:?})"
    );
    assert!(
        stall < Duration::from_secs(35),
        "readers stalled {stall:?} with transaction_timeout {timeout:?}"
    );
    Ok(())
}

/// 9. At-most-once: a crash while a batch is processed loses (part of) that batch, and
///    only that batch; nothing is ever output twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_loses_only_the_batch_a_crash_interrupts() -> TestResult {
    let kafka = testkit::kafka().await;
    let state = tempfile::tempdir()?;
    let base = instance(kafka, "amo-crash", 1, &state)
        .await?
        .with_env("SUM_DELIVERY", "at-most-once");
    let inputs = sum::amounts(0, 3_000, 10);
    sum::produce(kafka, &base.input, &inputs).await?;
    // Crash at the fourth record of the second batch.
    let mut crashing = base
        .with_env("FAILPOINTS", "onceflow-after-process=1003*off->return")
        .spawn();
    assert!(!crashing.wait(Duration::from_secs(60)).success());
    let running = base.spawn();
    sum::wait_for_outputs(kafka, &base.output, 1_000, WITHIN).await?;
    // Wait until the instance has gone through the whole input, then stop it.
    let counters = loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let committed = kafka.committed_offsets(&base.group, &base.input).await?;
        if committed.get(&0) == Some(&Some(3_000)) {
            break running.stop(WITHIN);
        }
    };
    let outputs = sum::committed_outputs(kafka, &base.output).await?;
    let mut ids: Vec<&str> = outputs.iter().filter_map(|o| o.id.as_deref()).collect();
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "an event was output twice");
    let lost = inputs.len() - total;
    assert!(
        lost > 0 && lost <= 1_000,
        "{lost} events lost: expected part of one batch ({counters})"
    );
    Ok(())
}

/// Issue 5, test 4. A SIGKILL while a record is being retried, then a restart: the good
///    records are output exactly once and the failing one is dead-lettered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_retries_still_dead_letters_exactly_once() -> TestResult {
    use onceflow_e2e::poison::{Behaviour, Order};
    use onceflow_testkit::{Isolation, OutgoingRecord};

    let kafka = testkit::kafka().await;
    let state = tempfile::tempdir()?;
    let base = instance(kafka, "retry-kill", 1, &state)
        .await?
        .with_env("SUM_PROCESSOR", "picky")
        .with_env("SUM_MAX_RETRY_SECONDS", "4");
    let orders: Vec<Order> = (0..300)
        .map(|i| Order {
            id: format!("o-{i}"),
            key: format!("k{}", i % 7),
            behaviour: if i == 150 {
                Behaviour::Transient(0)
            } else {
                Behaviour::Fine
            },
        })
        .collect();
    let records = orders
        .iter()
        .map(|o| OutgoingRecord::keyed(o.key.clone(), serde_json::to_vec(o).expect("json")));
    kafka.produce(&base.input, records).await?;

    // Killed twice while retrying order 150 (its retries take 4 s), then left to finish.
    for _ in 0..2 {
        let running = base.spawn();
        tokio::time::sleep(Duration::from_secs(3)).await;
        running.kill();
    }
    let running = base.spawn();
    let caught_up = sum::wait_for_caught_up(kafka, &base.group, &base.input, WITHIN).await;
    running.stop(WITHIN);
    caught_up?;

    let outputs = kafka
        .read_to_end(&base.output, Isolation::ReadCommitted)
        .await?;
    let mut ids: Vec<String> = outputs
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("id"))
        .collect();
    ids.sort();
    let mut expected: Vec<String> = (0..300)
        .filter(|i| *i != 150)
        .map(|i| format!("o-{i}"))
        .collect();
    expected.sort();
    assert_eq!(ids, expected);
    let dead = kafka
        .read_to_end(&format!("{}-dlq", base.group), Isolation::ReadCommitted)
        .await?;
    assert_eq!(dead.len(), 1, "dead-lettered {} times", dead.len());
    assert_eq!(
        dead[0].header("onceflow-error-class"),
        Some(&b"transient-exhausted"[..])
    );
    Ok(())
}

/// Issue 13's durability warning: on the one-broker test cluster every topic has one
/// replica, so an instance warns at start about its output, its changelog and its
/// dead-letter topic, each by name, and still runs. (The zombie test in `cluster.rs`
/// checks that a durable cluster gets no such warning.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_warns_at_start_about_topics_one_broker_loss_would_lose() -> TestResult {
    let kafka = testkit::kafka().await;
    let state = tempfile::tempdir()?;
    let base = instance(kafka, "durability", 1, &state).await?;
    let events = sum::amounts(0, 10, 2);
    sum::produce(kafka, &base.input, &events).await?;
    let log = state.path().join("a.log");
    let running = base.spawn_logging_to(&log);
    sum::wait_for_outputs(kafka, &base.output, events.len(), WITHIN).await?;
    running.stop(WITHIN);
    let log = std::fs::read_to_string(&log)?;
    let warned: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("topic is not durable against a broker failure"))
        .collect();
    for topic in [
        base.output.clone(),
        format!("{}-txlog", base.group),
        format!("{}-dlq", base.group),
    ] {
        assert!(
            warned
                .iter()
                .any(|line| line.contains(&topic) && line.contains("Some(1)")),
            "no durability warning for `{topic}`; log:\n{log}"
        );
    }
    Ok(())
}
