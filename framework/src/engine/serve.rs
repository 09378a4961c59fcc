//! The engine's loop, over the seams: poll, follow rebalances, run a batch (or, after
//! refusals, one record per transaction), and recover from a failed one. The same code
//! runs against Kafka (`Engine::run`) and, in `onceflow::testing`, against the in-memory
//! log of the test driver.

use std::collections::{BTreeSet, VecDeque};

use tracing::Instrument;

use crate::config::DeliveryMode;
use crate::engine::backoff::abort_backoff;
use crate::engine::recover::{
    Failed, ISOLATE_AFTER, Parts, Resync, isolate, recover, stops_the_instance,
};
use crate::engine::seams::{Renew, Restore, Sink, Source};
use crate::engine::stats::{Phase, Shutdown, Stats};
use crate::kafka::{Polled, Rebalanced};
use crate::processor::Processor;
use crate::{Error, Result};

/// Serves the group through `consumer` until `shutdown` is triggered (`Ok`) or the
/// instance must stop (`Err`). `owned` is kept up to date with the partitions assigned.
pub(super) async fn serve<S, K, R, N, P>(
    parts: &Parts<'_, S>,
    resync: &Resync<'_, R, N>,
    shutdown: &Shutdown,
    processor: &mut P,
    producer: &mut K,
    owned: &mut BTreeSet<i32>,
) -> Result<()>
where
    S: Source,
    K: Sink<S> + Send,
    R: Restore,
    N: Renew<K>,
    P: Processor,
{
    let config = parts.config;
    let consumer = parts.consumer;
    // Batches that failed in a row, and whether one of them failed on a record the
    // broker refused: then, after ISOLATE_AFTER failures, records go one per
    // transaction until the one that fails is found. (Sticky: after a refusal the
    // next transaction may fail on the idempotence sequence instead, which librdkafka
    // repairs with an epoch bump; that does not mean the culprit is gone.)
    let mut failures = 0u32;
    let mut refused = false;
    loop {
        if shutdown.is_triggered() {
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
        match follow_rebalances(resync, consumer, owned, &mut polled).await {
            Ok(assigned) if !assigned.is_empty() => {
                processor.partitions_assigned(&assigned);
            }
            Ok(_) => {}
            Err(error) => break Err(error),
        }
        parts.stats.set_phase(Phase::Running);
        let span = tracing::info_span!("batch", records = polled.records.len());
        let one_by_one =
            refused && failures >= ISOLATE_AFTER && config.delivery != DeliveryMode::AtMostOnce;
        let failed = if polled.records.is_empty() {
            // No records: the wall-clock timers that came due meanwhile fire alone.
            if !processor.uses_timers() || owned.is_empty() {
                continue;
            }
            parts
                .batch(&*producer)
                .run_timers(processor, owned)
                .instrument(span)
                .await
                .err()
                .map(Failed::Batch)
        } else if one_by_one {
            isolate(parts, resync, processor, producer, owned, polled.records)
                .instrument(span)
                .await
        } else {
            parts
                .batch(&*producer)
                .run(processor, polled.records)
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
        Stats::add(&parts.stats.aborts, 1);
        if let Err(stop) = recover(resync, consumer, producer, owned, &error).await {
            break Err(stop);
        }
        if stops_the_instance(&error) {
            break Err(error);
        }
        failures += 1;
        refused |= error.is_rejection() || matches!(error, Error::TransactionTimedOut { .. });
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
        if let Err(stop) = resync.pause_for(consumer, delay).await {
            break Err(stop);
        }
    }
}

/// Acts on the rebalances `polled` reports, in order, and on those served while catching
/// up: a revoked partition is forgotten with its records; an assigned one is caught up
/// with the group's committed offsets before any of its records is processed. Returns the
/// partitions assigned (and still owned).
pub(super) async fn follow_rebalances<C: Source, R: Restore, N>(
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
