//! The ruststream-rdkafka contender of the onceflow benchmark (`ruststream-eo`): the same
//! work as the other contenders, written as ruststream-rdkafka's exactly-once pipeline.
//!
//! ```text
//!  KafkaTopic(input).commit(Commit::Transactional(id)), workers(lanes, by_key)
//!    ──► #[subscriber] handler: decode, sum[key] += amount, reply
//!    ──► EosReplies (the delivery's offset) + SameKey (its record key)
//!    ──► EosPublish(id).commit_interval(..): one transaction per window, the consumed
//!        offsets in it through send_offsets_to_transaction
//! ```
//!
//! The pipeline closes its window on the commit interval only: it has no batch limit, so
//! `--max-batch` is accepted (the driver passes it to every contender) and not used. One
//! worker lane per input partition (`--partitions`), lanes keyed by partition (the crate's
//! default lane key), so each partition, and so each key, is handled in order. Runs until
//! killed, like the other contenders; the driver measures it from outside.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ruststream::Str;
use ruststream::runtime::{
    ForReply, Outgoing as OutgoingRecord, PublishContext, PublishTransform, Reads,
};
use ruststream_rdkafka::PARTITION_KEY_HEADER;
use ruststream_rdkafka::prelude::*;
use serde::{Deserialize, Serialize};

/// An input event, as the load generator writes it (its padding is not read).
#[derive(Debug, Deserialize)]
struct Input {
    id: String,
    key: String,
    amount: i64,
    sent_us: i64,
}

/// An output, one per input: the fields the driver's reader needs, as every contender writes
/// them.
#[derive(Debug, Serialize, Outgoing)]
struct Output {
    id: String,
    key: String,
    sum: i64,
    sent_us: i64,
    processed_us: i64,
}

/// The per-key sums, in memory as in contender b.
#[derive(Debug, Clone, Default)]
struct Sums(Arc<Mutex<HashMap<String, i64>>>);

/// The application state: what a handler takes with `State<T>`.
#[derive(Debug, Default, FromRef)]
struct AppState {
    sums: Sums,
}

/// What the command line says.
#[derive(Debug)]
struct Settings {
    brokers: String,
    input: String,
    output: &'static str,
    group: String,
    commit_interval: Duration,
    lanes: usize,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

fn settings() -> &'static Settings {
    SETTINGS
        .get()
        .expect("settings are read before the app is built")
}

/// The pipeline id: the transactional ID of its producer, which the subscription names.
fn pipeline_id() -> String {
    format!("{}-ruststream", settings().group)
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

#[subscriber(
    KafkaTopic::new(settings().input.clone())
        .group(settings().group.clone())
        .start(StartOffset::Earliest)
        .config("isolation.level", "read_committed")
        .commit(Commit::Transactional(pipeline_id())),
    reply(settings().output),
    workers(settings().lanes, by_key)
)]
async fn add(input: &Input, State(sums): State<Sums>) -> Output {
    let sum = {
        let mut sums = sums.0.lock().expect("sums mutex poisoned");
        let sum = sums.entry(input.key.clone()).or_insert(0);
        *sum += input.amount;
        *sum
    };
    Output {
        id: input.id.clone(),
        key: input.key.clone(),
        sum,
        sent_us: input.sent_us,
        processed_us: now_us(),
    }
}

/// Gives a reply its delivery's record key, as the other contenders key their outputs (the
/// crate's publisher makes the `PARTITION_KEY_HEADER` header the record key).
#[derive(Debug, Clone, Copy, Default)]
struct SameKey;

impl<C, Options> PublishTransform<ForReply<C>, Options> for SameKey {
    type Destination = Reads;

    fn apply(
        &self,
        out: &mut OutgoingRecord<'_>,
        _options: &mut Option<Options>,
        cx: &PublishContext<'_, C>,
    ) {
        if let Some(key) = cx.headers().get_shared(PARTITION_KEY_HEADER) {
            out.headers_mut()
                .insert(Str::from_static(PARTITION_KEY_HEADER), key);
        }
    }
}

fn app() -> impl App {
    let settings = settings();
    let broker = KafkaBroker::new([settings.brokers.as_str()]).producer_config("linger.ms", "5");
    RustStream::new(AppInfo::new("onceflow-bench-ruststream", "0.1.0"))
        .on_startup(async move |()| Ok::<_, std::convert::Infallible>(AppState::default()))
        .with_broker(broker, |b| {
            b.include(add)
                .out_reply(EosPublish::new(pipeline_id()).commit_interval(settings.commit_interval))
                .transform(EosReplies)
                .transform(SameKey);
        })
}

/// `--name value` pairs; unknown names are an error, missing ones take their default.
fn parse(args: impl Iterator<Item = String>) -> Result<Settings, String> {
    let mut values: HashMap<String, String> = HashMap::new();
    let mut args = args.peekable();
    while let Some(name) = args.next() {
        let name = name
            .strip_prefix("--")
            .ok_or_else(|| format!("`{name}`: expected --name value"))?
            .to_owned();
        let value = args.next().ok_or_else(|| format!("--{name}: no value"))?;
        values.insert(name, value);
    }
    let mut take = |name: &str| values.remove(name);
    let required =
        |value: Option<String>, name: &str| value.ok_or_else(|| format!("--{name} is required"));
    let number = |value: Option<String>, name: &str, default: u64| -> Result<u64, String> {
        value.map_or(Ok(default), |v| {
            v.parse().map_err(|e| format!("--{name} {v}: {e}"))
        })
    };
    let settings = Settings {
        brokers: required(take("brokers"), "brokers")?,
        input: required(take("input"), "input")?,
        output: required(take("output"), "output")?.leak(),
        group: required(take("group"), "group")?,
        commit_interval: Duration::from_millis(number(
            take("commit-interval-ms"),
            "commit-interval-ms",
            100,
        )?),
        lanes: number(take("partitions"), "partitions", 8)?.max(1) as usize,
    };
    // Accepted for the driver's sake, without a counterpart here (see the module doc).
    take("max-batch");
    if let Some(name) = values.keys().next() {
        return Err(format!("unknown option --{name}"));
    }
    Ok(settings)
}

fn main() -> std::process::ExitCode {
    let settings = match parse(std::env::args().skip(1)) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    SETTINGS.set(settings).expect("settings are set once");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(app().run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
