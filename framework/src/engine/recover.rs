//! What the engine does when a batch fails: abort, re-synchronise with what the broker
//! says happened, back off, and find the record that fails every batch it is in.
//!
//! Invariants:
//! - Nothing is assumed about a failed batch's outcome: every owned partition is caught
//!   up with the group's stable committed offsets (replaying the changelog to them) and
//!   moved to them, whether the batch aborted or its commit went through after all.
//! - A producer is re-created under the instance's transactional ID only while the
//!   instance still owns it (its consumer was not fenced by a successor).
//! - Records go one per transaction only after a refusal, and only until the refused
//!   record is found; it is handled per `on_error`, never retried for ever.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::config::{DeliveryMode, EngineConfig};
use crate::engine::stats::{Phase, Stats};
use crate::engine::{
    REPLAY_WAIT_GRACE, batch, changelog, dead_letters, new_producer, retry_transient,
};
use crate::kafka::{self, ClientOptions, InputConsumer, OutputProducer};
use crate::processor::Processor;
use crate::txlog::TxLog;
use crate::{Error, Result};

/// Failed batches in a row after which the engine looks for the record that fails them.
pub(super) const ISOLATE_AFTER: u32 = 2;

/// The pause after the `failures`-th failed batch in a row: 100 ms, doubling, at most 5 s.
pub(super) fn abort_backoff(failures: u32) -> std::time::Duration {
    let doublings = failures.saturating_sub(1).min(6);
    std::time::Duration::from_millis(100 * (1 << doublings)).min(std::time::Duration::from_secs(5))
}

/// What a batch needs besides the producer, which recovery may replace between two.
pub(super) struct Parts<'a> {
    pub(super) config: &'a EngineConfig,
    pub(super) consumer: &'a InputConsumer,
    pub(super) txlog: &'a Arc<TxLog>,
    pub(super) stats: &'a Arc<Stats>,
    pub(super) declared: &'a BTreeSet<String>,
    pub(super) changelog: &'a str,
    pub(super) output_limits: &'a std::collections::BTreeMap<String, usize>,
}

impl<'a> Parts<'a> {
    pub(super) fn batch(
        &self,
        producer: &'a OutputProducer,
    ) -> batch::Batch<'a, InputConsumer, OutputProducer> {
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
pub(super) async fn isolate<P: Processor>(
    parts: &Parts<'_>,
    resync: &Resync<'_>,
    processor: &mut P,
    producer: &mut OutputProducer,
    owned: &BTreeSet<i32>,
    records: Vec<kafka::Record>,
) -> Option<Failed> {
    for record in records {
        let alone = parts
            .batch(producer)
            .run(processor, vec![record.clone()])
            .await;
        let Err(error) = alone else { continue };
        let class = match &error {
            e if e.is_rejection() => dead_letters::FailureClass::Rejected,
            Error::TransactionTimedOut { .. } => dead_letters::FailureClass::TransactionTimeout,
            _ => return Some(Failed::Batch(error)),
        };
        Stats::add(&parts.stats.aborts, 1);
        if let Err(stop) = recover(resync, parts.consumer, producer, owned, &error).await {
            return Some(Failed::Stop(stop));
        }
        tracing::warn!(
            %error,
            %class,
            partition = record.partition,
            offset = record.offset,
            "found the record that fails its batches"
        );
        if let Err(stop) = parts
            .batch(producer)
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

/// Errors after which the instance must not go on: fencing and configuration problems,
/// and a record failure under `on_error = stop` (it would fail the same way on the same
/// record forever).
pub(super) fn stops_the_instance(error: &Error) -> bool {
    error.is_fatal()
        || matches!(
            error,
            Error::Processing { .. }
                | Error::Decode { .. }
                | Error::Encode { .. }
                | Error::Corrupt { .. }
        )
}

/// What re-synchronising after a failed batch needs besides the clients.
pub(super) struct Resync<'a> {
    pub(super) options: &'a ClientOptions,
    pub(super) config: &'a EngineConfig,
    pub(super) changelog: &'a str,
    pub(super) txlog: &'a Arc<TxLog>,
    pub(super) stats: &'a Arc<Stats>,
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
pub(super) async fn recover(
    resync: &Resync<'_>,
    consumer: &InputConsumer,
    producer: &mut OutputProducer,
    owned: &BTreeSet<i32>,
    cause: &Error,
) -> Result<()> {
    let Resync {
        options, config, ..
    } = resync;
    if matches!(cause, Error::Fenced { .. }) {
        return Ok(());
    }
    if let Error::TransactionTimedOut { .. } = cause {
        // The coordinator aborted the transaction and bumped the producer's epoch: this
        // producer is unusable, but no other instance has the transactional ID.
        if let Some(fatal) = consumer.fatal_error() {
            return Err(fatal);
        }
        tracing::warn!(error = %cause, "recreating the producer after a transaction timeout");
        *producer =
            retry_transient("recreate the producer", || new_producer(options, config)).await?;
    } else if config.delivery == DeliveryMode::ExactlyOnce
        && let Err(error) = producer.abort().await
    {
        if matches!(error, Error::Fenced { .. }) {
            return Err(error);
        }
        // A producer that can neither commit nor abort is replaced; initialising the new
        // one (same transactional ID) resolves whatever the old one left open. Unless
        // this instance was replaced: then the ID is its successor's, and initialising
        // it would fence the legitimate owner.
        if let Some(fatal) = consumer.fatal_error() {
            tracing::error!(error = %fatal, abort = %error, "this instance was replaced; stopping");
            return Err(fatal);
        }
        tracing::warn!(%error, "abort failed; recreating the producer");
        *producer =
            retry_transient("recreate the producer", || new_producer(options, config)).await?;
    }
    if config.delivery == DeliveryMode::AtMostOnce {
        // The batch's offsets were committed before it was processed: at most once means
        // it is not processed again.
        return Ok(());
    }
    let owned: Vec<i32> = owned.iter().copied().collect();
    let committed = resync.catch_up(consumer, &owned).await?;
    retry_transient("seek to the committed offsets", || {
        consumer.seek(committed.clone())
    })
    .await
}

impl Resync<'_> {
    /// Brings the transaction log of `partitions` up to what the group committed: reads
    /// the group's stable committed offsets (a transaction that is still committing its
    /// offsets is waited for), then replays each partition's changelog until its progress
    /// records reach them. Returns the committed offsets.
    pub(super) async fn catch_up(
        &self,
        consumer: &InputConsumer,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>> {
        let committed = retry_transient("read the committed offsets", || {
            consumer.committed(partitions.to_vec())
        })
        .await?;
        // At most once commits before it processes: the changelog lags the committed
        // offsets by design, so there is nothing to wait for.
        let must_reach = self.config.delivery != DeliveryMode::AtMostOnce;
        for (partition, offset) in &committed {
            self.stats.set_phase(Phase::Replaying);
            retry_transient("replay the changelog", || {
                changelog::replay(
                    self.options,
                    self.changelog,
                    *partition,
                    offset.filter(|_| must_reach),
                    self.config.transaction_timeout + REPLAY_WAIT_GRACE,
                    self.txlog,
                    self.stats,
                )
            })
            .await?;
        }
        Ok(committed)
    }
}
