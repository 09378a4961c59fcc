//! An effect executor as a child process, for the test that crashes one between an
//! apply and the record of it: it charges through the payment service at `EXEC_URL`
//! the intents of operator `EXEC_GROUP` (effects topic `<group>-effects`), writes
//! results to `EXEC_RESULTS`, and checks back when `EXEC_CHECKS_BACK=1`. It stops
//! gracefully when its standard input closes, printing its counters as one JSON line.

use onceflow::EngineConfig;
use onceflow_e2e::effects::HttpCharge;

use onceflow_e2e::child::env;

#[tokio::main]
async fn main() {
    let _failpoints = fail::FailScenario::setup();
    onceflow_e2e::child::init_logs();
    let group = env("EXEC_GROUP");
    let processor = EngineConfig::new(
        env("EXEC_BROKERS"),
        &group,
        "processor",
        "unused",
        env("EXEC_STATE_DIR"),
    )
    .with_effects();
    let config = onceflow::effects::executor_config(&processor, &env("EXEC_INSTANCE"))
        .expect("executor config")
        .kafka("session.timeout.ms", "6000");
    let effect = HttpCharge::new(env("EXEC_URL"), env("EXEC_CHECKS_BACK") == "1");
    let results = env("EXEC_RESULTS");
    let (engine, executor) = onceflow::effects::executor(config, effect, Some(&results))
        .await
        .expect("executor");
    let shutdown = engine.shutdown_handle();
    tokio::spawn(async move {
        onceflow_e2e::child::stdin_closed().await;
        shutdown.trigger();
    });
    match engine.run(executor).await {
        Ok(stats) => {
            #[allow(clippy::print_stdout)]
            {
                println!(
                    "{}",
                    serde_json::json!({
                        "records_in": stats.records_in,
                        "dead_lettered": stats.dead_lettered,
                    })
                );
            }
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(0);
        }
        Err(error) => {
            eprintln!("effects_executor: {error}");
            std::process::exit(2);
        }
    }
}
