//! The names onceflow writes on the wire, in one place: the headers it puts on records
//! (dead letters, event IDs, side-effect intents), the keys of its changelog records and
//! the state keys it reserves. A name here is a contract with what reads it (another
//! version of onceflow, `dlq replay`, a consumer downstream): it is never renamed.
//!
//! A leaf: it imports nothing, so every module may use it.

/// The header a record's event ID is read from, by default (`EngineConfig::event_id_header`),
/// and that the outbox relay and half messages write.
pub const EVENT_ID_HEADER: &str = "onceflow-event-id";

/// Header of a half message: the topic it is for.
pub const HALF_TOPIC_HEADER: &str = "onceflow-half-topic";
/// Header of a half message: the key it will have (absent: none).
pub const HALF_KEY_HEADER: &str = "onceflow-half-key";

/// Header of a side-effect intent record: its kind.
pub const EFFECT_KIND_HEADER: &str = "onceflow-effect-kind";
/// Header of a side-effect intent and of its result: the idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "onceflow-idempotency-key";

// The headers a dead letter carries besides its record's own (their meaning is in
// `engine::batch::dead_letters::HEADERS`, rendered to the reference page).
pub(crate) const DLQ_ERROR_CLASS: &str = "onceflow-error-class";
pub(crate) const DLQ_ERROR_MESSAGE: &str = "onceflow-error-message";
pub(crate) const DLQ_SOURCE_TOPIC: &str = "onceflow-source-topic";
pub(crate) const DLQ_SOURCE_PARTITION: &str = "onceflow-source-partition";
pub(crate) const DLQ_SOURCE_OFFSET: &str = "onceflow-source-offset";
pub(crate) const DLQ_SOURCE_TIMESTAMP: &str = "onceflow-source-timestamp";
pub(crate) const DLQ_PROCESSOR: &str = "onceflow-processor";
pub(crate) const DLQ_ATTEMPTS: &str = "onceflow-attempts";
pub(crate) const DLQ_AT: &str = "onceflow-dead-lettered-at";
/// Set (to the value's size in bytes) when the record's value was left out of its dead
/// letter because the copy would be over the topic's size limit; the value is still in
/// the source topic at the source offset, while that is retained.
pub(crate) const DLQ_VALUE_OMITTED: &str = "onceflow-value-omitted";
/// Set (to the timer's key) on the dead letter of a timer whose `on_timer` failed.
pub(crate) const DLQ_TIMER: &str = "onceflow-timer";
/// Set by `dlq replay` on a record it re-published: the dead letter it came from.
pub(crate) const REPLAYED_FROM: &str = "onceflow-replayed-from";

/// The headers dead-lettering adds to a record, and an earlier replay's mark: dropped when
/// the record is re-published. Every other header is the original record's and goes with
/// it, the event ID header above all: dropping it (as every `onceflow-*` header once was)
/// made the re-published record one without an ID, processed without a dedup entry, so a
/// later copy of the same event was processed again.
pub(crate) const DEAD_LETTER_HEADERS: &[&str] = &[
    DLQ_ERROR_CLASS,
    DLQ_ERROR_MESSAGE,
    DLQ_SOURCE_TOPIC,
    DLQ_SOURCE_PARTITION,
    DLQ_SOURCE_OFFSET,
    DLQ_SOURCE_TIMESTAMP,
    DLQ_PROCESSOR,
    DLQ_ATTEMPTS,
    DLQ_AT,
    DLQ_VALUE_OMITTED,
    DLQ_TIMER,
    REPLAYED_FROM,
];

/// The key of the record the fence probe (`Producer::probe_fenced`) sends to a
/// topic onceflow owns, in a transaction it then aborts.
pub(crate) const FENCE_PROBE_KEY: &[u8] = b"onceflow-fence-probe";

// The changelog's record keys. It is compacted, so every change maps to the key it
// overwrites (see `txlog::change`).
/// Key prefix of dedup entries (`Processed` and `Expired`): `e:<event ID>`.
pub(crate) const CHANGELOG_EVENT_PREFIX: &[u8] = b"e:";
/// Key prefix of state: `s:<state key>`.
pub(crate) const CHANGELOG_STATE_PREFIX: &[u8] = b"s:";
/// Key of the progress record: the input offset the batches so far reached.
pub(crate) const CHANGELOG_PROGRESS_KEY: &[u8] = b"p:";

/// Every state key the engine keeps for itself (timers, event time) starts with this; a
/// processor's own state keys may not.
pub(crate) const RESERVED_STATE_PREFIX: &str = "\0onceflow/";
