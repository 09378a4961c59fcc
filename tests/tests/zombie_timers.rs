//! Hole D of issue 40 against the real broker: a transaction of wall-clock timers alone
//! (no input records) carried no input offsets, so the group's generation check of
//! KIP-447 never ran, and an instance that had lost its session committed the timers
//! its successor had fired too. Seen: a processor scheduling one wall-clock reminder per
//! order; instance a frozen (SIGSTOP) with 20 reminders pending; instance b took the
//! partition over when a's session expired and fired the 20 reminders; a, continued
//! 17 s later, committed all 20 again in a timer-only transaction about 30 ms before its
//! consumer noticed the lost session: 20 of 20 reminders twice under `read_committed`.
//!
//! A timer-only transaction now commits the group's committed offsets of its partitions
//! again, with the consumer's group metadata, so the zombie's is refused and aborted.
//! This test runs that scenario with two `sum_processor` child processes running the
//! timer tests' `Buckets` (`SUM_PROCESSOR=reminders`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use onceflow_e2e::Operator;
use onceflow_e2e::buckets::{Closed, Tick, at};
use onceflow_e2e::child::{Instance, KillOnDrop, Running};
use onceflow_testkit::{Isolation, Kafka, Record};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Bound of each wait.
const WITHIN: Duration = Duration::from_secs(60);
/// Orders, each with one reminder.
const ORDERS: usize = 20;
/// How long after its order is processed a reminder is due (wall clock).
const REMIND_IN_MS: i64 = 5_000;
/// How long instance a stays frozen: well past the 6 s session timeout and the
/// reminders' due time, so that b has the partition and has fired them when a wakes.
const FREEZE: Duration = Duration::from_secs(18);

/// Instance a froze (SIGSTOP) with the 20 reminders of its orders pending; b took its
/// partition over, replayed a's changelog and fired them; a, continued (SIGCONT) 18 s
/// later, finds the same 20 reminders due in its own state and fires them in a
/// transaction of timers alone before its consumer learns that it lost its session.
/// Under `read_committed` each reminder must be visible exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_commits_no_reminder_its_successor_fired() -> TestResult {
    let started = Instant::now();
    let op = Operator::new("zombie-timers", 1).await?;
    let kafka = op.kafka;
    let disks = [tempfile::tempdir()?, tempfile::tempdir()?];
    let logs = tempfile::tempdir()?;
    let a = Instance {
        binary: env!("CARGO_BIN_EXE_sum_processor").into(),
        brokers: kafka.bootstrap_servers().to_owned(),
        group: op.group.clone(),
        instance: "a".into(),
        input: op.input.clone(),
        output: op.output.clone(),
        state_dir: disks[0].path().to_owned(),
        env: vec![("SUM_PROCESSOR".into(), "reminders".into())],
        user: None,
    };
    let b = Instance {
        instance: "b".into(),
        state_dir: disks[1].path().to_owned(),
        ..a.clone()
    };

    // a alone owns the partition and processes the orders: their reminders are pending
    // in its state (and its changelog) once the group has committed the 20 records.
    let running_a = KillOnDrop::new(a.spawn_logging_to(&logs.path().join("a.log")));
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let orders = (0..ORDERS).map(|n| {
        let tick = Tick {
            id: format!("order-{n}"),
            key: format!("order-{n}"),
            amount: 1,
            remind_in_ms: Some(REMIND_IN_MS),
            cancel: false,
        };
        at(&tick, now_ms)
    });
    kafka.produce(&op.input, orders).await?;
    onceflow_e2e::sum::wait_for_caught_up(kafka, &op.group, &op.input, WITHIN).await?;
    let early = reminders(&committed(kafka, &op.output).await?);
    assert!(
        early.is_empty(),
        "reminders visible before a was frozen (they came due too soon): {early:?}"
    );

    // a freezes; b starts meanwhile, gets the partition when a's session expires,
    // replays a's changelog and fires the reminders as they come due.
    let frozen_at = Instant::now();
    eprintln!(
        "zombie_timers: {:?} in: a committed the {ORDERS} orders; freezing a for {FREEZE:?}",
        started.elapsed()
    );
    let freezing = tokio::task::spawn_blocking(move || {
        running_a.get().freeze_for(FREEZE);
        running_a
    });
    let mut running_b = KillOnDrop::new(b.spawn_logging_to(&logs.path().join("b.log")));
    // Until a is continued: whether b fired all of them while a was frozen.
    let fired_by_b = wait_for_reminders(kafka, &op.output, frozen_at + FREEZE).await?;
    let mut running_a = freezing.await?;
    eprintln!(
        "zombie_timers: {:?} in: a continued; b had fired {} of {ORDERS} reminders",
        started.elapsed(),
        fired_by_b.len()
    );

    // Things settle: a's transaction of timers alone ends (refused and aborted, or, were
    // the hole open, committed), and a joins the group again (or stops).
    let settled = settle(kafka, &op, running_a.get_mut()).await?;
    let outputs = committed(kafka, &op.output).await?;
    let seen = reminders(&outputs);
    let written = reminders(
        &kafka
            .read_to_end(&op.output, Isolation::ReadUncommitted)
            .await?,
    );
    let doubled: Vec<(&String, &usize)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let missing: Vec<String> = (0..ORDERS)
        .map(|n| format!("order-{n}"))
        .filter(|key| !seen.contains_key(key))
        .collect();
    let a_said = notable(&logs.path().join("a.log"));
    let others: Vec<Closed> = parse(&outputs)
        .into_iter()
        .filter(|c| c.bucket != -1)
        .collect();
    let what = format!(
        "{} reminders visible under read_committed ({} distinct), {} written in all \
         (aborted copies included); doubled: {doubled:?}; missing: {missing:?}; other \
         outputs: {others:?}; b had fired {} of {ORDERS} before a was continued; \
         {settled}; a's log: {a_said:#?}",
        seen.values().sum::<usize>(),
        seen.len(),
        written.values().sum::<usize>(),
        fired_by_b.len(),
    );
    eprintln!("zombie_timers: {:?} in: {what}", started.elapsed());
    assert!(
        doubled.is_empty() && missing.is_empty() && others.is_empty(),
        "each of the {ORDERS} reminders must be visible exactly once: {what}"
    );
    assert!(
        fired_by_b.len() == ORDERS,
        "the scenario did not happen: b had not fired every reminder while a was frozen: {what}"
    );

    // Both still serve: a graceful stop of each succeeds (a's counters say what it did).
    let mut zombie = running_a.take();
    if zombie.is_running() {
        eprintln!("zombie_timers: a: {}", zombie.stop(WITHIN));
    } else {
        eprintln!("zombie_timers: a exited: {}", zombie.wait(Duration::ZERO));
    }
    eprintln!("zombie_timers: b: {}", running_b.take().stop(WITHIN));
    eprintln!("zombie_timers: done in {:?}", started.elapsed());
    Ok(())
}

/// The records of `topic` visible to `read_committed`.
async fn committed(kafka: &Kafka, topic: &str) -> Result<Vec<Record>, Box<dyn std::error::Error>> {
    Ok(kafka.read_to_end(topic, Isolation::ReadCommitted).await?)
}

/// The outputs, decoded.
fn parse(records: &[Record]) -> Vec<Closed> {
    records
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("a Closed"))
        .collect()
}

/// How many times each key's reminder (a `Closed` of bucket -1) is among `records`.
fn reminders(records: &[Record]) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for closed in parse(records) {
        if closed.bucket == -1 {
            *seen.entry(closed.key).or_default() += 1;
        }
    }
    seen
}

/// Waits until every reminder is visible under `read_committed`, or `until`; what was
/// visible then.
async fn wait_for_reminders(
    kafka: &Kafka,
    output: &str,
    until: Instant,
) -> Result<BTreeMap<String, usize>, Box<dyn std::error::Error>> {
    loop {
        let seen = reminders(&committed(kafka, output).await?);
        if seen.len() >= ORDERS || Instant::now() >= until {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits (at most [`WITHIN`]) until a continued instance has settled: no transaction is
/// open on the output (its last stable offset is its high watermark) and a either
/// exited or is back in the group (stable, two members), then two seconds more in that
/// state, so that whatever a does after rejoining shows too. Says what it saw.
async fn settle(
    kafka: &Kafka,
    op: &Operator,
    running_a: &mut Running,
) -> Result<String, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + WITHIN;
    let mut settled_since: Option<Instant> = None;
    loop {
        let ends = kafka.stable_ends(&op.output).await?;
        let open = ends.values().any(|(stable, high)| stable < high);
        let a_running = running_a.is_running();
        let group = tokio::task::block_in_place(|| group_state(kafka, &op.group));
        let back = !a_running || matches!(&group, Some((state, 2)) if state == "Stable");
        let now = Instant::now();
        let what = format!(
            "output ends (stable, high) {ends:?}; a {}; group {group:?}",
            if a_running { "running" } else { "exited" }
        );
        if !open && back {
            let since = *settled_since.get_or_insert(now);
            if now >= since + Duration::from_secs(2) {
                return Ok(format!("settled: {what}"));
            }
        } else {
            settled_since = None;
        }
        assert!(now < deadline, "not settled after {WITHIN:?}: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `group`'s state and number of members, as the group coordinator reports them.
fn group_state(kafka: &Kafka, group: &str) -> Option<(String, usize)> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .create()
        .ok()?;
    let list = client
        .fetch_group_list(Some(group), Duration::from_secs(5))
        .ok()?;
    let found = list.groups().first()?;
    Some((found.state().to_owned(), found.members().len()))
}

/// The lines of a child's log (at `onceflow=warn`, unless `RUST_LOG` says otherwise)
/// about aborts, refusals and the group, at most the last ten.
fn notable(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<String> = text
        .lines()
        .filter(|line| {
            let line = line.to_lowercase();
            [
                "abort",
                "refused",
                "fenced",
                "generation",
                "member",
                "lost",
                "revoked",
            ]
            .iter()
            .any(|word| line.contains(word))
        })
        .map(plain)
        .collect();
    lines[lines.len().saturating_sub(10)..].to_vec()
}

/// `line` without its terminal colours (`ESC [ … m`).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
