//! onceflow side by side with raw rdkafka and Kafka Streams exactly-once.
//!
//! `cargo run --release -p onceflow-bench -- report` runs everything and writes
//! `bench/results/<date>.md` with its charts; the other subcommands are the pieces it
//! runs (the load generator and the Rust contenders), usable on their own.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use onceflow_bench::driver::{self, Environment, Progress, RunSettings, System};
use onceflow_bench::report::{self, Conditions, Measured};
use onceflow_bench::{charts, flow, peers, raw, workload};

#[derive(Parser, Debug)]
#[command(name = "onceflow-bench", about)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Run every contender in turn and write the report (the one command).
    Report(ReportArgs),
    /// Load generator: keyed JSON events to a topic; prints its rate.
    Produce(ProduceArgs),
    /// Contender a: raw rdkafka, no transaction, auto-commit.
    Raw(ContenderArgs),
    /// Contender b: raw rdkafka, canonical transactional loop.
    RawTxn(ContenderArgs),
    /// Contender c: onceflow, in the mode given by --delivery.
    Onceflow(ContenderArgs),
    /// Exactly-once side effects: executor throughput and send-to-effect latency.
    Effects(EffectsCli),
}

#[derive(Args, Debug)]
struct EffectsCli {
    /// Use this broker instead of starting one (testkit, Docker).
    #[arg(long)]
    brokers: Option<String>,
    /// Intents of the throughput phase.
    #[arg(long, default_value_t = 20_000)]
    events: u64,
    /// Events per second of the latency phase.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    #[arg(long, default_value_t = 5_000)]
    latency_events: u64,
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// Where the report goes (`<date>-effects.md`).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct ProduceArgs {
    #[arg(long, default_value = "localhost:9092")]
    brokers: String,
    #[arg(long)]
    topic: String,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Events per second (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
}

/// The events of one load (the throughput preload, in `report`).
#[derive(Args, Debug, Clone)]
struct WorkloadArgs {
    /// Number of events.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Approximate event size in bytes.
    #[arg(long, default_value_t = 200)]
    size: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Share of events repeating an earlier event's ID (0.0 … 1.0).
    #[arg(long, default_value_t = 0.0)]
    duplicates: f64,
}

#[derive(Args, Debug)]
struct ContenderArgs {
    #[arg(long)]
    brokers: String,
    #[arg(long)]
    input: String,
    #[arg(long)]
    output: String,
    #[arg(long)]
    group: String,
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    #[arg(long, default_value_t = 10_000)]
    max_batch: usize,
    #[arg(long, default_value = "i0")]
    instance: String,
    #[arg(long, default_value = "onceflow-state")]
    state_dir: PathBuf,
    /// exactly-once, at-least-once or at-most-once (onceflow only).
    #[arg(long, default_value = "exactly-once")]
    delivery: String,
    /// A librdkafka property for every client of the engine, KEY=VALUE (onceflow only).
    #[arg(long = "kafka", value_name = "KEY=VALUE")]
    kafka: Vec<String>,
}

#[derive(Args, Debug, Clone)]
struct ReportArgs {
    /// Use this broker instead of starting one (testkit, Docker).
    #[arg(long)]
    brokers: Option<String>,
    /// Contenders, comma-separated (default: all but the Rust peers). A Rust peer
    /// (ruststream-eo) is built first, in bench/peers/; one that does not build or run is
    /// left out and the report says why.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raw,raw-txn,onceflow-amo,onceflow-alo,onceflow-eo,streams-eos2"
    )]
    contenders: Vec<System>,
    #[command(flatten)]
    workload: WorkloadArgs,
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// Records per batch at most (onceflow and raw-txn): high, so that the commit interval
    /// closes batches, as it does in Kafka Streams.
    #[arg(long, default_value_t = 10_000)]
    max_batch: usize,
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Offered rate of the latency phase, events/s.
    #[arg(long, default_value_t = 2000)]
    latency_rate: u64,
    #[arg(long, default_value_t = 10_000)]
    latency_events: u64,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Commit intervals of the sweep, ms. Each sweep's option given with no value
    /// (`--sweep-commit-intervals`) leaves that sweep out.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "10,100,1000")]
    sweep_commit_intervals: Vec<u64>,
    /// Partition counts of the sweep.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,8,64")]
    sweep_partitions: Vec<i32>,
    /// Event sizes of the sweep, bytes (fewer events for big ones, see --sweep-bytes).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "100,1000,10000")]
    sweep_sizes: Vec<usize>,
    /// Instance counts of the sweep (onceflow and Kafka Streams).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,2,3")]
    sweep_instances: Vec<usize>,
    /// Events of each instance sweep run, at least (and not cut by --sweep-bytes): the
    /// group's joins and rebalances take seconds, so a run of about one second (the
    /// 200,000 events of the main runs) measures them rather than the instances' rate.
    #[arg(long, default_value_t = 2_000_000)]
    sweep_instance_events: u64,
    /// Dedup log sizes of the sweep (onceflow exactly-once): that many events are
    /// processed before the throughput phase. 10000000 works but takes minutes and GBs.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "0,100000,1000000")]
    sweep_dedup_ids: Vec<u64>,
    /// Input bytes per sweep run at most: events are cut to fit.
    #[arg(long, default_value_t = 100_000_000)]
    sweep_bytes: u64,
    #[arg(long, default_value_t = 1)]
    sweep_repeats: usize,
    /// Skip every sweep.
    #[arg(long)]
    no_sweeps: bool,
    /// Dedup entries (distinct event IDs) in the one partition of the restore
    /// measurement (onceflow exactly-once; 0: no restore measurement).
    #[arg(long, default_value_t = 1_000_000)]
    restore_ids: u64,
    /// State keys of that partition.
    #[arg(long, default_value_t = 100_000)]
    restore_keys: u64,
    /// Repeats of the restore measurement.
    #[arg(long, default_value_t = 1)]
    restore_repeats: usize,
    /// Where the report goes.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    out: PathBuf,
    /// The Kafka Streams contender's jar (built with Maven when missing).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/streams/target/onceflow-bench-streams-all.jar"))]
    streams_jar: PathBuf,
    /// A run that takes longer fails, seconds.
    #[arg(long, default_value_t = 300)]
    run_timeout: u64,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    /// No PNG charts.
    #[arg(long)]
    no_charts: bool,
    /// A librdkafka property for the onceflow contenders' clients, KEY=VALUE (repeatable);
    /// the report names them.
    #[arg(long = "onceflow-kafka", value_name = "KEY=VALUE")]
    onceflow_kafka: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let outcome = match cli.command {
        Commands::Report(args) => runtime.block_on(report(args)),
        Commands::Produce(args) => produce(args),
        Commands::Raw(args) => raw::run_plain(&raw_args(&args)).map_err(|e| e.to_string()),
        Commands::RawTxn(args) => {
            raw::run_transactional(&raw_args(&args)).map_err(|e| e.to_string())
        }
        Commands::Onceflow(args) => {
            // Warnings, and the changelog replay's lines (the restore measurement reads
            // "changelog replayed … elapsed=…"); nothing per batch.
            let filter = std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "warn,onceflow::engine::changelog=info".into());
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .init();
            runtime.block_on(onceflow(args))
        }
        Commands::Effects(args) => runtime.block_on(effects(args)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn produce(args: ProduceArgs) -> Result<(), String> {
    let load = workload::Load {
        topic: args.topic,
        events: args.workload.events,
        size: args.workload.size,
        keys: args.workload.keys,
        duplicates: args.workload.duplicates,
        rate: args.rate,
        id_prefix: "t".into(),
    };
    let produced = workload::produce(&args.brokers, &load).map_err(|e| e.to_string())?;
    println!(
        "produced {} events ({} duplicates) in {:.2} s: {:.0} events/s",
        produced.events,
        load.duplicate_count(),
        produced.elapsed.as_secs_f64(),
        produced.rate()
    );
    Ok(())
}

fn raw_args(args: &ContenderArgs) -> raw::RawArgs {
    raw::RawArgs {
        brokers: args.brokers.clone(),
        input: args.input.clone(),
        output: args.output.clone(),
        group: args.group.clone(),
        commit_interval: Duration::from_millis(args.commit_interval_ms),
        max_batch: args.max_batch,
    }
}

async fn onceflow(args: ContenderArgs) -> Result<(), String> {
    let delivery = args
        .delivery
        .parse()
        .map_err(|e: onceflow::Error| e.to_string())?;
    flow::run(flow::FlowArgs {
        brokers: args.brokers,
        input: args.input,
        output: args.output,
        group: args.group,
        instance: args.instance,
        state_dir: args.state_dir,
        commit_interval: Duration::from_millis(args.commit_interval_ms),
        max_batch: args.max_batch,
        delivery,
        kafka: args
            .kafka
            .iter()
            .map(|pair| {
                pair.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .ok_or_else(|| format!("--kafka {pair}: expected KEY=VALUE"))
            })
            .collect::<Result<_, _>>()?,
    })
    .await
    .map_err(|e| e.to_string())
}

/// One planned run.
struct Planned {
    section: String,
    point: String,
    settings: RunSettings,
}

fn plan(args: &ReportArgs) -> Vec<Planned> {
    let base = RunSettings {
        system: System::Raw,
        events: args.workload.events,
        size: args.workload.size,
        keys: args.workload.keys,
        duplicates: args.workload.duplicates,
        partitions: args.partitions,
        commit_interval: Duration::from_millis(args.commit_interval_ms),
        max_batch: args.max_batch,
        instances: args.instances,
        latency_rate: args.latency_rate,
        latency_events: args.latency_events,
        dedup_preload: 0,
    };
    let mut runs = Vec::new();
    for _ in 0..args.repeats {
        for &system in &args.contenders {
            runs.push(Planned {
                section: "main".into(),
                point: String::new(),
                settings: RunSettings {
                    system,
                    ..base.clone()
                },
            });
        }
    }
    if args.no_sweeps {
        return runs;
    }
    let sweep_base = RunSettings {
        latency_rate: 0,
        ..base.clone()
    };
    let only = |wanted: &[System]| -> Vec<System> {
        wanted
            .iter()
            .copied()
            .filter(|s| args.contenders.contains(s))
            .collect()
    };
    let mut sweep = |section: &str, points: Vec<(String, RunSettings)>, systems: Vec<System>| {
        for _ in 0..args.sweep_repeats {
            for (point, settings) in &points {
                for &system in &systems {
                    runs.push(Planned {
                        section: section.into(),
                        point: point.clone(),
                        settings: RunSettings {
                            system,
                            ..settings.clone()
                        },
                    });
                }
            }
        }
    };
    let cap = |mut settings: RunSettings| {
        let fitting = args.sweep_bytes / settings.size.max(1) as u64;
        settings.events = settings.events.min(fitting).max(1);
        settings
    };
    let interval_label = |ms: u64| {
        if ms >= 1000 && ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    };
    let sweeps = [
        (
            // With the latency phase: latency is what the commit interval trades.
            "commit interval",
            points(&args.sweep_commit_intervals, &base, |s, ms| {
                s.commit_interval = Duration::from_millis(ms);
                interval_label(ms)
            }),
            only(&[
                System::RawTransactional,
                System::AtLeastOnce,
                System::ExactlyOnce,
                System::Streams,
            ]),
        ),
        (
            "partitions",
            points(&args.sweep_partitions, &sweep_base, |s, partitions| {
                s.partitions = partitions;
                partitions.to_string()
            }),
            only(&[System::Raw, System::ExactlyOnce, System::Streams]),
        ),
        (
            "payload bytes",
            points(&args.sweep_sizes, &sweep_base, |s, size| {
                s.size = size;
                *s = cap(s.clone());
                size.to_string()
            }),
            only(&[System::Raw, System::ExactlyOnce, System::Streams]),
        ),
        (
            "instances",
            points(&args.sweep_instances, &sweep_base, |s, instances| {
                s.instances = instances;
                s.events = s.events.max(args.sweep_instance_events);
                instances.to_string()
            }),
            only(&[System::ExactlyOnce, System::Streams]),
        ),
        (
            "dedup log IDs",
            points(&args.sweep_dedup_ids, &sweep_base, |s, ids| {
                s.dedup_preload = ids;
                ids.to_string()
            }),
            only(&[System::ExactlyOnce]),
        ),
    ];
    for (section, points, systems) in sweeps {
        sweep(section, points, systems);
    }
    runs
}

/// One sweep's points: `base` changed by `apply` for each value, labelled by what
/// `apply` returns.
fn points<T: Copy>(
    values: &[T],
    base: &RunSettings,
    apply: impl Fn(&mut RunSettings, T) -> String,
) -> Vec<(String, RunSettings)> {
    values
        .iter()
        .map(|&value| {
            let mut settings = base.clone();
            let label = apply(&mut settings, value);
            (label, settings)
        })
        .collect()
}

async fn report(mut args: ReportArgs) -> Result<(), String> {
    let started = Instant::now();
    if args.contenders.contains(&System::Streams) && !args.streams_jar.exists() {
        build_streams_jar(&args)?;
    }
    // A Rust peer that does not build is left out, and the report says why.
    let mut peer_notes = Vec::new();
    let mut peer_binaries = Vec::new();
    for peer in peers::PEERS
        .iter()
        .filter(|p| args.contenders.contains(&p.system))
    {
        let problem = match peers::build(peer, args.quiet) {
            Ok(binary) => {
                peer_binaries.push((peer.system, binary));
                None
            }
            Err(why) => {
                eprintln!("{} left out: {why}", peer.system.id());
                Some(format!("not built: {why}"))
            }
        };
        peer_notes.push(report::PeerNote {
            system: peer.system,
            what: peer.what.to_owned(),
            problem,
            unfinished: None,
        });
    }
    args.contenders.retain(|system| {
        peers::peer(*system).is_none() || peer_binaries.iter().any(|(s, _)| s == system)
    });
    let kafka: &'static onceflow_testkit::Kafka = match &args.brokers {
        Some(brokers) => Box::leak(Box::new(onceflow_testkit::Kafka::connect(brokers.clone()))),
        None => onceflow_testkit::kafka().await,
    };
    let log_dir = std::env::temp_dir().join("onceflow-bench-logs");
    std::fs::create_dir_all(&log_dir).map_err(|e| e.to_string())?;
    let env = Environment {
        kafka,
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        streams_jar: args.streams_jar.clone(),
        log_dir: log_dir.clone(),
        run_timeout: Duration::from_secs(args.run_timeout),
        onceflow_kafka: args.onceflow_kafka.clone(),
        peers: peer_binaries,
    };
    let planned = plan(&args);
    let restore_runs = if args.restore_ids > 0 && args.contenders.contains(&System::ExactlyOnce) {
        args.restore_repeats
    } else {
        0
    };
    let progress = Progress::new((planned.len() + restore_runs) as u64, args.quiet);
    let mut measured = Vec::new();
    for run in planned {
        let system = run.settings.system;
        progress
            .overall
            .set_message(format!("{} {} {}", run.section, run.point, system.id()));
        // A peer that failed is left out; one that ran out of time is run once, as each
        // further run would take the whole run timeout again.
        let failed_peer = |notes: &[report::PeerNote]| {
            notes.iter().any(|note| {
                note.system == system && (note.problem.is_some() || note.unfinished.is_some())
            })
        };
        if failed_peer(&peer_notes) {
            progress.overall.inc(1);
            continue;
        }
        let result = match driver::run_once(&env, &run.settings, &progress.run).await {
            Ok(result) => result,
            // A peer failing is the report's finding about it, not the report's failure.
            Err(why) if peers::peer(system).is_some() => {
                eprintln!("{} failed: {why}", system.id());
                if let Some(note) = peer_notes.iter_mut().find(|note| note.system == system) {
                    note.problem = Some(format!("failed while running: {}", peers::tail(&why, 8)));
                }
                measured.retain(|m: &Measured| m.settings.system != system);
                progress.overall.inc(1);
                continue;
            }
            Err(why) => return Err(why),
        };
        if let Some(cut) = &result.unfinished {
            let why = format!(
                "{} ran out of time after {} of {} outputs ({} s)",
                system.id(),
                cut.seen,
                cut.expected,
                cut.patience.as_secs()
            );
            let Some(note) = peer_notes.iter_mut().find(|note| note.system == system) else {
                // onceflow and the other contenders finish, or the report is wrong.
                return Err(why);
            };
            eprintln!("{why}: measured on the outputs it made, run once");
            note.unfinished = Some(cut.clone());
        }
        measured.push(Measured {
            section: run.section,
            point: run.point,
            settings: run.settings,
            result,
        });
        progress.overall.inc(1);
    }
    let mut restores = Vec::new();
    if args.restore_ids > 0 && args.contenders.contains(&System::ExactlyOnce) {
        let settings = driver::RestoreSettings {
            events: args.restore_ids,
            keys: args.restore_keys,
            size: args.workload.size,
            commit_interval: Duration::from_millis(args.commit_interval_ms),
            max_batch: args.max_batch,
        };
        for _ in 0..args.restore_repeats {
            progress.overall.set_message("restore onceflow-eo");
            restores.push(driver::restore_once(&env, &settings, &progress.run).await?);
            progress.overall.inc(1);
        }
    }
    progress.run.finish_and_clear();
    progress.overall.finish();

    let date = report::today();
    let charts = if args.no_charts {
        Vec::new()
    } else {
        charts::draw(&args.out, &date, &measured).unwrap_or_else(|error| {
            eprintln!("charts skipped: {error}");
            Vec::new()
        })
    };
    let base = measured
        .first()
        .map(|m| m.settings.clone())
        .ok_or("no contender ran")?;
    let conditions = Conditions {
        base,
        repeats: args.repeats,
        sweep_repeats: args.sweep_repeats,
        command: command_line(),
        elapsed: started.elapsed(),
        broker: format!(
            "Apache Kafka {} (KRaft, one node) at {}",
            onceflow_testkit::KAFKA_VERSION,
            kafka.bootstrap_servers()
        ),
        charts,
        onceflow_kafka: args.onceflow_kafka.clone(),
        restore: (restore_runs > 0).then_some(report::RestoreConditions {
            ids: args.restore_ids,
            keys: args.restore_keys,
        }),
        peers: peer_notes,
    };
    let text = report::markdown(&date, &conditions, &measured, &restores);
    let path = args.out.join(format!("{date}.md"));
    report::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("{text}");
    println!("written to {}", path.display());
    Ok(())
}

async fn effects(cli: EffectsCli) -> Result<(), String> {
    let kafka: &'static onceflow_testkit::Kafka = match &cli.brokers {
        Some(brokers) => Box::leak(Box::new(onceflow_testkit::Kafka::connect(brokers.clone()))),
        None => onceflow_testkit::kafka().await,
    };
    let args = onceflow_bench::effects::EffectsArgs {
        events: cli.events,
        rate: cli.rate,
        latency_events: cli.latency_events,
        partitions: cli.partitions,
        commit_interval: Duration::from_millis(cli.commit_interval_ms),
    };
    let phases = onceflow_bench::effects::run(kafka, &args)
        .await
        .map_err(|e| e.to_string())?;
    let date = report::today();
    let broker = format!(
        "Apache Kafka {} (KRaft, one node) at {}",
        onceflow_testkit::KAFKA_VERSION,
        kafka.bootstrap_servers()
    );
    let text = onceflow_bench::effects::markdown(&date, &args, &broker, &phases);
    let path = cli.out.join(format!("{date}-effects.md"));
    report::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("{text}");
    println!("written to {}", path.display());
    Ok(())
}

/// `onceflow-bench report …` as typed, for the report's header.
fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("onceflow-bench {}", args.join(" "))
}

/// `mvn -q -B package` in `bench/streams/`.
fn build_streams_jar(args: &ReportArgs) -> Result<(), String> {
    let project = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/streams"));
    eprintln!("building the Kafka Streams contender (mvn -q -B package)…");
    let status = std::process::Command::new("mvn")
        .args(["-q", "-B", "package"])
        .current_dir(&project)
        .status()
        .map_err(|e| format!("mvn: {e} (Maven and Java 17 are needed for streams-eos2)"))?;
    if !status.success() || !args.streams_jar.exists() {
        return Err(format!(
            "mvn package in {} failed or did not make {}",
            project.display(),
            args.streams_jar.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report's plan for `onceflow-bench report ARGS`.
    fn planned(args: &[&str]) -> Vec<Planned> {
        let cli = Cli::try_parse_from(["onceflow-bench", "report"].iter().chain(args))
            .expect("the arguments parse");
        let Commands::Report(args) = cli.command else {
            panic!("not the report command");
        };
        plan(&args)
    }

    fn sections(runs: &[Planned]) -> Vec<&str> {
        let mut sections: Vec<&str> = runs.iter().map(|r| r.section.as_str()).collect();
        sections.dedup();
        sections
    }

    #[test]
    fn a_sweep_option_given_no_value_leaves_that_sweep_out() {
        let all = planned(&[]);
        assert_eq!(
            sections(&all),
            [
                "main",
                "commit interval",
                "partitions",
                "payload bytes",
                "instances",
                "dedup log IDs"
            ]
        );
        let some = planned(&[
            "--sweep-commit-intervals",
            "--sweep-partitions",
            "--no-charts",
        ]);
        assert_eq!(
            sections(&some),
            ["main", "payload bytes", "instances", "dedup log IDs"]
        );
    }

    /// At 200,000 events one instance is done in about a second, less than the group's
    /// joins take: the instance sweep runs more, and its byte cap does not cut them.
    #[test]
    fn the_instance_sweep_runs_long_enough_to_measure_instances() {
        let events = |runs: &[Planned], section: &str| -> Vec<u64> {
            runs.iter()
                .filter(|r| r.section == section)
                .map(|r| r.settings.events)
                .collect()
        };
        let runs = planned(&["--sweep-bytes", "1000000"]);
        let instances = events(&runs, "instances");
        assert!(!instances.is_empty());
        assert!(instances.iter().all(|&n| n == 2_000_000), "{instances:?}");
        assert!(events(&runs, "main").iter().all(|&n| n == 200_000));

        let more = planned(&["--events", "3000000", "--sweep-instance-events", "10"]);
        assert!(events(&more, "instances").iter().all(|&n| n == 3_000_000));
    }
}
