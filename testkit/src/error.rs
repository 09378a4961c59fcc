//! What a testkit call can fail with: its own error, apart from onceflow's, with the
//! Kafka client's error kept as its cause.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A testkit call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kafka client call failed.
    #[error("{operation}: {source}")]
    Kafka {
        /// What was being done.
        operation: String,
        /// The client's error.
        #[source]
        source: KafkaError,
    },
    /// A wait ran out of time; `detail` says what was seen last.
    #[error("{what}: not within {after:?} ({detail})")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        after: Duration,
        /// What was seen last.
        detail: String,
    },
    /// What the tests run on could not be set up or used: Docker and its containers,
    /// PostgreSQL, certificates, files, a setting of the environment.
    #[error("{0}")]
    Environment(String),
}

/// The testkit's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn kafka(operation: impl Into<String>, source: KafkaError) -> Error {
        Error::Kafka {
            operation: operation.into(),
            source,
        }
    }

    /// librdkafka's code of a Kafka error (an admin call's too).
    pub fn code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            Error::Kafka {
                source: KafkaError::AdminOp(code),
                ..
            } => Some(*code),
            Error::Kafka { source, .. } => source.rdkafka_error_code(),
            _ => None,
        }
    }

    /// Whether the same call may succeed if made again: the cluster was settling (a
    /// leader being elected, a coordinator loading, a broker away). The codes are those
    /// onceflow's engine retries on a call outside a transaction.
    pub fn is_retriable(&self) -> bool {
        use RDKafkaErrorCode as C;
        if matches!(
            self,
            Error::Kafka {
                source: KafkaError::MessageConsumptionFatal(_),
                ..
            }
        ) {
            return false;
        }
        matches!(self, Error::Timeout { .. })
            || matches!(
                self.code(),
                Some(
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
                        | C::OffsetNotAvailable
                        | C::FencedLeaderEpoch
                        | C::UnknownLeaderEpoch
                        | C::KafkaStorageError
                        | C::PreferredLeaderNotAvailable
                        | C::ReplicaNotAvailable
                        | C::DestroyBroker
                )
            )
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};

    use super::Error;

    #[test]
    fn a_settling_cluster_is_retriable_and_a_refusal_or_a_fatal_read_is_not() {
        let error = |source| Error::kafka("read", source);
        assert!(
            error(KafkaError::MessageConsumption(
                RDKafkaErrorCode::OffsetNotAvailable
            ))
            .is_retriable()
        );
        assert!(
            error(KafkaError::AdminOp(
                RDKafkaErrorCode::BrokerTransportFailure
            ))
            .is_retriable()
        );
        assert!(
            !error(KafkaError::MessageConsumption(
                RDKafkaErrorCode::TopicAuthorizationFailed
            ))
            .is_retriable()
        );
        assert!(
            !error(KafkaError::MessageConsumptionFatal(
                RDKafkaErrorCode::OffsetNotAvailable
            ))
            .is_retriable()
        );
        assert_eq!(
            error(KafkaError::AdminOp(RDKafkaErrorCode::TopicAlreadyExists)).code(),
            Some(RDKafkaErrorCode::TopicAlreadyExists)
        );
        assert!(!Error::Environment("no Docker".into()).is_retriable());
    }
}
