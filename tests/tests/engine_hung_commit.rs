//! A commit that hangs (the broker frozen while the batch commits) does not hang the
//! instance: the commit is bounded by the transaction timeout, the producer is replaced,
//! and the instance goes on from what the broker says happened, exactly once.
//!
//! Its own binary, because it freezes the broker every test of a binary shares.

use std::time::Duration;

use onceflow::{Engine, EngineConfig};
use onceflow_e2e::sum::{self, Sum};
use onceflow_testkit as testkit;

const WITHIN: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_commit_is_bounded_and_nothing_is_lost_or_doubled()
-> Result<(), Box<dyn std::error::Error>> {
    let kafka = testkit::kafka().await;
    if !kafka.is_managed() {
        eprintln!(
            "skipped: needs a broker the testkit started, to pause it (ONCEFLOW_TEST_BOOTSTRAP is set)"
        );
        return Ok(());
    }
    let input = testkit::unique_name("hung-in");
    let output = testkit::unique_name("hung-out");
    let group = testkit::unique_name("hung");
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let state = tempfile::tempdir()?;
    let mut config =
        EngineConfig::new(kafka.bootstrap_servers(), &group, "a", &input, state.path())
            .output(&output)
            .retries(2, Duration::from_secs(1))
            .kafka("session.timeout.ms", "30000");
    config.transaction_timeout = Duration::from_secs(6);

    let first = sum::amounts(0, 1_000, 10);
    sum::produce(kafka, &input, &first).await?;
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(&output)));
    sum::wait_for_outputs(kafka, &output, first.len(), WITHIN).await?;

    // Hold the next batch just before its commit, freeze the broker, let the commit go.
    fail::cfg("onceflow-before-commit", "pause")?;
    let second = sum::amounts(1_000, 1_000, 10);
    sum::produce(kafka, &input, &second).await?;
    let commits_before = stats.snapshot().commits;
    tokio::time::sleep(Duration::from_secs(2)).await;
    kafka.pause().await?;
    fail::remove("onceflow-before-commit");
    // Longer than the transaction timeout: the commit cannot finish while frozen.
    tokio::time::sleep(Duration::from_secs(10)).await;
    kafka.unpause().await?;

    let all: Vec<_> = first.iter().chain(&second).cloned().collect();
    let outputs = sum::wait_for_outputs(kafka, &output, all.len(), WITHIN).await;
    let caught_up = sum::wait_for_caught_up(kafka, &group, &input, WITHIN).await;
    shutdown.trigger();
    let result = running.await?;
    let snapshot = stats.snapshot();
    eprintln!("after the frozen commit: {snapshot:?} (commits before: {commits_before})");
    result?;
    caught_up?;
    sum::assert_exactly_once(&all, &outputs?);
    let outputs = sum::committed_outputs(kafka, &output).await?;
    sum::assert_exactly_once(&all, &outputs);
    Ok(())
}
