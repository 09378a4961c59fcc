//! The Rust peers on a tiny load, next to contender b: each builds (minutes the first
//! time, in its own target directory), runs and is measured, or the report says why
//! not. Ignored by default, so CI does not build them:
//!
//! ```text
//! cargo test --release -p onceflow-bench --test peer_smoke -- --ignored
//! ```

use std::process::Command;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "builds the Rust peers in bench/peers/ (minutes); run with --ignored"]
async fn every_rust_peer_runs_or_the_report_says_why() {
    let kafka = onceflow_testkit::kafka().await;
    let out = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(env!("CARGO_BIN_EXE_onceflow-bench"))
        .args(["report", "--brokers", kafka.bootstrap_servers()])
        .args(["--contenders", "raw-txn,onceflow-eo,ruststream-eo"])
        .args(["--events", "300", "--latency-events", "100"])
        .args(["--latency-rate", "500", "--partitions", "2"])
        .args(["--repeats", "1", "--no-sweeps", "--restore-ids", "0"])
        .args(["--no-charts", "--quiet", "--run-timeout", "120"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("the driver runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the driver failed:\n{stderr}");
    let report = String::from_utf8_lossy(&output.stdout);
    let peers = report
        .split("## Rust peers")
        .nth(1)
        .unwrap_or_else(|| panic!("no Rust peers section:\n{report}"));
    let label = "e. ruststream-rdkafka exactly-once";
    assert!(peers.contains(label), "{label} described:\n{report}");
    let ran = report
        .lines()
        .any(|line| line.starts_with(&format!("| {label} |")));
    let said_why = peers
        .split("## ")
        .next()
        .is_some_and(|section| section.contains("**Not run here**"));
    assert!(ran != said_why, "either a row or a reason:\n{report}");
    let row = report
        .lines()
        .find(|line| line.starts_with("| onceflow leads the Rust peers"))
        .expect("the peers' target row");
    if ran {
        assert!(row.contains("vs ruststream-eo"), "{row}");
    }
}
