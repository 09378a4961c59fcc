//! Half messages (issue 14, part 2) against the real broker, with the local
//! transactions in a real PostgreSQL database (the testkit's server): 100 orders, each
//! sent as a half message whose local transaction inserts the order.
//!
//! - committed orders are published once, rolled-back ones never;
//! - a sender that stops after its local transaction (committed, or rolled back) and
//!   before resolving leaves the half to the check-back, which asks the database and
//!   publishes or removes it;
//! - a half whose check-back never resolves is dead-lettered after its bounds;
//! - a sender *process* crashed (`abort()`) between its local transaction and the
//!   resolution — once after a commit, once after a rollback — leaves a half the
//!   check-back publishes or removes, as the database says.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use onceflow::effects::Bounds;
use onceflow::half::{self, CheckBack, Decision, HalfConfig, HalfMessage, Resolved};
use onceflow::outbox::sqlx::{self, PgPool};
use onceflow_testkit::{self as testkit, Isolation};

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
    let (_, pool) = orders_database("half").await?;
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
                onceflow_e2e::insert_order(&pool, &half.id, i64::from(i), commit).await;
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
    let ids = published_ids(kafka, &topic).await?;
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

/// The message IDs published on `topic`, in log order (copies included).
async fn published_ids(
    kafka: &testkit::Kafka,
    topic: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    Ok(kafka
        .read_to_end(topic, Isolation::ReadCommitted)
        .await?
        .iter()
        .map(|r| {
            String::from_utf8_lossy(r.header(half::EVENT_ID_HEADER).unwrap_or_default())
                .trim_start_matches("half:")
                .to_owned()
        })
        .collect())
}

/// A database of the test's own with the `orders` table: its URL and a pool.
async fn orders_database(name: &str) -> Result<(String, PgPool), Box<dyn std::error::Error>> {
    let url = testkit::postgres().await.create_database(name).await?;
    let pool = PgPool::connect(&url).await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, total BIGINT NOT NULL)")
        .execute(&pool)
        .await?;
    Ok((url, pool))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_crashed_after_its_local_transaction_is_resolved_by_the_check_back() -> TestResult
{
    let kafka = testkit::kafka().await;
    let (url, pool) = orders_database("half-crash").await?;
    let topic = testkit::unique_name("half-crash-orders");
    kafka.create_topic(&topic, 3).await?;
    let mut config = HalfConfig::new(kafka.bootstrap_servers(), testkit::unique_name("crashing"));
    config.check_after = Duration::from_secs(2);

    // Sender `c` crashes after the local transaction of c-4 (committed), sender `r`
    // after that of r-3 (rolled back): each resolved the orders before it itself.
    for (prefix, failpoint) in [("c", "4*off->return"), ("r", "3*off->return")] {
        let output = Command::new(env!("CARGO_BIN_EXE_half_sender"))
            .env("HALF_BROKERS", kafka.bootstrap_servers())
            .env("HALF_NAME", &config.name)
            .env("HALF_TOPIC", &topic)
            .env("HALF_DATABASE", &url)
            .env("HALF_PREFIX", prefix)
            .env("HALF_ORDERS", "10")
            .env(
                "FAILPOINTS",
                format!("onceflow-half-after-local={failpoint}"),
            )
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "onceflow=warn".into()),
            )
            .output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains("failpoint onceflow-half-after-local hit"),
            "sender {prefix} did not crash where it should: {}\n{stderr}",
            output.status
        );
    }
    // The crash came after the local transactions: c-4's row exists, r-3's does not.
    let rows: Vec<String> = sqlx::query_scalar("SELECT id FROM orders ORDER BY id")
        .fetch_all(&pool)
        .await?;
    assert_eq!(rows, ["c-0", "c-2", "c-4", "r-0", "r-2"]);
    let before = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
    assert_eq!(
        before.len(),
        4,
        "c-0, c-2, r-0, r-2 published by their senders"
    );

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let checker = tokio::spawn(half::check_back(
        config.clone(),
        Orders {
            pool: pool.clone(),
            stuck: String::new(),
        },
        async {
            let _ = stopped.await;
        },
    ));
    // Until both crashed halves are resolved: their last record on the half topic is a
    // tombstone (c-4's written with its publication, r-3's as its removal).
    let resolved = async {
        let deadline = std::time::Instant::now() + WITHIN;
        loop {
            let halves = kafka
                .read_to_end(&config.half_topic(), Isolation::ReadCommitted)
                .await?;
            let last_is_tombstone = |id: &[u8]| {
                halves
                    .iter()
                    .rev()
                    .find(|r| r.key.as_deref() == Some(id))
                    .is_some_and(|r| r.value.is_none())
            };
            if last_is_tombstone(b"c-4") && last_is_tombstone(b"r-3") {
                return Ok::<(), Box<dyn std::error::Error>>(());
            }
            if std::time::Instant::now() > deadline {
                return Err("the crashed senders' halves were not resolved".into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let waited = resolved.await;
    let _ = stop.send(());
    let stats = checker.await??;
    waited?;
    let ids = published_ids(kafka, &topic).await?;
    let distinct: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(
        ids.len(),
        distinct.len(),
        "a half message published twice: {ids:?}"
    );
    assert_eq!(
        distinct,
        BTreeSet::from(["c-0", "c-2", "c-4", "r-0", "r-2"]),
        "exactly the committed orders"
    );
    assert_eq!(
        stats.committed, 1,
        "c-4 published by the check-back: {stats:?}"
    );
    assert_eq!(
        stats.rolled_back, 1,
        "r-3 removed by the check-back: {stats:?}"
    );
    assert_eq!(stats.unresolved, 0, "{stats:?}");
    Ok(())
}
