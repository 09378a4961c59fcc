//! An outbox relay as a child process, to be crashed and replaced: it publishes the
//! outbox of the database at `RELAY_DATABASE` to the cluster at `RELAY_BROKERS` as relay
//! `RELAY_NAME`, until its standard input closes; then it prints its counters as one
//! JSON line.

use onceflow_e2e::child::env;

#[tokio::main]
async fn main() {
    let _failpoints = fail::FailScenario::setup();
    onceflow_e2e::child::init_logs();
    let pool = onceflow::outbox::sqlx::PgPool::connect(&env("RELAY_DATABASE"))
        .await
        .expect("connect to the database");
    let config = onceflow::outbox::RelayConfig::new(env("RELAY_BROKERS"), env("RELAY_NAME"));
    match onceflow::outbox::relay(pool, config, onceflow_e2e::child::stdin_closed()).await {
        Ok(stats) => {
            #[allow(clippy::print_stdout)]
            {
                println!(
                    "{}",
                    serde_json::json!({
                        "published": stats.published,
                        "transactions": stats.transactions,
                        "activations": stats.activations,
                    })
                );
            }
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(0);
        }
        Err(error) => {
            eprintln!("outbox_relay: {error}");
            std::process::exit(2);
        }
    }
}
