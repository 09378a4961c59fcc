//! The transactional outbox (issue 14, part 3) against a real PostgreSQL server (the
//! testkit's, from Debian's binaries) and the real broker.
//!
//! 1. Four writers insert orders with their outbox rows in one transaction each, one in
//!    ten rolled back, some held open while others commit; an `outbox_relay` process
//!    crashes (`abort()`) between writing a batch and committing it, two more take over,
//!    one of them SIGKILLed. Every committed order is published once, in each
//!    customer's order, no rolled-back one ever; the crashed batch is in the log only
//!    as aborted records.
//! 2. A transaction that commits after a later one is published, first: a relay that
//!    read `id > last` would have moved past it for good.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use onceflow::outbox::sqlx::{self, PgPool, postgres::PgPoolOptions};
use onceflow::outbox::{self, Message, RelayConfig};
use onceflow_testkit::{self as testkit, Isolation, Kafka, Record};
use serde::{Deserialize, Serialize};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Order {
    id: String,
    customer: String,
    seq: u32,
}

/// A fresh database on the test server, with the outbox and an `orders` table.
async fn database(name: &str) -> Result<(String, PgPool), Box<dyn std::error::Error>> {
    let url = testkit::postgres().await.create_database(name).await?;
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(&url)
        .await?;
    outbox::install(&pool).await?;
    sqlx::query(
        "CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, seq INT NOT NULL)",
    )
    .execute(&pool)
    .await?;
    Ok((url, pool))
}

/// Inserts an order and its outbox message in one transaction; commits it unless
/// `roll_back`, after holding it open for `hold`.
async fn place(
    pool: &PgPool,
    topic: &str,
    order: &Order,
    hold: Duration,
    roll_back: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, customer, seq) VALUES ($1, $2, $3)")
        .bind(&order.id)
        .bind(&order.customer)
        .bind(order.seq as i32)
        .execute(&mut *tx)
        .await?;
    outbox::enqueue(&mut tx, &Message::json(topic, &order.customer, order)?).await?;
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    if roll_back {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(())
}

/// The committed orders on `topic`, in partition and offset order, with their records.
async fn published(
    kafka: &Kafka,
    topic: &str,
) -> Result<Vec<(Order, Record)>, Box<dyn std::error::Error>> {
    let records = kafka.read_to_end(topic, Isolation::ReadCommitted).await?;
    Ok(records
        .into_iter()
        .map(|r| {
            let order =
                serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("order");
            (order, r)
        })
        .collect())
}

/// A relay process, killed (and reaped) when dropped unless stopped first.
struct RelayProcess(Option<Child>);

impl RelayProcess {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }

    /// Closes its stdin (a graceful stop) and waits for its exit.
    fn stop(mut self) -> std::io::Result<std::process::Output> {
        let mut child = self.0.take().expect("running");
        drop(child.stdin.take());
        child.wait_with_output()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn relay_process(
    kafka: &Kafka,
    database: &str,
    name: &str,
    failpoints: Option<&str>,
) -> RelayProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox_relay"));
    if let Some(failpoints) = failpoints {
        command.env("FAILPOINTS", failpoints);
    }
    command
        .env("RELAY_DATABASE", database)
        .env("RELAY_BROKERS", kafka.bootstrap_servers())
        .env("RELAY_NAME", name)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "onceflow=warn".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map(|child| RelayProcess(Some(child)))
        .expect("spawn outbox_relay")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_orders_are_published_once_in_order_through_crashed_relays() -> TestResult {
    let kafka = testkit::kafka().await;
    let (url, pool) = database("outbox-crash").await?;
    let topic = testkit::unique_name("shop-orders");
    kafka.create_topic(&topic, 3).await?;
    let name = testkit::unique_name("relay");

    // Four writers, 250 orders each on three customers of their own; one in ten rolled
    // back; one in seven held open for 300 ms while the others commit.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (pool, topic) = (pool.clone(), topic.clone());
            tokio::spawn(async move {
                let mut committed = Vec::new();
                for i in 0..250u32 {
                    let order = Order {
                        id: format!("w{w}-o{i}"),
                        customer: format!("w{w}-c{}", i % 3),
                        seq: i,
                    };
                    let hold = if i % 7 == 3 {
                        Duration::from_millis(300)
                    } else {
                        Duration::ZERO
                    };
                    let roll_back = i % 10 == 9;
                    place(&pool, &topic, &order, hold, roll_back).await?;
                    if !roll_back {
                        committed.push(order);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(committed)
            })
        })
        .collect();

    // The first relay crashes inside its fifth transaction, after writing the batch.
    let mut first = relay_process(
        kafka,
        &url,
        &name,
        Some("onceflow-outbox-before-commit=4*off->return"),
    );
    let deadline = Instant::now() + WITHIN;
    let status = loop {
        if let Some(status) = first.child().try_wait()? {
            break status;
        }
        assert!(Instant::now() < deadline, "the first relay did not crash");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !status.success(),
        "the first relay exited with {status}, not a crash"
    );
    // Two more: one active, one waiting; the first of them is SIGKILLed a moment later
    // (whichever was active, the other must go on without a gap or a double).
    let second = relay_process(kafka, &url, &name, None);
    let third = relay_process(kafka, &url, &name, None);
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(second); // SIGKILL

    let mut committed = Vec::new();
    for writer in writers {
        committed.extend(writer.await?.map_err(|e| e.to_string())?);
    }
    let waited = onceflow_e2e::wait_for_records(kafka, &topic, committed.len(), WITHIN).await;
    let stopped = tokio::task::block_in_place(|| third.stop())?;
    waited?;
    assert!(stopped.status.success(), "{stopped:?}");

    let published = published(kafka, &topic).await?;
    // Once each, the rolled-back never.
    let ids: Vec<&str> = published.iter().map(|(o, _)| o.id.as_str()).collect();
    let distinct: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), distinct.len(), "an order published twice");
    let want: BTreeSet<&str> = committed.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(distinct, want, "published and committed orders differ");
    // In each customer's order.
    let mut by_customer: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (order, _) in &published {
        by_customer
            .entry(&order.customer)
            .or_default()
            .push(order.seq);
    }
    for (customer, seqs) in &by_customer {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{customer} out of order: {seqs:?}"
        );
    }
    // Each with its row as its event ID.
    let event_ids: BTreeSet<String> = published
        .iter()
        .map(|(_, r)| {
            String::from_utf8_lossy(r.header(outbox::EVENT_ID_HEADER).unwrap_or_default())
                .into_owned()
        })
        .collect();
    assert_eq!(event_ids.len(), published.len());
    assert!(event_ids.iter().all(|id| id.starts_with("outbox:")));
    // The crashed batch was written and never committed: only read_uncommitted sees it.
    let everything = kafka
        .read_to_end(&topic, Isolation::ReadUncommitted)
        .await?;
    assert!(
        everything.len() > published.len(),
        "no aborted batch in the log: the crash did not land inside a transaction"
    );
    // Published rows are deleted.
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM onceflow_outbox")
        .fetch_one(&pool)
        .await?;
    assert_eq!(left, 0, "published rows left in the outbox");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_commits_late_is_published_first_not_skipped() -> TestResult {
    let kafka = testkit::kafka().await;
    let (_, pool) = database("outbox-late").await?;
    let topic = testkit::unique_name("late-orders");
    kafka.create_topic(&topic, 1).await?;
    let config = RelayConfig::new(kafka.bootstrap_servers(), testkit::unique_name("relay"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(outbox::relay(pool.clone(), config, async {
        let _ = stopped.await;
    }));

    let order = |seq: u32| Order {
        id: format!("o{seq}"),
        customer: "c".into(),
        seq,
    };
    // The relay is active once a first order is through.
    let mut first = pool.begin().await?;
    outbox::enqueue(&mut first, &Message::json(&topic, "c", &order(0))?).await?;
    first.commit().await?;
    onceflow_e2e::wait_for_records(kafka, &topic, 1, WITHIN).await?;
    // The next transaction takes its ID, then waits; a later one commits meanwhile.
    let mut early = pool.begin().await?;
    outbox::enqueue(&mut early, &Message::json(&topic, "c", &order(1))?).await?;
    let mut late = pool.begin().await?;
    outbox::enqueue(&mut late, &Message::json(&topic, "c", &order(2))?).await?;
    late.commit().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = kafka.read_to_end(&topic, Isolation::ReadCommitted).await?;
    assert_eq!(held.len(), 1, "published past a transaction still open");
    early.commit().await?;
    onceflow_e2e::wait_for_records(kafka, &topic, 3, WITHIN).await?;
    let _ = stop.send(());
    let stats = relay.await??;
    let seqs: Vec<u32> = published(kafka, &topic)
        .await?
        .iter()
        .map(|(o, _)| o.seq)
        .collect();
    assert_eq!(seqs, vec![0, 1, 2]);
    assert_eq!(stats.published, 3);
    Ok(())
}
