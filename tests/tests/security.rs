//! Secured connections, against a broker with a SASL_SSL (SCRAM-SHA-512) listener, a
//! mutual-TLS listener and ACLs enforced (`onceflow_testkit::secure_kafka`), running the
//! `sum_service` binary (`onceflow::run`) configured as a user would: flags, `ONCEFLOW_*`
//! variables and files.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use onceflow_e2e::sum::{self, Amount};
use onceflow_testkit::{
    self as testkit, ALLOWED_PREFIX, Isolation, LOCKED_PREFIX, SecureKafka, TestUser, secure_kafka,
};
use tokio::process::{Child, Command};

/// One deployment of `sum_service`: its topics, group, state directory and log file.
struct Service {
    kafka: &'static SecureKafka,
    input: String,
    output: String,
    group: String,
    dir: tempfile::TempDir,
}

impl Service {
    /// Creates an input (3 partitions) and an output topic named after `output_prefix`,
    /// with `events` on the input.
    async fn new(output_prefix: &str, events: &[Amount]) -> Service {
        let kafka = secure_kafka().await;
        let input = testkit::unique_name(&format!("{ALLOWED_PREFIX}in"));
        let output = testkit::unique_name(&format!("{output_prefix}out"));
        let admin = kafka.admin();
        admin.create_topic(&input, 3).await.expect("create input");
        admin.create_topic(&output, 3).await.expect("create output");
        sum::produce(admin, &input, events).await.expect("produce");
        Service {
            kafka,
            input,
            output,
            group: testkit::unique_name(&format!("{ALLOWED_PREFIX}g")),
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// The runner's arguments for this deployment, connecting to `bootstrap`.
    fn args(&self, bootstrap: &str) -> Vec<String> {
        let state = self.dir.path().join("state");
        [
            "--brokers",
            bootstrap,
            "--group",
            &self.group,
            "--instance-id",
            "sec-0",
            "--input",
            &self.input,
            "--outputs",
            &self.output,
            "--state-dir",
            state.to_str().expect("utf-8"),
            "--metrics-address",
            "off",
            "--commit-interval",
            "50ms",
            "--max-batch-records",
            "50",
            "--kafka",
            "session.timeout.ms=6000",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Starts `sum_service` with `args` and `env`, its stdout and stderr in `log`.
    fn spawn(&self, args: &[String], env: &[(String, String)], log: &Path) -> Child {
        let file = std::fs::File::create(log).expect("log file");
        Command::new(env!("CARGO_BIN_EXE_sum_service"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("sum_service starts")
    }

    /// Waits until `count` outputs are visible, then stops the service with SIGTERM and
    /// returns its exit status and log.
    async fn run_until_outputs(&self, mut child: Child, count: usize, log: &Path) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let seen = sum::committed_outputs(self.kafka.admin(), &self.output)
                .await
                .expect("read outputs")
                .len();
            if seen >= count {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "exited with {status} after {seen} of {count} outputs; log:\n{}",
                    read(log)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{seen} of {count} outputs in 90 s; log:\n{}",
                read(log)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        terminate(child, log).await
    }
}

impl Service {
    /// Runs the service with `args` and `env` until every distinct event is output, stops
    /// it, and checks exactly once: one output per distinct event under read_committed,
    /// every input offset committed. Returns the log.
    async fn run_exactly_once(
        &self,
        args: &[String],
        env: &[(String, String)],
        name: &str,
        (distinct, produced): (&[Amount], &[Amount]),
    ) -> String {
        let log = self.log_path(name);
        let child = self.spawn(args, env, &log);
        let status = self.run_until_outputs(child, distinct.len(), &log).await;
        let text = read(&log);
        assert!(status.success(), "{status}; log:\n{text}");
        let admin = self.kafka.admin();
        let outputs = sum::committed_outputs(admin, &self.output)
            .await
            .expect("outputs");
        sum::assert_exactly_once(distinct, &outputs);
        let offsets = admin
            .committed_offsets(&self.group, &self.input)
            .await
            .expect("offsets");
        let committed: i64 = offsets.values().map(|o| o.unwrap_or(0)).sum();
        assert_eq!(
            committed,
            produced.len() as i64,
            "every input's offset committed"
        );
        text
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// SIGTERM, then the exit status within 30 s.
async fn terminate(mut child: Child, log: &Path) -> ExitStatus {
    let pid = child.id().expect("running").to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(sent.success());
    tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap_or_else(|_| panic!("no exit within 30 s of SIGTERM; log:\n{}", read(log)))
        .expect("wait")
}

/// The exit status of a service that must stop by itself within `within`.
async fn exits_within(mut child: Child, within: Duration, log: &Path) -> (ExitStatus, Duration) {
    let started = Instant::now();
    let status = tokio::time::timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("still running after {within:?}; log:\n{}", read(log)))
        .expect("wait");
    (status, started.elapsed())
}

/// `--kafka key=value` for each property.
fn kafka_flags(properties: &[(String, String)]) -> Vec<String> {
    properties
        .iter()
        .flat_map(|(key, value)| ["--kafka".to_owned(), format!("{key}={value}")])
        .collect()
}

/// `--kafka` flags connecting as `user` with the right password.
fn sasl_flags(kafka: &SecureKafka, user: TestUser) -> Vec<String> {
    kafka_flags(&kafka.sasl_properties(user, kafka.password(user)))
}

/// 150 distinct events, every 5th sent twice.
fn workload() -> (Vec<Amount>, Vec<Amount>) {
    let distinct = sum::amounts(0, 150, 10);
    let mut produced = Vec::new();
    for (n, event) in distinct.iter().enumerate() {
        produced.push(event.clone());
        if n % 5 == 0 {
            produced.push(event.clone());
        }
    }
    (distinct, produced)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_scram_over_tls_runs_the_exactly_once_flow() {
    let (distinct, produced) = workload();
    let service = Service::new(ALLOWED_PREFIX, &produced).await;
    let kafka = service.kafka;
    let mut args = service.args(&kafka.sasl_ssl_bootstrap());
    // The password comes from the environment, the rest from flags.
    let mut properties = kafka.sasl_properties(TestUser::Alice, "unused");
    properties.retain(|(key, _)| key != "sasl.password");
    args.extend(kafka_flags(&properties));
    let env = [(
        "ONCEFLOW_KAFKA_SASL_PASSWORD".to_owned(),
        kafka.password(TestUser::Alice).to_owned(),
    )];
    service
        .run_exactly_once(&args, &env, "alice", (&distinct, &produced))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_plain_over_tls_runs_the_exactly_once_flow() {
    let (distinct, produced) = workload();
    let service = Service::new(ALLOWED_PREFIX, &produced).await;
    let mut args = service.args(&service.kafka.sasl_ssl_bootstrap());
    args.extend(sasl_flags(service.kafka, TestUser::Plain));
    service
        .run_exactly_once(&args, &[], "plain", (&distinct, &produced))
        .await;
}

/// Runs a service that must stop by itself on a refusal: its exit status, how long it
/// took, and its log; and checks that it committed nothing.
async fn refused(
    service: &Service,
    args: &[String],
    env: &[(String, String)],
    name: &str,
) -> (ExitStatus, Duration, String) {
    let log = service.log_path(name);
    let child = service.spawn(args, env, &log);
    let (status, took) = exits_within(child, Duration::from_secs(60), &log).await;
    let text = read(&log);
    let admin = service.kafka.admin();
    let written = admin
        .read_to_end(&service.output, Isolation::ReadUncommitted)
        .await
        .expect("read outputs");
    assert!(
        written.is_empty(),
        "{} records written; log:\n{text}",
        written.len()
    );
    let committed = admin
        .committed_offsets(&service.group, &service.input)
        .await
        .expect("offsets");
    assert!(
        committed.values().all(Option::is_none),
        "offsets committed: {committed:?}; log:\n{text}"
    );
    (status, took, text)
}

/// Asserts a refusal stopped the instance with exit code 1, at once (not after retries),
/// with an error that contains every one of `expected`.
fn assert_stopped_with(status: ExitStatus, took: Duration, log: &str, expected: &[&str]) {
    assert_eq!(status.code(), Some(1), "{status}; log:\n{log}");
    assert!(took < Duration::from_secs(30), "took {took:?}; log:\n{log}");
    let error = log
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line; log:\n{log}"));
    for needle in expected {
        assert!(error.contains(needle), "`{needle}` missing from: {error}");
    }
    let retries = log.matches("going on").count() + log.matches("trying again").count();
    assert!(retries <= 1, "{retries} retries; log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_at_once_with_an_authentication_error() {
    let (_, produced) = workload();
    let service = Service::new(ALLOWED_PREFIX, &produced).await;
    let kafka = service.kafka;
    let mut args = service.args(&kafka.sasl_ssl_bootstrap());
    args.extend(kafka_flags(
        &kafka.sasl_properties(TestUser::Alice, "not-the-password"),
    ));
    let (status, took, log) = refused(&service, &args, &[], "wrong-password").await;
    assert_stopped_with(
        status,
        took,
        &log,
        &["authentication failed as User:alice", "invalid credentials"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_write_on_the_output_is_told_which_acl_is_missing() {
    let (_, produced) = workload();
    let service = Service::new(LOCKED_PREFIX, &produced).await;
    let kafka = service.kafka;
    let mut args = service.args(&kafka.sasl_ssl_bootstrap());
    args.extend(sasl_flags(kafka, TestUser::NoWrite));
    let (status, took, log) = refused(&service, &args, &[], "no-write").await;
    let acl = format!("WRITE on topic `{}`", service.output);
    assert_stopped_with(
        status,
        took,
        &log,
        &["not authorized", "User:nowrite", &acl],
    );
    let changelog = format!("{}-txlog", service.group);
    let entries = kafka
        .admin()
        .read_to_end(&changelog, Isolation::ReadCommitted)
        .await
        .expect("changelog");
    assert!(
        entries.is_empty(),
        "changelog entries committed: {}",
        entries.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_transactional_id_acl_is_told_which_acl_is_missing() {
    let (_, produced) = workload();
    let service = Service::new(ALLOWED_PREFIX, &produced).await;
    let kafka = service.kafka;
    let mut args = service.args(&kafka.sasl_ssl_bootstrap());
    args.extend(sasl_flags(kafka, TestUser::NoTransactionalId));
    let (status, took, log) = refused(&service, &args, &[], "no-txn").await;
    let acl = format!("WRITE on transactional ID `{}-sec-0`", service.group);
    assert_stopped_with(status, took, &log, &["not authorized", "User:notxn", &acl]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_trusted_certificate_runs_the_exactly_once_flow() {
    let (distinct, produced) = workload();
    let service = Service::new(ALLOWED_PREFIX, &produced).await;
    let kafka = service.kafka;
    let (certificate, _) = kafka.client_files();
    let mut args = service.args(&kafka.mtls_bootstrap());
    args.extend(kafka_flags(&kafka.mtls_properties(&certificate)));
    // The key itself, inline, from the environment: it must not show up in the log.
    let key = kafka.pki().client.private_key.clone();
    let env = [("ONCEFLOW_KAFKA_SSL_KEY_PEM".to_owned(), key.clone())];
    let log = service
        .run_exactly_once(&args, &env, "mtls", (&distinct, &produced))
        .await;
    assert_no_secret(&log, &[&key]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_client_certificate_is_rejected() {
    let (_, produced) = workload();
    let service = Service::new(ALLOWED_PREFIX, &produced).await;
    let kafka = service.kafka;
    let (certificate, key) = kafka.untrusted_client_files();
    let mut args = service.args(&kafka.mtls_bootstrap());
    let mut properties = kafka.mtls_properties(&certificate);
    properties.push(("ssl.key.location".into(), key.display().to_string()));
    args.extend(kafka_flags(&properties));
    let (status, took, log) = refused(&service, &args, &[], "untrusted").await;
    assert_stopped_with(status, took, &log, &["authentication failed", "SSL"]);
}

/// The secret values, and every line of multi-line ones (a PEM body), are absent.
fn assert_no_secret(text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "a secret is in:\n{text}");
        for line in secret
            .lines()
            .filter(|l| l.len() > 20 && !l.starts_with("-----"))
        {
            assert!(!text.contains(line), "key material `{line}` is in:\n{text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_debug_log_help_or_verify_config() {
    let (distinct, produced) = workload();
    let service = Service::new(ALLOWED_PREFIX, &produced).await;
    let kafka = service.kafka;
    let password = kafka.password(TestUser::Alice);
    let password_file = service.dir.path().join("kafka-password");
    std::fs::write(&password_file, format!("{password}\n")).expect("password file");
    let mut args = service.args(&kafka.sasl_ssl_bootstrap());
    let mut properties = kafka.sasl_properties(TestUser::Alice, "");
    properties.retain(|(key, _)| key != "sasl.password");
    properties.push((
        "sasl.password.file".into(),
        password_file.display().to_string(),
    ));
    // librdkafka's own security and protocol debugging too.
    properties.push(("debug".into(), "security,broker,protocol".into()));
    args.extend(kafka_flags(&properties));
    args.extend(["--log".into(), "debug".into()]);
    let text = service
        .run_exactly_once(&args, &[], "debug", (&distinct, &produced))
        .await;
    assert!(text.contains("DEBUG"), "not a debug log:\n{text}");
    assert!(
        text.contains("SASL"),
        "librdkafka's security debugging is missing:\n{text}"
    );
    assert_no_secret(&text, &[password]);

    // The same settings, the password now in a variable: --help, verify-config, inspect.
    let binary = env!("CARGO_BIN_EXE_sum_service");
    let mut with_variable = args.clone();
    let at = with_variable
        .iter()
        .position(|a| a.starts_with("sasl.password.file="))
        .expect("flag");
    with_variable.drain(at - 1..=at);
    for subcommand in [vec!["--help"], vec!["verify-config"], vec!["inspect"]] {
        let output = std::process::Command::new(binary)
            .args(&with_variable)
            .args(&subcommand)
            .env("ONCEFLOW_KAFKA_SASL_PASSWORD", password)
            .output()
            .expect("runs");
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "{subcommand:?}: {shown}");
        assert_no_secret(&shown, &[password]);
        if subcommand == ["verify-config"] {
            assert!(
                shown.contains("kafka.sasl.password") && shown.contains("[redacted]"),
                "{shown}"
            );
        }
    }
}
