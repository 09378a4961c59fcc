//! The engine's loop, over the seams: poll, follow rebalances, run a batch (or, after
//! refusals, one record per transaction), and recover from a failed one. The same code
//! runs against Kafka (`Engine::run`) and, in `onceflow::testing`, against the in-memory
//! log of the test driver.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::config::DeliveryMode;
use crate::engine::backoff::{abort_backoff, retry_transient};
use crate::engine::recovery::isolate::isolate;
use crate::engine::recovery::{Failed, ISOLATE_AFTER, Parts, Resync, recover, stops_the_instance};
use crate::engine::seams::{Renew, Restore, Sink, Source};
use crate::engine::stats::{Phase, Shutdown, Stats};
use crate::kafka::{self, Polled, Rebalanced};
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
    let mut cadence = Cadence::new(config.commit_interval, Instant::now());
    loop {
        if shutdown.is_triggered() {
            break Ok(());
        }
        // What the polls of a held consumer brought comes first (rebalances served
        // while catching up or backing off), in the order it came.
        let mut polls = resync.take_held();
        if polls.is_empty() {
            match consumer
                .poll(config.max_batch_records, cadence.wait(Instant::now()))
                .await
            {
                Ok(polled) => polls.push(polled),
                Err(error) if error.is_fatal() => break Err(error),
                Err(error) => {
                    tracing::warn!(%error, "poll failed; polling again");
                    continue;
                }
            }
        }
        let mut polled = match follow_rebalances(resync, consumer, owned, polls).await {
            Ok(followed) => {
                if !followed.assigned.is_empty() {
                    processor.partitions_assigned(&followed.assigned);
                }
                followed
            }
            Err(error) => break Err(error),
        };
        let placed = resync.drop_committed(&mut polled.records);
        if !placed.seek.is_empty()
            && let Err(error) = retry_transient("seek back to where catching up found", || {
                consumer.seek(placed.seek.clone())
            })
            .await
        {
            break Err(error);
        }
        parts.stats.set_phase(Phase::Running);
        let span = tracing::info_span!("batch", records = polled.records.len());
        let one_by_one =
            refused && failures >= ISOLATE_AFTER && config.delivery != DeliveryMode::AtMostOnce;
        if polled.records.is_empty() {
            cadence.idle(Instant::now());
        } else {
            cadence.closed(Instant::now());
        }
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
        // The records of the failed batch come again, in a window of their own.
        cadence.idle(Instant::now());
    }
}

/// When the batch being gathered closes. Batches close `commit_interval` apart, as Kafka
/// Streams' `commit.interval.ms` commits: the time one takes to handle, commit and apply
/// its records is not added to the next one's wait, so a record waits about one interval
/// and one commit to be visible, not one interval and two. A batch whose close has passed
/// before it is polled (its predecessor took longer than the interval) takes what has
/// arrived meanwhile; after a poll that found nothing, the next batch gets a whole
/// interval (an idle engine does not poll in a loop).
#[derive(Debug)]
struct Cadence {
    interval: Duration,
    close_at: Instant,
}

impl Cadence {
    fn new(interval: Duration, now: Instant) -> Self {
        Cadence {
            interval,
            close_at: now + interval,
        }
    }

    /// How long the poll for the next batch gathers.
    fn wait(&self, now: Instant) -> Duration {
        self.close_at.saturating_duration_since(now)
    }

    /// A batch was polled at `now`: the next closes an interval after this one's close,
    /// or after `now` if it closed early (it was full).
    fn closed(&mut self, now: Instant) {
        let close = self.close_at.min(now);
        self.close_at = (close + self.interval).max(now);
    }

    /// A poll found nothing (or a batch failed and is rewound).
    fn idle(&mut self, now: Instant) {
        self.close_at = now + self.interval;
    }
}

/// What following the polls' rebalances left: the partitions assigned (and still
/// owned), and the records to process.
pub(super) struct Followed {
    pub(super) assigned: Vec<i32>,
    pub(super) records: Vec<kafka::Record>,
}

/// Acts on what `polls` brought, in the order it came: each poll's rebalances in turn,
/// then its records (a poll's records come after its rebalances: librdkafka drops
/// those of a partition revoked meanwhile, and `keep_alive` and `gather` drop those
/// polled before a revocation). A revoked partition is forgotten with every record of
/// it gathered so far; an assigned one is caught up with the group's committed offsets
/// before any of its records is processed, and what the consumer's polls bring while
/// it catches up comes after this poll, in order. Merging the polls instead (records
/// apart from rebalances) let a revocation drop the records its partition got after it
/// was assigned back (hole A of issue 40).
pub(super) async fn follow_rebalances<C: Source, R: Restore, N>(
    resync: &Resync<'_, R, N>,
    consumer: &C,
    owned: &mut BTreeSet<i32>,
    polls: Vec<Polled>,
) -> Result<Followed> {
    let mut assigned = BTreeSet::new();
    let mut records = Vec::new();
    let mut polls: VecDeque<Polled> = polls.into();
    while let Some(polled) = polls.pop_front() {
        for event in polled.rebalances {
            match event {
                Rebalanced::Revoked(partitions) => {
                    owned.retain(|p| !partitions.contains(p));
                    assigned.retain(|p| !partitions.contains(p));
                    resync.forget_floors(&partitions);
                    records.retain(|r: &kafka::Record| !partitions.contains(&r.partition));
                }
                Rebalanced::Assigned(partitions) => {
                    Stats::add(&resync.stats.assignments, 1);
                    resync.stats.set_phase(Phase::Replaying);
                    let from = resync.catch_up(consumer, &partitions).await?;
                    tracing::info!(positions = ?from, "caught up the partitions assigned");
                    assigned.extend(partitions.iter().copied());
                    owned.extend(partitions);
                    polls.extend(resync.take_held());
                }
            }
        }
        records.extend(polled.records);
    }
    // A record of a partition the instance does not own (any more) is never processed:
    // its owner reads it from the committed offset.
    let before = records.len();
    records.retain(|r| owned.contains(&r.partition));
    if records.len() < before {
        tracing::warn!(
            dropped = before - records.len(),
            ?owned,
            "records of partitions this instance does not own came in a poll; not processed"
        );
    }
    Ok(Followed {
        assigned: assigned.into_iter().collect(),
        records,
    })
}

/// [`follow_rebalances`] of one poll, whose records it leaves in `polled` (for tests).
#[cfg(test)]
pub(super) async fn follow<C: Source, R: Restore, N>(
    resync: &Resync<'_, R, N>,
    consumer: &C,
    owned: &mut BTreeSet<i32>,
    polled: &mut Polled,
) -> Result<Vec<i32>> {
    let followed = follow_rebalances(resync, consumer, owned, vec![std::mem::take(polled)]).await?;
    polled.records = followed.records;
    Ok(followed.assigned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn batches_close_an_interval_apart_whatever_their_commit_took() {
        let start = Instant::now();
        let mut cadence = Cadence::new(100 * MS, start);
        assert_eq!(cadence.wait(start), 100 * MS);
        // The first batch closes at 100 ms; its commit and apply take 30 ms: the next
        // gathers for the 70 ms left of its interval, not for another 100.
        cadence.closed(start + 100 * MS);
        assert_eq!(cadence.wait(start + 130 * MS), 70 * MS);
        cadence.closed(start + 200 * MS);
        assert_eq!(cadence.wait(start + 225 * MS), 75 * MS);
        // A batch full before its close (a burst): the next closes an interval after it
        // was polled, not after the close it did not wait for.
        cadence.closed(start + 240 * MS);
        assert_eq!(cadence.wait(start + 250 * MS), 90 * MS);
    }

    #[test]
    fn a_late_batch_takes_what_has_arrived_and_an_idle_poll_restarts_the_interval() {
        let start = Instant::now();
        let mut cadence = Cadence::new(10 * MS, start);
        // Closed at 10 ms, committed at 35: the next batch's close has passed.
        cadence.closed(start + 10 * MS);
        assert_eq!(cadence.wait(start + 35 * MS), Duration::ZERO);
        // While commits outlast the interval, batches follow each other with no wait,
        // each with what came during the commit before it.
        cadence.closed(start + 35 * MS);
        assert_eq!(cadence.wait(start + 60 * MS), Duration::ZERO);
        // Once commits are quick again (2 ms), the cadence is back a batch later.
        cadence.closed(start + 60 * MS);
        assert_eq!(cadence.wait(start + 62 * MS), Duration::ZERO);
        cadence.closed(start + 62 * MS);
        assert_eq!(cadence.wait(start + 64 * MS), 6 * MS);
        // Nothing came: a whole interval from now, so an idle engine waits in its poll.
        cadence.idle(start + 50 * MS);
        assert_eq!(cadence.wait(start + 50 * MS), 10 * MS);
    }
}
