//! librdkafka errors translated into [`crate::Error`], keeping librdkafka's classification.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;

use crate::Error;
use crate::error::{ErrorClass, KafkaCode, Operation};
use crate::redact;

/// Translates an rdkafka error raised by `operation`.
pub(crate) fn kafka_error(operation: impl Into<Operation>, error: KafkaError) -> Error {
    let operation = operation.into();
    if let KafkaError::ClientConfig(_, description, key, value) = &error {
        // rdkafka's message echoes the value, which may be a password or a private key.
        return Error::Config {
            key: key.clone(),
            value: redact::shown(key, value).to_owned(),
            accepted: format!("a value librdkafka accepts ({description})"),
        };
    }
    if let KafkaError::Transaction(rd) = &error {
        // Transactional API errors carry librdkafka's own verdict; use it as is.
        // A refused credential or a missing ACL stays refused however often the call
        // is made or the transaction aborted: stop, whatever else librdkafka says.
        let class = if rd.is_fatal() || is_refused(rd.code()) {
            ErrorClass::Fatal
        } else if rejects_the_record(rd.code()) {
            ErrorClass::Rejected
        } else if rd.txn_requires_abort() {
            ErrorClass::Abortable
        } else if rd.is_retriable() {
            ErrorClass::Retriable
        } else {
            ErrorClass::Other
        };
        return Error::Kafka {
            operation,
            code: code_of(rd.code()),
            message: rd.string(),
            class,
            cause: Some(Box::new(error)),
        };
    }
    // rdkafka gives no code for an admin call's error, though it carries one: without it
    // a broker away during a start-up check was not retriable, and the instance stopped.
    let code = match &error {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    if let KafkaError::MessageConsumptionFatal(code) = &error {
        // librdkafka raised it as fatal: the consumer cannot go on, however often polled.
        return Error::Kafka {
            operation,
            code: code_of(*code),
            message: error.to_string(),
            class: ErrorClass::Fatal,
            cause: Some(Box::new(error)),
        };
    }
    Error::Kafka {
        operation,
        code: code.map_or(KafkaCode::UNKNOWN, code_of),
        message: error.to_string(),
        class: code.map_or(ErrorClass::Other, classify_code),
        cause: Some(Box::new(error)),
    }
}

/// onceflow's code for librdkafka's: the same number, and librdkafka's name for it.
pub(crate) fn code_of(code: RDKafkaErrorCode) -> KafkaCode {
    // A code's name is needed as `&'static str`, and librdkafka's enum gives it only
    // through `Debug`: each name is made once and kept (a few hundred codes at most).
    static NAMES: LazyLock<Mutex<HashMap<i32, &'static str>>> = LazyLock::new(Default::default);
    let number = code as i32;
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let name = *names
        .entry(number)
        .or_insert_with(|| Box::leak(format!("{code:?}").into_boxed_str()));
    KafkaCode::new(number, name)
}

/// librdkafka's code for onceflow's, `None` for [`KafkaCode::UNKNOWN`].
pub(crate) fn rd_code(code: KafkaCode) -> Option<RDKafkaErrorCode> {
    code.number()
        .and_then(|number| RDKafkaRespErr::try_from(number).ok())
        .map(RDKafkaErrorCode::from)
}

/// Classifies onceflow's code as [`classify_code`] does librdkafka's (for the engine's
/// in-memory Kafka, which makes the errors a broker would).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn classify(code: KafkaCode) -> ErrorClass {
    rd_code(code).map_or(ErrorClass::Other, classify_code)
}

/// Translates an error of a read of a topic the instance has already seen exist (its
/// changelog, checked or created at start): "unknown topic or partition" there comes
/// from a node whose metadata lags the cluster's (just restarted, or cut off from the
/// controllers: a three-node test saw a replay stop an instance this way while a node
/// was cut off its peers), a moment's condition, so retriable, not the refusal
/// [`kafka_error`] makes of it for a record sent to such a topic. A topic really deleted
/// still fails, once the caller's bounded retries are spent.
pub(crate) fn known_topic_error(operation: impl Into<Operation>, error: KafkaError) -> Error {
    let mut translated = kafka_error(operation, error);
    if let Error::Kafka { code, class, .. } = &mut translated
        && *class == ErrorClass::Rejected
        && [
            RDKafkaErrorCode::UnknownPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ]
        .into_iter()
        .any(|unknown| *code == code_of(unknown))
    {
        *class = ErrorClass::Retriable;
    }
    translated
}

/// Logs what librdkafka reports through its error callback at the level it deserves: a
/// node or connection going away is routine in a cluster (every restart of a broker makes
/// its clients report refused connections), so WARN; only what cannot go on is ERROR; the
/// end of a partition is routine (TRACE). rust-rdkafka's default logs all of it as ERROR,
/// which teaches operators to ignore ERROR.
pub(crate) fn log_client_error(error: KafkaError, reason: &str) {
    if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) {
        tracing::trace!(%error, reason, "end of partition");
        return;
    }
    let translated = kafka_error("librdkafka", error);
    if translated.is_fatal() {
        tracing::error!(error = %translated, reason, "librdkafka error");
    } else {
        tracing::warn!(error = %translated, reason, "librdkafka error");
    }
}

/// Whether `code` says a record was refused for good: the same record fails the same
/// way however often it is sent (librdkafka's local size check, the broker's size,
/// validation and topic checks).
fn rejects_the_record(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::MessageBatchTooLarge
            | C::InvalidTopic
            | C::UnknownTopic
            | C::UnknownPartition
            | C::PolicyViolation
    )
}

/// Classifies a bare error code, for calls outside the transactional API.
pub(crate) fn classify_code(code: RDKafkaErrorCode) -> ErrorClass {
    use RDKafkaErrorCode as C;
    if is_refused(code) {
        return ErrorClass::Fatal;
    }
    if rejects_the_record(code) {
        return ErrorClass::Rejected;
    }
    match code {
        C::Fenced
        | C::ProducerFenced
        | C::InvalidProducerEpoch
        | C::TransactionalIdAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::Fatal => ErrorClass::Fatal,
        C::RequestTimedOut
        | C::OperationTimedOut
        | C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::NotCoordinator
        | C::CoordinatorLoadInProgress
        | C::CoordinatorNotAvailable
        | C::NotLeaderForPartition
        | C::LeaderNotAvailable
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::UnknownTopicOrPartition
        | C::NetworkException
        | C::ConcurrentTransactions
        // A leader just elected, or a replica behind: Kafka's clients retry all of
        // these. Seen on the cluster: a replay right after a leader was killed read
        // "Leader high watermark is not caught up" and the instance stopped.
        | C::OffsetNotAvailable
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::KafkaStorageError
        | C::PreferredLeaderNotAvailable
        | C::ReplicaNotAvailable
        // A request on a broker handle librdkafka decommissioned (a broker gone from
        // the metadata): the next call picks another. Seen on the cluster: a replay's
        // high-watermark read while a node was cut off its peers stopped the instance.
        | C::DestroyBroker => ErrorClass::Retriable,
        _ => ErrorClass::Other,
    }
}

/// The level of every event `run` logs (for tests of what is logged how).
#[cfg(test)]
pub(crate) fn levels_logged(run: impl FnOnce()) -> Vec<tracing::Level> {
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

    struct Levels(Arc<Mutex<Vec<tracing::Level>>>);
    impl<S: tracing::Subscriber> Layer<S> for Levels {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            self.0
                .lock()
                .expect("levels")
                .push(*event.metadata().level());
        }
    }
    let levels = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Levels(Arc::clone(&levels)));
    tracing::subscriber::with_default(subscriber, run);
    levels.lock().map(|seen| seen.clone()).expect("levels")
}

/// Whether librdkafka's error code means the cluster refused this client: its credentials
/// or one of its ACLs. Retrying cannot help.
fn is_refused(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::Authentication
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's own error stays the cause (a caller may downcast to it), and its
    /// text stays in the message, for the log.
    #[test]
    fn a_kafka_error_keeps_the_clients_error_as_its_cause() {
        let error = kafka_error(
            "produce",
            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
        );
        let cause = std::error::Error::source(&error).expect("a cause");
        assert!(
            matches!(
                cause.downcast_ref::<KafkaError>(),
                Some(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
            ),
            "{cause:?}"
        );
        assert_eq!(
            error.kafka_code(),
            Some(code_of(RDKafkaErrorCode::QueueFull))
        );
        assert!(error.to_string().contains("Queue full"), "{error}");
    }

    /// Seen on the cluster: an instance restarted while a node was away stopped at its
    /// start-up check, "describe the configuration … failed: BrokerTransportFailure",
    /// because an admin call's error came without its code and so was not retriable.
    #[test]
    fn an_admin_call_error_keeps_its_code_and_class() {
        let error = kafka_error(
            "describe the configuration of `t`",
            KafkaError::AdminOp(RDKafkaErrorCode::BrokerTransportFailure),
        );
        assert!(error.is_retriable(), "{error:?}");
        assert!(error.has_code(code_of(RDKafkaErrorCode::BrokerTransportFailure)));
        let exists = kafka_error(
            Operation::create_topic("t"),
            KafkaError::AdminOp(RDKafkaErrorCode::TopicAlreadyExists),
        );
        assert!(exists.has_code(code_of(RDKafkaErrorCode::TopicAlreadyExists)));
    }

    /// Seen on the cluster: while a node was cut off its peers, a changelog replay's
    /// high-watermark read answered UnknownPartition, taken as "refused for good", and
    /// the instance stopped. On a topic known to exist it is retried; for a record sent
    /// to such a topic it stays a refusal.
    #[test]
    fn an_unknown_partition_of_a_known_topic_is_retriable() {
        let read = known_topic_error(
            "replay `t-txlog` [3]: high watermark",
            KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition),
        );
        assert!(read.is_retriable(), "{read:?}");
        let sent = kafka_error(
            "send to `t`",
            KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownPartition),
        );
        assert!(!sent.is_retriable(), "{sent:?}");
        let refused = known_topic_error(
            "replay `t-txlog` [3]",
            KafkaError::MetadataFetch(RDKafkaErrorCode::MessageSizeTooLarge),
        );
        assert!(!refused.is_retriable(), "{refused:?}");
    }

    /// Seen on the cluster: a changelog replay right after the leader was killed read
    /// the high watermark from the new leader and got OffsetNotAvailable ("Leader high
    /// watermark is not caught up"), taken as final, and the instance stopped.
    #[test]
    fn a_new_leaders_moments_are_retriable() {
        for code in [
            RDKafkaErrorCode::OffsetNotAvailable,
            RDKafkaErrorCode::FencedLeaderEpoch,
            RDKafkaErrorCode::UnknownLeaderEpoch,
            RDKafkaErrorCode::DestroyBroker,
        ] {
            let error = known_topic_error(
                "replay `t-txlog` [3]: high watermark",
                KafkaError::MetadataFetch(code),
            );
            assert!(error.is_retriable(), "{error:?}");
        }
    }

    /// A broker restarting makes every client report refused connections: WARN, so
    /// that ERROR stays for what cannot go on.
    #[test]
    fn librdkafka_errors_are_logged_at_the_level_they_deserve() {
        use rdkafka::ClientContext;
        // The engine producer's context.
        let context = crate::kafka::deliveries::Ledgered {
            deliveries: Default::default(),
        };
        let levels = levels_logged(|| {
            context.error(
                KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
                "Connect to ipv4#127.0.0.1:9092 failed: Connection refused",
            );
            context.error(KafkaError::Global(RDKafkaErrorCode::PartitionEOF), "end");
            context.error(
                KafkaError::Global(RDKafkaErrorCode::Fatal),
                "Fatal error: fenced",
            );
        });
        assert_eq!(
            levels,
            [
                tracing::Level::WARN,
                tracing::Level::TRACE,
                tracing::Level::ERROR
            ]
        );
    }

    #[test]
    fn fencing_is_fatal_and_timeouts_are_retriable() {
        let fenced = kafka_error(
            "send",
            KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
        );
        assert!(fenced.is_fatal(), "{fenced}");
        assert!(
            fenced.has_code(code_of(RDKafkaErrorCode::ProducerFenced)),
            "{fenced}"
        );
        let timeout = kafka_error(
            "metadata",
            KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
        );
        assert!(timeout.is_retriable(), "{timeout}");
    }

    #[test]
    fn refusals_are_fatal_even_where_librdkafka_would_abort_and_retry() {
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::SaslAuthenticationFailed,
        ] {
            let produce = Operation::Produce { topic: "x".into() };
            let error = kafka_error(produce, KafkaError::MessageProduction(code));
            assert!(error.is_fatal() && !error.is_retriable(), "{error}");
        }
    }

    #[test]
    fn a_rejected_secret_property_is_not_echoed() {
        let error = kafka_error(
            "create the consumer",
            KafkaError::ClientConfig(
                rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
                "Invalid value".into(),
                "ssl.key.pem".into(),
                "-----BEGIN PRIVATE KEY-----abc".into(),
            ),
        );
        let text = error.to_string();
        assert!(
            text.contains("ssl.key.pem") && !text.contains("abc"),
            "{text}"
        );
    }

    #[test]
    fn the_codes_onceflow_names_are_librdkafkas_by_number_and_name() {
        use RDKafkaErrorCode as C;
        let named = [
            (KafkaCode::MESSAGE_SIZE_TOO_LARGE, C::MessageSizeTooLarge),
            (KafkaCode::REQUEST_TIMED_OUT, C::RequestTimedOut),
            (KafkaCode::ILLEGAL_GENERATION, C::IllegalGeneration),
            (KafkaCode::TOPIC_ALREADY_EXISTS, C::TopicAlreadyExists),
            (
                KafkaCode::OUT_OF_ORDER_SEQUENCE_NUMBER,
                C::OutOfOrderSequenceNumber,
            ),
            (KafkaCode::INVALID_PRODUCER_EPOCH, C::InvalidProducerEpoch),
            (
                KafkaCode::INVALID_TRANSACTIONAL_STATE,
                C::InvalidTransactionalState,
            ),
            (KafkaCode::UNKNOWN_PRODUCER_ID, C::UnknownProducerId),
            (KafkaCode::UNSTABLE_OFFSET_COMMIT, C::UnstableOffsetCommit),
            (KafkaCode::PRODUCER_FENCED, C::ProducerFenced),
            (KafkaCode::FATAL, C::Fatal),
            (KafkaCode::OPERATION_TIMED_OUT, C::OperationTimedOut),
            (KafkaCode::MESSAGE_TIMED_OUT, C::MessageTimedOut),
        ];
        assert_eq!(
            named.len(),
            KafkaCode::NAMED.len(),
            "a named code left out here"
        );
        for (ours, theirs) in named {
            assert!(KafkaCode::NAMED.contains(&ours));
            let made = code_of(theirs);
            assert_eq!(ours.number(), made.number(), "{theirs:?}");
            assert_eq!(ours.name(), made.name(), "{theirs:?}");
            assert_eq!(ours.to_string(), format!("{theirs:?}"));
            assert_eq!(classify(ours), classify_code(theirs), "{theirs:?}");
            assert_eq!(rd_code(ours), Some(theirs));
        }
        // The same code made twice is equal; an unknown one is no code at all.
        assert_eq!(code_of(C::Fenced), code_of(C::Fenced));
        assert_ne!(code_of(C::Fenced), KafkaCode::UNKNOWN);
        assert_eq!(rd_code(KafkaCode::UNKNOWN), None);
    }
}
