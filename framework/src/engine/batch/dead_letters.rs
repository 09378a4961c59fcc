//! The dead-letter record's contract, in one place: its error classes ([`FailureClass`])
//! and, for the reference pages, what each header and the record mean. How a batch
//! handles a record it cannot process (dead-lettered, skipped, or the instance stops,
//! per `on_error`) is `on_error.rs`; the header names are `wire.rs`'s.
//!
//! Invariants:
//! - A dead letter is written in the same transaction as its input's offset: it exists
//!   exactly once, and is never marked processed (a later copy of the event is processed).
//! - A dead letter never fails its batch for its size: a copy over the topic's limit goes
//!   without its value, saying so in `onceflow-value-omitted`.
//!
//! The reference pages `docs/src/reference/dead-letters.md` and `error-classes.md` are
//! rendered from `HEADERS`, `RECORD` and `FailureClass::meaning` (the test
//! `runner::reference` fails when they differ).

#[cfg(all(test, feature = "runner"))]
use crate::wire::{
    DLQ_AT, DLQ_ATTEMPTS, DLQ_ERROR_CLASS, DLQ_ERROR_MESSAGE, DLQ_PROCESSOR, DLQ_SOURCE_OFFSET,
    DLQ_SOURCE_PARTITION, DLQ_SOURCE_TIMESTAMP, DLQ_SOURCE_TOPIC, DLQ_TIMER, DLQ_VALUE_OMITTED,
};

/// A header of dead-letter records, for the reference page.
#[cfg(all(test, feature = "runner"))]
pub(crate) struct HeaderDoc {
    /// The header.
    pub(crate) name: &'static str,
    /// Which records carry it.
    pub(crate) on: &'static str,
    /// What its value is, in Markdown.
    pub(crate) meaning: &'static str,
}

/// Every `onceflow-*` header of dead-letter records, with what it holds. Values are UTF-8
/// text; numbers are decimal.
#[cfg(all(test, feature = "runner"))]
pub(crate) const HEADERS: &[HeaderDoc] = &[
    HeaderDoc {
        name: DLQ_ERROR_CLASS,
        on: "every dead letter",
        meaning: "Why the record could not be processed: one of the dead-letter error classes \
                  (`decode`, `permanent`, ...). `dlq replay --error-class` selects by it.",
    },
    HeaderDoc {
        name: DLQ_ERROR_MESSAGE,
        on: "every dead letter",
        meaning: "The error as onceflow reports it; for `Error::processing` and \
                  `Error::transient`, the processor's own words.",
    },
    HeaderDoc {
        name: DLQ_SOURCE_TOPIC,
        on: "every dead letter",
        meaning: "The topic the record was read from. `dlq replay` re-publishes to it.",
    },
    HeaderDoc {
        name: DLQ_SOURCE_PARTITION,
        on: "every dead letter",
        meaning: "The record's partition. `dlq replay` re-publishes to the same partition of \
                  the source topic (dedup and state are per input partition).",
    },
    HeaderDoc {
        name: DLQ_SOURCE_OFFSET,
        on: "every dead letter",
        meaning: "The record's offset; `-1` for a timer's dead letter.",
    },
    HeaderDoc {
        name: DLQ_SOURCE_TIMESTAMP,
        on: "every dead letter",
        meaning: "The record's timestamp, in milliseconds since the Unix epoch; empty when it \
                  had none. For a timer, its due time.",
    },
    HeaderDoc {
        name: DLQ_PROCESSOR,
        on: "every dead letter",
        meaning: "The processor's consumer group (`group`, by default the processor's name).",
    },
    HeaderDoc {
        name: DLQ_ATTEMPTS,
        on: "every dead letter",
        meaning: "The attempts made at the record: 1, or for `transient-exhausted` the attempts \
                  `max_attempts` and `max_retry_time` allowed.",
    },
    HeaderDoc {
        name: DLQ_AT,
        on: "every dead letter",
        meaning: "When it was dead-lettered, by the engine's clock, in milliseconds since the \
                  Unix epoch.",
    },
    HeaderDoc {
        name: DLQ_VALUE_OMITTED,
        on: "a dead letter over the topic's size limit",
        meaning: "The size of the record's value in bytes: the copy would have been over the \
                  dead-letter topic's limit, so its value was left out (null). The value is \
                  still at the source offset while that is retained; `dlq replay` passes such \
                  a letter over with a warning.",
    },
    HeaderDoc {
        name: DLQ_TIMER,
        on: "the dead letter of a failed timer",
        meaning: "The timer's key: `on_timer` failed or panicked. The record's key is the \
                  timer's key and its value the timer as JSON: `{\"timer\": key, \"due_ms\": \
                  ms, \"clock\": \"wall-clock\" or \"event-time\"}`.",
    },
    HeaderDoc {
        name: crate::wire::REPLAYED_FROM,
        on: "a record re-published by `dlq replay`",
        meaning: "`<dead-letter topic>/<partition>@<offset>`: the dead letter it was \
                  re-published from. The replay keeps the record's key, value and own headers \
                  (its event ID header among them, so a later copy of the event is still a \
                  duplicate) and drops the headers above, which dead-lettering added.",
    },
];

/// The dead-letter record, for the reference page: how it is made from the record that
/// failed (as `Batch::fail` makes it), in Markdown.
#[cfg(all(test, feature = "runner"))]
pub(crate) const RECORD: &[(&str, &str)] = &[
    (
        "key",
        "The failed record's key, byte for byte (none stays none). A timer's dead letter: the \
         timer's key.",
    ),
    (
        "value",
        "The failed record's value, byte for byte; left out (null) only when the copy would be \
         over the dead-letter topic's size limit, said in `onceflow-value-omitted`. A timer's \
         dead letter: the timer as JSON.",
    ),
    (
        "headers",
        "The failed record's own headers, byte for byte and in their order, then the \
         `onceflow-*` headers below.",
    ),
    (
        "topic",
        "`dead_letter_topic`, by default `<group>-dlq`, created at start if missing. The \
         effect executor's are on `<group>-effects-executor-dlq`.",
    ),
    (
        "partition and timestamp",
        "The producer's: the partitioner places it by key, and its timestamp is when it was \
         written (the record's own is in `onceflow-source-timestamp`).",
    ),
    (
        "when",
        "With the batch that handled the record: under `exactly-once` in the same transaction \
         as the record's offset, so it exists exactly once. Under `at-least-once` it is \
         acknowledged before the offset commits; under `at-most-once` it is sent after.",
    ),
    (
        "afterwards",
        "The record is not marked processed: a later copy of the same event (re-published by \
         `dlq replay` after a fix, or a duplicate) is processed like a new one.",
    ),
];
/// Why a record could not be processed: the `onceflow-error-class` of its dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureClass {
    /// The value does not decode into the processor's input type.
    Decode,
    /// The processor returned a permanent error.
    Permanent,
    /// The processor panicked.
    Panic,
    /// Transient failures outlasted `max_attempts` or `max_retry_time`.
    TransientExhausted,
    /// No event ID (or an empty one) while `require_event_id` is set.
    MissingEventId,
    /// An output over its topic's size limit.
    OutputTooLarge,
    /// A state value over the changelog's size limit.
    StateTooLarge,
    /// An event ID over the changelog's size limit.
    EventIdTooLarge,
    /// The broker refused a record it caused, for good.
    Rejected,
    /// Its transaction outlived `transaction_timeout` on its own.
    TransactionTimeout,
}

impl FailureClass {
    /// Every class, in the order the reference page lists them.
    #[cfg(all(test, feature = "runner"))]
    pub(crate) const ALL: [FailureClass; 10] = [
        FailureClass::Decode,
        FailureClass::Permanent,
        FailureClass::Panic,
        FailureClass::TransientExhausted,
        FailureClass::MissingEventId,
        FailureClass::OutputTooLarge,
        FailureClass::StateTooLarge,
        FailureClass::EventIdTooLarge,
        FailureClass::Rejected,
        FailureClass::TransactionTimeout,
    ];

    /// What a dead letter of this class means and what to do about it, in Markdown: the
    /// reference page (`docs/src/reference/error-classes.md`).
    #[cfg(all(test, feature = "runner"))]
    pub(crate) fn meaning(self) -> &'static str {
        match self {
            FailureClass::Decode => {
                "The value does not decode into the processor's input type (`Event`'s codec: \
                 JSON that does not match, bytes that are not JSON). Fix the type or the \
                 producer, then `dlq replay`."
            }
            FailureClass::Permanent => {
                "The processor returned an error that is neither transient nor fatal \
                 (`Error::processing`, or an output or state value that does not encode); a \
                 fatal one (`Error::is_fatal`) stops the instance instead. Also a timer whose `on_timer` failed (with \
                 an `onceflow-timer` header), a record late for every window it falls in \
                 (`onceflow::windows`, message `late for windows ...`, unless `drop_late`), \
                 and, in the effect executor, an intent refused or unresolved past its bounds."
            }
            FailureClass::Panic => {
                "The processor (`process` or `on_timer`) panicked. The panic was caught and \
                 the same processor value goes on, so keep what matters in `ctx.state()`."
            }
            FailureClass::TransientExhausted => {
                "The processor failed transiently (`Error::transient`) at every attempt that \
                 `max_attempts` and `max_retry_time` allowed."
            }
            FailureClass::MissingEventId => {
                "The record has no event ID (none, or an empty one) and `require_event_id` is \
                 set."
            }
            FailureClass::OutputTooLarge => {
                "An output is over its topic's `max.message.bytes` (read at start, less 512 \
                 bytes of batch framing) or the producer's `message.max.bytes`. None of the \
                 record's outputs entered the transaction."
            }
            FailureClass::StateTooLarge => {
                "A state value the record wrote is over the changelog topic's size limit."
            }
            FailureClass::EventIdTooLarge => {
                "The record's event ID is over the changelog topic's size limit (its dedup \
                 entry could not be written)."
            }
            FailureClass::Rejected => {
                "The broker refused, for good, a record this one caused once it was sent (an \
                 output topic whose `max.message.bytes` was lowered after start, a null key to \
                 a compacted topic, a topic deleted under the running instance). After two \
                 failed batches in a row the records go one per transaction, and the one that \
                 fails alone gets this class; the rest go on."
            }
            FailureClass::TransactionTimeout => {
                "Handling this record alone held its transaction open past \
                 `transaction_timeout`, and the coordinator aborted it (found one record per \
                 transaction, as `rejected`). A handler that slow needs a larger \
                 `transaction_timeout`."
            }
        }
    }
}

impl FailureClass {
    /// The class as written in `onceflow-error-class`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FailureClass::Decode => "decode",
            FailureClass::Permanent => "permanent",
            FailureClass::Panic => "panic",
            FailureClass::TransientExhausted => "transient-exhausted",
            FailureClass::MissingEventId => "missing-event-id",
            FailureClass::OutputTooLarge => "output-too-large",
            FailureClass::StateTooLarge => "state-too-large",
            FailureClass::EventIdTooLarge => "event-id-too-large",
            FailureClass::Rejected => "rejected",
            FailureClass::TransactionTimeout => "transaction-timeout",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
