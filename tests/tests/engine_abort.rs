//! A batch that fails with an abortable error is aborted and rewound, and the instance
//! goes on: nothing of the failed batch is visible, nothing is lost, nothing doubled.
//!
//! Its own binary, because failpoints configured in-process apply to every engine of the
//! process.

use std::time::Duration;

use onceflow::testkit;
use onceflow::{Engine, EngineConfig};
use onceflow_e2e::sum::{self, Sum};

const WITHIN: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_batch_is_rewound_and_the_instance_goes_on()
-> Result<(), Box<dyn std::error::Error>> {
    let kafka = testkit::kafka().await;
    let input = testkit::unique_name("abort-in");
    let output = testkit::unique_name("abort-out");
    let group = testkit::unique_name("abort");
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let state = tempfile::tempdir()?;
    let config = EngineConfig::new(kafka.bootstrap_servers(), &group, "a", &input, state.path())
        .output(&output)
        .kafka("session.timeout.ms", "6000");
    let inputs = sum::amounts(0, 3_000, 10);
    sum::produce(kafka, &input, &inputs).await?;

    // The second and third batches fail once each; the others pass.
    fail::cfg("onceflow-fail-batch", "1*off->2*return->off")?;
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(&output)));
    let caught_up = sum::wait_for_caught_up(kafka, &group, &input, WITHIN).await;
    shutdown.trigger();
    running.await??;
    fail::remove("onceflow-fail-batch");
    caught_up?;

    let snapshot = stats.snapshot();
    assert_eq!(snapshot.aborts, 2, "{snapshot:?}");
    let outputs = sum::committed_outputs(kafka, &output).await?;
    sum::assert_exactly_once(&inputs, &outputs);
    Ok(())
}
