//! An in-process Kafka for the engine's unit tests: it implements [`Source`], [`Sink`],
//! [`Renew`] and [`Restore`], records every call in order, keeps what a transaction wrote
//! apart until it commits (an abort drops it), and fails the call a test names with the
//! error it gives, or applies it and then fails (an outcome the caller cannot know).
//! Clones share one cluster: a renewed producer is a clone.
//!
//! The cluster has members ([`FakeKafka::member`]), each a process's consumer and
//! transactional producer, in one group: every join and leave (a stop, a kill, a lost
//! session) moves the group to a new generation, and each member's next poll revokes
//! what it had and assigns its share (eager rebalancing). The group refuses offsets
//! (in a transaction, or committed plainly) from a member of an older generation
//! (KIP-447), a `require_stable` read while another member's transaction holds offsets
//! of its partitions, and the coordinator aborts a transaction open past the
//! transaction timeout (when set). One member's state is in `Inner::client` while its
//! handle holds the lock; the others wait in `Inner::parked`.
//!
//! The test driver (`onceflow::testing`, feature `testing`) runs the engine's loop over
//! it: the consumer polls the input topic from its positions (committed records only, as
//! `read_committed`), keyed records go where librdkafka's default partitioner puts them,
//! and [`MemoryReplay`] replays the changelog the batches wrote into the transaction log.
// The engine's unit tests use one part of it and the driver another: built with both
// (the workspace's tests and lints are), nothing of it may go unused.
#![cfg_attr(not(all(test, feature = "testing")), allow(dead_code))]

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::EngineConfig;
use crate::engine::recovery::Resync;
use crate::engine::seams::{Cancel, Landing, Outgoing, Renew, Restore, Sink, Source};
use crate::engine::stats::Stats;
use crate::kafka::{AtTheEnd, Polled, Rebalanced, Record};
use crate::txlog::TxLog;
use crate::{Error, Result};

/// The fake group's `session.timeout.ms`.
pub(crate) const FAKE_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// One call the engine made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Begin,
    Send {
        topic: String,
        partition: Option<i32>,
    },
    SendOffsets(Vec<(i32, i64)>),
    Commit,
    Abort,
    Flush,
    ConsumerCommit(Vec<(i32, i64)>),
    /// Reading the group's committed offsets of these partitions.
    Committed(Vec<i32>),
    Seek(Vec<(i32, Option<i64>)>),
    Hold,
    Release,
    /// A changelog replay of a partition up to a committed offset.
    Restore(i32, Option<i64>),
    /// A new producer.
    Renew,
    /// Describing the group: who is under the instance ID?
    Members,
    /// Asking whether the producer is fenced.
    Probe,
}

/// The kinds of call a fault can be put on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Begin,
    /// Sending a record (to any topic, or the one the fault names).
    Send,
    /// The acknowledgement of a sent record.
    Landing,
    SendOffsets,
    Commit,
    Abort,
    Flush,
    ConsumerCommit,
    Committed,
    Seek,
    Restore,
    Renew,
    Members,
    Probe,
    /// A poll of a held consumer.
    KeepAlive,
}

/// A record as the fake stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
    pub(crate) timestamp_ms: Option<i64>,
}

impl Stored {
    /// The record as a consumer reads it.
    pub(crate) fn to_record(&self) -> Record {
        Record {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            key: self.key.clone(),
            value: self.value.clone(),
            headers: self.headers.clone(),
            timestamp_ms: self.timestamp_ms,
        }
    }

    /// The value of header `name`, as text.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

type MakeError = Box<dyn Fn() -> Error + Send>;

/// An injected Kafka error of `class`.
pub(crate) fn injected(class: crate::ErrorClass) -> impl Fn() -> Error + Send + 'static {
    move || Error::Kafka {
        operation: "fake".into(),
        code: crate::KafkaCode::UNKNOWN,
        message: "injected".into(),
        class,
        cause: None,
    }
}

struct Fault {
    kind: Kind,
    /// Only calls about this topic count (sends and landings), when set.
    topic: Option<String>,
    /// Fail the nth matching call (1 for the first).
    nth: u32,
    error: MakeError,
    seen: u32,
    /// The call takes effect, then fails: its caller cannot know it went through.
    applied: bool,
}

/// What becomes of a commit ([`FakeKafka::commit_fate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitFate {
    /// The coordinator accepts it and the client hears so, but its markers land only
    /// [`IN_DOUBT_FOR`] later (or when its producer begins its next transaction, or a
    /// new producer of its ID is made, which wait for them): until then its records
    /// hold the last stable offset, and the group's committed offsets read without
    /// them, as during a coordinator failover (hole F of issue 40).
    MarkersLate,
    /// As [`CommitFate::MarkersLate`], but the client's request times out: it cannot
    /// know that the commit went through.
    TimesOutInDoubt,
    /// The request times out before it reaches the coordinator and lands later: with
    /// the same producer's next offsets to a transaction, committing whatever that
    /// transaction holds then (what Transactions V2, KIP-890 part 2, would refuse),
    /// unless a new producer bumped the epoch first.
    TimesOutLate,
}

/// How long the markers of a commit in doubt take to land, at most.
pub(crate) const IN_DOUBT_FOR: Duration = Duration::from_secs(5);

/// A commit in doubt: accepted by the coordinator, its markers not written yet.
struct InDoubt {
    member: usize,
    records: Vec<Stored>,
    offsets: Vec<(i32, i64)>,
    lands_at: tokio::time::Instant,
}

/// A changelog replay whose future was dropped while it waited for an open transaction
/// (a hold that gave up, hole B of issue 40). In the engine its read runs on the blocking
/// pool and goes on: once the transaction ends it applies what it reads from where it
/// was, unless its [`Cancel`] stops it. Here it does so at the adversarial moment: at
/// its member's first poll after a commit, when newer batches were applied. It dies
/// with its process (the member leaves, or the transaction log is closed).
struct OrphanReplay {
    txlog: std::sync::Weak<TxLog>,
    changelog: String,
    partition: i32,
    /// What it had read, or was reading: the changelog from `from` to `until` (the
    /// partition's end when it was orphaned).
    from: i64,
    until: i64,
    cancel: Cancel,
    /// The member's commits when it was orphaned.
    commits: u32,
}

/// The cluster: topics, the group's committed offsets and generation, and its clients.
/// `client` is the client state of the member whose handle holds the lock (see
/// [`FakeKafka::inner`]); the other members' wait in `parked`.
#[derive(Default)]
struct Inner {
    calls: Vec<Call>,
    next_offset: BTreeMap<(String, i32), i64>,
    committed: Vec<Stored>,
    committed_offsets: BTreeMap<i32, i64>,
    /// The topic the consumers poll (none: polls return only rebalances).
    input: Option<String>,
    /// Partitions per topic (a topic not named here has one).
    partitions: BTreeMap<String, i32>,
    /// The next partition of a record without a key, per topic.
    round_robin: BTreeMap<String, i32>,
    /// Calls are not recorded (a driver's long runs).
    quiet: bool,
    /// The group's generation: it moves on whenever a member joins or leaves (its
    /// session expired), and the group refuses the offsets a member of an older one
    /// sends to a transaction (KIP-447's generation check).
    generation: u32,
    /// The members in the group now (a zombie is not).
    group: std::collections::BTreeSet<usize>,
    /// The input's partitions, which the group's members share.
    group_partitions: i32,
    /// The coordinator aborts a transaction open longer than this (none: never).
    transaction_timeout: Option<Duration>,
    /// The time of records sent without one (the driver's clock), if set.
    clock: Option<crate::clock::Clock>,
    /// Commits the coordinator accepted whose markers have not landed (see
    /// [`CommitFate`]).
    in_doubt: Vec<InDoubt>,
    /// The member whose state is in `client`.
    active: usize,
    client: Client,
    /// The other members' state.
    parked: BTreeMap<usize, Client>,
}

/// What one member (a process: its consumer and its transactional producer) has.
#[derive(Default)]
struct Client {
    faults: Vec<Fault>,
    in_transaction: bool,
    /// When the open transaction began (tokio time).
    began: Option<tokio::time::Instant>,
    /// The coordinator aborted the open transaction (it timed out): the producer's
    /// next transactional call is refused.
    timed_out: bool,
    open: Vec<Stored>,
    open_offsets: Vec<(i32, i64)>,
    assigned: Vec<i32>,
    /// What each poll of a held consumer returns, in turn (then nothing).
    held_polls: VecDeque<Polled>,
    /// The consumer's fatal error, and from when it is raised (tokio time).
    fatal: Option<(MakeError, tokio::time::Instant)>,
    /// How long a replay takes.
    restore_takes: Duration,
    /// Where a replay leaves each partition's progress (the input offset the
    /// transaction log has reached); none: unknown.
    progress: BTreeMap<i32, i64>,
    /// The consumer's next offset per partition of the input.
    positions: BTreeMap<i32, i64>,
    /// Rebalances the next poll serves.
    rebalances: Vec<Rebalanced>,
    /// Triggered by a poll that finds nothing.
    on_idle: Option<crate::engine::Shutdown>,
    /// What describing the group says, in turn (the last one again and again).
    holders: VecDeque<crate::kafka::Holder>,
    /// The producer is fenced (until renewed).
    producer_fenced: bool,
    /// The generation the member last joined: when it differs from the group's, the
    /// member is behind a rebalance, or lost its session without knowing yet (a
    /// zombie, not in the group).
    member_generation: u32,
    /// Sends so far, and the ones (by number) whose request times out on the client,
    /// to land later: with the producer's next transaction unless an epoch bump fences
    /// it first (a new producer, or the abort of its own transaction, after which
    /// librdkafka bumps the epoch).
    sends: u32,
    time_out_sends: std::collections::BTreeSet<u32>,
    late: Vec<Stored>,
    /// A send of the open transaction timed out: committing it fails (librdkafka's
    /// commit waits for every delivery, and a failed one makes the transaction
    /// abortable).
    send_timed_out: bool,
    /// Commits so far, and what becomes of some of them (by number).
    commits: u32,
    commit_fates: BTreeMap<u32, CommitFate>,
    /// A commit request that timed out before it reached the coordinator is still on
    /// its way: it lands with the producer's next offsets to a transaction (the same
    /// epoch), committing what that transaction holds then, unless a new producer
    /// fences it first.
    late_commit: bool,
    /// Replays whose future was dropped while they waited (see [`OrphanReplay`]).
    orphans: Vec<OrphanReplay>,
    /// The consumer's static membership is fenced: its polls fail with
    /// [`Error::Fenced`] until it joins again.
    member_fenced: bool,
    /// Keep-alive polls of a held consumer until its membership is fenced (see
    /// [`FakeKafka::fence_member_while_held`]).
    fence_at_keep_alive: Option<u32>,
    /// Polls a zombie makes before it hears that it lost its session; then its next
    /// poll serves the loss (every partition revoked), and it joins again.
    unaware_polls: u32,
    /// Per partition, how far past the committed offset its next assignment starts (as
    /// librdkafka's pause/assign races can make it): once.
    misplaced: BTreeMap<i32, i64>,
    /// Partitions the group takes away and gives back while the consumer is held next,
    /// their records from the committed offset coming in the same poll (before the
    /// pause takes effect on the new assignment).
    bounce_while_held: Vec<i32>,
}

impl Inner {
    fn call(&mut self, call: Call) {
        if !self.quiet {
            self.calls.push(call);
        }
    }

    /// Where the producer puts a record without an explicit partition: librdkafka's
    /// default partitioner (`consistent_random`: the CRC-32 of a key, and any partition
    /// for an empty or missing one; here the next in turn).
    fn partition_for(&mut self, topic: &str, key: Option<&[u8]>) -> i32 {
        let count = self.partitions.get(topic).copied().unwrap_or(1).max(1);
        match key.filter(|key| !key.is_empty()) {
            Some(key) => (crc32fast::hash(key) % count.unsigned_abs()) as i32,
            None => {
                let next = self.round_robin.entry(topic.to_owned()).or_default();
                let partition = *next % count;
                *next = (*next + 1) % count;
                partition
            }
        }
    }

    fn fault(&mut self, kind: Kind, topic: Option<&str>) -> Result<()> {
        match self.fault_after(kind, topic) {
            Some((error, false)) => Err(error),
            _ => Ok(()),
        }
    }

    /// The fault due on this call, if any, and whether the call takes effect first.
    fn fault_after(&mut self, kind: Kind, topic: Option<&str>) -> Option<(Error, bool)> {
        // Every matching fault counts the call, not only up to the one that fires.
        let mut due = None;
        for fault in &mut self.client.faults {
            if fault.kind != kind || (fault.topic.is_some() && fault.topic.as_deref() != topic) {
                continue;
            }
            fault.seen += 1;
            if fault.seen == fault.nth && due.is_none() {
                due = Some(((fault.error)(), fault.applied));
            }
        }
        due
    }

    /// The markers of commits in doubt land: those whose time has come, and `member`'s.
    fn land_in_doubt(&mut self, member: Option<usize>) {
        let now = tokio::time::Instant::now();
        let (landing, waiting): (Vec<InDoubt>, Vec<InDoubt>) = std::mem::take(&mut self.in_doubt)
            .into_iter()
            .partition(|commit| commit.lands_at <= now || Some(commit.member) == member);
        self.in_doubt = waiting;
        for commit in landing {
            mark(&mut self.next_offset, &commit.records);
            self.committed.extend(commit.records);
            self.committed_offsets.extend(commit.offsets);
        }
    }

    /// This member's orphaned replays whose moment came apply what they read (see
    /// [`OrphanReplay`]).
    fn run_orphans(&mut self) {
        let commits = self.client.commits;
        let (due, waiting): (Vec<OrphanReplay>, Vec<OrphanReplay>) =
            std::mem::take(&mut self.client.orphans)
                .into_iter()
                .partition(|orphan| commits > orphan.commits);
        self.client.orphans = waiting;
        for orphan in due {
            let Some(txlog) = orphan.txlog.upgrade() else {
                continue;
            };
            let records: Vec<&Stored> = self
                .committed
                .iter()
                .filter(|r| {
                    r.topic == orphan.changelog
                        && r.partition == orphan.partition
                        && r.offset >= orphan.from
                        && r.offset < orphan.until
                })
                .collect();
            for chunk in records.chunks(REPLAY_CHUNK) {
                let Ok(changes) = chunk
                    .iter()
                    .map(|r| {
                        crate::engine::changelog::decode(
                            &orphan.changelog,
                            orphan.partition,
                            r.offset,
                            r.key.as_deref(),
                            r.value.as_deref(),
                        )
                    })
                    .collect::<Result<Vec<_>>>()
                else {
                    break;
                };
                let next = chunk.last().map_or(orphan.from, |r| r.offset + 1);
                let applied = orphan.cancel.unless_cancelled("an orphaned replay", || {
                    txlog.apply(&[(orphan.partition, changes, Some(next))])
                });
                if applied.is_err() {
                    break;
                }
            }
        }
    }

    /// The open transaction commits: its records become visible, its offsets the
    /// group's.
    fn commit_open(&mut self) {
        self.mark();
        let open = std::mem::take(&mut self.client.open);
        self.committed.extend(open);
        let offsets = std::mem::take(&mut self.client.open_offsets);
        self.committed_offsets.extend(offsets);
    }

    /// One offset in each partition the open transaction wrote, for its marker.
    fn mark(&mut self) {
        mark(&mut self.next_offset, &self.client.open);
    }

    /// `Err` when the coordinator aborted this member's transaction (it was open
    /// longer than the transaction timeout): the transaction must be aborted.
    fn timed_out(&self) -> Result<()> {
        if !self.client.timed_out {
            return Ok(());
        }
        Err(Error::Kafka {
            operation: "fake".into(),
            code: crate::KafkaCode::INVALID_PRODUCER_EPOCH,
            message: "the coordinator aborted the transaction: it timed out".into(),
            class: crate::ErrorClass::Abortable,
            cause: None,
        })
    }

    /// Every member's client state, this one's first.
    fn clients(&self) -> impl Iterator<Item = &Client> {
        std::iter::once(&self.client).chain(self.parked.values())
    }

    /// Aborts each transaction open longer than the transaction timeout, as the
    /// coordinator does: its records are dropped behind an abort marker, and the
    /// producer's next transactional call is refused.
    fn expire_transactions(&mut self) {
        let Some(timeout) = self.transaction_timeout else {
            return;
        };
        let now = tokio::time::Instant::now();
        let clients = std::iter::once(&mut self.client).chain(self.parked.values_mut());
        for client in clients {
            if client.began.is_some_and(|began| now >= began + timeout) {
                mark(&mut self.next_offset, &client.open);
                client.open.clear();
                client.open_offsets.clear();
                client.began = None;
                client.timed_out = true;
            }
        }
    }

    /// The input partitions `member` gets in the current generation: the group's
    /// members in order take the partitions in turn (one member: every partition).
    fn share(&self, member: usize) -> Vec<i32> {
        let count = self.group_partitions.max(1);
        let members: Vec<usize> = self.group.iter().copied().collect();
        let Some(index) = members.iter().position(|m| *m == member) else {
            return Vec::new();
        };
        (0..count)
            .filter(|p| usize::try_from(*p).unwrap_or(0) % members.len() == index)
            .collect()
    }

    /// The calling member joins the group: a new generation, in which every member's
    /// next poll takes its share (see [`Inner::follow_group`]).
    fn join(&mut self) {
        let active = self.active;
        self.group.insert(active);
        self.generation += 1;
        self.follow_group();
    }

    /// The calling member leaves the group (it stopped, or its session expired): a new
    /// generation, in which the others share its partitions.
    fn leave(&mut self) {
        let active = self.active;
        if self.group.remove(&active) {
            self.generation += 1;
        }
    }

    /// The calling member takes its part in the current generation (eager rebalancing):
    /// its next poll revokes whatever it holds or was about to get, and assigns its share.
    fn follow_group(&mut self) {
        let mut holds: Vec<i32> = self.client.assigned.clone();
        for event in &self.client.rebalances {
            match event {
                Rebalanced::Assigned(partitions) => holds.extend(partitions),
                Rebalanced::Revoked(partitions) => holds.retain(|p| !partitions.contains(p)),
            }
        }
        holds.sort_unstable();
        holds.dedup();
        if !holds.is_empty() {
            self.client.rebalances.push(Rebalanced::Revoked(holds));
        }
        let share = self.share(self.active);
        self.client.rebalances.push(Rebalanced::Assigned(share));
        self.client.member_generation = self.generation;
    }
}

/// What a consumer whose static membership was fenced hears.
fn member_fenced() -> Error {
    Error::Fenced {
        what: "group.instance.id".into(),
        detail: "the group coordinator fenced this static member (fake)".into(),
    }
}

/// One offset in each partition `open` wrote, for its marker.
fn mark(next_offset: &mut BTreeMap<(String, i32), i64>, open: &[Stored]) {
    for record in open {
        *next_offset
            .entry((record.topic.clone(), record.partition))
            .or_default() += 1;
    }
}

/// A client of the fake cluster: one member is both the source and the sink of a batch.
/// Clones are the same member (a renewed producer is a clone); [`FakeKafka::member`]
/// gives another member of the same cluster.
#[derive(Default, Clone)]
pub(crate) struct FakeKafka {
    cluster: Arc<Mutex<Inner>>,
    member: usize,
}

impl std::fmt::Debug for FakeKafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeKafka").finish_non_exhaustive()
    }
}

/// A sent record's acknowledgement, decided when it was sent.
#[derive(Debug)]
pub(crate) struct FakePending(std::result::Result<(i32, i64), Refused>);

/// Why a sent record did not land (as far as its producer knows).
#[derive(Debug)]
pub(crate) enum Refused {
    /// Refused for good (too large, say).
    Rejected(String),
    /// Its request timed out on the client: it may still land later.
    TimedOut,
}

impl Landing for FakePending {
    fn landed(self) -> impl Future<Output = Result<(i32, i64)>> + Send {
        std::future::ready(self.0.map_err(|refused| match refused {
            Refused::Rejected(message) => Error::Kafka {
                operation: crate::Operation::produce("fake"),
                code: crate::KafkaCode::MESSAGE_SIZE_TOO_LARGE,
                message,
                class: crate::ErrorClass::Rejected,
                cause: None,
            },
            Refused::TimedOut => Error::Kafka {
                operation: crate::Operation::produce("fake"),
                code: crate::KafkaCode::MESSAGE_TIMED_OUT,
                message: "the produce request timed out (it may land later)".into(),
                class: crate::ErrorClass::Retriable,
                cause: None,
            },
        }))
    }
}

impl FakeKafka {
    /// The cluster, with this member's client state in `client`; a transaction open
    /// past the transaction timeout is aborted first, as the coordinator does.
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        let mut inner = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
        if inner.active != self.member {
            let mine = inner.parked.remove(&self.member).unwrap_or_default();
            let theirs = std::mem::replace(&mut inner.client, mine);
            let active = inner.active;
            inner.parked.insert(active, theirs);
            inner.active = self.member;
        }
        inner.expire_transactions();
        inner.land_in_doubt(None);
        inner
    }

    /// Member `member` of this cluster (a new one the first time).
    pub(crate) fn member(&self, member: usize) -> FakeKafka {
        FakeKafka {
            cluster: Arc::clone(&self.cluster),
            member,
        }
    }

    /// Fails the `nth` call of `kind` (about `topic`, when given) with `error()`.
    pub(crate) fn fail(
        &self,
        kind: Kind,
        topic: Option<&str>,
        nth: u32,
        error: impl Fn() -> Error + Send + 'static,
    ) {
        self.inner().client.faults.push(Fault {
            kind,
            topic: topic.map(str::to_owned),
            nth,
            error: Box::new(error),
            seen: 0,
            applied: false,
        });
    }

    /// Lets the `nth` call of `kind` take effect, then fail with `error()`.
    pub(crate) fn fail_after_applying(
        &self,
        kind: Kind,
        nth: u32,
        error: impl Fn() -> Error + Send + 'static,
    ) {
        self.inner().client.faults.push(Fault {
            kind,
            topic: None,
            nth,
            error: Box::new(error),
            seen: 0,
            applied: true,
        });
    }

    /// The partitions the consumer has.
    pub(crate) fn assign(&self, partitions: &[i32]) {
        self.inner().client.assigned = partitions.to_vec();
    }

    /// Each poll of a held consumer serves the next of `polls` (then nothing).
    pub(crate) fn serve_while_held(&self, polls: Vec<Vec<Rebalanced>>) {
        self.inner().client.held_polls = polls
            .into_iter()
            .map(|rebalances| Polled {
                records: Vec::new(),
                rebalances,
            })
            .collect();
    }

    /// Each poll of a held consumer returns the next of `polls` (then nothing): records
    /// too, as librdkafka returns those of a partition assigned while held before its
    /// pause takes effect.
    pub(crate) fn poll_while_held(&self, polls: Vec<Polled>) {
        self.inner().client.held_polls = polls.into();
    }

    /// The consumer raises `error` as fatal from now on.
    pub(crate) fn raise_fatal(&self, error: impl Fn() -> Error + Send + 'static) {
        self.raise_fatal_in(Duration::ZERO, error);
    }

    /// The consumer raises `error` as fatal once `delay` (of tokio time) has passed, as
    /// librdkafka does when a heartbeat learns that a successor joined.
    pub(crate) fn raise_fatal_in(
        &self,
        delay: Duration,
        error: impl Fn() -> Error + Send + 'static,
    ) {
        self.inner().client.fatal = Some((Box::new(error), tokio::time::Instant::now() + delay));
    }

    /// Describing the group says `holders` in turn (the last one from then on); before
    /// this, nobody is under the instance ID.
    pub(crate) fn describe_group_as(&self, holders: Vec<crate::kafka::Holder>) {
        self.inner().client.holders = holders.into();
    }

    /// The producer is fenced: a probe says so until a new producer is made.
    pub(crate) fn fence_producer(&self) {
        self.inner().client.producer_fenced = true;
    }

    /// Each replay takes `duration` (of tokio time).
    pub(crate) fn restore_takes(&self, duration: Duration) {
        self.inner().client.restore_takes = duration;
    }

    /// A replay of `partition` leaves the transaction log's progress at `offset`.
    pub(crate) fn progress_after_replay(&self, partition: i32, offset: i64) {
        self.inner().client.progress.insert(partition, offset);
    }

    /// The group's committed offset of `partition` reads `offset`, whatever was
    /// committed (an answer from before a commit was resolved).
    pub(crate) fn committed_offset_reads(&self, partition: i32, offset: i64) {
        self.inner().committed_offsets.insert(partition, offset);
    }

    /// Recovery's surroundings, with this fake replaying and renewing.
    pub(crate) fn resync<'a>(
        &self,
        config: &'a EngineConfig,
        stats: &'a Arc<Stats>,
    ) -> Resync<'a, FakeKafka, FakeKafka> {
        Resync::new(config, stats, self.clone(), self.clone())
    }

    /// The consumer polls `topic`, of `partitions` partitions, all assigned to it at the
    /// next poll; calls are no longer recorded; `idle` is triggered by a poll that finds
    /// nothing. For the test driver.
    pub(crate) fn serve_input(&self, topic: &str, partitions: i32, idle: crate::engine::Shutdown) {
        let mut inner = self.inner();
        inner.input = Some(topic.to_owned());
        inner.partitions.insert(topic.to_owned(), partitions);
        inner.quiet = true;
        inner.client.on_idle = Some(idle);
    }

    /// `topic` has `partitions` partitions.
    pub(crate) fn set_partitions(&self, topic: &str, partitions: i32) {
        self.inner().partitions.insert(topic.to_owned(), partitions);
    }

    /// Partitions of `topic`.
    pub(crate) fn partitions(&self, topic: &str) -> i32 {
        self.inner().partitions.get(topic).copied().unwrap_or(1)
    }

    /// A new consumer joins: it holds nothing until the next poll assigns it partitions
    /// `0..partitions` of the input (from the committed offsets). What a start does.
    pub(crate) fn rejoin(&self, partitions: i32) {
        let mut inner = self.inner();
        // A new consumer: no fence of an earlier one's membership applies to it.
        inner.client.member_fenced = false;
        inner.client.fence_at_keep_alive = None;
        inner.group_partitions = partitions;
        inner.client.assigned.clear();
        inner.client.positions.clear();
        inner.client.rebalances.clear();
        inner.client.unaware_polls = 0;
        inner.join();
    }

    /// The member stops (cleanly, or killed and its session expired): it leaves the
    /// group, whose other members share its partitions at their next poll. What its
    /// producer left open stays open until the transaction timeout or a new producer
    /// of its transactional ID.
    pub(crate) fn leave(&self) {
        let mut inner = self.inner();
        inner.leave();
        // Its process is gone, and the reads it left behind with it.
        inner.client.orphans.clear();
        inner.client.assigned.clear();
        inner.client.positions.clear();
        inner.client.rebalances.clear();
    }

    /// The coordinator aborts transactions open longer than `timeout` (of tokio time).
    pub(crate) fn abort_transactions_after(&self, timeout: Duration) {
        self.inner().transaction_timeout = Some(timeout);
    }

    /// The `nth` send from now times out on the client; its record still lands, later:
    /// with the producer's next transaction, unless a new producer fences it first.
    pub(crate) fn time_out_send(&self, nth: u32) {
        let mut inner = self.inner();
        let at = inner.client.sends + nth.max(1);
        inner.client.time_out_sends.insert(at);
    }

    /// What becomes of this member's `nth` commit from now (1: the next).
    pub(crate) fn commit_fate(&self, nth: u32, fate: CommitFate) {
        let mut inner = self.inner();
        let at = inner.client.commits + nth.max(1);
        inner.client.commit_fates.insert(at, fate);
    }

    /// The consumer's static membership is fenced at its `nth` keep-alive poll from
    /// now (1: the next), while it is held for a catch-up or an undo: as by a join under
    /// its instance ID whose answer was lost, or a coordinator away longer than the
    /// session. From then on its polls fail with [`Error::Fenced`]; its producer is not
    /// fenced, so the engine joins again in the same process, and whatever the hold
    /// gave up keeps running there.
    pub(crate) fn fence_member_while_held(&self, nth: u32) {
        self.inner().client.fence_at_keep_alive = Some(nth.max(1));
    }

    /// Whether the consumer's static membership is fenced.
    pub(crate) fn member_fenced(&self) -> bool {
        self.inner().client.member_fenced
    }

    /// Whether this member is in the group (not a zombie, not gone).
    pub(crate) fn in_group(&self) -> bool {
        let inner = self.inner();
        inner.group.contains(&inner.active)
    }

    /// The group's generation.
    pub(crate) fn generation(&self) -> u32 {
        self.inner().generation
    }

    /// The partitions this member's consumer has.
    pub(crate) fn assignment(&self) -> Vec<i32> {
        self.inner().client.assigned.clone()
    }

    /// Records sent without a time get `clock`'s (a broker stamps them on arrival).
    pub(crate) fn use_clock(&self, clock: crate::clock::Clock) {
        self.inner().clock = Some(clock);
    }

    /// How long the changelog keeps a tombstone after compaction reached it: Kafka's
    /// default `delete.retention.ms`.
    pub(crate) fn tombstones_kept(&self) -> Duration {
        crate::engine::changelog::DEFAULT_TOMBSTONES_KEPT
    }

    /// Compacts `topic` as Kafka's log cleaner does, once it has run over every segment:
    /// of each key's records in a partition only the last is kept, and a last one that is
    /// a tombstone goes too once it is older than [`FakeKafka::tombstones_kept`] (by the
    /// clock of [`FakeKafka::use_clock`]). Offsets do not change.
    pub(crate) fn compact(&self, topic: &str) {
        let mut inner = self.inner();
        let now = inner
            .clock
            .as_ref()
            .map_or(i64::MAX, crate::clock::Clock::now_ms);
        let kept = i64::try_from(self.tombstones_kept().as_millis()).unwrap_or(i64::MAX);
        let mut last: BTreeMap<(i32, Option<Vec<u8>>), i64> = BTreeMap::new();
        for record in inner.committed.iter().filter(|r| r.topic == topic) {
            last.insert((record.partition, record.key.clone()), record.offset);
        }
        inner.committed.retain(|r| {
            if r.topic != topic {
                return true;
            }
            let latest = last.get(&(r.partition, r.key.clone())) == Some(&r.offset);
            let expired_tombstone =
                r.value.is_none() && r.timestamp_ms.is_some_and(|at| now - at >= kept);
            latest && !expired_tombstone
        });
    }

    /// The next time the consumer is held, the group takes `partition` away and gives
    /// it back, and up to three of its records from the committed offset come in the
    /// same poll.
    pub(crate) fn bounce_while_held(&self, partition: i32) {
        self.inner().client.bounce_while_held.push(partition);
    }

    /// The next assignment of `partition` starts `by` records past the group's
    /// committed offset, as librdkafka's pause/assign races can make it start.
    pub(crate) fn misplace_next_assignment(&self, partition: i32, by: i64) {
        self.inner().client.misplaced.insert(partition, by);
    }

    /// The consumer's session expires (it was frozen, or cut off): the group moves to a
    /// new generation and refuses what the consumer commits until it joins again. The
    /// consumer goes on for `unaware_polls` polls as if nothing happened (a zombie),
    /// then hears of the loss: every partition is revoked and assigned to it again.
    pub(crate) fn lose_session(&self, unaware_polls: u32) {
        let mut inner = self.inner();
        let active = inner.active;
        inner.group.remove(&active);
        inner.generation += 1;
        inner.client.unaware_polls = unaware_polls;
    }

    /// Writes a record outside any transaction, as a plain producer does (the input's
    /// upstream): where it landed.
    pub(crate) fn produce(&self, record: Stored) -> (i32, i64) {
        let mut inner = self.inner();
        let partition = if record.partition >= 0 {
            record.partition
        } else {
            inner.partition_for(&record.topic, record.key.as_deref())
        };
        let next = inner
            .next_offset
            .entry((record.topic.clone(), partition))
            .or_default();
        let offset = *next;
        *next += 1;
        inner.committed.push(Stored {
            partition,
            offset,
            ..record
        });
        (partition, offset)
    }

    /// What a `read_uncommitted` reader of `topic` sees beyond the committed records:
    /// the open transaction's.
    pub(crate) fn open_records(&self, topic: &str) -> Vec<Stored> {
        let inner = self.inner();
        inner
            .clients()
            .flat_map(|client| &client.open)
            .chain(inner.in_doubt.iter().flat_map(|commit| &commit.records))
            .filter(|r| r.topic == topic)
            .cloned()
            .collect()
    }

    /// The last stable offset of `topic`'s `partition`: the first offset an open
    /// transaction wrote there, else its end.
    pub(crate) fn last_stable_offset(&self, topic: &str, partition: i32) -> i64 {
        let inner = self.inner();
        let end = inner
            .next_offset
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0);
        inner
            .clients()
            .flat_map(|client| &client.open)
            .chain(inner.in_doubt.iter().flat_map(|commit| &commit.records))
            .filter(|r| r.topic == topic && r.partition == partition)
            .map(|r| r.offset)
            .min()
            .unwrap_or(end)
    }

    /// The offset after the last record (or marker) of `topic`'s `partition`.
    pub(crate) fn end_offset(&self, topic: &str, partition: i32) -> i64 {
        self.inner()
            .next_offset
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }

    /// Forgets the calls so far.
    pub(crate) fn clear_calls(&self) {
        self.inner().calls.clear();
    }

    /// Every call so far, in order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.inner().calls.clone()
    }

    /// What a `read_committed` reader of `topic` sees.
    pub(crate) fn committed(&self, topic: &str) -> Vec<Stored> {
        self.inner()
            .committed
            .iter()
            .filter(|r| r.topic == topic)
            .cloned()
            .collect()
    }

    /// The input offsets committed so far.
    pub(crate) fn committed_offsets(&self) -> BTreeMap<i32, i64> {
        self.inner().committed_offsets.clone()
    }
}

impl Source for FakeKafka {
    /// Serves the rebalances due (an assigned partition's position starts at its
    /// committed offset), then up to `max_records` committed records of the input from
    /// the positions, partition by partition. A poll that finds nothing triggers the
    /// idle handle, if there is one.
    fn poll(
        &self,
        max_records: usize,
        _max_wait: Duration,
    ) -> impl Future<Output = Result<Polled>> + Send {
        let mut inner = self.inner();
        inner.run_orphans();
        if inner.client.member_fenced {
            return std::future::ready(Err(member_fenced()));
        }
        if inner.client.member_generation != inner.generation {
            if inner.group.contains(&inner.active) {
                // The group moved on (a member joined or left): this member's part.
                inner.follow_group();
            } else if inner.client.unaware_polls == 0 {
                // A zombie hears that its session expired: it loses every partition,
                // and joins again.
                let lost = std::mem::take(&mut inner.client.assigned);
                for partition in &lost {
                    inner.client.positions.remove(partition);
                }
                inner.client.rebalances.push(Rebalanced::Revoked(lost));
                inner.join();
            } else {
                inner.client.unaware_polls -= 1;
            }
        }
        let rebalances = std::mem::take(&mut inner.client.rebalances);
        for event in &rebalances {
            match event {
                Rebalanced::Assigned(partitions) => {
                    for partition in partitions {
                        let from = inner.committed_offsets.get(partition).copied().unwrap_or(0)
                            + inner.client.misplaced.remove(partition).unwrap_or(0);
                        inner.client.positions.insert(*partition, from);
                        if !inner.client.assigned.contains(partition) {
                            inner.client.assigned.push(*partition);
                        }
                    }
                    inner.client.assigned.sort_unstable();
                }
                Rebalanced::Revoked(partitions) => {
                    inner.client.assigned.retain(|p| !partitions.contains(p));
                    for partition in partitions {
                        inner.client.positions.remove(partition);
                    }
                }
            }
        }
        let mut records = Vec::new();
        if let Some(input) = inner.input.clone() {
            for partition in inner.client.assigned.clone() {
                let mut from = inner.client.positions.get(&partition).copied().unwrap_or(0);
                // Past the end, Kafka answers OFFSET_OUT_OF_RANGE and the consumer
                // starts again where `auto.offset.reset` (the engine's: earliest) says.
                let end = inner
                    .next_offset
                    .get(&(input.clone(), partition))
                    .copied()
                    .unwrap_or(0);
                if from > end {
                    from = 0;
                    inner.client.positions.insert(partition, 0);
                }
                let taken: Vec<Record> = inner
                    .committed
                    .iter()
                    .filter(|r| r.topic == input && r.partition == partition && r.offset >= from)
                    .take(max_records - records.len())
                    .map(Stored::to_record)
                    .collect();
                if let Some(last) = taken.last() {
                    inner.client.positions.insert(partition, last.offset + 1);
                }
                records.extend(taken);
                if records.len() >= max_records {
                    break;
                }
            }
        }
        if records.is_empty()
            && rebalances.is_empty()
            && let Some(idle) = &inner.client.on_idle
        {
            idle.trigger();
        }
        std::future::ready(Ok(Polled {
            records,
            rebalances,
        }))
    }

    fn commit(&self, offsets: Vec<(i32, i64)>) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.call(Call::ConsumerCommit(offsets.clone()));
        let result = inner.fault(Kind::ConsumerCommit, None).and_then(|()| {
            if inner.client.member_generation != inner.generation {
                // The group refuses a commit from a member behind a rebalance (or a
                // zombie): librdkafka's ILLEGAL_GENERATION, classified as Kafka's.
                let code = crate::KafkaCode::ILLEGAL_GENERATION;
                return Err(Error::Kafka {
                    operation: "commit".into(),
                    code,
                    message: "the group has moved to a newer generation".into(),
                    class: crate::kafka::classify(code),
                    cause: None,
                });
            }
            inner.committed_offsets.extend(offsets);
            Ok(())
        });
        std::future::ready(result)
    }

    fn committed(
        &self,
        partitions: Vec<i32>,
    ) -> impl Future<Output = Result<Vec<(i32, Option<i64>)>>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Committed(partitions.clone()));
        let pending = inner
            .parked
            .values()
            .flat_map(|client| &client.open_offsets)
            .any(|(p, _)| partitions.contains(p));
        let result = inner.fault(Kind::Committed, None);
        let result = result.and_then(|()| {
            if pending {
                // `require_stable`: another member's open transaction holds offsets of
                // these partitions; the broker answers so until it ends.
                return Err(Error::Kafka {
                    operation: "committed".into(),
                    code: crate::KafkaCode::UNSTABLE_OFFSET_COMMIT,
                    message: "another transaction holds offsets of these partitions".into(),
                    class: crate::ErrorClass::Retriable,
                    cause: None,
                });
            }
            Ok(())
        });
        let result = result.map(|()| {
            partitions
                .iter()
                .map(|p| (*p, inner.committed_offsets.get(p).copied()))
                .collect()
        });
        std::future::ready(result)
    }

    fn seek(&self, positions: Vec<(i32, Option<i64>)>) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Seek(positions.clone()));
        let result = inner.fault(Kind::Seek, None).map(|()| {
            for (partition, offset) in positions {
                inner
                    .client
                    .positions
                    .insert(partition, offset.unwrap_or(0));
            }
        });
        std::future::ready(result)
    }

    fn assigned(&self) -> impl Future<Output = Result<Vec<i32>>> + Send {
        std::future::ready(Ok(self.inner().client.assigned.clone()))
    }

    fn fatal_error(&self) -> Option<Error> {
        let inner = self.inner();
        let (error, from) = inner.client.fatal.as_ref()?;
        (tokio::time::Instant::now() >= *from).then(error)
    }

    fn hold(&self) -> impl Future<Output = Result<()>> + Send {
        self.inner().call(Call::Hold);
        std::future::ready(Ok(()))
    }

    fn keep_alive(&self) -> impl Future<Output = Result<Polled>> + Send {
        // Not recorded: how many polls happen depends on the time the work takes.
        let mut inner = self.inner();
        if let Some(left) = inner.client.fence_at_keep_alive.as_mut() {
            *left -= 1;
            if *left == 0 {
                inner.client.fence_at_keep_alive = None;
                inner.client.member_fenced = true;
            }
        }
        if inner.client.member_fenced {
            return std::future::ready(Err(member_fenced()));
        }
        let result = inner.fault(Kind::KeepAlive, None).map(|()| {
            // Each partition once, as a rebalance names it (the simulation may ask for
            // the same one twice before a hold comes).
            let bounced: Vec<i32> = std::mem::take(&mut inner.client.bounce_while_held)
                .into_iter()
                .filter(|p| inner.client.assigned.contains(p))
                .collect::<std::collections::BTreeSet<i32>>()
                .into_iter()
                .collect();
            if bounced.is_empty() {
                return inner.client.held_polls.pop_front().unwrap_or_default();
            }
            let mut records = Vec::new();
            if let Some(input) = inner.input.clone() {
                for partition in &bounced {
                    let from = inner.committed_offsets.get(partition).copied().unwrap_or(0);
                    let taken: Vec<Record> = inner
                        .committed
                        .iter()
                        .filter(|r| {
                            r.topic == input && r.partition == *partition && r.offset >= from
                        })
                        .take(3)
                        .map(Stored::to_record)
                        .collect();
                    let next = taken.last().map_or(from, |r| r.offset + 1);
                    inner.client.positions.insert(*partition, next);
                    records.extend(taken);
                }
            }
            Polled {
                records,
                rebalances: vec![
                    Rebalanced::Revoked(bounced.clone()),
                    Rebalanced::Assigned(bounced),
                ],
            }
        });
        std::future::ready(result)
    }

    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        self.inner().call(Call::Release);
        std::future::ready(Ok(()))
    }

    fn holder(&self) -> impl Future<Output = Result<crate::kafka::Holder>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Members);
        let result = inner.fault(Kind::Members, None).map(|()| {
            let holder = if inner.client.holders.len() > 1 {
                inner.client.holders.pop_front()
            } else {
                inner.client.holders.front().cloned()
            };
            holder.unwrap_or(crate::kafka::Holder {
                member: None,
                stable: true,
            })
        });
        std::future::ready(result)
    }

    fn session_timeout(&self) -> Duration {
        FAKE_SESSION_TIMEOUT
    }
}

impl Restore for FakeKafka {
    fn restore(
        &self,
        partition: i32,
        committed: Option<i64>,
        _cancel: &Cancel,
    ) -> impl Future<Output = Result<()>> + Send {
        let (result, takes) = {
            let mut inner = self.inner();
            inner.call(Call::Restore(partition, committed));
            (inner.fault(Kind::Restore, None), inner.client.restore_takes)
        };
        async move {
            tokio::time::sleep(takes).await;
            result
        }
    }

    fn progress(&self, partition: i32) -> Result<Option<i64>> {
        Ok(self.inner().client.progress.get(&partition).copied())
    }
}

impl Renew<FakeKafka> for FakeKafka {
    fn renew(&self) -> impl Future<Output = Result<FakeKafka>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Renew);
        // A new producer aborts what its predecessor left open.
        let result = inner.fault(Kind::Renew, None).map(|()| {
            // Its initialisation waits for the markers of its predecessor's commit.
            let active = inner.active;
            inner.land_in_doubt(Some(active));
            inner.client.late_commit = false;
            if inner.client.in_transaction || !inner.client.open.is_empty() {
                // Its abort marker, in each partition the transaction wrote.
                inner.mark();
            }
            inner.client.open.clear();
            inner.client.open_offsets.clear();
            inner.client.in_transaction = false;
            inner.client.began = None;
            inner.client.timed_out = false;
            inner.client.producer_fenced = false;
            // The new producer's epoch fences what the old one still had in flight.
            inner.client.late.clear();
            inner.client.send_timed_out = false;
            self.clone()
        });
        std::future::ready(result)
    }
}

impl Sink<FakeKafka> for FakeKafka {
    type Pending = FakePending;

    fn begin(&self) -> Result<()> {
        let mut inner = self.inner();
        inner.call(Call::Begin);
        inner.fault(Kind::Begin, None)?;
        assert!(
            !inner.client.in_transaction,
            "begin inside an open transaction"
        );
        // The coordinator holds a new transaction back until the last one's markers are
        // written.
        let active = inner.active;
        inner.land_in_doubt(Some(active));
        inner.client.in_transaction = true;
        inner.client.began = Some(tokio::time::Instant::now());
        // What timed out in an earlier transaction of this producer lands now, in this
        // one (what Transactions V2, KIP-890 part 2, would refuse).
        let late = std::mem::take(&mut inner.client.late);
        for mut record in late {
            let next = inner
                .next_offset
                .entry((record.topic.clone(), record.partition))
                .or_default();
            record.offset = *next;
            *next += 1;
            inner.client.open.push(record);
        }
        Ok(())
    }

    fn send(&self, record: Outgoing<'_>) -> impl Future<Output = Result<FakePending>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Send {
            topic: record.topic.to_owned(),
            partition: record.partition,
        });
        let result = inner.fault(Kind::Send, Some(record.topic));
        let result = result.and_then(|()| inner.timed_out()).map(|()| {
            let partition = record
                .partition
                .unwrap_or_else(|| inner.partition_for(record.topic, record.key));
            let next = inner
                .next_offset
                .entry((record.topic.to_owned(), partition))
                .or_default();
            let offset = *next;
            *next += 1;
            inner.client.sends += 1;
            let sent = inner.client.sends;
            let late = inner.client.time_out_sends.remove(&sent);
            let landing = match inner.fault(Kind::Landing, Some(record.topic)) {
                Ok(()) if late => Err(Refused::TimedOut),
                Ok(()) => Ok((partition, offset)),
                Err(error) => Err(Refused::Rejected(error.to_string())),
            };
            let stored = Stored {
                topic: record.topic.to_owned(),
                partition,
                offset,
                key: record.key.map(<[u8]>::to_vec),
                value: record.value.map(<[u8]>::to_vec),
                headers: record
                    .headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), v.map(<[u8]>::to_vec)))
                    .collect(),
                timestamp_ms: record
                    .timestamp_ms
                    .or_else(|| inner.clock.as_ref().map(crate::clock::Clock::now_ms)),
            };
            if late {
                inner.client.send_timed_out = inner.client.in_transaction;
                // Its request is still on its way: it lands with the producer's next
                // transaction (the same epoch), unless a new producer fences it first.
                inner.client.late.push(stored);
            } else if landing.is_ok() {
                if inner.client.in_transaction {
                    inner.client.open.push(stored);
                } else {
                    inner.committed.push(stored);
                }
            }
            FakePending(landing)
        });
        std::future::ready(result)
    }

    fn send_offsets(
        &self,
        _source: &FakeKafka,
        _topic: &str,
        offsets: Vec<(i32, i64)>,
    ) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.call(Call::SendOffsets(offsets.clone()));
        let mut result = inner
            .fault(Kind::SendOffsets, None)
            .and_then(|()| inner.timed_out());
        if result.is_ok() && inner.client.member_generation != inner.generation {
            // What the group coordinator answers a member of an older generation; for
            // librdkafka the transaction must then be aborted.
            result = Err(Error::Kafka {
                operation: "send_offsets_to_transaction".into(),
                code: crate::KafkaCode::ILLEGAL_GENERATION,
                message: "the group has moved to a newer generation".into(),
                class: crate::ErrorClass::Abortable,
                cause: None,
            });
        }
        let result = result.map(|()| {
            if std::mem::take(&mut inner.client.late_commit) {
                // The earlier commit request lands now, in this transaction.
                inner.commit_open();
            }
            inner.client.open_offsets.extend(offsets);
        });
        std::future::ready(result)
    }

    fn commit(&self) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Commit);
        let fault = inner.fault_after(Kind::Commit, None);
        let result = match fault {
            Some((error, false)) => Err(error),
            None if inner.client.timed_out => inner.timed_out(),
            None if inner.client.send_timed_out => Err(Error::Kafka {
                operation: "commit_transaction".into(),
                code: crate::KafkaCode::MESSAGE_TIMED_OUT,
                message: "a record of the transaction timed out".into(),
                class: crate::ErrorClass::Abortable,
                cause: None,
            }),
            applied => {
                inner.client.commits += 1;
                let number = inner.client.commits;
                let fate = inner.client.commit_fates.remove(&number);
                let timed_out = || Error::Kafka {
                    operation: "commit_transaction".into(),
                    code: crate::KafkaCode::REQUEST_TIMED_OUT,
                    message: "the commit request timed out (it may still land)".into(),
                    class: crate::ErrorClass::Retriable,
                    cause: None,
                };
                match fate {
                    Some(CommitFate::TimesOutLate) => {
                        // Still open on the coordinator; the request is on its way.
                        inner.client.late_commit = true;
                        Err(timed_out())
                    }
                    Some(fate @ (CommitFate::MarkersLate | CommitFate::TimesOutInDoubt)) => {
                        let commit = InDoubt {
                            member: inner.active,
                            records: std::mem::take(&mut inner.client.open),
                            offsets: std::mem::take(&mut inner.client.open_offsets),
                            lands_at: tokio::time::Instant::now() + IN_DOUBT_FOR,
                        };
                        inner.in_doubt.push(commit);
                        inner.client.in_transaction = false;
                        inner.client.began = None;
                        if fate == CommitFate::TimesOutInDoubt {
                            Err(timed_out())
                        } else {
                            applied.map_or(Ok(()), |(error, _)| Err(error))
                        }
                    }
                    None => {
                        inner.commit_open();
                        inner.client.in_transaction = false;
                        inner.client.began = None;
                        applied.map_or(Ok(()), |(error, _)| Err(error))
                    }
                }
            }
        };
        std::future::ready(result)
    }

    fn abort(&self) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Abort);
        let result = inner.fault(Kind::Abort, None).map(|()| {
            inner.mark();
            inner.client.open.clear();
            inner.client.open_offsets.clear();
            inner.client.in_transaction = false;
            inner.client.began = None;
            inner.client.timed_out = false;
            if inner.client.send_timed_out {
                // librdkafka bumps the epoch after aborting a transaction a record of
                // which timed out (KIP-360's drain and bump): the late record is fenced.
                inner.client.late.clear();
                inner.client.send_timed_out = false;
            }
        });
        std::future::ready(result)
    }

    fn flush(&self) -> impl Future<Output = Result<()>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Flush);
        std::future::ready(inner.fault(Kind::Flush, None))
    }

    fn probe_fenced(&self, _topic: &str) -> impl Future<Output = Result<bool>> + Send {
        let mut inner = self.inner();
        inner.call(Call::Probe);
        let result = inner
            .fault(Kind::Probe, None)
            .map(|()| inner.client.producer_fenced);
        std::future::ready(result)
    }
}

/// Changelog records applied to the transaction log per write while replaying (the
/// engine's replay reads in chunks too; a crash during replay falls between two).
const REPLAY_CHUNK: usize = 64;

/// How long a replay takes to start reading (of tokio time).
const REPLAY_STARTS_IN: Duration = Duration::from_millis(100);

/// The changelog's replay from the fake into a real transaction log: the engine's
/// `changelog::replay` without the Kafka reads. From the partition's checkpoint, every
/// committed changelog record, decoded as the engine decodes them, applied with the
/// offset after it as the new checkpoint; then the checkpoint moves past the markers.
pub(crate) struct MemoryReplay<'a> {
    pub(crate) kafka: &'a FakeKafka,
    pub(crate) changelog: &'a str,
    pub(crate) txlog: &'a Arc<TxLog>,
    pub(crate) stats: &'a Arc<Stats>,
    /// `accept_changelog_behind`.
    pub(crate) accept_behind: bool,
    /// The changelog's `delete.retention.ms`.
    pub(crate) tombstones_kept: Duration,
    /// How long a replay waits for a transaction that hides committed records.
    pub(crate) wait: Duration,
    /// How long a replay that reached the committed offset still waits for a
    /// transaction open since before it began.
    pub(crate) in_doubt_wait: Duration,
}

impl MemoryReplay<'_> {
    /// Applies the committed changelog records of `partition` from its checkpoint, in
    /// chunks, and moves the checkpoint to the last stable offset (what an open
    /// transaction hides is read later).
    async fn read_committed(&self, partition: i32, cancel: &Cancel) -> Result<()> {
        let from = self.txlog.checkpoint(partition)?.unwrap_or(0);
        let stable = self.kafka.last_stable_offset(self.changelog, partition);
        let records: Vec<Stored> = self
            .kafka
            .committed(self.changelog)
            .into_iter()
            .filter(|r| r.partition == partition && r.offset >= from && r.offset < stable)
            .collect();
        let chunks = records.chunks(REPLAY_CHUNK).count();
        for (index, chunk) in records.chunks(REPLAY_CHUNK).enumerate() {
            let changes = chunk
                .iter()
                .map(|r| {
                    crate::engine::changelog::decode(
                        self.changelog,
                        partition,
                        r.offset,
                        r.key.as_deref(),
                        r.value.as_deref(),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let last = chunk.last().map_or(from, |r| r.offset);
            cancel.unless_cancelled("a replay", || {
                self.txlog.apply(&[(partition, changes, Some(last + 1))])
            })?;
            Stats::add(&self.stats.replayed_records, chunk.len() as u64);
            #[cfg(feature = "testing")]
            if index + 1 < chunks && crate::crash::due("onceflow-during-replay") {
                crate::crash::hang().await;
            }
            let _ = (index, chunks);
        }
        if self
            .txlog
            .checkpoint(partition)?
            .is_none_or(|at| at < stable)
        {
            cancel.unless_cancelled("a replay", || {
                self.txlog.apply(&[(partition, Vec::new(), Some(stable))])
            })?;
        }
        Ok(())
    }
}

impl Restore for MemoryReplay<'_> {
    /// As the engine's replay: reads until nothing is hidden by a transaction that was
    /// open when it began (waiting for it, at most `wait`), then checks the progress.
    async fn restore(&self, partition: i32, committed: Option<i64>, cancel: &Cancel) -> Result<()> {
        let orphaned = OrphanOnDrop {
            replay: self,
            partition,
            cancel: Some(cancel.clone()),
        };
        let result = self.replay(partition, committed, cancel).await;
        orphaned.finished();
        result
    }

    fn progress(&self, partition: i32) -> Result<Option<i64>> {
        self.txlog.progress(partition)
    }
}

/// Leaves an [`OrphanReplay`] behind when a replay's future is dropped before it ends.
struct OrphanOnDrop<'a, 'b> {
    replay: &'a MemoryReplay<'b>,
    partition: i32,
    cancel: Option<Cancel>,
}

impl OrphanOnDrop<'_, '_> {
    /// The replay ended (well or not): nothing goes on behind the engine.
    fn finished(mut self) {
        self.cancel = None;
    }
}

impl Drop for OrphanOnDrop<'_, '_> {
    fn drop(&mut self) {
        let Some(cancel) = self.cancel.take() else {
            return;
        };
        let replay = self.replay;
        let from = replay
            .txlog
            .checkpoint(self.partition)
            .ok()
            .flatten()
            .unwrap_or(0);
        let until = replay.kafka.end_offset(replay.changelog, self.partition);
        let mut inner = replay.kafka.inner();
        let commits = inner.client.commits;
        inner.client.orphans.push(OrphanReplay {
            txlog: Arc::downgrade(replay.txlog),
            changelog: replay.changelog.to_owned(),
            partition: self.partition,
            from,
            until,
            cancel,
            commits,
        });
    }
}

impl MemoryReplay<'_> {
    /// [`Restore::restore`], without what is left behind when it is dropped.
    async fn replay(&self, partition: i32, committed: Option<i64>, cancel: &Cancel) -> Result<()> {
        crate::engine::changelog::forget_if_out_of_step(
            self.txlog,
            self.changelog,
            partition,
            self.tombstones_kept,
            cancel,
        )?;
        // A replay of the broker takes a while even for an empty partition (its
        // reader's connection, offsets and first fetch: 134-776 ms were measured), so a
        // hold around it polls the held consumer meanwhile.
        tokio::time::sleep(REPLAY_STARTS_IN).await;
        let high_at_start = self.kafka.end_offset(self.changelog, partition);
        let mut waiting: Option<tokio::time::Instant> = None;
        loop {
            self.read_committed(partition, cancel).await?;
            let stable = self.kafka.last_stable_offset(self.changelog, partition);
            let high_now = self.kafka.end_offset(self.changelog, partition);
            let reached = match committed {
                None => true,
                Some(committed) => self
                    .txlog
                    .progress(partition)?
                    .is_some_and(|at| at >= committed),
            };
            let waited = waiting.map(|since| since.elapsed());
            match crate::kafka::at_the_end(
                reached,
                stable,
                high_at_start,
                high_now,
                waited,
                self.in_doubt_wait,
                self.wait,
            ) {
                AtTheEnd::Stop { .. } | AtTheEnd::StopDespiteOpen => break,
                AtTheEnd::Hanging => {
                    return Err(Error::HangingTransaction {
                        topic: self.changelog.to_owned(),
                        partition,
                        last_stable_offset: stable,
                        high_watermark: high_now,
                        waited: waited.unwrap_or_default(),
                    });
                }
                AtTheEnd::Wait => {
                    waiting.get_or_insert_with(tokio::time::Instant::now);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        cancel.unless_cancelled("a replay", || self.txlog.mark_in_step(partition))?;
        if let Some(committed) = committed {
            crate::engine::changelog::behind(
                self.changelog,
                partition,
                committed,
                self.txlog.progress(partition)?,
                self.accept_behind,
            )?;
        }
        Ok(())
    }
}
