//! The engine's loop over the in-memory log (`testing/kafka.rs`), for `onceflow::testing`:
//! the same [`serve`](super::serve::serve), batches, recovery and changelog decoding as
//! against Kafka; only the clients are the fake's, and the replay reads its changelog.
//!
//! ```text
//!  start ─► new producer (aborts what a crashed one left open) ─► join: every partition,
//!     from the committed offsets ─► replay each changelog from redb's checkpoint
//!     ─► serve until a poll finds nothing (Done), the instance stops (Stopped),
//!        or an armed crash point is reached (Crashed: the future is dropped there)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::Error;
use crate::config::EngineConfig;
use crate::crash::CrashPlan;
use crate::engine::recovery::{Parts, Resync, State, first_producer};
use crate::engine::stats::{Phase, Shutdown, Stats};
use crate::engine::{DEFAULT_MESSAGE_MAX_BYTES, serve, startup};
use crate::processor::Processor;
use crate::testing::kafka::{FakeKafka, MemoryReplay};
use crate::txlog::TxLog;

/// One incarnation of the instance: what a crash or a restart loses.
pub(crate) struct Instance<P> {
    processor: P,
    producer: FakeKafka,
    owned: BTreeSet<i32>,
    /// What recovery remembers between batches (the floors its catch-ups set, the polls
    /// a held consumer brought, the fences it took): kept from one run to the next, as a
    /// process keeps it.
    kept: State,
}

/// How a run ended.
pub(crate) enum Outcome {
    /// Every record polled was handled; the instance is still running.
    Done,
    /// The engine crashed at this point; the instance is gone.
    Crashed(&'static str),
    /// The instance stopped with this error; it is gone.
    Stopped(Error),
}

impl<P: Processor> Instance<P> {
    /// Starts an instance: a new producer under the transactional ID (which ends what
    /// its predecessor left open) and a new group member, assigned every partition at
    /// its first poll.
    pub(crate) async fn start(
        config: &EngineConfig,
        kafka: &FakeKafka,
        processor: P,
    ) -> crate::Result<Self> {
        let producer = first_producer(kafka).await?;
        kafka.rejoin(kafka.partitions(&config.input_topic));
        Ok(Instance {
            processor,
            producer,
            owned: BTreeSet::new(),
            kept: State::default(),
        })
    }
}

/// Runs `instance` until a poll finds nothing, it stops, or it crashes.
pub(crate) async fn run<P: Processor>(
    config: &EngineConfig,
    kafka: &FakeKafka,
    txlog: &Arc<TxLog>,
    stats: &Arc<Stats>,
    plan: &Arc<CrashPlan>,
    instance: &mut Instance<P>,
) -> Outcome {
    let changelog = config.changelog_topic();
    let declared: BTreeSet<String> = config.output_topics.iter().cloned().collect();
    // The broker's default `max.message.bytes` (1 MiB and framing) is above the
    // producer's default limit: the producer's is the one that counts.
    let limits: BTreeMap<String, usize> = startup::written_topics(config)
        .into_iter()
        .map(|topic| (topic, DEFAULT_MESSAGE_MAX_BYTES))
        .collect();
    let idle = Shutdown::default();
    kafka.serve_input(
        &config.input_topic,
        kafka.partitions(&config.input_topic),
        idle.clone(),
    );
    let parts = Parts {
        config,
        consumer: kafka,
        txlog,
        stats,
        declared: &declared,
        changelog: &changelog,
        output_limits: &limits,
    };
    let resync = Resync::with_state(
        config,
        stats,
        MemoryReplay {
            kafka,
            changelog: &changelog,
            txlog,
            stats,
            accept_behind: config.accept_changelog_behind,
            tombstones_kept: kafka.tombstones_kept(),
            wait: config.transaction_timeout + crate::engine::REPLAY_WAIT_GRACE,
            in_doubt_wait: config.transaction_timeout,
        },
        kafka.clone(),
        std::mem::take(&mut instance.kept),
    );
    let Instance {
        processor,
        producer,
        owned,
        kept,
    } = instance;
    // Which instance said what, when a driver runs several.
    let span = tracing::info_span!("instance", id = %config.instance_id);
    let outcome = loop {
        let serving = plan.scope(tracing::Instrument::instrument(
            serve::serve(&parts, &resync, &idle, processor, producer, owned),
            span.clone(),
        ));
        let served = tokio::select! {
            biased;
            () = plan.crashed() => None,
            served = serving => Some(served),
        };
        // As the engine's own loop (`Engine::run`): a consumer whose static membership
        // was fenced joins again when no successor has its instance ID, in the same
        // process, with whatever that process left running.
        match served {
            Some(Err(error))
                if config.delivery == crate::DeliveryMode::ExactlyOnce && kafka.member_fenced() =>
            {
                match resync
                    .after_member_fenced(kafka, producer, &changelog, error)
                    .await
                {
                    Ok(()) => {
                        drop(resync.take_held());
                        owned.clear();
                        kafka.rejoin(kafka.partitions(&config.input_topic));
                    }
                    Err(stop) => break Some(Err(stop)),
                }
            }
            other => break other,
        }
    };
    *kept = resync.into_state();
    match outcome {
        None => Outcome::Crashed(plan.take_crash().unwrap_or("unknown")),
        Some(Ok(())) => {
            stats.set_phase(Phase::Running);
            Outcome::Done
        }
        Some(Err(error)) => {
            stats.set_phase(Phase::Stopped);
            Outcome::Stopped(error)
        }
    }
}
