//! The fraud check end to end against the real broker: minutes of event time handed
//! over exactly once, with exact tallies and alerts, through a SIGKILL and a restart.

mod common;

use std::collections::BTreeMap;

use common::{Deployment, committed_values};
use onceflow_testkit::OutgoingRecord;
use serde::Deserialize;

const MINUTE: i64 = 60_000;
const CARDS: u32 = 12;
const MINUTES: i64 = 8;

#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
struct CardMinute {
    card: String,
    minute_start_ms: i64,
    payments: u32,
    total_cents: i64,
}

fn payment(id: &str, card: &str, cents: i64, at_ms: i64) -> OutgoingRecord {
    let value = serde_json::json!({ "id": id, "card": card, "amount_cents": cents });
    OutgoingRecord::keyed(card, value.to_string()).at_ms(at_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_card_minute_is_reported_once_through_a_kill() {
    let deployment = Deployment::new(
        "fraud_check",
        &[("payments", 3), ("card-minutes", 3), ("fraud-alerts", 3)],
        20,
    )
    .await;
    let kafka = deployment.kafka;
    // Event time starts at a round minute; card c0 pays 8 times a minute (flagged), the
    // others 1 to 3 times; one payment in ten is sent twice (a producer's retry).
    let base = 1_767_225_600_000; // 2026-01-01T00:00:00Z
    let mut records = Vec::new();
    let mut expected: BTreeMap<(String, i64), (u32, i64)> = BTreeMap::new();
    let mut n = 0u32;
    for minute in 0..MINUTES {
        for card in 0..CARDS {
            let count = if card == 0 {
                8
            } else {
                1 + (card + minute as u32) % 3
            };
            for i in 0..count {
                let at = base + minute * MINUTE + i64::from(i) * 7_000 + i64::from(card) * 100;
                let card_name = format!("c{card}");
                let cents = i64::from(100 + card * 10 + i);
                let record = payment(&format!("p-{n}"), &card_name, cents, at);
                if n % 10 == 3 {
                    records.push(record.clone());
                }
                records.push(record);
                n += 1;
                let tally = expected
                    .entry((card_name, base + minute * MINUTE))
                    .or_default();
                tally.0 += 1;
                tally.1 += cents;
            }
        }
    }
    // The event time of every partition moves past the last minute's end plus grace:
    // every card pays once more, two minutes later (those minutes stay open).
    for card in 0..CARDS {
        records.push(payment(
            &format!("flush-{card}"),
            &format!("c{card}"),
            1,
            base + (MINUTES + 2) * MINUTE,
        ));
    }
    let produced = records.len() as u64;
    let rest = records.split_off(records.len() / 2);
    kafka.produce("payments", records).await.expect("produce");

    let run = deployment.start();
    deployment.wait_for("payments", produced / 4, &run).await;
    run.kill().await;
    kafka.produce("payments", rest).await.expect("produce");
    let run = deployment.start();
    deployment.wait_for("payments", produced, &run).await;
    run.terminate().await;

    let minutes: Vec<CardMinute> = committed_values(kafka, "card-minutes").await;
    let mut seen: BTreeMap<(String, i64), Vec<(u32, i64)>> = BTreeMap::new();
    for m in &minutes {
        seen.entry((m.card.clone(), m.minute_start_ms))
            .or_default()
            .push((m.payments, m.total_cents));
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, v)| v.len() > 1).take(5).collect();
    assert!(doubled.is_empty(), "minutes reported twice: {doubled:?}");
    let got: BTreeMap<(String, i64), (u32, i64)> =
        seen.into_iter().map(|(k, v)| (k, v[0])).collect();
    assert_eq!(got.len(), expected.len(), "every card minute reported");
    assert_eq!(got, expected, "tallies exact");

    let alerts: Vec<CardMinute> = committed_values(kafka, "fraud-alerts").await;
    let flagged: Vec<(&str, i64)> = alerts
        .iter()
        .map(|a| (a.card.as_str(), a.minute_start_ms))
        .collect();
    let want: Vec<(&str, i64)> = (0..MINUTES).map(|m| ("c0", base + m * MINUTE)).collect();
    let mut flagged_sorted = flagged.clone();
    flagged_sorted.sort();
    assert_eq!(
        flagged_sorted, want,
        "c0 flagged once per minute, nobody else"
    );
}
