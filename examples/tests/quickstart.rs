//! The quickstart as a user runs it: no arguments, its own broker, a SIGKILL half-way,
//! and the verdict of its independent read_committed check.

mod common;

use std::process::Command;

#[test]
fn the_quickstart_runs_end_to_end_and_finds_exactly_once() {
    let output = Command::new(common::example("quickstart"))
        .args(["--orders", "1500"])
        .output()
        .expect("the quickstart runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("exactly once: OK"), "{stdout}");
    assert!(
        stdout.contains("invoices (read_committed)    1500"),
        "{stdout}"
    );
    assert!(stdout.contains("Killed billing with SIGKILL"), "{stdout}");
}
