//! librdkafka errors translated into [`crate::Error`], keeping librdkafka's classification.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::Error;
use crate::error::ErrorClass;

/// Translates an rdkafka error raised by `operation`.
pub(crate) fn kafka_error(operation: impl Into<String>, error: KafkaError) -> Error {
    let operation = operation.into();
    if let KafkaError::Transaction(rd) = &error {
        // Transactional API errors carry librdkafka's own verdict; use it as is.
        let class = if rd.is_fatal() {
            ErrorClass::Fatal
        } else if rd.txn_requires_abort() {
            ErrorClass::Abortable
        } else if rd.is_retriable() {
            ErrorClass::Retriable
        } else {
            ErrorClass::Other
        };
        return Error::Kafka {
            operation,
            code: format!("{:?}", rd.code()),
            message: rd.string(),
            class,
        };
    }
    let code = error.rdkafka_error_code();
    Error::Kafka {
        operation,
        code: code.map_or_else(|| "UNKNOWN".to_owned(), |code| format!("{code:?}")),
        message: error.to_string(),
        class: code.map_or(ErrorClass::Other, classify_code),
    }
}

/// Classifies a bare error code, for calls outside the transactional API.
fn classify_code(code: RDKafkaErrorCode) -> ErrorClass {
    use RDKafkaErrorCode as C;
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
        assert_eq!(fenced.kafka_code(), Some("ProducerFenced"));
        let timeout = kafka_error(
            "metadata",
            KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
        );
        assert!(timeout.is_retriable(), "{timeout}");
    }
}
