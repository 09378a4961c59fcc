//! The processor the zombie-timer test runs as a child process: the timer tests'
//! [`Buckets`], whose `Tick`s with `remind_in_ms` schedule a wall-clock reminder
//! `remind/<key>` that emits a `Closed` with `bucket == -1` when it fires.
//!
//! Configured as `sum_processor` is, by the same environment variables (`SUM_BROKERS`,
//! `SUM_GROUP`, `SUM_INSTANCE`, `SUM_INPUT`, `SUM_OUTPUT`, `SUM_STATE_DIR`; the
//! processor's `closed` output goes to `SUM_OUTPUT`), with a 6 s session timeout. It stops
//! gracefully when its standard input closes or on SIGINT/SIGTERM, and prints its counters
//! as one JSON line; it exits with 3 when fenced and 2 on any other error.

use onceflow::{Engine, EngineConfig, Error};
use onceflow_e2e::buckets::{Buckets, OUT};
use onceflow_e2e::child::env;

#[tokio::main]
async fn main() {
    onceflow_e2e::child::init_logs();

    let output = env("SUM_OUTPUT");
    let config = EngineConfig::new(
        env("SUM_BROKERS"),
        env("SUM_GROUP"),
        env("SUM_INSTANCE"),
        env("SUM_INPUT"),
        env("SUM_STATE_DIR"),
    )
    .output(output.clone())
    .rename_output(OUT, output)
    .kafka("session.timeout.ms", "6000");
    let engine = match Engine::new(config) {
        Ok(engine) => engine,
        Err(error) => {
            eprintln!("reminder_processor: {error}");
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
    match engine.run(Buckets::default()).await {
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
            eprintln!("reminder_processor: {error}");
            std::process::exit(3);
        }
        Err(error) => {
            eprintln!("reminder_processor: {error}");
            std::process::exit(2);
        }
    }
}
