//! Exactly-once side effects (issue 14, part 1) against the real broker and a real HTTP
//! payment service on loopback: the `sum` processor records a `charge` effect per
//! event, an executor charges through the service.
//!
//! 1. A service that honours idempotency keys, answering 503 after charging for one
//!    intent in ten: every intent exists once, every charge happens once, the ambiguous
//!    ones were tried again with the same key, every result recorded once.
//! 2. A service that honours no key, and an executor process crashed (`abort()`) between
//!    a charge and the record of it: without check-back the restarted executor charges
//!    again (the control: it shows the crash lands where it should), with it the pending
//!    charge is checked back and not repeated.
//! 3. A charge that stays ambiguous and whose check-back never resolves is dead-lettered
//!    with the reason after its bounds, and the others go on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use onceflow::effects::{self, Bounds, EffectResult, Intent};
use onceflow::{Engine, EngineConfig};
use onceflow_e2e::Operator;
use onceflow_e2e::effects::{Behaviour, HttpCharge, PaymentService};
use onceflow_e2e::sum::{self, Amount, Sum};
use onceflow_testkit::{self as testkit, Isolation, Kafka};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WITHIN: Duration = Duration::from_secs(120);

/// The idempotency key of the charge recorded for `event` by operator `group`.
fn charge_key(group: &str, event: &Amount) -> String {
    format!("{group}/{}/0", event.id.as_deref().expect("id"))
}

/// The committed records of `topic` as `T`.
async fn committed<T: serde::de::DeserializeOwned>(
    kafka: &Kafka,
    topic: &str,
) -> Result<Vec<T>, Box<dyn std::error::Error>> {
    let records = kafka.read_to_end(topic, Isolation::ReadCommitted).await?;
    Ok(records
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()))
        .collect::<Result<_, _>>()?)
}

/// The processor with effects on, and a results topic for the executor.
async fn setup(name: &str) -> Result<(Operator, EngineConfig, String), Box<dyn std::error::Error>> {
    let op = Operator::new(name, 3).await?;
    let results = testkit::unique_name(&format!("{name}-results"));
    op.kafka.create_topic(&results, 3).await?;
    let config = op.config("p").with_effects();
    Ok((op, config, results))
}

/// Runs the processor until every event's output is visible.
async fn run_processor(op: &Operator, config: EngineConfig, outputs: usize) -> TestResult {
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Sum::charging(&op.output)));
    sum::wait_for_outputs(op.kafka, &op.output, outputs, WITHIN).await?;
    shutdown.trigger();
    running.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_applied_once_under_its_idempotency_key() -> TestResult {
    let (op, config, results) = setup("effects-keys").await?;
    let events = sum::amounts(0, 2_000, 20);
    let again: Vec<Amount> = events.iter().step_by(20).cloned().collect();
    sum::produce(op.kafka, &op.input, &events).await?;
    sum::produce(op.kafka, &op.input, &again).await?;
    let keys: BTreeSet<String> = events.iter().map(|e| charge_key(&op.group, e)).collect();
    let ambiguous: BTreeSet<String> = keys.iter().step_by(10).cloned().collect();
    let service = PaymentService::start(Behaviour {
        honours_keys: true,
        ambiguous_once: ambiguous.clone(),
        ..Behaviour::default()
    })
    .await;

    let executor_config =
        effects::executor_config(&config, "x")?.kafka("session.timeout.ms", "6000");
    run_processor(&op, config, events.len()).await?;
    let (engine, executor) = effects::executor(
        executor_config,
        HttpCharge::new(&service.url, false),
        Some(&results),
    )
    .await?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(executor));
    let waited = onceflow_e2e::wait_for_records(op.kafka, &results, keys.len(), WITHIN).await;
    shutdown.trigger();
    let stats = running.await??;
    waited?;

    // Each intent once: the duplicates recorded none.
    let intents: Vec<Intent> = committed(op.kafka, &format!("{}-effects", op.group)).await?;
    let intent_keys: BTreeSet<String> = intents.iter().map(|i| i.idempotency_key.clone()).collect();
    assert_eq!(intents.len(), keys.len(), "intents recorded");
    assert_eq!(intent_keys, keys);
    // Each charge once, the ambiguous ones asked again with the same key.
    service.seen(|seen| {
        assert_eq!(seen.applied.keys().cloned().collect::<BTreeSet<_>>(), keys);
        assert!(
            seen.applied.values().all(|n| *n == 1),
            "a key charged twice"
        );
        for key in &ambiguous {
            assert!(seen.requests[key] >= 2, "{key} not tried again");
        }
    });
    // Each result once.
    let recorded: Vec<EffectResult> = committed(op.kafka, &results).await?;
    let recorded_keys: BTreeSet<String> =
        recorded.iter().map(|r| r.idempotency_key.clone()).collect();
    assert_eq!(recorded.len(), keys.len(), "results recorded");
    assert_eq!(recorded_keys, keys);
    assert!(
        recorded
            .iter()
            .all(|r| r.result.is_some() && !r.checked_back)
    );
    assert_eq!(stats.dead_lettered, 0);
    Ok(())
}

/// One executor process crashed between a charge and its record, then started again.
/// Returns the service's charge counts.
async fn crash_an_executor(checks_back: bool) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let name = if checks_back {
        "effects-check"
    } else {
        "effects-control"
    };
    let (op, config, results) = setup(name).await?;
    let events = sum::amounts(0, 300, 10);
    sum::produce(op.kafka, &op.input, &events).await?;
    run_processor(&op, config, events.len()).await?;
    let service = PaymentService::start(Behaviour::default()).await;

    let spawn = |failpoints: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_effects_executor"));
        if let Some(failpoints) = failpoints {
            command.env("FAILPOINTS", failpoints);
        }
        command
            .env("EXEC_BROKERS", op.kafka.bootstrap_servers())
            .env("EXEC_GROUP", &op.group)
            .env("EXEC_INSTANCE", "x")
            .env("EXEC_STATE_DIR", op.state.path())
            .env("EXEC_URL", &service.url)
            .env("EXEC_CHECKS_BACK", if checks_back { "1" } else { "0" })
            .env("EXEC_RESULTS", &results)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "onceflow=warn".into()),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn effects_executor")
    };
    // The 41st charge crashes the process right after the service applied it.
    let mut first = spawn(Some("onceflow-effect-applied=40*off->return"));
    let deadline = Instant::now() + WITHIN;
    let status = loop {
        if let Some(status) = first.try_wait()? {
            break status;
        }
        assert!(Instant::now() < deadline, "the executor did not crash");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !status.success(),
        "the executor exited with {status}, not a crash"
    );
    assert!(service.seen(|s| s.applied.len()) >= 41);

    let mut second = spawn(None);
    let waited = onceflow_e2e::wait_for_records(op.kafka, &results, events.len(), WITHIN).await;
    drop(second.stdin.take());
    let stopped = tokio::task::block_in_place(|| second.wait_with_output())?;
    waited?;
    assert!(stopped.status.success(), "{stopped:?}");

    let recorded: Vec<EffectResult> = committed(op.kafka, &results).await?;
    let recorded_keys: BTreeSet<String> =
        recorded.iter().map(|r| r.idempotency_key.clone()).collect();
    let keys: BTreeSet<String> = events.iter().map(|e| charge_key(&op.group, e)).collect();
    assert_eq!(recorded.len(), events.len(), "results recorded");
    assert_eq!(recorded_keys, keys);
    if checks_back {
        assert!(
            recorded.iter().any(|r| r.checked_back),
            "no result came from a check-back"
        );
    }
    Ok(service.seen(|s| {
        assert_eq!(s.applied.keys().cloned().collect::<BTreeSet<_>>(), keys);
        s.applied.values().copied().collect()
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_check_back_a_crash_after_a_charge_charges_again() -> TestResult {
    let charges = crash_an_executor(false).await?;
    assert!(
        charges.iter().any(|n| *n > 1),
        "the crash between a charge and its record repeated no charge: the test's crash \
         is not where it should be"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_charge_is_resolved_by_check_back() -> TestResult {
    let charges = crash_an_executor(true).await?;
    let twice = charges.iter().filter(|n| **n > 1).count();
    assert_eq!(twice, 0, "{twice} keys charged twice");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_that_never_resolves_is_dead_lettered_with_the_reason() -> TestResult {
    let (op, config, results) = setup("effects-never").await?;
    let events = sum::amounts(0, 50, 5);
    sum::produce(op.kafka, &op.input, &events).await?;
    let stuck = charge_key(&op.group, &events[7]);
    let service = PaymentService::start(Behaviour {
        honours_keys: true,
        never: [stuck.clone()].into(),
        ..Behaviour::default()
    })
    .await;
    let executor_config =
        effects::executor_config(&config, "x")?.kafka("session.timeout.ms", "6000");
    let dead_letters = executor_config.dead_letter_topic();
    run_processor(&op, config, events.len()).await?;
    let (engine, executor) = effects::executor(
        executor_config,
        HttpCharge::new(&service.url, true),
        Some(&results),
    )
    .await?;
    let executor = executor.bounds(Bounds {
        tries: 4,
        within: Duration::from_secs(30),
    });
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(executor));
    let waited = async {
        onceflow_e2e::wait_for_records(op.kafka, &results, events.len() - 1, WITHIN).await?;
        onceflow_e2e::wait_for_records(op.kafka, &dead_letters, 1, WITHIN).await
    }
    .await;
    shutdown.trigger();
    let stats = running.await??;
    waited?;

    assert_eq!(stats.dead_lettered, 1);
    let dead = op
        .kafka
        .read_to_end(&dead_letters, Isolation::ReadCommitted)
        .await?;
    assert_eq!(dead.len(), 1);
    let intent: Intent = serde_json::from_slice(dead[0].value.as_deref().unwrap_or_default())?;
    assert_eq!(intent.idempotency_key, stuck);
    let reason =
        String::from_utf8_lossy(dead[0].header("onceflow-error-message").unwrap_or_default())
            .into_owned();
    assert!(
        reason.contains("unresolved after 4 tries") && reason.contains("check-back unknown"),
        "{reason}"
    );
    // One charge attempt, then check-backs only: never a blind second charge.
    service.seen(|seen| {
        assert_eq!(
            seen.requests.get(&stuck),
            Some(&1),
            "{:?}",
            seen.requests.get(&stuck)
        );
        assert_eq!(seen.checks.get(&stuck), Some(&3));
        assert_eq!(seen.applied.len(), events.len() - 1);
    });
    let recorded: Vec<EffectResult> = committed(op.kafka, &results).await?;
    assert!(recorded.iter().all(|r| r.idempotency_key != stuck));
    assert_eq!(recorded.len(), events.len() - 1);
    Ok(())
}

/// `run_with_effects` with its default role `all` on a group that never ran: the
/// processor creates the effects topic at its start, so the executor beside it in the
/// same process must not wait for that topic before the processor runs (it did: 120 s of
/// "waiting for the effects topic", then exit 2). Every event is charged once and a
/// SIGTERM stops both cleanly. The payment service's address is an application setting,
/// given as `--app payment_url=…`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_all_runs_the_processor_and_its_executor_in_one_process_on_a_fresh_group() -> TestResult
{
    use tokio::process::Command;
    let op = Operator::new("effects-all", 2).await?;
    let events = sum::amounts(0, 40, 8);
    sum::produce(op.kafka, &op.input, &events).await?;
    let service = PaymentService::start(Behaviour {
        honours_keys: true,
        ..Behaviour::default()
    })
    .await;
    let log = op.state.path().join("charge_service.log");
    let file = std::fs::File::create(&log)?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_charge_service"))
        .args([
            "--brokers",
            op.kafka.bootstrap_servers(),
            "--group",
            &op.group,
            "--instance-id",
            "all-0",
            "--input",
            &op.input,
            "--outputs",
            &op.output,
            "--state-dir",
            op.state.path().to_str().expect("utf-8"),
            "--metrics-address",
            "off",
            "--kafka",
            "session.timeout.ms=6000",
            // An application setting (`onceflow::run_with_effects_and_settings`).
            "--app",
            &format!("payment_url={}", service.url),
        ])
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()?;
    let keys: BTreeSet<String> = events.iter().map(|e| charge_key(&op.group, e)).collect();
    // Well inside the executor's 120 s wait for the topic: a start that waits it out fails.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let charged = service.seen(|seen| seen.applied.len());
        if charged >= keys.len() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            panic!(
                "exited with {status} after {charged} of {} charges; log:\n{}",
                keys.len(),
                std::fs::read_to_string(&log)?
            );
        }
        assert!(
            Instant::now() < deadline,
            "{charged} of {} charges within 60 s; log:\n{}",
            keys.len(),
            std::fs::read_to_string(&log)?
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pid = child.id().expect("running").to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await?
            .success()
    );
    let status = tokio::time::timeout(WITHIN, child.wait()).await??;
    assert!(
        status.success(),
        "SIGTERM: {status}; log:\n{}",
        std::fs::read_to_string(&log)?
    );
    service.seen(|seen| {
        assert_eq!(seen.applied.keys().cloned().collect::<BTreeSet<_>>(), keys);
        assert!(
            seen.applied.values().all(|n| *n == 1),
            "a key charged twice"
        );
    });
    Ok(())
}
