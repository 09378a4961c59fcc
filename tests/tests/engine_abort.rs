//! A batch that fails with an abortable error is aborted and rewound, and the instance
//! goes on: nothing of the failed batch is visible, nothing is lost, nothing doubled.
//!
//! Its own binary, because failpoints configured in-process apply to every engine of the
//! process.

use std::time::Duration;

use onceflow::Engine;
use onceflow_e2e::Operator;
use onceflow_e2e::sum::{self, Sum};

const WITHIN: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_batch_is_rewound_and_the_instance_goes_on()
-> Result<(), Box<dyn std::error::Error>> {
    let op = Operator::new("abort", 2).await?;
    let (kafka, input, output, group) = (op.kafka, &op.input, &op.output, &op.group);
    let config = op.config("a");
    let inputs = sum::amounts(0, 3_000, 10);
    sum::produce(kafka, input, &inputs).await?;

    // The second and third batches fail once each; the others pass.
    fail::cfg("onceflow-fail-batch", "1*off->2*return->off")?;
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(output)));
    let caught_up = sum::wait_for_caught_up(kafka, group, input, WITHIN).await;
    shutdown.trigger();
    running.await??;
    fail::remove("onceflow-fail-batch");
    caught_up?;

    let snapshot = stats.snapshot();
    assert_eq!(snapshot.aborts, 2, "{snapshot:?}");
    let outputs = sum::committed_outputs(kafka, output).await?;
    sum::assert_exactly_once(&inputs, &outputs);
    Ok(())
}
