//! The shop end to end (issue 14, part 4): every part its own process against the broker
//! and PostgreSQL — the order service, the outbox relay, the inventory and points
//! processors, the effect executor and the warehouse — each SIGKILLed at moments drawn
//! from a seed (printed; `SHOP_SEED=<n>` replays one) while orders come in, some posted
//! twice and some injected twice straight into `orders`. Then: every order decided once;
//! each accepted one took its stock once, granted its points once and reached the
//! warehouse once (as the warehouse counted it); rejected ones touched nothing; stock
//! and points totals exact.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{committed_values, example, free_port};
use onceflow::outbox::sqlx::{self, Row};
use onceflow_testkit::{self as testkit, OutgoingRecord};
use serde::Deserialize;
use tokio::process::{Child, Command};

const ORDERS: usize = 400;
const KILLS: usize = 12;
const STOCK_PER_ITEM: u32 = 100;
const POINTS_PER_UNIT: u64 = 10;
const WITHIN: Duration = Duration::from_secs(180);

#[derive(Deserialize, Debug, Clone)]
struct Reserved {
    order: String,
    customer: String,
    item: String,
    quantity: u32,
    stock_left: u32,
}

#[derive(Deserialize, Debug, Clone)]
struct Rejected {
    order: String,
    item: String,
    quantity: u32,
    reason: String,
}

#[derive(Deserialize, Debug, Clone)]
struct Granted {
    order: String,
    customer: String,
    points: u64,
    total: u64,
}

#[derive(Deserialize, Debug, Clone)]
struct Shipped {
    key: String,
    order: String,
    item: String,
    quantity: u32,
}

#[derive(Deserialize, Debug)]
struct Warehouse {
    requests: u64,
    shipments: Vec<Shipped>,
}

/// The `n`-th order: 13 customers, 8 items and now and then one not in the catalogue,
/// 1 to 6 units (more are asked than the stock holds, so some are rejected).
fn order(n: usize) -> serde_json::Value {
    let item = if n % 50 == 49 {
        "item-99".to_owned()
    } else {
        format!("item-{}", n % 8)
    };
    serde_json::json!({
        "id": format!("order-{n}"),
        "customer": format!("customer-{}", n % 13),
        "item": item,
        "quantity": 1 + (n * 7) % 6,
    })
}

/// A small deterministic generator (xorshift), so a failing run can be replayed.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// One part of the shop: how to start it, and its process while it runs.
struct Part {
    name: &'static str,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Part {
    fn new(name: &'static str, args: Vec<String>, dir: &Path) -> Part {
        Part {
            name,
            args,
            envs: Vec::new(),
            log: dir.join(format!("{name}.log")),
            child: None,
        }
    }

    fn start(&mut self) {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(example("shop"))
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info,sqlx=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("the shop starts");
        self.child = Some(child);
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.start_kill().expect("kill");
            child.wait().await.expect("wait");
        }
    }

    /// SIGTERM, then whether it exited cleanly within 30 s.
    async fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        if let Some(status) = child.try_wait().expect("try_wait") {
            eprintln!("{} had exited already: {status}", self.name);
            return false;
        }
        let pid = child.id().expect("running").to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().await;
        assert!(sent.expect("kill -TERM").success());
        match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => false,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// Posts order `body` until the order service answers 2xx (it may be down, being
/// restarted): a client that retries, as clients do.
async fn post_order(client: &reqwest::Client, url: &str, body: &serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.post(url).json(body).send().await {
            Ok(response) if response.status().is_success() => return,
            Ok(response) => eprintln!("order service answered {}", response.status()),
            Err(_) => {} // down for a moment
        }
        assert!(Instant::now() < deadline, "order {body} not taken in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_ships_once_and_counts_once_through_kills_of_every_part() {
    let kafka = testkit::kafka().await;
    let postgres = testkit::postgres().await;
    for topic in ["orders", "reserved-orders", "rejected-orders", "points"] {
        kafka.create_topic(topic, 4).await.expect("create topic");
    }
    let shop_db = postgres.create_database("shop").await.expect("a database");
    let warehouse_db = postgres
        .create_database("warehouse")
        .await
        .expect("a database");
    let dir = tempfile::tempdir().expect("temporary directory");
    let state = dir.path().join("state").to_str().expect("utf-8").to_owned();
    let brokers = kafka.bootstrap_servers().to_owned();
    let (orders_port, warehouse_port) = (free_port(), free_port());
    let warehouse_url = format!("http://127.0.0.1:{warehouse_port}");
    let seed = std::env::var("SHOP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1)
        });
    eprintln!("shop: seed {seed} (SHOP_SEED={seed} replays these kills)");
    let mut dice = Dice(seed);

    let strings = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let processor = |part: &str, extra: &[&str]| {
        let mut args = strings(&[
            part,
            "--brokers",
            &brokers,
            "--instance-id",
            "shop-1",
            "--state-dir",
            &state,
            "--commit-interval",
            "50ms",
            "--max-batch-records",
            "20",
            "--metrics-address",
            "off",
            "--kafka",
            "session.timeout.ms=6000",
        ]);
        args.extend(strings(extra));
        args
    };
    let mut parts = vec![
        Part::new(
            "warehouse",
            strings(&[
                "warehouse",
                "--database",
                &warehouse_db,
                "--listen",
                &format!("127.0.0.1:{warehouse_port}"),
            ]),
            dir.path(),
        ),
        Part::new(
            "order-service",
            strings(&[
                "order-service",
                "--database",
                &shop_db,
                "--listen",
                &format!("127.0.0.1:{orders_port}"),
            ]),
            dir.path(),
        ),
        Part::new(
            "relay",
            strings(&["relay", "--database", &shop_db, "--brokers", &brokers]),
            dir.path(),
        ),
        Part::new("inventory", processor("inventory", &[]), dir.path()),
        Part::new(
            "points",
            processor("points", &["--role", "processor"]),
            dir.path(),
        ),
        Part::new(
            "executor",
            processor("points", &["--role", "effects"]),
            dir.path(),
        ),
    ];
    parts[5]
        .envs
        .push(("SHOP_WAREHOUSE_URL".into(), warehouse_url.clone()));
    for part in &mut parts {
        part.start();
    }

    // Orders at a steady pace while parts are killed: one in ten posted twice (a client
    // retrying after a lost answer), one in twenty injected twice into `orders` (a copy
    // a broken relay might publish); both must count once.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let orders_url = format!("http://127.0.0.1:{orders_port}/orders");
    let started = Instant::now();
    let post_all = async {
        for n in 0..ORDERS {
            let body = order(n);
            post_order(&client, &orders_url, &body).await;
            if n % 10 == 3 {
                post_order(&client, &orders_url, &body).await;
            }
            if n % 20 == 7 {
                let key = body["item"].as_str().expect("item").to_owned();
                kafka
                    .produce("orders", [OutgoingRecord::keyed(key, body.to_string())])
                    .await
                    .expect("inject a duplicate");
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    };
    let chaos = async {
        let mut kills = Vec::new();
        for round in 0..KILLS {
            tokio::time::sleep(Duration::from_millis(1_000 + dice.roll(2_000))).await;
            // Every part once in the first round of six, then at random.
            let victim = if round < parts.len() {
                (round * 5 + seed as usize) % parts.len()
            } else {
                dice.roll(parts.len() as u64) as usize
            };
            let part = &mut parts[victim];
            part.kill().await;
            kills.push((started.elapsed(), part.name));
            tokio::time::sleep(Duration::from_millis(dice.roll(1_000))).await;
            part.start();
        }
        kills
    };
    let ((), kills) = tokio::join!(post_all, chaos);
    for (at, name) in &kills {
        eprintln!("shop: killed {name} at {:.1} s", at.as_secs_f64());
    }
    assert_eq!(
        kills.iter().map(|(_, n)| *n).collect::<BTreeSet<_>>().len(),
        parts.len(),
        "every part was killed at least once"
    );

    // Until every order is decided and every accepted one shipped.
    let deadline = Instant::now() + WITHIN;
    let (reserved, rejected, granted, warehouse) = loop {
        let reserved: Vec<Reserved> = committed_values(kafka, "reserved-orders").await;
        let rejected: Vec<Rejected> = committed_values(kafka, "rejected-orders").await;
        let granted: Vec<Granted> = committed_values(kafka, "points").await;
        let warehouse: Option<Warehouse> = match client
            .get(format!("{warehouse_url}/shipments"))
            .send()
            .await
        {
            Ok(response) => response.json().await.ok(),
            Err(_) => None,
        };
        // Distinct orders: a copy (the hole the checks below look for) must not make
        // the wait end early or never.
        let distinct = |orders: Vec<&str>| orders.into_iter().collect::<BTreeSet<_>>().len();
        let reserved_orders = distinct(reserved.iter().map(|r| r.order.as_str()).collect());
        let decided =
            reserved_orders + distinct(rejected.iter().map(|r| r.order.as_str()).collect());
        let granted_orders = distinct(granted.iter().map(|g| g.order.as_str()).collect());
        let shipped = warehouse.as_ref().map_or(0, |w| {
            distinct(w.shipments.iter().map(|s| s.order.as_str()).collect())
        });
        if decided >= ORDERS && granted_orders >= reserved_orders && shipped >= reserved_orders {
            break (reserved, rejected, granted, warehouse.expect("read"));
        }
        if Instant::now() > deadline {
            let tails: Vec<String> = parts
                .iter()
                .map(|p| format!("--- {}\n{}", p.name, p.log_tail()))
                .collect();
            panic!(
                "after {WITHIN:?}: {} reserved + {} rejected of {ORDERS} orders, {} granted, \
                 {shipped} shipped\n{}",
                reserved.len(),
                rejected.len(),
                granted.len(),
                tails.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let settled = started.elapsed();
    for part in &mut parts {
        let name = part.name;
        let tail = part.log_tail();
        assert!(part.stop().await, "{name} did not stop cleanly:\n{tail}");
    }

    // Every order decided exactly once.
    let accepted: BTreeMap<&str, &Reserved> =
        reserved.iter().map(|r| (r.order.as_str(), r)).collect();
    assert_eq!(accepted.len(), reserved.len(), "an order reserved twice");
    let refused: BTreeMap<&str, &Rejected> =
        rejected.iter().map(|r| (r.order.as_str(), r)).collect();
    assert_eq!(refused.len(), rejected.len(), "an order rejected twice");
    assert!(
        accepted.keys().all(|o| !refused.contains_key(o)),
        "an order both reserved and rejected"
    );
    let all: BTreeSet<String> = (0..ORDERS).map(|n| format!("order-{n}")).collect();
    let decided: BTreeSet<String> = accepted
        .keys()
        .chain(refused.keys())
        .map(|o| (*o).to_owned())
        .collect();
    assert_eq!(decided, all, "every order decided");
    assert!(
        !refused.is_empty() && !accepted.is_empty(),
        "the workload both fits and overdraws the stock"
    );

    // Stock: per item, the reservations in the order they took units form one chain
    // from the initial stock, each taking its own units once.
    let mut by_item: BTreeMap<&str, Vec<&Reserved>> = BTreeMap::new();
    for r in &reserved {
        let (id, o) = (r.order.as_str(), order(order_number(&r.order)));
        assert_eq!(
            o["item"],
            r.item.as_str(),
            "{id}: another item than ordered"
        );
        assert_eq!(
            o["quantity"], r.quantity,
            "{id}: another quantity than ordered"
        );
        by_item.entry(r.item.as_str()).or_default().push(r);
    }
    let mut stock_left: BTreeMap<&str, u32> = BTreeMap::new();
    for (item, mut taken) in by_item {
        taken.sort_by_key(|r| std::cmp::Reverse(r.stock_left));
        let mut left = STOCK_PER_ITEM;
        for r in taken {
            assert_eq!(
                r.stock_left,
                left - r.quantity,
                "{item}: {} did not take its {} units once from {left}",
                r.order,
                r.quantity
            );
            left = r.stock_left;
        }
        stock_left.insert(item, left);
    }
    for r in &rejected {
        let known = r.item != "item-99";
        let left = stock_left
            .get(r.item.as_str())
            .copied()
            .unwrap_or(STOCK_PER_ITEM);
        assert!(
            !known || r.quantity > left,
            "{} rejected ({}) though {left} of {} are left at the end",
            r.order,
            r.reason,
            r.item
        );
    }

    // Points: once per reserved order, each customer's running total exact.
    let mut points_of: BTreeMap<&str, Vec<&Granted>> = BTreeMap::new();
    for g in &granted {
        points_of.entry(g.customer.as_str()).or_default().push(g);
    }
    let granted_orders: BTreeSet<&str> = granted.iter().map(|g| g.order.as_str()).collect();
    assert_eq!(granted_orders.len(), granted.len(), "points granted twice");
    assert_eq!(
        granted_orders,
        accepted.keys().copied().collect::<BTreeSet<_>>(),
        "points for exactly the reserved orders"
    );
    for (customer, mut grants) in points_of {
        grants.sort_by_key(|g| g.total);
        let mut total = 0;
        for g in grants {
            let r = accepted[g.order.as_str()];
            assert_eq!(r.customer, customer);
            assert_eq!(g.points, u64::from(r.quantity) * POINTS_PER_UNIT);
            total += g.points;
            assert_eq!(
                g.total, total,
                "{customer}: running total off at {}",
                g.order
            );
        }
    }

    // The warehouse: each reserved order shipped once, with its units; nothing else.
    let shipped: BTreeMap<&str, &Shipped> = warehouse
        .shipments
        .iter()
        .map(|s| (s.order.as_str(), s))
        .collect();
    assert_eq!(
        shipped.len(),
        warehouse.shipments.len(),
        "an order shipped twice (under two keys)"
    );
    assert_eq!(
        shipped.keys().copied().collect::<BTreeSet<_>>(),
        accepted.keys().copied().collect::<BTreeSet<_>>(),
        "shipments for exactly the reserved orders"
    );
    for (order_id, s) in &shipped {
        assert_eq!(s.quantity, accepted[order_id].quantity);
        assert_eq!(s.item, accepted[order_id].item);
        assert!(
            s.key.starts_with("shop-points/"),
            "the key comes from the operator: {}",
            s.key
        );
    }
    assert!(warehouse.requests >= warehouse.shipments.len() as u64);

    // The order service stored each order once, and its outbox is drained.
    let pool = sqlx::PgPool::connect(&shop_db).await.expect("connect");
    let stored: i64 = sqlx::query("SELECT count(*) FROM shop_orders")
        .fetch_one(&pool)
        .await
        .expect("count")
        .get(0);
    assert_eq!(stored, ORDERS as i64);
    eprintln!(
        "shop: {ORDERS} orders ({} reserved, {} rejected) settled {:.1} s after the first, \
         through {} kills; the warehouse got {} requests for {} shipments",
        reserved.len(),
        rejected.len(),
        settled.as_secs_f64(),
        kills.len(),
        warehouse.requests,
        warehouse.shipments.len()
    );
}

fn order_number(id: &str) -> usize {
    id.trim_start_matches("order-").parse().expect("order-<n>")
}
