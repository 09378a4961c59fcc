//! The processor the crash tests run as a child process: one output per input, and a
//! per-key running sum kept in state.
//!
//! Input `{"id": "e-17", "key": "k3", "amount": 5}` (the ID may be absent) becomes
//! `{"id": "e-17", "key": "k3", "amount": 5, "sum": 42}` on the output topic, keyed by
//! `key`. Configured by environment variables (`SUM_*`, see `main`). It stops gracefully
//! when its standard input closes or on SIGINT/SIGTERM, and prints its counters as one
//! JSON line; it exits with 3 when fenced and 2 on any other error.

use std::time::Duration;

use onceflow::{Engine, EngineConfig, Error};
use onceflow_e2e::buckets::{self, Buckets};
use onceflow_e2e::poison::Picky;
use onceflow_e2e::sum::Sum;

use onceflow_e2e::child::env;

#[tokio::main]
async fn main() {
    let _failpoints = fail::FailScenario::setup();
    onceflow_e2e::child::init_logs();

    let output = env("SUM_OUTPUT");
    let mut config = EngineConfig::new(
        env("SUM_BROKERS"),
        env("SUM_GROUP"),
        env("SUM_INSTANCE"),
        env("SUM_INPUT"),
        env("SUM_STATE_DIR"),
    )
    .output(output.clone())
    .kafka("session.timeout.ms", "6000");
    if let Ok(mode) = std::env::var("SUM_DELIVERY") {
        config = config.delivery(mode.parse().expect("SUM_DELIVERY"));
    }
    if let Ok(seconds) = std::env::var("SUM_MAX_RETRY_SECONDS") {
        let seconds: u64 = seconds.parse().expect("SUM_MAX_RETRY_SECONDS");
        config = config.retries(1_000, Duration::from_secs(seconds));
    }
    if let Ok(ms) = std::env::var("SUM_COMMIT_INTERVAL_MS") {
        let ms: u64 = ms.parse().expect("SUM_COMMIT_INTERVAL_MS");
        let max_batch_records = config.max_batch_records;
        config = config.batching(Duration::from_millis(ms), max_batch_records);
    }
    let processor = std::env::var("SUM_PROCESSOR");
    if processor.as_deref() == Ok("reminders") {
        config = config.rename_output(buckets::OUT, output.clone());
    }
    let engine = match Engine::new(config) {
        Ok(engine) => engine,
        Err(error) => {
            eprintln!("sum_processor: {error}");
            std::process::exit(2);
        }
    };
    let shutdown = engine.shutdown_handle();
    tokio::spawn(async move {
        let closed = onceflow_e2e::child::stdin_closed();
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
        tokio::select! {
            () = closed => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        shutdown.trigger();
    });
    // SUM_PROCESSOR=picky runs the processor of the dead-letter tests instead, and
    // SUM_PROCESSOR=reminders the timer tests' `Buckets` (its `closed` output renamed
    // to SUM_OUTPUT), whose `Tick`s with `remind_in_ms` schedule wall-clock reminders.
    let result = match processor.as_deref() {
        Ok("picky") => engine.run(Picky::new(output)).await,
        Ok("reminders") => engine.run(Buckets::default()).await,
        _ => engine.run(Sum::new(output)).await,
    };
    match result {
        Ok(stats) => {
            #[allow(clippy::print_stdout)]
            {
                println!(
                    "{}",
                    serde_json::json!({
                        "records_in": stats.records_in,
                        "outputs": stats.outputs,
                        "duplicates_skipped": stats.duplicates_skipped,
                        "commits": stats.commits,
                        "aborts": stats.aborts,
                        "assignments": stats.assignments,
                        "replayed_records": stats.replayed_records,
                        "timers_fired": stats.timers_fired,
                    })
                );
            }
            // Not a return from main: the runtime would wait on its way out for the
            // blocking read of stdin, which never ends when a signal stopped the engine.
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(0);
        }
        Err(error @ Error::Fenced { .. }) => {
            eprintln!("sum_processor: {error}");
            std::process::exit(3);
        }
        Err(error) => {
            eprintln!("sum_processor: {error}");
            std::process::exit(2);
        }
    }
}
