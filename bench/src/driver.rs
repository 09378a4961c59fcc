//! The driver: runs the contenders in turn against one broker and measures each run.
//!
//! ```text
//!  for each run (contender, settings, repeat), on fresh topics:
//!   preload N events ─► start contender ─► read_committed reader counts N outputs
//!        throughput = N / (last output visible − first event processed)
//!        CPU seconds, peak RSS of the contender's processes (/proc)
//!   its changelog topics read to their end ─► records and bytes per input event
//!   offered load at R ev/s for S s ─► latency = visible − sent, per output (hdrhistogram),
//!        and its two parts: sent → handler, handler → visible
//!   kill the contender
//!   (a contender still short of N outputs at the run timeout: its rate over the outputs
//!    it made, marked unfinished, no latency phase; the caller decides what that means)
//!
//!  restore (onceflow exactly-once): one partition of N event IDs over K keys processed,
//!   the instance killed ─► a new one on an empty state directory: start → partition
//!   restored, start → first output ─► one on the killed one's directory: start → restored
//! ```
//!
//! - Every run gets its own input, output and group names, so nothing one contender left
//!   behind (offsets, changelog, transactional state) is seen by the next.
//! - Repeats are interleaved (a b c d, a b c d, …) so slow drift of the machine spreads
//!   over every contender instead of landing on one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use onceflow_testkit::Kafka;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::flow;
use crate::process::{Contender, Usage};
use crate::workload::{Load, Produced, now_us, produce};

/// The systems compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum System {
    /// a: raw rdkafka, no transaction, auto-commit.
    Raw,
    /// b: raw rdkafka, canonical transactional loop.
    RawTransactional,
    /// c: onceflow at-most-once.
    AtMostOnce,
    /// c: onceflow at-least-once.
    AtLeastOnce,
    /// c: onceflow exactly-once (dedup on).
    ExactlyOnce,
    /// d: Kafka Streams exactly_once_v2.
    Streams,
    /// e: a Rust peer, ruststream-rdkafka's exactly-once pipeline (`bench/peers/`).
    RustStream,
}

impl System {
    /// Every contender, in table order.
    pub const ALL: [System; 7] = [
        System::Raw,
        System::RawTransactional,
        System::AtMostOnce,
        System::AtLeastOnce,
        System::ExactlyOnce,
        System::Streams,
        System::RustStream,
    ];

    /// Its name on the command line.
    pub fn id(self) -> &'static str {
        match self {
            System::Raw => "raw",
            System::RawTransactional => "raw-txn",
            System::AtMostOnce => "onceflow-amo",
            System::AtLeastOnce => "onceflow-alo",
            System::ExactlyOnce => "onceflow-eo",
            System::Streams => "streams-eos2",
            System::RustStream => "ruststream-eo",
        }
    }

    /// Its row label in the report.
    pub fn label(self) -> &'static str {
        match self {
            System::Raw => "a. raw rdkafka, auto-commit",
            System::RawTransactional => "b. raw rdkafka, transactions",
            System::AtMostOnce => "c. onceflow at-most-once",
            System::AtLeastOnce => "c. onceflow at-least-once",
            System::ExactlyOnce => "c. onceflow exactly-once",
            System::Streams => "d. Kafka Streams exactly_once_v2",
            System::RustStream => "e. ruststream-rdkafka exactly-once",
        }
    }

    /// Whether it skips events whose ID it has seen.
    fn dedups(self) -> bool {
        matches!(
            self,
            System::AtMostOnce | System::AtLeastOnce | System::ExactlyOnce
        )
    }
}

impl std::str::FromStr for System {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        System::ALL
            .into_iter()
            .find(|s| s.id() == text)
            .ok_or_else(|| {
                let names: Vec<_> = System::ALL.iter().map(|s| s.id()).collect();
                format!("unknown contender `{text}`; one of {}", names.join(", "))
            })
    }
}

/// The settings of one run.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Who runs.
    pub system: System,
    /// Events preloaded for the throughput phase.
    pub events: u64,
    /// Event size in bytes.
    pub size: usize,
    /// Distinct keys.
    pub keys: u64,
    /// Share of duplicate event IDs.
    pub duplicates: f64,
    /// Partitions of the input and output topics.
    pub partitions: i32,
    /// Commit interval (onceflow, raw-txn, Kafka Streams).
    pub commit_interval: Duration,
    /// Records per batch at most (onceflow, raw-txn).
    pub max_batch: usize,
    /// Processes of the contender.
    pub instances: usize,
    /// Offered rate of the latency phase (0: no latency phase).
    pub latency_rate: u64,
    /// Events of the latency phase.
    pub latency_events: u64,
    /// IDs put in the dedup log before the throughput phase, by processing that many
    /// events first (0: none).
    pub dedup_preload: u64,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    /// Input events per second, first processed to last visible.
    pub throughput: f64,
    /// The load generator's own rate during the preload.
    pub generator_rate: f64,
    /// Latency percentiles in ms: p50, p99, p99.9 (None without a latency phase).
    pub latency_ms: Option<[f64; 3]>,
    /// The same percentiles of the latency's two parts: send → handler (the event's way
    /// to the contender's handler, its wait for a batch included) and handler → visible
    /// (the rest of its batch, the commit and the reader). Their sum is not the total's:
    /// each is a percentile of its own.
    pub latency_parts_ms: Option<[[f64; 3]; 2]>,
    /// CPU and RSS at the end of the throughput phase.
    pub usage: Usage,
    /// CPU µs per input event in the throughput phase.
    pub cpu_us_per_event: f64,
    /// What the contender wrote to its changelog topics (onceflow's `-txlog`, Kafka
    /// Streams' `-changelog`) by the end of the throughput phase; None for a contender
    /// without one.
    pub changelog: Option<Volume>,
    /// Set when the throughput phase ran out of time before every output was seen: the
    /// figures are of the outputs it did make, and there was no latency phase (its
    /// backlog would be in every latency).
    pub unfinished: Option<Unfinished>,
}

/// How far a throughput phase that ran out of time got.
#[derive(Debug, Clone, PartialEq)]
pub struct Unfinished {
    /// Outputs seen.
    pub seen: u64,
    /// Outputs expected.
    pub expected: u64,
    /// How long it had.
    pub patience: Duration,
}

/// Records and bytes of a set of topics, as a `read_committed` reader sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Volume {
    /// Records.
    pub records: u64,
    /// Key plus value bytes of those records (the record and batch framing, about 70 B
    /// per batch and up to 20 B per record uncompressed, not counted).
    pub bytes: u64,
}

/// Where the driver finds things.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The broker.
    pub kafka: &'static Kafka,
    /// This binary, which the Rust contenders run as.
    pub exe: PathBuf,
    /// The Kafka Streams contender's runnable jar.
    pub streams_jar: PathBuf,
    /// Logs of the contenders.
    pub log_dir: PathBuf,
    /// A run that has not finished after this long fails.
    pub run_timeout: Duration,
    /// librdkafka properties (KEY=VALUE) for the onceflow contenders.
    pub onceflow_kafka: Vec<String>,
    /// The Rust peers' binaries, as built (`crate::peers`).
    pub peers: Vec<(System, PathBuf)>,
}

/// Runs one contender once, reporting progress on `bar`.
pub async fn run_once(
    env: &Environment,
    settings: &RunSettings,
    bar: &ProgressBar,
) -> Result<RunResult, String> {
    let kafka = env.kafka;
    let name = onceflow_testkit::unique_name(&format!("bench-{}", settings.system.id()));
    let input = format!("{name}-in");
    let output = format!("{name}-out");
    for topic in [&input, &output] {
        kafka
            .create_topic(topic, settings.partitions)
            .await
            .map_err(|e| format!("create topic {topic}: {e}"))?;
    }
    let brokers = kafka.bootstrap_servers().to_owned();

    // The throughput events are preloaded before the contender starts, except after a
    // dedup-log warm-up: then the warm-up events are preloaded and processed first, and
    // the throughput events are produced once the log holds them.
    let load = Load {
        topic: input.clone(),
        events: settings.events,
        size: settings.size,
        keys: settings.keys,
        duplicates: settings.duplicates,
        rate: 0,
        id_prefix: "t".into(),
    };
    let warm_up = (settings.dedup_preload > 0).then(|| Load {
        events: settings.dedup_preload,
        duplicates: 0.0,
        id_prefix: "w".into(),
        ..load.clone()
    });
    bar.set_message(format!("{}: preloading", settings.system.id()));
    let produced = generate(&brokers, warm_up.as_ref().unwrap_or(&load).clone())
        .done()
        .await
        .map_err(|e| format!("preload: {e}"))?;
    let expected = if settings.system.dedups() {
        load.unique_events()
    } else {
        load.events
    };

    let reader = Reader::start(&brokers, &output, settings.partitions, Offset::Beginning)?;
    let state = tempfile::tempdir().map_err(|e| e.to_string())?;
    let log = env.log_dir.join(format!("{name}.log"));
    let commands = (0..settings.instances)
        .map(|instance| command(env, settings, &brokers, &name, instance, state.path()))
        .collect();
    let contender = Contender::start(commands, &log).map_err(|e| e.to_string())?;
    let mut watch = Watch {
        reader: &reader,
        contender,
        bar,
        log: &log,
        what: settings.system.id(),
    };

    if let Some(warm_up) = &warm_up {
        bar.set_message(format!("{}: dedup log warm-up", settings.system.id()));
        watch.collect('w', warm_up.events, env.run_timeout, |_, _| {})?;
    }
    let generator = warm_up.is_some().then(|| generate(&brokers, load.clone()));

    // Throughput.
    bar.set_message(format!("{}: throughput", settings.system.id()));
    let mut first_processed = i64::MAX;
    let mut last_visible = 0i64;
    let mut seen = 0u64;
    // CPU from the first output on, so that start-up (a JVM's above all) is not counted
    // per event.
    let mut at_first_output: Option<(u64, Usage)> = None;
    let collected = watch.collect_or_cut('t', expected, env.run_timeout, |out, contender| {
        seen += 1;
        if at_first_output.is_none() {
            at_first_output = Some((seen, contender.usage()));
        }
        first_processed = first_processed.min(out.processed_us);
        last_visible = last_visible.max(out.visible_us);
    });
    // A contender too slow for the run timeout is measured on what it did; one that
    // exited, or made nothing to measure, has failed.
    let unfinished = match collected {
        Ok(()) => None,
        Err(cut) if cut.timed_out && seen >= 2 => Some(Unfinished {
            seen,
            expected,
            patience: env.run_timeout,
        }),
        Err(cut) => return Err(cut.message),
    };
    let usage = watch.contender.usage();
    let produced = match generator {
        Some(generator) => generator.done().await.map_err(|e| format!("load: {e}"))?,
        None => produced,
    };
    let seconds = ((last_visible - first_processed) as f64 / 1e6).max(1e-6);
    // The events the outputs seen stand for (with duplicate IDs, fewer outputs than
    // events are expected).
    let events = match &unfinished {
        None => settings.events,
        Some(cut) => (settings.events as f64 * cut.seen as f64 / expected.max(1) as f64) as u64,
    };
    let mut result = RunResult {
        throughput: events as f64 / seconds,
        generator_rate: produced.rate(),
        latency_ms: None,
        latency_parts_ms: None,
        usage,
        cpu_us_per_event: at_first_output.map_or(0.0, |(from, at)| {
            (usage.cpu_seconds - at.cpu_seconds) * 1e6 / (seen - from).max(1) as f64
        }),
        changelog: None,
        unfinished,
    };
    if result.unfinished.is_some() {
        let Watch { contender, .. } = watch;
        drop(contender);
        reader.stop();
        drop(state);
        delete_topics(&brokers, &name).await;
        return Ok(result);
    }
    bar.set_message(format!("{}: changelog volume", settings.system.id()));
    result.changelog = changelog_volume(&brokers, &name, env.run_timeout)?;

    // Latency at a fixed offered rate.
    if settings.latency_rate > 0 && settings.latency_events > 0 {
        bar.set_message(format!(
            "{}: latency at {} ev/s",
            settings.system.id(),
            settings.latency_rate
        ));
        let load = Load {
            events: settings.latency_events,
            duplicates: 0.0,
            rate: settings.latency_rate,
            id_prefix: "l".into(),
            ..load
        };
        let target = load.events;
        let generator = generate(&brokers, load);
        let histogram =
            || Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).map_err(|e| e.to_string());
        let (mut total, mut to_handler, mut to_visible) =
            (histogram()?, histogram()?, histogram()?);
        let patience =
            env.run_timeout + Duration::from_secs_f64(target as f64 / settings.latency_rate as f64);
        watch.collect('l', target, patience, |out, _| {
            let micros = |from: i64, to: i64| (to - from).max(1) as u64;
            total.saturating_record(micros(out.sent_us, out.visible_us));
            to_handler.saturating_record(micros(out.sent_us, out.processed_us));
            to_visible.saturating_record(micros(out.processed_us, out.visible_us));
        })?;
        generator
            .done()
            .await
            .map_err(|e| format!("latency load: {e}"))?;
        let percentiles = |histogram: &Histogram<u64>| {
            [0.5, 0.99, 0.999].map(|q| histogram.value_at_quantile(q) as f64 / 1000.0)
        };
        result.latency_ms = Some(percentiles(&total));
        result.latency_parts_ms = Some([percentiles(&to_handler), percentiles(&to_visible)]);
    }
    let Watch { contender, .. } = watch;
    drop(contender);
    reader.stop();
    drop(state);
    delete_topics(&brokers, &name).await;
    Ok(result)
}

/// Starts the load generator on the blocking pool, now; await the result for its rate.
fn generate(brokers: &str, load: Load) -> Generator {
    let brokers = brokers.to_owned();
    Generator(tokio::task::spawn_blocking(move || {
        produce(&brokers, &load)
    }))
}

/// A load generator running.
struct Generator(tokio::task::JoinHandle<Result<Produced, rdkafka::error::KafkaError>>);

impl Generator {
    /// What it produced, once it is done.
    async fn done(self) -> Result<Produced, String> {
        self.0
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

/// A running contender and the reader of its outputs.
struct Watch<'a> {
    reader: &'a Reader,
    contender: Contender,
    bar: &'a ProgressBar,
    log: &'a Path,
    what: &'static str,
}

impl Watch<'_> {
    /// Waits for `expected` outputs of `phase`, handing each to `seen`; fails with the
    /// contender's log if it exits or `patience` runs out first.
    fn collect(
        &mut self,
        phase: char,
        expected: u64,
        patience: Duration,
        seen: impl FnMut(&Seen, &Contender),
    ) -> Result<(), String> {
        self.collect_or_cut(phase, expected, patience, seen)
            .map_err(|cut| cut.message)
    }

    /// [`Watch::collect`], telling a contender that ran out of time from one that stopped.
    fn collect_or_cut(
        &mut self,
        phase: char,
        expected: u64,
        patience: Duration,
        mut seen: impl FnMut(&Seen, &Contender),
    ) -> Result<(), Cut> {
        let deadline = Instant::now() + patience;
        self.bar.set_length(expected);
        self.bar.set_position(0);
        let mut count = 0u64;
        while count < expected {
            match self.reader.outputs.recv_timeout(Duration::from_millis(200)) {
                Ok(out) if out.phase == phase => {
                    count += 1;
                    seen(&out, &self.contender);
                    if count.is_multiple_of(1024) {
                        self.bar.set_position(count);
                    }
                }
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Cut {
                        message: "the output reader stopped".into(),
                        timed_out: false,
                    });
                }
            }
            let (problem, timed_out) = if !self.contender.alive() {
                ("exited", false)
            } else if Instant::now() > deadline {
                ("ran out of time", true)
            } else {
                continue;
            };
            let text = std::fs::read_to_string(self.log).unwrap_or_default();
            let start = text.floor_char_boundary(text.len().saturating_sub(3000));
            return Err(Cut {
                message: format!(
                    "{} {problem} after {count} of {expected} outputs ({phase}); log {}:\n{}",
                    self.what,
                    self.log.display(),
                    &text[start..]
                ),
                timed_out,
            });
        }
        self.bar.set_position(count);
        Ok(())
    }
}

/// Why [`Watch::collect_or_cut`] stopped short.
struct Cut {
    /// What happened, with the contender's log.
    message: String,
    /// The patience ran out while the contender still ran.
    timed_out: bool,
}

/// Deletes every topic whose name starts with `prefix` (the run's input, output,
/// changelog and Kafka Streams' internal topics), so that a long report does not fill the
/// broker's disk. Best effort: a topic left behind costs space, not correctness.
async fn delete_topics(brokers: &str, prefix: &str) {
    let Ok(admin) = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create::<AdminClient<DefaultClientContext>>()
    else {
        return;
    };
    let Ok(metadata) = admin.inner().fetch_metadata(None, Duration::from_secs(10)) else {
        return;
    };
    let topics: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|t| t.starts_with(prefix))
        .collect();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    if !names.is_empty() {
        let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
    }
}

/// A `read_committed` consumer that commits nothing and does not let the broker hold an
/// empty fetch, in a group of its own named after `what`.
fn committed_reader(brokers: &str, what: &str) -> Result<BaseConsumer, String> {
    reader(brokers, what, "read_committed")
}

/// A consumer with `isolation` that commits nothing and does not let the broker hold an
/// empty fetch, in a group of its own named after `what`.
fn reader(brokers: &str, what: &str, isolation: &str) -> Result<BaseConsumer, String> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", onceflow_testkit::unique_name(what))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("fetch.wait.max.ms", "10")
        .create()
        .map_err(|e| format!("{what}: {e}"))
}

/// Whether `topic`, of a run named `name`, is a contender's changelog: onceflow's
/// transaction log replica (`<group>-txlog`) or a Kafka Streams store's
/// (`<application>-<store>-changelog`).
fn is_changelog(name: &str, topic: &str) -> bool {
    topic
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|rest| rest == "txlog" || rest.ends_with("-changelog"))
}

/// Reads every changelog topic of the run `name` from its start to the high watermark
/// taken now, counting records and bytes (`None`: the contender has none). The contender
/// may still run: what it writes after this call is not counted.
///
/// The watermarks come from a `read_uncommitted` consumer: a `read_committed` one is told
/// the last stable offset instead, and the coordinator writes a commit's markers to its
/// partitions one by one, so a changelog partition can still be unstable when the outputs
/// of the same transaction are already visible. Asked that way, a partition whose whole
/// changelog was one transaction had "nothing" to read (the smoke test once counted 0.99
/// records per event where 2.01 were written). The records are still read committed: the
/// read ends once the position passes the high watermark, so after the commit's marker.
fn changelog_volume(
    brokers: &str,
    name: &str,
    patience: Duration,
) -> Result<Option<Volume>, String> {
    let consumer = committed_reader(brokers, "bench-volume")?;
    let meter = reader(brokers, "bench-volume-meter", "read_uncommitted")?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(None, timeout)
        .map_err(|e| format!("changelog reader metadata: {e}"))?;
    let changelogs: Vec<_> = metadata
        .topics()
        .iter()
        .filter(|t| is_changelog(name, t.name()))
        .collect();
    if changelogs.is_empty() {
        return Ok(None);
    }
    let mut assignment = TopicPartitionList::new();
    let mut ends = Vec::new();
    for topic in changelogs {
        for partition in topic.partitions() {
            let (_, high) = meter
                .fetch_watermarks(topic.name(), partition.id(), timeout)
                .map_err(|e| format!("watermarks of {}: {e}", topic.name()))?;
            if high > 0 {
                assignment
                    .add_partition_offset(topic.name(), partition.id(), Offset::Beginning)
                    .map_err(|e| e.to_string())?;
                ends.push((topic.name().to_owned(), partition.id(), high));
            }
        }
    }
    let mut volume = Volume::default();
    if ends.is_empty() {
        return Ok(Some(volume));
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + patience;
    let mut checked = Instant::now();
    loop {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message.map_err(|e| format!("changelog reader: {e}"))?;
            volume.records += 1;
            volume.bytes += (message.key().map_or(0, <[u8]>::len)
                + message.payload().map_or(0, <[u8]>::len)) as u64;
            if checked.elapsed() < Duration::from_millis(200) {
                continue;
            }
        }
        checked = Instant::now();
        let position = consumer.position().map_err(|e| e.to_string())?;
        let done = ends.iter().all(|(topic, partition, high)| {
            position
                .find_partition(topic, *partition)
                .and_then(|element| match element.offset() {
                    Offset::Offset(at) => Some(at >= *high),
                    _ => None,
                })
                .unwrap_or(false)
        });
        if done {
            return Ok(Some(volume));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the changelog of {name} was not read to its end in {patience:?} ({} records read)",
                volume.records
            ));
        }
    }
}

/// The settings of one restore measurement: a one-partition input of `events` distinct
/// event IDs over `keys` keys, processed exactly once, then the instance killed.
#[derive(Debug, Clone)]
pub struct RestoreSettings {
    /// Distinct event IDs, so dedup entries, in the partition.
    pub events: u64,
    /// Distinct state keys.
    pub keys: u64,
    /// Event size in bytes.
    pub size: usize,
    /// Commit interval.
    pub commit_interval: Duration,
    /// Records per batch at most.
    pub max_batch: usize,
}

/// What one restore measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreResult {
    /// Records in the changelog partition when the instance was killed.
    pub changelog: Volume,
    /// A new process with an empty state directory: from its start to its partition
    /// restored (the changelog replayed into redb) and handed to the processor.
    pub cold_ready: Duration,
    /// The same process: the replay alone, as the engine logged it ("changelog
    /// replayed … elapsed"); None if the line was not found.
    pub cold_replay: Option<Duration>,
    /// The same process: from its start to the output of an event sent at its start.
    pub cold_first_output: Duration,
    /// A new process on the killed one's state directory (only the unsynced tail and
    /// what follows the checkpoint is replayed): start to partition restored.
    pub warm_ready: Duration,
}

/// Builds a changelog partition holding `settings.events` dedup entries and
/// `settings.keys` state keys, kills the instance, and times two restarts: on an empty
/// state directory (a lost disk, a new machine: the whole changelog replayed) and on the
/// killed instance's own (a crash: the tail replayed).
pub async fn restore_once(
    env: &Environment,
    settings: &RestoreSettings,
    bar: &ProgressBar,
) -> Result<RestoreResult, String> {
    let kafka = env.kafka;
    let name = onceflow_testkit::unique_name("bench-restore");
    let input = format!("{name}-in");
    let output = format!("{name}-out");
    for topic in [&input, &output] {
        kafka
            .create_topic(topic, 1)
            .await
            .map_err(|e| format!("create topic {topic}: {e}"))?;
    }
    let brokers = kafka.bootstrap_servers().to_owned();
    let run = RunSettings {
        system: System::ExactlyOnce,
        events: settings.events,
        size: settings.size,
        keys: settings.keys,
        duplicates: 0.0,
        partitions: 1,
        commit_interval: settings.commit_interval,
        max_batch: settings.max_batch,
        instances: 1,
        latency_rate: 0,
        latency_events: 0,
        dedup_preload: 0,
    };
    let load = Load {
        topic: input.clone(),
        events: settings.events,
        size: settings.size,
        keys: settings.keys,
        duplicates: 0.0,
        rate: 0,
        id_prefix: "w".into(),
    };
    bar.set_message(format!("restore: preloading {} events", settings.events));
    generate(&brokers, load.clone())
        .done()
        .await
        .map_err(|e| format!("preload: {e}"))?;
    let reader = Reader::start(&brokers, &output, 1, Offset::End)?;
    let first = tempfile::tempdir().map_err(|e| e.to_string())?;
    let log = |phase: &str| env.log_dir.join(format!("{name}-{phase}.log"));
    let build_log = log("build");
    let mut watch = Watch {
        reader: &reader,
        contender: Contender::start(
            vec![command(env, &run, &brokers, &name, 0, first.path())],
            &build_log,
        )
        .map_err(|e| e.to_string())?,
        bar,
        log: &build_log,
        what: "restore",
    };
    bar.set_message("restore: building the changelog");
    watch.collect('w', settings.events, env.run_timeout, |_, _| {})?;
    // Killed, not stopped: what a crash leaves.
    drop(watch);
    bar.set_message("restore: counting the changelog");
    let changelog =
        changelog_volume(&brokers, &name, env.run_timeout)?.ok_or("no changelog was written")?;

    let restart = |state: &Path,
                   phase: &str,
                   probe: bool|
     -> Result<(Duration, Duration, Option<Duration>), String> {
        let log = log(phase);
        let started = Instant::now();
        let started_us = now_us();
        let contender = Contender::start(vec![command(env, &run, &brokers, &name, 0, state)], &log)
            .map_err(|e| e.to_string())?;
        let mut watch = Watch {
            reader: &reader,
            contender,
            bar,
            log: &log,
            what: "restore",
        };
        bar.set_message(format!("restore: {phase} restart"));
        let mut first_output = Duration::ZERO;
        if probe {
            // One event sent at the start: it is processed once the partition is back.
            produce(
                &brokers,
                &Load {
                    events: 1,
                    id_prefix: format!("p{phase}"),
                    ..load.clone()
                },
            )
            .map_err(|e| format!("probe: {e}"))?;
            watch.collect('p', 1, env.run_timeout, |_, _| {})?;
            first_output = started.elapsed();
        }
        let deadline = started + env.run_timeout;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(at_us) = text.lines().find_map(|line| {
                line.split_once(flow::RESTORED)
                    .and_then(|(_, rest)| rest.split_whitespace().next()?.parse::<i64>().ok())
            }) {
                let ready = Duration::from_micros((at_us - started_us).max(0) as u64);
                let replay = text
                    .lines()
                    .filter(|line| line.contains("changelog replayed"))
                    .find_map(|line| {
                        line.split_whitespace()
                            .find_map(|field| field.strip_prefix("elapsed="))
                            .and_then(debug_duration)
                    });
                return Ok((ready, first_output, replay));
            }
            if !watch.contender.alive() || Instant::now() > deadline {
                return Err(format!(
                    "the {phase} restart never said its partition was restored; log {}",
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let fresh = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (cold_ready, cold_first_output, cold_replay) = restart(fresh.path(), "cold", true)?;
    let (warm_ready, _, _) = restart(first.path(), "warm", false)?;
    reader.stop();
    delete_topics(&brokers, &name).await;
    Ok(RestoreResult {
        changelog,
        cold_ready,
        cold_replay,
        cold_first_output,
        warm_ready,
    })
}

/// A duration as `Debug` writes it (`1.5s`, `812.25ms`, `40µs`, `7ns`).
pub fn debug_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => number,
        "ms" => number / 1e3,
        "µs" | "us" => number / 1e6,
        "ns" => number / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// The command line of one instance of a contender.
fn command(
    env: &Environment,
    settings: &RunSettings,
    brokers: &str,
    name: &str,
    instance: usize,
    state: &Path,
) -> Command {
    let input = format!("{name}-in");
    let output = format!("{name}-out");
    let interval_ms = settings.commit_interval.as_millis().to_string();
    if settings.system == System::Streams {
        let mut command = Command::new("java");
        // RocksDB unpacks its native library into java.io.tmpdir and a killed JVM never
        // removes it: keep it in the run's own directory, deleted after the run.
        let mut tmpdir = std::ffi::OsString::from("-Djava.io.tmpdir=");
        tmpdir.push(state);
        command
            .arg(tmpdir)
            .args(["-jar"])
            .arg(&env.streams_jar)
            .args(["--brokers", brokers, "--input", &input, "--output", &output])
            .args([
                "--application-id",
                name,
                "--commit-interval-ms",
                &interval_ms,
            ])
            .arg("--state-dir")
            .arg(state.join(format!("streams-{instance}")));
        return command;
    }
    if let Some((_, binary)) = env.peers.iter().find(|(s, _)| *s == settings.system) {
        let mut command = Command::new(binary);
        command
            .args(["--brokers", brokers, "--input", &input, "--output", &output])
            .args(["--group", name, "--commit-interval-ms", &interval_ms])
            .args(["--max-batch", &settings.max_batch.to_string()])
            .args(["--partitions", &settings.partitions.to_string()]);
        return command;
    }
    let mut command = Command::new(&env.exe);
    let subcommand = match settings.system {
        System::Raw => "raw",
        System::RawTransactional => "raw-txn",
        _ => "onceflow",
    };
    command
        .arg(subcommand)
        .args(["--brokers", brokers, "--input", &input, "--output", &output])
        .args(["--group", name, "--commit-interval-ms", &interval_ms])
        .args(["--max-batch", &settings.max_batch.to_string()])
        .args(["--instance", &format!("i{instance}")])
        .arg("--state-dir")
        .arg(state);
    let mode = match settings.system {
        System::AtMostOnce => Some("at-most-once"),
        System::AtLeastOnce => Some("at-least-once"),
        System::ExactlyOnce => Some("exactly-once"),
        _ => None,
    };
    if let Some(mode) = mode {
        command.args(["--delivery", mode]);
        for property in &env.onceflow_kafka {
            command.args(["--kafka", property]);
        }
    }
    command
}

/// One output as the reader saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// `t` (throughput) or `l` (latency): the first letter of the event ID.
    phase: char,
    sent_us: i64,
    processed_us: i64,
    visible_us: i64,
}

/// What the reader needs of an output (an input parses too: pointed at the input topic,
/// the reader measures the load generator and the broker alone).
#[derive(serde::Deserialize)]
struct Stamp {
    id: String,
    sent_us: i64,
    #[serde(default)]
    processed_us: i64,
}

/// A `read_committed` consumer of the output topic on a thread of its own.
struct Reader {
    outputs: Receiver<Seen>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Reader {
    fn start(brokers: &str, topic: &str, partitions: i32, from: Offset) -> Result<Reader, String> {
        let consumer = committed_reader(brokers, "bench-reader")?;
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            assignment
                .add_partition_offset(topic, partition, from)
                .map_err(|e| e.to_string())?;
        }
        consumer.assign(&assignment).map_err(|e| e.to_string())?;
        let (sender, outputs) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) else {
                    continue;
                };
                let visible_us = now_us();
                let Ok(out) =
                    serde_json::from_slice::<Stamp>(message.payload().unwrap_or_default())
                else {
                    continue;
                };
                let seen = Seen {
                    phase: out.id.chars().next().unwrap_or('?'),
                    sent_us: out.sent_us,
                    processed_us: out.processed_us,
                    visible_us,
                };
                if sender.send(seen).is_err() {
                    return;
                }
            }
        });
        Ok(Reader {
            outputs,
            stop,
            thread,
        })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.outputs);
        let _ = self.thread.join();
    }
}

/// Progress bars: one for the whole report, one for the current run.
#[derive(Debug)]
pub struct Progress {
    /// Runs done of all runs.
    pub overall: ProgressBar,
    /// Outputs seen in the current run.
    pub run: ProgressBar,
}

impl Progress {
    /// Bars for `runs` runs (hidden when `quiet`).
    pub fn new(runs: u64, quiet: bool) -> Progress {
        let multi = MultiProgress::new();
        if quiet {
            multi.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let overall = multi.add(ProgressBar::new(runs));
        overall.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] runs {pos}/{len} {bar:30} {msg}")
                .expect("a valid template"),
        );
        let run = multi.add(ProgressBar::new(1));
        run.set_style(
            ProgressStyle::with_template("  {msg:32} {bar:30} {pos}/{len} {per_sec}")
                .expect("a valid template"),
        );
        Progress { overall, run }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{debug_duration, is_changelog};

    #[test]
    fn durations_read_as_debug_writes_them() {
        for duration in [
            Duration::from_secs(3),
            Duration::from_millis(1_234),
            Duration::from_micros(812_250),
            Duration::from_micros(40),
            Duration::from_nanos(7),
        ] {
            let text = format!("{duration:?}");
            let read = debug_duration(&text).unwrap_or_else(|| panic!("`{text}` not read"));
            let error = read.abs_diff(duration);
            assert!(error < Duration::from_nanos(2), "{text}: {read:?}");
        }
        assert_eq!(debug_duration("soon"), None);
        assert_eq!(debug_duration("12parsecs"), None);
    }

    #[test]
    fn only_the_runs_changelogs_are_counted() {
        let run = "bench-onceflow-eo-1a2b";
        assert!(is_changelog(run, "bench-onceflow-eo-1a2b-txlog"));
        assert!(is_changelog(
            run,
            "bench-onceflow-eo-1a2b-KSTREAM-AGGREGATE-STATE-STORE-0000000001-changelog"
        ));
        for other in [
            "bench-onceflow-eo-1a2b-in",
            "bench-onceflow-eo-1a2b-out",
            "bench-onceflow-eo-1a2b-dlq",
            "bench-onceflow-eo-1a2b-x-repartition",
            "bench-onceflow-eo-1a2bc-txlog",
            "other-txlog",
        ] {
            assert!(!is_changelog(run, other), "{other}");
        }
    }

    /// A changelog partition whose whole content is one transaction, committed while the
    /// volume is read: every record is counted, not only the other partition's.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_changelog_committed_while_it_is_read_is_counted_whole() {
        use rdkafka::ClientConfig;
        use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

        let kafka = onceflow_testkit::kafka().await;
        let name = onceflow_testkit::unique_name("bench-volume");
        let changelog = format!("{name}-txlog");
        kafka.create_topic(&changelog, 2).await.expect("the topic");
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", kafka.bootstrap_servers())
            .set("transactional.id", &name)
            .create()
            .expect("a producer");
        let timeout = Duration::from_secs(30);
        producer.init_transactions(timeout).expect("init");
        let send = |partition: i32, count: usize| {
            for i in 0..count {
                let key = format!("k{i}");
                producer
                    .send(
                        BaseRecord::to(&changelog)
                            .partition(partition)
                            .key(&key)
                            .payload("value"),
                    )
                    .map_err(|(e, _)| e)
                    .expect("send");
            }
        };
        producer.begin_transaction().expect("begin");
        send(0, 3);
        producer.commit_transaction(timeout).expect("commit");
        // Partition 1's only transaction is open when the volume is asked, committed 2 s on.
        producer.begin_transaction().expect("begin");
        send(1, 4);
        producer.flush(timeout).expect("flush");
        let committer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            producer.commit_transaction(timeout).expect("commit");
        });

        let brokers = kafka.bootstrap_servers().to_owned();
        let volume = tokio::task::spawn_blocking(move || {
            super::changelog_volume(&brokers, &name, Duration::from_secs(60))
        })
        .await
        .expect("the reader")
        .expect("the volume")
        .expect("a changelog");
        committer.join().expect("the committer");
        assert_eq!(volume.records, 7, "{volume:?}");
        assert_eq!(volume.bytes, 7 * (2 + 5), "{volume:?}");
    }
}
