//! Start-up checks and changelog replay.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{EngineConfig, ErrorPolicy};
use crate::engine::stats::{Phase, Stats};
use crate::kafka::{self, ClientOptions, ReadEnd};
use crate::txlog::{Change, TxLog};
use crate::{Error, Result};

const METADATA_TIMEOUT: Duration = Duration::from_secs(30);
/// Changelog records applied to redb per write transaction while replaying.
const REPLAY_CHUNK: usize = 2_000;

/// Checks the topics before anything is consumed: the input and outputs exist, and the
/// changelog exists with as many partitions as the input (it is created when missing).
/// Returns the input's partition count.
pub(crate) async fn check_topics(options: &ClientOptions, config: &EngineConfig) -> Result<i32> {
    let input = &config.input_topic;
    let partitions = kafka::partition_count(options, input, METADATA_TIMEOUT)
        .await?
        .ok_or_else(|| Error::Config {
            key: "input".into(),
            value: input.clone(),
            accepted: "an existing topic (create it first; onceflow does not create inputs)".into(),
        })?;
    for output in &config.output_topics {
        if kafka::partition_count(options, output, METADATA_TIMEOUT)
            .await?
            .is_none()
        {
            return Err(Error::Config {
                key: "outputs".into(),
                value: output.clone(),
                accepted:
                    "existing topics (create it first: records to a missing topic would be lost)"
                        .into(),
            });
        }
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
            let policy =
                kafka::topic_config(options, &changelog, "cleanup.policy", METADATA_TIMEOUT)
                    .await?
                    .unwrap_or_default();
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
    warn_if_not_durable(options, &changelog).await?;
    if config.on_error == ErrorPolicy::DeadLetter {
        let dead_letters = config.dead_letter_topic();
        if kafka::partition_count(options, &dead_letters, METADATA_TIMEOUT)
            .await?
            .is_none()
        {
            create(options, &dead_letters, partitions, &dead_letter_configs).await?;
        }
        warn_if_not_durable(options, &dead_letters).await?;
    }
    Ok(partitions)
}

/// Warns when `topic` would lose committed records with one broker: fewer than 3
/// replicas, or `min.insync.replicas` below 2. Fine on a one-broker test cluster, not in
/// production: the changelog holds the dedup log and the state.
async fn warn_if_not_durable(options: &ClientOptions, topic: &str) -> Result<()> {
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
             min.insync.replicas 2; set changelog_replication_factor, or the broker's \
             default.replication.factor and min.insync.replicas)"
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
        Err(Error::Kafka { code, .. }) if code == "TopicAlreadyExists" => Ok(()),
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
    // Every topic the engine writes: a changelog or dead-letter record over the limit
    // would fail its batch on every retry, like an output.
    let mut written = config.output_topics.clone();
    written.push(config.changelog_topic());
    if config.on_error == ErrorPolicy::DeadLetter {
        written.push(config.dead_letter_topic());
    }
    for topic in &written {
        let broker_limit =
            kafka::topic_config(options, topic, "max.message.bytes", METADATA_TIMEOUT)
                .await?
                .and_then(|value| value.parse::<usize>().ok())
                .map_or(usize::MAX, |limit| limit.saturating_sub(FRAMING));
        limits.insert(topic.clone(), producer_limit.min(broker_limit));
    }
    Ok(limits)
}

/// Brings `partition`'s dedup entries and state in redb up to date with the changelog,
/// from the stored checkpoint until the changelog's progress records reach `committed`,
/// the group's stable committed offset of the input partition (`None`: nothing to
/// reach, read to the end the reader sees). Must finish before any record of the
/// partition is processed.
///
/// While an open transaction hides committed records (the last stable offset lags the
/// high watermark) and the progress has not reached `committed`, it waits, at most `wait`;
/// then it fails with [`Error::HangingTransaction`]. A checkpoint past the changelog's
/// high watermark means the topic was recreated: the partition is cleared and read from
/// the start. A malformed record is an error that names it, never a reason to clear.
pub(crate) async fn replay(
    options: &ClientOptions,
    changelog: &str,
    partition: i32,
    committed: Option<i64>,
    wait: Duration,
    txlog: &Arc<TxLog>,
    stats: &Arc<Stats>,
) -> Result<()> {
    let options = options.clone();
    let changelog = changelog.to_owned();
    let txlog = Arc::clone(txlog);
    let stats = Arc::clone(stats);
    kafka::blocking("replay the changelog", move || {
        let started = std::time::Instant::now();
        let mut replayed = 0u64;
        let remaining = metrics::gauge!("onceflow_replay_remaining_records", "partition" => partition.to_string());
        let mut apply = |records: Vec<kafka::Record>, end: i64| -> Result<()> {
            crate::engine::crash_point!("onceflow-during-replay");
            let Some(last) = records.last().map(|r| r.offset) else { return Ok(()) };
            let changes = records
                .iter()
                .map(|r| {
                    Change::decode(
                        r.key.as_deref().unwrap_or_default(),
                        r.value.as_deref(),
                        &format!("changelog record {changelog}/{partition}@{}", r.offset),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            txlog.apply(&[(partition, changes, Some(last + 1))])?;
            replayed += records.len() as u64;
            Stats::add(&stats.replayed_records, records.len() as u64);
            remaining.set((end - last - 1).max(0) as f64);
            tracing::info!(partition, replayed, at = last + 1, end, "replaying the changelog");
            Ok(())
        };
        let mut reached = || -> Result<bool> {
            Ok(match committed {
                None => true,
                Some(committed) => txlog.progress(partition)?.is_some_and(|at| at >= committed),
            })
        };
        let mut read = |from: Option<i64>, apply: &mut dyn FnMut(Vec<kafka::Record>, i64) -> Result<()>| {
            kafka::read_partition(
                &options,
                &changelog,
                partition,
                from,
                REPLAY_CHUNK,
                METADATA_TIMEOUT,
                kafka::Until {
                    reached: &mut reached,
                    wait,
                    on_wait: &|| stats.set_phase(Phase::WaitingForTransaction),
                },
                apply,
            )
        };
        let end = match read(txlog.checkpoint(partition)?, &mut apply)? {
            ReadEnd::PastEnd {
                checkpoint,
                high_watermark,
            } => {
                // Nothing of what redb holds for this partition is in the topic any more.
                tracing::warn!(
                    partition,
                    checkpoint,
                    high_watermark,
                    "the changelog is shorter than the transaction log's checkpoint (recreated \
                     or truncated): forgetting the partition and replaying from the start"
                );
                txlog.clear_partition(partition)?;
                match read(None, &mut apply)? {
                    ReadEnd::Read { next, reached } => (next, reached),
                    ReadEnd::PastEnd { .. } => unreachable!("a read from the start is never past the end"),
                }
            }
            ReadEnd::Read { next, reached } => (next, reached),
        };
        let (end, reached) = end;
        if !reached {
            // Nothing hides anything, yet the changelog does not reach the committed
            // offset: the offsets were moved by something else (a reset, a changelog from
            // before progress records), or at-most-once committed ahead of processing.
            tracing::warn!(
                partition,
                committed = ?committed,
                progress = ?txlog.progress(partition)?,
                "the changelog's progress does not reach the group's committed offset; going on \
                 with what it holds (were the group's offsets reset?)"
            );
        }
        // Past the last record there may be commit markers; start after them next time.
        if txlog.checkpoint(partition)? != Some(end) {
            txlog.apply(&[(partition, Vec::new(), Some(end))])?;
        }
        remaining.set(0.0);
        tracing::info!(partition, replayed, end, elapsed = ?started.elapsed(), "changelog replayed");
        Ok(())
    })
    .await
}
