//! The benchmark's smoke test: every contender starts, processes a tiny load and is
//! measured, and the report is well-formed. Nothing here is about speed.

use std::process::Command;

const CONTENDERS: [&str; 6] = [
    "a. raw rdkafka, auto-commit",
    "b. raw rdkafka, transactions",
    "c. onceflow at-most-once",
    "c. onceflow at-least-once",
    "c. onceflow exactly-once",
    "d. Kafka Streams exactly_once_v2",
];

const CONTENDER_IDS: [&str; 6] = [
    "raw",
    "raw-txn",
    "onceflow-amo",
    "onceflow-alo",
    "onceflow-eo",
    "streams-eos2",
];

/// The rows of the table under `heading`: cells of each line up to the next heading.
fn table<'a>(report: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    let start = report
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}` in the report:\n{report}"));
    report[start..]
        .lines()
        .skip(1)
        .take_while(|line| !line.starts_with("## "))
        .filter(|line| line.starts_with("| ") && !line.starts_with("| ---"))
        .skip(1)
        .map(|line| line.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect()
}

fn number(cell: &str) -> Option<f64> {
    cell.split_whitespace()
        .next()?
        .trim_end_matches('×')
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_contender_runs_and_the_report_is_well_formed() {
    // Starts (or reuses, with ONCEFLOW_TEST_BOOTSTRAP) the test broker in this process,
    // so the child driver does not start a second one.
    let kafka = onceflow_testkit::kafka().await;
    let out = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(env!("CARGO_BIN_EXE_onceflow-bench"))
        .args(["report", "--brokers", kafka.bootstrap_servers()])
        // Every contender but the Rust peers, which are cargo projects of their own: their
        // first build takes minutes (bench/peers/README.md). `peer_smoke.rs` runs one.
        .args(["--contenders", &CONTENDER_IDS.join(",")])
        .args([
            "--events",
            "300",
            "--latency-events",
            "100",
            "--latency-rate",
            "500",
        ])
        .args([
            "--partitions",
            "2",
            "--repeats",
            "1",
            "--no-sweeps",
            "--quiet",
        ])
        // A tiny restore measurement: the path is exercised, the figure means nothing.
        .args(["--restore-ids", "500", "--restore-keys", "50"])
        .args(["--run-timeout", "120"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("the driver runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the driver failed:\n{stderr}");

    let file = std::fs::read_dir(out.path())
        .expect("the output directory")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.extension().is_some_and(|e| e == "md"))
        .expect("a <date>.md report");
    let report = std::fs::read_to_string(&file).expect("the report reads");

    for (heading, columns) in [("## Throughput", 7), ("## Latency at", 8)] {
        let rows = table(&report, heading);
        for contender in CONTENDERS {
            let row = rows
                .iter()
                .find(|row| row[0] == contender)
                .unwrap_or_else(|| panic!("no row for {contender} under {heading}:\n{report}"));
            assert_eq!(row.len(), columns, "{heading}, {contender}: {row:?}");
            for cell in &row[1..] {
                let value = number(cell)
                    .unwrap_or_else(|| panic!("{heading}, {contender}: `{cell}` is no number"));
                assert!(value.is_finite() && value >= 0.0, "{contender}: {cell}");
            }
        }
    }
    // Every onceflow mode and Kafka Streams keep a changelog; a and b keep state in memory.
    let changelog = table(&report, "## Changelog written per input event");
    let rows: Vec<&str> = changelog.iter().map(|row| row[0]).collect();
    assert_eq!(rows, CONTENDERS[2..].to_vec(), "changelog rows:\n{report}");
    let exactly_once = &changelog[2];
    assert!(
        number(exactly_once[1]).is_some_and(|records| records >= 1.0),
        "a dedup entry per event at least: {exactly_once:?}"
    );
    let restore = table(&report, "## Restore");
    assert_eq!(restore.len(), 1, "one restore row:\n{report}");
    assert!(
        number(restore[0][0]).is_some_and(|records| records >= 500.0),
        "the restored changelog holds an entry per ID: {:?}",
        restore[0]
    );
    for cell in &restore[0][1..] {
        assert!(
            number(cell).is_some_and(|v| v.is_finite() && v >= 0.0),
            "restore: `{cell}` is no number"
        );
    }
    let targets = table(&report, "## Targets");
    assert_eq!(targets.len(), 12, "twelve targets:\n{report}");
    let measured = |i: usize| ["yes", "no"].contains(&targets[i][2]);
    // Without sweeps, the partition and instance scaling are not measured, and the Rust
    // peers are not asked for here. CPU per event (6) may round to nothing for b on a
    // load this small.
    for i in [0, 1, 2, 3, 4, 5, 7, 10] {
        assert!(measured(i), "target {i} measured:\n{report}");
    }
    for i in [8, 9, 11] {
        assert!(!measured(i), "target {i} not measured:\n{report}");
    }
    for chart in ["latency", "rss"] {
        let png = file.with_file_name(format!(
            "{}-{chart}.png",
            file.file_stem().and_then(|s| s.to_str()).expect("a date")
        ));
        let bytes = std::fs::read(&png).unwrap_or_else(|_| panic!("{} missing", png.display()));
        assert!(bytes.starts_with(b"\x89PNG"), "{} is a PNG", png.display());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_effects_benchmark_runs_and_applies_every_intent_once() {
    let kafka = onceflow_testkit::kafka().await;
    let out = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(env!("CARGO_BIN_EXE_onceflow-bench"))
        .args(["effects", "--brokers", kafka.bootstrap_servers()])
        .args([
            "--events",
            "200",
            "--latency-events",
            "100",
            "--rate",
            "200",
        ])
        .args(["--partitions", "2"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("the effects benchmark runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "it failed:\n{stderr}");
    let file = std::fs::read_dir(out.path())
        .expect("the output directory")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.to_string_lossy().ends_with("-effects.md"))
        .expect("a <date>-effects.md report");
    let report = std::fs::read_to_string(&file).expect("the report reads");
    let rows = table(&report, "# Effects benchmark");
    assert_eq!(rows.len(), 2, "keys and check-back:\n{report}");
    for row in rows {
        assert_eq!(row.len(), 5, "{row:?}");
        assert!(number(row[1]).is_some_and(|rate| rate > 0.0), "{row:?}");
        // 300 intents, each applied once: no request repeated in a run without faults.
        assert_eq!(row[4], "300 / 300", "{row:?}");
    }
}
