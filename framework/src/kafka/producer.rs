//! onceflow's one Kafka producer: transactional (init, begin, send, send offsets, commit,
//! abort, and a new one after a fence or a timed-out request) or idempotent. The engine
//! writes its outputs and changelog with it, the effects executor its pending markers,
//! half messages their halves and publications, and the outbox relay its rows: each life
//! cycle is this one, so a rule about transactional calls (a call that timed out is never
//! made again on the same producer) holds for all of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub(crate) use super::deliveries::Pending;
use super::deliveries::{Deliveries, Ledgered};
use super::{ClientOptions, GroupMetadata, InputConsumer, kafka_error};
use crate::blocking::blocking;
use crate::wire::FENCE_PROBE_KEY;
use crate::{Error, Result};

/// How long past its own timeout a transactional call may block before the producer is
/// given up (a commit may retry for the whole transaction timeout first).
const STUCK_GRACE: Duration = Duration::from_secs(15);

/// The codes librdkafka reports a fenced producer with.
const FENCED: [RDKafkaErrorCode; 3] = [
    RDKafkaErrorCode::Fenced,
    RDKafkaErrorCode::ProducerFenced,
    RDKafkaErrorCode::InvalidProducerEpoch,
];
/// The longest one `send_offsets_to_transaction` call may take before the loop around it
/// looks again (see [`Producer::send_offsets`]).
const SEND_OFFSETS_CALL: Duration = Duration::from_secs(1);
/// How often [`Producer::settle`] asks whether librdkafka's queue is empty.
const SETTLE_EVERY: Duration = Duration::from_micros(200);

/// Whether a producer waits for more records to a partition before it sends (unless a
/// user's own `linger.ms` says otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Linger {
    /// 5 ms: the engine's batches, many records awaited together.
    Batches,
    /// None: one record at a time, each awaited before the next step (a pending marker
    /// before its effect, a half before its local transaction).
    Not,
}

impl Linger {
    fn setting(self) -> (&'static str, &'static str) {
        match self {
            Linger::Batches => ("linger.ms", "5"),
            Linger::Not => ("linger.ms", "0"),
        }
    }
}

/// A transactional producer's configuration: the defaults (which a user's own
/// properties override), then what the guarantee needs.
fn transactional_config(
    options: &ClientOptions,
    transactional_id: &str,
    transaction_timeout: Duration,
    linger: Linger,
) -> ClientConfig {
    let timeout_ms = transaction_timeout.as_millis().to_string();
    options.config_with_defaults(
        &[super::TRANSACTIONAL_DEFAULTS, &[linger.setting()]].concat(),
        &[
            ("transactional.id", transactional_id),
            ("enable.idempotence", "true"),
            ("transaction.timeout.ms", &timeout_ms),
        ],
    )
}

/// A producer made of `config`, with the ledger its delivery reports go to.
fn ledgered(
    config: ClientConfig,
    operation: &str,
) -> Result<(ThreadedProducer<Ledgered>, Arc<Deliveries>)> {
    let deliveries = Arc::new(Deliveries::default());
    let producer = config
        .create_with_context(Ledgered {
            deliveries: deliveries.clone(),
        })
        .map_err(|e| kafka_error(operation, e))?;
    Ok((producer, deliveries))
}

/// A producer (see the [module](self)). Where each record landed is kept in its
/// [`Deliveries`] ledger (see `deliveries.rs`), served by the producer's polling thread.
#[derive(Clone)]
pub(crate) struct Producer {
    producer: ThreadedProducer<Ledgered>,
    deliveries: Arc<Deliveries>,
    /// What it was made of, for [`Producer::replaced`].
    config: ClientConfig,
    transactional_id: Option<String>,
    transaction_timeout: Duration,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("transactional_id", &self.transactional_id)
            .finish()
    }
}

impl Producer {
    /// A transactional producer with `transactional_id`, initialised: any earlier producer
    /// with the same ID is fenced and its open transaction aborted.
    pub(crate) async fn transactional(
        options: &ClientOptions,
        transactional_id: &str,
        transaction_timeout: Duration,
        linger: Linger,
    ) -> Result<Self> {
        let config = transactional_config(options, transactional_id, transaction_timeout, linger);
        Self::initialised(config, transactional_id, transaction_timeout).await
    }

    /// A transactional producer of `config`, initialised.
    async fn initialised(
        config: ClientConfig,
        transactional_id: &str,
        transaction_timeout: Duration,
    ) -> Result<Self> {
        let (producer, deliveries) = ledgered(config.clone(), "create the transactional producer")?;
        let init = producer.clone();
        blocking("init_transactions", move || {
            init.init_transactions(transaction_timeout)
                .map_err(|e| kafka_error("init_transactions", e))
        })
        .await?;
        Ok(Producer {
            producer,
            deliveries,
            config,
            transactional_id: Some(transactional_id.to_owned()),
            transaction_timeout,
        })
    }

    /// A new transactional producer with this one's ID and configuration, initialised:
    /// what this one left open is aborted, and what it still has in flight is fenced (the
    /// new epoch). The way on after a fence, or after any transactional request that
    /// timed out (it may still land later: librdkafka has no KIP-890 part 2).
    pub(crate) async fn replaced(&self) -> Result<Self> {
        let Some(id) = &self.transactional_id else {
            return Err(Error::Usage {
                what: "an idempotent producer was asked to be replaced".into(),
                fix: "replace only transactional producers; an idempotent one goes on".into(),
            });
        };
        Self::initialised(self.config.clone(), id, self.transaction_timeout).await
    }

    /// An idempotent, non-transactional producer (at-least-once and at-most-once, and
    /// records whose order matters but which need no transaction).
    pub(crate) fn idempotent(options: &ClientOptions, linger: Linger) -> Result<Self> {
        let config = options.config_with_defaults(
            &[linger.setting()],
            &[("enable.idempotence", "true"), ("acks", "all")],
        );
        let (producer, deliveries) = ledgered(config.clone(), "create the producer")?;
        Ok(Producer {
            producer,
            deliveries,
            config,
            transactional_id: None,
            transaction_timeout: Duration::from_secs(60),
        })
    }

    /// Which client this is (clones share it; a replacement is another one).
    #[cfg(test)]
    pub(crate) fn instance(&self) -> usize {
        Arc::as_ptr(&self.deliveries) as usize
    }

    fn classify(&self, operation: impl Into<crate::Operation>, error: KafkaError) -> Error {
        let translated = kafka_error(operation, error);
        let fenced = FENCED
            .into_iter()
            .any(|code| translated.has_code(super::error::code_of(code)));
        match (&self.transactional_id, fenced) {
            (Some(id), true) => Error::Fenced {
                what: format!("transactional.id `{id}`"),
                detail: translated.to_string(),
            },
            _ => translated,
        }
    }

    /// Starts a transaction (a local state change in librdkafka; it does not block).
    pub(crate) fn begin(&self) -> Result<()> {
        self.producer
            .begin_transaction()
            .map_err(|e| self.classify("begin_transaction", e))
    }

    /// Queues a record with headers (a header may have no value) and, if given, its own
    /// timestamp (else the producer's clock); waits while librdkafka's queue is full.
    pub(crate) async fn send_with_headers(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
        timestamp_ms: Option<i64>,
    ) -> Result<Pending> {
        // Frees its slot if the record is never queued (refused, or this future dropped
        // while waiting for room).
        let pending = self.deliveries.reserve();
        let opaque = pending.opaque();
        loop {
            let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(topic, opaque);
            if let Some(timestamp) = timestamp_ms {
                record = record.timestamp(timestamp);
            }
            if !headers.is_empty() {
                let mut owned = OwnedHeaders::new_with_capacity(headers.len());
                for (name, value) in headers {
                    owned = owned.insert(Header {
                        key: name,
                        value: *value,
                    });
                }
                record = record.headers(owned);
            }
            if let Some(partition) = partition {
                record = record.partition(partition);
            }
            if let Some(key) = key {
                record = record.key(key);
            }
            if let Some(value) = value {
                record = record.payload(value);
            }
            match self.producer.send(record) {
                Ok(()) => return Ok(pending),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((error, _)) => {
                    return Err(self.classify(crate::Operation::produce(topic), error));
                }
            }
        }
    }

    /// Adds the consumer's next offsets to the open transaction, with the consumer's
    /// current group metadata (so a consumer that lost its generation cannot commit).
    pub(crate) async fn send_offsets(
        &self,
        consumer: &InputConsumer,
        topic: &str,
        offsets: Vec<(i32, i64)>,
    ) -> Result<()> {
        self.send_offsets_of(consumer.group_metadata()?, topic, offsets)
            .await
    }

    /// Adds a group's next offsets to the open transaction with the group member's
    /// `metadata` (its generation: a member that lost its turn cannot commit).
    pub(crate) async fn send_offsets_of(
        &self,
        metadata: GroupMetadata,
        topic: &str,
        offsets: Vec<(i32, i64)>,
    ) -> Result<()> {
        let metadata = metadata.0;
        let mut list = TopicPartitionList::new();
        for (partition, offset) in offsets {
            list.add_partition_offset(topic, partition, Offset::Offset(offset))
                .map_err(|e| kafka_error("send_offsets_to_transaction", e))?;
        }
        let this = self.clone();
        self.bounded("send_offsets_to_transaction", move || {
            // A retriable error (the coordinator moved or was not reachable) leaves the
            // transaction as it was: librdkafka's contract is to call again, which costs
            // less than aborting the batch (and the abort's epoch bump is where a moving
            // coordinator can fence the producer). Within half the transaction timeout:
            // the batch itself took up to the other half.
            let within = this.transaction_timeout / 2;
            let started = Instant::now();
            let mut pause = Duration::from_millis(50);
            loop {
                // librdkafka retries inside a call until its timeout; a short one lets
                // the loop see (and log) a coordinator that does not answer. A call
                // made again after its timeout resumes the one in flight.
                let left = within.saturating_sub(started.elapsed());
                let call = left.clamp(Duration::from_millis(100), SEND_OFFSETS_CALL);
                match this
                    .producer
                    .send_offsets_to_transaction(&list, &metadata, call)
                {
                    Ok(()) => return Ok(()),
                    Err(error) => {
                        let error = this.classify("send_offsets_to_transaction", error);
                        // A call that timed out is not made again on this producer (see
                        // `commit`): the batch fails and the producer is replaced.
                        if !error.is_retriable()
                            || error.timed_out_request()
                            || started.elapsed() + pause >= within
                        {
                            return Err(error);
                        }
                        tracing::warn!(%error, ?pause, "sending the offsets failed; sending them again");
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                }
            }
        })
        .await
    }

    /// Runs `work` (a blocking transactional call) on a thread of its own and gives up on
    /// it when it has not returned well after the producer's own timeout: librdkafka can
    /// block past it (its coordinator requests do not check their timeout when the
    /// coordinator went away, librdkafka issues 5456 and 5511; seen here when the node
    /// coordinating the group was killed). The caller then replaces the producer; the
    /// blocked thread is left behind, detached (a thread of tokio's blocking pool would
    /// keep the runtime, and the process, from shutting down).
    async fn bounded<T: Send + 'static>(
        &self,
        call: &'static str,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let after = self.transaction_timeout + STUCK_GRACE;
        let (done, result) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("onceflow-{call}"))
            .spawn(move || {
                let _ = done.send(work());
            })
            .map_err(|e| Error::Broker(format!("no thread for {call}: {e}")))?;
        match tokio::time::timeout(after, result).await {
            Ok(Ok(done)) => done,
            Ok(Err(_)) => Err(Error::Broker(format!("{call} ended without an answer"))),
            Err(_) => {
                tracing::error!(
                    call,
                    ?after,
                    "a producer call did not return past its timeout; abandoning the producer"
                );
                Err(Error::ProducerStuck {
                    call: call.to_owned(),
                    after,
                })
            }
        }
    }

    /// Blocks until librdkafka holds no unacknowledged record and no delivery report left
    /// to serve (`Ok(true)`), or `timeout` passes (`Ok(false)`).
    ///
    /// Instead of rust-rdkafka's `Producer::flush`, which costs 100 ms whenever anything
    /// is in flight when it is called: it polls in steps of `min(left, 100 ms)`, and its
    /// `BaseProducer::poll` (0.39) returns only once its whole timeout is over, even after
    /// the last delivery report. `commit_transaction` flushes that way first, so each
    /// commit took at least 100 ms (the benchmark measured ~110 ms from a batch's last
    /// record to its outputs being visible, both here and in the plain rdkafka loop).
    /// Here librdkafka's own flush is asked with no wait, which only tells whether the
    /// queue is empty, while the producer's polling thread serves the delivery
    /// reports.
    fn settle(&self, timeout: Duration) -> std::result::Result<bool, KafkaError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.producer.flush(Duration::ZERO) {
                Ok(()) => return Ok(true),
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {
                    if Instant::now() >= deadline {
                        return Ok(false);
                    }
                    std::thread::sleep(SETTLE_EVERY);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Commits the open transaction. A commit that times out is an error at once, not
    /// retried on this producer: its request may still land later, and only a new
    /// producer (whose initialisation bumps the epoch) is safe from it (the engine's
    /// recovery replaces the producer and learns from the committed offsets whether the
    /// commit went through). Other retriable errors are retried until
    /// `transaction.timeout.ms` has passed in all.
    pub(crate) async fn commit(&self) -> Result<()> {
        let this = self.clone();
        let commit = move || {
            let started = Instant::now();
            // What is still in flight is waited for here, so that the commit's own flush
            // finds nothing (see `settle`); one that does not settle is left to the
            // commit, which then times out as before.
            this.settle(this.transaction_timeout)
                .map_err(|e| this.classify("flush", e))?;
            tracing::debug!(
                settle_ms = started.elapsed().as_secs_f64() * 1e3,
                "in-flight records acknowledged; committing"
            );
            loop {
                let left = this.transaction_timeout.saturating_sub(started.elapsed());
                match this
                    .producer
                    .commit_transaction(left.max(Duration::from_millis(100)))
                {
                    Ok(()) => return Ok(()),
                    Err(error) => {
                        let error = this.classify("commit_transaction", error);
                        if error.is_retriable()
                            && !error.timed_out_request()
                            && started.elapsed() < this.transaction_timeout
                        {
                            tracing::warn!(%error, "commit timed out; retrying");
                            continue;
                        }
                        return Err(error);
                    }
                }
            }
        };
        self.bounded("commit_transaction", commit).await
    }

    /// Aborts the open transaction.
    pub(crate) async fn abort(&self) -> Result<()> {
        let this = self.clone();
        let abort = move || {
            this.producer
                .abort_transaction(this.transaction_timeout)
                .map_err(|e| this.classify("abort_transaction", e))
        };
        self.bounded("abort_transaction", abort).await
    }

    /// Whether a successor fenced this producer (initialised its transactional ID). Asked
    /// the only way librdkafka allows: a transaction with one record of no consequence
    /// (a tombstone keyed `onceflow-fence-probe` to `topic` partition 0, the changelog;
    /// aborted, so no `read_committed` reader and no replay ever sees it), delivered, then
    /// aborted. A transaction left open by a failed batch is aborted first. For the rare
    /// moment a fence of the consumer must be told from the instance's own, between
    /// transactions. `Err`: the cluster did not say.
    pub(crate) async fn probe_fenced(&self, topic: &str) -> Result<bool> {
        let fenced = |error: &Error| matches!(error, Error::Fenced { .. });
        if let Err(error) = self.begin() {
            if fenced(&error) {
                return Ok(true);
            }
            // A transaction is open still: end it, then try again.
            if let Err(error) = self.abort().await {
                return if fenced(&error) { Ok(true) } else { Err(error) };
            }
            if let Err(error) = self.begin() {
                return if fenced(&error) { Ok(true) } else { Err(error) };
            }
        }
        let sent = self
            .send_with_headers(topic, Some(0), Some(FENCE_PROBE_KEY), None, &[], None)
            .await;
        let landed = match sent {
            Ok(pending) => pending.landed().await.map(|_| ()),
            Err(error) => Err(error),
        };
        let aborted = self.abort().await;
        match (landed, aborted) {
            (_, Err(error)) if fenced(&error) => Ok(true),
            (Err(error), _)
                if FENCED
                    .into_iter()
                    .any(|code| error.has_code(super::error::code_of(code))) =>
            {
                Ok(true)
            }
            (Ok(()), Ok(())) => Ok(false),
            (Err(error), _) | (_, Err(error)) => Err(error),
        }
    }

    /// Waits until every queued record is acknowledged (non-transactional modes).
    pub(crate) async fn flush(&self) -> Result<()> {
        let this = self.clone();
        blocking("flush", move || {
            match this.settle(this.transaction_timeout) {
                Ok(true) => Ok(()),
                Ok(false) => Err(this.classify(
                    "flush",
                    KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut),
                )),
                Err(error) => Err(this.classify("flush", error)),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::{Linger, Producer};
    use crate::kafka::{ClientOptions, InputConsumer};

    /// A consumer of the mock's topic `in` with its partition assigned, and a transactional
    /// producer in an open transaction.
    async fn in_a_transaction(
        mock: &MockCluster<'_, DefaultProducerContext>,
    ) -> (InputConsumer, Producer) {
        mock.create_topic("in", 1, 1).expect("topic");
        let options = ClientOptions::with_properties(mock.bootstrap_servers(), &[]);
        let consumer = InputConsumer::subscribe(&options, "g", "a", "in", 10).expect("consumer");
        let deadline = Instant::now() + Duration::from_secs(30);
        while consumer.assigned().await.expect("assignment").is_empty() {
            assert!(Instant::now() < deadline, "never assigned");
            consumer
                .poll(10, Duration::from_millis(200))
                .await
                .expect("poll");
        }
        let producer =
            Producer::transactional(&options, "g-a", Duration::from_secs(20), Linger::Batches)
                .await
                .expect("producer");
        producer.begin().expect("begin");
        (consumer, producer)
    }

    /// librdkafka's mock cluster drives the error (an error path, no exactly-once claim):
    /// a coordinator that moved answers the offsets of a transaction with NOT_COORDINATOR,
    /// retriable. The call is made again in the same transaction, which then commits;
    /// before, the batch was aborted and processed again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retriable_send_offsets_failure_is_sent_again_in_the_same_transaction() {
        let mock = MockCluster::new(1).expect("mock cluster");
        let (consumer, producer) = in_a_transaction(&mock).await;
        mock.request_errors(
            RDKafkaApiKey::AddOffsetsToTxn,
            // More than librdkafka's own retries fit in one call (the first waits
            // `retry.backoff.ms`, 10 ms, each next one twice as long up to 1 s): the call
            // fails with NOT_COORDINATOR, retriable (not a timeout, which would fail the
            // batch and replace the producer: see `commit`).
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR; 10],
        );
        producer
            .send_offsets(&consumer, "in", vec![(0, 0)])
            .await
            .expect("sent again after the retriable errors");
        producer.commit().await.expect("commit");
    }

    /// A transaction begun soon after the last one committed is answered
    /// CONCURRENT_TRANSACTIONS until its coordinator has written the last one's markers.
    /// librdkafka asks again after `retry.backoff.ms`: the engine's producer starts at
    /// 10 ms, not librdkafka's 100 ms, which was most of the p99 at a 10 ms commit
    /// interval. A user's own value wins (of `linger.ms` too, which the engine used to set
    /// over it); what the guarantee needs does not move.
    #[test]
    fn the_transactional_producer_asks_its_coordinator_again_soon_unless_told_otherwise() {
        let config = |properties: &[(&str, &str)]| {
            let properties: Vec<(String, String)> = properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let options = ClientOptions::with_properties("broker:9092", &properties);
            super::transactional_config(&options, "g-a", Duration::from_secs(60), Linger::Batches)
        };
        let default = config(&[]);
        assert_eq!(default.get("retry.backoff.ms"), Some("10"));
        assert_eq!(
            default.get("retry.backoff.max.ms"),
            None,
            "librdkafka's 1 s"
        );
        assert_eq!(default.get("transactional.id"), Some("g-a"));
        assert_eq!(default.get("enable.idempotence"), Some("true"));
        assert_eq!(default.get("transaction.timeout.ms"), Some("60000"));
        assert_eq!(default.get("linger.ms"), Some("5"));
        let own = config(&[
            ("retry.backoff.ms", "250"),
            ("linger.ms", "0"),
            ("enable.idempotence", "false"),
        ]);
        assert_eq!(own.get("retry.backoff.ms"), Some("250"));
        assert_eq!(
            own.get("linger.ms"),
            Some("0"),
            "set before, it was not the user's"
        );
        assert_eq!(own.get("enable.idempotence"), Some("true"));
    }

    /// The coordinator still busy with the last transaction (CONCURRENT_TRANSACTIONS) is
    /// an answer to wait out, in the same call and the same transaction: the offsets are
    /// sent and the transaction commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn offsets_sent_while_the_last_transaction_completes_are_sent_again() {
        let mock = MockCluster::new(1).expect("mock cluster");
        let (consumer, producer) = in_a_transaction(&mock).await;
        mock.request_errors(
            RDKafkaApiKey::AddOffsetsToTxn,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS; 3],
        );
        producer
            .send_offsets(&consumer, "in", vec![(0, 0)])
            .await
            .expect("sent again once the coordinator was done");
        producer.commit().await.expect("commit");
    }

    /// librdkafka's mock cluster drives it (no exactly-once claim): the way on after a
    /// failed transactional call is a new producer under the same ID and configuration
    /// (its initialisation fences the old one on a real broker; the mock does not check
    /// epochs), left with an open transaction by the old one, whose transactions commit.
    /// An idempotent producer has nothing to replace.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transactional_producer_is_replaced_under_its_own_id_and_configuration() {
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("out", 1, 1).expect("topic");
        let properties = [("client.id".to_owned(), "replaced".to_owned())];
        let options = ClientOptions::with_properties(mock.bootstrap_servers(), &properties);
        let send = |producer: Producer, value: &'static [u8]| async move {
            producer
                .send_with_headers("out", Some(0), None, Some(value), &[], None)
                .await
                .expect("queued")
                .landed()
                .await
                .expect("landed");
        };
        let old = Producer::transactional(&options, "r", Duration::from_secs(20), Linger::Not)
            .await
            .expect("producer");
        old.begin().expect("begin");
        send(old.clone(), b"old").await;
        let new = old.replaced().await.expect("replaced");
        for key in [
            "transactional.id",
            "client.id",
            "linger.ms",
            "transaction.timeout.ms",
        ] {
            assert_eq!(new.config.get(key), old.config.get(key), "{key}");
        }
        assert_eq!(new.transactional_id.as_deref(), Some("r"));
        new.begin().expect("begin");
        send(new.clone(), b"new").await;
        new.commit().await.expect("the replacement commits");

        let idempotent = Producer::idempotent(&options, Linger::Not).expect("producer");
        let error = idempotent.replaced().await.expect_err("not transactional");
        assert!(matches!(error, crate::Error::Usage { .. }), "{error}");
    }

    /// Each record learns its own partition and offset however the reports are awaited,
    /// and the ledger keeps nothing afterwards: not for records awaited, nor for records
    /// dropped unawaited in a transaction that was then aborted (librdkafka reports the
    /// purged records as failed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_record_learns_where_it_landed_and_the_ledger_keeps_nothing_after() {
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("out", 3, 1).expect("topic");
        let options = ClientOptions::with_properties(mock.bootstrap_servers(), &[]);
        let producer = Producer::idempotent(&options, Linger::Batches).expect("producer");
        let mut pending = Vec::new();
        for i in 0..30 {
            let value = format!("v{i}");
            let sent = producer
                .send_with_headers("out", Some(i % 3), None, Some(value.as_bytes()), &[], None)
                .await
                .expect("queued");
            pending.push((i % 3, i / 3, sent));
        }
        for (partition, offset, sent) in pending.into_iter().rev() {
            assert_eq!(
                sent.landed().await.expect("landed"),
                (partition, i64::from(offset))
            );
        }
        assert_eq!(producer.deliveries.held(), 0);

        let transactional =
            Producer::transactional(&options, "t", Duration::from_secs(20), Linger::Batches)
                .await
                .expect("producer");
        transactional.begin().expect("begin");
        for i in 0..50 {
            let sent = transactional
                .send_with_headers("out", Some(i % 3), None, Some(b"aborted"), &[], None)
                .await
                .expect("queued");
            drop(sent);
        }
        let refused = transactional
            .send_with_headers("out", Some(7), None, Some(b"no such partition"), &[], None)
            .await;
        // Refused when queued or when reported, depending on what librdkafka knows yet.
        let error = match refused {
            Ok(sent) => sent.landed().await.expect_err("partition 7 of 3"),
            Err(error) => error,
        };
        assert!(error.to_string().contains("`out`"), "{error}");
        transactional.abort().await.expect("abort");
        transactional
            .settle(Duration::from_secs(10))
            .expect("settled");
        assert_eq!(transactional.deliveries.held(), 0);
    }
}
