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
//!   within a heartbeat), and [`state::Fences`] bounds how often an instance may take a fence
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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::KafkaCode;
use crate::config::{DeliveryMode, EngineConfig};
use crate::engine::backoff::{RECOVERY_PATIENCE, retry_transient, retry_transient_for};
use crate::engine::batch;
use crate::engine::seams::{Renew, Restore, Sink, Source};
use crate::engine::stats::Stats;
use crate::txlog::TxLog;
use crate::{Error, Result};
pub(crate) use state::State;

mod catch_up;
mod fences;
mod floor;
mod hold;
pub(in crate::engine) mod isolate;
pub(in crate::engine) mod state;

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
    pub(super) output_limits: &'a BTreeMap<String, usize>,
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

/// What re-synchronising with the group needs besides the clients: the changelog replay,
/// a way to make the producer again, and what recovery remembers between batches.
pub(crate) struct Resync<'a, R, N> {
    pub(super) config: &'a EngineConfig,
    pub(super) stats: &'a Arc<Stats>,
    pub(super) restore: R,
    pub(super) renew: N,
    pub(super) state: State,
}

impl<'a, R, N> Resync<'a, R, N> {
    /// Recovery's surroundings with nothing held, fenced or caught up yet.
    pub(crate) fn new(
        config: &'a EngineConfig,
        stats: &'a Arc<Stats>,
        restore: R,
        renew: N,
    ) -> Self {
        Self::with_state(config, stats, restore, renew, State::default())
    }

    /// Recovery's surroundings with what an earlier run of the same process remembered.
    pub(crate) fn with_state(
        config: &'a EngineConfig,
        stats: &'a Arc<Stats>,
        restore: R,
        renew: N,
        state: State,
    ) -> Self {
        Resync {
            config,
            stats,
            restore,
            renew,
            state,
        }
    }

    /// What recovery remembered, for the next run of the same process.
    #[cfg(feature = "testing")]
    pub(crate) fn into_state(self) -> State {
        self.state
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
