//! The processor a user writes, and the context it works through.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::effects::{Intent, RecordedAt, idempotency_key};
use crate::event::{Codec, Event, Json};
use crate::state::StateStore;
use crate::{Error, Result};

/// A stream processor: handles one decoded input event at a time.
///
/// Everything it does through the [`Context`] (emitting records, changing state) becomes
/// visible exactly once, atomically with the commit of the input's offset; if the batch
/// aborts, none of it happened, and the event is handed to `process` again.
///
/// ```
/// use onceflow::{Context, Event, Processor, Result};
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: String, customer: String, amount: i64 }
///
/// impl Event for Order {
///     fn event_id(&self) -> Option<String> { Some(self.id.clone()) }
/// }
///
/// struct Billing;
///
/// #[onceflow::async_trait]
/// impl Processor for Billing {
///     type Input = Order;
///     fn name(&self) -> &str { "billing" }
///     async fn process(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
///         let total = ctx.state().get::<i64>(&order.customer)?.unwrap_or(0) + order.amount;
///         ctx.state().put(&order.customer, &total)?;
///         ctx.emit("invoices", &order.customer, &serde_json::json!({ "order": order.id, "total": total }))
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an onceflow `Processor`",
    note = "add `#[derive(onceflow::Processor)]` with `#[processor(name = \"...\", input_type = ...)]` and an `async fn handle`, or implement `onceflow::Processor` with `#[onceflow::async_trait]`"
)]
#[async_trait]
pub trait Processor: Send + 'static {
    /// The decoded input event.
    type Input: Event + DeserializeOwned + Send + 'static;

    /// The processor's name, for logs and metrics.
    fn name(&self) -> &str;

    /// The topic it consumes, when the processor declares one (`#[derive(Processor)]`
    /// does). The engine refuses to start on a configuration naming another.
    fn input_topic(&self) -> Option<&str> {
        None
    }

    /// The version of the program the processor is part of, for `--version` and the
    /// start-up log: `#[derive(Processor)]` gives the deriving crate's version (its
    /// `Cargo.toml`'s). `None` by default.
    fn version(&self) -> Option<&str> {
        None
    }

    /// Topics it emits to, when the processor declares them (`#[derive(Processor)]` does);
    /// they are added to the configuration's outputs, and each must exist at start.
    fn output_topics(&self) -> &[&str] {
        &[]
    }

    /// Decodes an input record's value: JSON by default. Override it (or give
    /// `#[processor(codec = MyCodec)]`) to read another serde format; an error is the
    /// record's (class `decode`, dead-lettered per `on_error`).
    fn decode_input(&self, bytes: &[u8]) -> std::result::Result<Self::Input, String> {
        Json.decode(bytes)
    }

    /// Handles one event. A transient error ([`Error::transient`]) is tried again with
    /// backoff; a permanent one ([`Error::processing`]), a panic, or a transient one that
    /// outlasts its retries is handled per `EngineConfig::on_error`: dead-lettered (the
    /// default), skipped, or the instance stops. Nothing a failed attempt did through the
    /// context is kept. After a panic the same processor value goes on with the next
    /// event, so keep what must survive in [`Context::state`], not in `self`.
    async fn process(&mut self, input: Self::Input, ctx: &mut Context<'_>) -> Result<()>;

    /// Called when the instance was given `partitions`, after their state was restored
    /// and before any of their records is processed. A processor that keeps something
    /// per partition outside [`Context::state`] (a cache of another topic, say) must
    /// take it as stale here: while the partition was elsewhere, another instance may
    /// have changed what it stands for. The default does nothing.
    fn partitions_assigned(&mut self, partitions: &[i32]) {
        let _ = partitions;
    }

    /// Whether the processor uses timers ([`Context::schedule`]): then the engine keeps
    /// each partition's event time and fires due timers through [`Processor::on_timer`].
    /// `#[derive(Processor)]` says so for `timer = method`. The default is `false`: a
    /// processor that schedules timers without saying so is refused when it schedules.
    fn uses_timers(&self) -> bool {
        false
    }

    /// Handles a timer that is due, in the transaction that removes it: what it does
    /// through `ctx` (emit, change state, schedule again) commits with the removal, so a
    /// timer fires once. It runs with the state of `timer.partition`. An error is handled
    /// like a record's (per `on_error`: the timer is dead-lettered, as a record whose key
    /// is the timer's key, skipped, or the instance stops). The default does nothing.
    async fn on_timer(&mut self, timer: crate::Timer, ctx: &mut Context<'_>) -> Result<()> {
        let _ = (timer, ctx);
        Ok(())
    }
}

/// Where an input record came from.
#[derive(Debug, Clone)]
pub struct RecordMeta {
    /// Input topic.
    pub topic: String,
    /// Input partition: state and dedup are scoped to it.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Timestamp in milliseconds since the epoch, if the record has one.
    pub timestamp_ms: Option<i64>,
    /// Headers of the record.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The event ID used for dedup, if any.
    pub event_id: Option<String>,
}

/// A record the processor emitted, waiting for the batch's transaction.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub(crate) topic: String,
    /// `None`: the partitioner picks one from the key.
    pub(crate) partition: Option<i32>,
    pub(crate) key: Option<Vec<u8>>,
    /// `None`: a tombstone (on a compacted topic, the key's removal).
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
    pub(crate) timestamp_ms: Option<i64>,
}

impl Output {
    /// Bytes librdkafka counts against `message.max.bytes` (key, value and headers).
    pub(crate) fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.as_ref().map_or(0, Vec::len))
            .sum();
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len) + headers
    }
}

/// An output record with what a Kafka record can carry besides its key and value:
/// headers and its own timestamp, for [`Context::emit_record`].
///
/// ```
/// # fn f(ctx: &mut onceflow::Context<'_>) -> onceflow::Result<()> {
/// let invoice = onceflow::OutputRecord::json(&serde_json::json!({"total": 42}))?
///     .key("c17")
///     .header("trace-id", "4bf92f35")
///     .timestamp_ms(ctx.record().timestamp_ms.unwrap_or_default());
/// ctx.emit_record("invoices", invoice)
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct OutputRecord {
    partition: Option<i32>,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: Option<i64>,
}

impl OutputRecord {
    /// A record whose value is `value` as JSON.
    pub fn json<V: Serialize + ?Sized>(value: &V) -> Result<Self> {
        let value = Json.encode(value).map_err(|message| Error::Encode {
            what: "an output record".into(),
            message,
            cause: None,
        })?;
        Ok(Self::bytes(value))
    }

    /// A record whose value is these bytes.
    pub fn bytes(value: impl Into<Vec<u8>>) -> Self {
        OutputRecord {
            value: Some(value.into()),
            ..OutputRecord::default()
        }
    }

    /// A record with no value: on a compacted topic, the removal of its key.
    pub fn tombstone() -> Self {
        OutputRecord::default()
    }

    /// Sends it to partition `partition` instead of the one its key hashes to.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Sets the key (the partitioner hashes it: equal keys keep their order).
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a header (names may repeat; order is kept).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), Some(value.into())));
        self
    }

    /// Sets the record's timestamp, in milliseconds since the epoch (by default the
    /// producer's clock when it is sent), e.g. the input's event time.
    pub fn timestamp_ms(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = Some(timestamp_ms);
        self
    }
}

/// What a processor can do while handling one event.
pub struct Context<'a> {
    pub(crate) meta: &'a RecordMeta,
    /// The record's reads and writes of state.
    pub(crate) state: &'a mut dyn StateStore,
    pub(crate) outputs: &'a mut Vec<Output>,
    pub(crate) declared_outputs: &'a BTreeSet<String>,
    /// Declared output names renamed by the configuration → their topics.
    pub(crate) renamed_outputs: &'a BTreeMap<String, String>,
    /// Where [`Context::effect`] writes, `None` when effects are off.
    pub(crate) effects_topic: Option<&'a str>,
    /// The operator (its group), the first part of every idempotency key.
    pub(crate) operator: &'a str,
    /// Effects this attempt at the record recorded so far: the next one's index.
    pub(crate) effects_recorded: u32,
    /// The engine's clock when the batch started (ms since the epoch).
    pub(crate) now_ms: i64,
    /// Whether the processor said it uses timers ([`Processor::uses_timers`]).
    pub(crate) timers: bool,
    /// `timer_lateness`, in ms: event-time timers fire this far behind the event time.
    pub(crate) timer_lateness_ms: i64,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("meta", self.meta)
            .finish_non_exhaustive()
    }
}

/// An output topic a processor declared, as a constant `#[derive(Processor)]` generates
/// for each name in `outputs`: `outputs = ["invoices", "audit-log"]` gives
/// `Billing::INVOICES` and `Billing::AUDIT_LOG`. Emitting through the constant makes a
/// misspelt or undeclared output a compile error; a plain `&str` topic is checked when the
/// record is emitted ([`Error::UndeclaredOutput`]). The name is the declared one: a
/// configuration that renames the output (`--outputs invoices=prod.invoices`,
/// [`crate::EngineConfig::rename_output`]) sends what is emitted through it to its
/// configured topic, resolved when the record is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Topic(&'static str);

impl Topic {
    /// The declared name (the configuration may send it to a topic of another name).
    pub const fn name(self) -> &'static str {
        self.0
    }

    /// Used by the derive only: a `Topic` stands for a declared output.
    #[doc(hidden)]
    pub const fn __declared(name: &'static str) -> Self {
        Topic(name)
    }
}

impl AsRef<str> for Topic {
    fn as_ref(&self) -> &str {
        self.0
    }
}

impl std::fmt::Display for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// `value` as JSON for a record of `topic`.
fn encoded<V: Serialize + ?Sized>(topic: &str, value: &V) -> Result<Vec<u8>> {
    Json.encode(value).map_err(|message| Error::Encode {
        what: format!("a record for `{topic}`"),
        message,
        cause: None,
    })
}

impl Context<'_> {
    /// Emits `value` (as JSON) with `key` to `topic`, one of the declared outputs: a
    /// [`Topic`] constant of the processor (`Self::INVOICES`) or a topic name. A declared
    /// name the configuration renamed goes to its configured topic.
    pub fn emit<V: Serialize + ?Sized>(
        &mut self,
        topic: impl AsRef<str>,
        key: &str,
        value: &V,
    ) -> Result<()> {
        let topic = topic.as_ref();
        let value = encoded(topic, value)?;
        self.emit_bytes(topic, Some(key.as_bytes().to_vec()), value)
    }

    /// Emits `event` (as JSON) to `topic`, keyed by its own key ([`Event::key`]: the
    /// `#[event(key)]` field of `#[derive(Event)]`), so the key is said once, where the
    /// type is defined. An event without a key is emitted without one (the producer
    /// spreads such records over the partitions; use [`Context::emit`] to give one).
    ///
    /// ```
    /// # use onceflow::{Context, Event, Result};
    /// #[derive(Event, serde::Serialize)]
    /// struct Reserved {
    ///     #[event(id)]
    ///     order: String,
    ///     #[event(key)]
    ///     customer: String,
    /// }
    /// fn reserve(ctx: &mut Context<'_>, order: String, customer: String) -> Result<()> {
    ///     ctx.emit_event("reserved-orders", &Reserved { order, customer }) // keyed by customer
    /// }
    /// ```
    pub fn emit_event<V: Serialize + Event + ?Sized>(
        &mut self,
        topic: impl AsRef<str>,
        event: &V,
    ) -> Result<()> {
        let topic = topic.as_ref();
        let value = encoded(topic, event)?;
        self.emit_bytes(topic, event.key().map(String::into_bytes), value)
    }

    /// Emits `value` encoded by `codec` (instead of JSON) with `key` to `topic`.
    ///
    /// ```
    /// # use onceflow::{Codec, Context, Json, Result};
    /// # fn f(ctx: &mut Context<'_>) -> Result<()> {
    /// ctx.emit_with(&Json, "invoices", "c-1", &42) // any `Codec`: CBOR, MessagePack, …
    /// # }
    /// ```
    pub fn emit_with<C: Codec, V: Serialize + ?Sized>(
        &mut self,
        codec: &C,
        topic: impl AsRef<str>,
        key: &str,
        value: &V,
    ) -> Result<()> {
        let topic = topic.as_ref();
        let value = codec.encode(value).map_err(|message| Error::Encode {
            what: format!("a record for `{topic}`"),
            message,
            cause: None,
        })?;
        self.emit_bytes(topic, Some(key.as_bytes().to_vec()), value)
    }

    /// Emits raw bytes to `topic`, one of the declared outputs.
    pub fn emit_bytes(
        &mut self,
        topic: impl AsRef<str>,
        key: Option<Vec<u8>>,
        value: Vec<u8>,
    ) -> Result<()> {
        self.emit_record(
            topic,
            OutputRecord {
                key,
                value: Some(value),
                ..OutputRecord::default()
            },
        )
    }

    /// Emits `record`, with its headers and timestamp, to `topic`, one of the declared
    /// outputs.
    pub fn emit_record(&mut self, topic: impl AsRef<str>, record: OutputRecord) -> Result<()> {
        // A declared name the configuration renamed goes to its configured topic.
        let topic = topic.as_ref();
        let topic = self
            .renamed_outputs
            .get(topic)
            .map_or(topic, String::as_str);
        if !self.declared_outputs.contains(topic) {
            return Err(Error::UndeclaredOutput {
                topic: topic.to_owned(),
                declared: self
                    .declared_outputs
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        self.outputs.push(Output {
            topic: topic.to_owned(),
            partition: record.partition,
            key: record.key,
            value: record.value,
            headers: record.headers,
            timestamp_ms: record.timestamp_ms,
        });
        Ok(())
    }

    /// Records a side effect for an executor to apply after the batch commits, never in
    /// the handler itself: an *intent* (`kind`, `key`, `payload` as JSON) written to the
    /// operator's effects topic in the batch's transaction, with the outputs, state and
    /// offsets, so it exists exactly once however often the record is processed. `key`
    /// keeps order: effects of one key are applied in the order recorded. Each intent
    /// gets an idempotency key from the operator, the event's ID (or its input position)
    /// and the effect's index within the record, the same in every attempt; the
    /// executor hands it to the outside system. Needs
    /// [`crate::EngineConfig::with_effects`]; see [`crate::effects`] for the guarantee.
    ///
    /// ```
    /// # fn f(ctx: &mut onceflow::Context<'_>) -> onceflow::Result<()> {
    /// ctx.effect("charge", "card-17", &serde_json::json!({"cents": 1250}))
    /// # }
    /// ```
    pub fn effect<V: Serialize + ?Sized>(
        &mut self,
        kind: &str,
        key: &str,
        payload: &V,
    ) -> Result<()> {
        let Some(topic) = self.effects_topic else {
            return Err(Error::Usage {
                what: format!("recording effect `{kind}` with effects off"),
                fix: "turn effects on with EngineConfig::with_effects() (or the effects_topic \
                      setting)"
                    .into(),
            });
        };
        let index = self.effects_recorded;
        let at = RecordedAt {
            event_id: self.meta.event_id.as_deref(),
            topic: &self.meta.topic,
            partition: self.meta.partition,
            offset: self.meta.offset,
        };
        let idempotency_key = idempotency_key(self.operator, at, index);
        let intent = Intent::recorded(self.operator, kind, key, &idempotency_key, payload)?;
        let value = Json.encode(&intent).map_err(|message| Error::Encode {
            what: format!("an effect intent for `{topic}`"),
            message,
            cause: None,
        })?;
        self.effects_recorded += 1;
        self.outputs.push(Output {
            topic: topic.to_owned(),
            partition: None,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value),
            headers: vec![
                (
                    crate::wire::EFFECT_KIND_HEADER.to_owned(),
                    Some(kind.as_bytes().to_vec()),
                ),
                (
                    crate::wire::IDEMPOTENCY_KEY_HEADER.to_owned(),
                    Some(idempotency_key.into_bytes()),
                ),
            ],
            timestamp_ms: None,
        });
        Ok(())
    }

    /// The state of this input partition: reads see this batch's own writes.
    pub fn state(&mut self) -> State<'_> {
        State {
            partition: self.meta.partition,
            store: &mut *self.state,
        }
    }

    /// Where the event came from.
    pub fn record(&self) -> &RecordMeta {
        self.meta
    }

    /// Input partition.
    pub fn partition(&self) -> i32 {
        self.meta.partition
    }

    /// Input offset.
    pub fn offset(&self) -> i64 {
        self.meta.offset
    }

    /// The event ID used for dedup, if any.
    pub fn event_id(&self) -> Option<&str> {
        self.meta.event_id.as_deref()
    }

    /// The engine's wall clock when this batch started, in milliseconds since the epoch
    /// (the system's clock; in the test driver, the driver's).
    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// Schedules timer `key` of this input partition at `due_ms` by `clock`; a timer of
    /// the same key is moved. It is part of the partition's state: it commits with this
    /// batch (an aborted batch never scheduled it), survives restarts and moves with the
    /// partition. When due, [`Processor::on_timer`] gets it, once.
    ///
    /// ```
    /// # use onceflow::{Context, Result, TimerClock};
    /// # fn f(ctx: &mut Context<'_>, card: &str) -> Result<()> {
    /// // A minute of event time after this payment's timestamp.
    /// let at = ctx.record().timestamp_ms.unwrap_or(0) + 60_000;
    /// ctx.schedule(&format!("close/{card}"), TimerClock::EventTime, at)
    /// # }
    /// ```
    pub fn schedule(&mut self, key: &str, clock: crate::TimerClock, due_ms: i64) -> Result<()> {
        self.check_timers()?;
        crate::timers::schedule(&mut *self.state, self.meta.partition, key, clock, due_ms)
    }

    /// Schedules timer `key` `after` from now by the wall clock ([`Context::now_ms`]).
    pub fn schedule_after(&mut self, key: &str, after: std::time::Duration) -> Result<()> {
        let after = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
        let due = self.now_ms.saturating_add(after);
        self.schedule(key, crate::TimerClock::WallClock, due)
    }

    /// Cancels timer `key` of this input partition: whether it was scheduled.
    pub fn cancel(&mut self, key: &str) -> Result<bool> {
        self.check_timers()?;
        crate::timers::cancel(&mut *self.state, self.meta.partition, key)
    }

    /// When timer `key` of this partition is due, and by which clock, if scheduled.
    pub fn scheduled(&self, key: &str) -> Result<Option<(crate::TimerClock, i64)>> {
        crate::timers::scheduled(&*self.state, self.meta.partition, key)
    }

    /// This partition's event time: the highest record timestamp processed so far
    /// (this record's included), kept only for a processor that uses timers.
    pub fn event_time(&self) -> Result<Option<i64>> {
        crate::timers::event_time(&*self.state, self.meta.partition)
    }

    /// Up to where this partition's event-time timers fire: its event time minus
    /// `timer_lateness` (`None` before its first record with a timestamp). A timer due
    /// at or before it has fired, or fires right after this record.
    pub fn watermark(&self) -> Result<Option<i64>> {
        Ok(self
            .event_time()?
            .map(|at| at.saturating_sub(self.timer_lateness_ms)))
    }

    fn check_timers(&self) -> Result<()> {
        if self.timers {
            return Ok(());
        }
        Err(Error::Usage {
            what: "a timer of a processor that does not use timers".into(),
            fix: "implement `on_timer` and return true from `Processor::uses_timers` \
                  (`#[processor(timer = method)]` does both)"
                .into(),
        })
    }
}

/// Typed key-value state scoped to one input partition (values as JSON).
pub struct State<'a> {
    partition: i32,
    store: &'a mut dyn StateStore,
}

impl std::fmt::Debug for State<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

impl State<'_> {
    /// The value under `key`, if any.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        self.store
            .get(self.partition, key.as_bytes())?
            .map(|bytes| {
                Json.decode(&bytes).map_err(|message| Error::Encode {
                    what: format!("state `{key}` (stored value does not decode)"),
                    message,
                    cause: None,
                })
            })
            .transpose()
    }

    /// Sets `key` to `value`. Keys starting with `"\0onceflow/"` are the engine's (timers).
    pub fn put<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<()> {
        if key.starts_with(crate::timers::RESERVED) {
            return Err(Error::processing(format!(
                "state key {key:?} starts with {:?}, which onceflow keeps for its timers",
                crate::timers::RESERVED
            )));
        }
        let bytes = Json.encode(value).map_err(|message| Error::Encode {
            what: format!("state `{key}`"),
            message,
            cause: None,
        })?;
        self.store
            .put(self.partition, key.as_bytes().to_vec(), bytes);
        Ok(())
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: &str) {
        self.store.delete(self.partition, key.as_bytes().to_vec());
    }
}
