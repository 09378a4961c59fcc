//! The quickstart: `cargo run --example quickstart`.
//!
//! Starts Apache Kafka in Docker through the testkit (or uses `--brokers`), produces
//! sample orders, some of them twice, runs the `billing` example as a child process,
//! kills it with SIGKILL part-way, restarts it, and then checks with an independent
//! `read_committed` reader that every order was invoiced exactly once and every
//! customer's running total is right.
//!
//! With `--keep-broker` the broker it started is left running at the end, for your own
//! processors: it prints the address and the `docker rm -f` command that removes it.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use onceflow_testkit::{self as testkit, Isolation, Kafka, KeptBroker, OutgoingRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

#[path = "billing.rs"]
#[allow(dead_code, unreachable_pub)]
mod billing;

use billing::{Invoice, Order};

/// Set on the child process: run the billing processor instead of the quickstart.
const ROLE: &str = "ONCEFLOW_QUICKSTART_ROLE";
const GROUP: &str = "billing";
const PARTITIONS: i32 = 3;
/// The name `--keep-broker` gives the broker's container.
const KEPT_NAME: &str = "onceflow-quickstart-kafka";

#[derive(Parser, Debug)]
#[command(
    about = "Run billing through a crash and check that every order was invoiced exactly once"
)]
struct Args {
    /// Use this Kafka cluster instead of starting one in Docker (it must not have the
    /// topics `orders` and `invoices` yet).
    #[arg(long)]
    brokers: Option<String>,
    /// Distinct orders to produce.
    #[arg(long, default_value_t = 4000)]
    orders: usize,
    /// Every n-th order is produced twice.
    #[arg(long, default_value_t = 10)]
    duplicate_every: usize,
    /// Customers the orders are spread over.
    #[arg(long, default_value_t = 40)]
    customers: usize,
    /// Leave the broker running at the end (its container named
    /// `onceflow-quickstart-kafka`), for your own processors; prints its address and the
    /// command that removes it.
    #[arg(long, conflicts_with = "brokers")]
    keep_broker: bool,
}

fn main() -> ExitCode {
    if std::env::var(ROLE).as_deref() == Ok("billing") {
        return billing::main();
    }
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let mut kept = None;
    let code = match runtime.block_on(quickstart(args, &mut kept)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("quickstart failed: {error}");
            ExitCode::FAILURE
        }
    };
    if let Some(kept) = kept {
        print_kept(&kept);
    }
    code
}

/// Where the broker `--keep-broker` left running is, and how to remove it.
fn print_kept(kept: &KeptBroker) {
    let brokers = &kept.bootstrap_servers;
    let container = &kept.container;
    println!();
    println!("The Kafka broker keeps running (--keep-broker):");
    println!("  address              {brokers}   (a processor here: --brokers {brokers})");
    println!(
        "  inside its container {}   (docker exec {container} …)",
        kept.inside_bootstrap_servers
    );
    println!("  remove it with       docker rm -f {container}");
}

type Failure = Box<dyn std::error::Error>;

async fn quickstart(args: Args, kept_broker: &mut Option<KeptBroker>) -> Result<bool, Failure> {
    let kafka: &Kafka = match &args.brokers {
        Some(brokers) => {
            let kafka = Box::leak(Box::new(Kafka::connect(brokers.clone())));
            for topic in ["orders", "invoices"] {
                if kafka.topic_exists(topic).await? {
                    return Err(format!(
                        "topic `{topic}` already exists on {brokers}; the quickstart needs a \
                         cluster without `orders` and `invoices` (delete them, or run without --brokers)"
                    )
                    .into());
                }
            }
            kafka
        }
        None => {
            println!(
                "Starting Apache Kafka {} in Docker (testcontainers)…",
                testkit::KAFKA_VERSION
            );
            let kafka = testkit::kafka().await;
            if args.keep_broker {
                // Now rather than at the end: a failure further on keeps it as well.
                *kept_broker = kafka.keep_running(KEPT_NAME).await?;
                if kept_broker.is_none() {
                    println!(
                        "--keep-broker: this broker was not started here (ONCEFLOW_TEST_BOOTSTRAP); nothing to keep"
                    );
                }
            }
            kafka
        }
    };
    let brokers = kafka.bootstrap_servers().to_owned();
    println!("Kafka at {brokers}");
    kafka.create_topic("orders", PARTITIONS).await?;
    kafka.create_topic("invoices", PARTITIONS).await?;

    let orders = sample_orders(&args);
    let records: Vec<OutgoingRecord> = orders
        .iter()
        .flat_map(|order| {
            let copies = if args.duplicate_every > 0
                && order_number(order).is_multiple_of(args.duplicate_every)
            {
                2
            } else {
                1
            };
            std::iter::repeat_n(order, copies)
        })
        .map(|order| {
            let value = serde_json::to_vec(order).expect("an order serializes");
            OutgoingRecord::keyed(order.customer.clone(), value)
        })
        .collect();
    let produced = records.len() as u64;
    let (first_half, second_half) = records.split_at(records.len() / 2);
    kafka.produce("orders", first_half.to_vec()).await?;
    println!(
        "Produced {} orders, {} of them twice: {produced} records on `orders` ({} now, the rest while billing is down)",
        orders.len(),
        produced - orders.len() as u64,
        first_half.len()
    );

    let state = tempfile::tempdir()?;
    let log_path = state.path().join("billing.log");
    let bar = ProgressBar::new(produced).with_style(
        ProgressStyle::with_template("{msg:>18} [{bar:40}] {pos}/{len} orders processed")
            .expect("a valid template")
            .progress_chars("=> "),
    );

    // Run 1: killed with SIGKILL part-way through the first half.
    bar.set_message("billing, run 1");
    let mut run = Billing::start(&brokers, state.path(), &log_path)?;
    let kill_at = produced / 4;
    let reached = wait_for(kafka, &bar, &mut run, kill_at).await?;
    let killed_at = reached.min(produced);
    run.child.start_kill()?;
    run.child.wait().await?;
    let first_metrics = run.last_metrics.clone();
    bar.suspend(|| {
        println!("Killed billing with SIGKILL after {killed_at} of {produced} records (no shutdown, no flush); restarting it")
    });

    kafka.produce("orders", second_half.to_vec()).await?;

    // Run 2: a restart over the same state directory, until everything is processed.
    bar.set_message("billing, run 2");
    let mut run = Billing::start(&brokers, state.path(), &log_path)?;
    wait_for(kafka, &bar, &mut run, produced).await?;
    let final_metrics = scrape(run.metrics_port)
        .await
        .unwrap_or_else(|| run.last_metrics.clone());
    run.stop().await?;
    bar.finish_with_message("done");

    let verdict = check(kafka, &orders).await?;
    let metric = |m: &BTreeMap<String, f64>, name: &str| m.get(name).copied().unwrap_or(0.0) as u64;
    let skipped = metric(&first_metrics, "onceflow_duplicates_skipped_total")
        + metric(&final_metrics, "onceflow_duplicates_skipped_total");
    println!();
    println!(
        "orders produced              {produced} ({} distinct)",
        orders.len()
    );
    println!("invoices (read_committed)    {}", verdict.invoices);
    println!(
        "duplicates skipped           {skipped} (billing's /metrics, both runs; the first run's last scrape)"
    );
    println!("restarts                     1 (SIGKILL after {killed_at} records)");
    println!(
        "aborted invoice records      {} (written by open transactions, seen only by read_uncommitted readers)",
        verdict.uncommitted.saturating_sub(verdict.invoices)
    );
    println!(
        "customer totals              {} of {} right",
        verdict.customers_right, verdict.customers
    );
    // Keep billing's log for a look; the state directory goes.
    let kept = std::env::temp_dir().join("onceflow-quickstart-billing.log");
    if std::fs::copy(&log_path, &kept).is_ok() {
        println!("billing's log                {}", kept.display());
    }
    if verdict.problems.is_empty() {
        println!("exactly once: OK");
        Ok(true)
    } else {
        for problem in verdict.problems.iter().take(20) {
            println!("  {problem}");
        }
        println!("exactly once: FAILED ({} problems)", verdict.problems.len());
        Ok(false)
    }
}

fn sample_orders(args: &Args) -> Vec<Order> {
    (1..=args.orders)
        .map(|n| Order {
            id: format!("order-{n:06}"),
            customer: format!("customer-{:03}", n * 7 % args.customers.max(1)),
            amount_cents: (n * 7919 % 10_000) as i64 + 100,
        })
        .collect()
}

fn order_number(order: &Order) -> usize {
    order.id.trim_start_matches("order-").parse().unwrap_or(1)
}

/// The billing example running as a child process.
struct Billing {
    child: Child,
    metrics_port: u16,
    last_metrics: BTreeMap<String, f64>,
}

impl Billing {
    fn start(brokers: &str, state: &Path, log: &Path) -> Result<Billing, Failure> {
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let child = Command::new(std::env::current_exe()?)
            .env(ROLE, "billing")
            .args([
                "--brokers",
                brokers,
                "--group",
                GROUP,
                "--instance-id",
                "quickstart-1",
            ])
            .arg("--state-dir")
            .arg(state)
            .args(["--max-batch-records", "25", "--commit-interval", "50ms"])
            .args(["--metrics-address", &format!("127.0.0.1:{metrics_port}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Billing {
            child,
            metrics_port,
            last_metrics: BTreeMap::new(),
        })
    }

    /// SIGTERM: the runner finishes and commits its batch and exits.
    async fn stop(mut self) -> Result<(), Failure> {
        if let Some(pid) = self.child.id() {
            Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await?;
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => match status? {
                status if status.success() => Ok(()),
                status => Err(format!("billing exited with {status}; see its log").into()),
            },
            Err(_) => Err("billing did not stop within 30 s of SIGTERM".into()),
        }
    }
}

/// Waits until the group has committed `target` input records, moving the bar, and
/// returns how many it had. Fails when billing exits or stalls.
async fn wait_for(
    kafka: &Kafka,
    bar: &ProgressBar,
    run: &mut Billing,
    target: u64,
) -> Result<u64, Failure> {
    let mut last_change = Instant::now();
    let mut last = 0;
    loop {
        // Until billing has joined, the group has no coordinator yet: that reads as 0.
        let done: u64 = match kafka.committed_offsets(GROUP, "orders").await {
            Ok(offsets) => offsets.values().map(|o| o.unwrap_or(0).max(0) as u64).sum(),
            Err(error) if error.is_retriable() => last,
            Err(error) => return Err(error.into()),
        };
        bar.set_position(done);
        if let Some(metrics) = scrape(run.metrics_port).await {
            run.last_metrics = metrics;
        }
        if done >= target {
            return Ok(done);
        }
        if done != last {
            last = done;
            last_change = Instant::now();
        }
        if let Some(status) = run.child.try_wait()? {
            return Err(format!("billing exited early with {status}; see its log").into());
        }
        if last_change.elapsed() > Duration::from_secs(120) {
            return Err(format!("no progress for 120 s at {done} of {target} records").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The child's Prometheus counters, or `None` while its endpoint is not up.
async fn scrape(port: u16) -> Option<BTreeMap<String, f64>> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    Some(
        body.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                let name = name.split('{').next()?.to_owned();
                Some((name, value.parse().ok()?))
            })
            .collect(),
    )
}

/// What the independent reader found.
struct Verdict {
    invoices: usize,
    uncommitted: usize,
    customers: usize,
    customers_right: usize,
    problems: Vec<String>,
}

/// Reads `invoices` with a fresh `read_committed` consumer and compares it with the
/// orders: one invoice per distinct order, and each customer's last running total is
/// the sum of its distinct orders.
async fn check(kafka: &Kafka, orders: &[Order]) -> Result<Verdict, Failure> {
    let committed = kafka
        .read_to_end("invoices", Isolation::ReadCommitted)
        .await?;
    let uncommitted = kafka
        .read_to_end("invoices", Isolation::ReadUncommitted)
        .await?;
    let mut problems = Vec::new();
    let mut per_order: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_total: BTreeMap<String, i64> = BTreeMap::new();
    for record in &committed {
        let invoice: Invoice = serde_json::from_slice(record.value.as_deref().unwrap_or_default())?;
        *per_order.entry(invoice.order.clone()).or_default() += 1;
        // Invoices of a customer share its partition, so the last one read is the latest.
        last_total.insert(invoice.customer, invoice.customer_total_cents);
    }
    let mut expected_total: BTreeMap<String, i64> = BTreeMap::new();
    for order in orders {
        *expected_total.entry(order.customer.clone()).or_default() += order.amount_cents;
        match per_order.get(&order.id) {
            Some(1) => {}
            Some(n) => problems.push(format!("{} was invoiced {n} times", order.id)),
            None => problems.push(format!("{} was never invoiced", order.id)),
        }
    }
    let known: BTreeSet<&str> = orders.iter().map(|o| o.id.as_str()).collect();
    for id in per_order.keys().filter(|id| !known.contains(id.as_str())) {
        problems.push(format!("an invoice for unknown order {id}"));
    }
    let mut customers_right = 0;
    for (customer, expected) in &expected_total {
        match last_total.get(customer) {
            Some(total) if total == expected => customers_right += 1,
            total => problems.push(format!("{customer}: total {total:?}, expected {expected}")),
        }
    }
    Ok(Verdict {
        invoices: committed.len(),
        uncommitted: uncommitted.len(),
        customers: expected_total.len(),
        customers_right,
        problems,
    })
}
