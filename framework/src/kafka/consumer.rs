//! The input consumer: polled in batches, with rebalances reported between batches.
//!
//! The engine only ever polls when no transaction is open, and rebalance callbacks only
//! run inside a poll, so a revocation never finds an open transaction: that is how "the
//! open transaction is committed before partitions are revoked" holds, by construction.
//! The protocol is eager (librdkafka's default assignors): a rebalance revokes every
//! partition, and the engine replays the changelog of every partition it is then given.
//!
//! Work that keeps the engine from polling for long (a replay, a wait for an open
//! transaction, back-off) happens while the consumer is *held*: every assigned partition
//! paused, so polls return no records, and polled regularly anyway, so librdkafka does
//! not take the member out of the group when `max.poll.interval.ms` passes. Partitions
//! assigned while held are paused in the callback itself; a partition is resumed when it
//! is assigned while not held, so none can stay paused by a hold it outlived.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, Offset, Statistics, TopicPartitionList};

use super::{ClientOptions, Record, kafka_error, types::to_record};
use crate::Result;
use crate::blocking::blocking;

/// A change of assignment, as seen between two batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rebalanced {
    /// These partitions were taken away.
    Revoked(Vec<i32>),
    /// These partitions were given (their records may follow in the same poll).
    Assigned(Vec<i32>),
}

/// Records rebalances as librdkafka reports them, for the engine to act on.
#[derive(Default)]
pub(crate) struct RebalanceLog {
    events: Mutex<Vec<Rebalanced>>,
    /// The consumer is held (see the module's documentation): pause what is assigned.
    holding: AtomicBool,
}

impl ClientContext for RebalanceLog {
    fn error(&self, error: KafkaError, reason: &str) {
        super::error::log_client_error(error, reason);
    }

    /// librdkafka's statistics (every `statistics.interval.ms`) give each assigned
    /// partition's consumer lag: the last stable offset less the next offset the engine
    /// takes. Offsets commit through the producer's transaction, which librdkafka's own
    /// `consumer_lag` (based on the consumer's commits) does not see.
    fn stats(&self, statistics: Statistics) {
        for topic in statistics.topics.values() {
            for (partition, stats) in &topic.partitions {
                if *partition < 0 {
                    continue;
                }
                let end = if stats.ls_offset >= 0 {
                    stats.ls_offset
                } else {
                    stats.hi_offset
                };
                let next = if stats.app_offset >= 0 {
                    stats.app_offset
                } else {
                    stats.committed_offset
                };
                if end >= 0 && next >= 0 {
                    metrics::gauge!("onceflow_consumer_lag", "partition" => partition.to_string())
                        .set((end - next).max(0) as f64);
                }
            }
        }
    }
}

impl ConsumerContext for RebalanceLog {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            self.push(Rebalanced::Revoked(partitions(list)));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            // librdkafka keeps a partition's pause across revocation and assignment.
            let paused = if self.holding.load(Ordering::SeqCst) {
                consumer.pause(list)
            } else {
                consumer.resume(list)
            };
            if let Err(error) = paused {
                // Not expected for partitions just assigned; the engine's next hold or
                // release sets them again.
                tracing::warn!(%error, "pausing or resuming newly assigned partitions");
            }
            self.push(Rebalanced::Assigned(partitions(list)));
        }
    }
}

impl RebalanceLog {
    fn push(&self, event: Rebalanced) {
        tracing::info!(?event, "rebalance");
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }

    fn take(&self) -> Vec<Rebalanced> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The records per partition librdkafka keeps fetched ahead at least, whatever the batch.
const MIN_PREFETCH: usize = 1_000;
/// The kilobytes of input librdkafka holds fetched ahead, at least, across all partitions.
const MIN_PREFETCH_KBYTES: usize = 2_048;
/// How long librdkafka waits before fetching a partition again once its queue was over
/// `queued.min.messages` or `queued.max.messages.kbytes` (librdkafka's default: 1 s).
const FETCH_QUEUE_BACKOFF_MS: &str = "1";

/// The input consumer's configuration. Its defaults (a user's own value of each wins) size
/// the prefetch for one batch per partition, not for librdkafka's 100,000 records per
/// partition.
///
/// - `queued.min.messages`: librdkafka fetches ahead until each partition's queue holds
///   this many records (default 100,000, bounded only by `queued.max.messages.kbytes`,
///   64 MiB). With that default the benchmark's consumer held the whole 200,000-event
///   input, ~55 MiB of fetch buffers and messages: half the contender's heap at its peak.
/// - `queued.max.messages.kbytes`: the bytes fetched ahead across all partitions (the
///   consumer queue is one for the whole group member); it wins over
///   `queued.min.messages`. librdkafka's 64 MiB let the per-partition count hold a batch
///   for every partition, eight batches at eight partitions. The default here is 2 MiB,
///   or an eighth of a kilobyte per record of a batch when that is more. At the
///   benchmark's batches of 10,000 records of ~200 B (2026-12-06, medians of three runs
///   each, interleaved): librdkafka's 64 MiB peaked at 82.7/84.9/83.9 MiB RSS and made
///   161.7k/161.5k/168.1k events/s; 4 MiB 65.5-70.5 MiB and 169.1k-184.9k; 2 MiB
///   62.1/62.8/63.3 MiB and 174.2k/176.1k/176.2k. The fetcher refills while a batch
///   commits, so less than a batch ahead did not starve the engine. librdkafka also
///   lowers `fetch.max.bytes` to the bound (not below `message.max.bytes`, 1 MB), so one
///   fetch brings at most that much.
/// - `fetch.queue.backoff.ms`: once a queue was over either mark, librdkafka waits this
///   long before fetching the partition again. At its default 1 s a queue sized for a
///   batch runs dry and the engine waits for input (a 10,000-record prefetch with the 1 s
///   backoff processed 38,586 events/s where the default queue made 111,619). With the
///   2 MiB bound, 10 ms held large records back: one fetch of at most 2 MiB, then a wait.
///   In single sweep runs, 1 kB records made 117k/104k events/s at 10 ms, 142k/128k at
///   1 ms and 125k-151k with librdkafka's 64 MiB bound; 10 kB records 31k/25k, 43k/32k
///   and 38k-55k (2026-12-06). A full queue's partition is looked at again every
///   millisecond by its broker thread, which does nothing else then.
/// - `statistics.interval.ms`: statistics feed the lag metric every 5 s.
/// - `check.crcs`: librdkafka checks each fetched batch's CRC (its default is not to, the
///   Java consumer's is to), so a batch damaged on the broker's disk or on the way stops
///   the instance (see `unreadable`) rather than reach the processor as other data.
fn input_config(
    options: &ClientOptions,
    group: &str,
    instance_id: &str,
    max_batch_records: usize,
) -> rdkafka::ClientConfig {
    let prefetch = max_batch_records.max(MIN_PREFETCH).to_string();
    let prefetch_kbytes = (max_batch_records / 8).max(MIN_PREFETCH_KBYTES).to_string();
    options.config_with_defaults(
        &[
            ("queued.min.messages", &prefetch),
            ("queued.max.messages.kbytes", &prefetch_kbytes),
            ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS),
            ("statistics.interval.ms", "5000"),
            ("check.crcs", "true"),
        ],
        &[
            ("group.id", group),
            ("group.instance.id", instance_id),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
            // Records of aborted transactions, and of open ones, are never processed.
            ("isolation.level", "read_committed"),
            ("partition.assignment.strategy", "range,roundrobin"),
        ],
    )
}

fn partitions(list: &TopicPartitionList) -> Vec<i32> {
    list.elements().iter().map(|e| e.partition()).collect()
}

/// What one call of librdkafka's poll gives: a record, an error or nothing, and the
/// rebalances its callbacks served (before the record: librdkafka discards records of
/// revoked partitions, so a record it returns belongs to the current assignment).
type PollOnce = (
    Option<std::result::Result<Record, KafkaError>>,
    Vec<Rebalanced>,
);

/// One batch's worth of polls: until `max_records` records, `max_wait`, or a rebalance,
/// whichever comes first; at `max_wait`, what has already arrived is taken too (so a
/// batch whose wait is over before it starts still gets what came meanwhile, up to
/// `max_records`). Records gathered before a revocation of their partition are
/// dropped (whoever owns it next reads them again from the committed offset). A consumer
/// error never drops what was gathered: librdkafka's position is already past it, so
/// returning the error without it would lose it (the next batch would commit beyond). Only
/// a fatal error (or being fenced) is returned.
fn gather(
    mut poll_once: impl FnMut(Duration) -> PollOnce,
    max_records: usize,
    max_wait: Duration,
    topic: &str,
    instance_id: &str,
) -> Result<Polled> {
    let deadline = Instant::now() + max_wait;
    let mut polled = Polled::default();
    // A poll first takes what has arrived, without waiting: while records keep coming
    // nobody reads a clock (neither this loop nor librdkafka, which reads one for any
    // poll that may wait). Only when nothing has arrived does the next poll wait, until
    // the deadline; past it, nothing waits and an empty poll ends the gathering.
    let mut wait = Duration::ZERO;
    while polled.records.len() < max_records {
        let (message, rebalances) = poll_once(wait);
        wait = Duration::ZERO;
        for event in &rebalances {
            if let Rebalanced::Revoked(revoked) = event {
                polled.records.retain(|r| !revoked.contains(&r.partition));
            }
        }
        let rebalanced = !rebalances.is_empty();
        polled.rebalances.extend(rebalances);
        match message {
            Some(Ok(record)) => polled.records.push(record),
            None => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                wait = left.min(Duration::from_millis(50));
            }
            Some(Err(error)) => {
                if let Some(stop) = stopping(error, topic, instance_id) {
                    return Err(stop);
                }
                // Hand over what was gathered now; an error with nothing gathered is
                // polled past (until the deadline).
                let left = deadline.saturating_duration_since(Instant::now());
                if !polled.records.is_empty() || left.is_zero() {
                    break;
                }
                wait = left.min(Duration::from_millis(50));
            }
        }
        if rebalanced {
            break;
        }
    }
    Ok(polled)
}

/// The committed offsets in the broker's answers, `(partition, error, offset)` each: a
/// partition's own error is an error, never "nothing committed" (taking it for that would
/// seek to the beginning and process the partition again).
fn committed_offsets(
    topic: &str,
    answers: Vec<(i32, rdkafka::error::KafkaResult<()>, Offset)>,
) -> Result<Vec<(i32, Option<i64>)>> {
    answers
        .into_iter()
        .map(|(partition, error, offset)| {
            error.map_err(|error| {
                kafka_error(
                    format!("read the committed offset of `{topic}` [{partition}]"),
                    error,
                )
            })?;
            Ok(match offset {
                Offset::Offset(offset) => (partition, Some(offset)),
                _ => (partition, None),
            })
        })
        .collect()
}

/// What a consumer error in a poll means: `Some` error that stops the instance (fenced,
/// fatal), or `None` after saying what happened (the poll goes on).
fn stopping(error: KafkaError, topic: &str, instance_id: &str) -> Option<crate::Error> {
    if let KafkaError::PartitionEOF(_) = error {
        // Routine; the engine's own consumer does not ask for it.
        return None;
    }
    let consume = crate::Operation::Consume {
        topic: topic.to_owned(),
    };
    if let KafkaError::MessageConsumption(code) = &error
        && unreadable(*code)
    {
        return Some(crate::Error::Kafka {
            operation: consume,
            code: super::error::code_of(*code),
            message: format!(
                "{error}: librdkafka could not read a batch of records (its log names the \
                 partition and offset) and skips it or fetches it again; going on would \
                 commit offsets past records never processed, so the instance stops"
            ),
            class: crate::error::ErrorClass::Fatal,
            cause: None,
        });
    }
    let error = kafka_error(consume, error);
    if error.has_code(super::error::code_of(
        rdkafka::types::RDKafkaErrorCode::FencedInstanceId,
    )) {
        return Some(crate::Error::Fenced {
            what: format!("group.instance.id `{instance_id}`"),
            detail: error.to_string(),
        });
    }
    if error.is_fatal() {
        return Some(error);
    }
    tracing::warn!(%error, "consumer error during a poll; going on with what was gathered");
    None
}

/// Whether a consume error means librdkafka could not read a batch of records it fetched:
/// one that failed its CRC (`check.crcs`, on by default here), which librdkafka skips and
/// goes on past; one of a message format it does not know, skipped too; or one it could
/// not decompress (a codec it was built without, or corrupt data), fetched again forever.
fn unreadable(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(code, C::BadMessage | C::NotImplemented | C::BadCompression)
}

/// Who a group has under an instance ID, after that instance's consumer was fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The member under the instance ID, if any.
    pub(crate) member: Option<String>,
    /// The group is stable (no rebalance under way).
    pub(crate) stable: bool,
}

/// Whether `member_id` is a static member's under `instance_id`. Kafka names a static
/// member `<instance ID>-<UUID>`: 22 characters of base64 (the KRaft-era coordinator) or
/// 36 of hex and dashes (the older one); a UUID may itself hold dashes, so the length
/// decides, and instance `a` is not mistaken for `a-2`.
fn is_under(member_id: &str, instance_id: &str) -> bool {
    member_id
        .strip_prefix(instance_id)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|uuid| uuid.len() == 22 || uuid.len() == 36)
}

/// One poll's worth of input.
#[derive(Debug, Default)]
pub(crate) struct Polled {
    pub(crate) records: Vec<Record>,
    pub(crate) rebalances: Vec<Rebalanced>,
}

/// The consumer of the input topic, in the operator's group.
#[derive(Clone)]
pub(crate) struct InputConsumer {
    pub(super) consumer: Arc<BaseConsumer<RebalanceLog>>,
    topic: String,
    instance_id: String,
    group: String,
    options: ClientOptions,
}

impl std::fmt::Debug for InputConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputConsumer")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl InputConsumer {
    /// Subscribes to `topic` in `group` (auto-commit off: offsets move only when the engine
    /// says so).
    ///
    /// The member is static (`group.instance.id` = the instance ID): a restarted instance
    /// takes its old place at once instead of waiting out the dead member's session. Its
    /// prefetch is sized for batches of `max_batch_records` (see [`input_config`]).
    pub(crate) fn subscribe(
        options: &ClientOptions,
        group: &str,
        instance_id: &str,
        topic: &str,
        max_batch_records: usize,
    ) -> Result<Self> {
        let consumer: BaseConsumer<RebalanceLog> =
            input_config(options, group, instance_id, max_batch_records)
                .create_with_context(RebalanceLog::default())
                .map_err(|e| kafka_error(format!("create the consumer of `{topic}`"), e))?;
        consumer
            .subscribe(&[topic])
            .map_err(|e| kafka_error(format!("subscribe to `{topic}`"), e))?;
        Ok(InputConsumer {
            consumer: Arc::new(consumer),
            topic: topic.to_owned(),
            instance_id: instance_id.to_owned(),
            group: group.to_owned(),
            options: options.clone(),
        })
    }

    /// Polls until `max_records` records, `max_wait`, or a rebalance, whichever comes
    /// first. Records polled before a revocation are dropped: they were not processed,
    /// and whoever owns the partition next reads them again from the committed offset.
    pub(crate) async fn poll(&self, max_records: usize, max_wait: Duration) -> Result<Polled> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        let instance_id = self.instance_id.clone();
        blocking("poll", move || {
            let poll_once = |timeout| {
                let message = consumer.poll(timeout).map(|m| m.map(|m| to_record(&m)));
                // Rebalance callbacks ran inside that poll.
                (message, consumer.context().take())
            };
            gather(poll_once, max_records, max_wait, &topic, &instance_id)
        })
        .await
    }

    /// Holds the consumer (see the module's documentation): pauses every assigned
    /// partition, and every one assigned until [`InputConsumer::release`]. Call
    /// [`InputConsumer::keep_alive`] well within `max.poll.interval.ms` meanwhile.
    pub(crate) async fn hold(&self) -> Result<()> {
        self.set_held(true).await
    }

    /// Polls a held consumer, so its member stays in the group: returns the rebalances
    /// it served (a partition assigned now is paused too) and any record it returned
    /// (none is expected while everything is paused; one that comes is kept, in order).
    /// Fails only with a fatal error (fenced, for one).
    pub(crate) async fn keep_alive(&self) -> Result<Polled> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        let instance_id = self.instance_id.clone();
        blocking("poll", move || {
            let mut polled = Polled::default();
            // Every queued event, not only the first; bounded, a poll is not the work.
            for _ in 0..100 {
                let message = consumer.poll(Duration::ZERO);
                for event in consumer.context().take() {
                    if let Rebalanced::Revoked(revoked) = &event {
                        polled.records.retain(|r| !revoked.contains(&r.partition));
                    }
                    polled.rebalances.push(event);
                }
                match message {
                    None => break,
                    Some(Ok(message)) => polled.records.push(to_record(&message)),
                    Some(Err(error)) => {
                        if let Some(stop) = stopping(error, &topic, &instance_id) {
                            return Err(stop);
                        }
                    }
                }
            }
            Ok(polled)
        })
        .await
    }

    /// Ends a hold: resumes every assigned partition, whose fetching goes on from the
    /// position the application reached (or, for one it never read, the committed offset).
    pub(crate) async fn release(&self) -> Result<()> {
        self.set_held(false).await
    }

    /// Starts or ends a hold: pauses or resumes every assigned partition.
    async fn set_held(&self, held: bool) -> Result<()> {
        let consumer = Arc::clone(&self.consumer);
        let what = if held {
            "pause the input"
        } else {
            "resume the input"
        };
        blocking(what, move || {
            consumer.context().holding.store(held, Ordering::SeqCst);
            let assigned = consumer
                .assignment()
                .map_err(|e| kafka_error("read the assignment", e))?;
            let done = if held {
                consumer.pause(&assigned)
            } else {
                consumer.resume(&assigned)
            };
            done.map_err(|e| kafka_error(what, e))
        })
        .await
    }

    /// The partitions assigned now.
    pub(crate) async fn assigned(&self) -> Result<Vec<i32>> {
        let consumer = Arc::clone(&self.consumer);
        blocking("read the assignment", move || {
            let assigned = consumer
                .assignment()
                .map_err(|e| kafka_error("read the assignment", e))?;
            Ok(partitions(&assigned))
        })
        .await
    }

    /// The group's committed offset of each partition (`None`: nothing committed). With
    /// `read_committed` librdkafka asks for stable offsets, so a pending transactional
    /// commit is waited for, not read past.
    pub(crate) async fn committed(&self, partitions: Vec<i32>) -> Result<Vec<(i32, Option<i64>)>> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        blocking("read committed offsets", move || {
            let mut query = TopicPartitionList::new();
            for partition in partitions {
                query.add_partition(&topic, partition);
            }
            let committed = consumer
                .committed_offsets(query, Duration::from_secs(30))
                .map_err(|e| kafka_error(format!("read committed offsets of `{topic}`"), e))?;
            let answers = committed
                .elements()
                .iter()
                .map(|e| (e.partition(), e.error(), e.offset()))
                .collect();
            committed_offsets(&topic, answers)
        })
        .await
    }

    /// Moves each partition's fetch position to `offset` (`None`: the beginning).
    pub(crate) async fn seek(&self, positions: Vec<(i32, Option<i64>)>) -> Result<()> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        blocking("seek", move || {
            for (partition, offset) in positions {
                consumer
                    .seek(
                        &topic,
                        partition,
                        offset.map_or(Offset::Beginning, Offset::Offset),
                        Duration::from_secs(10),
                    )
                    .map_err(|e| {
                        kafka_error(format!("seek `{topic}` [{partition}] to {offset:?}"), e)
                    })?;
            }
            Ok(())
        })
        .await
    }

    /// Commits offsets outside any transaction (the two weaker delivery modes).
    pub(crate) async fn commit(&self, offsets: Vec<(i32, i64)>) -> Result<()> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        blocking("commit offsets", move || {
            let mut list = TopicPartitionList::new();
            for (partition, offset) in offsets {
                list.add_partition_offset(&topic, partition, Offset::Offset(offset))
                    .map_err(|e| kafka_error("commit offsets", e))?;
            }
            consumer
                .commit(&list, rdkafka::consumer::CommitMode::Sync)
                .map_err(|e| kafka_error(format!("commit offsets of `{topic}`"), e))
        })
        .await
    }

    /// The fatal error librdkafka raised on this consumer, if any. A member that joined
    /// with the same `group.instance.id` fences this one: it was replaced, and whoever
    /// replaced it owns the partitions (and the transactional ID) now.
    pub(crate) fn fatal_error(&self) -> Option<crate::Error> {
        let (code, reason) = self.consumer.client().fatal_error()?;
        Some(match code {
            rdkafka::types::RDKafkaErrorCode::FencedInstanceId => crate::Error::Fenced {
                what: format!("group.instance.id `{}`", self.instance_id),
                detail: reason,
            },
            code => kafka_error(
                crate::Operation::Consume {
                    topic: self.topic.clone(),
                },
                KafkaError::MessageConsumptionFatal(code),
            ),
        })
    }

    /// Whether librdkafka fenced this consumer's static membership (a fatal
    /// `FENCED_INSTANCE_ID`): someone joined under its `group.instance.id`.
    pub(crate) fn member_fenced(&self) -> bool {
        self.consumer
            .client()
            .fatal_error()
            .is_some_and(|(code, _)| code == rdkafka::types::RDKafkaErrorCode::FencedInstanceId)
    }

    /// Who the group has under this consumer's instance ID: the member's ID (a static
    /// member's is the instance ID, a dash and a UUID), if any, and whether the group is
    /// stable. Asked of the group coordinator (DescribeGroups) through a client of its
    /// own, since a fenced consumer's handle is spent. `Err`: the group could not be
    /// described (its coordinator away).
    pub(crate) async fn holder(&self) -> Result<Holder> {
        let options = self.options.clone();
        let group = self.group.clone();
        let instance_id = self.instance_id.clone();
        blocking("describe the group", move || {
            let doing = || format!("describe the group `{group}`");
            let lister: BaseConsumer = options
                .config(&[])
                .create()
                .map_err(|e| kafka_error(doing(), e))?;
            let list = lister
                .fetch_group_list(Some(&group), Duration::from_secs(10))
                .map_err(|e| kafka_error(doing(), e))?;
            let Some(described) = list.groups().iter().find(|g| g.name() == group) else {
                return Err(crate::Error::Timeout {
                    what: doing(),
                    after: Duration::from_secs(10),
                    detail: "the group's coordinator did not describe it".into(),
                });
            };
            let member = described
                .members()
                .iter()
                .map(|m| m.id())
                .find(|id| is_under(id, &instance_id))
                .map(str::to_owned);
            let holder = Holder {
                member,
                stable: described.state() == "Stable",
            };
            tracing::debug!(
                state = described.state(),
                ?holder,
                "the group, after this consumer was fenced"
            );
            Ok(holder)
        })
        .await
    }

    /// The consumer's current generation in its group, for the offsets of a
    /// transaction (see [`super::Producer::send_offsets`]).
    pub(crate) fn group_metadata(&self) -> Result<super::GroupMetadata> {
        super::GroupMetadata::of(&*self.consumer)
    }

    /// How long the group keeps a member that stopped heartbeating (`session.timeout.ms`).
    pub(crate) fn session_timeout(&self) -> Duration {
        let millis = self
            .options
            .property("session.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(45_000);
        Duration::from_millis(millis)
    }

    /// Leaves the group (revoking every partition), so others take over at once.
    pub(crate) async fn close(self) -> Result<()> {
        let consumer = self.consumer;
        blocking("leave the group", move || {
            consumer.unsubscribe();
            // Serve the revocation callback that leaving triggers.
            let _ = consumer.poll(Duration::from_millis(100));
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};

    use super::*;

    fn record(partition: i32, offset: i64) -> Record {
        Record {
            topic: "orders".into(),
            partition,
            offset,
            key: None,
            value: Some(b"x".to_vec()),
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    /// Polls that return `script` in order, then nothing.
    fn scripted(script: Vec<PollOnce>) -> impl FnMut(Duration) -> PollOnce {
        let mut script = script.into_iter();
        move |_| script.next().unwrap_or((None, Vec::new()))
    }

    fn gathered(script: Vec<PollOnce>) -> Result<Polled> {
        gather(
            scripted(script),
            100,
            Duration::from_millis(30),
            "orders",
            "a",
        )
    }

    fn positions(polled: &Polled) -> Vec<(i32, i64)> {
        polled
            .records
            .iter()
            .map(|r| (r.partition, r.offset))
            .collect()
    }

    fn consumption(code: C) -> PollOnce {
        (Some(Err(KafkaError::MessageConsumption(code))), Vec::new())
    }

    #[test]
    fn a_consumer_error_keeps_the_records_gathered_before_it() {
        for code in [
            C::BrokerTransportFailure,
            C::RequestTimedOut,
            C::UnknownTopicOrPartition,
        ] {
            let polled = gathered(vec![
                (Some(Ok(record(0, 0))), Vec::new()),
                (Some(Ok(record(0, 1))), Vec::new()),
                consumption(code),
                (Some(Ok(record(0, 2))), Vec::new()),
            ])
            .unwrap_or_else(|e| panic!("{code:?}: the gathered records were dropped: {e}"));
            // Handed over at the error; the record after it comes with the next poll.
            assert_eq!(positions(&polled), [(0, 0), (0, 1)], "{code:?}");
        }
    }

    #[test]
    fn an_error_before_any_record_is_polled_past() {
        let polled = gathered(vec![
            consumption(C::BrokerTransportFailure),
            (Some(Err(KafkaError::PartitionEOF(0))), Vec::new()),
            (Some(Ok(record(1, 7))), Vec::new()),
        ])
        .expect("polled past");
        assert_eq!(positions(&polled), [(1, 7)]);
    }

    #[test]
    fn a_revocation_drops_only_the_revoked_partitions_records_and_ends_the_poll() {
        let polled = gathered(vec![
            (Some(Ok(record(0, 0))), Vec::new()),
            (Some(Ok(record(1, 0))), Vec::new()),
            (Some(Ok(record(1, 1))), vec![Rebalanced::Revoked(vec![0])]),
            (Some(Ok(record(1, 2))), Vec::new()),
        ])
        .expect("polled");
        assert_eq!(positions(&polled), [(1, 0), (1, 1)]);
        assert_eq!(polled.rebalances, [Rebalanced::Revoked(vec![0])]);
    }

    #[test]
    fn a_poll_whose_wait_is_over_takes_what_has_arrived_up_to_the_limit() {
        let script = || {
            vec![
                (Some(Ok(record(0, 0))), Vec::new()),
                (Some(Ok(record(1, 0))), Vec::new()),
                (Some(Ok(record(0, 1))), Vec::new()),
                // The queue is empty: the poll ends here, what follows is the next one's.
                (None, Vec::new()),
                (Some(Ok(record(0, 2))), Vec::new()),
            ]
        };
        let polled =
            gather(scripted(script()), 100, Duration::ZERO, "orders", "a").expect("polled");
        assert_eq!(positions(&polled), [(0, 0), (1, 0), (0, 1)]);
        let polled = gather(scripted(script()), 2, Duration::ZERO, "orders", "a").expect("polled");
        assert_eq!(positions(&polled), [(0, 0), (1, 0)]);
        // An error with nothing gathered ends it too: nothing waits past the deadline.
        let polled = gather(
            scripted(vec![
                consumption(C::BrokerTransportFailure),
                (Some(Ok(record(0, 0))), Vec::new()),
            ]),
            100,
            Duration::ZERO,
            "orders",
            "a",
        )
        .expect("polled");
        assert!(polled.records.is_empty());
    }

    #[test]
    fn a_static_members_id_is_its_instance_id_and_a_uuid() {
        let kraft = "a-Zm9vYmFyYmF6cXV4cXV1dQ";
        let classic = "a-0b6f1c2e-8d3a-4e5f-9a7b-1c2d3e4f5a6b";
        assert!(is_under(kraft, "a") && is_under(classic, "a"));
        // Instance `a-2`'s member, or a dynamic member, is not under `a`.
        assert!(!is_under("a-2-Zm9vYmFyYmF6cXV4cXV1dQ", "a"));
        assert!(is_under("a-2-Zm9vYmFyYmF6cXV4cXV1dQ", "a-2"));
        assert!(!is_under("rdkafka-Zm9vYmFyYmF6cXV4cXV1dQ", "a"));
    }

    #[test]
    fn a_batch_librdkafka_cannot_read_stops_the_instance() {
        // librdkafka skips a batch that fails its CRC or has an unknown format, and
        // fetches again one it cannot decompress: none may be polled past.
        for code in [C::BadMessage, C::NotImplemented, C::BadCompression] {
            let polled = gathered(vec![
                (Some(Ok(record(0, 0))), Vec::new()),
                consumption(code),
                (Some(Ok(record(0, 9))), Vec::new()),
            ]);
            let error = polled.expect_err("an unreadable batch was polled past");
            assert!(error.is_fatal(), "{code:?}: {error}");
            assert!(
                error.to_string().contains("could not read a batch"),
                "{error}"
            );
        }
    }

    #[test]
    fn being_fenced_or_a_fatal_error_stops() {
        let fenced = gathered(vec![
            (Some(Ok(record(0, 0))), Vec::new()),
            consumption(C::FencedInstanceId),
        ]);
        assert!(
            matches!(fenced, Err(crate::Error::Fenced { .. })),
            "{fenced:?}"
        );
        let fatal = gathered(vec![(
            Some(Err(KafkaError::MessageConsumptionFatal(
                C::InconsistentGroupProtocol,
            ))),
            Vec::new(),
        )]);
        assert!(
            fatal.as_ref().is_err_and(crate::Error::is_fatal),
            "{fatal:?}"
        );
    }

    #[test]
    fn a_partitions_error_reading_committed_offsets_is_an_error_not_the_beginning() {
        let answers = vec![
            (0, Ok(()), Offset::Offset(42)),
            (1, Ok(()), Offset::Invalid),
            (
                2,
                Err(KafkaError::OffsetFetch(C::UnstableOffsetCommit)),
                Offset::Invalid,
            ),
        ];
        let failed = committed_offsets("orders", answers);
        let error = failed.expect_err("partition 2's error");
        assert!(error.to_string().contains("[2]"), "{error}");
        let answers = vec![
            (0, Ok(()), Offset::Offset(42)),
            (1, Ok(()), Offset::Invalid),
        ];
        assert_eq!(
            committed_offsets("orders", answers).expect("offsets"),
            [(0, Some(42)), (1, None)]
        );
    }

    #[test]
    fn only_a_poll_after_an_empty_one_waits() {
        let waits = std::cell::RefCell::new(Vec::new());
        let mut script = vec![
            (Some(Ok(record(0, 0))), Vec::new()),
            (Some(Ok(record(0, 1))), Vec::new()),
            (None, Vec::new()),
            (Some(Ok(record(0, 2))), Vec::new()),
            (Some(Ok(record(0, 3))), Vec::new()),
        ]
        .into_iter();
        let poll_once = |wait| {
            waits.borrow_mut().push(wait);
            script.next().unwrap_or((None, Vec::new()))
        };
        let polled = gather(poll_once, 4, Duration::from_secs(5), "orders", "a").expect("polled");
        assert_eq!(positions(&polled), [(0, 0), (0, 1), (0, 2), (0, 3)]);
        let waits = waits.into_inner();
        assert_eq!(waits.len(), 5, "{waits:?}");
        assert!(waits[3] > Duration::ZERO, "after the empty poll: {waits:?}");
        for (i, wait) in waits.iter().enumerate().filter(|(i, _)| *i != 3) {
            assert_eq!(*wait, Duration::ZERO, "poll {i}: {waits:?}");
        }
    }

    #[test]
    fn a_poll_ends_at_max_records() {
        let script = (0..10)
            .map(|o| (Some(Ok(record(0, o))), Vec::new()))
            .collect();
        let polled =
            gather(scripted(script), 4, Duration::from_secs(5), "orders", "a").expect("polled");
        assert_eq!(polled.records.len(), 4);
    }

    #[test]
    fn the_prefetch_is_sized_for_the_batch_and_a_users_own_settings_win() {
        let config = |properties: &[(&str, &str)], max_batch_records| {
            let properties: Vec<(String, String)> = properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let options = ClientOptions::with_properties("broker:9092", &properties);
            input_config(&options, "g", "a", max_batch_records)
        };
        let batch = config(&[], 10_000);
        assert_eq!(batch.get("queued.min.messages"), Some("10000"));
        // 2 MiB across all partitions, not librdkafka's 64 MiB.
        assert_eq!(batch.get("queued.max.messages.kbytes"), Some("2048"));
        // A large batch gets room for one of 128-byte records.
        assert_eq!(
            config(&[], 100_000).get("queued.max.messages.kbytes"),
            Some("12500")
        );
        assert_eq!(batch.get("fetch.queue.backoff.ms"), Some("1"));
        assert_eq!(batch.get("statistics.interval.ms"), Some("5000"));
        assert_eq!(batch.get("check.crcs"), Some("true"));
        // A small batch still keeps a thousand records per partition ahead.
        assert_eq!(config(&[], 1).get("queued.min.messages"), Some("1000"));
        let own = config(
            &[
                ("queued.min.messages", "50000"),
                ("queued.max.messages.kbytes", "65536"),
                ("fetch.queue.backoff.ms", "500"),
                ("statistics.interval.ms", "1000"),
                ("check.crcs", "false"),
                // What the engine needs is not the user's to change.
                ("enable.auto.commit", "true"),
            ],
            10_000,
        );
        assert_eq!(own.get("queued.min.messages"), Some("50000"));
        assert_eq!(own.get("queued.max.messages.kbytes"), Some("65536"));
        assert_eq!(own.get("fetch.queue.backoff.ms"), Some("500"));
        assert_eq!(own.get("statistics.interval.ms"), Some("1000"));
        assert_eq!(own.get("check.crcs"), Some("false"));
        assert_eq!(own.get("enable.auto.commit"), Some("false"));
    }
}
