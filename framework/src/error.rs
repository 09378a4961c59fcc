//! The crate's one error type.
//!
//! Every failure says what the caller should do next: retry the same call
//! ([`Error::is_retriable`]), abort the open transaction and rewind
//! ([`Error::requires_abort`]), or stop ([`Error::is_fatal`]). No rdkafka or redb type
//! appears here: a Kafka error carries its code as a [`KafkaCode`] (compared as a code,
//! shown as librdkafka's name) and the call as an [`Operation`].

use std::time::Duration;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error of a library onceflow called (the Kafka client, the state store, a codec,
/// the filesystem), kept as an [`Error`]'s [`source`](std::error::Error::source): its type
/// is not part of onceflow's API, but a caller may downcast to it.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kafka client call failed.
    #[error("{operation} failed: {message} ({code}){hint}", hint = class.hint())]
    Kafka {
        /// The call that failed, e.g. `commit_transaction` or `create topic orders`.
        operation: Operation,
        /// librdkafka's error code, e.g. `ProducerFenced` or `OperationTimedOut`.
        code: KafkaCode,
        /// librdkafka's description of the error.
        message: String,
        /// What the caller should do.
        class: ErrorClass,
        /// The Kafka client's own error, when there was one (the engine's in-memory Kafka
        /// and onceflow's own checks make Kafka errors without one).
        #[source]
        cause: Option<Cause>,
    },
    /// A call of the transactional producer did not return long after its own timeout
    /// (librdkafka's coordinator requests can ignore it, e.g. when the group coordinator
    /// died). The producer is abandoned and a new one takes the transactional ID.
    #[error(
        "{call} did not return within {after:?}, past its own timeout; the producer is replaced"
    )]
    ProducerStuck {
        /// The call, e.g. `send_offsets_to_transaction`.
        call: String,
        /// How long it was waited for.
        after: Duration,
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
    /// Work given up on purpose: the engine no longer waits for it (it stops, or joins
    /// the group again), and what it would still write is not written.
    #[error("{what} was given up: the engine no longer waits for it")]
    Cancelled {
        /// The work, e.g. `replay the changelog of partition 3`.
        what: String,
    },
    /// The processor's code uses onceflow in a way that cannot work: a timer scheduled by
    /// a processor that does not use timers, an effect recorded with effects off. The same
    /// code fails the same way on every record, so the instance stops with this (nothing
    /// of the batch is committed) instead of dead-lettering every record.
    #[error("{what} cannot work: {fix}")]
    Usage {
        /// What the code did.
        what: String,
        /// How to make it work.
        fix: String,
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
    /// The local state (the redb transaction log under the state directory) failed.
    #[error("state store at {path}: {message}")]
    State {
        /// The file or directory concerned.
        path: std::path::PathBuf,
        /// What went wrong, and what to do about it.
        message: String,
        /// The library's own error (redb's, the filesystem's, the codec's), when there
        /// was one.
        #[source]
        cause: Option<Cause>,
    },
    /// Data that should have been written by onceflow could not be read back: a changelog
    /// record or a state file entry of an unknown shape.
    #[error("corrupt {what}: {message}")]
    Corrupt {
        /// What was being read, e.g. `changelog record at orders-txlog/2@118`.
        what: String,
        /// What was wrong with it.
        message: String,
        /// The library's own error (redb's, the filesystem's, the codec's), when there
        /// was one.
        #[source]
        cause: Option<Cause>,
    },
    /// The processor could not handle a record ([`Error::processing`],
    /// [`Error::transient`]).
    #[error("processing failed{}: {message}", if *retriable { " (transient)" } else { "" })]
    Processing {
        /// What went wrong, in the processor's words.
        message: String,
        /// Whether trying the same record again may succeed.
        retriable: bool,
    },
    /// An input record could not be decoded into the processor's input type.
    #[error("cannot decode the record at {topic}/{partition}@{offset}: {message}")]
    Decode {
        /// Input topic.
        topic: String,
        /// Input partition.
        partition: i32,
        /// Input offset.
        offset: i64,
        /// The codec's explanation.
        message: String,
        /// The library's own error (redb's, the filesystem's, the codec's), when there
        /// was one.
        #[source]
        cause: Option<Cause>,
    },
    /// A value the processor emitted or stored could not be encoded or decoded.
    #[error("cannot encode {what}: {message}")]
    Encode {
        /// What was being encoded, e.g. `output to invoices`.
        what: String,
        /// The codec's explanation.
        message: String,
        /// The library's own error (redb's, the filesystem's, the codec's), when there
        /// was one.
        #[source]
        cause: Option<Cause>,
    },
    /// The processor emitted to a topic it did not declare as an output.
    #[error(
        "emitted to `{topic}`, which is not a declared output (declared: {declared}); \
         declare it with `EngineConfig::output`"
    )]
    UndeclaredOutput {
        /// The topic emitted to.
        topic: String,
        /// The declared outputs, comma-separated.
        declared: String,
    },
    /// A transaction of some producer has been open on a changelog partition for longer
    /// than the engine waits: the committed records after it stay hidden, so the
    /// partition's state cannot be known and its records are not processed.
    #[error(
        "changelog `{topic}` [{partition}]: a transaction has held the last stable offset at \
         {last_stable_offset} (high watermark {high_watermark}) for {waited:?}, longer than \
         transaction_timeout; find it with `kafka-transactions.sh --bootstrap-server … \
         find-hanging --topic {topic} --partition {partition}` and abort it, or wait for the \
         producer's transaction.timeout.ms"
    )]
    HangingTransaction {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Where the open transaction starts.
        last_stable_offset: i64,
        /// The partition's high watermark.
        high_watermark: i64,
        /// How long the engine waited.
        waited: Duration,
    },
    /// A changelog partition, read to its end, holds progress short of the group's
    /// committed offset of its input partition: processing on would start the
    /// partition's state and dedup entries from less than the committed batches left.
    #[error(
        "the changelog `{topic}` [{partition}] holds progress up to {progress:?}, short of the \
         group's committed offset {committed} of input partition {partition}: going on would \
         lose that partition's state and dedup entries of the batches in between. If the \
         group's offsets were moved on purpose (a reset, a switch from at-most-once), start \
         once with accept_changelog_behind = true"
    )]
    ChangelogBehind {
        /// The changelog topic.
        topic: String,
        /// The partition (of the changelog and of the input).
        partition: i32,
        /// The group's committed offset of the input partition.
        committed: i64,
        /// The input offset the changelog's progress records reach, if any.
        progress: Option<i64>,
    },
    /// The transaction coordinator aborted the batch's transaction because it was open
    /// longer than `transaction.timeout.ms` (the broker then fences the producer's
    /// epoch: librdkafka reports it as fenced, though no other instance exists).
    #[error(
        "the batch's transaction was open for {open_for:?}, longer than transaction_timeout \
         ({timeout:?}), and the coordinator aborted it ({detail}); nothing of it is visible. \
         A handler that takes this long on one record needs a larger transaction_timeout"
    )]
    TransactionTimedOut {
        /// How long the transaction had been open.
        open_for: Duration,
        /// The configured transaction timeout.
        timeout: Duration,
        /// The broker's error.
        detail: String,
    },
    /// Another instance with the same transactional ID took over: this one must stop.
    #[error(
        "fenced: another instance with {what} started (same group and instance ID), so this \
         one stopped without committing its open batch ({detail}); give every running \
         instance its own instance ID"
    )]
    Fenced {
        /// The identity the two instances share, e.g. transactional.id `billing-a`.
        what: String,
        /// The broker's error.
        detail: String,
    },
    /// The cluster refused this client's credentials: a wrong password, an unknown user,
    /// a mechanism it does not enable, or a client certificate it does not trust.
    #[error(
        "authentication failed as {principal}: {detail}; check sasl.username and sasl.password \
         (or the client certificate and key), sasl.mechanism and security.protocol"
    )]
    Authentication {
        /// Who the client tried to be, e.g. `User:alice`.
        principal: String,
        /// librdkafka's report.
        detail: String,
    },
    /// The cluster authenticated this client, but an ACL it needs is missing.
    #[error(
        "not authorized: {principal} lacks the ACL {acl} ({operation} failed: {detail}); \
         grant it (e.g. kafka-acls.sh --add --allow-principal {principal} …) and start again"
    )]
    Unauthorized {
        /// Who the broker saw, e.g. `User:alice` or the client certificate's subject.
        principal: String,
        /// The missing ACL: operation and resource, e.g. WRITE on topic `invoices`.
        acl: String,
        /// The call that was refused.
        operation: Operation,
        /// The broker's error.
        detail: String,
    },
    /// The broker answered in a way no Kafka error code describes (a delivery gone, no
    /// group metadata).
    #[error("{0}")]
    Broker(String),
    /// The outbox's database refused or failed a statement, or its relay found what it
    /// cannot go on from (feature `outbox`). The database's own error is kept as the
    /// cause ([`std::error::Error::source`]).
    #[error("outbox: {what}{}", cause.as_ref().map(|c| format!(": {c}")).unwrap_or_default())]
    Outbox {
        /// What failed, e.g. `the database` or `progress record relay-progress@12`.
        what: String,
        /// The error it failed with, if any.
        #[source]
        cause: Option<Cause>,
    },
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
    /// The broker or the client refused a record for good (too large, invalid for the
    /// topic, a topic that does not exist): sending the same record again fails the same
    /// way. The open transaction must be aborted, and the record found and dead-lettered.
    Rejected,
    /// Not classified by librdkafka: treat as a failure of this call only.
    Other,
}

impl ErrorClass {
    /// Every class, in the order the reference page lists them.
    #[cfg(all(test, feature = "runner"))]
    pub(crate) const ALL: [ErrorClass; 5] = [
        ErrorClass::Retriable,
        ErrorClass::Abortable,
        ErrorClass::Fatal,
        ErrorClass::Rejected,
        ErrorClass::Other,
    ];

    /// What the class means for a user, in Markdown: the reference page
    /// (`docs/src/reference/error-classes.md`).
    #[cfg(all(test, feature = "runner"))]
    pub(crate) fn meaning(self) -> &'static str {
        match self {
            ErrorClass::Retriable => {
                "The same call may be made again (a broker that is away for a moment, a request \
                 that timed out)."
            }
            ErrorClass::Abortable => {
                "The open transaction must be aborted; processing may then go on. The engine \
                 aborts, rewinds to the last committed offsets and processes the batch again: \
                 nothing of the aborted transaction is visible."
            }
            ErrorClass::Fatal => {
                "The client is unusable (for example fenced by a newer instance): the instance \
                 stops."
            }
            ErrorClass::Rejected => {
                "The broker or the client refused a record for good (too large, invalid for the \
                 topic, a topic that does not exist): sending it again fails the same way. The \
                 transaction is aborted, and the record that caused it is found and handled per \
                 `on_error` (dead-letter class `rejected`)."
            }
            ErrorClass::Other => "Not classified by librdkafka: a failure of this call only.",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            ErrorClass::Retriable => "; retriable",
            ErrorClass::Abortable => "; the transaction must be aborted",
            ErrorClass::Fatal => "; fatal: this client cannot go on",
            ErrorClass::Rejected => "; the record is refused for good",
            ErrorClass::Other => "",
        }
    }
}

/// A Kafka error code: the broker's protocol error code (a positive number) or
/// librdkafka's own (a negative one), with librdkafka's name for it. onceflow's own type:
/// the Kafka client library it is built on does not show through it.
#[derive(Debug, Clone, Copy)]
pub struct KafkaCode {
    number: Option<i32>,
    name: &'static str,
}

impl PartialEq for KafkaCode {
    fn eq(&self, other: &KafkaCode) -> bool {
        self.number == other.number
    }
}

impl Eq for KafkaCode {}

impl KafkaCode {
    /// A code librdkafka did not give (an error with no code).
    pub const UNKNOWN: KafkaCode = KafkaCode {
        number: None,
        name: "Unknown",
    };

    // The codes onceflow's own decisions name (the Kafka client layer classifies the
    // rest); `kafka/error.rs` checks each against librdkafka's number and name.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) const MESSAGE_SIZE_TOO_LARGE: KafkaCode = KafkaCode::new(10, "MessageSizeTooLarge");
    pub(crate) const REQUEST_TIMED_OUT: KafkaCode = KafkaCode::new(7, "RequestTimedOut");
    #[cfg(any(test, feature = "testing"))]
    pub(crate) const ILLEGAL_GENERATION: KafkaCode = KafkaCode::new(22, "IllegalGeneration");
    pub(crate) const TOPIC_ALREADY_EXISTS: KafkaCode = KafkaCode::new(36, "TopicAlreadyExists");
    pub(crate) const OUT_OF_ORDER_SEQUENCE_NUMBER: KafkaCode =
        KafkaCode::new(45, "OutOfOrderSequenceNumber");
    #[cfg(any(test, feature = "testing"))]
    pub(crate) const INVALID_PRODUCER_EPOCH: KafkaCode = KafkaCode::new(47, "InvalidProducerEpoch");
    pub(crate) const INVALID_TRANSACTIONAL_STATE: KafkaCode =
        KafkaCode::new(48, "InvalidTransactionalState");
    pub(crate) const UNKNOWN_PRODUCER_ID: KafkaCode = KafkaCode::new(59, "UnknownProducerId");
    #[cfg(any(test, feature = "testing"))]
    pub(crate) const UNSTABLE_OFFSET_COMMIT: KafkaCode = KafkaCode::new(88, "UnstableOffsetCommit");
    #[cfg(test)]
    pub(crate) const PRODUCER_FENCED: KafkaCode = KafkaCode::new(90, "ProducerFenced");
    pub(crate) const FATAL: KafkaCode = KafkaCode::new(-150, "Fatal");
    pub(crate) const OPERATION_TIMED_OUT: KafkaCode = KafkaCode::new(-185, "OperationTimedOut");
    pub(crate) const MESSAGE_TIMED_OUT: KafkaCode = KafkaCode::new(-192, "MessageTimedOut");

    /// Every code named above, for the check against librdkafka's.
    #[cfg(test)]
    pub(crate) const NAMED: [KafkaCode; 13] = [
        KafkaCode::MESSAGE_SIZE_TOO_LARGE,
        KafkaCode::REQUEST_TIMED_OUT,
        KafkaCode::ILLEGAL_GENERATION,
        KafkaCode::TOPIC_ALREADY_EXISTS,
        KafkaCode::OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaCode::INVALID_PRODUCER_EPOCH,
        KafkaCode::INVALID_TRANSACTIONAL_STATE,
        KafkaCode::UNKNOWN_PRODUCER_ID,
        KafkaCode::UNSTABLE_OFFSET_COMMIT,
        KafkaCode::PRODUCER_FENCED,
        KafkaCode::FATAL,
        KafkaCode::OPERATION_TIMED_OUT,
        KafkaCode::MESSAGE_TIMED_OUT,
    ];

    /// The code numbered `number`, named `name` (the Kafka client layer makes them).
    pub(crate) const fn new(number: i32, name: &'static str) -> KafkaCode {
        KafkaCode {
            number: Some(number),
            name,
        }
    }

    /// librdkafka's name for the code, e.g. `ProducerFenced`.
    pub fn name(&self) -> String {
        self.name.to_owned()
    }

    /// The code's number: Kafka's protocol error code when positive, librdkafka's own
    /// when negative; `None` for [`KafkaCode::UNKNOWN`].
    pub fn number(&self) -> Option<i32> {
        self.number
    }
}

impl std::fmt::Display for KafkaCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The Kafka call that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// Producing a record to a topic.
    Produce {
        /// The topic.
        topic: String,
    },
    /// Creating a topic.
    CreateTopic {
        /// The topic.
        topic: String,
    },
    /// Consuming from a topic (a poll).
    Consume {
        /// The topic.
        topic: String,
    },
    /// Any other call, described, e.g. `commit_transaction`.
    Other(String),
}

impl Operation {
    pub(crate) fn produce(topic: impl Into<String>) -> Self {
        Operation::Produce {
            topic: topic.into(),
        }
    }

    pub(crate) fn create_topic(topic: impl Into<String>) -> Self {
        Operation::CreateTopic {
            topic: topic.into(),
        }
    }

    /// The topic the call named, if it named one.
    pub fn topic(&self) -> Option<&str> {
        match self {
            Operation::Produce { topic }
            | Operation::CreateTopic { topic }
            | Operation::Consume { topic } => Some(topic),
            Operation::Other(text) => {
                // A described call names its topic in backquotes.
                let start = text.find('`')? + 1;
                let end = text[start..].find('`')? + start;
                Some(&text[start..end])
            }
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operation::Produce { topic } => write!(f, "produce to `{topic}`"),
            Operation::CreateTopic { topic } => write!(f, "create topic `{topic}`"),
            Operation::Consume { topic } => write!(f, "consume `{topic}`"),
            Operation::Other(text) => f.write_str(text),
        }
    }
}

impl From<String> for Operation {
    fn from(text: String) -> Self {
        Operation::Other(text)
    }
}

impl From<&str> for Operation {
    fn from(text: &str) -> Self {
        Operation::Other(text.to_owned())
    }
}

impl From<&Operation> for Operation {
    fn from(operation: &Operation) -> Self {
        operation.clone()
    }
}

impl From<&String> for Operation {
    fn from(text: &String) -> Self {
        Operation::Other(text.clone())
    }
}

impl Error {
    /// A permanent failure of the processor on one record.
    pub fn processing(message: impl std::fmt::Display) -> Self {
        Error::Processing {
            message: message.to_string(),
            retriable: false,
        }
    }

    /// A transient failure of the processor on one record: trying again may succeed.
    pub fn transient(message: impl std::fmt::Display) -> Self {
        Error::Processing {
            message: message.to_string(),
            retriable: true,
        }
    }

    /// The same call may succeed if made again.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Error::Kafka {
                class: ErrorClass::Retriable,
                ..
            } | Error::Timeout { .. }
                | Error::Processing {
                    retriable: true,
                    ..
                }
        )
    }

    /// A request that timed out on the client (the call's own timeout, a request's, or a
    /// record's delivery): the broker may still act on it later.
    pub(crate) fn timed_out_request(&self) -> bool {
        matches!(self, Error::Timeout { .. })
            || [
                KafkaCode::OPERATION_TIMED_OUT,
                KafkaCode::REQUEST_TIMED_OUT,
                KafkaCode::MESSAGE_TIMED_OUT,
            ]
            .into_iter()
            .any(|code| self.has_code(code))
    }

    /// The open Kafka transaction must be aborted before processing can go on.
    pub fn requires_abort(&self) -> bool {
        matches!(
            self,
            Error::Kafka {
                class: ErrorClass::Abortable | ErrorClass::Rejected,
                ..
            }
        )
    }

    /// A record was refused for good: sending it again fails the same way.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self,
            Error::Kafka {
                class: ErrorClass::Rejected,
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
                | Error::Usage { .. }
                | Error::State { .. }
                | Error::Fenced { .. }
                | Error::UndeclaredOutput { .. }
                | Error::Authentication { .. }
                | Error::Unauthorized { .. }
        )
    }

    /// The code of a Kafka error.
    pub fn kafka_code(&self) -> Option<KafkaCode> {
        match self {
            Error::Kafka { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether this is a Kafka error with `code`.
    pub(crate) fn has_code(&self, code: KafkaCode) -> bool {
        self.kafka_code() == Some(code)
    }
}

/// Turns any failure of a handler's own work into an [`Error`] that says whether trying
/// the record again may help, so `?` works on it:
///
/// ```
/// use onceflow::{ResultExt, Result};
///
/// fn amount(text: &str) -> Result<i64> {
///     text.parse::<i64>().permanent() // bad data: dead-lettered at once
/// }
/// assert!(amount("12").is_ok());
/// let error = amount("twelve").unwrap_err();
/// assert!(!error.is_retriable());
/// assert!(error.to_string().contains("invalid digit"));
/// ```
///
/// A transient failure (a database that is restarting, a timeout) is retried with
/// back-off (`max_attempts`, `max_retry_time`) before the record is dead-lettered; a
/// permanent one is handled per `on_error` at once. A failure converted with `?` alone
/// (from a `serde_json::Error`, or a boxed error) is permanent: when in doubt, a dead
/// letter keeps the record, and `dlq replay` brings it back.
pub trait ResultExt<T> {
    /// A failure that will not go away by trying the same record again.
    fn permanent(self) -> Result<T>;
    /// A failure that trying the same record again may get past.
    fn transient(self) -> Result<T>;
}

impl<T, E> ResultExt<T> for std::result::Result<T, E>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn permanent(self) -> Result<T> {
        self.map_err(|error| Error::processing(chain(error.into().as_ref())))
    }

    fn transient(self) -> Result<T> {
        self.map_err(|error| Error::transient(chain(error.into().as_ref())))
    }
}

/// An error and its causes, as one line.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A JSON value the handler could not read or write: permanent (the same bytes fail the
/// same way).
impl From<serde_json::Error> for Error {
    fn from(error: serde_json::Error) -> Self {
        Error::processing(format!("JSON: {error}"))
    }
}

/// Any other failure given to `?` as a boxed error: permanent ([`ResultExt`] says which).
impl From<Box<dyn std::error::Error + Send + Sync>> for Error {
    fn from(error: Box<dyn std::error::Error + Send + Sync>) -> Self {
        Error::processing(chain(error.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(class: ErrorClass) -> Error {
        Error::Kafka {
            operation: "commit_transaction".into(),
            code: KafkaCode::PRODUCER_FENCED,
            message: "fenced".into(),
            class,
            cause: None,
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
    fn fencing_bad_configuration_and_a_broken_state_store_are_fatal() {
        let fenced = Error::Fenced {
            what: "transactional.id `g-a`".into(),
            detail: "x".into(),
        };
        assert!(fenced.is_fatal() && !fenced.requires_abort() && !fenced.is_retriable());
        let state = Error::State {
            path: "/tmp/x".into(),
            message: "locked".into(),
            cause: None,
        };
        assert!(state.is_fatal());
        assert!(Error::transient("busy").is_retriable());
        assert!(!Error::processing("bad").is_retriable() && !Error::processing("bad").is_fatal());
    }

    #[test]
    fn message_names_the_call_the_code_and_the_action() {
        let text = kafka(ErrorClass::Fatal).to_string();
        assert_eq!(
            text,
            "commit_transaction failed: fenced (ProducerFenced); fatal: this client cannot go on"
        );
    }

    #[test]
    fn a_handlers_own_failure_converts_with_its_causes_and_its_kind() {
        #[derive(Debug, thiserror::Error)]
        #[error("the ledger refused")]
        struct Refused(#[source] std::io::Error);
        let failed: std::result::Result<(), Refused> =
            Err(Refused(std::io::Error::other("disk full")));
        let error = failed.transient().unwrap_err();
        assert!(error.is_retriable());
        assert_eq!(
            error.to_string(),
            "processing failed (transient): the ledger refused: disk full"
        );
        let error = "x".parse::<u8>().permanent().unwrap_err();
        assert!(!error.is_retriable() && !error.is_fatal());

        fn read(text: &str) -> Result<u8> {
            Ok(serde_json::from_str::<u8>(text)?)
        }
        let error = read("\"a\"").unwrap_err();
        assert!(!error.is_retriable());
        assert!(
            error
                .to_string()
                .starts_with("processing failed: JSON: invalid type")
        );
        let boxed: Box<dyn std::error::Error + Send + Sync> = "no such customer".into();
        assert_eq!(
            Error::from(boxed).to_string(),
            "processing failed: no such customer"
        );
    }
}
