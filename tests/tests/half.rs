//! Half messages (issue 14, part 2) against the real broker, with the local
//! transactions in a real PostgreSQL database (the testkit's server): 100 orders, each
//! sent as a half message whose local transaction inserts the order.
//!
//! - committed orders are published once, rolled-back ones never;
//! - a sender that stops after its local transaction (committed, or rolled back) and
//!   before resolving leaves the half to the check-back, which asks the database and
//!   publishes or removes it;
//! - a half whose check-back never resolves is dead-lettered after its bounds.

use std::collections::BTreeSet;
use std::time::Duration;

use onceflow::effects::Bounds;
use onceflow::half::{self, CheckBack, Decision, HalfConfig, HalfMessage, Resolved};
use onceflow::outbox::sqlx::{self, PgPool};
use onceflow::testkit::{self, Isolation};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(120);

/// The check-back: an order whose row exists committed; `stuck` cannot be told.
struct Orders {
    pool: PgPool,
    stuck: String,
}

#[onceflow::async_trait]
impl CheckBack for Orders {
    async fn check(&mut self, half: &HalfMessage) -> Decision {
        if half.id == self.stuck {
            return Decision::Unknown("the order database cannot say".into());
        }
        match sqlx::query("SELECT 1 FROM orders WHERE id = $1")
            .bind(&half.id)
            .fetch_optional(&self.pool)
            .await
        {
            Ok(Some(_)) => Decision::Commit,
            Ok(None) => Decision::Rollback,
            Err(error) => Decision::Unknown(error.to_string()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_message_is_published_if_and_only_if_its_local_transaction_committed() -> TestResult
{
    let kafka = testkit::kafka().await;
    let server = testkit::postgres().await;
    let admin = PgPool::connect(server.url()).await?;
    let database = testkit::unique_name("half").replace('-', "_");
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&admin)
        .await?;
    let pool = PgPool::connect(&server.database_url(&database)).await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, total BIGINT NOT NULL)")
        .execute(&pool)
        .await?;
    let topic = testkit::unique_name("half-orders");
    kafka.create_topic(&topic, 3).await?;
    let mut config = HalfConfig::new(kafka.bootstrap_servers(), testkit::unique_name("shop"));
    config.check_after = Duration::from_secs(2);
    config.bounds = Bounds {
        tries: 3,
        within: Duration::from_secs(60),
    };
    let sender = half::TransactionalSender::new(&config).await?;

    let stuck = "o-50".to_owned();
    let mut published = BTreeSet::new();
    let (mut left_committed, mut left_rolled_back) = (0, 0);
    for i in 0..100u32 {
        let id = format!("o-{i}");
        let message = HalfMessage::json(&id, &topic, &format!("c{}", i % 7), &i)?;
        // What the local transaction does, and what the sender then says.
        let (commit, says) = match i % 10 {
            _ if id == stuck => (true, Decision::Unknown("the sender died".into())),
            9 => (false, Decision::Rollback),
            4 => (true, Decision::Unknown("the sender died".into())),
            6 => (false, Decision::Unknown("the sender died".into())),
            _ => (true, Decision::Commit),
        };
        let pool = pool.clone();
        let says_now = says.clone();
        let resolved = sender
            .send(message, |half| async move {
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query("INSERT INTO orders (id, total) VALUES ($1, $2)")
                    .bind(&half.id)
                    .bind(i64::from(i))
                    .execute(&mut *tx)
                    .await
                    .expect("insert");
                if commit {
                    tx.commit().await.expect("commit");
                } else {
                    tx.rollback().await.expect("rollback");
                }
                says_now
            })
            .await?;
        match (&says, &resolved) {
            (Decision::Commit, Resolved::Committed) => {
                published.insert(id);
            }
            (Decision::Rollback, Resolved::RolledBack) => {}
            (Decision::Unknown(_), Resolved::Pending(_)) => {
                if id == stuck {
                } else if commit {
                    left_committed += 1;
                    published.insert(id);
                } else {
                    left_rolled_back += 1;
                }
            }
            other => panic!("order {id}: {other:?}"),
        }
    }

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let checker = tokio::spawn(half::check_back(
        config.clone(),
        Orders {
            pool: pool.clone(),
            stuck: stuck.clone(),
        },
        async {
            let _ = stopped.await;
        },
    ));
    let waited = async {
        onceflow_e2e::wait_for_records(kafka, &topic, published.len(), WITHIN).await?;
        onceflow_e2e::wait_for_records(kafka, &config.dead_letter_topic(), 1, WITHIN).await
    }
    .await;
    let _ = stop.send(());
    let stats = checker.await??;
    waited?;

    // Published: exactly the committed orders, once each (by event ID), the stuck one not.
    let records = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
    let ids: Vec<String> = records
        .iter()
        .map(|r| {
            String::from_utf8_lossy(r.header(half::EVENT_ID_HEADER).unwrap_or_default())
                .trim_start_matches("half:")
                .to_owned()
        })
        .collect();
    let distinct: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(ids.len(), distinct.len(), "a half message published twice");
    assert_eq!(distinct, published, "published and committed orders differ");
    // The check-backs: the committed ones published, the rolled-back ones removed, the
    // stuck one dead-lettered with the reason.
    assert_eq!(stats.committed, left_committed, "{stats:?}");
    assert_eq!(stats.rolled_back, left_rolled_back, "{stats:?}");
    assert_eq!(stats.unresolved, 1, "{stats:?}");
    let dead = kafka
        .read_to_end(&config.dead_letter_topic(), Isolation::ReadCommitted)
        .await?;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].key.as_deref(), Some(stuck.as_bytes()));
    let reason =
        String::from_utf8_lossy(dead[0].header("onceflow-error-message").unwrap_or_default())
            .into_owned();
    assert!(
        reason.contains("unresolved after 3 check-backs"),
        "{reason}"
    );
    Ok(())
}
