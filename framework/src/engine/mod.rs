//! The engine: consume, transform and produce, one Kafka transaction per batch.
//!
//! The guarantee (the guide's `docs/src/guarantee.md`), for every input record R of an
//! operator:
//! 1. **Effects once.** R's outputs, state changes and dead letter become visible to
//!    `read_committed` readers exactly once, atomically with the commit of R's offset;
//!    aborted work is never visible.
//! 2. **Duplicates once.** If R carries a (non-empty) event ID this operator processed on
//!    the same input partition within `dedup_window`, R is skipped: no outputs, no state
//!    change; its offset commits and `duplicates_skipped` counts it.
//! 3. **Nothing lost.** R is processed, skipped as a duplicate, or handled per `on_error`
//!    with its reason (a record the broker refuses for good is found and dead-lettered);
//!    no record is silently dropped and no partition stalls for ever on one record.
//! 4. **Zombies can't commit.** An instance replaced under the same instance ID is fenced
//!    and stops; one that lost its partitions cannot commit their offsets (KIP-447).
//!
//! Not covered: effects outside Kafka, duplicates across partitions or older than the
//! window, records without an event ID (processed, counted, not deduplicated by ID).
//!
//! ```text
//!  poll (read_committed) ─► decode ─► dedup check ─► Processor::process ─► outputs, state
//!     ▲   no transaction open                                                  │
//!     │   while polling      ┌──────── one Kafka transaction ────────┐         ▼
//!  seek back on abort        │ outputs + changelog (dedup entries,    │   batch overlay
//!     └──────────────────────┤ state changes, expiries) + offsets     │   (memory)
//!                            └──────────── commit_transaction ───────┘
//!                                               │ committed
//!                                               ▼
//!                    apply the batch to redb with the changelog offsets it reached
//! ```
//!
//! Invariants:
//! - A transaction is open only between two polls, and rebalance callbacks run only
//!   inside a poll: partitions are never revoked under an open transaction.
//! - A partition's changelog is replayed into redb after it is assigned and before any of
//!   its records is processed, from its checkpoint until the progress records (every
//!   batch writes the input offset it reached) reach the group's *stable* committed
//!   offset: not merely to the end a `read_committed` reader sees, which another
//!   producer's open transaction holds back. While the last stable offset lags the high
//!   watermark, replay waits (at most `transaction_timeout` and a grace). So dedup and
//!   state reads always see every committed batch, a zombie's late commit included.
//! - A partition's transaction log out of step with its changelog for half the
//!   changelog's `delete.retention.ms` is rebuilt before it is replayed: compaction may
//!   have removed a deletion since.
//! - Timers fired alone commit the group's offsets again, so a zombie's are refused.
//! - A checkpoint never moves over changelog records that were not replayed. "The
//!   changelog was recreated" is told by its topic ID (stored in redb, checked at start),
//!   else by a checkpoint past its high watermark, never by the last stable offset; a
//!   malformed changelog record stops the instance.
//! - redb is changed only after the Kafka transaction committed, and only together
//!   with the changelog offsets the batch reached: a crash in between is repaired by
//!   replay, never by guessing.
//! - An aborted batch leaves nothing: its overlay is dropped and every partition it read
//!   is rewound to the batch's first offset.
//! - Nothing a fenced producer did after the fence is visible. A fence stops the instance
//!   when a successor joined the group under its instance ID; one with no successor (a
//!   coordinator moved during an epoch bump) makes a new producer, within a budget.

mod backoff;
pub(crate) mod batch;
pub(crate) mod changelog;
#[cfg(feature = "testing")]
pub(crate) mod drive;
pub(crate) mod recovery;
pub(crate) mod seams;
pub(crate) mod serve;
pub(crate) mod startup;
pub(crate) mod stats;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;

pub use stats::{Phase, Shutdown, Stats, StatsSnapshot};

/// The processor's topics checked and its own ones created, as its start does: for a
/// runner that starts an effect executor beside the processor, which needs the effects
/// topic the processor's start would create.
#[cfg(feature = "runner")]
pub(crate) async fn check_topics(options: &ClientOptions, config: &EngineConfig) -> Result<i32> {
    startup::check_topics(options, config).await
}

use crate::Result;
use crate::config::{DeliveryMode, EngineConfig, ErrorPolicy};
use crate::kafka::{self, ClientOptions, InputConsumer};
use crate::processor::Processor;
use crate::txlog::{self, Opened, TxLog};
use backoff::retry_transient;
use changelog::ChangelogReplay;
use recovery::{Parts, Resync};
use seams::NewProducer;

/// librdkafka's default `message.max.bytes`.
pub(crate) const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;
/// How long replay waits for an open transaction beyond `transaction_timeout`: the
/// coordinator aborts a transaction some time after its timeout, not at once.
pub(super) const REPLAY_WAIT_GRACE: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the start-up connection check waits for the cluster to answer.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs one instance of an operator until it is shut down or fails.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    shutdown: Shutdown,
    stats: Arc<Stats>,
}

impl Engine {
    /// An engine for `config`; fails with the first configuration problem.
    pub fn new(config: EngineConfig) -> Result<Self> {
        if let Some(problem) = config.problems().into_iter().next() {
            return Err(problem);
        }
        Ok(Engine {
            config,
            shutdown: Shutdown::default(),
            stats: Arc::default(),
        })
    }

    /// A handle that stops the engine after its current batch.
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// The engine's live counters.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Consumes, processes and commits until shut down (then returns the counters) or
    /// until a fatal error (fenced, bad configuration, a permanent processing error).
    ///
    /// A refused credential stops it with [`crate::Error::Authentication`], a missing ACL with
    /// [`crate::Error::Unauthorized`] naming the ACL and the principal.
    pub async fn run<P: Processor>(mut self, processor: P) -> Result<StatsSnapshot> {
        let config = &mut self.config;
        merge_declarations(config, &processor)?;
        let options =
            ClientOptions::with_properties(&config.bootstrap_servers, &config.kafka_properties);
        let mut writes = config.output_topics.clone();
        writes.push(config.changelog_topic());
        if config.on_error == ErrorPolicy::DeadLetter {
            writes.push(config.dead_letter_topic());
        }
        let names = kafka::Resources {
            group: config.group.clone(),
            transactional_id: (config.delivery == DeliveryMode::ExactlyOnce)
                .then(|| config.transactional_id()),
            input: config.input_topic.clone(),
            writes,
        };
        self.run_until_stopped(processor, &options)
            .await
            .map_err(|error| kafka::explain(error, &options, &names))
    }

    /// [`Engine::run`] once the processor's declarations are merged into the configuration.
    async fn run_until_stopped<P: Processor>(
        self,
        mut processor: P,
        options: &ClientOptions,
    ) -> Result<StatsSnapshot> {
        let config = self.config;
        let dir = config.instance_dir();
        let root = config.state_dir.clone();
        let cache_size = config.txlog_cache_size;
        let (txlog, opened) = crate::blocking::blocking("open the transaction log", move || {
            // The instance's own directory is checked by `open`; a state dir that existed
            // before must not be someone else's either.
            if root.is_dir() {
                txlog::check_private(&root)?;
            }
            TxLog::open_with_cache(&dir, cache_size)
        })
        .await?;
        txlog.use_clock(config.clock.clone());
        let txlog = Arc::new(txlog);
        match &opened {
            Opened::Rebuilt { reason } => {
                tracing::warn!(%reason, path = %txlog.path().display(), "transaction log rebuilt from the changelog")
            }
            other => {
                tracing::info!(opened = ?other, path = %txlog.path().display(), "transaction log open")
            }
        }
        startup::log_contents(&txlog);
        kafka::check_connection(options, CONNECT_TIMEOUT).await?;
        // A node away (a rolling restart) fails a check now and then: asked again.
        retry_transient("check the topics", || {
            startup::check_topics(options, &config)
        })
        .await?;
        retry_transient("read the changelog's topic ID", || {
            changelog::adopt(options, &config, &txlog)
        })
        .await?;

        let mut producer = recovery::first_producer(&NewProducer {
            options,
            config: &config,
        })
        .await?;
        let subscribe = || {
            InputConsumer::subscribe(
                options,
                &config.group,
                &config.instance_id,
                &config.input_topic,
                config.max_batch_records,
            )
        };
        let changelog = config.changelog_topic();
        let declared: BTreeSet<String> = config.output_topics.iter().cloned().collect();
        let producer_limit = config
            .kafka_property("message.max.bytes")
            .and_then(|value| value.parse().ok())
            .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES);
        let output_limits = retry_transient("read the topics' size limits", || {
            startup::output_limits(options, &config, producer_limit)
        })
        .await?;
        tracing::info!(
            processor = processor.name(),
            group = %config.group,
            instance = %config.instance_id,
            input = %config.input_topic,
            delivery = ?config.delivery,
            "engine started"
        );

        let tombstones_kept = retry_transient("read the changelog's delete.retention.ms", || {
            changelog::tombstones_kept(options, &changelog)
        })
        .await?;
        let resync = Resync::new(
            &config,
            &self.stats,
            ChangelogReplay {
                options,
                changelog: &changelog,
                txlog: &txlog,
                stats: &self.stats,
                wait: config.transaction_timeout + REPLAY_WAIT_GRACE,
                accept_behind: config.accept_changelog_behind,
                tombstones_kept,
                in_doubt_wait: config.transaction_timeout,
            },
            NewProducer {
                options,
                config: &config,
            },
        );
        let outcome = loop {
            let consumer = match subscribe() {
                Ok(consumer) => consumer,
                Err(error) => break Err(error),
            };
            let parts = Parts {
                config: &config,
                consumer: &consumer,
                txlog: &txlog,
                stats: &self.stats,
                declared: &declared,
                changelog: &changelog,
                output_limits: &output_limits,
            };
            let mut owned = BTreeSet::new();
            let inner = serve::serve(
                &parts,
                &resync,
                &self.shutdown,
                &mut processor,
                &mut producer,
                &mut owned,
            )
            .await;
            let inner = match inner {
                // A static member is fenced by a join under its group.instance.id. Not
                // only by a successor: when the group coordinator was away longer than
                // the session, librdkafka rejoins and a request still carrying the old
                // member ID fences the consumer itself (KAFKA-20985 is the same for
                // Kafka Streams). `after_member_fenced` tells them apart.
                Err(error)
                    if config.delivery == DeliveryMode::ExactlyOnce && consumer.member_fenced() =>
                {
                    match resync
                        .after_member_fenced(&consumer, &mut producer, &changelog, error)
                        .await
                    {
                        Ok(()) => {
                            drop(resync.take_held());
                            drop(consumer);
                            continue;
                        }
                        Err(stop) => Err(stop),
                    }
                }
                other => other,
            };
            if let Err(error) = consumer.close().await {
                tracing::warn!(%error, "leaving the group failed");
            }
            break inner;
        };

        drop(producer);
        self.stats.set_phase(Phase::Stopped);
        let snapshot = self.stats.snapshot();
        tracing::info!(?snapshot, result = ?outcome.as_ref().map(|_| ()), "engine stopped");
        outcome.map(|()| snapshot)
    }
}

/// Merges what `processor` declares into `config`: a declared input is a default the
/// configured one renames; each declared output is added, under the topic a rename
/// gives it. A rename of an output the processor does not declare is an error.
pub(crate) fn merge_declarations<P: Processor>(
    config: &mut EngineConfig,
    processor: &P,
) -> Result<()> {
    if let Some(declared) = processor.input_topic()
        && declared != config.input_topic
    {
        tracing::info!(
            declared,
            topic = %config.input_topic,
            "the processor's declared input is read from the configured topic"
        );
    }
    let declared_outputs = processor.output_topics();
    if let Some(error) =
        crate::config::unknown_rename(&config.renamed_outputs, declared_outputs, processor.name())
    {
        return Err(error);
    }
    for declared in declared_outputs {
        let topic = config
            .renamed_outputs
            .get(*declared)
            .cloned()
            .unwrap_or_else(|| (*declared).to_owned());
        if !config.output_topics.contains(&topic) {
            config.output_topics.push(topic);
        }
    }
    Ok(())
}
