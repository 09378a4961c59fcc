//! The batch's decisions, through the fake Kafka (`testing/kafka.rs`): the call order of
//! each delivery mode, an error of each class at each call of a transaction, dedup, dead
//! letters, size limits, the retry split and the transaction-duration bound. Milliseconds
//! each; what needs a broker is in `tests/`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{DeliveryMode, EngineConfig};
use crate::engine::batch::Batch;
use crate::engine::recover::Resync;
use crate::engine::stats::Stats;
use crate::kafka::Record;
use crate::testing::kafka::{Call, FakeKafka, Kind, injected as kafka_error};
use crate::txlog::TxLog;
use crate::{Context, Error, ErrorClass, Event, Processor, Result};

const OUT: &str = "out";
const CHANGELOG: &str = "g-txlog";
const DLQ: &str = "g-dlq";

#[derive(Debug, serde::Deserialize, serde::Serialize, Default)]
struct In {
    id: Option<String>,
    key: String,
    amount: i64,
    /// Fails transiently this many times first.
    #[serde(default)]
    transient: u32,
    /// Stores a state value this large.
    #[serde(default)]
    big_state: usize,
    /// Takes this long.
    #[serde(default)]
    slow_ms: u64,
}

impl Event for In {
    fn event_id(&self) -> Option<String> {
        self.id.clone()
    }

    fn key(&self) -> Option<String> {
        Some(self.key.clone()).filter(|key| !key.is_empty())
    }
}

/// Emits each input as it came, keyed by the event's own key.
struct Forward;

#[async_trait::async_trait]
impl Processor for Forward {
    type Input = In;

    fn name(&self) -> &str {
        "forward"
    }

    async fn process(&mut self, input: In, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit_event(OUT, &input)
    }
}

/// Emits each key's running sum.
#[derive(Default)]
struct Summer {
    attempts: HashMap<i64, u32>,
}

#[async_trait::async_trait]
impl Processor for Summer {
    type Input = In;

    fn name(&self) -> &str {
        "summer"
    }

    async fn process(&mut self, input: In, ctx: &mut Context<'_>) -> Result<()> {
        let attempt = self.attempts.entry(ctx.offset()).or_default();
        *attempt += 1;
        if *attempt <= input.transient {
            return Err(Error::transient("not yet"));
        }
        if input.slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(input.slow_ms)).await;
        }
        if input.big_state > 0 {
            ctx.state().put("blob", &"x".repeat(input.big_state))?;
        }
        let sum = ctx.state().get::<i64>(&input.key)?.unwrap_or(0) + input.amount;
        ctx.state().put(&input.key, &sum)?;
        ctx.emit(OUT, &input.key, &sum)
    }
}

/// One batch's surroundings: the fake, a real transaction log in a temporary directory.
struct Rig {
    kafka: FakeKafka,
    txlog: Arc<TxLog>,
    stats: Arc<Stats>,
    config: EngineConfig,
    declared: BTreeSet<String>,
    limits: BTreeMap<String, usize>,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new(delivery: DeliveryMode) -> Rig {
        let dir = tempfile::tempdir().expect("temp dir");
        let (txlog, _) = TxLog::open(&dir.path().join("log")).expect("log");
        let mut config = EngineConfig::new("fake:9092", "g", "a", "in", dir.path())
            .output(OUT)
            .delivery(delivery);
        config.max_retry_time = Duration::from_secs(2);
        Rig {
            kafka: FakeKafka::default(),
            txlog: Arc::new(txlog),
            stats: Arc::default(),
            config,
            declared: [OUT.to_owned()].into(),
            limits: [
                (OUT.to_owned(), 1_000_000),
                (CHANGELOG.to_owned(), 1_000_000),
                (DLQ.to_owned(), 1_000_000),
            ]
            .into(),
            _dir: dir,
        }
    }

    fn batch(&self) -> Batch<'_, FakeKafka, FakeKafka> {
        Batch {
            config: &self.config,
            consumer: &self.kafka,
            producer: &self.kafka,
            txlog: &self.txlog,
            stats: &self.stats,
            declared: &self.declared,
            changelog: CHANGELOG,
            output_limits: &self.limits,
        }
    }

    async fn run(&self, records: Vec<Record>) -> Result<()> {
        self.batch().run(&mut Summer::default(), records).await
    }

    /// Recovers from `error` as the engine does, with partition 0 assigned and the
    /// calls so far cleared; returns the `Resync` it used, floors and all.
    async fn recover(&self, error: &Error) -> Resync<'_, FakeKafka, FakeKafka> {
        self.kafka.assign(&[0]);
        self.kafka.clear_calls();
        let resync = self.kafka.resync(&self.config, &self.stats);
        let mut producer = self.kafka.clone();
        crate::engine::recover::recover(&resync, &self.kafka, &mut producer, &[0].into(), error)
            .await
            .expect("recovered");
        resync
    }

    /// Commits a batch at offset 0, fails the next one's commit and recovers: partition
    /// 0 has a floor at 1. Returns the `Resync` with it.
    async fn floor_after_a_failed_commit(&self) -> Resync<'_, FakeKafka, FakeKafka> {
        self.run(vec![amount(0, "a", 1)]).await.expect("batch");
        self.kafka
            .fail(Kind::Commit, None, 1, kafka_error(ErrorClass::Retriable));
        let error = self
            .run(vec![amount(1, "b", 2)])
            .await
            .expect_err("the commit failed");
        self.recover(&error).await
    }

    /// The sums a `read_committed` reader of the output sees.
    fn sums(&self) -> Vec<i64> {
        self.kafka
            .committed(OUT)
            .iter()
            .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()).expect("sum"))
            .collect()
    }

    fn state(&self, key: &str) -> Option<i64> {
        self.txlog
            .state(0, key.as_bytes())
            .expect("state")
            .map(|v| serde_json::from_slice(&v).expect("json"))
    }
}

fn record(offset: i64, input: In) -> Record {
    Record {
        topic: "in".into(),
        partition: 0,
        offset,
        key: Some(input.key.clone().into_bytes()),
        value: Some(serde_json::to_vec(&input).expect("json")),
        headers: Vec::new(),
        timestamp_ms: None,
    }
}

fn amount(offset: i64, id: &str, amount: i64) -> Record {
    record(
        offset,
        In {
            id: Some(id.into()),
            key: "k".into(),
            amount,
            ..In::default()
        },
    )
}

/// The calls, with sends to a topic shown by its name.
fn shape(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| match c {
            Call::Send { topic, .. } => format!("send {topic}"),
            Call::SendOffsets(o) => format!("offsets {o:?}"),
            Call::ConsumerCommit(o) => format!("consumer commit {o:?}"),
            other => format!("{other:?}").to_lowercase(),
        })
        .collect()
}

#[tokio::test]
async fn exactly_once_writes_outputs_changelog_and_offsets_in_one_transaction() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect("batch");
    let calls = shape(&rig.kafka.calls());
    assert_eq!(calls.first().map(String::as_str), Some("begin"));
    assert_eq!(calls.last().map(String::as_str), Some("commit"));
    assert_eq!(
        calls[calls.len() - 2],
        "offsets [(0, 2)]",
        "offsets go in last: {calls:?}"
    );
    assert_eq!(calls.iter().filter(|c| *c == "send out").count(), 2);
    // The changelog: two dedup entries, one state key, one progress record.
    let changelog = rig.kafka.committed(CHANGELOG);
    assert_eq!(changelog.len(), 4, "{changelog:?}");
    assert_eq!(
        changelog.last().and_then(|r| r.key.clone()),
        Some(b"p:".to_vec())
    );
    assert_eq!(rig.sums(), [1, 3]);
    assert_eq!(rig.state("k"), Some(3));
    assert_eq!(rig.txlog.progress(0).expect("progress"), Some(2));
    assert_eq!(rig.kafka.committed_offsets(), [(0, 2)].into());
}

/// librdkafka's transactional error matrix, at each call of a transaction: whatever
/// fails, nothing of the batch is visible and nothing reaches the transaction log.
#[tokio::test]
async fn an_error_at_any_call_of_the_transaction_leaves_nothing_behind() {
    for kind in [Kind::Begin, Kind::Send, Kind::SendOffsets, Kind::Commit] {
        for class in [
            ErrorClass::Retriable,
            ErrorClass::Abortable,
            ErrorClass::Fatal,
            ErrorClass::Rejected,
        ] {
            let rig = Rig::new(DeliveryMode::ExactlyOnce);
            rig.kafka.fail(kind, None, 1, kafka_error(class));
            let result = rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)]).await;
            let error = result.expect_err(&format!("{kind:?} {class:?}: the batch went through"));
            assert_eq!(
                (error.is_retriable(), error.is_fatal(), error.is_rejection()),
                (
                    class == ErrorClass::Retriable,
                    class == ErrorClass::Fatal,
                    class == ErrorClass::Rejected
                ),
                "{kind:?} {class:?}: the class is kept: {error}"
            );
            assert!(rig.sums().is_empty(), "{kind:?} {class:?}: outputs visible");
            assert!(rig.kafka.committed(CHANGELOG).is_empty());
            assert!(rig.kafka.committed_offsets().is_empty());
            assert_eq!(rig.state("k"), None, "{kind:?} {class:?}: state applied");
            assert!(!rig.txlog.is_processed(0, "a").expect("read"));
        }
    }
}

#[tokio::test]
async fn at_least_once_writes_the_changelog_only_after_the_outputs_landed() {
    let rig = Rig::new(DeliveryMode::AtLeastOnce);
    rig.run(vec![amount(0, "a", 1)]).await.expect("batch");
    let calls = shape(&rig.kafka.calls());
    let first_changelog = calls
        .iter()
        .position(|c| c == "send g-txlog")
        .expect("changelog");
    let flush = calls.iter().position(|c| c == "flush").expect("flush");
    let output = calls.iter().position(|c| c == "send out").expect("output");
    assert!(output < flush && flush < first_changelog, "{calls:?}");
    assert_eq!(
        calls.last().map(String::as_str),
        Some("consumer commit [(0, 1)]")
    );

    // An output that fails to land: no dedup entry, no commit, so the retry processes it.
    let rig = Rig::new(DeliveryMode::AtLeastOnce);
    rig.kafka.fail(
        Kind::Landing,
        Some(OUT),
        1,
        kafka_error(ErrorClass::Rejected),
    );
    assert!(rig.run(vec![amount(0, "a", 1)]).await.is_err());
    let calls = shape(&rig.kafka.calls());
    assert!(!calls.iter().any(|c| c == "send g-txlog"), "{calls:?}");
    assert!(rig.kafka.committed_offsets().is_empty());
    assert!(!rig.txlog.is_processed(0, "a").expect("read"));
}

#[tokio::test]
async fn at_most_once_commits_offsets_before_it_processes() {
    let rig = Rig::new(DeliveryMode::AtMostOnce);
    rig.kafka
        .fail(Kind::Send, Some(OUT), 1, kafka_error(ErrorClass::Other));
    assert!(rig.run(vec![amount(0, "a", 1)]).await.is_err());
    let calls = shape(&rig.kafka.calls());
    assert_eq!(calls[0], "consumer commit [(0, 1)]", "{calls:?}");
    assert_eq!(rig.kafka.committed_offsets(), [(0, 1)].into());
}

#[tokio::test]
async fn duplicates_are_skipped_in_a_batch_and_after_it_and_empty_ids_are_no_ids() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.run(vec![amount(0, "a", 1), amount(1, "a", 1), amount(2, "", 5)])
        .await
        .expect("first");
    rig.run(vec![amount(3, "a", 1), amount(4, "", 5)])
        .await
        .expect("second");
    assert_eq!(rig.sums(), [1, 6, 11]);
    let stats = rig.stats.snapshot();
    assert_eq!(stats.duplicates_skipped, 2);
    assert_eq!(stats.without_event_id, 2);
}

#[tokio::test]
async fn a_transient_failure_commits_what_came_before_and_retries_in_a_new_transaction() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let failing = record(
        1,
        In {
            id: Some("b".into()),
            key: "k".into(),
            amount: 2,
            transient: 2,
            ..In::default()
        },
    );
    rig.run(vec![amount(0, "a", 1), failing, amount(2, "c", 3)])
        .await
        .expect("batch");
    let calls = shape(&rig.kafka.calls());
    let offsets: Vec<&String> = calls.iter().filter(|c| c.starts_with("offsets")).collect();
    // The first record alone, then (an empty part is aborted) the rest.
    assert_eq!(
        offsets.first().map(|s| s.as_str()),
        Some("offsets [(0, 1)]")
    );
    assert_eq!(offsets.last().map(|s| s.as_str()), Some("offsets [(0, 3)]"));
    assert!(calls.iter().any(|c| c == "abort"), "{calls:?}");
    assert_eq!(rig.sums(), [1, 3, 6]);
}

#[tokio::test]
async fn a_batch_commits_at_half_the_transaction_timeout() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.config.transaction_timeout = Duration::from_millis(60);
    let slow = |offset: i64, id: &str| {
        record(
            offset,
            In {
                id: Some(id.into()),
                key: "k".into(),
                amount: 1,
                slow_ms: 20,
                ..In::default()
            },
        )
    };
    rig.run(vec![slow(0, "a"), slow(1, "b"), slow(2, "c"), slow(3, "d")])
        .await
        .expect("batch");
    let commits = rig
        .kafka
        .calls()
        .iter()
        .filter(|c| **c == Call::Commit)
        .count();
    assert!(
        commits >= 2,
        "{commits} commit(s) for 80 ms of work and a 60 ms timeout"
    );
    assert_eq!(rig.sums(), [1, 2, 3, 4]);
}

#[tokio::test]
async fn a_fence_after_the_transaction_timeout_is_reported_as_a_timeout() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.config.transaction_timeout = Duration::from_millis(10);
    rig.kafka.fail(Kind::Commit, None, 1, || Error::Fenced {
        what: "transactional.id `g-a`".into(),
        detail: "PRODUCER_FENCED".into(),
    });
    let slow = record(
        0,
        In {
            id: Some("a".into()),
            key: "k".into(),
            amount: 1,
            slow_ms: 20,
            ..In::default()
        },
    );
    match rig.run(vec![slow]).await {
        Err(Error::TransactionTimedOut { timeout, .. }) => {
            assert_eq!(timeout, Duration::from_millis(10))
        }
        other => panic!("expected TransactionTimedOut, got {other:?}"),
    }
    // A fence in a transaction younger than the timeout is a real fence.
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka.fail(Kind::Commit, None, 1, || Error::Fenced {
        what: "transactional.id `g-a`".into(),
        detail: "PRODUCER_FENCED".into(),
    });
    assert!(matches!(
        rig.run(vec![amount(0, "a", 1)]).await,
        Err(Error::Fenced { .. })
    ));
}

#[tokio::test]
async fn a_state_value_over_the_changelog_limit_is_dead_lettered_before_the_transaction() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.limits.insert(CHANGELOG.into(), 200);
    let big = record(
        1,
        In {
            id: Some("b".into()),
            key: "k".into(),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    rig.run(vec![amount(0, "a", 1), big, amount(2, "c", 3)])
        .await
        .expect("batch");
    assert_eq!(rig.sums(), [1, 4], "the big record changed nothing");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header("onceflow-error-class").as_deref(),
        Some("state-too-large")
    );
    assert_eq!(rig.stats.snapshot().dead_lettered, 1);
}

#[tokio::test]
async fn a_dead_letter_over_its_limit_goes_without_its_value() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.limits.insert(DLQ.into(), 600);
    rig.limits.insert(CHANGELOG.into(), 200);
    let big = record(
        0,
        In {
            id: Some("b".into()),
            key: "k".repeat(300),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    rig.run(vec![big]).await.expect("batch");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value, None);
    assert!(dead[0].header("onceflow-value-omitted").is_some());
}

/// `dlq replay` drops the headers dead-lettering adds (`wire::DEAD_LETTER_HEADERS`) and
/// keeps the record's own, its event ID header above all: each header of a dead letter
/// (one over its limit, so it has them all but the timer's) is one or the other.
#[tokio::test]
async fn a_replay_drops_every_header_dead_lettering_adds_and_no_other() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.limits.insert(DLQ.into(), 900);
    rig.limits.insert(CHANGELOG.into(), 200);
    let mut big = record(
        0,
        In {
            key: "k".repeat(300),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    let id_header = crate::wire::EVENT_ID_HEADER.to_owned();
    big.headers = vec![
        (id_header.clone(), Some(b"b".to_vec())),
        ("trace".into(), None),
    ];
    rig.run(vec![big]).await.expect("batch");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    let mut added = Vec::new();
    for (name, _) in &dead[0].headers {
        let own = *name == id_header || name == "trace";
        assert_eq!(
            crate::wire::DEAD_LETTER_HEADERS.contains(&name.as_str()),
            !own,
            "{name}: a replay must drop what dead-lettering added and keep the rest"
        );
        if !own {
            added.push(name.as_str());
        }
    }
    assert_eq!(
        added.len() + 2,
        crate::wire::DEAD_LETTER_HEADERS.len(),
        "all but the timer's and the replay's own mark: {added:?}"
    );
}

#[tokio::test]
async fn a_record_failed_alone_is_dead_lettered_with_its_offset_in_its_own_transaction() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let refused = amount(7, "x", 1);
    rig.batch()
        .fail_alone(
            &refused,
            crate::engine::dead_letters::FailureClass::Rejected,
            kafka_error(ErrorClass::Rejected)(),
        )
        .await
        .expect("dead-lettered");
    let calls = shape(&rig.kafka.calls());
    assert_eq!(calls.first().map(String::as_str), Some("begin"));
    assert!(calls.contains(&"offsets [(0, 8)]".to_owned()), "{calls:?}");
    let dead = rig.kafka.committed(DLQ);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].header("onceflow-error-class").as_deref(),
        Some("rejected")
    );
    assert_eq!(
        dead[0].header("onceflow-source-offset").as_deref(),
        Some("7")
    );
    assert!(
        !rig.txlog.is_processed(0, "x").expect("read"),
        "a dead letter is not processed"
    );
}

/// A commit whose outcome the engine cannot know (its answer was an error, yet it went
/// through). Recovery assumes nothing: it reads the group's committed offsets, replays the
/// changelog up to them and moves there, the batch's end; nothing is processed twice.
#[tokio::test(start_paused = true)]
async fn a_commit_whose_outcome_is_unknown_is_settled_by_the_committed_offsets() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka
        .fail_after_applying(Kind::Commit, 1, kafka_error(ErrorClass::Retriable));
    let failed = rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)]).await;
    let error = failed.expect_err("the commit answered with an error");
    assert_eq!(rig.sums(), [1, 3], "and went through");

    rig.recover(&error).await;
    let calls = rig.kafka.calls();
    assert!(calls.contains(&Call::Restore(0, Some(2))), "{calls:?}");
    assert_eq!(
        calls.last(),
        Some(&Call::Seek(vec![(0, Some(2))])),
        "{calls:?}"
    );
    assert_eq!(rig.sums(), [1, 3]);
}

/// The counters of a batch whose commit answered with an error: counted as committed
/// when the committed offsets show it went through (its outputs are visible, and what it
/// skipped was skipped), as aborted when they show it did not. Before, a batch that went
/// through after all was counted as neither, and the broker tests' exact
/// `duplicates_skipped` failed whenever such a batch held a duplicate.
#[tokio::test(start_paused = true)]
async fn a_batch_that_went_through_after_all_is_counted_as_committed() {
    for went_through in [true, false] {
        let rig = Rig::new(DeliveryMode::ExactlyOnce);
        let failure = kafka_error(ErrorClass::Retriable);
        if went_through {
            rig.kafka.fail_after_applying(Kind::Commit, 1, failure);
        } else {
            rig.kafka.fail(Kind::Commit, None, 1, failure);
        }
        // "a" twice: the second is a duplicate.
        let records = vec![amount(0, "a", 1), amount(1, "a", 1), amount(2, "b", 2)];
        let error = rig.run(records).await.expect_err("the commit failed");
        rig.recover(&error).await;
        let s = rig.stats.snapshot();
        let counted = (
            s.records_in,
            s.outputs,
            s.duplicates_skipped,
            s.commits,
            s.aborts,
        );
        if went_through {
            assert_eq!(rig.sums(), [1, 3]);
            assert_eq!(counted, (3, 2, 1, 1, 0), "went through: {s:?}");
        } else {
            assert!(rig.sums().is_empty());
            assert_eq!(counted, (0, 0, 0, 0, 1), "aborted: {s:?}");
        }
    }
}

/// Fail closed (issue 40): a commit that timed out on the client but went through is
/// not retried or aborted on the same producer; a new producer takes over, and the
/// committed offsets show the batch committed: its outputs are visible once and it
/// counts as committed.
#[tokio::test(start_paused = true)]
async fn a_commit_that_timed_out_but_went_through_is_settled_by_a_new_producer() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka
        .fail_after_applying(Kind::Commit, 1, || Error::Kafka {
            operation: "commit_transaction".into(),
            code: crate::KafkaCode::OPERATION_TIMED_OUT,
            message: "Local: Timed out".into(),
            class: ErrorClass::Retriable,
        });
    let error = rig
        .run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect_err("the commit timed out");
    rig.recover(&error).await;
    let calls = rig.kafka.calls();
    assert!(calls.contains(&Call::Renew), "{calls:?}");
    assert!(!calls.contains(&Call::Abort), "{calls:?}");
    assert_eq!(
        calls.last(),
        Some(&Call::Seek(vec![(0, Some(2))])),
        "{calls:?}"
    );
    assert_eq!(rig.sums(), [1, 3]);
    let s = rig.stats.snapshot();
    assert_eq!((s.commits, s.aborts), (1, 0), "{s:?}");
}

/// A commit that went through while the group's committed offsets still read the batch's
/// start (seen on the three-node cluster after a killed coordinator: the batch's records
/// came again, skipped only because their event IDs were in the log; records without an
/// ID would have been processed twice). The changelog, committed in the same transaction,
/// shows where the batch ended: recovery goes on from there, and counts the batch.
#[tokio::test(start_paused = true)]
async fn a_commit_the_changelog_shows_is_gone_past_when_the_offsets_lag() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.kafka
        .fail_after_applying(Kind::Commit, 1, kafka_error(ErrorClass::Retriable));
    let error = rig
        .run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect_err("the commit answered with an error");
    rig.kafka.committed_offset_reads(0, 0);
    rig.kafka.progress_after_replay(0, 2);

    let resync = rig.recover(&error).await;
    let calls = rig.kafka.calls();
    assert_eq!(
        calls.last(),
        Some(&Call::Seek(vec![(0, Some(2))])),
        "{calls:?}"
    );
    let s = rig.stats.snapshot();
    assert_eq!((s.outputs, s.commits, s.aborts), (2, 1, 0), "{s:?}");
    // What a lagging consumer brings from below that point is not processed again.
    let mut records = vec![amount(0, "a", 1), amount(1, "b", 2), amount(2, "c", 3)];
    assert_eq!(resync.floors(), [0]);
    assert_eq!(resync.drop_committed(&mut records).below, 2);
    assert_eq!(rig.stats.snapshot().already_committed, 2);
    assert_eq!(records.iter().map(|r| r.offset).collect::<Vec<_>>(), [2]);
    // Once the partition is past its floor, the polls that follow are not looked at.
    assert!(resync.floors().is_empty(), "{:?}", resync.floors());
}

/// Hole G of issue 40: a partition's first record past its floor is sought back to
/// once (the consumer may have started past the committed offset); still past it after
/// the seek (transaction markers there), it is taken, and nothing loops.
#[tokio::test(start_paused = true)]
async fn a_first_record_past_the_floor_is_sought_back_to_once() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let resync = rig.floor_after_a_failed_commit().await;
    assert_eq!(resync.floors(), [0]);
    let offsets = |records: &[Record]| records.iter().map(|r| r.offset).collect::<Vec<_>>();

    let mut records = vec![amount(3, "c", 1), amount(4, "d", 1)];
    let placed = resync.drop_committed(&mut records);
    assert_eq!(placed.seek, [(0, Some(1))]);
    assert!(
        records.is_empty(),
        "not processed before the seek: {records:?}"
    );
    // Offsets 1 and 2 hold markers: the seek brings 3 first again.
    let mut records = vec![amount(3, "c", 1), amount(4, "d", 1)];
    let placed = resync.drop_committed(&mut records);
    assert!(
        placed.seek.is_empty() && placed.corrected == 0,
        "{placed:?}"
    );
    assert_eq!(offsets(&records), [3, 4]);
    assert!(resync.floors().is_empty());

    // A seek that finds what the consumer had started past is a correction.
    let error = {
        rig.kafka
            .fail(Kind::Commit, None, 1, kafka_error(ErrorClass::Retriable));
        rig.run(vec![amount(1, "b", 2)]).await.expect_err("failed")
    };
    let resync = rig.recover(&error).await;
    let mut records = vec![amount(3, "c", 1)];
    assert_eq!(resync.drop_committed(&mut records).seek, [(0, Some(1))]);
    let mut records = vec![amount(1, "b", 2), amount(2, "x", 1), amount(3, "c", 1)];
    let placed = resync.drop_committed(&mut records);
    assert_eq!((placed.below, placed.corrected), (0, 1), "{placed:?}");
    assert_eq!(offsets(&records), [1, 2, 3]);
}

/// The floor a catch-up sets goes with its partition: a revoked partition's is forgotten
/// (its next owner catches up and sets its own), so no poll after looks records up.
#[tokio::test(start_paused = true)]
async fn a_revoked_partition_forgets_its_floor() {
    use crate::kafka::{Polled, Rebalanced};

    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let resync = rig.floor_after_a_failed_commit().await;
    assert_eq!(resync.floors(), [0]);
    let mut owned: BTreeSet<i32> = [0].into();
    let mut polled = Polled {
        records: vec![amount(1, "b", 2)],
        rebalances: vec![Rebalanced::Revoked(vec![0])],
    };
    crate::engine::serve::follow(&resync, &rig.kafka, &mut owned, &mut polled)
        .await
        .expect("followed");
    assert!(owned.is_empty() && polled.records.is_empty());
    assert!(resync.floors().is_empty(), "{:?}", resync.floors());
}

/// Issue 16, part 3: the processor emits to its declared name (`out`, what
/// `Self::OUT` would be); the configuration renamed it, so the record goes to the
/// configured topic, and the declared name's own topic gets nothing.
#[tokio::test]
async fn an_emit_to_a_renamed_output_goes_to_the_configured_topic() {
    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    rig.config = rig.config.clone().rename_output(OUT, "prod.out");
    rig.declared = ["prod.out".to_owned()].into();
    rig.limits.insert("prod.out".into(), 1_000_000);
    rig.run(vec![amount(0, "a", 1), amount(1, "b", 2)])
        .await
        .expect("batch");
    assert_eq!(rig.kafka.committed("prod.out").len(), 2);
    assert!(rig.kafka.committed(OUT).is_empty());
}

/// Issue 16, part 4: a processor emits a record with headers and its own timestamp
/// (here the input's event time, a day back); both reach the output as given, and the
/// headers count against the topic's size limit like the key and value.
#[tokio::test]
async fn an_output_carries_the_headers_and_timestamp_the_processor_gives_it() {
    struct Tagger;

    #[async_trait::async_trait]
    impl Processor for Tagger {
        type Input = In;

        fn name(&self) -> &str {
            "tagger"
        }

        async fn process(&mut self, input: In, ctx: &mut Context<'_>) -> Result<()> {
            let at = ctx.record().timestamp_ms.unwrap_or_default() - 86_400_000;
            let record = crate::processor::OutputRecord::json(&input.amount)?
                .key(input.key.clone())
                .header("source-offset", ctx.offset().to_string())
                .header("tag", "x".repeat(input.big_state))
                .timestamp_ms(at);
            ctx.emit_record(OUT, record)
        }
    }

    let mut rig = Rig::new(DeliveryMode::ExactlyOnce);
    let mut first = amount(0, "a", 1);
    first.timestamp_ms = Some(1_796_000_000_000);
    rig.batch()
        .run(&mut Tagger, vec![first])
        .await
        .expect("batch");
    let out = rig.kafka.committed(OUT);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].header("source-offset").as_deref(), Some("0"));
    assert_eq!(out[0].timestamp_ms, Some(1_796_000_000_000 - 86_400_000));
    assert_eq!(out[0].key.as_deref(), Some(&b"k"[..]));

    // Headers count: a header that takes the record over the limit fails the record
    // before its transaction, as a large value does.
    rig.limits.insert(OUT.into(), 300);
    let big = record(
        1,
        In {
            id: Some("b".into()),
            key: "k".into(),
            amount: 2,
            big_state: 500,
            ..In::default()
        },
    );
    rig.batch()
        .run(&mut Tagger, vec![big])
        .await
        .expect("batch");
    assert_eq!(
        rig.kafka.committed(OUT).len(),
        1,
        "the big one was not output"
    );
    assert_eq!(rig.kafka.committed(DLQ).len(), 1, "it was dead-lettered");
}

#[tokio::test]
async fn an_emitted_event_is_keyed_by_its_own_key() {
    let rig = Rig::new(DeliveryMode::ExactlyOnce);
    let keyless = In {
        id: Some("b".into()),
        ..In::default()
    };
    rig.batch()
        .run(&mut Forward, vec![amount(0, "a", 1), record(1, keyless)])
        .await
        .expect("batch");
    let keys: Vec<Option<Vec<u8>>> = rig
        .kafka
        .committed(OUT)
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(
        keys,
        [Some(b"k".to_vec()), None],
        "the event's key, or none"
    );
}
