//! The Rust peers: other Rust frameworks' exactly-once pipelines doing the same work, each a
//! cargo project of its own under `bench/peers/` (outside the workspace: its own lockfile,
//! its own target directory), built on demand by `report` like the Kafka Streams jar.
//!
//! A peer that cannot be built, or fails while it runs, does not fail the report: the
//! report says why, from the build's or the run's own error.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::driver::System;

/// One peer contender.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// Its contender.
    pub system: System,
    /// What runs, for the report: the crate, its version and the API used.
    pub what: &'static str,
    /// Its cargo project, relative to `bench/`.
    pub project: &'static str,
    /// The binary the project builds.
    pub binary: &'static str,
}

/// Every peer, in table order.
pub const PEERS: [Peer; 1] = [Peer {
    system: System::RustStream,
    what: "ruststream-rdkafka 0.7.1 on ruststream 0.7.7: a `#[subscriber]` handler with \
           `Commit::Transactional`, its reply through `EosPublish` + `EosReplies` (one \
           transaction per commit interval, offsets by `send_offsets_to_transaction`), one \
           worker lane per input partition; no batch limit (windows close on the interval)",
    project: "peers/ruststream",
    binary: "onceflow-bench-ruststream",
}];

/// The peer behind `system`, if it is one.
pub fn peer(system: System) -> Option<&'static Peer> {
    PEERS.iter().find(|peer| peer.system == system)
}

/// Where the peers are built: `$ONCEFLOW_PEERS_TARGET_DIR`, else `peers-target` beside
/// `$CARGO_TARGET_DIR`, else `target/peers` in the workspace. Never the workspace's own
/// target directory, whose lock a running `cargo run` holds.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ONCEFLOW_PEERS_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(dir);
        return dir
            .parent()
            .map_or_else(|| dir.join("peers"), |parent| parent.join("peers-target"));
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers")
}

/// Builds `peer` (release, `--locked`: the project's lockfile as committed) and returns
/// its binary, or why it could not be built: the tail of cargo's own output.
pub fn build(peer: &Peer, quiet: bool) -> Result<PathBuf, String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(peer.project)
        .join("Cargo.toml");
    let target = target_dir();
    if !quiet {
        eprintln!(
            "building the {} contender (cargo build --release in bench/{})…",
            peer.system.id(),
            peer.project
        );
    }
    let output = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--manifest-path",
        ])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "`cargo build --release --locked` in bench/{} failed: {}",
            peer.project,
            tail(&String::from_utf8_lossy(&output.stderr), 6)
        ));
    }
    let binary = target.join("release").join(peer.binary);
    if binary.exists() {
        Ok(binary)
    } else {
        Err(format!("the build made no {}", binary.display()))
    }
}

/// The last `lines` non-empty lines of `text`, joined by ` / ` (a report cell's worth).
pub fn tail(text: &str, lines: usize) -> String {
    let kept: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    kept[kept.len().saturating_sub(lines)..].join(" / ")
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn a_tail_keeps_the_last_lines() {
        assert_eq!(tail("a\n\n b \nc\nd\n", 3), "b / c / d");
        assert_eq!(tail("only", 6), "only");
        assert_eq!(tail("", 2), "");
    }
}
