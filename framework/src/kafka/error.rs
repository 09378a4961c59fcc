//! librdkafka errors translated into [`crate::Error`], keeping librdkafka's classification.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::security;
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
        let class = if rd.is_fatal() || security::is_refused(rd.code()) {
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
            code: rd.code().into(),
            message: rd.string(),
            class,
        };
    }
    let code = error.rdkafka_error_code();
    if let KafkaError::MessageConsumptionFatal(code) = &error {
        // librdkafka raised it as fatal: the consumer cannot go on, however often polled.
        return Error::Kafka {
            operation,
            code: (*code).into(),
            message: error.to_string(),
            class: ErrorClass::Fatal,
        };
    }
    Error::Kafka {
        operation,
        code: code.map_or(KafkaCode::UNKNOWN, KafkaCode::from),
        message: error.to_string(),
        class: code.map_or(ErrorClass::Other, classify_code),
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
fn classify_code(code: RDKafkaErrorCode) -> ErrorClass {
    use RDKafkaErrorCode as C;
    if security::is_refused(code) {
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
        | C::ConcurrentTransactions => ErrorClass::Retriable,
        _ => ErrorClass::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_is_fatal_and_timeouts_are_retriable() {
        let fenced = kafka_error(
            "send",
            KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
        );
        assert!(fenced.is_fatal(), "{fenced}");
        assert!(
            fenced.has_code(RDKafkaErrorCode::ProducerFenced),
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
}
