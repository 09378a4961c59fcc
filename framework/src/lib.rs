//! # onceflow
//!
//! Kafka stream processors whose effects happen exactly once: each batch of input is
//! processed in one Kafka transaction, in which outputs, changelog entries and consumer
//! offsets commit together, and each operator keeps a durable log of the event IDs it
//! processed so that duplicates from upstream are skipped even after a restart.
//!
//! - [`Processor`]: what you write, one async method per input event, working through a
//!   [`Context`] (emit records, typed per-partition state, the record's metadata);
//! - [`Event`]: an input's optional business ID, by which duplicates are recognised;
//! - [`Engine`]: runs one instance of an operator from an [`EngineConfig`];
//! - [`Error`], the one error type, which tells its caller whether a failure is worth
//!   retrying, needs the open transaction aborted, or is fatal;
//! - timers ([`Context::schedule`], [`Processor::on_timer`]) by the wall clock or by
//!   event time, and [`windows`]: tumbling and hopping windows with a grace period;
//! - [`effects`]: side effects (a payment API, a database) exactly once, recorded as
//!   intents in the batch's transaction and applied by an executor with idempotency keys
//!   and check-back;
//! - [`half`]: half messages for a service — published if and only if its local
//!   transaction committed, with a check-back when the sender died in between;
//! - `outbox` (feature `outbox`): a service's PostgreSQL rows and its Kafka messages in
//!   one database transaction, published once by a relay;
//! - [`testing`] (feature `testing`): a processor tested in milliseconds without a
//!   broker, by the engine's own code over an in-memory log with transactions;
//!
//! Tests against a real broker use the `onceflow-testkit` crate: Apache Kafka (one broker
//! or a three-node cluster with faults) started with testcontainers, and PostgreSQL.
//!
//! The precise guarantee and the architecture are in the guide (`docs/` of the
//! repository: "The guarantee and the fault model", "Design").
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "bench-internals")]
mod bench;
mod blocking;
mod clock;
mod config;
mod crash;
mod dlq;
pub mod effects;
mod engine;
mod error;
mod event;
pub mod half;
mod kafka;
#[cfg(feature = "outbox")]
pub mod outbox;
mod processor;
mod redact;
#[cfg(feature = "runner")]
mod runner;
mod state;
mod timers;
mod txlog;
pub mod windows;
mod wire;

#[cfg(feature = "testing")]
pub mod testing;
/// Without the `testing` feature the engine's unit tests still run over the in-memory
/// Kafka (`testing/kafka.rs`), without the driver around it.
#[cfg(all(test, not(feature = "testing")))]
mod testing {
    pub(crate) mod kafka;
}

pub use async_trait::async_trait;
pub use config::{DeliveryMode, EngineConfig, ErrorPolicy};
pub use dlq::{DeadLetterReplay, ReplaySummary};
pub use engine::{Engine, Phase, Shutdown, Stats, StatsSnapshot};
pub use error::{Cause, Error, ErrorClass, KafkaCode, Operation, Result, ResultExt};
pub use event::{Codec, Event, EventId, Json};
#[cfg(feature = "derive")]
pub use onceflow_macros::{Event, Processor};
pub use processor::{Context, OutputRecord, Processor, RecordMeta, State, Topic};
#[cfg(feature = "runner")]
pub use runner::{
    run, run_with_args, run_with_effects, run_with_effects_and_args, run_with_effects_and_settings,
    run_with_settings, run_with_settings_and_args,
};
pub use timers::{Timer, TimerClock};

/// The transaction log's hot path for the benchmark crate (feature `bench-internals`).
/// Not public API: it may change in any release.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod __bench {
    pub use crate::bench::{Overlay, TxLog};
}

/// What the derive macros expand to. Not public API: it may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::event::{Codec, Event, EventId};
    pub use crate::processor::{Context, Processor, Topic};
    pub use crate::timers::Timer;
    pub use crate::{Error, Result};
    pub use async_trait::async_trait;
    pub use std::option::Option;
    pub use std::result::Result as StdResult;
    pub use std::string::{String, ToString};
}

/// The README's code compiles (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// The guide's code compiles (`cargo test --doc`): every Rust block of a page is a
/// doctest. A page whose code is included from a compiled file instead (mdBook's
/// `{{#include}}`, as the tutorial's from `examples/`) is left out here;
/// `.ci/check-docs` checks that every page is one or the other.
#[cfg(doctest)]
mod guide {
    macro_rules! pages {
        ($($name:ident = $path:literal),* $(,)?) => {
            $(
                #[doc = include_str!(concat!("../../docs/src/", $path))]
                struct $name;
            )*
        };
    }
    pages! {
        Processors = "processors.md",
        Testing = "testing.md",
        KafkaStreams = "kafka-streams.md",
        Running = "running.md",
        Security = "security.md",
        Operations = "operations.md",
        Failures = "failures.md",
        Timers = "timers.md",
        Effects = "effects.md",
        Guarantee = "guarantee.md",
        Design = "design.md",
    }
}
