//! The engine: consume, transform and produce, one Kafka transaction per batch.
//!
//! The guarantee (DESIGN.md §1), for every input record R of an operator:
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
mod batch;
mod changelog;
mod commit;
mod dead_letters;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod matrix;
mod record;
mod recover;
#[cfg(test)]
mod recovery_matrix;
mod seams;
mod startup;
mod stats;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use tracing::Instrument;

pub use stats::{Phase, Shutdown, Stats, StatsSnapshot};

use crate::config::{DeliveryMode, EngineConfig, ErrorPolicy};
use crate::kafka::{self, ClientOptions, InputConsumer, Isolation, Polled, Rebalanced};
use crate::processor::Processor;
use crate::txlog::{self, Opened, TxLog};
use crate::{Error, Result};
use backoff::{abort_backoff, retry_transient};
use recover::{Failed, ISOLATE_AFTER, Parts, Resync, isolate, recover, stops_the_instance};
use seams::{ChangelogReplay, NewProducer, Restore, Source};

/// librdkafka's default `message.max.bytes`.
const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;
/// How long replay waits for an open transaction beyond `transaction_timeout`: the
/// coordinator aborts a transaction some time after its timeout, not at once.
pub(super) const REPLAY_WAIT_GRACE: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the start-up connection check waits for the cluster to answer.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Named points (feature `failpoints`): `onceflow-after-process`, `onceflow-after-produce`,
/// `onceflow-before-send-offsets`, `onceflow-before-commit`,
/// `onceflow-after-commit-before-apply` and `onceflow-during-replay` crash the process;
/// `onceflow-fail-batch` fails the batch with a retriable error instead.
///
/// Crashes the process at a named point when the failpoint is configured (feature
/// `failpoints`; e.g. `FAILPOINTS=onceflow-before-commit=3*off->return` crashes at the
/// fourth pass). A crash is `abort()`: no destructor, no flush, like a power cut.
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        if fail::eval($name, |_| ()).is_some() {
            eprintln!("onceflow: failpoint {} hit: crashing", $name);
            std::process::abort();
        }
    };
}
pub(crate) use crash_point;

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
    /// A refused credential stops it with [`Error::Authentication`], a missing ACL with
    /// [`Error::Unauthorized`] naming the ACL and the principal.
    pub async fn run<P: Processor>(mut self, processor: P) -> Result<StatsSnapshot> {
        let config = &mut self.config;
        if let Some(declared) = processor.input_topic()
            && declared != config.input_topic
        {
            // A declared input is a default: the configured one renames it.
            tracing::info!(
                declared,
                topic = %config.input_topic,
                "the processor's declared input is read from the configured topic"
            );
        }
        let declared_outputs = processor.output_topics();
        if let Some(error) = crate::config::unknown_rename(
            &config.renamed_outputs,
            declared_outputs,
            processor.name(),
        ) {
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
        let (txlog, opened) = kafka::blocking("open the transaction log", move || {
            // The instance's own directory is checked by `open`; a state dir that existed
            // before must not be someone else's either.
            if root.is_dir() {
                txlog::check_private(&root)?;
            }
            TxLog::open(&dir)
        })
        .await?;
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
            startup::adopt_changelog(options, &config, &txlog)
        })
        .await?;

        let mut producer = seams::new_producer(options, &config).await?;
        let subscribe = || {
            InputConsumer::subscribe(
                options,
                &config.group,
                &config.instance_id,
                &config.input_topic,
                Isolation::ReadCommitted,
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

        let resync = Resync {
            config: &config,
            stats: &self.stats,
            restore: ChangelogReplay {
                options,
                changelog: &changelog,
                txlog: &txlog,
                stats: &self.stats,
                wait: config.transaction_timeout + REPLAY_WAIT_GRACE,
            },
            renew: NewProducer {
                options,
                config: &config,
            },
            held: std::sync::Mutex::default(),
            fences: std::sync::Mutex::default(),
            producer_fenced: std::sync::atomic::AtomicBool::default(),
        };
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
            // Batches that failed in a row, and whether one of them failed on a record the
            // broker refused: then, after ISOLATE_AFTER failures, records go one per
            // transaction until the one that fails is found. (Sticky: after a refusal the
            // next transaction may fail on the idempotence sequence instead, which librdkafka
            // repairs with an epoch bump; that does not mean the culprit is gone.)
            let mut failures = 0u32;
            let mut refused = false;
            let inner = loop {
                if self.shutdown.is_triggered() {
                    break Ok(());
                }
                // What the polls of a held consumer brought comes first (rebalances served
                // while catching up or backing off).
                let mut polled = resync.take_held();
                if polled.rebalances.is_empty() && polled.records.is_empty() {
                    polled = match consumer
                        .poll(config.max_batch_records, config.commit_interval)
                        .await
                    {
                        Ok(polled) => polled,
                        Err(error) if error.is_fatal() => break Err(error),
                        Err(error) => {
                            tracing::warn!(%error, "poll failed; polling again");
                            continue;
                        }
                    };
                }
                match follow_rebalances(&resync, &consumer, &mut owned, &mut polled).await {
                    Ok(assigned) if !assigned.is_empty() => {
                        processor.partitions_assigned(&assigned);
                    }
                    Ok(_) => {}
                    Err(error) => break Err(error),
                }
                self.stats.set_phase(Phase::Running);
                if polled.records.is_empty() {
                    continue;
                }
                let span = tracing::info_span!("batch", records = polled.records.len());
                let one_by_one = refused
                    && failures >= ISOLATE_AFTER
                    && config.delivery != DeliveryMode::AtMostOnce;
                let failed = if one_by_one {
                    isolate(
                        &parts,
                        &resync,
                        &mut processor,
                        &mut producer,
                        &owned,
                        polled.records,
                    )
                    .instrument(span)
                    .await
                } else {
                    parts
                        .batch(&producer)
                        .run(&mut processor, polled.records)
                        .instrument(span)
                        .await
                        .err()
                        .map(Failed::Batch)
                };
                let error = match failed {
                    // A batch committed, or the record that failed the others was found and
                    // dead-lettered (the records after it come again, in a batch as usual).
                    None | Some(Failed::Isolated) => {
                        if failures > 0 {
                            metrics::gauge!("onceflow_consecutive_aborts").set(0.0);
                        }
                        failures = 0;
                        refused = false;
                        continue;
                    }
                    Some(Failed::Stop(error)) => break Err(error),
                    Some(Failed::Batch(error)) => error,
                };
                Stats::add(&self.stats.aborts, 1);
                if let Err(stop) = recover(&resync, &consumer, &mut producer, &owned, &error).await
                {
                    break Err(stop);
                }
                if stops_the_instance(&error) {
                    break Err(error);
                }
                failures += 1;
                refused |=
                    error.is_rejection() || matches!(error, Error::TransactionTimedOut { .. });
                let delay = abort_backoff(failures);
                metrics::gauge!("onceflow_consecutive_aborts").set(f64::from(failures));
                // Rate-limited: a batch that fails every time must not flood the logs.
                if failures <= 3 || failures.is_power_of_two() {
                    tracing::warn!(
                        %error,
                        consecutive = failures,
                        ?delay,
                        one_by_one = refused && failures >= ISOLATE_AFTER,
                        "batch aborted and rewound; going on"
                    );
                }
                if let Err(stop) = resync.pause_for(&consumer, delay).await {
                    break Err(stop);
                }
            };
            let inner = match inner {
                Err(error)
                    if config.delivery == DeliveryMode::ExactlyOnce
                        && consumer.member_fenced()
                        && !resync.producer_fenced() =>
                {
                    // A static member is fenced by a join under its group.instance.id. Not
                    // only by a successor: when the group coordinator was away longer than
                    // the session, librdkafka rejoins and a request still carrying the old
                    // member ID fences the consumer itself (KAFKA-20985 is the same for
                    // Kafka Streams). Joining again is safe in exactly-once mode: the
                    // group's generation check refuses a zombie's offsets (KIP-447), so
                    // nothing it commits becomes visible; a real successor fences this
                    // one again, until the budget of fences is spent and it stops. (With
                    // the producer fenced too, a successor is certain: it stops at once.)
                    //
                    // A successor initialises the transactional ID before it joins, so
                    // first the producer is asked: fenced too, this instance was replaced
                    // and stops without fencing its successor's member in turn.
                    match producer.probe_fenced(&changelog).await {
                        Ok(true) => {
                            tracing::error!(%error, "this instance was replaced: its producer is fenced too; stopping");
                            Err(error)
                        }
                        probed => {
                            if let Err(unknown) = &probed {
                                tracing::warn!(error = %unknown, "could not learn whether the producer is fenced too");
                            }
                            match resync.allow_fence(&error) {
                                Ok(fences) => {
                                    tracing::warn!(%error, fences, "the consumer's static membership was fenced, the producer was not: joining the group again");
                                    drop(resync.take_held());
                                    drop(consumer);
                                    continue;
                                }
                                Err(spent) => Err(spent),
                            }
                        }
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

/// Acts on the rebalances `polled` reports, in order, and on those served while catching
/// up: a revoked partition is forgotten with its records; an assigned one is caught up
/// with the group's committed offsets before any of its records is processed. Returns the
/// partitions assigned (and still owned).
async fn follow_rebalances<C: Source, R: Restore, N>(
    resync: &Resync<'_, R, N>,
    consumer: &C,
    owned: &mut BTreeSet<i32>,
    polled: &mut Polled,
) -> Result<Vec<i32>> {
    let mut assigned = BTreeSet::new();
    let mut events: VecDeque<Rebalanced> = std::mem::take(&mut polled.rebalances).into();
    while let Some(event) = events.pop_front() {
        match event {
            Rebalanced::Revoked(partitions) => {
                owned.retain(|p| !partitions.contains(p));
                assigned.retain(|p| !partitions.contains(p));
                polled
                    .records
                    .retain(|r| !partitions.contains(&r.partition));
            }
            Rebalanced::Assigned(partitions) => {
                Stats::add(&resync.stats.assignments, 1);
                resync.stats.set_phase(Phase::Replaying);
                resync.catch_up(consumer, &partitions).await?;
                assigned.extend(partitions.iter().copied());
                owned.extend(partitions);
                let held = resync.take_held();
                polled.records.extend(held.records);
                events.extend(held.rebalances);
            }
        }
    }
    Ok(assigned.into_iter().collect())
}
