//! The bank transfer example end to end: money is conserved, no transfer is applied
//! twice however often it is delivered, no balance goes negative, through a SIGKILL.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Deployment, committed_values};
use onceflow_testkit::OutgoingRecord;
use serde::Deserialize;

#[derive(Deserialize, Debug)]
struct Entry {
    transfer: String,
    account: String,
    change: i64,
    balance: i64,
}

#[derive(Deserialize, Debug)]
struct Rejection {
    transfer: String,
}

fn request(id: &str, ledger: &str, from: Option<&str>, to: &str, amount: i64) -> OutgoingRecord {
    let value = serde_json::json!({ "id": id, "ledger": ledger, "from": from, "to": to, "amount_cents": amount });
    OutgoingRecord::keyed(ledger.to_owned(), value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_conserve_money_and_apply_once_through_a_kill() {
    let topics = [
        ("transfer-requests", 2),
        ("ledger-entries", 2),
        ("rejected-transfers", 2),
    ];
    let deployment = Deployment::new("bank_transfer", &topics, 15).await;
    let kafka = deployment.kafka;

    // Four ledgers of five accounts: a deposit of 1,000 each, then 300 transfers of
    // amounts that often exceed what the payer has; every third request is sent twice.
    let mut requests = Vec::new();
    let mut deposits = 0i64;
    for ledger in 0..4 {
        for account in 0..5 {
            let id = format!("deposit-{ledger}-{account}");
            requests.push(request(
                &id,
                &format!("l{ledger}"),
                None,
                &format!("a{account}"),
                1_000,
            ));
            deposits += 1_000;
        }
    }
    for n in 0..300usize {
        let ledger = format!("l{}", n % 4);
        let (from, to) = (format!("a{}", n % 5), format!("a{}", (n * 3 + 1) % 5));
        let amount = (n * 37 % 900) as i64 + 1;
        let id = format!("t{n}");
        requests.push(request(&id, &ledger, Some(&from), &to, amount));
        if n % 3 == 0 {
            requests.push(request(&id, &ledger, Some(&from), &to, amount));
        }
    }
    let produced = requests.len() as u64;
    let distinct = 20 + 300;
    kafka
        .produce("transfer-requests", requests)
        .await
        .expect("produce");

    let run = deployment.start();
    deployment
        .wait_for("transfer-requests", produced / 2, &run)
        .await;
    run.kill().await;
    let run = deployment.start();
    deployment
        .wait_for("transfer-requests", produced, &run)
        .await;
    run.terminate().await;

    let entries: Vec<Entry> = committed_values(kafka, "ledger-entries").await;
    let rejections: Vec<Rejection> = committed_values(kafka, "rejected-transfers").await;
    let mut applied: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for entry in &entries {
        applied
            .entry(entry.transfer.as_str())
            .or_default()
            .push(entry);
        assert!(entry.balance >= 0, "negative balance: {entry:?}");
    }
    // Every transfer applied other than once, with both instances' logs: a violation
    // seen once in CI (t0 applied twice, the second time over the first's balances) is
    // not reproduced here, and the log is what tells which instance did what.
    let wrong: Vec<(&&str, &Vec<&Entry>)> = applied
        .iter()
        .filter(|(transfer, sides)| {
            sides.len()
                != if transfer.starts_with("deposit") {
                    1
                } else {
                    2
                }
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} transfers applied other than once, the first: {:?}\nthe instances' log:\n{}",
        wrong.len(),
        wrong.first(),
        std::fs::read_to_string(&deployment.log).unwrap_or_default()
    );
    for (transfer, sides) in &applied {
        let expected_sides = if transfer.starts_with("deposit") {
            1
        } else {
            2
        };
        if expected_sides == 2 {
            assert_eq!(
                sides[0].change + sides[1].change,
                0,
                "{transfer} created or lost money"
            );
        }
    }
    let rejected: BTreeSet<&str> = rejections.iter().map(|r| r.transfer.as_str()).collect();
    assert_eq!(
        rejected.len(),
        rejections.len(),
        "a transfer rejected twice"
    );
    assert!(
        rejected.iter().all(|t| !applied.contains_key(t)),
        "a transfer both applied and rejected"
    );
    assert_eq!(
        applied.len() + rejected.len(),
        distinct,
        "every request decided exactly once"
    );
    assert!(
        !rejected.is_empty(),
        "the workload should overdraw some accounts"
    );

    // Conservation: all changes add up to the deposits, and each account's running
    // balance is the sum of its changes (entries of a ledger share a partition, in order).
    let total_change: i64 = entries.iter().map(|e| e.change).sum();
    assert_eq!(total_change, deposits, "money was created or destroyed");
    let ledger_of = |transfer: &str| -> String {
        match transfer.strip_prefix("deposit-") {
            Some(rest) => format!("l{}", &rest[..rest.find('-').unwrap_or(rest.len())]),
            None => format!("l{}", transfer[1..].parse::<usize>().unwrap_or(0) % 4),
        }
    };
    let mut balances: BTreeMap<(String, &str), i64> = BTreeMap::new();
    for entry in &entries {
        let balance = balances
            .entry((ledger_of(&entry.transfer), entry.account.as_str()))
            .or_default();
        *balance += entry.change;
        assert_eq!(
            *balance, entry.balance,
            "running balance wrong at {entry:?}"
        );
    }
    assert_eq!(balances.values().sum::<i64>(), deposits);
}
