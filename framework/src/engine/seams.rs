//! What a batch and its recovery need from Kafka, as small traits: the input ([`Source`]:
//! its offsets, its group, its polls while held), the producer it writes and commits
//! through ([`Sink`]), a new producer after one broke ([`Renew`]), and the changelog replay
//! that brings a partition's transaction log up to the group's committed offset
//! ([`Restore`]).
//!
//! The engine's clients implement them here, by delegating to `kafka/`; the unit tests
//! implement them with an in-process Kafka (`testing/kafka.rs`) that records every call and
//! fails the one a test names, so each decision of a batch (call order per delivery mode,
//! aborts, splits, dead letters) and of recovery (abort, new producer, catch-up, rewind,
//! rebalances while held) is tested in milliseconds without a broker.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{DeliveryMode, EngineConfig};
use crate::kafka::{ClientOptions, Holder, InputConsumer, Linger, Pending, Polled, Producer};
use crate::{Error, Result};

/// A record to send: topic, explicit partition or none (the key decides), key, value,
/// headers (a header may have no value).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'r> {
    pub(crate) topic: &'r str,
    pub(crate) partition: Option<i32>,
    pub(crate) key: Option<&'r [u8]>,
    pub(crate) value: Option<&'r [u8]>,
    pub(crate) headers: &'r [(&'r str, Option<&'r [u8]>)],
    /// The record's own timestamp (ms since the epoch); `None`: the producer's clock.
    pub(crate) timestamp_ms: Option<i64>,
}

/// A sent record whose acknowledgement may still be coming.
pub(crate) trait Landing: Send + Sync + 'static {
    /// Waits for the acknowledgement: where the record landed, `(partition, offset)`.
    fn landed(self) -> impl Future<Output = Result<(i32, i64)>> + Send;
}

/// The input: what a batch commits outside a transaction, and what recovery reads and
/// moves.
pub(crate) trait Source: Sync {
    /// Polls for at most `max_records` records, gathering for `max_wait` (then taking
    /// what has already arrived, without waiting): the records, and the rebalances served
    /// meanwhile.
    fn poll(
        &self,
        max_records: usize,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Polled>> + Send;
    /// Commits `offsets` (partition, next offset) outside any transaction.
    fn commit(&self, offsets: Vec<(i32, i64)>) -> impl Future<Output = Result<()>> + Send;
    /// The group's stable committed offset of each partition (`None`: nothing committed).
    fn committed(
        &self,
        partitions: Vec<i32>,
    ) -> impl Future<Output = Result<Vec<(i32, Option<i64>)>>> + Send;
    /// Moves each partition's position (`None`: the beginning).
    fn seek(&self, positions: Vec<(i32, Option<i64>)>) -> impl Future<Output = Result<()>> + Send;
    /// The partitions assigned now.
    fn assigned(&self) -> impl Future<Output = Result<Vec<i32>>> + Send;
    /// The fatal error the consumer raised, if any (a successor with the same instance ID
    /// fenced it).
    fn fatal_error(&self) -> Option<Error>;
    /// Pauses every assigned partition until [`Source::release`].
    fn hold(&self) -> impl Future<Output = Result<()>> + Send;
    /// Polls a held consumer: the rebalances served, any record returned.
    fn keep_alive(&self) -> impl Future<Output = Result<Polled>> + Send;
    /// Resumes every assigned partition.
    fn release(&self) -> impl Future<Output = Result<()>> + Send;
    /// Who the group has under this consumer's instance ID (asked after the consumer was
    /// fenced); `Err`: the group could not be described.
    fn holder(&self) -> impl Future<Output = Result<Holder>> + Send;
    /// How long the group keeps a member that stopped heartbeating.
    fn session_timeout(&self) -> Duration;
}

/// A producer made again under the instance's transactional ID: initialising it aborts
/// (or completes) whatever its predecessor left open.
pub(crate) trait Renew<P>: Sync {
    /// The new producer.
    fn renew(&self) -> impl Future<Output = Result<P>> + Send;
}

/// Tells replays that run apart from their caller (on the blocking pool) that nobody
/// waits for them any more: from [`Cancel::cancel`]'s return on, none applies anything
/// to the transaction log. A replay's future dropped while a `spawn_blocking` read goes
/// on used to leave it applying older changelog records over what the engine committed
/// next, and moving the checkpoint back (hole B of issue 40).
#[derive(Debug, Clone, Default)]
pub(crate) struct Cancel(Arc<std::sync::RwLock<bool>>);

impl Cancel {
    /// Cancels: waits for an apply under way to end, then lets none start.
    pub(crate) fn cancel(&self) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// Whether it was cancelled.
    pub(crate) fn is_cancelled(&self) -> bool {
        *self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `apply` unless cancelled (then [`Error::Cancelled`] naming `what`); a cancel
    /// meanwhile waits for it to end.
    pub(crate) fn unless_cancelled<T>(
        &self,
        what: &str,
        apply: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let cancelled = self.0.read().unwrap_or_else(|e| e.into_inner());
        if *cancelled {
            return Err(Error::Cancelled {
                what: what.to_owned(),
            });
        }
        apply()
    }

    /// A guard that cancels when dropped, unless [`CancelOnDrop::disarm`]ed first.
    pub(crate) fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(Some(self.clone()))
    }
}

/// See [`Cancel::on_drop`].
#[derive(Debug)]
pub(crate) struct CancelOnDrop(Option<Cancel>);

impl CancelOnDrop {
    /// The work finished: nothing to cancel.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            cancel.cancel();
        }
    }
}

/// Brings a partition's transaction log up to the group's committed offset (`None`:
/// read to the end a reader sees) by replaying its changelog.
pub(crate) trait Restore: Sync {
    /// Replays `partition`'s changelog until its progress reaches `committed`; applies
    /// nothing once `cancel` is cancelled.
    fn restore(
        &self,
        partition: i32,
        committed: Option<i64>,
        cancel: &Cancel,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Where the transaction log's progress of `partition` is: the input offset after the
    /// last batch it holds (none: it holds none).
    fn progress(&self, partition: i32) -> Result<Option<i64>>;
}

/// The producer of outputs, changelog records and dead letters, and, in exactly-once
/// mode, the transaction they and the input offsets commit in.
pub(crate) trait Sink<S: Source>: Sync {
    /// A sent record.
    type Pending: Landing;
    /// Starts a transaction.
    fn begin(&self) -> Result<()>;
    /// Queues a record.
    fn send(&self, record: Outgoing<'_>) -> impl Future<Output = Result<Self::Pending>> + Send;
    /// Adds the input offsets to the open transaction, with `source`'s group metadata.
    fn send_offsets(
        &self,
        source: &S,
        topic: &str,
        offsets: Vec<(i32, i64)>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Commits the open transaction.
    fn commit(&self) -> impl Future<Output = Result<()>> + Send;
    /// Aborts the open transaction.
    fn abort(&self) -> impl Future<Output = Result<()>> + Send;
    /// Waits until every queued record is acknowledged.
    fn flush(&self) -> impl Future<Output = Result<()>> + Send;
    /// Whether a successor fenced this producer, asked with a transaction of no
    /// consequence to `topic` (see [`Producer::probe_fenced`]); `Err`: unknown.
    fn probe_fenced(&self, topic: &str) -> impl Future<Output = Result<bool>> + Send;
}

impl Landing for Pending {
    fn landed(self) -> impl Future<Output = Result<(i32, i64)>> + Send {
        Pending::landed(self)
    }
}

impl Source for InputConsumer {
    fn poll(
        &self,
        max_records: usize,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Polled>> + Send {
        InputConsumer::poll(self, max_records, max_wait)
    }

    fn commit(&self, offsets: Vec<(i32, i64)>) -> impl Future<Output = Result<()>> + Send {
        InputConsumer::commit(self, offsets)
    }

    fn committed(
        &self,
        partitions: Vec<i32>,
    ) -> impl Future<Output = Result<Vec<(i32, Option<i64>)>>> + Send {
        InputConsumer::committed(self, partitions)
    }

    fn seek(&self, positions: Vec<(i32, Option<i64>)>) -> impl Future<Output = Result<()>> + Send {
        InputConsumer::seek(self, positions)
    }

    fn assigned(&self) -> impl Future<Output = Result<Vec<i32>>> + Send {
        InputConsumer::assigned(self)
    }

    fn fatal_error(&self) -> Option<Error> {
        InputConsumer::fatal_error(self)
    }

    fn hold(&self) -> impl Future<Output = Result<()>> + Send {
        InputConsumer::hold(self)
    }

    fn keep_alive(&self) -> impl Future<Output = Result<Polled>> + Send {
        InputConsumer::keep_alive(self)
    }

    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        InputConsumer::release(self)
    }

    fn holder(&self) -> impl Future<Output = Result<Holder>> + Send {
        InputConsumer::holder(self)
    }

    fn session_timeout(&self) -> Duration {
        InputConsumer::session_timeout(self)
    }
}

/// Makes the engine's producer again.
pub(crate) struct NewProducer<'a> {
    pub(crate) options: &'a ClientOptions,
    pub(crate) config: &'a EngineConfig,
}

impl Renew<Producer> for NewProducer<'_> {
    fn renew(&self) -> impl Future<Output = Result<Producer>> + Send {
        new_producer(self.options, self.config)
    }
}

impl Sink<InputConsumer> for Producer {
    type Pending = Pending;

    fn begin(&self) -> Result<()> {
        Producer::begin(self)
    }

    fn send(&self, record: Outgoing<'_>) -> impl Future<Output = Result<Pending>> + Send {
        self.send_with_headers(
            record.topic,
            record.partition,
            record.key,
            record.value,
            record.headers,
            record.timestamp_ms,
        )
    }

    fn send_offsets(
        &self,
        source: &InputConsumer,
        topic: &str,
        offsets: Vec<(i32, i64)>,
    ) -> impl Future<Output = Result<()>> + Send {
        Producer::send_offsets(self, source, topic, offsets)
    }

    fn commit(&self) -> impl Future<Output = Result<()>> + Send {
        Producer::commit(self)
    }

    fn abort(&self) -> impl Future<Output = Result<()>> + Send {
        Producer::abort(self)
    }

    fn flush(&self) -> impl Future<Output = Result<()>> + Send {
        Producer::flush(self)
    }

    fn probe_fenced(&self, topic: &str) -> impl Future<Output = Result<bool>> + Send {
        Producer::probe_fenced(self, topic)
    }
}

/// The producer the delivery mode needs: transactional under the instance's
/// transactional ID for exactly once, idempotent otherwise.
pub(crate) async fn new_producer(
    options: &ClientOptions,
    config: &EngineConfig,
) -> Result<Producer> {
    match config.delivery {
        DeliveryMode::ExactlyOnce => {
            Producer::transactional(
                options,
                &config.transactional_id(),
                config.transaction_timeout,
                Linger::Batches,
            )
            .await
        }
        DeliveryMode::AtLeastOnce | DeliveryMode::AtMostOnce => {
            Producer::idempotent(options, Linger::Batches)
        }
    }
}
