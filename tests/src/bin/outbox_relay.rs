//! An outbox relay as a child process, to be crashed and replaced: it publishes the
//! outbox of the database at `RELAY_DATABASE` to the cluster at `RELAY_BROKERS` as relay
//! `RELAY_NAME`, until its standard input closes; then it prints its counters as one
//! JSON line.

use tokio::io::AsyncReadExt;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is required"))
}

#[tokio::main]
async fn main() {
    let _failpoints = fail::FailScenario::setup();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "onceflow=info".into()),
        )
        .init();
    let pool = onceflow::outbox::sqlx::PgPool::connect(&env("RELAY_DATABASE"))
        .await
        .expect("connect to the database");
    let config = onceflow::outbox::RelayConfig::new(env("RELAY_BROKERS"), env("RELAY_NAME"));
    let stop = async {
        let mut stdin = tokio::io::stdin();
        let mut buffer = [0u8; 64];
        while stdin
            .read(&mut buffer)
            .await
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    };
    match onceflow::outbox::relay(pool, config, stop).await {
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
