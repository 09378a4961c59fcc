//! Start-up checks: the topics exist (onceflow's own are created, durable and compacted)
//! and the size limits of every topic the engine writes. That the transaction log mirrors
//! the changelog that exists now (by its topic ID) is `changelog.rs`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{EngineConfig, ErrorPolicy};
use crate::kafka::{self, ClientOptions};
use crate::txlog::TxLog;
use crate::{Error, Result};

const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// Checks the topics before anything is consumed: the input and outputs exist, and the
/// changelog exists with as many partitions as the input (it is created when missing).
/// Returns the input's partition count.
pub(crate) async fn check_topics(options: &ClientOptions, config: &EngineConfig) -> Result<i32> {
    let input = &config.input_topic;
    let partitions = settled_partition_count(options, input)
        .await?
        .ok_or_else(|| Error::Config {
            key: "input".into(),
            value: input.clone(),
            accepted: "an existing topic (create it first; onceflow does not create inputs)".into(),
        })?;
    for output in &config.output_topics {
        if settled_partition_count(options, output).await?.is_none() {
            return Err(Error::Config {
                key: "outputs".into(),
                value: output.clone(),
                accepted:
                    "existing topics (create it first: records to a missing topic would be lost)"
                        .into(),
            });
        }
        // A committed output lost with a broker is lost for good: say so at start.
        warn_if_not_durable(
            options,
            output,
            "outputs are your topics: alter or recreate them with 3 replicas and \
             min.insync.replicas 2",
        )
        .await?;
    }
    let changelog = config.changelog_topic();
    let factor = config.changelog_replication_factor.map(|f| f.to_string());
    let mut changelog_configs = vec![("cleanup.policy", "compact")];
    let mut dead_letter_configs = Vec::new();
    if let Some(factor) = &factor {
        changelog_configs.push(("replication.factor", factor.as_str()));
        dead_letter_configs.push(("replication.factor", factor.as_str()));
    }
    match kafka::partition_count(options, &changelog, METADATA_TIMEOUT).await? {
        Some(found) if found == partitions => {
            // Deletion would drop dedup entries and state that are still in use.
            let policy = cleanup_policy(options, &changelog).await?;
            if !policy.split(',').any(|p| p.trim() == "compact") {
                return Err(Error::Config {
                    key: "changelog_topic".into(),
                    value: changelog.clone(),
                    accepted: format!(
                        "a compacted topic, but its cleanup.policy is `{policy}`: retention would \
                         delete dedup entries and state still in use; set cleanup.policy=compact \
                         on it (kafka-configs.sh --alter --add-config cleanup.policy=compact)"
                    ),
                });
            }
        }
        Some(found) => {
            return Err(Error::Config {
                key: "changelog_topic".into(),
                value: changelog.clone(),
                accepted: format!(
                    "a topic with {partitions} partitions like input `{input}`, but it has {found}; \
                     delete it (it is rebuilt from nothing only if the state may be lost) or set \
                     changelog_topic"
                ),
            });
        }
        None => create(options, &changelog, partitions, &changelog_configs).await?,
    }
    warn_if_not_durable(options, &changelog, OWN_TOPIC_FIX).await?;
    if config.on_error == ErrorPolicy::DeadLetter {
        let dead_letters = config.dead_letter_topic();
        if kafka::partition_count(options, &dead_letters, METADATA_TIMEOUT)
            .await?
            .is_none()
        {
            create(options, &dead_letters, partitions, &dead_letter_configs).await?;
        }
        warn_if_not_durable(options, &dead_letters, OWN_TOPIC_FIX).await?;
    }
    if let Some(effects) = &config.effects_topic {
        // Keyed like the input, so an executor keeps each key's effects in order; as many
        // partitions, so it scales as far as the processor does.
        if kafka::partition_count(options, effects, METADATA_TIMEOUT)
            .await?
            .is_none()
        {
            create(options, effects, partitions, &dead_letter_configs).await?;
        }
        warn_if_not_durable(options, effects, OWN_TOPIC_FIX).await?;
    }
    Ok(partitions)
}

/// How to make one of onceflow's own topics durable.
const OWN_TOPIC_FIX: &str = "set changelog_replication_factor, or the broker's \
                             default.replication.factor and min.insync.replicas";

/// How often, and how far apart, a topic the configuration names is looked for before it
/// is taken for missing.
const LOOK_FOR_TOPIC: (u32, Duration) = (10, Duration::from_millis(500));

/// The partition count of a topic the configuration names, `None` when it is missing. A
/// topic created a moment ago is not yet known to every broker (on a three-node cluster a
/// test saw an instance started right after its output was created stop with "create it
/// first"): it is looked for again, for up to 5 s, before it is taken for missing.
async fn settled_partition_count(options: &ClientOptions, topic: &str) -> Result<Option<i32>> {
    let (times, pause) = LOOK_FOR_TOPIC;
    for _ in 1..times {
        if let Some(partitions) = kafka::partition_count(options, topic, METADATA_TIMEOUT).await? {
            return Ok(Some(partitions));
        }
        tracing::debug!(topic, "topic not found; looking again");
        tokio::time::sleep(pause).await;
    }
    kafka::partition_count(options, topic, METADATA_TIMEOUT).await
}

/// Warns when `topic` would lose committed records with one broker: fewer than 3
/// replicas, or `min.insync.replicas` below 2. Fine on a one-broker test cluster, not in
/// production: the changelog holds the dedup log and the state.
async fn warn_if_not_durable(options: &ClientOptions, topic: &str, fix: &str) -> Result<()> {
    let replicas = kafka::replica_count(options, topic, METADATA_TIMEOUT).await?;
    let min_isr = kafka::topic_config(options, topic, "min.insync.replicas", METADATA_TIMEOUT)
        .await?
        .and_then(|v| v.parse::<usize>().ok());
    if replicas.is_some_and(|r| r < 3) || min_isr.is_some_and(|m| m < 2) {
        tracing::warn!(
            topic,
            replicas = ?replicas,
            min_insync_replicas = ?min_isr,
            "topic is not durable against a broker failure (want 3 replicas and \
             min.insync.replicas 2; {fix})"
        );
    }
    Ok(())
}

/// Creates a topic onceflow owns; another instance creating it at the same moment is fine.
async fn create(
    options: &ClientOptions,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<()> {
    tracing::info!(topic, partitions, "creating topic");
    match kafka::create_topic(options, topic, partitions, configs, METADATA_TIMEOUT).await {
        Err(error) if error.has_code(crate::KafkaCode::TOPIC_ALREADY_EXISTS) => Ok(()),
        other => other,
    }
}

/// The largest record (key and value) each topic the engine writes accepts: the smaller of the
/// producer's `message.max.bytes` and the topic's `max.message.bytes`, less a margin for
/// the record batch framing the broker counts too.
pub(crate) async fn output_limits(
    options: &ClientOptions,
    config: &EngineConfig,
    producer_limit: usize,
) -> Result<BTreeMap<String, usize>> {
    /// Batch and record headers of a one-record batch, rounded up.
    const FRAMING: usize = 512;
    let mut limits = BTreeMap::new();
    for topic in &written_topics(config) {
        let broker_limit =
            kafka::topic_config(options, topic, "max.message.bytes", METADATA_TIMEOUT)
                .await?
                .and_then(|value| value.parse::<usize>().ok())
                .map_or(usize::MAX, |limit| limit.saturating_sub(FRAMING));
        limits.insert(topic.clone(), producer_limit.min(broker_limit));
    }
    Ok(limits)
}

/// Every topic the engine writes: a changelog or dead-letter record over its limit would
/// fail its batch on every retry, like an output.
pub(super) fn written_topics(config: &EngineConfig) -> Vec<String> {
    let mut written = config.output_topics.clone();
    written.push(config.changelog_topic());
    if config.on_error == ErrorPolicy::DeadLetter {
        written.push(config.dead_letter_topic());
    }
    written.extend(config.effects_topic.clone());
    written
}

/// What the transaction log holds at start-up, per partition.
pub(super) fn log_contents(txlog: &TxLog) {
    match (txlog.stats(), txlog.file_size()) {
        (Ok(partitions), Ok(bytes)) => {
            for p in partitions {
                tracing::info!(
                    partition = p.partition,
                    dedup_entries = p.processed_entries,
                    state_entries = p.state_entries,
                    checkpoint = ?p.checkpoint,
                    oldest_entry_ms = ?p.oldest_processed_at_ms,
                    "transaction log partition"
                );
            }
            tracing::info!(
                bytes,
                cache_bytes = txlog.cache_size(),
                "transaction log file"
            );
        }
        (Err(error), _) | (_, Err(error)) => tracing::warn!(%error, "transaction log statistics"),
    }
}

/// The changelog's `cleanup.policy`. Every topic has one (Kafka's default is `delete`),
/// so no value means the broker that answered does not know the topic's configuration
/// yet: the cluster test saw an instance refuse a changelog its peer had just created,
/// its policy read as empty on a three-node cluster. Asked again for a while (10 tries,
/// 0.5 s apart) before no value counts as not compacted.
async fn cleanup_policy(options: &ClientOptions, changelog: &str) -> Result<String> {
    for _ in 1..10 {
        match kafka::topic_config(options, changelog, "cleanup.policy", METADATA_TIMEOUT).await? {
            Some(policy) if !policy.is_empty() => return Ok(policy),
            _ => {
                tracing::info!(
                    topic = changelog,
                    "the changelog's cleanup.policy is not known yet; asking again"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Ok(
        kafka::topic_config(options, changelog, "cleanup.policy", METADATA_TIMEOUT)
            .await?
            .unwrap_or_default(),
    )
}
