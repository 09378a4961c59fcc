//! A service sending half messages as a child process, to be crashed: it sends orders
//! `<HALF_PREFIX>-0` … `-<HALF_ORDERS - 1>` to `HALF_TOPIC` as service `HALF_NAME`, each
//! with a local transaction in the database at `HALF_DATABASE` that inserts the order
//! and commits it (even numbers) or rolls it back (odd). `FAILPOINTS` with
//! `onceflow-half-after-local` crashes it between a local transaction and its resolution.

use onceflow::half::{Decision, HalfConfig, HalfMessage, TransactionalSender};
use onceflow::outbox::sqlx::PgPool;
use onceflow_e2e::child::env;

#[tokio::main]
async fn main() {
    let _failpoints = fail::FailScenario::setup();
    onceflow_e2e::child::init_logs();
    let pool = PgPool::connect(&env("HALF_DATABASE"))
        .await
        .expect("connect to the database");
    let config = HalfConfig::new(env("HALF_BROKERS"), env("HALF_NAME"));
    let sender = TransactionalSender::new(&config)
        .await
        .expect("the sender starts");
    let (prefix, topic) = (env("HALF_PREFIX"), env("HALF_TOPIC"));
    let orders: u32 = env("HALF_ORDERS").parse().expect("HALF_ORDERS");
    for i in 0..orders {
        let id = format!("{prefix}-{i}");
        let message = HalfMessage::json(&id, &topic, &id, &i).expect("a message");
        let pool = pool.clone();
        let resolved = sender
            .send(message, |half| async move {
                let commit = i % 2 == 0;
                onceflow_e2e::insert_order(&pool, &half.id, i64::from(i), commit).await;
                if commit {
                    Decision::Commit
                } else {
                    Decision::Rollback
                }
            })
            .await
            .expect("send");
        eprintln!("half_sender: {id} {resolved:?}");
    }
}
