//! Running the example binaries against the test broker.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use onceflow_testkit::{Isolation, Kafka};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// The path of an example binary: `cargo test` builds every example before it runs the
/// tests, into `target/<profile>/examples/`, next to this test's `deps/` directory.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` (which builds the examples first)",
        path.display()
    );
    path
}

/// A free local port for a child's metrics endpoint.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// An example running as a child process, with its stderr kept in a file.
pub struct Running {
    pub child: Child,
    pub metrics_port: u16,
    pub log: PathBuf,
}

impl Running {
    /// Starts example `name` with `args` and a metrics endpoint on a free port.
    pub fn start(name: &str, args: &[&str], log: &Path) -> Running {
        let metrics_port = free_port();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = Command::new(example(name))
            .args(args)
            .args(["--metrics-address", &format!("127.0.0.1:{metrics_port}")])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("the example starts");
        Running {
            child,
            metrics_port,
            log: log.to_owned(),
        }
    }

    /// SIGKILL, like a power cut.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("kill");
        self.child.wait().await.expect("wait");
    }

    /// Sends SIGTERM and returns at once.
    pub async fn signal_term(&self) {
        let pid = self.child.id().expect("running");
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .expect("kill -TERM");
        assert!(sent.success());
    }

    /// SIGTERM, then a clean exit within 30 s; otherwise the test fails with the log
    /// (the only account of why: a repeat run once saw a failed exit with nothing
    /// else to go on).
    pub async fn terminate(mut self) {
        self.signal_term().await;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("no exit within 30 s of SIGTERM; log:\n{}", self.log_text()))
            .expect("wait");
        assert!(
            status.success(),
            "SIGTERM should stop it cleanly: {status}; log:\n{}",
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path` on the metrics endpoint: status code and body.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.metrics_port, path).await
    }

    /// The Prometheus samples, by name with labels.
    pub async fn metrics(&self) -> BTreeMap<String, f64> {
        let (_, body) = self.get("/metrics").await.unwrap_or_default();
        body.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }
}

/// A minimal HTTP/1.0 GET.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The sum of `metric` over its samples (all label sets).
pub fn total(metrics: &BTreeMap<String, f64>, metric: &str) -> f64 {
    metrics
        .iter()
        .filter(|(name, _)| name.split('{').next() == Some(metric))
        .map(|(_, value)| value)
        .sum()
}

/// Input records `group` has committed on `topic`.
pub async fn committed(kafka: &Kafka, group: &str, topic: &str) -> u64 {
    match kafka.committed_offsets(group, topic).await {
        Ok(offsets) => offsets.values().map(|o| o.unwrap_or(0).max(0) as u64).sum(),
        Err(_) => 0,
    }
}

/// Waits until `group` has committed `target` records of `topic`, or fails with the log.
pub async fn wait_for_committed(
    kafka: &Kafka,
    group: &str,
    topic: &str,
    target: u64,
    run: &Running,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = committed(kafka, group, topic).await;
        if done >= target {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{group} committed {done} of {target} records of {topic} in 120 s; log:\n{}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Values of `topic` under read_committed, parsed as JSON.
pub async fn committed_values<T: serde::de::DeserializeOwned>(
    kafka: &Kafka,
    topic: &str,
) -> Vec<T> {
    kafka
        .read_to_end(topic, Isolation::ReadCommitted)
        .await
        .expect("read")
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("json"))
        .collect()
}

/// One example deployed against the test broker: its topics, its own group and state
/// directory, and the command line every instance of it gets.
pub struct Deployment {
    pub kafka: &'static Kafka,
    pub example: &'static str,
    pub group: String,
    pub state: tempfile::TempDir,
    pub log: PathBuf,
    max_batch_records: usize,
}

impl Deployment {
    /// Creates `topics` (name, partitions) and picks a fresh group; batches stay small
    /// so that a kill lands in the middle of the work.
    pub async fn new(
        example: &'static str,
        topics: &[(&str, i32)],
        max_batch_records: usize,
    ) -> Deployment {
        let kafka = onceflow_testkit::kafka().await;
        for (topic, partitions) in topics {
            kafka
                .create_topic(topic, *partitions)
                .await
                .expect("create topic");
        }
        let state = tempfile::tempdir().expect("state dir");
        let log = state.path().join(format!("{example}.log"));
        Deployment {
            kafka,
            example,
            group: onceflow_testkit::unique_name(example),
            state,
            log,
            max_batch_records,
        }
    }

    /// Brokers, group, instance ID and state directory: what every subcommand needs.
    pub fn instance_args(&self) -> Vec<String> {
        let state = self.state.path().to_str().expect("utf-8 path");
        [
            "--brokers",
            self.kafka.bootstrap_servers(),
            "--group",
            &self.group,
            "--instance-id",
            "e2e",
            "--state-dir",
            state,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Starts an instance, with small batches and a metrics endpoint.
    pub fn start(&self) -> Running {
        self.start_with(&[])
    }

    /// [`Deployment::start`] with `extra` arguments.
    pub fn start_with(&self, extra: &[&str]) -> Running {
        let mut args = self.instance_args();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args.extend([
            "--max-batch-records".into(),
            self.max_batch_records.to_string(),
        ]);
        args.extend(
            [
                "--commit-interval",
                "50ms",
                "--kafka",
                "session.timeout.ms=6000",
            ]
            .map(str::to_owned),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Running::start(self.example, &args, &self.log)
    }

    /// Runs a subcommand (`extra` after the instance arguments) to its end: stdout, or a
    /// panic with both streams.
    pub fn subcommand(&self, extra: &[&str]) -> String {
        let output = std::process::Command::new(example(self.example))
            .args(self.instance_args())
            .args(["--metrics-address", "off"])
            .args(extra)
            .output()
            .expect("the example runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{extra:?} failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    /// Waits until the group has committed `target` records of `topic`.
    pub async fn wait_for(&self, topic: &str, target: u64, run: &Running) {
        wait_for_committed(self.kafka, &self.group, topic, target, run).await;
    }
}
