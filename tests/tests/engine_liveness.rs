//! An instance that works without polling its consumer for longer than
//! `max.poll.interval.ms` (a long changelog replay, a wait for an open transaction,
//! back-off after failed batches) is taken out of the group by librdkafka: its
//! partitions are revoked as lost, the group rebalances, and every member replays again.
//! The engine must keep its member alive through such work (issue 12, item 15).
//!
//! Its own binary, because failpoints configured in-process apply to every engine of the
//! process.

use std::time::Duration;

use onceflow::Engine;
use onceflow_e2e::Operator;
use onceflow_e2e::sum::{self, Amount, Sum};

const WITHIN: Duration = Duration::from_secs(120);

/// A new instance (empty transaction log) replays the changelog of two partitions; the
/// first replay takes 15 s (a failpoint sleeps in it), more than the 6 s
/// `max.poll.interval.ms`. The member must stay in the group (one assignment, not a
/// second after being thrown out), and what was waiting meanwhile is processed exactly
/// once afterwards: pausing and resuming the partitions must not move their positions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_longer_than_max_poll_interval_keeps_the_member_in_the_group()
-> Result<(), Box<dyn std::error::Error>> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let op = Operator::new("liveness", 2).await?;
    let (kafka, input, output, group) = (op.kafka, &op.input, &op.output, &op.group);

    let first = sum::amounts(0, 300, 10);
    sum::produce(kafka, input, &first).await?;
    let engine = Engine::new(op.config("a"))?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Sum::new(output)));
    sum::wait_for_outputs(kafka, output, 300, WITHIN).await?;
    sum::wait_for_caught_up(kafka, group, input, WITHIN).await?;
    shutdown.trigger();
    running.await??;

    // Waiting while the next instance replays: new events and re-sends of old ones.
    let second = sum::amounts(300, 300, 10);
    let again: Vec<Amount> = first.iter().step_by(6).cloned().collect();
    sum::produce(kafka, input, &second).await?;
    sum::produce(kafka, input, &again).await?;

    fail::cfg("onceflow-during-replay", "1*sleep(15000)")?;
    // A batch (half the transaction timeout plus a record's retries) must fit in the
    // poll interval: start-up checks.
    let mut config = op
        .config("b")
        .kafka("max.poll.interval.ms", "6000")
        .retries(3, Duration::from_secs(1));
    config.transaction_timeout = Duration::from_secs(6);
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(output)));
    let done = async {
        sum::wait_for_outputs(kafka, output, 600, WITHIN).await?;
        sum::wait_for_caught_up(kafka, group, input, WITHIN).await
    }
    .await;
    shutdown.trigger();
    let stopped = running.await?;
    fail::remove("onceflow-during-replay");
    done?;
    stopped?;

    let snapshot = stats.snapshot();
    let outputs = sum::committed_outputs(kafka, output).await?;
    let all: Vec<Amount> = first.iter().chain(&second).cloned().collect();
    sum::assert_exactly_once(&all, &outputs);
    assert_eq!(
        snapshot.duplicates_skipped,
        again.len() as u64,
        "{snapshot:?}"
    );
    assert_eq!(
        snapshot.assignments, 1,
        "the member was thrown out of the group during the replay and joined again: {snapshot:?}"
    );
    Ok(())
}
