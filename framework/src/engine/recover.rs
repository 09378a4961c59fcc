//! What the engine does when a batch fails: abort, re-synchronise with what the broker
//! says happened, back off, and find the record that fails every batch it is in.
//!
//! Invariants:
//! - Nothing is assumed about a failed batch's outcome: every owned partition is caught
//!   up with the group's stable committed offsets (replaying the changelog to them) and
//!   moved to them, whether the batch aborted or its commit went through after all;
//!   except a partition a rebalance moved while the consumer was held, which the
//!   engine's loop catches up for its new assignment (a seek would move the consumer
//!   behind records of it already held).
//! - A producer is never used again after a transactional request of it timed out
//!   (librdkafka has no Transactions V2): a new one takes its place.
//! - The engine's position is the authority: a partition's first record past where a
//!   catch-up found it must go on from makes the engine seek back there, once.
//! - Replays a catch-up started apply nothing once the catch-up is gone.
//! - A producer is re-created under the instance's transactional ID only while the
//!   instance still owns it (its consumer was not fenced by a successor).
//! - A fence is not proof of a successor: the cluster fences an instance's own producer
//!   and static member when a coordinator moves at the wrong moment. Group membership
//!   decides (a successor joins under the same instance ID, which fences the consumer
//!   within a heartbeat), and [`Fences`] bounds how often an instance may take a fence
//!   for its own, so two instances sharing an instance ID cannot fight for ever.
//! - Records go one per transaction only after a refusal, and only until the refused
//!   record is found; it is handled per `on_error`, never retried for ever.
//! - Work that does not poll (catching up, back-off) runs with the consumer held: its
//!   partitions paused and polled twice a second, so the member stays in the group past
//!   `max.poll.interval.ms`. Never while a transaction is open: a rebalance is served
//!   only between transactions. What those polls bring waits in [`Resync::take_held`].
//!   Newly assigned partitions are not paused during their first
//!   [`HOLD_AFTER_ASSIGNMENT`]: librdkafka may still be starting their fetchers, and a
//!   pause then can leave one never fetched.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::KafkaCode;
use crate::config::{DeliveryMode, EngineConfig};
use crate::engine::backoff::{RECOVERY_PATIENCE, retry_transient, retry_transient_for};
use crate::engine::seams::{Cancel, Renew, Restore, Sink, Source};
use crate::engine::stats::{Phase, Stats};
use crate::engine::{batch, dead_letters};
use crate::kafka;
use crate::processor::Processor;
use crate::txlog::TxLog;
use crate::{Error, Result};

/// Failed batches in a row after which the engine looks for the record that fails them.
pub(super) const ISOLATE_AFTER: u32 = 2;
/// How often a held consumer is polled: far inside any `max.poll.interval.ms` librdkafka
/// accepts with the broker's smallest session timeout (6 s by default).
const KEEP_ALIVE_EVERY: Duration = Duration::from_millis(500);
/// How long the catch-up of newly assigned partitions runs before the consumer is held.
/// librdkafka starts a new partition's fetcher asynchronously, once the group's committed
/// offset is known, and a pause that lands between the start being queued and being
/// served makes it drop the start as outdated: the partition is then never fetched, with
/// no error (librdkafka's issues 2190 and 5591; CI's benchmark smoke test saw a partition
/// never processed). Most catch-ups are over well within this, and are never held; a
/// longer one is held after it, when the starts are long served. Not polling meanwhile
/// is far inside `max.poll.interval.ms`.
pub(super) const HOLD_AFTER_ASSIGNMENT: Duration = Duration::from_secs(5);
/// How long a fenced producer waits, its consumer held, for the consumer to hear of a
/// successor before the fence is taken for the instance's own: two heartbeats at
/// librdkafka's default `heartbeat.interval.ms` (3 s), and a margin.
pub(super) const FENCE_GRACE: Duration = Duration::from_secs(7);
/// Fences (of the producer or of the static member) an instance takes for its own within
/// [`FENCE_WINDOW`]; one more stops it as fenced.
pub(super) const MAX_FENCES: usize = 5;
/// See [`MAX_FENCES`].
pub(super) const FENCE_WINDOW: Duration = Duration::from_secs(600);
/// Beyond the session timeout, how long a member under a fenced instance's ID must stay
/// before it counts as a successor's (heartbeats are a few seconds apart).
pub(super) const SESSION_MARGIN: Duration = Duration::from_secs(5);
/// The longest wait for a group to settle before a member under the instance ID counts
/// as a successor's.
pub(super) const SUCCESSOR_WAIT: Duration = Duration::from_secs(330);
/// How often the group is described while waiting.
const DESCRIBE_EVERY: Duration = Duration::from_secs(1);

/// What a batch needs besides the producer, which recovery may replace between two.
pub(super) struct Parts<'a, S> {
    pub(super) config: &'a EngineConfig,
    pub(super) consumer: &'a S,
    pub(super) txlog: &'a Arc<TxLog>,
    pub(super) stats: &'a Arc<Stats>,
    pub(super) declared: &'a BTreeSet<String>,
    pub(super) changelog: &'a str,
    pub(super) output_limits: &'a std::collections::BTreeMap<String, usize>,
}

impl<'a, S: Source> Parts<'a, S> {
    /// A batch through `producer`.
    pub(super) fn batch<'p, K: Sink<S>>(&self, producer: &'p K) -> batch::Batch<'p, S, K>
    where
        'a: 'p,
    {
        batch::Batch {
            config: self.config,
            consumer: self.consumer,
            producer,
            txlog: self.txlog,
            stats: self.stats,
            declared: self.declared,
            changelog: self.changelog,
            output_limits: self.output_limits,
        }
    }
}

/// How a batch failed.
pub(super) enum Failed {
    /// It failed as a whole: abort, rewind, and try again.
    Batch(Error),
    /// The record that failed it alone was dead-lettered (and everything is rewound).
    Isolated,
    /// The instance must stop.
    Stop(Error),
}

/// Runs `records` one per transaction, after batches failed in a row: the record that
/// fails alone, refused for good by the broker (too large, invalid for its topic) or
/// holding its transaction past the timeout, is the one that fails them all. It is
/// handled per `on_error` in a transaction of its own, and the partitions are rewound
/// to what is committed; the records after it come again with the next poll.
pub(super) async fn isolate<S, K, P, R, N>(
    parts: &Parts<'_, S>,
    resync: &Resync<'_, R, N>,
    processor: &mut P,
    producer: &mut K,
    owned: &BTreeSet<i32>,
    records: Vec<kafka::Record>,
) -> Option<Failed>
where
    S: Source,
    K: Sink<S> + Send,
    P: Processor,
    R: Restore,
    N: Renew<K>,
{
    for record in records {
        let alone = parts
            .batch(&*producer)
            .run(processor, vec![record.clone()])
            .await;
        let Err(error) = alone else { continue };

        let class = match &error {
            e if e.is_rejection() => dead_letters::FailureClass::Rejected,
            Error::TransactionTimedOut { .. } => dead_letters::FailureClass::TransactionTimeout,
            _ => return Some(Failed::Batch(error)),
        };
        if let Err(stop) = recover(resync, parts.consumer, producer, owned, &error).await {
            return Some(Failed::Stop(stop));
        }
        if resync.rebalanced_meanwhile() {
            // The record's partition may be someone else's now: its transaction would be
            // refused. Whoever owns it next finds the record the same way.
            tracing::info!(%error, "rebalanced while recovering; the records come again");
            return Some(Failed::Isolated);
        }
        tracing::warn!(
            %error,
            %class,
            partition = record.partition,
            offset = record.offset,
            "found the record that fails its batches"
        );
        if let Err(stop) = parts
            .batch(&*producer)
            .fail_alone(&record, class, error)
            .await
        {
            return Some(Failed::Stop(stop));
        }
        let next = vec![(record.partition, Some(record.offset + 1))];
        if let Err(stop) = parts.consumer.seek(next).await {
            return Some(Failed::Stop(stop));
        }
        return Some(Failed::Isolated);
    }
    None
}

/// Errors after which the instance must not go on, once [`recover`] has run: fatal
/// errors and configuration problems, and a record failure under `on_error = stop` (it
/// would fail the same way on the same record forever). Not a fence of the producer:
/// recovery either stopped on it (a successor) or made a new producer.
pub(super) fn stops_the_instance(error: &Error) -> bool {
    (error.is_fatal() && !producer_state_lost(error) && !matches!(error, Error::Fenced { .. }))
        || matches!(
            error,
            Error::Processing { .. }
                | Error::Decode { .. }
                | Error::Encode { .. }
                | Error::Corrupt { .. }
        )
}

/// A fatal error of the producer's transactional state that is not a fence: the
/// coordinator aborted the transaction under it (it moved, or timed the transaction out)
/// and the producer cannot go on, but the transactional ID is still this instance's. A
/// new producer takes over; the instance does not stop. (A successor would have fenced the
/// producer: that is `Error::Fenced`, and it stops.)
pub(super) fn producer_state_lost(error: &Error) -> bool {
    error.is_fatal()
        && [
            KafkaCode::INVALID_TRANSACTIONAL_STATE,
            KafkaCode::OUT_OF_ORDER_SEQUENCE_NUMBER,
            KafkaCode::UNKNOWN_PRODUCER_ID,
            KafkaCode::FATAL,
        ]
        .into_iter()
        .any(|code| error.has_code(code))
}

/// What re-synchronising with the group needs besides the clients: the changelog replay
/// and a way to make the producer again.
pub(crate) struct Resync<'a, R, N> {
    pub(super) config: &'a EngineConfig,
    pub(super) stats: &'a Arc<Stats>,
    pub(super) restore: R,
    pub(super) renew: N,
    /// What the polls of a held consumer brought, poll by poll in the order they came
    /// (rebalances and any record), for the engine's loop to act on before it polls again.
    pub(super) held: Mutex<Vec<kafka::Polled>>,
    /// The fences taken for the instance's own so far.
    pub(super) fences: Mutex<Fences>,
    /// Set while a fenced producer waits for the grace and is not yet replaced: a fence
    /// of the consumer meanwhile means both were fenced, which only a successor does.
    pub(super) producer_fenced: std::sync::atomic::AtomicBool,
    /// Per partition, where the last catch-up found it must go on from: a record below it
    /// was processed and committed, and is never processed again; the first record past
    /// it makes the engine seek back to it once (see [`Resync::drop_committed`]).
    pub(super) floor: Mutex<std::collections::BTreeMap<i32, Floor>>,
}

impl<'a, R, N> Resync<'a, R, N> {
    /// Recovery's surroundings with nothing held, fenced or caught up yet.
    pub(crate) fn new(
        config: &'a EngineConfig,
        stats: &'a Arc<Stats>,
        restore: R,
        renew: N,
    ) -> Self {
        Resync {
            config,
            stats,
            restore,
            renew,
            held: Mutex::default(),
            fences: Mutex::default(),
            producer_fenced: std::sync::atomic::AtomicBool::default(),
            floor: Mutex::default(),
        }
    }
}

/// Where a partition must go on from after a catch-up, until a record of it is taken.
#[derive(Debug, Clone, Copy)]
pub(super) struct Floor {
    /// The offset: records below it were committed.
    pub(super) at: i64,
    /// Where a start past it seeks back to: `at`, or the beginning when nothing was
    /// committed (the log's first offset may be past 0).
    pub(super) seek_to: Option<i64>,
    /// The first offset the consumer brought, when it was past `at` and the engine
    /// sought back (once).
    pub(super) seen_before_seek: Option<i64>,
}

/// What [`Resync::drop_committed`] did to a poll's records.
#[derive(Debug, Default)]
pub(super) struct Placed {
    /// Records dropped as below their partition's floor (already committed).
    pub(super) below: usize,
    /// Partitions whose first record was past their floor, to seek back to it.
    pub(super) seek: Vec<(i32, Option<i64>)>,
    /// Partitions the seek back found records the consumer had started past.
    pub(super) corrected: usize,
}

/// The fences an instance took for its own (it made a new producer, or joined the group
/// again), within [`FENCE_WINDOW`]: one a coordinator's failure causes is rare; many mean
/// another instance runs with the same instance ID, and the two would fence each other
/// for ever (neither could commit much; exactly once holds, progress does not).
#[derive(Debug, Default)]
pub(super) struct Fences {
    taken: std::collections::VecDeque<tokio::time::Instant>,
}

impl Fences {
    /// Takes one more fence for the instance's own, if the budget allows: `Ok` with how
    /// many were taken within the window, or `Err` with that count when it is spent.
    pub(super) fn take(&mut self) -> std::result::Result<usize, usize> {
        let now = tokio::time::Instant::now();
        while self
            .taken
            .front()
            .is_some_and(|at| now.duration_since(*at) >= FENCE_WINDOW)
        {
            self.taken.pop_front();
        }
        if self.taken.len() >= MAX_FENCES {
            return Err(self.taken.len());
        }
        self.taken.push_back(now);
        Ok(self.taken.len())
    }
}

/// Undoes a failed batch: aborts its transaction (recreating the producer when the abort
/// itself fails), then continues from what the broker says happened.
///
/// The outcome of a failed batch is not always known: a commit that timed out may have
/// reached the coordinator, and a new producer with the same transactional ID then
/// completes it instead of aborting it. So nothing is assumed: every owned partition's
/// changelog is replayed into redb (a no-op when the batch really aborted), and every owned
/// partition is moved to the group's committed offset (read with `read_committed`
/// semantics, so it waits for the transaction to be resolved), which is the batch's start
/// if it aborted and its end if it committed.
pub(super) async fn recover<C, P, R, N>(
    resync: &Resync<'_, R, N>,
    consumer: &C,
    producer: &mut P,
    owned: &BTreeSet<i32>,
    cause: &Error,
) -> Result<()>
where
    C: Source,
    P: Sink<C> + Send,
    R: Restore,
    N: Renew<P>,
{
    // An abort, a new producer and a replay can each take long: the consumer is held
    // through them (the transaction is over, or being aborted: nothing commits meanwhile).
    let undone = resync
        .holding(
            consumer,
            Duration::ZERO,
            undo(resync, consumer, producer, owned, cause),
        )
        .await;
    // Where the partitions move settles how the failed batch is counted.
    resync
        .stats
        .settle(undone.as_ref().ok().and_then(|moved| moved.as_deref()));
    let Some(mut committed) = undone? else {
        return Ok(());
    };
    // A partition revoked while catching up is not sought (its new owner reads from the
    // committed offset; the engine's loop forgets it), and neither is one revoked and
    // assigned back meanwhile: the engine's loop catches it up for its new assignment,
    // whose records from the committed offset may already wait among the held polls. A
    // seek now would move the consumer back behind them, and they would come twice,
    // past the floor their first delivery cleared (found by the simulation, seeds
    // 2000347 and 3000272: a refused record dead-lettered twice).
    if resync.rebalanced_meanwhile() {
        let assigned = consumer.assigned().await?;
        let moved = resync.rebalanced_partitions();
        committed
            .retain(|(partition, _)| assigned.contains(partition) && !moved.contains(partition));
    }
    tracing::info!(positions = ?committed, "moving the partitions to where catching up found them");
    retry_transient("seek to the committed offsets", || {
        consumer.seek(committed.clone())
    })
    .await
}

/// [`recover`] until the seek: returns where each owned partition must go on from
/// (`None`: nowhere to move, the instance was fenced or delivers at most once).
async fn undo<C, P, R, N>(
    resync: &Resync<'_, R, N>,
    consumer: &C,
    producer: &mut P,
    owned: &BTreeSet<i32>,
    cause: &Error,
) -> Result<Option<Vec<(i32, Option<i64>)>>>
where
    C: Source,
    P: Sink<C> + Send,
    R: Restore,
    N: Renew<P>,
{
    let config = resync.config;
    if matches!(cause, Error::Fenced { .. }) {
        resync.take_fence(consumer, producer, cause).await?;
    } else if matches!(
        cause,
        Error::TransactionTimedOut { .. } | Error::ProducerStuck { .. }
    ) || producer_state_lost(cause)
    {
        // The coordinator aborted the transaction and bumped the producer's epoch: this
        // producer is unusable, but no other instance has the transactional ID.
        if let Some(fatal) = consumer.fatal_error() {
            return Err(fatal);
        }
        tracing::warn!(error = %cause, "recreating the producer: its transaction was aborted under it");
        *producer = new_producer(&resync.renew, resync.stats).await?;
    } else if config.delivery == DeliveryMode::ExactlyOnce && cause.timed_out_request() {
        // Fail closed: a transactional request that timed out on the client may still
        // land later, in a later transaction of the same producer epoch (librdkafka has
        // no Transactions V2, KIP-890 part 2; its issue 5423). So the producer is never
        // used again, not even to abort: a new one's initialisation bumps the epoch,
        // which fences whatever the old one still has in flight, and completes or
        // aborts the transaction as the coordinator had it. Catching up then finds
        // where the batch ended, committed or not.
        if let Some(fatal) = consumer.fatal_error() {
            tracing::error!(error = %fatal, cause = %cause, "this instance was replaced; stopping");
            return Err(fatal);
        }
        tracing::warn!(error = %cause, "a transactional request timed out: replacing the producer rather than using it again");
        *producer = new_producer(&resync.renew, resync.stats).await?;
    } else if config.delivery == DeliveryMode::ExactlyOnce
        && let Err(error) = producer.abort().await
    {
        if matches!(error, Error::Fenced { .. }) {
            resync.take_fence(consumer, producer, &error).await?;
        } else {
            // A producer that can neither commit nor abort is replaced; initialising the
            // new one (same transactional ID) resolves whatever the old one left open.
            // Unless this instance was replaced: then the ID is its successor's, and
            // initialising it would fence the legitimate owner.
            if let Some(fatal) = consumer.fatal_error() {
                tracing::error!(error = %fatal, abort = %error, "this instance was replaced; stopping");
                return Err(fatal);
            }
            tracing::warn!(%error, "abort failed; recreating the producer");
            *producer = new_producer(&resync.renew, resync.stats).await?;
        }
    }
    if config.delivery == DeliveryMode::AtMostOnce {
        // The batch's offsets were committed before it was processed: at most once means
        // it is not processed again.
        return Ok(None);
    }
    let owned: Vec<i32> = owned.iter().copied().collect();
    resync.catch_up_now(consumer, &owned).await.map(Some)
}

/// A new producer, through `renew`, waited for while the cluster recovers (up to
/// [`RECOVERY_PATIENCE`]): every place recovery replaces the producer goes through here.
async fn new_producer<P, N: Renew<P>>(renew: &N, stats: &Stats) -> Result<P> {
    let producer =
        retry_transient_for("recreate the producer", RECOVERY_PATIENCE, || renew.renew()).await?;
    Stats::add(&stats.producers_replaced, 1);
    Ok(producer)
}

/// An instance's first producer, waited for as long as recovery waits for a new one. An
/// instance started in the middle of a fault (its transaction coordinator's node away
/// until another node takes its place) must not stop on a retriable `init_transactions`:
/// CI's fault matrix saw a restarted instance do that.
pub(crate) async fn first_producer<P, N: Renew<P>>(renew: &N) -> Result<P> {
    retry_transient_for("create the producer", RECOVERY_PATIENCE, || renew.renew()).await
}

impl<R, N> Resync<'_, R, N> {
    /// Keeps each partition where catching up found it must go on from (its floor): drops
    /// from `records` those below it (already committed), and when a partition's first
    /// record is past it, drops that partition's records and returns it with its floor
    /// to seek back to, once. The engine's position is the authority, not librdkafka's:
    /// the floor alone caught a start below the committed offset, not one above it, which
    /// librdkafka's pause/assign races can make (its issues 2190, 5591, 3567) and which
    /// would skip the records between for good. After the seek, a first record still
    /// past the floor is a real gap (transaction markers, compaction, retention); one
    /// lower than the first seen before it shows the position was wrong, which is logged
    /// as an error and counted (`onceflow_positions_corrected_total`). A floor is
    /// forgotten once a record of its partition is taken, so after the first poll that
    /// follows a catch-up this is one lock per poll and no look-up per record.
    pub(super) fn drop_committed(&self, records: &mut Vec<kafka::Record>) -> Placed {
        let mut floor = self.floor.lock().unwrap_or_else(|e| e.into_inner());
        let mut placed = Placed::default();
        if floor.is_empty() || records.is_empty() {
            return placed;
        }
        let before = records.len();
        records.retain(|r| floor.get(&r.partition).is_none_or(|f| r.offset >= f.at));
        placed.below = before - records.len();
        if placed.below > 0 {
            Stats::add(&self.stats.already_committed, placed.below as u64);
            tracing::warn!(
                dropped = placed.below,
                ?floor,
                "records below where catching up found their partitions came again (the \
                 consumer's position lagged the committed work); not processed again"
            );
        }
        let mut first: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        for record in records.iter() {
            first.entry(record.partition).or_insert(record.offset);
        }
        for (partition, offset) in first {
            let Some(at) = floor.get_mut(&partition) else {
                continue;
            };
            match at.seen_before_seek {
                None if offset > at.at => {
                    tracing::info!(
                        partition,
                        first = offset,
                        floor = at.at,
                        "the first record after catching up is past where the partition \
                         must go on from: seeking back there once, so nothing between is \
                         skipped (transaction markers leave such gaps too)"
                    );
                    at.seen_before_seek = Some(offset);
                    placed.seek.push((partition, at.seek_to));
                    continue;
                }
                Some(seen) if offset < seen => {
                    metrics::counter!("onceflow_positions_corrected_total").increment(1);
                    tracing::error!(
                        partition,
                        floor = at.at,
                        started_at = seen,
                        first = offset,
                        "the consumer started the partition past where it must go on from: \
                         records would have been skipped; the seek back found them"
                    );
                    placed.corrected += 1;
                }
                // Once per partition per catch-up: where the consumer started against where
                // the committed offsets and the changelog's progress said to go on from,
                // what would explain a record lost or doubled next time.
                _ => tracing::info!(
                    partition,
                    floor = at.at,
                    first = offset,
                    "the partition's first record after catching up"
                ),
            }
            floor.remove(&partition);
        }
        if !placed.seek.is_empty() {
            records.retain(|r| !placed.seek.iter().any(|(p, _)| *p == r.partition));
        }
        placed
    }

    /// Forgets the floors of `partitions`, revoked: whoever owns them next catches up
    /// and sets its own.
    pub(super) fn forget_floors(&self, partitions: &[i32]) {
        self.floor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|partition, _| !partitions.contains(partition));
    }

    /// The partitions with a floor still to pass (for tests).
    #[cfg(test)]
    pub(super) fn floors(&self) -> Vec<i32> {
        let floor = self.floor.lock().unwrap_or_else(|e| e.into_inner());
        floor.keys().copied().collect()
    }

    /// Takes a fence for the instance's own, if the budget of [`Fences`] allows; `Err`
    /// (the instance stops) when it is spent.
    pub(super) fn allow_fence(&self, fence: &Error) -> Result<usize> {
        let taken = self.fences.lock().unwrap_or_else(|e| e.into_inner()).take();
        taken.map_err(|count| match fence {
            Error::Fenced { what, detail } => Error::Fenced {
                what: what.clone(),
                detail: format!(
                    "{detail}; fenced {count} times within {FENCE_WINDOW:?} before this: is \
                     another instance running with this instance ID?"
                ),
            },
            other => Error::Fenced {
                what: "this instance".into(),
                detail: format!("{other}; fenced {count} times within {FENCE_WINDOW:?}"),
            },
        })
    }

    /// A fenced producer, while the consumer is held. librdkafka reports a fence when a
    /// successor initialised the transactional ID, but also when the transaction
    /// coordinator moved while the producer bumped its own epoch (the bump reached the
    /// old coordinator, its answer did not; the cluster test saw it when it killed the
    /// coordinator). Group membership tells them apart: a successor joins under the same
    /// instance ID, which fences this consumer within a heartbeat. So the consumer is kept
    /// in the group for [`FENCE_GRACE`]; fenced meanwhile, the consumer's error ends the
    /// batch and the engine's loop asks the group who holds the instance ID
    /// ([`Resync::after_member_fenced`]); otherwise a new producer takes over. Exactly once
    /// holds either way: the new producer's initialisation ends what the old one left
    /// open, and catching up follows.
    async fn take_fence<C, P>(&self, consumer: &C, producer: &mut P, fence: &Error) -> Result<()>
    where
        C: Source,
        P: Send,
        N: Renew<P>,
    {
        use std::sync::atomic::Ordering;
        self.producer_fenced.store(true, Ordering::Relaxed);
        tokio::time::sleep(FENCE_GRACE).await;
        if let Some(fatal) = consumer.fatal_error() {
            tracing::warn!(error = %fatal, producer = %fence, "the consumer was fenced too");
            return Err(fatal);
        }
        let taken = self.allow_fence(fence)?;
        tracing::warn!(
            error = %fence,
            fences = taken,
            "the producer was fenced, but no successor joined the group under this instance \
             ID: taking the fence for the instance's own (a coordinator moved) and making a \
             new producer"
        );
        *producer = new_producer(&self.renew, self.stats).await?;
        self.producer_fenced.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// What to do when the consumer's static membership was fenced (librdkafka's fatal
    /// `FENCED_INSTANCE_ID`) in exactly-once mode: `Ok` to join the group again, `Err`
    /// to stop.
    ///
    /// The producer fenced as well used to mean "replaced" at once. The fault matrix
    /// showed otherwise (CI, 2026-12-02): after the coordinators were restarted, an
    /// instance found both fenced with no successor anywhere, and stopped for nothing.
    /// The consumer can be fenced by its own join whose answer was lost, the producer by
    /// the transaction coordinator. Neither the member's ID nor its client ID (the
    /// coordinator keeps a replaced static member's client ID) tells a successor from
    /// that; liveness does: only a live consumer heartbeats for the member under the
    /// instance ID (this one's is fenced), so a member that outlives the session timeout
    /// is a successor's ([`Resync::successor_alive`]). Replaced, the instance stops and
    /// makes no new producer (that would fence the successor's). Not replaced, it makes
    /// a new producer (whose initialisation ends whatever the old one left open) and
    /// joins again. With only the consumer fenced it makes a new producer (which ends a
    /// transaction a hold given up may have left open) and joins again at once.
    /// Each rejoin spends one of the budget of fences.
    ///
    /// Joining again is safe in exactly-once mode either way: the group's generation
    /// check refuses a zombie's offsets (KIP-447), so nothing it commits becomes visible.
    pub(super) async fn after_member_fenced<C, P>(
        &self,
        consumer: &C,
        producer: &mut P,
        changelog: &str,
        error: Error,
    ) -> Result<()>
    where
        C: Source,
        P: Sink<C>,
        N: Renew<P>,
    {
        let fenced_too = self.producer_fenced()
            || match producer.probe_fenced(changelog).await {
                Ok(fenced) => fenced,
                Err(unknown) => {
                    tracing::warn!(error = %unknown, "could not learn whether the producer is fenced too");
                    false
                }
            };
        if !fenced_too {
            let fences = self.allow_fence(&error)?;
            tracing::warn!(%error, fences, "the consumer's static membership was fenced, the producer was not: making a new producer and joining the group again");
            // The fence may have ended a hold half-way through undoing a failed batch,
            // its transaction still open: the producer would refuse to begin the next
            // one, and the open transaction would hold the changelog's last stable
            // offset until it timed out (found by the simulation of issue 40). A new
            // producer's initialisation aborts it; the ID is still this instance's.
            *producer = new_producer(&self.renew, self.stats).await?;
            return Ok(());
        }
        match self.successor_alive(consumer).await {
            Ok(true) => {
                tracing::error!(%error, "this instance was replaced: its producer is fenced too, and a member under its instance ID outlived the session; stopping");
                Err(error)
            }
            Ok(false) => {
                let fences = self.allow_fence(&error)?;
                tracing::warn!(
                    %error,
                    fences,
                    "the consumer and the producer were fenced, but no member under the \
                     instance ID outlived the session: no successor; making a new producer \
                     and joining the group again"
                );
                *producer = new_producer(&self.renew, self.stats).await?;
                self.producer_fenced
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(unknown) => {
                tracing::error!(%error, group = %unknown, "this instance was likely replaced: its producer is fenced too, and the group could not be described; stopping");
                Err(error)
            }
        }
    }

    /// Whether a member under the instance ID stays in the group past the consumer's
    /// session timeout (and a margin), the group stable: then someone heartbeats for it,
    /// a successor. Gone before, it was left over from this instance. A rebalance under
    /// way keeps members that stopped heartbeating until it ends, so an unstable group
    /// is waited for, up to [`SUCCESSOR_WAIT`].
    async fn successor_alive<C: Source>(&self, consumer: &C) -> Result<bool> {
        let started = tokio::time::Instant::now();
        let session = consumer.session_timeout() + SESSION_MARGIN;
        let mut seen = None;
        loop {
            let holder = retry_transient("describe the group", || consumer.holder()).await?;
            let Some(member) = holder.member else {
                return Ok(false);
            };
            let waited = started.elapsed();
            if (waited >= session && holder.stable) || waited >= SUCCESSOR_WAIT {
                tracing::info!(%member, ?waited, stable = holder.stable, "a member under the instance ID outlived the session");
                return Ok(true);
            }
            if seen.as_ref() != Some(&member) {
                tracing::info!(%member, ?session, "a member is under the instance ID: waiting whether it outlives the session");
                seen = Some(member);
            }
            tokio::time::sleep(DESCRIBE_EVERY).await;
        }
    }

    /// Whether the producer was fenced and not replaced since: with the consumer fenced
    /// too, a successor has the instance ID (see [`Self::take_fence`]).
    pub(super) fn producer_fenced(&self) -> bool {
        self.producer_fenced
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<R: Restore, N> Resync<'_, R, N> {
    /// Brings the transaction log of `partitions` up to what the group committed: reads
    /// the group's stable committed offsets (a transaction that is still committing its
    /// offsets is waited for), then replays each partition's changelog until its progress
    /// records reach them. Returns the committed offsets.
    pub(super) async fn catch_up<C: Source>(
        &self,
        consumer: &C,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>> {
        self.holding(
            consumer,
            HOLD_AFTER_ASSIGNMENT,
            self.catch_up_now(consumer, partitions),
        )
        .await
    }

    /// Waits `delay` (back-off after a failed batch) with the consumer held.
    pub(super) async fn pause_for<C: Source>(&self, consumer: &C, delay: Duration) -> Result<()> {
        self.holding(consumer, Duration::ZERO, async {
            tokio::time::sleep(delay).await;
            Ok(())
        })
        .await
    }

    /// Takes what the polls of a held consumer brought, poll by poll, in order.
    pub(super) fn take_held(&self) -> Vec<kafka::Polled> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The partitions the rebalances a held consumer served (and the engine has not
    /// taken yet) revoked or assigned.
    pub(super) fn rebalanced_partitions(&self) -> BTreeSet<i32> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter()
            .flat_map(|polled| &polled.rebalances)
            .flat_map(|event| match event {
                kafka::Rebalanced::Revoked(partitions)
                | kafka::Rebalanced::Assigned(partitions) => partitions.iter().copied(),
            })
            .collect()
    }

    /// Whether a held consumer served a rebalance that the engine has not taken yet.
    pub(super) fn rebalanced_meanwhile(&self) -> bool {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|polled| !polled.rebalances.is_empty())
    }

    /// Runs `work` with the consumer held (see the module's invariants) once it has run
    /// for `after` (at once when zero; [`HOLD_AFTER_ASSIGNMENT`] for newly assigned
    /// partitions): the member stays in the group however long `work` takes. Work over
    /// within `after` is never held. No transaction may be open.
    async fn holding<C: Source, T>(
        &self,
        consumer: &C,
        after: Duration,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut work = std::pin::pin!(work);
        if !after.is_zero() {
            tokio::select! {
                outcome = &mut work => return outcome,
                () = tokio::time::sleep(after) => {}
            }
        }
        consumer.hold().await?;
        let outcome = {
            let mut ticks = tokio::time::interval(KEEP_ALIVE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    outcome = &mut work => break outcome,
                    _ = ticks.tick() => match consumer.keep_alive().await {
                        Ok(polled) => {
                            if !polled.records.is_empty() || !polled.rebalances.is_empty() {
                                self.held
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push(polled);
                            }
                        }
                        // Fenced or fatal: the instance stops; the work's result no
                        // longer matters.
                        Err(error) => break Err(error),
                    },
                }
            }
        };
        let released = consumer.release().await;
        let value = outcome?;
        released?;
        Ok(value)
    }

    async fn catch_up_now<C: Source>(
        &self,
        consumer: &C,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>> {
        // Patient: the group coordinator may be moving (NotCoordinator) after a fault.
        let committed =
            retry_transient_for("read the committed offsets", RECOVERY_PATIENCE, || {
                consumer.committed(partitions.to_vec())
            })
            .await?;
        // At most once commits before it processes: the changelog lags the committed
        // offsets by design, so there is nothing to wait for.
        let must_reach = self.config.delivery != DeliveryMode::AtMostOnce;
        self.stats.set_phase(Phase::Replaying);
        // Each replay is mostly waiting on the broker (its readers' connections, offsets
        // and fetches: 134-776 ms for an empty partition), so up to `replay_concurrency`
        // partitions are replayed side by side. After a failed replay no more are
        // started, and those under way are waited for, so none is left writing to the
        // log behind the caller.
        // Dropped before they end (the hold gave up: the consumer was fenced, or the
        // instance stops), the replays are cancelled: a read on the blocking pool must
        // not go on applying older records after the engine moved on (hole B).
        let cancel = Cancel::default();
        let cancel_on_drop = cancel.on_drop();
        let at_once = self.config.replay_concurrency.max(1);
        let mut queued = committed.iter().copied();
        let mut running = FuturesUnordered::new();
        let mut failed = None;
        loop {
            while failed.is_none() && running.len() < at_once {
                let Some((partition, offset)) = queued.next() else {
                    break;
                };
                let cancel = &cancel;
                running.push(retry_transient("replay the changelog", move || {
                    self.restore
                        .restore(partition, offset.filter(|_| must_reach), cancel)
                }));
            }
            match running.next().await {
                Some(Ok(())) => {}
                Some(Err(error)) => {
                    failed.get_or_insert(error);
                }
                None => break,
            }
        }
        drop(running);
        cancel_on_drop.disarm();
        if let Some(error) = failed {
            return Err(error);
        }
        let committed = self.read_again_where_unsure(consumer, committed).await?;
        let mut positions = Vec::with_capacity(committed.len());
        for (partition, offset) in committed {
            positions.push((partition, self.go_on_from(partition, offset)?));
        }
        Ok(positions)
    }

    /// `committed`, read again for the partitions read with no committed offset whose
    /// replayed changelog shows a commit (exactly once only). The changelog's progress
    /// commits in the same transaction as the group's offsets, so the first read came
    /// before that commit's markers landed (a commit in doubt, hole M of issue 40): the
    /// replay waited for them, so a read now sees the offsets. Taken for a new group, the
    /// partition would start at its beginning, and the batch's records that no dedup
    /// entry stops (refused ones, records without an ID) would be done again.
    async fn read_again_where_unsure<C: Source>(
        &self,
        consumer: &C,
        mut committed: Vec<(i32, Option<i64>)>,
    ) -> Result<Vec<(i32, Option<i64>)>> {
        if self.config.delivery != DeliveryMode::ExactlyOnce {
            return Ok(committed);
        }
        let mut unsure = Vec::new();
        for (partition, offset) in &committed {
            if offset.is_none() && self.restore.progress(*partition)?.is_some() {
                unsure.push(*partition);
            }
        }
        if unsure.is_empty() {
            return Ok(committed);
        }
        let again = retry_transient_for("read the committed offsets", RECOVERY_PATIENCE, || {
            consumer.committed(unsure.clone())
        })
        .await?;
        for (partition, offset) in again {
            tracing::info!(
                partition,
                committed = ?offset,
                "no committed offset was read before the replay, but the changelog shows a \
                 commit: read again"
            );
            if let Some(entry) = committed.iter_mut().find(|(p, _)| *p == partition) {
                entry.1 = offset;
            }
        }
        Ok(committed)
    }

    /// Where `partition` goes on from, the group's committed offset read as `committed`:
    /// there, unless the changelog just replayed shows a batch committed past it. The
    /// changelog's progress commits in the same transaction as the offsets, so it is
    /// never ahead of what committed; the offsets read may lag a commit whose outcome was
    /// in doubt (seen after a killed coordinator). They are read before the replay, so a
    /// replay that outlasts the session (the instance cut off the network while catching
    /// up, seen in the cut soak test) also sees the commits of the partition's new owner:
    /// the instance is a zombie for it then (the group's generation check refuses its
    /// offsets, KIP-447), and the revocation its next poll serves forgets the floor. With
    /// no committed offset at all, the group starts afresh (a new group, or an input made
    /// again) and nothing is skipped.
    /// Going past the committed offset is exactly once's only: at least once lands the
    /// changelog before it commits the offsets, so its changelog may rightly be ahead, and
    /// the batch is processed again (that is its guarantee); at most once commits the
    /// offsets first. The floor is set in every mode.
    fn go_on_from(&self, partition: i32, committed: Option<i64>) -> Result<Option<i64>> {
        let Some(committed) = committed else {
            // Nothing committed: the partition starts at its beginning (the consumer's
            // `auto.offset.reset` is `earliest`), and a first record past offset 0 is
            // sought back to the beginning once, as any start past its floor.
            if self.config.delivery == DeliveryMode::ExactlyOnce
                && let Some(progress) = self.restore.progress(partition)?
            {
                // Read twice (see `read_again_where_unsure`): the group's offsets were
                // removed (they expired, or the input was deleted and made again), and
                // its state is kept.
                tracing::warn!(
                    partition,
                    progress,
                    "the group has no committed offset, but the changelog shows work \
                     committed up to here: the group's offsets were removed (expired or \
                     deleted, or the input topic was made again); starting the partition \
                     at its beginning with the state kept (records with an ID already \
                     done are dropped as copies)"
                );
            }
            let floor = Floor {
                at: 0,
                seek_to: None,
                seen_before_seek: None,
            };
            self.floor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(partition, floor);
            return Ok(None);
        };
        let progress = if self.config.delivery == DeliveryMode::ExactlyOnce {
            self.restore.progress(partition)?
        } else {
            None
        };
        let at = match progress {
            Some(progress) if progress > committed => {
                tracing::warn!(
                    partition,
                    committed,
                    progress,
                    "the changelog shows work committed past the group's committed offset \
                     read before the replay (a commit whose outcome was in doubt, or the \
                     commits of a new owner while the replay ran); going on after it"
                );
                progress
            }
            _ => committed,
        };
        self.floor.lock().unwrap_or_else(|e| e.into_inner()).insert(
            partition,
            Floor {
                at,
                seek_to: Some(at),
                seen_before_seek: None,
            },
        );
        Ok(Some(at))
    }
}
