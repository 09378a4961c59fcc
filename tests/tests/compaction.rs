//! Hole E of issue 40 against the real broker: an instance's transaction log kept a
//! partition's rows with an old checkpoint while the instance was stopped; meanwhile
//! another instance deleted a key, and compaction of the changelog removed the key's
//! value and, `delete.retention.ms` later, the tombstone that deleted it. Given the
//! partition back, the first instance replayed from its old checkpoint, never saw the
//! deletion, and the deleted state came back: a running total of 5, reset to nothing by
//! the other instance, went on at 6 instead of 1 after the next +1.
//!
//! The transaction log now records when each partition was last in step with its
//! changelog; one out of step for half the changelog's `delete.retention.ms` is cleared
//! and rebuilt from the changelog. This test runs that scenario with two `sum_processor`
//! child processes on a changelog compacted within seconds (its `segment.ms`,
//! `delete.retention.ms` and `min.cleanable.dirty.ratio` turned down, the broker's
//! cleaner backing off for 200 ms instead of 15 s), and checks that compaction did remove
//! both the value and the tombstone before the first instance comes back.

use std::time::{Duration, Instant};

use onceflow_e2e::Operator;
use onceflow_e2e::child::{Instance, KillOnDrop, Running};
use onceflow_e2e::sum::{self, Amount, Summed};
use onceflow_testkit::{Isolation, Kafka};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Bound of each wait for the instances.
const WITHIN: Duration = Duration::from_secs(60);
/// Bound of the wait for compaction to remove the key's value and its tombstone.
const COMPACTION_WITHIN: Duration = Duration::from_secs(60);
/// The changelog's `delete.retention.ms`: how long the broker keeps a tombstone after the
/// cleaner first reached it. Long enough for the test to see the tombstone before it
/// goes, short enough to see it go.
const DELETE_RETENTION_MS: u64 = 5_000;
/// The key whose running total is built, deleted, and added to again.
const KEY: &str = "hole-e";
/// The line an instance logs when it rebuilds a partition out of step with its changelog.
const REBUILD_LINE: &str = "rebuilding the partition from the changelog";

/// Instance a builds a total of 5 and stops; b resets it (a state deletion: a tombstone
/// in the changelog) and runs on with other keys while the changelog is compacted until
/// neither the value nor the tombstone is left; b stops; a comes back on its own state
/// directory (its checkpoint from before the deletion) and adds 1. Under
/// `read_committed` the total must be 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_compacted_away_while_an_instance_was_stopped_stays_deleted() -> TestResult {
    let started = Instant::now();
    let op = Operator::new("compaction", 1).await?;
    let kafka = op.kafka;
    let changelog = format!("{}-txlog", op.group);
    let retention = DELETE_RETENTION_MS.to_string();
    // Created before any instance starts (which would create it with the defaults): a
    // segment rolls at the first record 100 ms after it began, a tombstone goes 5 s after
    // the cleaner reached it, and any dirt at all makes the log worth cleaning.
    kafka
        .create_topic_with(
            &changelog,
            1,
            &[
                ("cleanup.policy", "compact"),
                ("segment.ms", "100"),
                ("delete.retention.ms", &retention),
                ("min.cleanable.dirty.ratio", "0.01"),
                ("min.compaction.lag.ms", "0"),
            ],
        )
        .await?;
    quicken_the_cleaner(kafka).await?;

    let disks = [tempfile::tempdir()?, tempfile::tempdir()?];
    let a = Instance {
        binary: env!("CARGO_BIN_EXE_sum_processor").into(),
        brokers: kafka.bootstrap_servers().to_owned(),
        group: op.group.clone(),
        instance: "a".into(),
        input: op.input.clone(),
        output: op.output.clone(),
        state_dir: disks[0].path().to_owned(),
        env: Vec::new(),
        user: None,
    };
    let b = Instance {
        instance: "b".into(),
        state_dir: disks[1].path().to_owned(),
        ..a.clone()
    };
    let mut outputs = 0;

    // a builds the total: 5, in its changelog as the value of `s:hole-e`.
    sum::produce(kafka, &op.input, &[amount("add-5", KEY, 5)]).await?;
    outputs += 1;
    let mut running_a = KillOnDrop::new(a.spawn());
    sum::wait_for_outputs(kafka, &op.output, outputs, WITHIN).await?;
    sum::wait_for_caught_up(kafka, &op.group, &op.input, WITHIN).await?;
    let counters = stop(running_a.take());
    let a_stopped = Instant::now();
    eprintln!(
        "compaction: {:?} in: a built the total and stopped: {counters}",
        started.elapsed()
    );
    let seen = key_records(kafka, &changelog).await?;
    let value_at = match seen.last() {
        Some((offset, Some(value))) if value == "5" => *offset,
        _ => panic!("the changelog should hold the total 5 of `{KEY}` after a: {seen:?}"),
    };

    // b takes the partition over and resets the key: its state is deleted.
    let mut running_b = KillOnDrop::new(b.spawn());
    sum::produce(kafka, &op.input, &[amount("reset", KEY, 0)]).await?;
    outputs += 1;
    let reset = sum::wait_for_outputs(kafka, &op.output, outputs, WITHIN).await?;
    assert_eq!(
        reset.last().map(|o| o.sum),
        Some(0),
        "b's output for the reset: {reset:?}"
    );
    let seen = key_records(kafka, &changelog).await?;
    let tombstone_at = match seen.last() {
        Some((offset, None)) => *offset,
        _ => panic!(
            "the changelog should end `{KEY}` with b's tombstone after the reset (the value \
             5 was at offset {value_at}): {seen:?}"
        ),
    };
    eprintln!(
        "compaction: {:?} in: b deleted the key (value at changelog offset {value_at}, \
         tombstone at {tombstone_at}); compacting",
        started.elapsed()
    );

    // b goes on with other keys, one record at a time: each batch it commits appends to
    // the changelog, so segments roll (the active one is never cleaned) and the log stays
    // dirty enough to be cleaned again and again, until the cleaner has removed the value
    // and, once the tombstone's delete.retention.ms has passed, the tombstone too.
    let compacting = Instant::now();
    let mut fillers = 0;
    let mut value_gone_after = None;
    let mut last_seen = seen;
    while !last_seen.is_empty() {
        assert!(
            compacting.elapsed() < COMPACTION_WITHIN && fillers < 600,
            "compaction did not remove `{KEY}`'s value (offset {value_at}) and tombstone \
             (offset {tombstone_at}) from {changelog} within {COMPACTION_WITHIN:?} ({fillers} \
             more records processed by b meanwhile); still there, as (offset, value): \
             {last_seen:?}; the value {}; the changelog's ends (last stable offset, high \
             watermark): {:?}\n--- broker log (last 30 lines) ---\n{}",
            match value_gone_after {
                Some(after) => format!("went after {after:?}"),
                None => "never went".to_owned(),
            },
            kafka.stable_ends(&changelog).await,
            kafka.log_tail(30).await,
        );
        sum::produce(
            kafka,
            &op.input,
            &[amount(
                &format!("filler-{fillers}"),
                &format!("other-{}", fillers % 5),
                1,
            )],
        )
        .await?;
        fillers += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        last_seen = key_records(kafka, &changelog).await?;
        if value_gone_after.is_none() && !last_seen.iter().any(|(offset, _)| *offset == value_at) {
            value_gone_after = Some(compacting.elapsed());
        }
    }
    eprintln!(
        "compaction: {:?} in: the value of `{KEY}` was gone from the changelog after {:?}, \
         the tombstone too after {:?} ({fillers} records by b meanwhile)",
        started.elapsed(),
        value_gone_after.unwrap_or_default(),
        compacting.elapsed()
    );
    outputs += fillers;
    sum::wait_for_outputs(kafka, &op.output, outputs, WITHIN).await?;
    sum::wait_for_caught_up(kafka, &op.group, &op.input, WITHIN).await?;
    let counters = stop(running_b.take());
    eprintln!(
        "compaction: {:?} in: b stopped: {counters}",
        started.elapsed()
    );
    let seen = key_records(kafka, &changelog).await?;
    assert!(
        seen.is_empty(),
        "`{KEY}` is back in the changelog after b stopped: {seen:?}"
    );

    // a comes back on its own state directory, its checkpoint from before b's deletion,
    // well over half the changelog's delete.retention.ms after it was last in step.
    let out_of_step = Duration::from_millis(DELETE_RETENTION_MS);
    if let Some(rest) = out_of_step.checked_sub(a_stopped.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let log = disks[0].path().join("a.log");
    running_a = KillOnDrop::new(a.spawn_logging_to(&log));
    sum::produce(kafka, &op.input, &[amount("add-1", KEY, 1)]).await?;
    outputs += 1;
    let all = sum::wait_for_outputs(kafka, &op.output, outputs, WITHIN).await?;
    sum::wait_for_caught_up(kafka, &op.group, &op.input, WITHIN).await?;
    let counters = stop(running_a.take());
    eprintln!(
        "compaction: {:?} in: a came back, added 1 and stopped: {counters}",
        started.elapsed()
    );
    let ours: Vec<&Summed> = all.iter().filter(|o| o.key == KEY).collect();
    let last = ours.last().map(|o| (o.id.as_deref(), o.sum));
    assert_eq!(
        last,
        Some((Some("add-1"), 1)),
        "after b's reset the total of `{KEY}` must start again: a's +1 should make it 1 \
         (6 is the deleted total come back: a replayed from its old checkpoint a changelog \
         whose value and tombstone compaction had removed); outputs of the key under \
         read_committed: {ours:?}; a's counters {counters}"
    );
    let said = std::fs::read_to_string(&log)?;
    assert!(
        said.contains(REBUILD_LINE),
        "a did not say it rebuilt the partition (\"{REBUILD_LINE}\"); its log:\n{said}"
    );
    eprintln!("compaction: passed in {:?}", started.elapsed());
    Ok(())
}

/// An input event with an ID.
fn amount(id: &str, key: &str, amount: i64) -> Amount {
    Amount {
        id: Some(id.to_owned()),
        key: key.to_owned(),
        amount,
        anonymous: false,
    }
}

/// The records of state key [`KEY`] in `changelog` (key `s:hole-e`), read uncommitted
/// from its beginning: offset and value (`None`: a tombstone).
async fn key_records(
    kafka: &Kafka,
    changelog: &str,
) -> Result<Vec<(i64, Option<String>)>, Box<dyn std::error::Error>> {
    let key = format!("s:{KEY}");
    Ok(kafka
        .read_to_end(changelog, Isolation::ReadUncommitted)
        .await?
        .iter()
        .filter(|r| r.key.as_deref() == Some(key.as_bytes()))
        .map(|r| {
            (
                r.offset,
                r.value
                    .as_deref()
                    .map(|v| String::from_utf8_lossy(v).into_owned()),
            )
        })
        .collect())
}

/// Makes the broker's log cleaner look for work every 200 ms instead of Kafka's 15 s
/// (`log.cleaner.backoff.ms` is a dynamic broker config). Only on a broker the testkit
/// started for this test binary: the legacy AlterConfigs this client has would reset
/// the other dynamic configs of someone else's broker. An external broker keeps its own
/// back-off, which the compaction deadline leaves room for.
async fn quicken_the_cleaner(kafka: &Kafka) -> TestResult {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    if !kafka.is_managed() {
        eprintln!("compaction: an external broker: its log.cleaner.backoff.ms is left as it is");
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .create()?;
    let brokers: Vec<i32> = tokio::task::block_in_place(|| {
        admin
            .inner()
            .fetch_metadata(None, onceflow_e2e::CALL_TIMEOUT)
            .map(|metadata| metadata.brokers().iter().map(|b| b.id()).collect())
    })?;
    let changes: Vec<AlterConfig<'_>> = brokers
        .iter()
        .map(|id| {
            AlterConfig::new(ResourceSpecifier::Broker(*id)).set("log.cleaner.backoff.ms", "200")
        })
        .collect();
    let options = AdminOptions::new().request_timeout(Some(onceflow_e2e::CALL_TIMEOUT));
    for result in admin.alter_configs(&changes, &options).await? {
        result.map_err(|(broker, code)| {
            format!("setting log.cleaner.backoff.ms on broker {broker:?}: {code}")
        })?;
    }
    Ok(())
}

/// Asks for a graceful stop and returns the counters it printed.
fn stop(running: Running) -> serde_json::Value {
    tokio::task::block_in_place(|| running.stop(WITHIN))
}
