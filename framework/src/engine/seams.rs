//! What a batch needs from Kafka, as two small traits: the input it commits offsets of
//! ([`Source`]) and the producer it writes and commits through ([`Sink`]).
//!
//! The engine's clients implement them here, by delegating to `kafka/`; the unit tests
//! implement them with an in-process fake (`fake.rs`) that records every call and fails
//! the one a test names, so each decision of a batch (call order per delivery mode, aborts,
//! splits, dead letters) is tested in milliseconds without a broker.

use std::future::Future;

use crate::Result;
use crate::kafka::{InputConsumer, OutputProducer, Pending};

/// A record to send: topic, explicit partition or none (the key decides), key, value,
/// headers (a header may have no value).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'r> {
    pub(crate) topic: &'r str,
    pub(crate) partition: Option<i32>,
    pub(crate) key: Option<&'r [u8]>,
    pub(crate) value: Option<&'r [u8]>,
    pub(crate) headers: &'r [(&'r str, Option<&'r [u8]>)],
}

/// A sent record whose acknowledgement may still be coming.
pub(crate) trait Landing: Send + Sync + 'static {
    /// Waits for the acknowledgement: where the record landed, `(partition, offset)`.
    fn landed(self) -> impl Future<Output = Result<(i32, i64)>> + Send;
}

/// The input, as far as a batch is concerned.
pub(crate) trait Source: Sync {
    /// Commits `offsets` (partition, next offset) outside any transaction.
    fn commit(&self, offsets: Vec<(i32, i64)>) -> impl Future<Output = Result<()>> + Send;
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
}

impl Landing for Pending {
    fn landed(self) -> impl Future<Output = Result<(i32, i64)>> + Send {
        Pending::landed(self)
    }
}

impl Source for InputConsumer {
    fn commit(&self, offsets: Vec<(i32, i64)>) -> impl Future<Output = Result<()>> + Send {
        InputConsumer::commit(self, offsets)
    }
}

impl Sink<InputConsumer> for OutputProducer {
    type Pending = Pending;

    fn begin(&self) -> Result<()> {
        OutputProducer::begin(self)
    }

    fn send(&self, record: Outgoing<'_>) -> impl Future<Output = Result<Pending>> + Send {
        self.send_with_headers(
            record.topic,
            record.partition,
            record.key,
            record.value,
            record.headers,
        )
    }

    fn send_offsets(
        &self,
        source: &InputConsumer,
        topic: &str,
        offsets: Vec<(i32, i64)>,
    ) -> impl Future<Output = Result<()>> + Send {
        OutputProducer::send_offsets(self, source, topic, offsets)
    }

    fn commit(&self) -> impl Future<Output = Result<()>> + Send {
        OutputProducer::commit(self)
    }

    fn abort(&self) -> impl Future<Output = Result<()>> + Send {
        OutputProducer::abort(self)
    }

    fn flush(&self) -> impl Future<Output = Result<()>> + Send {
        OutputProducer::flush(self)
    }
}
