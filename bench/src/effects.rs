//! `onceflow-bench effects`: what an exactly-once side effect costs (issue 14).
//!
//! ```text
//!  load generator ─► input ─► processor: one intent per event ─► <group>-effects
//!                                 (same transaction as its offsets)     │
//!                   warehouse on loopback ◄─ POST, Idempotency-Key ◄─ executor
//! ```
//!
//! Two phases against one broker, each on a fresh topic and group:
//! - **Throughput**: `events` intents already committed by the processor (a backlog),
//!   then the executor started; intents applied per second from its first request to
//!   the last, as the loopback service counts them (distinct keys).
//! - **Latency**: the load generator at `rate` events/s with the processor and the
//!   executor running; per event, from the generator's send to the service receiving the
//!   effect (both clocks are this machine's), and the executor's apply call alone.
//!
//! Each phase once with idempotency keys only and once with check-back
//! (`checks_back() = true`: a pending marker acknowledged by the in-sync replicas before
//! every apply). The service answers at once, so the figures are onceflow's overhead,
//! not a remote system's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use hdrhistogram::Histogram;
use onceflow::effects::{self, Checked, Effect, Intent, Outcome};
use onceflow::{Context, Engine, EngineConfig, Processor, Result};

use crate::flow::Keyed;
use crate::workload::{self, Load};

/// Records one effect per event, carrying the event's send time.
#[derive(Processor, Debug)]
#[processor(name = "bench-effects", input_type = Keyed)]
pub struct Notify;

impl Notify {
    async fn handle(&mut self, event: Keyed, ctx: &mut Context<'_>) -> Result<()> {
        let payload = serde_json::json!({ "id": event.id, "sent_us": event.sent_us });
        ctx.effect("notify", &event.key, &payload)
    }
}

/// What the loopback service saw.
#[derive(Debug)]
struct Seen {
    keys: HashSet<String>,
    requests: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    /// From the event's send to its first receipt, µs.
    end_to_end: Histogram<u64>,
}

type Shared = Arc<Mutex<Seen>>;

async fn receive(
    State(seen): State<Shared>,
    headers: HeaderMap,
    Json(payload): Json<serde_json::Value>,
) -> &'static str {
    let now = Instant::now();
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut seen = seen.lock().expect("seen");
    seen.requests += 1;
    seen.first.get_or_insert(now);
    seen.last = Some(now);
    if seen.keys.insert(key) {
        let sent = payload["sent_us"].as_i64().unwrap_or(0);
        let micros = (workload::now_us() - sent).max(1) as u64;
        let _ = seen.end_to_end.record(micros);
    }
    "{}"
}

/// POSTs each intent to the loopback service, timing the call.
struct Http {
    url: String,
    client: reqwest::Client,
    checks_back: bool,
    apply: Arc<Mutex<Histogram<u64>>>,
}

#[onceflow::async_trait]
impl Effect for Http {
    fn name(&self) -> &str {
        "bench-http"
    }

    fn checks_back(&self) -> bool {
        self.checks_back
    }

    async fn apply(&mut self, intent: &Intent) -> Outcome {
        let started = Instant::now();
        let sent = self
            .client
            .post(&self.url)
            .header("idempotency-key", &intent.idempotency_key)
            .json(&intent.payload)
            .send()
            .await;
        let micros = started.elapsed().as_micros().max(1) as u64;
        let _ = self.apply.lock().expect("histogram").record(micros);
        match sent {
            Ok(response) if response.status().is_success() => Outcome::Applied(None),
            Ok(response) => Outcome::Ambiguous(format!("HTTP {}", response.status())),
            Err(error) => Outcome::Ambiguous(error.to_string()),
        }
    }

    async fn check(&mut self, _: &Intent) -> Checked {
        // Only after a crash; none in the benchmark.
        Checked::NotDone
    }
}

/// How a run of the effects benchmark goes.
#[derive(Debug, Clone)]
pub struct EffectsArgs {
    /// Intents of the throughput phase.
    pub events: u64,
    /// Events per second of the latency phase, and how many.
    pub rate: u64,
    pub latency_events: u64,
    pub partitions: i32,
    pub commit_interval: Duration,
}

/// One phase's figures.
#[derive(Debug, Clone)]
pub struct Phase {
    pub checks_back: bool,
    pub applied: u64,
    pub requests: u64,
    /// Intents per second (throughput phase).
    pub rate: f64,
    /// p50, p99, max of send → received, ms (latency phase).
    pub end_to_end_ms: [f64; 3],
    /// p50, p99, max of the apply call, ms.
    pub apply_ms: [f64; 3],
}

fn quantiles(histogram: &Histogram<u64>) -> [f64; 3] {
    [0.5, 0.99, 1.0].map(|q| histogram.value_at_quantile(q) as f64 / 1000.0)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds")
}

/// Runs both phases, with and without check-back; progress on stderr.
pub async fn run(kafka: &onceflow_testkit::Kafka, args: &EffectsArgs) -> Result<Vec<Phase>> {
    let mut phases = Vec::new();
    for checks_back in [false, true] {
        for latency in [false, true] {
            eprintln!(
                "effects: {} phase, {}",
                if latency { "latency" } else { "throughput" },
                if checks_back {
                    "with check-back"
                } else {
                    "idempotency keys"
                }
            );
            phases.push(phase(kafka, args, checks_back, latency).await?);
        }
    }
    Ok(phases)
}

async fn phase(
    kafka: &onceflow_testkit::Kafka,
    args: &EffectsArgs,
    checks_back: bool,
    latency: bool,
) -> Result<Phase> {
    let name = onceflow_testkit::unique_name("bench-effects");
    kafka
        .create_topic(&name, args.partitions)
        .await
        .map_err(|e| onceflow::Error::processing(e.to_string()))?;
    let state = tempfile::tempdir().map_err(|e| onceflow::Error::processing(e.to_string()))?;
    let config = EngineConfig::new(
        kafka.bootstrap_servers(),
        format!("{name}-group"),
        "i0",
        name.clone(),
        state.path(),
    )
    .batching(args.commit_interval, 10_000)
    .with_effects();

    let seen: Shared = Arc::new(Mutex::new(Seen {
        keys: HashSet::new(),
        requests: 0,
        first: None,
        last: None,
        end_to_end: histogram(),
    }));
    let app = axum::Router::new()
        .route("/effects", post(receive))
        .with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| onceflow::Error::processing(e.to_string()))?;
    let url = format!(
        "http://{}/effects",
        listener
            .local_addr()
            .map_err(|e| onceflow::Error::processing(e.to_string()))?
    );
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let events = if latency {
        args.latency_events
    } else {
        args.events
    };
    let load = |events: u64, rate: u64, prefix: &str| Load {
        topic: name.clone(),
        events,
        size: 100,
        keys: 1000,
        duplicates: 0.0,
        rate,
        id_prefix: format!("{name}-{prefix}-"),
    };
    let produce = |load: Load| {
        let brokers = kafka.bootstrap_servers().to_owned();
        tokio::task::spawn_blocking(move || workload::produce(&brokers, &load))
    };

    let processor = Engine::new(config.clone())?;
    let stop_processor = processor.shutdown_handle();
    let processing = tokio::spawn(processor.run(Notify));
    if !latency {
        // The backlog first: every intent committed before the executor starts.
        produced(produce(load(events, 0, "backlog"))).await?;
        wait(
            kafka,
            &config.group,
            &name,
            events,
            Duration::from_secs(300),
        )
        .await?;
    }
    let apply = Arc::new(Mutex::new(histogram()));
    let effect = Http {
        url,
        client: reqwest::Client::new(),
        checks_back,
        apply: Arc::clone(&apply),
    };
    let (executor_engine, executor) =
        effects::executor(effects::executor_config(&config, "i0")?, effect, None).await?;
    let stop_executor = executor_engine.shutdown_handle();
    let executing = tokio::spawn(executor_engine.run(executor));
    if latency {
        // Warm-up: both groups joined and a first batch through, so that the clock
        // measures the flow, not the start-up; then the measured events.
        const WARM_UP: u64 = 20;
        produced(produce(load(WARM_UP, 0, "warm-up"))).await?;
        let deadline = Instant::now() + Duration::from_secs(120);
        while (seen.lock().expect("seen").keys.len() as u64) < WARM_UP {
            if Instant::now() > deadline {
                return Err(onceflow::Error::processing("no warm-up effect in 120 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        {
            let mut seen = seen.lock().expect("seen");
            seen.end_to_end.reset();
            seen.requests = 0;
            seen.keys.clear();
            seen.first = None;
        }
        apply.lock().expect("histogram").reset();
        produced(produce(load(events, args.rate, "measured"))).await?;
    }

    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let applied = seen.lock().expect("seen").keys.len() as u64;
        if applied >= events {
            break;
        }
        if Instant::now() > deadline {
            return Err(onceflow::Error::processing(format!(
                "{applied} of {events} effects applied in 600 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_executor.trigger();
    stop_processor.trigger();
    let _ = executing.await;
    let _ = processing.await;
    server.abort();

    let seen = seen.lock().expect("seen");
    let span = match (seen.first, seen.last) {
        (Some(first), Some(last)) => last.duration_since(first).as_secs_f64(),
        _ => 0.0,
    };
    let apply = apply.lock().expect("histogram");
    Ok(Phase {
        checks_back,
        applied: seen.keys.len() as u64,
        requests: seen.requests,
        rate: if latency {
            0.0
        } else {
            seen.keys.len() as f64 / span.max(1e-9)
        },
        end_to_end_ms: if latency {
            quantiles(&seen.end_to_end)
        } else {
            [0.0; 3]
        },
        apply_ms: quantiles(&apply),
    })
}

/// The load generator's end, as an error of the benchmark.
async fn produced(
    handle: tokio::task::JoinHandle<
        std::result::Result<workload::Produced, rdkafka::error::KafkaError>,
    >,
) -> Result<()> {
    match handle.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(onceflow::Error::processing(format!(
            "load generator: {error}"
        ))),
        Err(error) => Err(onceflow::Error::processing(format!(
            "load generator: {error}"
        ))),
    }
}

/// Waits until `group` committed `target` records of `topic`.
async fn wait(
    kafka: &onceflow_testkit::Kafka,
    group: &str,
    topic: &str,
    target: u64,
    within: Duration,
) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let offsets = kafka
            .committed_offsets(group, topic)
            .await
            .map_err(|e| onceflow::Error::processing(e.to_string()))?;
        let done: i64 = offsets.values().map(|o| o.unwrap_or(0).max(0)).sum();
        if done as u64 >= target {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(onceflow::Error::processing(format!(
                "the processor committed {done} of {target} events in {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The phases as a Markdown report.
pub fn markdown(date: &str, args: &EffectsArgs, broker: &str, phases: &[Phase]) -> String {
    let mut out = format!(
        "# Effects benchmark, {date}\n\n\
         `onceflow-bench effects` on {broker}: {} partitions, commit interval {:?}, a loopback \
         HTTP service that answers at once. Throughput: {} intents committed first, then the \
         executor alone. Latency: {} events at {} events/s through processor and executor \
         together, from the generator's send to the service's receipt (after a warm-up of 20); \
         the apply call is the throughput phase's, timed around the HTTP request. One run.\n\n\
         | effect | intents/s (backlog) | send→effect p50 / p99 / max ms | apply call p50 / p99 ms | requests / applied |\n\
         | --- | --- | --- | --- | --- |\n",
        args.partitions, args.commit_interval, args.events, args.latency_events, args.rate
    );
    for checks_back in [false, true] {
        let of = |latency: bool| {
            phases
                .iter()
                .find(|p| p.checks_back == checks_back && (p.rate == 0.0) == latency)
        };
        let (Some(throughput), Some(latency)) = (of(false), of(true)) else {
            continue;
        };
        out.push_str(&format!(
            "| {} | {:.0} | {:.1} / {:.1} / {:.1} | {:.2} / {:.2} | {} / {} |\n",
            if checks_back {
                "check-back (pending marker per apply)"
            } else {
                "idempotency key"
            },
            throughput.rate,
            latency.end_to_end_ms[0],
            latency.end_to_end_ms[1],
            latency.end_to_end_ms[2],
            throughput.apply_ms[0],
            throughput.apply_ms[1],
            throughput.requests + latency.requests,
            throughput.applied + latency.applied,
        ));
    }
    out
}
