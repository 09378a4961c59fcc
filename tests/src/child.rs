//! The `sum_processor` binary as a child process, to be killed and restarted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// An instance's log unless `RUST_LOG` says otherwise: warnings, and what recovery,
/// the changelog's replay and the engine's loop decide about positions (where catching
/// up found each partition, how far a replay read, where the consumer was sought). Those
/// are a few lines per recovery, and what an exactly-once failure of the fault matrix
/// needs to explain itself: the repeat runs' one loss (`tests/RESULTS.md`, ninth
/// session) had warnings only, and the decision that skipped the records was not in it.
pub const INSTANCE_LOG: &str = "onceflow=warn,onceflow::engine::recovery=info,onceflow::engine::changelog=info,onceflow::engine::serve=info";

/// How to start one instance.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Path of the `sum_processor` binary.
    pub binary: PathBuf,
    /// Broker address.
    pub brokers: String,
    /// Consumer group.
    pub group: String,
    /// Instance ID.
    pub instance: String,
    /// Input topic.
    pub input: String,
    /// Output topic.
    pub output: String,
    /// State directory root.
    pub state_dir: PathBuf,
    /// Extra environment (e.g. `FAILPOINTS`, `SUM_DELIVERY`).
    pub env: Vec<(String, String)>,
    /// The user it runs as, when not the test's own (see [`Instance::as_own_user`]).
    pub user: Option<u32>,
}

impl Instance {
    /// Starts it, its log on the test's standard error.
    pub fn spawn(&self) -> Running {
        self.spawn_with_log(Stdio::inherit())
    }

    /// Starts it with its log (standard error, at `RUST_LOG` or [`INSTANCE_LOG`]) copied
    /// to the file `log`, for a test that reads what it said; the test's standard error
    /// gets every line too, so a failing run still shows it.
    pub fn spawn_logging_to(&self, log: &Path) -> Running {
        use std::io::{BufRead, Write};
        let mut file = std::fs::File::create(log).expect("log file");
        let mut running = self.spawn_with_log(Stdio::piped());
        let stderr = running.child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                let _ = writeln!(file, "{line}");
            }
        });
        running
    }

    fn spawn_with_log(&self, log: Stdio) -> Running {
        let mut command = Command::new(&self.binary);
        command
            .env("SUM_BROKERS", &self.brokers)
            .env("SUM_GROUP", &self.group)
            .env("SUM_INSTANCE", &self.instance)
            .env("SUM_INPUT", &self.input)
            .env("SUM_OUTPUT", &self.output)
            .env("SUM_STATE_DIR", &self.state_dir)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| INSTANCE_LOG.into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        if let Some(user) = self.user {
            use std::os::unix::process::CommandExt;
            command.uid(user).gid(user);
        }
        Running {
            child: command.spawn().expect("spawn sum_processor"),
            user: self.user,
        }
    }

    /// The same instance run as a user of its own (a fresh UID that owns its state
    /// directory), so that [`Running::cut_off_for`] can take its network away while it
    /// keeps running. Needs root (the tests run as root in CI, as Docker does).
    pub fn as_own_user(&self) -> Instance {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        // Apart from other test binaries' users: each binary has its own process ID.
        let user = 40_000
            + (std::process::id() % 1_000) * 16
            + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 16;
        std::fs::create_dir_all(&self.state_dir).expect("state dir");
        std::os::unix::fs::chown(&self.state_dir, Some(user), Some(user))
            .expect("chown the state dir (running as a user of its own needs root)");
        Instance {
            user: Some(user),
            ..self.clone()
        }
    }

    /// The same instance with one more environment variable.
    pub fn with_env(&self, key: &str, value: &str) -> Instance {
        let mut copy = self.clone();
        copy.env.push((key.to_owned(), value.to_owned()));
        copy
    }

    /// This instance's state directory.
    pub fn instance_dir(&self) -> PathBuf {
        self.state_dir.join(&self.group).join(&self.instance)
    }
}

/// A running instance. Dropped while still running (a failed assertion, an early `?`),
/// it is killed, so no instance outlives its test: one the fault matrix left behind
/// when a heal failed was still running, using CPU, minutes into the next suite.
#[derive(Debug)]
pub struct Running {
    child: Child,
    user: Option<u32>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Running {
    /// SIGKILL, and wait for it to be gone.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks for a graceful stop (closes its stdin) and returns its counters.
    pub fn stop(mut self, within: Duration) -> serde_json::Value {
        drop(self.child.stdin.take());
        self.counters(within, "its stdin closed")
    }

    /// SIGTERM, as an orchestrator stops a pod: a graceful exit with its counters.
    pub fn terminate(self, within: Duration) -> serde_json::Value {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(sent.success(), "kill -TERM failed");
        self.counters(within, "SIGTERM")
    }

    /// Freezes it for `stall` (SIGSTOP, then SIGCONT): every thread stops, librdkafka's
    /// heartbeats too, as in a long GC pause, a VM stall or a cut network. Past the
    /// session timeout its partitions move, and it wakes as a zombie in mid-batch.
    pub fn freeze_for(&self, stall: Duration) {
        let signal = |name: &str| {
            let sent = Command::new("kill")
                .args([name, &self.child.id().to_string()])
                .status()
                .expect("kill");
            assert!(sent.success(), "kill {name} failed");
        };
        signal("-STOP");
        std::thread::sleep(stall);
        signal("-CONT");
    }

    /// Cuts its network for `cut` while it keeps running: every connection it has or
    /// opens goes silent both ways (no reset, no refusal: packets vanish, as behind a
    /// failed link), then comes back. Its heartbeats stop reaching the group, so past the
    /// session timeout its partitions move; its open transaction cannot commit, and
    /// when the network returns it finds itself out of the group in mid-batch. Only
    /// for an instance started [`Instance::as_own_user`]: the rules match its UID (a
    /// connection mark set by its packets drops both directions on loopback).
    pub fn cut_off_for(&self, cut: Duration) {
        let user = self
            .user
            .expect("cut_off_for needs an instance started as_own_user");
        let (user, mark) = (user.to_string(), user.to_string());
        let rules: [Vec<&str>; 2] = [
            vec![
                "OUTPUT",
                "-m",
                "owner",
                "--uid-owner",
                &user,
                "-j",
                "CONNMARK",
                "--set-mark",
                &mark,
            ],
            vec!["INPUT", "-m", "connmark", "--mark", &mark, "-j", "DROP"],
        ];
        /// Takes the rules away however the test goes on (a panic included); a rule
        /// that was never added is no error here.
        struct Heal<'a>(&'a [Vec<&'a str>; 2]);
        impl Drop for Heal<'_> {
            fn drop(&mut self) {
                for rule in self.0.iter().rev() {
                    let _ = Command::new("iptables").arg("-D").args(rule).status();
                }
            }
        }
        let _heal = Heal(&rules);
        for rule in &rules {
            let status = Command::new("iptables")
                .arg("-I")
                .args(rule)
                .status()
                .expect("iptables (cutting an instance's network needs iptables and root)");
            assert!(status.success(), "iptables -I {rule:?} failed");
        }
        std::thread::sleep(cut);
    }

    /// Waits for the graceful exit `after` asked for, and reads the counters it printed.
    fn counters(mut self, within: Duration, after: &str) -> serde_json::Value {
        let status = self.wait(within);
        assert!(
            status.success(),
            "sum_processor exited with {status} after {after}"
        );
        let mut stdout = String::new();
        use std::io::Read;
        self.child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut stdout)
            .expect("read stdout");
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("counters {stdout:?}: {e}"))
    }

    /// Waits for it to exit by itself (a crash point, a fence), at most `within`.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("sum_processor still running after {within:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }
}

/// Removes a state directory (as a lost disk would).
pub fn wipe(dir: &Path) {
    if dir.exists() {
        std::fs::remove_dir_all(dir).expect("wipe state dir");
    }
}

/// For the test binaries run as children: the environment variable `name`, which the
/// test must set.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is required"))
}

/// For the test binaries run as children: logs to standard error at `RUST_LOG`, or
/// `onceflow=info`, each line led by the instance ID (`SUM_INSTANCE`), so the log of a
/// test running two instances tells them apart.
pub fn init_logs() {
    /// The time of each line, after the instance it comes from.
    struct Named(String);
    impl tracing_subscriber::fmt::time::FormatTime for Named {
        fn format_time(
            &self,
            w: &mut tracing_subscriber::fmt::format::Writer<'_>,
        ) -> std::fmt::Result {
            write!(w, "[{}] ", self.0)?;
            tracing_subscriber::fmt::time::SystemTime.format_time(w)
        }
    }
    let name = std::env::var("SUM_INSTANCE").unwrap_or_else(|_| "-".into());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_timer(Named(name))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "onceflow=info".into()),
        )
        .init();
}

/// For the test binaries run as children: resolves when standard input closes (the
/// test's way of asking for a graceful stop).
pub async fn stdin_closed() {
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut buffer = [0u8; 64];
    while stdin
        .read(&mut buffer)
        .await
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
}

/// A running instance that is killed if the test ends (a failed assertion, an early
/// return) before it stopped it, so no child process outlives its test.
#[derive(Debug)]
pub struct KillOnDrop(Option<Running>);

impl KillOnDrop {
    /// Guards `running`.
    pub fn new(running: Running) -> Self {
        KillOnDrop(Some(running))
    }

    /// The instance, still running.
    pub fn get(&self) -> &Running {
        self.0.as_ref().expect("running")
    }

    /// The instance, still running.
    pub fn get_mut(&mut self) -> &mut Running {
        self.0.as_mut().expect("running")
    }

    /// The instance, for a graceful stop: no longer killed on drop.
    pub fn take(&mut self) -> Running {
        self.0.take().expect("running")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(running) = self.0.take() {
            running.kill();
        }
    }
}
