//! The executor side of effects: an onceflow processor of the effects topic that applies
//! each intent through the user's [`Effect`] and records the outcome (see the module
//! [`crate::effects`] for the guarantee).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::intent::Intent;
use crate::wire::IDEMPOTENCY_KEY_HEADER;

use crate::kafka::{self, ClientOptions};
use crate::{Context, Engine, EngineConfig, Error, Event, OutputRecord, Processor, Result};

/// What an apply came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done (now, or before under the same key); the result, if any, is recorded.
    Applied(Option<serde_json::Value>),
    /// Not known whether it happened (a timeout, a 5xx, a connection lost): tried again
    /// with the same key, never assumed failed.
    Ambiguous(String),
    /// Refused for good (a 4xx): dead-lettered with the reason, not tried again.
    Refused(String),
}

/// What a check-back found.
#[derive(Debug, Clone, PartialEq)]
pub enum Checked {
    /// It happened; the result, if any, is recorded and the effect not applied again.
    Done(Option<serde_json::Value>),
    /// It did not happen: the executor applies it.
    NotDone,
    /// Cannot tell now: asked again later, within [`Bounds`].
    Unknown(String),
}

/// The user's side of the outside world.
#[crate::async_trait]
pub trait Effect: Send + 'static {
    /// A name for logs.
    fn name(&self) -> &str;

    /// Applies `intent`, handing `intent.idempotency_key` to the outside system.
    async fn apply(&mut self, intent: &Intent) -> Outcome;

    /// Whether the outside system honours no idempotency key, so that an intent that may
    /// have been applied is checked back ([`Effect::check`]) before it is applied again.
    /// Default `false`.
    fn checks_back(&self) -> bool {
        false
    }

    /// Whether the effect under `intent.idempotency_key` happened. Called only when
    /// [`Effect::checks_back`] is `true`, for an intent marked pending.
    async fn check(&mut self, intent: &Intent) -> Checked {
        let _ = intent;
        Checked::Unknown("this effect has no check-back".into())
    }
}

/// How long an intent may stay ambiguous or unknown before it is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Tries (applies and check-backs) at most.
    pub tries: u32,
    /// From the first try, at most.
    pub within: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            tries: 20,
            within: Duration::from_secs(60),
        }
    }
}

/// The record an executor writes for an applied effect: its event ID is the idempotency
/// key, so an onceflow processor of the results deduplicates them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectResult {
    /// The operator that recorded the intent.
    pub operator: String,
    /// The intent's kind.
    pub kind: String,
    /// The intent's ordering key (also the record's key).
    pub key: String,
    /// The intent's idempotency key.
    pub idempotency_key: String,
    /// What [`Outcome::Applied`] or [`Checked::Done`] carried.
    pub result: Option<serde_json::Value>,
    /// Whether a check-back found it done (rather than this executor applying it).
    pub checked_back: bool,
}

impl Event for EffectResult {
    fn event_id(&self) -> Option<String> {
        Some(self.idempotency_key.clone())
    }
}

/// The executor's engine configuration for the operator configured by `processor`:
/// group `<group>-effects-executor`, the effects topic as input, the same brokers,
/// security and state directory. Transient failures are retried by the executor's own
/// [`Bounds`], so the engine's budget is set wide.
pub fn executor_config(processor: &EngineConfig, instance_id: &str) -> Result<EngineConfig> {
    let effects = processor
        .effects_topic
        .clone()
        .ok_or_else(|| Error::Config {
            key: "effects_topic".into(),
            value: "(effects off)".into(),
            accepted: "a processor configuration with effects on (EngineConfig::with_effects)"
                .into(),
        })?;
    let mut config = EngineConfig::new(
        processor.bootstrap_servers.clone(),
        format!("{}-effects-executor", processor.group),
        instance_id,
        effects,
        processor.state_dir.clone(),
    )
    .retries(u32::MAX, Duration::from_secs(120));
    config.kafka_properties = processor.kafka_properties.clone();
    config.changelog_replication_factor = processor.changelog_replication_factor;
    Ok(config)
}

/// An engine ready to run `effect` as the executor `config` describes (see
/// [`executor_config`]), writing results to `results` when given (a topic that must
/// exist). Creates the pending-marker topic when the effect checks back. An executor
/// started before its processor waits for the effects topic the processor creates at
/// its first start (at most 2 minutes, logged), so the two can start in any order.
///
/// ```no_run
/// # async fn f(processor: onceflow::EngineConfig, effect: impl onceflow::effects::Effect) -> onceflow::Result<()> {
/// let config = onceflow::effects::executor_config(&processor, "executor-1")?;
/// let (engine, executor) = onceflow::effects::executor(config, effect, Some("charges")).await?;
/// engine.run(executor).await?;
/// # Ok(()) }
/// ```
pub async fn executor<E: Effect>(
    mut config: EngineConfig,
    effect: E,
    results: Option<&str>,
) -> Result<(Engine, Executor<E>)> {
    let options =
        ClientOptions::with_properties(&config.bootstrap_servers, &config.kafka_properties);
    wait_for_effects_topic(&options, &config.input_topic).await?;
    let pending_topic = if effect.checks_back() {
        let topic = format!("{}-pending", config.group);
        let partitions = kafka::partition_count(&options, &config.input_topic, TIMEOUT)
            .await?
            .ok_or_else(|| Error::Config {
                key: "input".into(),
                value: config.input_topic.clone(),
                accepted: "the effects topic, created by the processor's first start".into(),
            })?;
        let factor = config.changelog_replication_factor.map(|f| f.to_string());
        let mut configs = vec![("cleanup.policy", "compact")];
        if let Some(factor) = &factor {
            configs.push(("replication.factor", factor.as_str()));
        }
        kafka::ensure_topic(&options, &topic, partitions, &configs, TIMEOUT).await?;
        config = config.output(topic.clone());
        Some(topic)
    } else {
        None
    };
    if let Some(results) = results {
        config = config.output(results);
    }
    let executor = Executor {
        name: format!("effects:{}", effect.name()),
        effect,
        results: results.map(str::to_owned),
        pending: pending_topic.map(|topic| PendingMarkers {
            topic,
            options: options.clone(),
            known: BTreeMap::new(),
            stale: BTreeSet::new(),
            producer: None,
            wait: config.transaction_timeout * 2 + TIMEOUT,
        }),
        bounds: Bounds::default(),
        tries: HashMap::new(),
    };
    Ok((Engine::new(config)?, executor))
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// How long an executor started before its processor waits for the effects topic.
const EFFECTS_TOPIC_WAIT: Duration = Duration::from_secs(120);

/// Waits for the effects topic, bounded, with the wait logged once.
async fn wait_for_effects_topic(options: &ClientOptions, topic: &str) -> Result<()> {
    let started = Instant::now();
    let mut logged = false;
    loop {
        if kafka::partition_count(options, topic, TIMEOUT)
            .await?
            .is_some()
        {
            return Ok(());
        }
        if started.elapsed() > EFFECTS_TOPIC_WAIT {
            return Err(Error::Config {
                key: "effects_topic".into(),
                value: topic.to_owned(),
                accepted: format!(
                    "a topic that exists: none after {EFFECTS_TOPIC_WAIT:?}; the processor \
                     creates it at its first start (EngineConfig::with_effects)"
                ),
            });
        }
        if !logged {
            tracing::info!(%topic, "waiting for the effects topic (the processor creates it at its first start)");
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Applies the intents of an effects topic; see the [module](crate::effects).
pub struct Executor<E> {
    name: String,
    effect: E,
    results: Option<String>,
    pending: Option<PendingMarkers>,
    bounds: Bounds,
    /// Tries of the intents that are still unresolved, by idempotency key.
    tries: HashMap<String, (u32, Instant)>,
}

impl<E> std::fmt::Debug for Executor<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("name", &self.name)
            .field("results", &self.results)
            .field("bounds", &self.bounds)
            .finish_non_exhaustive()
    }
}

impl<E: Effect> Executor<E> {
    /// Another bound on unresolved intents than the default 20 tries or 60 s.
    pub fn bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Records the outcome: the result record and the pending marker's removal, in the
    /// batch's transaction.
    fn record(
        &mut self,
        intent: &Intent,
        result: Option<serde_json::Value>,
        checked_back: bool,
        ctx: &mut Context<'_>,
    ) -> Result<()> {
        if let Some(topic) = &self.results {
            let record = EffectResult {
                operator: intent.operator.clone(),
                kind: intent.kind.clone(),
                key: intent.key.clone(),
                idempotency_key: intent.idempotency_key.clone(),
                result,
                checked_back,
            };
            ctx.emit_record(
                topic,
                OutputRecord::json(&record)?
                    .key(intent.key.clone())
                    .header(IDEMPOTENCY_KEY_HEADER, intent.idempotency_key.clone()),
            )?;
        }
        if let Some(pending) = &self.pending {
            ctx.emit_record(
                &pending.topic,
                OutputRecord::tombstone()
                    .key(intent.idempotency_key.clone())
                    .partition(ctx.partition()),
            )?;
        }
        self.tries.remove(&intent.idempotency_key);
        Ok(())
    }

    /// Another try later, or, past the bounds, a dead letter with the reason.
    fn again(&mut self, intent: &Intent, why: String) -> Result<()> {
        let (tries, since) = self
            .tries
            .entry(intent.idempotency_key.clone())
            .or_insert((0, Instant::now()));
        *tries += 1;
        let (tries, since) = (*tries, *since);
        if tries < self.bounds.tries && since.elapsed() < self.bounds.within {
            metrics::counter!("onceflow_effects_retried_total", "kind" => intent.kind.clone())
                .increment(1);
            tracing::warn!(
                key = %intent.idempotency_key,
                kind = %intent.kind,
                tries,
                %why,
                "effect unresolved; trying again with the same key"
            );
            return Err(Error::transient(format!(
                "effect `{}` {}: {why}",
                intent.kind, intent.idempotency_key
            )));
        }
        self.tries.remove(&intent.idempotency_key);
        metrics::counter!("onceflow_effects_unresolved_total", "kind" => intent.kind.clone())
            .increment(1);
        tracing::error!(
            key = %intent.idempotency_key,
            kind = %intent.kind,
            tries,
            elapsed = ?since.elapsed(),
            %why,
            "effect unresolved past its bounds; dead-lettered for a person to resolve"
        );
        Err(Error::processing(format!(
            "effect `{}` {} unresolved after {tries} tries over {:?}: {why}",
            intent.kind,
            intent.idempotency_key,
            since.elapsed()
        )))
    }
}

#[crate::async_trait]
impl<E: Effect> Processor for Executor<E> {
    type Input = Intent;

    fn name(&self) -> &str {
        &self.name
    }

    fn partitions_assigned(&mut self, partitions: &[i32]) {
        // Another executor may have marked keys pending while they were elsewhere.
        if let Some(pending) = &mut self.pending {
            pending.stale.extend(partitions.iter().copied());
        }
    }

    async fn process(&mut self, intent: Intent, ctx: &mut Context<'_>) -> Result<()> {
        let partition = ctx.partition();
        if let Some(pending) = &mut self.pending {
            pending.load(partition).await?;
            if pending.contains(partition, &intent.idempotency_key) {
                metrics::counter!("onceflow_effects_checked_back_total", "kind" => intent.kind.clone())
                    .increment(1);
                match self.effect.check(&intent).await {
                    Checked::Done(result) => {
                        tracing::info!(key = %intent.idempotency_key, "check-back: done; not applied again");
                        return self.record(&intent, result, true, ctx);
                    }
                    Checked::NotDone => {
                        tracing::info!(key = %intent.idempotency_key, "check-back: not done; applying")
                    }
                    Checked::Unknown(why) => {
                        return self.again(&intent, format!("check-back unknown: {why}"));
                    }
                }
            } else {
                pending.mark(partition, &intent.idempotency_key).await?;
            }
        }
        let started = Instant::now();
        let outcome = self.effect.apply(&intent).await;
        metrics::histogram!("onceflow_effect_apply_seconds", "kind" => intent.kind.clone())
            .record(started.elapsed().as_secs_f64());
        match outcome {
            Outcome::Applied(result) => {
                // A crash here, between the apply and the record of it, is what the
                // check-back resolves (the tests crash a child process here).
                crate::crash::crash_point!("onceflow-effect-applied");
                metrics::counter!("onceflow_effects_applied_total", "kind" => intent.kind.clone())
                    .increment(1);
                self.record(&intent, result, false, ctx)
            }
            Outcome::Ambiguous(why) => self.again(&intent, why),
            Outcome::Refused(why) => {
                self.tries.remove(&intent.idempotency_key);
                Err(Error::processing(format!(
                    "effect `{}` {} refused: {why}",
                    intent.kind, intent.idempotency_key
                )))
            }
        }
    }
}

/// The pending markers of the partitions an executor owns.
struct PendingMarkers {
    topic: String,
    options: ClientOptions,
    /// Keys marked pending and not yet removed, per partition, as last read.
    known: BTreeMap<i32, BTreeSet<String>>,
    /// Partitions to read again before their next intent.
    stale: BTreeSet<i32>,
    producer: Option<kafka::Producer>,
    /// How long a read may wait for an open transaction on the topic.
    wait: Duration,
}

impl PendingMarkers {
    fn contains(&self, partition: i32, key: &str) -> bool {
        self.known
            .get(&partition)
            .is_some_and(|keys| keys.contains(key))
    }

    /// Reads partition `partition` of the marker topic to its end when it is stale or
    /// was never read: the keys whose last record is a marker, not a tombstone.
    async fn load(&mut self, partition: i32) -> Result<()> {
        if self.known.contains_key(&partition) && !self.stale.contains(&partition) {
            return Ok(());
        }
        let (options, topic, wait) = (self.options.clone(), self.topic.clone(), self.wait);
        let keys = crate::blocking::blocking("read the pending effects", move || {
            read_markers(&options, &topic, partition, wait)
        })
        .await
        .map_err(|error| Error::transient(format!("reading the pending effects: {error}")))?;
        metrics::gauge!("onceflow_effects_pending", "partition" => partition.to_string())
            .set(keys.len() as f64);
        tracing::info!(partition, pending = keys.len(), "pending effects read");
        self.known.insert(partition, keys);
        self.stale.remove(&partition);
        Ok(())
    }

    /// Marks `key` pending, acknowledged by every in-sync replica, before its apply.
    async fn mark(&mut self, partition: i32, key: &str) -> Result<()> {
        if self.producer.is_none() {
            self.producer = Some(kafka::Producer::idempotent(
                &self.options,
                kafka::Linger::Not,
            )?);
        }
        let producer = self.producer.as_ref().expect("created above");
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let value = format!("{{\"pending_since_ms\":{since}}}");
        let sent = producer
            .send_with_headers(
                &self.topic,
                Some(partition),
                Some(key.as_bytes()),
                Some(value.as_bytes()),
                &[],
                None,
            )
            .await;
        let landed = match sent {
            Ok(pending) => pending.landed().await.map(|_| ()),
            Err(error) => Err(error),
        };
        landed.map_err(|e| {
            Error::transient(format!(
                "marking effect {key} pending before its apply: {e}"
            ))
        })?;
        self.known
            .entry(partition)
            .or_default()
            .insert(key.to_owned());
        Ok(())
    }
}

/// The keys of `partition` whose last record is a marker, not a tombstone.
fn read_markers(
    options: &ClientOptions,
    topic: &str,
    partition: i32,
    wait: Duration,
) -> Result<BTreeSet<String>> {
    let mut keys = BTreeSet::new();
    kafka::read_partition_to_end(options, topic, partition, wait, |record| {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        if record.value.is_some() {
            keys.insert(key);
        } else {
            keys.remove(&key);
        }
        Ok(())
    })?;
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Never;

    #[crate::async_trait]
    impl Effect for Never {
        fn name(&self) -> &str {
            "never"
        }
        async fn apply(&mut self, _: &Intent) -> Outcome {
            Outcome::Ambiguous("no answer".into())
        }
    }

    #[test]
    fn an_unresolved_intent_is_tried_within_its_bounds_then_dead_lettered() {
        let mut executor = Executor {
            name: "effects:never".into(),
            effect: Never,
            results: None,
            pending: None,
            bounds: Bounds {
                tries: 3,
                within: Duration::from_secs(60),
            },
            tries: HashMap::new(),
        };
        let intent = Intent {
            operator: "billing".into(),
            kind: "charge".into(),
            key: "card-1".into(),
            idempotency_key: "billing/e-1/0".into(),
            payload: serde_json::Value::Null,
        };
        for _ in 0..2 {
            let error = executor.again(&intent, "HTTP 503".into()).unwrap_err();
            assert!(error.is_retriable(), "{error}");
        }
        let error = executor.again(&intent, "HTTP 503".into()).unwrap_err();
        assert!(!error.is_retriable(), "{error}");
        assert!(
            error.to_string().contains("unresolved after 3 tries"),
            "{error}"
        );
        // Dead-lettered: a later copy starts its count again.
        assert!(executor.tries.is_empty());
        let within = Bounds {
            tries: 100,
            within: Duration::ZERO,
        };
        let mut executor = executor.bounds(within);
        let error = executor.again(&intent, "HTTP 503".into()).unwrap_err();
        assert!(!error.is_retriable(), "past its time: {error}");
    }
}
