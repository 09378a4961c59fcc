//! The word count example end to end: each line counted once through a SIGKILL, with
//! lines that carry no event ID (deduplicated by offset).

mod common;

use std::collections::BTreeMap;

use common::{Deployment, committed_values};
use onceflow_testkit::OutgoingRecord;
use serde::Deserialize;

#[derive(Deserialize, Debug)]
struct WordCount {
    word: String,
    count: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_word_is_counted_once_through_a_kill() {
    let deployment = Deployment::new("word_count", &[("lines", 1), ("word-counts", 1)], 10).await;
    let kafka = deployment.kafka;
    let texts = [
        "the quick brown fox",
        "jumps over the lazy dog",
        "The dog sleeps; the fox runs!",
    ];
    let lines: Vec<OutgoingRecord> = (0..400)
        .map(|n| {
            OutgoingRecord::keyed(
                "doc",
                serde_json::json!({ "text": texts[n % 3] }).to_string(),
            )
        })
        .collect();
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for n in 0..400 {
        for word in texts[n % 3]
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            *expected.entry(word.to_lowercase()).or_default() += 1;
        }
    }
    kafka.produce("lines", lines).await.expect("produce");

    let run = deployment.start();
    deployment.wait_for("lines", 150, &run).await;
    run.kill().await;
    let run = deployment.start_with(&["--log-format", "json"]);
    deployment.wait_for("lines", 400, &run).await;
    run.terminate().await;

    // The restarted instance logged JSON, one object per line.
    let log = std::fs::read_to_string(&deployment.log).expect("log");
    let json: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        json.iter()
            .any(|v| v["message"] == "engine started" && v["level"] == "INFO"),
        "no JSON `engine started` line in:\n{log}"
    );

    let counts: Vec<WordCount> = committed_values(kafka, "word-counts").await;
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    let mut emitted: BTreeMap<&str, u64> = BTreeMap::new();
    for count in &counts {
        let previous = last.insert(count.word.as_str(), count.count).unwrap_or(0);
        assert_eq!(
            count.count,
            previous + 1,
            "{} counted out of order or twice",
            count.word
        );
        *emitted.entry(count.word.as_str()).or_default() += 1;
    }
    let last: BTreeMap<String, u64> = last.into_iter().map(|(w, c)| (w.to_owned(), c)).collect();
    assert_eq!(last, expected);
    assert_eq!(
        emitted.values().sum::<u64>(),
        expected.values().sum::<u64>()
    );
}
