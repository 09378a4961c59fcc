//! The crate's one error type.
//!
//! Every failure says what the caller should do next: retry the same call
//! ([`Error::is_retriable`]), abort the open transaction and rewind
//! ([`Error::requires_abort`]), or stop ([`Error::is_fatal`]). No rdkafka or redb type
//! appears here: Kafka errors are carried as their librdkafka name and message.

use std::time::Duration;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kafka client call failed.
    #[error("{operation} failed: {message} ({code}){hint}", hint = class.hint())]
    Kafka {
        /// The call that failed, e.g. `commit_transaction` or `create topic orders`.
        operation: String,
        /// librdkafka's name for the error, e.g. `PRODUCER_FENCED` or `_TIMED_OUT`.
        code: String,
        /// librdkafka's description of the error.
        message: String,
        /// What the caller should do.
        class: ErrorClass,
    },
    /// Something did not happen before its deadline.
    #[error("{what} did not happen within {after:?}: {detail}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long it was waited for.
        after: Duration,
        /// What was seen instead.
        detail: String,
    },
    /// A setting is missing or has a value that is not accepted.
    #[error("invalid configuration `{key}` = `{value}`: {accepted}")]
    Config {
        /// The setting's name.
        key: String,
        /// The value given.
        value: String,
        /// What is accepted instead.
        accepted: String,
    },
    /// The test broker could not be started or reached (feature `testkit`).
    #[error("{0}")]
    Broker(String),
    /// A blocking call's thread panicked or was cancelled.
    #[error("blocking call `{operation}` did not complete: {message}")]
    Blocking {
        /// The call.
        operation: String,
        /// Why it did not complete.
        message: String,
    },
}

/// How a Kafka failure should be handled, as librdkafka classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The same call may be made again.
    Retriable,
    /// The open transaction must be aborted; processing may then go on.
    Abortable,
    /// The client is unusable (for example fenced by a newer instance): stop.
    Fatal,
    /// Not classified by librdkafka: treat as a failure of this call only.
    Other,
}

impl ErrorClass {
    fn hint(self) -> &'static str {
        match self {
            ErrorClass::Retriable => "; retriable",
            ErrorClass::Abortable => "; the transaction must be aborted",
            ErrorClass::Fatal => "; fatal: this client cannot go on",
            ErrorClass::Other => "",
        }
    }
}

impl Error {
    /// The same call may succeed if made again.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Error::Kafka {
                class: ErrorClass::Retriable,
                ..
            } | Error::Timeout { .. }
        )
    }

    /// The open Kafka transaction must be aborted before processing can go on.
    pub fn requires_abort(&self) -> bool {
        matches!(
            self,
            Error::Kafka {
                class: ErrorClass::Abortable,
                ..
            }
        )
    }

    /// Nothing more can be done with the client that failed: the instance must stop.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::Kafka {
                class: ErrorClass::Fatal,
                ..
            } | Error::Config { .. }
        )
    }

    /// librdkafka's name for a Kafka error, e.g. `PRODUCER_FENCED`.
    pub fn kafka_code(&self) -> Option<&str> {
        match self {
            Error::Kafka { code, .. } => Some(code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(class: ErrorClass) -> Error {
        Error::Kafka {
            operation: "commit_transaction".into(),
            code: "PRODUCER_FENCED".into(),
            message: "fenced".into(),
            class,
        }
    }

    #[test]
    fn classes_map_to_exactly_one_action() {
        let fatal = kafka(ErrorClass::Fatal);
        assert!(fatal.is_fatal() && !fatal.requires_abort() && !fatal.is_retriable());
        let abortable = kafka(ErrorClass::Abortable);
        assert!(abortable.requires_abort() && !abortable.is_fatal() && !abortable.is_retriable());
        let retriable = kafka(ErrorClass::Retriable);
        assert!(retriable.is_retriable() && !retriable.is_fatal() && !retriable.requires_abort());
    }

    #[test]
    fn message_names_the_call_the_code_and_the_action() {
        let text = kafka(ErrorClass::Fatal).to_string();
        assert_eq!(
            text,
            "commit_transaction failed: fenced (PRODUCER_FENCED); fatal: this client cannot go on"
        );
    }
}
