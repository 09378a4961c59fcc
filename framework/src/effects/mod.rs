//! Exactly-once side effects: a processor records *intents*, an executor applies them.
//!
//! A handler never calls the outside world inside its Kafka transaction: it calls
//! [`crate::Context::effect`], which writes an [`Intent`] to the operator's effects topic
//! (`<group>-effects`, with [`crate::EngineConfig::with_effects`]) in the batch's
//! transaction, with the outputs, state changes and offsets. So an intent exists exactly
//! once: an aborted batch takes its intents back, a duplicate event records none. Each
//! intent carries an **idempotency key** made of the operator, the event's ID (or, without
//! one, its input topic, partition and offset) and the effect's index within the record:
//! the same in every attempt, never random.
//!
//! An [`Executor`] is an onceflow processor of the effects topic (its own consumer group,
//! `<group>-effects-executor`, `read_committed`, scalable like any processor; start one
//! with [`executor`]). For each intent it calls the user's [`Effect::apply`] and records
//! the outcome in a transaction with the intent's offset: a result record (on a topic
//! the processor or another consumes, [`EffectResult`], whose event ID is the
//! idempotency key) and nothing else, so "charge, then record the charge" is two
//! processors and one effect.
//!
//! With the runner, `onceflow::run_with_effects(processor, effect)` gives one binary both
//! roles (setting `role`: `processor`, `effects` or `all`); `examples/examples/shop/` is
//! a whole flow built that way.
//!
//! # The guarantee
//!
//! - **Systems that honour an idempotency key** (payment APIs, most HTTP services with an
//!   `Idempotency-Key` header): an ambiguous outcome ([`Outcome::Ambiguous`]: a timeout,
//!   a 5xx, a connection lost) is tried again *with the same key*, with back-off, never
//!   assumed failed; after a crash the intents after the executor's committed offset are
//!   applied again, with the same keys. The outside system sees the effect once.
//! - **Systems that honour none** ([`Effect::checks_back`] is `true`): before an apply, the
//!   executor writes a *pending* marker for the key (`<executor group>-pending`, compacted,
//!   acknowledged by every in-sync replica before the apply starts). An intent whose key
//!   is pending was perhaps applied: the executor asks [`Effect::check`] (RocketMQ's
//!   `checkLocalTransaction`) and applies it only on [`Checked::NotDone`]. The marker is
//!   removed (a tombstone) in the transaction that records the result.
//! - **Bounded**: an intent that stays ambiguous, or whose check-back stays
//!   [`Checked::Unknown`], for [`Bounds`] (20 tries or 60 s by default) is dead-lettered on
//!   the executor's dead-letter topic (`<executor group>-dlq`) with the reason, an error
//!   log and `onceflow_effects_unresolved_total` — never dropped, never retried forever.
//!   [`Outcome::Refused`] (a definite "no", a 4xx) is dead-lettered at once.
//!
//! # Limits
//!
//! - An effect reaches the outside world *after* its batch commits, not with it.
//! - Check-back cannot fence a zombie: an executor cut off in the middle of an apply that
//!   lands after its successor checked the key back would apply it twice. Only an
//!   idempotency key closes that window; use one where the system offers it.
//! - Pending markers known to an instance are kept in memory from the partition's
//!   assignment (about 100 bytes each) and read again at every assignment.
//!
//! Metrics: `onceflow_effects_applied_total`, `_retried_total`, `_checked_back_total`,
//! `_unresolved_total` (all labelled `kind`), `onceflow_effects_pending` and the histogram
//! `onceflow_effect_apply_seconds`.

mod executor;
mod intent;

pub use crate::wire::{EFFECT_KIND_HEADER as KIND_HEADER, IDEMPOTENCY_KEY_HEADER};
pub use executor::{
    Bounds, Checked, Effect, EffectResult, Executor, Outcome, executor, executor_config,
};
pub use intent::Intent;
pub(crate) use intent::{RecordedAt, idempotency_key};
