//! A processor tested in milliseconds, without a broker (feature `testing`).
//!
//! [`TestDriver`] runs **the engine's own code** — its loop, batches, dedup, dead letters,
//! transactions, recovery after a failed batch and the changelog's replay after a
//! restart — over an in-memory log with Kafka's transaction semantics: a `read_committed`
//! reader sees a transaction's records only once it commits, an aborted one never, and
//! the input offsets commit with the transaction. The transaction log is the real one
//! (redb, in a temporary directory). What it does not have is a broker's failures of its
//! own; the ones a test names are injected ([`TestDriver::fail`], [`TestDriver::crash_at`],
//! [`TestDriver::kill`]). A crash, as in a process, loses the transaction log's applies
//! that were not synced to disk yet (`txlog_sync_interval`): the restart replays them.
//!
//! ```
//! # use onceflow::{Context, Event, Processor, Result};
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Order { id: String, customer: String, amount: i64 }
//! # impl Event for Order {
//! #     fn event_id(&self) -> Option<String> { Some(self.id.clone()) }
//! #     fn key(&self) -> Option<String> { Some(self.customer.clone()) }
//! # }
//! # #[derive(Clone)]
//! # struct Billing;
//! # #[onceflow::async_trait]
//! # impl Processor for Billing {
//! #     type Input = Order;
//! #     fn name(&self) -> &str { "billing" }
//! #     fn input_topic(&self) -> Option<&str> { Some("orders") }
//! #     fn output_topics(&self) -> &[&str] { &["invoices"] }
//! #     async fn process(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
//! #         let total = ctx.state().get::<i64>(&order.customer)?.unwrap_or(0) + order.amount;
//! #         ctx.state().put(&order.customer, &total)?;
//! #         ctx.emit("invoices", &order.customer, &total)
//! #     }
//! # }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! use onceflow::testing::{CrashPoint, TestDriver};
//!
//! let mut driver = TestDriver::new(Billing);
//! let order = |id: &str, amount| Order { id: id.into(), customer: "c-1".into(), amount };
//! driver.pipe(&order("o-1", 5))?;
//! driver.pipe(&order("o-1", 5))?; // the same event again: skipped
//! driver.process().await?;
//! assert_eq!(driver.stats().duplicates_skipped, 1);
//!
//! driver.crash_at(CrashPoint::AfterCommitBeforeApply, 1);
//! driver.pipe(&order("o-2", 7))?;
//! driver.process().await?; // crashes once, restarts, replays the changelog
//! assert_eq!(driver.output_values::<i64>("invoices")?, [5, 12]);
//! assert_eq!(driver.state::<i64>(0, "c-1")?, Some(12));
//! # Ok(())
//! # }
//! ```
//!
//! Time: the driver's wall clock (the time of dedup entries, so of the dedup window)
//! starts at the system's time and moves only with [`TestDriver::advance_time`]; a piped
//! record's timestamp is that clock unless the record sets its own. The engine's waits
//! (a transient failure's back-off, 100 ms after a failed batch) are real: run a test
//! that has many under `#[tokio::test(start_paused = true)]` to skip them.

pub(crate) mod kafka;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::clock::Clock;
use crate::crash::CrashPlan;
use crate::engine::drive::{self, Instance, Outcome};
use crate::engine::{Stats, StatsSnapshot};
use crate::event::{Codec, Event, Json};
use crate::processor::Processor;
use crate::testing::kafka::CommitFate as Fate;
use crate::testing::kafka::{FakeKafka, Kind, Stored, injected};
use crate::txlog::TxLog;
use crate::{EngineConfig, Error, ErrorClass, Result};

pub use crate::kafka::{OutgoingRecord, Record};

/// A point in the engine where a test can crash it (the failpoints of the process crash
/// tests, by the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrashPoint {
    /// A record was processed; its outputs are not sent yet.
    AfterProcess,
    /// A record's outputs were sent into the open transaction.
    AfterProduce,
    /// The batch's changelog records were sent; its offsets not yet.
    BeforeSendOffsets,
    /// Everything is in the transaction; it is not committed.
    BeforeCommit,
    /// The transaction committed; the transaction log was not updated.
    AfterCommitBeforeApply,
    /// Replaying the changelog after a restart, between two chunks of 64 records: a
    /// replay of one chunk or less never reaches it (pipe more than 64 records' worth of
    /// changelog first, and check [`TestDriver::crashes`] to see that it fired).
    DuringReplay,
}

impl CrashPoint {
    /// Every crash point, in the order a batch passes them (replay last).
    pub const ALL: [CrashPoint; 6] = [
        CrashPoint::AfterProcess,
        CrashPoint::AfterProduce,
        CrashPoint::BeforeSendOffsets,
        CrashPoint::BeforeCommit,
        CrashPoint::AfterCommitBeforeApply,
        CrashPoint::DuringReplay,
    ];

    /// The failpoint's name (`FAILPOINTS=<name>=return` crashes a real process there).
    pub const fn name(self) -> &'static str {
        match self {
            CrashPoint::AfterProcess => "onceflow-after-process",
            CrashPoint::AfterProduce => "onceflow-after-produce",
            CrashPoint::BeforeSendOffsets => "onceflow-before-send-offsets",
            CrashPoint::BeforeCommit => "onceflow-before-commit",
            CrashPoint::AfterCommitBeforeApply => "onceflow-after-commit-before-apply",
            CrashPoint::DuringReplay => "onceflow-during-replay",
        }
    }

    fn from_name(name: &str) -> Option<CrashPoint> {
        CrashPoint::ALL
            .into_iter()
            .find(|point| point.name() == name)
    }
}

/// A call to Kafka a test can make fail ([`TestDriver::fail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KafkaCall {
    /// Beginning a transaction.
    Begin,
    /// Sending a record (output, changelog or dead letter).
    Send,
    /// Adding the input offsets to the transaction.
    SendOffsets,
    /// Committing the transaction.
    Commit,
    /// Aborting the transaction.
    Abort,
    /// Reading the group's committed offsets (at an assignment, after a failed batch).
    CommittedOffsets,
    /// A poll of a consumer held while a catch-up or an undo takes long: failing, it
    /// gives that work up.
    KeepAlive,
}

/// What becomes of a commit ([`TestDriver::commit_fate`]): the ways a transaction's
/// commit goes wrong that its client cannot see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFate {
    /// The coordinator accepts it and the client hears so, but its markers land a few
    /// seconds later (or when the producer begins its next transaction, or a new
    /// producer of its transactional ID is made, which wait for them). Until then its
    /// records hold the last stable offset, and the group's committed offsets read
    /// without them, as during a coordinator failover.
    MarkersLate,
    /// As [`CommitFate::MarkersLate`], but the client's request times out: it cannot
    /// know that the commit went through.
    TimesOutInDoubt,
    /// The request times out before it reaches the coordinator, and lands later: with
    /// the same producer's next offsets to a transaction, committing whatever that
    /// transaction holds then (librdkafka has no Transactions V2, KIP-890 part 2),
    /// unless a new producer bumped the epoch first.
    TimesOutLate,
}

impl CommitFate {
    fn fake(self) -> Fate {
        match self {
            CommitFate::MarkersLate => Fate::MarkersLate,
            CommitFate::TimesOutInDoubt => Fate::TimesOutInDoubt,
            CommitFate::TimesOutLate => Fate::TimesOutLate,
        }
    }
}

impl KafkaCall {
    fn kind(self) -> Kind {
        match self {
            KafkaCall::Begin => Kind::Begin,
            KafkaCall::Send => Kind::Send,
            KafkaCall::SendOffsets => Kind::SendOffsets,
            KafkaCall::Commit => Kind::Commit,
            KafkaCall::Abort => Kind::Abort,
            KafkaCall::CommittedOffsets => Kind::Committed,
            KafkaCall::KeepAlive => Kind::KeepAlive,
        }
    }
}

/// Runs a processor over an in-memory Kafka, by the engine's own code. See the
/// [module](self) for what it is and is not.
///
/// Its counters ([`TestDriver::stats`]) add up over restarts, unlike a process's.
///
/// The processor must not keep what matters in its own fields: a start builds a new one,
/// as a restarted process does; the driver's crash tests find such a processor out.
pub struct TestDriver<P: Processor> {
    make: Box<dyn FnMut() -> P + Send>,
    config: EngineConfig,
    kafka: FakeKafka,
    stats: Arc<Stats>,
    now: Arc<AtomicI64>,
    plan: Arc<CrashPlan>,
    dir: tempfile::TempDir,
    /// The instances of the group: one unless [`TestDriver::instances`] says more.
    slots: Vec<Slot<P>>,
    /// The processor's declarations were merged into the configuration.
    merged: bool,
    crashes: Vec<CrashPoint>,
}

/// One instance of the group: its own member of the in-memory Kafka (consumer and
/// producer), its own transaction log, and the running engine (none: not started, or
/// gone after a kill, a crash or a stop).
struct Slot<P> {
    kafka: FakeKafka,
    instance_id: String,
    txlog: Option<Arc<TxLog>>,
    instance: Option<Instance<P>>,
}

impl<P> Slot<P> {
    fn new(kafka: FakeKafka, instance_id: String) -> Self {
        Slot {
            kafka,
            instance_id,
            txlog: None,
            instance: None,
        }
    }
}

impl<P: Processor> std::fmt::Debug for TestDriver<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDriver")
            .field("config", &self.config)
            .field("crashes", &self.crashes)
            .finish_non_exhaustive()
    }
}

impl<P: Processor + Clone> TestDriver<P> {
    /// A driver for `processor`; each start (the first, and after a crash or restart)
    /// takes a fresh clone of it, as a restarted process builds its processor again.
    pub fn new(processor: P) -> Self {
        TestDriver::from_fn(move || processor.clone())
    }
}

impl<P: Processor> TestDriver<P> {
    /// A driver that makes the processor with `make` at each start.
    ///
    /// The configuration is the engine's defaults for group `<processor name>`, instance
    /// `test`, the input the processor declares (else `input`) with one partition.
    pub fn from_fn(mut make: impl FnMut() -> P + Send + 'static) -> Self {
        let sample = make();
        let dir = tempfile::tempdir().expect("a temporary directory for the transaction log");
        let input = sample.input_topic().unwrap_or("input").to_owned();
        let mut config = EngineConfig::new(
            "in-memory",
            sample.name().to_owned(),
            "test",
            input,
            dir.path().to_path_buf(),
        );
        let now = Arc::new(AtomicI64::new(Clock::System.now_ms()));
        config.clock = Clock::Manual(Arc::clone(&now));
        drop(sample);
        let kafka = FakeKafka::default();
        kafka.use_clock(config.clock.clone());
        let slots = vec![Slot::new(kafka.clone(), config.instance_id.clone())];
        TestDriver {
            make: Box::new(make),
            config,
            kafka,
            stats: Arc::default(),
            now,
            plan: Arc::default(),
            dir,
            slots,
            merged: false,
            crashes: Vec::new(),
        }
    }

    /// Changes the configuration (delivery mode, `on_error`, batch size, dedup window,
    /// renamed outputs, …) before the first record is processed. The bootstrap servers,
    /// state directory and clock are the driver's.
    pub fn configure(mut self, change: impl FnOnce(EngineConfig) -> EngineConfig) -> Self {
        assert!(
            self.slots.iter().all(|slot| slot.instance.is_none()) && !self.merged,
            "TestDriver::configure comes before the first process()"
        );
        let clock = self.config.clock.clone();
        let state_dir = self.config.state_dir.clone();
        self.config = change(self.config);
        self.config.clock = clock;
        self.config.state_dir = state_dir;
        self.slots[0].instance_id = self.config.instance_id.clone();
        self
    }

    /// The group has `count` instances (default 1), each with its own member of the
    /// group, producer and state directory: the first is the configuration's instance
    /// ID, the others `<it>-1`, `<it>-2`, …. They share the input's partitions as an
    /// eager rebalance does, and every start, stop, kill or lost session moves them.
    /// With more than one, the coordinator aborts a transaction left open longer than
    /// the transaction timeout (a killed instance's), as Kafka's does.
    pub fn instances(mut self, count: usize) -> Self {
        let count = count.max(1);
        while self.slots.len() < count {
            let n = self.slots.len();
            let id = format!("{}-{n}", self.config.instance_id);
            self.slots.push(Slot::new(self.kafka.member(n), id));
        }
        if count > 1 {
            self.kafka
                .abort_transactions_after(self.config.transaction_timeout);
        }
        self
    }

    /// How many instances the group has.
    pub fn instance_count(&self) -> usize {
        self.slots.len()
    }

    /// The input topic has `partitions` partitions (default 1).
    pub fn input_partitions(self, partitions: i32) -> Self {
        self.kafka
            .set_partitions(&self.config.input_topic, partitions.max(1));
        self
    }

    /// `topic` (an output, or the dead-letter topic) has `partitions` partitions
    /// (default 1): keyed records go where librdkafka's default partitioner puts them.
    pub fn topic_partitions(self, topic: &str, partitions: i32) -> Self {
        self.kafka.set_partitions(topic, partitions.max(1));
        self
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Writes `event` to the input as JSON, keyed by its [`Event::key`] (no key: the
    /// partitions in turn), as an upstream producer would. Returns where it landed.
    /// [`pipe_with`](Self::pipe_with) writes with another codec, and
    /// [`pipe_record`](Self::pipe_record) any bytes (a malformed record, say).
    pub fn pipe<E: Serialize + Event>(&mut self, event: &E) -> Result<(i32, i64)> {
        self.pipe_with(&Json, event)
    }

    /// [`pipe`](Self::pipe), encoded with `codec` (the codec of a processor that reads
    /// its input with `#[processor(codec = ...)]`).
    pub fn pipe_with<C: Codec, E: Serialize + Event>(
        &mut self,
        codec: &C,
        event: &E,
    ) -> Result<(i32, i64)> {
        let value = codec.encode(event).map_err(|message| Error::Encode {
            what: "a piped event".into(),
            message,
            cause: None,
        })?;
        let mut record = OutgoingRecord {
            value: Some(value),
            ..OutgoingRecord::default()
        };
        record.key = event.key().map(String::into_bytes);
        Ok(self.pipe_record(record))
    }

    /// Writes `record` to the input (its key, value, headers, partition and timestamp as
    /// given; no timestamp: the driver's clock). Returns where it landed.
    pub fn pipe_record(&mut self, record: OutgoingRecord) -> (i32, i64) {
        let partition = match record.partition {
            Some(partition) => {
                let count = self.kafka.partitions(&self.config.input_topic);
                assert!(
                    (0..count).contains(&partition),
                    "partition {partition} of `{}`, which has {count}",
                    self.config.input_topic
                );
                partition
            }
            None => -1,
        };
        self.kafka.produce(Stored {
            topic: self.config.input_topic.clone(),
            partition,
            offset: 0,
            key: record.key,
            value: record.value,
            headers: record
                .headers
                .into_iter()
                .map(|(name, value)| (name, Some(value)))
                .collect(),
            timestamp_ms: Some(record.timestamp_ms.unwrap_or_else(|| self.now_ms())),
        })
    }

    /// Writes the input record at `partition`/`offset` again, to the same partition:
    /// a duplicate, as a producer's retry or an upstream's replay makes one. `None` when
    /// there is no such record.
    pub fn pipe_again(&mut self, partition: i32, offset: i64) -> Option<(i32, i64)> {
        let original = self
            .kafka
            .committed(&self.config.input_topic)
            .into_iter()
            .find(|r| r.partition == partition && r.offset == offset)?;
        Some(self.kafka.produce(original))
    }

    /// Processes every record piped so far, then returns. A crash armed with
    /// [`TestDriver::crash_at`] stops the engine where it is; the driver starts it again
    /// (a new processor, the transaction log reopened, the open transaction aborted by
    /// the new producer, the changelog replayed) and goes on.
    ///
    /// `Err` when the engine stopped (`on_error = stop` on a failing record, a fatal
    /// error injected with [`TestDriver::fail`]); the next call starts it again.
    pub async fn process(&mut self) -> Result<()> {
        if self.slots.len() == 1 {
            return self.process_instance(0).await;
        }
        // Every instance in turn until a round in which the group stayed as it was:
        // each one's last poll then found nothing (no record, no rebalance).
        let mut first_error = None;
        for _ in 0..MAX_ROUNDS {
            let generation = self.kafka.generation();
            for index in 0..self.slots.len() {
                if let Err(error) = self.process_instance(index).await {
                    first_error.get_or_insert(error);
                }
            }
            if self.kafka.generation() == generation {
                break;
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Runs instance `index` (0 is the first) until a poll of its finds nothing,
    /// starting it if it is not running; the others do nothing meanwhile. See
    /// [`TestDriver::process`]; an instance that stopped with an error has left the
    /// group, and its next run starts it again.
    pub async fn process_instance(&mut self, index: usize) -> Result<()> {
        self.merge()?;
        loop {
            let txlog = self.open_txlog(index)?;
            let config = self.instance_config(index);
            let slot = &mut self.slots[index];
            let mut instance = match slot.instance.take() {
                Some(instance) => instance,
                None => Instance::start(&config, &slot.kafka, (self.make)()).await?,
            };
            let outcome = drive::run(
                &config,
                &slot.kafka,
                &txlog,
                &self.stats,
                &self.plan,
                &mut instance,
            )
            .await;
            match outcome {
                Outcome::Done => {
                    slot.instance = Some(instance);
                    return Ok(());
                }
                Outcome::Crashed(point) => {
                    tracing::info!(
                        point,
                        instance = %config.instance_id,
                        "the engine crashed (as the test asked); starting it again"
                    );
                    self.crashes.extend(CrashPoint::from_name(point));
                    drop(instance);
                    drop(txlog);
                    self.kill_txlog(index)?;
                }
                Outcome::Stopped(error) => {
                    slot.kafka.leave();
                    return Err(error);
                }
            }
        }
    }

    fn merge(&mut self) -> Result<()> {
        if !self.merged {
            let sample = (self.make)();
            crate::engine::merge_declarations(&mut self.config, &sample)?;
            if let Some(problem) = self.config.problems().into_iter().next() {
                return Err(problem);
            }
            self.merged = true;
        }
        Ok(())
    }

    /// The configuration instance `index` runs with: its own instance ID.
    fn instance_config(&self, index: usize) -> EngineConfig {
        let mut config = self.config.clone();
        config.instance_id = self.slots[index].instance_id.clone();
        config
    }

    /// Crashes the engine the `nth` time (1: the next) it passes `point`, from now on.
    pub fn crash_at(&mut self, point: CrashPoint, nth: u32) {
        self.plan.arm(point.name(), nth);
    }

    /// The crashes so far, in order.
    pub fn crashes(&self) -> &[CrashPoint] {
        &self.crashes
    }

    /// Fails the `nth` call (1: the next) of `call` from now on with an error of `class`:
    /// [`ErrorClass::Abortable`] or [`ErrorClass::Retriable`] abort the batch, which is
    /// rewound and done again; [`ErrorClass::Fatal`] stops the instance
    /// ([`TestDriver::process`] returns it).
    pub fn fail(&mut self, call: KafkaCall, nth: u32, class: ErrorClass) {
        self.fail_instance(0, call, nth, class);
    }

    /// [`TestDriver::fail`] for the calls of instance `index` only.
    pub fn fail_instance(&mut self, index: usize, call: KafkaCall, nth: u32, class: ErrorClass) {
        self.slots[index]
            .kafka
            .fail(call.kind(), None, nth.max(1), injected(class));
    }

    /// The `nth` send (1: the next) of instance `index` times out on the client, its
    /// record still on its way: its transaction cannot commit, and the record would land
    /// with the producer's next transaction (librdkafka has no Transactions V2, KIP-890
    /// part 2) unless an epoch bump fences it first: a new producer's, or the one
    /// librdkafka makes after aborting a transaction whose record timed out.
    pub fn time_out_send(&mut self, index: usize, nth: u32) {
        self.slots[index].kafka.time_out_send(nth);
    }

    /// What becomes of the `nth` commit (1: the next) of instance `index`: its markers
    /// land late, the client's request times out though the commit went through, or it
    /// times out on its way and lands in a later transaction. See [`CommitFate`].
    pub fn commit_fate(&mut self, index: usize, nth: u32, fate: CommitFate) {
        self.slots[index].kafka.commit_fate(nth, fate.fake());
    }

    /// The consumer of instance `index` has its static membership fenced at its `nth`
    /// keep-alive poll from now (1: the next), while it is held for a catch-up or an
    /// undo that takes long: as by a join under its instance ID whose answer was lost,
    /// or a group coordinator away longer than the session. No successor has the ID,
    /// so the instance joins the group again in the same process, as the engine does,
    /// and what the hold gave up (a replay on the blocking pool) goes on there unless
    /// cancelled.
    pub fn fence_member_while_held(&mut self, index: usize, nth: u32) {
        self.slots[index].kafka.fence_member_while_held(nth);
    }

    /// Stops the instance cleanly and reopens its transaction log; the next
    /// [`TestDriver::process`] starts a new instance (nothing to replay).
    pub fn restart(&mut self) -> Result<()> {
        self.restart_instance(0)
    }

    /// [`TestDriver::restart`] for instance `index`: it leaves the group (the others
    /// share its partitions at their next poll) until it is run again.
    pub fn restart_instance(&mut self, index: usize) -> Result<()> {
        self.stop(index);
        self.slots[index].txlog = None;
        self.open_txlog(index).map(drop)
    }

    /// The instance's process is gone: its member leaves the group.
    fn stop(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        if slot.instance.take().is_some() {
            slot.kafka.leave();
        }
    }

    /// Kills the instance, as SIGKILL or a power cut would, between two batches: no
    /// clean shutdown, so the transaction log comes back as of its last commit synced to
    /// disk (`txlog_sync_interval`; the applies since are lost, as a crash at a
    /// [`CrashPoint`] loses them too). The next [`TestDriver::process`] starts a new
    /// instance, which replays the changelog from the older checkpoints; until then
    /// [`TestDriver::state`] reads the log as it came back.
    pub fn kill(&mut self) -> Result<()> {
        self.kill_instance(0)
    }

    /// [`TestDriver::kill`] for instance `index`: what its transaction left open stays
    /// open (readers of its partitions wait) until its next start or the transaction
    /// timeout.
    pub fn kill_instance(&mut self, index: usize) -> Result<()> {
        self.stop(index);
        self.kill_txlog(index)?;
        self.open_txlog(index).map(drop)
    }

    /// Stops the instance and deletes its transaction log, as on a new machine: the
    /// next start rebuilds dedup entries and state from the changelog (until then
    /// [`TestDriver::state`] reads the empty new log).
    pub fn lose_local_state(&mut self) -> Result<()> {
        self.lose_local_state_of(0)
    }

    /// [`TestDriver::lose_local_state`] for instance `index`.
    pub fn lose_local_state_of(&mut self, index: usize) -> Result<()> {
        self.stop(index);
        self.slots[index].txlog = None;
        let dir = self.instance_dir(index);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| {
                Error::Broker(format!(
                    "deleting the transaction log {}: {e}",
                    dir.display()
                ))
            })?;
        }
        self.open_txlog(index).map(drop)
    }

    /// The instance's session with the group expires, as when its process is frozen
    /// (SIGSTOP, a long GC pause) or cut off the network: the group moves on without
    /// it. The instance does not know for `unaware_polls` more polls (a zombie, firing
    /// its wall-clock timers as usual); the group refuses whatever it commits meanwhile
    /// (KIP-447). Then it hears of the loss, joins again and catches up.
    pub fn lose_session(&mut self, unaware_polls: u32) {
        self.lose_session_of(0, unaware_polls);
    }

    /// [`TestDriver::lose_session`] for instance `index`: the others share its
    /// partitions at their next poll, while it goes on as a zombie.
    pub fn lose_session_of(&mut self, index: usize, unaware_polls: u32) {
        self.slots[index].kafka.lose_session(unaware_polls);
    }

    /// The instance stops and another, `instance_id`, takes every partition over, with
    /// the state directory (and transaction log) that instance ID has in this driver:
    /// empty the first time, as that instance left it when it comes back (a pod whose
    /// volume returns after others owned its partitions).
    pub fn switch_instance(&mut self, instance_id: &str) -> Result<()> {
        self.stop(0);
        self.slots[0].txlog = None;
        self.config.instance_id = instance_id.to_owned();
        self.slots[0].instance_id = instance_id.to_owned();
        self.open_txlog(0).map(drop)
    }

    /// Compacts the changelog as Kafka's log cleaner does once it has run over every
    /// segment: of each key only its last record stays, and a last record that is a
    /// tombstone goes too once it is older than the changelog keeps tombstones
    /// (`delete.retention.ms`, Kafka's default: 24 hours of the driver's clock).
    pub fn compact_changelog(&mut self) {
        self.kafka.compact(&self.config.changelog_topic());
    }

    /// The next time the engine holds its consumer (while it recovers from a failed
    /// batch or catches up), the group revokes input `partition` and assigns it back,
    /// and some of its records from the committed offset come in the same poll, as
    /// librdkafka may return them before a pause takes effect.
    pub fn rebalance_while_held(&mut self, partition: i32) {
        self.kafka.bounce_while_held(partition);
    }

    /// The next assignment of input `partition` starts `by` records past the group's
    /// committed offset, as librdkafka's pause/assign races can make a consumer start;
    /// the engine must still process every record from the committed offset on.
    pub fn misplace_next_assignment(&mut self, partition: i32, by: i64) {
        self.kafka.misplace_next_assignment(partition, by);
    }

    /// Moves the driver's wall clock (dedup entries' time, piped records' default
    /// timestamp) on by `by`.
    pub fn advance_time(&mut self, by: Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now.fetch_add(by, Ordering::SeqCst);
    }

    /// The driver's wall clock, in milliseconds since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    /// What a `read_committed` reader of `topic` sees, in partition then offset order.
    /// An output renamed in the configuration is read under the topic it goes to.
    pub fn output(&self, topic: impl AsRef<str>) -> Vec<Record> {
        let topic = topic.as_ref();
        let mut records: Vec<Record> = self
            .kafka
            .committed(topic)
            .iter()
            .map(Stored::to_record)
            .collect();
        records.sort_by_key(|r| (r.partition, r.offset));
        records
    }

    /// The values of [`TestDriver::output`], decoded from JSON.
    pub fn output_values<T: DeserializeOwned>(&self, topic: impl AsRef<str>) -> Result<Vec<T>> {
        let topic = topic.as_ref();
        self.output(topic)
            .iter()
            .map(|record| {
                serde_json::from_slice(record.value.as_deref().unwrap_or_default()).map_err(|e| {
                    Error::Decode {
                        topic: topic.to_owned(),
                        partition: record.partition,
                        offset: record.offset,
                        message: e.to_string(),
                        cause: Some(Box::new(e)),
                    }
                })
            })
            .collect()
    }

    /// The records of `topic` in a transaction that is still open (a `read_uncommitted`
    /// reader sees them too): after a crash before the commit, until the next start.
    pub fn uncommitted(&self, topic: impl AsRef<str>) -> Vec<Record> {
        self.kafka
            .open_records(topic.as_ref())
            .iter()
            .map(Stored::to_record)
            .collect()
    }

    /// The committed dead letters (their headers say why: `onceflow-error-class`, …).
    pub fn dead_letters(&self) -> Vec<Record> {
        self.output(self.config.dead_letter_topic())
    }

    /// The state value of `key` on input partition `partition`, as committed.
    pub fn state<T: DeserializeOwned>(&self, partition: i32, key: &str) -> Result<Option<T>> {
        let Some(txlog) = self.owner_txlog(partition) else {
            return Ok(None);
        };
        txlog
            .state(partition, key.as_bytes())?
            .map(|bytes| {
                serde_json::from_slice(&bytes).map_err(|e| Error::Encode {
                    what: format!("the state of `{key}` on partition {partition}, decoded"),
                    message: e.to_string(),
                    cause: Some(Box::new(e)),
                })
            })
            .transpose()
    }

    /// Whether `event_id` is in the committed dedup entries of `partition`.
    pub fn is_processed(&self, partition: i32, event_id: &str) -> Result<bool> {
        match self.owner_txlog(partition) {
            Some(txlog) => txlog.is_processed(partition, event_id),
            None => Ok(false),
        }
    }

    /// The group's committed offset of input partition `partition` (the next to read).
    pub fn committed_offset(&self, partition: i32) -> Option<i64> {
        self.kafka.committed_offsets().get(&partition).copied()
    }

    /// The engine's counters, over every start. A batch counts once it is applied: one
    /// that crashed between its commit and its apply is not counted, as in a process.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// The transaction log of the instance that has input `partition`: a member of the
    /// group before a zombie that still has it; the first instance's when none has it.
    fn owner_txlog(&self, partition: i32) -> Option<&Arc<TxLog>> {
        let has = |slot: &&Slot<P>| {
            slot.instance.is_some() && slot.kafka.assignment().contains(&partition)
        };
        let owner = self
            .slots
            .iter()
            .filter(has)
            .find(|slot| slot.kafka.in_group())
            .or_else(|| self.slots.iter().find(has))
            .unwrap_or(&self.slots[0]);
        owner.txlog.as_ref()
    }

    /// The partitions of the input instance `index` has (none when it is not running).
    pub fn assignment_of(&self, index: usize) -> Vec<i32> {
        let slot = &self.slots[index];
        if slot.instance.is_none() {
            return Vec::new();
        }
        slot.kafka.assignment()
    }

    fn instance_dir(&self, index: usize) -> PathBuf {
        // Inside the driver's temporary directory (`dir`), removed with the driver.
        debug_assert!(self.config.state_dir.starts_with(self.dir.path()));
        self.instance_config(index).instance_dir()
    }

    /// Closes the transaction log as a killed process leaves it (nothing else may hold it).
    fn kill_txlog(&mut self, index: usize) -> Result<()> {
        let Some(txlog) = self.slots[index].txlog.take() else {
            return Ok(());
        };
        let txlog = Arc::try_unwrap(txlog).unwrap_or_else(|_| {
            panic!("the transaction log is still in use after the engine stopped")
        });
        txlog.kill()
    }

    fn open_txlog(&mut self, index: usize) -> Result<Arc<TxLog>> {
        if let Some(txlog) = &self.slots[index].txlog {
            return Ok(Arc::clone(txlog));
        }
        let (txlog, _) =
            TxLog::open_with_cache(&self.instance_dir(index), self.config.txlog_cache_size)?;
        txlog.use_clock(self.config.clock.clone());
        let txlog = Arc::new(txlog);
        self.slots[index].txlog = Some(Arc::clone(&txlog));
        Ok(txlog)
    }
}

/// How many rounds [`TestDriver::process`] gives a group of several instances to settle.
const MAX_ROUNDS: usize = 50;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, Event};

    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Ping {
        id: String,
    }

    impl Event for Ping {
        fn event_id(&self) -> Option<String> {
            Some(self.id.clone())
        }
    }

    /// Echoes each ping's ID.
    #[derive(Debug, Clone)]
    struct Echo;

    #[async_trait::async_trait]
    impl Processor for Echo {
        type Input = Ping;

        fn name(&self) -> &str {
            "echo"
        }

        fn output_topics(&self) -> &[&str] {
            &["echoes"]
        }

        async fn process(&mut self, ping: Ping, ctx: &mut Context<'_>) -> Result<()> {
            ctx.emit("echoes", &ping.id, &ping.id)
        }
    }

    /// Echoes each ping, but first misuses onceflow as `how` says.
    #[derive(Debug, Clone)]
    struct Misuse {
        effect: bool,
    }

    #[async_trait::async_trait]
    impl Processor for Misuse {
        type Input = Ping;

        fn name(&self) -> &str {
            "misuse"
        }

        fn output_topics(&self) -> &[&str] {
            &["echoes"]
        }

        async fn process(&mut self, ping: Ping, ctx: &mut Context<'_>) -> Result<()> {
            if self.effect {
                ctx.effect("charge", &ping.id, &1)?;
            } else {
                ctx.schedule_after(&ping.id, Duration::from_secs(1))?;
            }
            ctx.emit("echoes", &ping.id, &ping.id)
        }
    }

    /// A timer scheduled by a processor that does not use timers, or an effect recorded
    /// with effects off, is the code's mistake, not the record's: the instance stops
    /// with `Error::Usage` saying how to fix it, and no record is dead-lettered or
    /// committed (before, it was reported as an invalid setting).
    #[tokio::test(start_paused = true)]
    async fn a_processor_that_misuses_timers_or_effects_stops_with_a_usage_error() {
        for effect in [false, true] {
            let mut driver = TestDriver::new(Misuse { effect });
            driver.pipe(&Ping { id: "p0".into() }).expect("pipe");
            let error = driver.process().await.expect_err("stops");
            let text = error.to_string();
            assert!(matches!(error, Error::Usage { .. }), "{text}");
            assert!(error.is_fatal(), "{text}");
            let fix = if effect {
                "with_effects"
            } else {
                "uses_timers"
            };
            assert!(text.contains(fix), "{text}");
            assert!(driver.dead_letters().is_empty(), "nothing dead-lettered");
            assert!(driver.output("echoes").is_empty(), "nothing committed");
        }
    }

    /// Hole G of issue 40: the engine never sought after an assignment, and its floor
    /// caught a start below the committed offset, not one above it (librdkafka's
    /// pause/assign races can start a partition past it): the records between were
    /// never processed, and the next commit moved past them.
    #[tokio::test(start_paused = true)]
    async fn records_between_the_committed_offset_and_a_start_past_it_are_processed() {
        let mut driver = TestDriver::new(Echo);
        let ping = |i: usize| Ping {
            id: format!("p{i}"),
        };
        for i in 0..3 {
            driver.pipe(&ping(i)).expect("pipe");
        }
        driver.process().await.expect("process");
        for i in 3..8 {
            driver.pipe(&ping(i)).expect("pipe");
        }
        driver.kafka.misplace_next_assignment(0, 2);
        driver.restart().expect("restart");
        driver.process().await.expect("process");
        let echoes: Vec<String> = driver.output_values("echoes").expect("echoes");
        let expected: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
        assert_eq!(echoes, expected, "every ping once, in order");
        assert_eq!(driver.committed_offset(0), Some(8));
    }

    /// Found by the simulation (seed 1000104): with nothing committed yet, a start past
    /// the partition's beginning set no floor, and the records before it were skipped.
    #[tokio::test(start_paused = true)]
    async fn records_before_a_first_start_past_the_beginning_are_processed() {
        let mut driver = TestDriver::new(Echo);
        for i in 0..4 {
            driver
                .pipe(&Ping {
                    id: format!("p{i}"),
                })
                .expect("pipe");
        }
        driver.kafka.misplace_next_assignment(0, 3);
        driver.process().await.expect("process");
        let echoes: Vec<String> = driver.output_values("echoes").expect("echoes");
        assert_eq!(echoes, ["p0", "p1", "p2", "p3"]);
    }

    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Entry {
        id: String,
        key: String,
        /// Added to the key's total; none: the total is deleted.
        add: Option<i64>,
    }

    impl Event for Entry {
        fn event_id(&self) -> Option<String> {
            Some(self.id.clone())
        }

        fn key(&self) -> Option<String> {
            Some(self.key.clone())
        }
    }

    /// Keeps a running total per key, deleted on request; emits each new total.
    #[derive(Debug, Clone)]
    struct Totals;

    #[async_trait::async_trait]
    impl Processor for Totals {
        type Input = Entry;

        fn name(&self) -> &str {
            "totals"
        }

        fn output_topics(&self) -> &[&str] {
            &["totals"]
        }

        async fn process(&mut self, entry: Entry, ctx: &mut Context<'_>) -> Result<()> {
            let Some(add) = entry.add else {
                ctx.state().delete(&entry.key);
                return Ok(());
            };
            let total = ctx.state().get::<i64>(&entry.key)?.unwrap_or(0) + add;
            ctx.state().put(&entry.key, &total)?;
            ctx.emit("totals", &entry.key, &total)
        }
    }

    /// Copies every file under `from` into `to`.
    fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).expect("create");
        for entry in std::fs::read_dir(from).expect("read dir") {
            let entry = entry.expect("entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("type").is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).expect("copy");
            }
        }
    }

    /// Hole E of issue 40, seen against the broker: instance a built a total of 5 and
    /// stopped; b deleted it and went on while the changelog was compacted (the value
    /// and, `delete.retention.ms` later, its tombstone removed); a came back on its own
    /// state directory, replayed from its old checkpoint, never saw the deletion, and
    /// the next +1 gave 6 instead of 1. A pod whose volume comes back after a day.
    #[tokio::test(start_paused = true)]
    async fn a_deletion_compacted_away_while_an_instance_was_gone_does_not_come_back() {
        let mut driver = TestDriver::new(Totals);
        let entry = |id: &str, add| Entry {
            id: id.into(),
            key: "k".into(),
            add,
        };
        driver.pipe(&entry("a-1", Some(5))).expect("pipe");
        driver.process().await.expect("a builds the total");
        driver.restart().expect("a stops");
        let volume = tempfile::tempdir().expect("a's volume");
        copy_dir(&driver.instance_dir(0), volume.path());

        // b, on a new machine, deletes the total and goes on.
        driver.lose_local_state().expect("b starts afresh");
        driver.pipe(&entry("b-1", None)).expect("pipe");
        driver
            .pipe(&Entry {
                id: "b-2".into(),
                key: "other".into(),
                add: Some(1),
            })
            .expect("pipe");
        driver.process().await.expect("b deletes");
        assert_eq!(driver.state::<i64>(0, "k").expect("state"), None);
        driver.restart().expect("b stops");

        // A day and a half later the changelog is compacted: the value and its
        // tombstone are gone.
        driver.advance_time(Duration::from_secs(36 * 3600));
        let changelog = driver.config.changelog_topic();
        driver.kafka.compact(&changelog);

        // a comes back on its own volume.
        driver.slots[0].txlog = None;
        std::fs::remove_dir_all(driver.instance_dir(0)).expect("remove b's log");
        copy_dir(volume.path(), &driver.instance_dir(0));
        driver.pipe(&entry("a-2", Some(1))).expect("pipe");
        driver.process().await.expect("a again");
        let totals: Vec<i64> = driver.output_values("totals").expect("totals");
        assert_eq!(
            totals.last(),
            Some(&1),
            "the deleted total came back: {totals:?}"
        );
    }
}
