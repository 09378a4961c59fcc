//! The exactly-once engine against the real broker, run in this process (tests that
//! kill processes are in `engine_crash.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow::{DeliveryMode, Engine, EngineConfig, Error, StatsSnapshot};
use onceflow_e2e::poison::{Behaviour, Order, Picky};
use onceflow_e2e::sum::{self, Amount, Sum};
use onceflow_e2e::{Operator, harness};
use onceflow_testkit::{self as testkit, Isolation};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(60);

/// The operator under test, with this file's helpers.
struct Setup(Operator);

impl std::ops::Deref for Setup {
    type Target = Operator;
    fn deref(&self) -> &Operator {
        &self.0
    }
}

async fn setup(name: &str, partitions: i32) -> Result<Setup, Box<dyn std::error::Error>> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    Ok(Setup(Operator::new(name, partitions).await?))
}

impl Setup {
    /// Runs an engine until `outputs` outputs are visible and its group has committed
    /// every input offset, then stops it gracefully.
    async fn run_until(
        &self,
        config: EngineConfig,
        outputs: usize,
    ) -> Result<StatsSnapshot, Box<dyn std::error::Error>> {
        let engine = Engine::new(config)?;
        let shutdown = engine.shutdown_handle();
        let stats = engine.stats();
        let running = tokio::spawn(engine.run(Sum::new(&self.output)));
        let deadline = std::time::Instant::now() + WITHIN;
        sum::outputs_reach(self.kafka, &self.output, outputs, deadline, &running).await;
        let visible = sum::committed_outputs(self.kafka, &self.output)
            .await?
            .len();
        if visible < outputs {
            // Say why before the test fails: the instance stopped (and with what), or
            // where its group stands against the input (CI saw this test stop at 7,400
            // of 10,000 outputs once, 2026-12-06, with nothing else to go on).
            let outcome = if running.is_finished() {
                format!("stopped with {:?}", running.await?)
            } else {
                "still running".to_owned()
            };
            let committed = self.kafka.committed_offsets(&self.group, &self.input).await;
            let ends = self.kafka.stable_ends(&self.input).await;
            panic!(
                "only {visible} of {outputs} outputs visible after {WITHIN:?}; the instance \
                 {outcome} ({:?}): {:?}; the group's committed offsets {committed:?}, the \
                 input's (stable, high) ends {ends:?}",
                stats.phase(),
                stats.snapshot()
            );
        }
        self.wait_for_caught_up().await?;
        shutdown.trigger();
        Ok(running.await??)
    }

    /// Waits until the group's committed offsets reach the end of the input.
    async fn wait_for_caught_up(&self) -> Result<(), Box<dyn std::error::Error>> {
        Ok(sum::wait_for_caught_up(self.kafka, &self.group, &self.input, WITHIN).await?)
    }
}

/// 1. Each input's output exactly once, per-key order kept, final state exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_are_output_exactly_once_with_exact_sums() -> TestResult {
    let s = setup("eo-basic", 4).await?;
    let inputs = sum::amounts(0, 10_000, 50);
    sum::produce(s.kafka, &s.input, &inputs).await?;
    let stats = s.run_until(s.config("a"), inputs.len()).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    sum::assert_exactly_once(&inputs, &outputs);
    assert_eq!(stats.records_in, 10_000);
    assert_eq!(stats.duplicates_skipped, 0);
    assert!(
        stats.commits >= 10,
        "10,000 records in {} batches",
        stats.commits
    );
    // No batch aborted, so nothing else reached the output topic, committed or not.
    assert_eq!(stats.aborts, 0);
    let everything = s
        .kafka
        .read_to_end(&s.output, Isolation::ReadUncommitted)
        .await?;
    assert_eq!(everything.len(), outputs.len());
    Ok(())
}

/// 4 and 7. Duplicates re-sent later (after a restart, and after the state directory
/// was wiped) are skipped, the skip counter equals the number injected, and the state
/// (sums) survives the wipe through the changelog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_skipped_after_restart_and_after_a_wiped_state_dir() -> TestResult {
    let s = setup("eo-dedup", 3).await?;
    let first = sum::amounts(0, 2_000, 20);
    sum::produce(s.kafka, &s.input, &first).await?;
    let run1 = s.run_until(s.config("a"), first.len()).await?;
    assert_eq!(run1.duplicates_skipped, 0);

    // Restart: 5% of the events again, plus new ones.
    let again: Vec<Amount> = first.iter().step_by(20).cloned().collect();
    let second = sum::amounts(2_000, 1_000, 20);
    sum::produce(s.kafka, &s.input, &again).await?;
    sum::produce(s.kafka, &s.input, &second).await?;
    let run2 = s
        .run_until(s.config("a"), first.len() + second.len())
        .await?;
    assert_eq!(run2.duplicates_skipped, again.len() as u64);

    // Wipe the state directory (a lost disk), then duplicates of both earlier rounds and
    // new events for the same keys: dedup entries and sums come back from the changelog.
    std::fs::remove_dir_all(s.state.path().join(&s.group))?;
    let again_after_wipe: Vec<Amount> = first
        .iter()
        .skip(7)
        .step_by(20)
        .chain(second.iter().step_by(20))
        .cloned()
        .collect();
    let third = sum::amounts(3_000, 1_000, 20);
    sum::produce(s.kafka, &s.input, &again_after_wipe).await?;
    sum::produce(s.kafka, &s.input, &third).await?;
    let run3 = s
        .run_until(s.config("a"), first.len() + second.len() + third.len())
        .await?;
    assert_eq!(run3.duplicates_skipped, again_after_wipe.len() as u64);
    assert!(run3.records_in >= (again_after_wipe.len() + third.len()) as u64);

    let distinct: Vec<Amount> = first.iter().chain(&second).chain(&third).cloned().collect();
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    sum::assert_exactly_once(&distinct, &outputs);
    Ok(())
}

/// 8. A batch made only of duplicates still commits its offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_only_duplicates_commits_its_offsets() -> TestResult {
    let s = setup("eo-dup-only", 1).await?;
    let inputs = sum::amounts(0, 100, 5);
    sum::produce(s.kafka, &s.input, &inputs).await?;
    s.run_until(s.config("a"), inputs.len()).await?;

    sum::produce(s.kafka, &s.input, &inputs).await?;
    // run_until waits for the group's offsets to reach the end of the input.
    let rerun = s.run_until(s.config("a"), inputs.len()).await?;
    assert_eq!(rerun.duplicates_skipped, inputs.len() as u64);
    assert_eq!(rerun.outputs, 0);
    let committed = s.kafka.committed_offsets(&s.group, &s.input).await?;
    assert_eq!(committed, BTreeMap::from([(0, Some(200))]));
    Ok(())
}

/// 5. A second instance with the same instance ID fences the first, which stops with the
///    fenced error; nothing the first did after the fence is visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_with_the_same_id_fences_the_first() -> TestResult {
    let s = setup("eo-zombie", 2).await?;
    let inputs = sum::amounts(0, 3_000, 10);
    sum::produce(s.kafka, &s.input, &inputs[..1_000]).await?;

    let first = Engine::new(s.config("same"))?;
    let first_shutdown = first.shutdown_handle();
    let first_stats = first.stats();
    let first_run = tokio::spawn(first.run(Sum::new(&s.output)));
    sum::wait_for_outputs(s.kafka, &s.output, 1_000, WITHIN).await?;

    // The second instance: same group and instance ID, its own disk.
    let other_disk = tempfile::tempdir()?;
    let mut config = s.config("same");
    config.state_dir = other_disk.path().to_owned();
    let second = Engine::new(config)?;
    let second_shutdown = second.shutdown_handle();
    let second_run = tokio::spawn(second.run(Sum::new(&s.output)));
    sum::produce(s.kafka, &s.input, &inputs[1_000..]).await?;

    let first_result = tokio::time::timeout(WITHIN, first_run).await??;
    match first_result {
        Err(Error::Fenced { what, .. }) => {
            assert!(what.contains("same"), "{what}");
        }
        other => panic!("the first instance should have been fenced, got {other:?}"),
    }
    // It stopped without joining the group again: the group had another consumer under
    // its instance ID (before it asked, the two instances fenced each other's member
    // five times each).
    assert_eq!(first_stats.snapshot().assignments, 1);
    first_shutdown.trigger();

    sum::wait_for_outputs(s.kafka, &s.output, inputs.len(), WITHIN).await?;
    s.wait_for_caught_up().await?;
    second_shutdown.trigger();
    second_run.await??;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    sum::assert_exactly_once(&inputs, &outputs);
    Ok(())
}

/// 9 (without crashes). At-least-once and at-most-once process every event once when
/// nothing fails; what each may do when something fails is in `engine_crash.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weaker_modes_process_everything_once_when_nothing_fails() -> TestResult {
    for mode in [DeliveryMode::AtLeastOnce, DeliveryMode::AtMostOnce] {
        let s = setup("weaker", 2).await?;
        let inputs = sum::amounts(0, 1_000, 10);
        sum::produce(s.kafka, &s.input, &inputs).await?;
        let stats = s
            .run_until(s.config("a").delivery(mode), inputs.len())
            .await?;
        assert_eq!(stats.records_in, 1_000, "{mode:?}");
        let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
        sum::assert_exactly_once(&inputs, &outputs);
    }
    Ok(())
}

/// The changelog must be co-partitioned with the input: a changelog topic that exists
/// with another partition count is refused at start, naming the topic and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_with_the_wrong_partition_count_is_refused() -> TestResult {
    let s = setup("eo-bad-changelog", 3).await?;
    s.kafka
        .create_topic(&format!("{}-txlog", s.group), 2)
        .await?;
    let error = Engine::new(s.config("a"))?
        .run(Sum::new(&s.output))
        .await
        .expect_err("must refuse");
    let text = error.to_string();
    assert!(matches!(error, Error::Config { .. }), "{text}");
    assert!(
        text.contains(&format!("{}-txlog", s.group)) && text.contains("3 partitions"),
        "{text}"
    );
    assert!(text.contains("it has 2"), "{text}");
    Ok(())
}

/// An output topic that does not exist is a configuration error found at start, before
/// any input is consumed (records to it would otherwise be lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_output_topic_is_refused_before_anything_is_consumed() -> TestResult {
    let s = setup("eo-no-output", 1).await?;
    sum::produce(s.kafka, &s.input, &sum::amounts(0, 10, 2)).await?;
    let missing = testkit::unique_name("missing");
    let config = s.config("a").output(&missing);
    let error = Engine::new(config)?
        .run(Sum::new(&s.output))
        .await
        .expect_err("must refuse");
    assert!(error.to_string().contains(&missing), "{error}");
    let committed = s.kafka.committed_offsets(&s.group, &s.input).await?;
    assert_eq!(
        committed,
        BTreeMap::from([(0, None)]),
        "consumed before refusing"
    );
    Ok(())
}

/// Dedup entries expire by count (the oldest beyond the limit, with a changelog tombstone
/// each) and by age (an event re-sent after the window is processed again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_entries_expire_by_count_and_by_age() -> TestResult {
    let s = setup("eo-expiry", 1).await?;
    let inputs = sum::amounts(0, 1_000, 5);
    sum::produce(s.kafka, &s.input, &inputs).await?;
    let limited = s.config("a").dedup(Duration::from_secs(3600), Some(50));
    let engine = Engine::new(limited)?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(&s.output)));
    sum::wait_for_outputs(s.kafka, &s.output, 1_000, WITHIN).await?;
    // One more record in a batch of its own: the batch before it is expired down to 50.
    let last = sum::amounts(1_000, 1, 5);
    sum::produce(s.kafka, &s.input, &last).await?;
    sum::wait_for_outputs(s.kafka, &s.output, 1_001, WITHIN).await?;
    s.wait_for_caught_up().await?;
    shutdown.trigger();
    running.await??;
    assert_eq!(stats.snapshot().expired_entries, 1_001 - 51);
    // The changelog carries a tombstone for each expired entry.
    let changelog = s
        .kafka
        .read_to_end(&format!("{}-txlog", s.group), Isolation::ReadCommitted)
        .await?;
    let tombstones = changelog
        .iter()
        .filter(|r| r.value.is_none() && r.key_str().starts_with("e:"))
        .count();
    assert_eq!(tombstones, 950);

    // By age: with a one-second window, the same event a few seconds later is new again.
    let t = setup("eo-window", 1).await?;
    let once = sum::amounts(0, 1, 1);
    sum::produce(t.kafka, &t.input, &once).await?;
    let windowed = |t: &Setup| t.config("a").dedup(Duration::from_secs(1), None);
    t.run_until(windowed(&t), 1).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A first batch expires the old entry; the re-sent event then comes in a later batch.
    sum::produce(t.kafka, &t.input, &sum::amounts(1, 1, 1)).await?;
    t.run_until(windowed(&t), 2).await?;
    sum::produce(t.kafka, &t.input, &once).await?;
    let again = t.run_until(windowed(&t), 3).await?;
    assert_eq!(
        again.duplicates_skipped, 0,
        "an expired entry still deduplicated"
    );
    Ok(())
}

/// A processor's declared input is a default: a configuration naming another topic reads
/// that one (issue 16: the same binary against `staging.orders` and `prod.orders`; it
/// was refused before). Its declared outputs are checked at start like configured ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_topics_are_checked_against_the_configuration() -> TestResult {
    struct Declares(Sum, &'static str, [&'static str; 1]);

    #[onceflow::async_trait]
    impl onceflow::Processor for Declares {
        type Input = Amount;
        fn name(&self) -> &str {
            "declares"
        }
        fn input_topic(&self) -> Option<&str> {
            Some(self.1)
        }
        fn output_topics(&self) -> &[&str] {
            &self.2
        }
        async fn process(
            &mut self,
            input: Amount,
            ctx: &mut onceflow::Context<'_>,
        ) -> onceflow::Result<()> {
            self.0.process(input, ctx).await
        }
    }

    let s = setup("eo-declared", 1).await?;
    let inputs = sum::amounts(0, 10, 2);
    sum::produce(s.kafka, &s.input, &inputs).await?;
    let output: &'static str = Box::leak(s.output.clone().into_boxed_str());
    let renamed_input = Declares(Sum::new(&s.output), "another-topic", [output]);
    let engine = Engine::new(s.config("a"))?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(renamed_input));
    let outputs = sum::wait_for_outputs(s.kafka, &s.output, inputs.len(), WITHIN).await;
    shutdown.trigger();
    running.await??;
    sum::assert_exactly_once(&inputs, &outputs?);

    let missing = testkit::unique_name("declared-missing");
    let leaked: &'static str = Box::leak(missing.clone().into_boxed_str());
    let input: &'static str = Box::leak(s.input.clone().into_boxed_str());
    let missing_output = Declares(Sum::new(&s.output), input, [leaked]);
    let error = Engine::new(s.config("a"))?
        .run(missing_output)
        .await
        .expect_err("missing output");
    assert!(error.to_string().contains(&missing), "{error}");
    Ok(())
}

/// Issue 16, part 4: what a handler gives an output beyond key and value, its headers
/// and its own timestamp (here the input's event time, a day back), reaches a
/// `read_committed` reader as given; the input's headers and timestamp are readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_carry_the_headers_and_timestamp_the_processor_gives_them() -> TestResult {
    struct Stamper(String);

    #[onceflow::async_trait]
    impl onceflow::Processor for Stamper {
        type Input = Amount;
        fn name(&self) -> &str {
            "stamper"
        }
        async fn process(
            &mut self,
            input: Amount,
            ctx: &mut onceflow::Context<'_>,
        ) -> onceflow::Result<()> {
            let at = ctx.record().timestamp_ms.expect("input timestamp") - 86_400_000;
            let record = onceflow::OutputRecord::json(&input)?
                .key(input.key.clone())
                .header("source-offset", ctx.offset().to_string())
                .timestamp_ms(at);
            ctx.emit_record(&self.0, record)
        }
    }

    let s = setup("eo-headers", 1).await?;
    let inputs = sum::amounts(0, 5, 1);
    sum::produce(s.kafka, &s.input, &inputs).await?;
    let read = s
        .kafka
        .read_to_end(&s.input, Isolation::ReadCommitted)
        .await?;
    let engine = Engine::new(s.config("a"))?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Stamper(s.output.clone())));
    let deadline = std::time::Instant::now() + WITHIN;
    let outputs = loop {
        let outputs = s
            .kafka
            .read_to_end(&s.output, Isolation::ReadCommitted)
            .await?;
        if outputs.len() >= inputs.len() || std::time::Instant::now() > deadline {
            break outputs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    shutdown.trigger();
    running.await??;
    assert_eq!(outputs.len(), inputs.len());
    for (input, output) in read.iter().zip(&outputs) {
        assert_eq!(
            output.header("source-offset"),
            Some(input.offset.to_string().as_bytes())
        );
        assert_eq!(
            output.timestamp_ms,
            input.timestamp_ms.map(|t| t - 86_400_000)
        );
    }
    Ok(())
}

/// Items 4 and 8. A handler taking 150 ms per record with a 5 s transaction timeout and
/// 1 s commit interval: before, a batch outlived the timeout, the coordinator aborted it
/// and the instance stopped as "fenced" by an instance that did not exist. Now a batch
/// commits what it has done at half the timeout. (The coordinator looks for timed-out
/// transactions every 10 s by default, so the batch must take well over 5 s + 10 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_batch_commits_within_the_transaction_timeout() -> TestResult {
    let s = harness::setup("holes-slow", 1).await?;
    let orders: Vec<Order> = (0..150)
        .map(|i| harness::order(i, Behaviour::Slow(150)))
        .collect();
    harness::produce_orders(&s, &orders).await?;
    let mut config = s.config("a").batching(Duration::from_secs(1), 1_000);
    config.transaction_timeout = Duration::from_secs(5);
    let stats = harness::run_to_end(&s, config, Picky::new(&s.output)).await?;
    let want: Vec<String> = (0..150).map(|i| format!("o-{i}")).collect();
    assert_eq!(harness::output_ids(&s).await?, want);
    assert_eq!(stats.aborts, 0);
    Ok(())
}

/// Item 11. A changelog that is not compacted would delete dedup entries and state still
/// in use: refused at start, with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changelog_that_is_not_compacted_is_refused() -> TestResult {
    let s = harness::setup("holes-not-compacted", 1).await?;
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
