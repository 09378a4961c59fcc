//! Reading one changelog partition from a checkpoint until the caller has all it needs.
//!
//! Under `read_committed` the end a reader sees is the last stable offset (LSO): an open
//! transaction of any producer on the partition (a killed owner's, a zombie's) holds it
//! back, and committed records after it stay hidden until that transaction ends. So "read
//! to the end" is not "saw every committed batch". The caller says when it has seen
//! enough ([`Until::reached`]: in the engine, when the progress records reached the
//! group's stable committed offset); until then, while the LSO lags the high watermark,
//! this waits for the hiding transaction to end, bounded by [`Until::wait`].

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use super::{ClientOptions, Record, known_topic_error, types::to_record};
use crate::{Error, Result};

/// How often the reader looks at the watermarks while no record arrives.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often a wait for an open transaction is logged.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// A reader's client context: end-of-partition is routine, not an error to log.
///
/// librdkafka reports it through the error callback too, which rdkafka's default context
/// logs at ERROR ("Global error: PartitionEOF") on every replay; an operator's alerting
/// must be able to trust ERROR.
#[derive(Debug, Default)]
pub(crate) struct Reader;

impl ClientContext for Reader {
    fn error(&self, error: KafkaError, reason: &str) {
        super::error::log_client_error(error, reason);
    }
}

impl ConsumerContext for Reader {}

/// When a replay may stop.
pub(crate) struct Until<'a> {
    /// Asked with everything read so far applied: whether it is enough.
    pub(crate) reached: &'a mut dyn FnMut() -> Result<bool>,
    /// How long to wait, at most, for open transactions that hide committed records.
    pub(crate) wait: Duration,
    /// Called when such a wait starts.
    pub(crate) on_wait: &'a dyn Fn(),
    /// Whether the caller gave the read up: it ends at once with [`Error::Cancelled`].
    pub(crate) cancelled: &'a dyn Fn() -> bool,
    /// How long a read that reached its goal still waits for a transaction open since
    /// before it began (a batch whose commit is in doubt; see [`open_from_before`]).
    pub(crate) in_doubt_wait: Duration,
}

/// Where a read of a partition ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadEnd {
    /// Read to `next` (the next offset to read). `reached` tells whether the caller's
    /// [`Until::reached`] said so, or the partition simply had nothing more: no open
    /// transaction hid anything, yet the caller's condition did not hold.
    Read {
        /// The next offset to read.
        next: i64,
        /// Whether [`Until::reached`] held at the end.
        reached: bool,
    },
    /// The checkpoint lies past the partition's high watermark: the topic was recreated
    /// or truncated, and nothing of what the checkpoint describes is there.
    PastEnd {
        /// The next offset the caller thought it would read.
        checkpoint: i64,
        /// The partition's high watermark.
        high_watermark: i64,
    },
}

/// Reads `topic` [`partition`] under `read_committed` from `from` (the beginning when
/// `None`), turning each record into a `T` with `decode` (its offset, key and value,
/// borrowed from librdkafka's buffer: a replay of millions of records copies nothing it
/// does not keep) and handing them to `apply` in chunks of at most `chunk`, together with
/// the offset after the chunk's last record and the partition's high watermark (for
/// progress), until `until` says it has enough or the partition has nothing more to give.
/// Blocking: call it inside [`super::blocking`].
#[allow(
    clippy::too_many_arguments,
    reason = "one call site, each argument named there"
)]
pub(crate) fn read_partition<T>(
    options: &ClientOptions,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    chunk: usize,
    timeout: Duration,
    until: Until<'_>,
    mut decode: impl FnMut(i64, Option<&[u8]>, Option<&[u8]>) -> Result<T>,
    mut apply: impl FnMut(Vec<T>, i64, i64) -> Result<()>,
) -> Result<ReadEnd> {
    let operation = format!("replay `{topic}` [{partition}]");
    // librdkafka needs a group to assign partitions, though this reader commits nothing.
    // Named after the changelog (`<group>-txlog`), a prefixed ACL on the operator's group
    // name covers it on a secured cluster.
    let group = format!("{topic}-replay");
    let reader = |isolation: &str| -> Result<BaseConsumer<Reader>> {
        options
            .config(&[
                ("group.id", &group),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "true"),
                // Reaching the end is the goal: do not let the broker hold an empty fetch.
                ("fetch.wait.max.ms", "10"),
                // A replay drains the fetch queue as fast as redb takes it, and librdkafka
                // postpones the next fetch by this much whenever the queue was over
                // `queued.min.messages` (100,000 records; one 1 MiB fetch of changelog
                // records is ~60,000): at the default 1 s a replay of 2 M records spent
                // 13 of its 17 s waiting. At 10 ms it took 4 s.
                ("fetch.queue.backoff.ms", "10"),
                // Several partitions may replay at once (`replay_concurrency`): each reader
                // holds at most 8 MiB fetched ahead, not librdkafka's 64 MiB, so a restore
                // of large state values stays bounded. A 1 MiB fetch of the benchmark's
                // changelog records (~18 B each) is ~60,000 of them.
                ("queued.max.messages.kbytes", "8192"),
                ("isolation.level", isolation),
                ("auto.offset.reset", "earliest"),
                // A batch damaged on disk fails the replay (an error that is not
                // retriable) rather than be skipped, which would drop dedup entries.
                ("check.crcs", "true"),
            ])
            .create_with_context(Reader)
            .map_err(|e| known_topic_error(&operation, e))
    };
    let consumer = reader("read_committed")?;
    // Only asked for watermarks: under read_uncommitted they are the high watermark, not
    // the last stable offset.
    let meter = reader("read_uncommitted")?;
    let watermarks = || -> Result<(i64, i64, i64)> {
        let (low, high) = meter
            .fetch_watermarks(topic, partition, timeout)
            .map_err(|e| known_topic_error(format!("{operation}: high watermark"), e))?;
        let (_, stable) = consumer
            .fetch_watermarks(topic, partition, timeout)
            .map_err(|e| known_topic_error(format!("{operation}: last stable offset"), e))?;
        Ok((low, stable, high))
    };
    let (low, _, high) = watermarks()?;
    if let Some(checkpoint) = from
        && checkpoint > high
    {
        return Ok(ReadEnd::PastEnd {
            checkpoint,
            high_watermark: high,
        });
    }
    let start = match from {
        Some(offset) => Offset::Offset(offset.max(low)),
        None => Offset::Beginning,
    };
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, start)
        .map_err(|e| known_topic_error(&operation, e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| known_topic_error(&operation, e))?;

    let mut next = from.unwrap_or(low).max(low);
    let mut pending = Vec::with_capacity(chunk);
    let mut last_record = Instant::now();
    // Records read since the clock was last read: the clock is read when the reader
    // stops to look (a clock read per record was 5% of a replay's CPU).
    let mut read_since = false;
    let mut last_check = Instant::now();
    let mut at_end = false;
    let mut waiting: Option<(Instant, Instant)> = None;
    loop {
        if (until.cancelled)() {
            return Err(Error::Cancelled { what: operation });
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(message)) => {
                let offset = message.offset();
                pending.push(decode(offset, message.key(), message.payload())?);
                next = offset + 1;
                read_since = true;
                at_end = false;
                if pending.len() >= chunk {
                    apply(std::mem::take(&mut pending), next, high)?;
                }
                continue;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => at_end = true,
            Some(Err(error)) => {
                // Connections come back by themselves (a broker restarting, a network
                // blip): keep polling until the deadline rather than fail at once.
                let error = known_topic_error(&operation, error);
                if !error.is_retriable() {
                    return Err(error);
                }
                tracing::debug!(%error, "transient error while reading; polling on");
                continue;
            }
        }
        if std::mem::take(&mut read_since) {
            last_record = Instant::now();
        }
        // At the end the reader sees, or quiet for a while (librdkafka may not report an
        // end while the position is past the last stable offset): is it enough?
        if !at_end && last_check.elapsed() < CHECK_EVERY {
            continue;
        }
        last_check = Instant::now();
        if !pending.is_empty() {
            // `next` is still the offset after the last record: the position moves it
            // past commit markers only below.
            apply(std::mem::take(&mut pending), next, high)?;
        }
        // The position after the end may lie past the last record (commit markers).
        if let Ok(position) = consumer.position()
            && let Some(Offset::Offset(offset)) = position
                .find_partition(topic, partition)
                .map(|element| element.offset())
        {
            next = next.max(offset);
        }
        let (_, stable, high_now) = watermarks()?;
        // Not yet through what a read_committed reader can see: read on (the condition is
        // asked only at that end, so a slow first fetch never ends a replay early).
        if let Standing::ReadOn { early_end } = standing(at_end, next, stable) {
            if early_end {
                // The fault matrix lost a key's state to this: an end reported with
                // nothing read, right after an instance restarted, and the replay
                // believed it.
                tracing::info!(
                    partition,
                    at = next,
                    last_stable_offset = stable,
                    "an end of partition reported short of the last stable offset; reading on"
                );
                at_end = false;
            }
            if last_record.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: operation,
                    after: timeout,
                    detail: format!("stuck at offset {next} of {stable}"),
                });
            }
            continue;
        }
        let reached = (until.reached)()?;
        let waited = waiting.map(|(since, _)| since.elapsed());
        match at_the_end(
            reached,
            stable,
            high,
            high_now,
            waited,
            until.in_doubt_wait,
            until.wait,
        ) {
            AtTheEnd::Stop { reached } => return Ok(ReadEnd::Read { next, reached }),
            AtTheEnd::StopDespiteOpen => {
                tracing::warn!(
                    partition,
                    last_stable_offset = stable,
                    waited = ?waited,
                    "a transaction open since before the replay began is still open; the \
                     replay reached the group's committed offset, so it ends (a batch of this \
                     group in doubt would have been resolved by now)"
                );
                return Ok(ReadEnd::Read {
                    next,
                    reached: true,
                });
            }
            AtTheEnd::Hanging => {
                return Err(Error::HangingTransaction {
                    topic: topic.to_owned(),
                    partition,
                    last_stable_offset: stable,
                    high_watermark: high_now,
                    waited: waited.unwrap_or_default(),
                });
            }
            AtTheEnd::Wait => {}
        }
        // An open transaction hides what lies after the last stable offset. Look again
        // when more arrives or in a while, not at every poll; waiting is not being stuck.
        at_end = false;
        last_record = Instant::now();
        let (since, logged) = waiting.get_or_insert_with(|| {
            (until.on_wait)();
            tracing::info!(
                partition,
                last_stable_offset = stable,
                high_watermark = high_now,
                at = next,
                "an open transaction on the changelog hides committed records; waiting for it to end"
            );
            let now = Instant::now();
            (now, now)
        });
        if logged.elapsed() > LOG_EVERY {
            *logged = Instant::now();
            tracing::info!(
                partition,
                last_stable_offset = stable,
                high_watermark = high_now,
                waited = ?since.elapsed(),
                "still waiting for an open transaction on the changelog"
            );
        }
    }
}

/// Where a read at `next` stands against the end a `read_committed` reader can see now
/// (`stable`, the last stable offset, just fetched). An end of partition librdkafka
/// reported (`at_end`) does not settle it: it is reported against the offsets of the
/// fetch that saw it, which may be older or from a leader that had not caught up, and
/// believed short of `stable`, a replay ends with committed records unread. At the true
/// end the position is the last stable offset, commit markers and aborted records
/// included, so `next < stable` means records are left.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Standing {
    /// Records are left: read on. `early_end`: an end was reported anyway.
    ReadOn { early_end: bool },
    /// At the end the reader sees: ask whether it is enough.
    AtTheEnd,
}

/// Whether a transaction that was open when the read began still holds the last
/// stable offset (`stable`, now) below the high watermark the read began with
/// (`high_at_start`): then the read must not end, even when what it read reaches its
/// goal. During a coordinator failover the group's committed offset read before a
/// replay can lag a batch whose commit is in doubt: its changelog records are still
/// hidden, the replay "reached" the stale offset, the new owner redid the batch
/// without its dedup entries, and when the markers landed both were visible (hole F
/// of issue 40). A transaction begun after the read began cannot be such a batch. The
/// wait is bounded as every wait for an open transaction is.
pub(crate) fn open_from_before(stable: i64, high_at_start: i64) -> bool {
    stable < high_at_start
}

/// What a read does once it is at the end a `read_committed` reader can see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtTheEnd {
    /// It ends; `reached` says whether the caller's condition held (if not, nothing was
    /// hidden either: more will not come).
    Stop { reached: bool },
    /// It reached its goal, and the transaction open since before it began is still
    /// open after `in_doubt_wait`: not this group's batch in doubt (that would have been
    /// resolved by now), so it ends.
    StopDespiteOpen,
    /// An open transaction hides committed records: wait for it to end.
    Wait,
    /// It waited longer than `wait` for an open transaction.
    Hanging,
}

/// The one rule for when a replay may end, shared by the reader of the broker and the
/// test driver's in-memory one (so the simulation searches the rule the engine runs):
/// `reached` is the caller's condition, `stable` and `high_now` the partition's last
/// stable offset and high watermark now, `high_at_start` the high watermark when the
/// read began, `waited` how long it has waited for an open transaction so far (none:
/// it has not).
///
/// It ends when it reached its goal and nothing open since before it began holds the
/// last stable offset back (hole F of issue 40, see [`open_from_before`]), or nothing
/// is hidden at all; it waits while something is, at most `in_doubt_wait` once the goal
/// is reached and `wait` in any case.
pub(crate) fn at_the_end(
    reached: bool,
    stable: i64,
    high_at_start: i64,
    high_now: i64,
    waited: Option<Duration>,
    in_doubt_wait: Duration,
    wait: Duration,
) -> AtTheEnd {
    if reached && !open_from_before(stable, high_at_start) {
        return AtTheEnd::Stop { reached: true };
    }
    if reached && waited.is_some_and(|waited| waited > in_doubt_wait) {
        return AtTheEnd::StopDespiteOpen;
    }
    if stable >= high_now {
        return AtTheEnd::Stop { reached: false };
    }
    if waited.is_some_and(|waited| waited > wait) {
        return AtTheEnd::Hanging;
    }
    AtTheEnd::Wait
}

pub(super) fn standing(at_end: bool, next: i64, stable: i64) -> Standing {
    if next < stable {
        Standing::ReadOn { early_end: at_end }
    } else {
        Standing::AtTheEnd
    }
}

/// Reads partition `partition` of `topic`, a topic onceflow owns, from its start to its
/// high watermark as of now under `read_committed`, handing each record to `each`: the
/// whole committed history, including what comes after a transaction that was open
/// when the read began (it waits for it, at most `wait`). Blocking.
pub(crate) fn read_partition_to_end(
    options: &ClientOptions,
    topic: &str,
    partition: i32,
    wait: Duration,
    mut each: impl FnMut(Record) -> Result<()>,
) -> Result<()> {
    let operation = format!("read `{topic}` [{partition}] to its end");
    let reader = |isolation: &str| -> Result<BaseConsumer> {
        options
            .config(&[
                ("group.id", "onceflow-reader"),
                ("enable.auto.commit", "false"),
                ("enable.partition.eof", "true"),
                ("fetch.wait.max.ms", "10"),
                ("isolation.level", isolation),
                ("auto.offset.reset", "earliest"),
            ])
            .create()
            .map_err(|e| known_topic_error(operation.as_str(), e))
    };
    // The high watermark: a read_committed consumer's watermark is the last stable offset.
    let (low, high) = reader("read_uncommitted")?
        .fetch_watermarks(topic, partition, wait)
        .map_err(|e| known_topic_error(operation.as_str(), e))?;
    if high <= low {
        return Ok(());
    }
    let consumer = reader("read_committed")?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Beginning)
        .map_err(|e| known_topic_error(operation.as_str(), e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| known_topic_error(operation.as_str(), e))?;
    let deadline = Instant::now() + wait;
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                each(to_record(&message))?;
                continue;
            }
            Some(Err(KafkaError::PartitionEOF(_))) | None => {}
            Some(Err(error)) => {
                let error = known_topic_error(operation.as_str(), error);
                if !error.is_retriable() {
                    return Err(error);
                }
            }
        }
        // Past the last record there may be transaction markers: the position tells.
        let at = consumer.position().ok().and_then(|list| {
            list.find_partition(topic, partition)
                .and_then(|p| p.offset().to_raw())
        });
        if at.is_some_and(|at| at >= high) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: operation,
                after: wait,
                detail: format!("at {at:?} of {high} (an open transaction on it?)"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::types::RDKafkaErrorCode;
    use tracing::Level;

    use super::*;
    use crate::kafka::error::levels_logged;

    #[test]
    fn a_transaction_open_before_the_read_began_keeps_it_from_ending() {
        // The read began with the high watermark at 100.
        assert!(open_from_before(90, 100), "open since 90: wait");
        assert!(!open_from_before(100, 100), "nothing open from before");
        assert!(!open_from_before(120, 100), "opened after the read began");
    }

    /// The fault matrix (CI, 2026-12-01): a replay ended at offset 0 of a changelog
    /// partition holding 600 batches' progress, the engine went on with empty state, and
    /// a key's running sum started again. An end of partition reported short of the last
    /// stable offset is not the end.
    #[test]
    fn a_reported_end_short_of_the_last_stable_offset_is_not_the_end() {
        let read_on = |early_end| Standing::ReadOn { early_end };
        assert_eq!(standing(true, 0, 1_207), read_on(true), "an early end");
        assert_eq!(standing(false, 1_000, 1_207), read_on(false));
        assert_eq!(standing(true, 1_207, 1_207), Standing::AtTheEnd);
        assert_eq!(standing(false, 1_207, 1_207), Standing::AtTheEnd, "quiet");
        assert_eq!(
            standing(true, 1_208, 1_207),
            Standing::AtTheEnd,
            "past a marker"
        );
    }

    /// Item 16: every replay reached the end of its partition, and librdkafka reports
    /// that through the error callback; logged as ERROR it taught operators to ignore
    /// ERROR. It is routine; a real error is still a warning.
    #[test]
    fn the_end_of_a_partition_is_not_logged_as_an_error() {
        let levels = levels_logged(|| {
            Reader.error(
                KafkaError::Global(RDKafkaErrorCode::PartitionEOF),
                "Fetch from broker 1 reached end of partition",
            );
            Reader.error(
                KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
                "Disconnected",
            );
        });
        assert_eq!(levels, [Level::TRACE, Level::WARN]);
    }
}
