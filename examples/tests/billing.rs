//! The billing example end to end against the real broker: duplicates, a SIGKILL and a
//! restart, a graceful SIGTERM, `/healthz` and `/metrics`, `inspect` and `dlq replay`.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Deployment, committed_values, total};
use onceflow_testkit::{self as testkit, OutgoingRecord};
use serde::Deserialize;

#[derive(Deserialize, Debug)]
struct Invoice {
    order: String,
    customer: String,
    amount_cents: i64,
    customer_total_cents: i64,
}

fn order(n: usize) -> OutgoingRecord {
    let customer = format!("c{}", n % 7);
    let value = serde_json::json!({ "id": format!("o{n}"), "customer": customer, "amount_cents": n as i64 });
    OutgoingRecord::keyed(customer, value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_invoices_every_order_once_through_a_kill_and_a_restart() {
    let deployment = Deployment::new("billing", &[("orders", 3), ("invoices", 3)], 20).await;
    let (kafka, group) = (deployment.kafka, &deployment.group);

    // 600 orders, every 5th sent twice, plus one record that does not decode.
    let mut records: Vec<OutgoingRecord> = Vec::new();
    for n in 0..600 {
        records.push(order(n));
        if n % 5 == 0 {
            records.push(order(n));
        }
    }
    records.insert(300, OutgoingRecord::keyed("c1", "not json"));
    let produced = records.len() as u64;
    // The rest is sent only after the kill, so the restarted instance has work of its
    // own however fast the first one was (it once finished everything before the test
    // saw a third of it committed, and the restart's counters stayed at 0).
    let rest = records.split_off(400);
    kafka.produce("orders", records).await.expect("produce");

    let run = deployment.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.get("/healthz").await.map(|(code, _)| code) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "never ready; log:\n{}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    deployment.wait_for("orders", 200, &run).await;
    run.kill().await;
    kafka.produce("orders", rest).await.expect("produce");

    // Statistics (the source of the lag gauge) every 200 ms instead of every 5 s.
    let run = deployment.start_with(&["--kafka", "statistics.interval.ms=200"]);
    deployment.wait_for("orders", produced, &run).await;
    // Consumer lag per partition, from librdkafka's statistics: caught up means 0 on each.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = run.metrics().await;
        let lags: Vec<f64> = (0..3)
            .filter_map(|p| {
                metrics
                    .iter()
                    .find(|(k, _)| {
                        k.starts_with("onceflow_consumer_lag{")
                            && k.contains(&format!("partition=\"{p}\""))
                    })
                    .map(|(_, v)| *v)
            })
            .collect();
        if lags == [0.0, 0.0, 0.0] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "consumer lag per partition never reached 0 after catching up: {lags:?}\n{metrics:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = run.metrics().await;
    assert!(
        total(&metrics, "onceflow_records_in_total") > 0.0,
        "{metrics:?}"
    );
    assert!(
        total(&metrics, "onceflow_commits_total") > 0.0,
        "{metrics:?}"
    );
    for histogram in [
        "onceflow_commit_seconds_count",
        "onceflow_batch_records_count",
        "onceflow_batch_stage_seconds_count",
    ] {
        assert!(
            total(&metrics, histogram) > 0.0,
            "{histogram} missing: {metrics:?}"
        );
    }
    assert!(
        metrics.keys().any(|k| k.starts_with("onceflow_ready{")),
        "{metrics:?}"
    );
    assert!(
        metrics
            .keys()
            .any(|k| k.contains(&format!("group=\"{group}\""))),
        "{metrics:?}"
    );
    run.terminate().await;

    // Exactly once, by an independent read_committed reader.
    let invoices: Vec<Invoice> = committed_values(kafka, "invoices").await;
    let mut per_order: BTreeMap<&str, usize> = BTreeMap::new();
    let mut last_total: BTreeMap<&str, i64> = BTreeMap::new();
    for invoice in &invoices {
        *per_order.entry(invoice.order.as_str()).or_default() += 1;
        last_total.insert(invoice.customer.as_str(), invoice.customer_total_cents);
    }
    assert_eq!(per_order.len(), 600, "one invoice per distinct order");
    assert!(
        per_order.values().all(|&n| n == 1),
        "no order invoiced twice"
    );
    for customer in 0..7 {
        let expected: i64 = (0..600)
            .filter(|n| n % 7 == customer)
            .map(|n| n as i64)
            .sum();
        assert_eq!(
            last_total.get(format!("c{customer}").as_str()),
            Some(&expected)
        );
    }
    assert_eq!(
        invoices.iter().map(|i| i.amount_cents).sum::<i64>(),
        (0..600).sum::<i64>()
    );

    // inspect: the stopped instance's log holds one dedup entry per distinct order.
    let text = deployment.subcommand(&["inspect"]);
    let dedup: u64 = text
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    assert_eq!(
        dedup, 600,
        "inspect should count 600 dedup entries:\n{text}"
    );

    // dlq replay: the record that did not decode was dead-lettered once; replay it.
    let target = testkit::unique_name("orders-fixed");
    kafka.create_topic(&target, 1).await.expect("target");
    let text = deployment.subcommand(&["dlq", "replay", "--to-topic", &target]);
    assert!(
        text.contains("replayed 1 dead-lettered record(s)"),
        "{text}"
    );
    let replayed = kafka
        .read_to_end(&target, testkit::Isolation::ReadCommitted)
        .await
        .expect("read");
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].value.as_deref(), Some(&b"not json"[..]));
}

/// The same binary against other topics (issue 16, part 3): `--input` replaces the
/// declared `orders`, `--output invoices=…` sends `Billing::INVOICES` elsewhere, and
/// `verify-config` shows both renames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_reads_and_writes_the_topics_it_is_configured_with() {
    let orders = testkit::unique_name("staging.orders");
    let invoices = testkit::unique_name("staging.invoices");
    let deployment = Deployment::new("billing", &[(&orders, 2), (&invoices, 2)], 20).await;
    let kafka = deployment.kafka;
    let rename = format!("invoices={invoices}");
    let topics = ["--input", orders.as_str(), "--outputs", rename.as_str()];

    let shown = deployment.subcommand(&[&topics[..], &["verify-config"]].concat());
    assert!(
        shown.contains(&format!("input  orders -> {orders}  (renamed)"))
            && shown.contains(&format!("output invoices -> {invoices}  (renamed)")),
        "{shown}"
    );

    let records: Vec<OutgoingRecord> = (0..50).chain(0..10).map(order).collect();
    kafka.produce(&orders, records).await.expect("produce");
    let run = deployment.start_with(&topics);
    deployment.wait_for(&orders, 60, &run).await;
    run.terminate().await;

    let mut invoiced: Vec<String> = committed_values::<Invoice>(kafka, &invoices)
        .await
        .into_iter()
        .map(|invoice| invoice.order)
        .collect();
    invoiced.sort();
    let mut want: Vec<String> = (0..50).map(|n| format!("o{n}")).collect();
    want.sort();
    assert_eq!(
        invoiced, want,
        "each order invoiced once, on the configured topic"
    );
}
