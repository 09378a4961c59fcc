//! `onceflow::run`: a processor becomes a complete service binary.
//!
//! ```text
//!  argv, ONCEFLOW_*, --config file ─► settings (all problems at once, before connecting)
//!        │
//!        ├─ run (default) ─► logs, /metrics + /healthz, signals ─► Engine::run
//!        ├─ verify-config ─► every setting with its value and where it came from
//!        ├─ inspect ──────► what the transaction log holds, per partition
//!        └─ dlq replay ───► re-publish dead letters, exactly once
//! ```
//!
//! Exit codes: 0 stopped as asked (or a subcommand succeeded), 1 failed, 2 bad usage or
//! configuration (nothing was started), 3 fenced by another instance with the same
//! instance ID, 130 a second signal while stopping.

mod commands;
mod endpoint;
mod settings;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Arg, Command};

use crate::Error;
use crate::engine::Engine;
use crate::engine::Shutdown;
use crate::processor::Processor;
use settings::{LogFormat, Settings};

/// Exit code of a bad command line or configuration.
const EXIT_USAGE: u8 = 2;
/// Exit code of an instance fenced by a newer one.
const EXIT_FENCED: u8 = 3;

/// Runs `processor` as a service: parses the command line, the `ONCEFLOW_*` environment
/// and the `--config` file, then consumes, processes and commits until SIGINT or SIGTERM
/// (the open batch is finished and committed; a second signal exits at once). The same
/// binary has the subcommands `verify-config`, `inspect` and `dlq replay`; `--help` lists
/// every setting with its default.
///
/// ```no_run
/// # use onceflow::{Context, Event, Processor, Result};
/// # #[derive(Event, serde::Deserialize)]
/// # struct Order { #[event(id)] id: String }
/// # #[derive(Processor)]
/// # #[processor(name = "billing", input = "orders", input_type = Order)]
/// # struct Billing;
/// # impl Billing {
/// #     async fn handle(&mut self, _: Order, _: &mut Context<'_>) -> Result<()> { Ok(()) }
/// # }
/// #[tokio::main]
/// async fn main() -> std::process::ExitCode {
///     onceflow::run(Billing).await
/// }
/// ```
pub async fn run<P: Processor>(processor: P) -> ExitCode {
    run_with_args(processor, std::env::args_os()).await
}

/// [`run`] with the given command line (the first item is the program name).
pub async fn run_with_args<P, I, T>(processor: P, args: I) -> ExitCode
where
    P: Processor,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let declared = settings::declared(&processor);
    let matches = match command(&declared.name).try_get_matches_from(args) {
        Ok(matches) => matches,
        Err(error) => {
            // --help and --version print to stdout and succeed; the rest is misuse.
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let settings = match settings::resolve(&matches, &env, &declared, &host) {
        Ok(settings) => settings,
        Err(problems) => {
            for problem in &problems {
                eprintln!("error: {problem}");
            }
            eprintln!(
                "{}: {} configuration problem(s); nothing was started (see --help)",
                declared.name,
                problems.len()
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    init_logging(&settings);

    let outcome = match matches.subcommand() {
        Some(("verify-config", _)) => commands::verify_config(&settings),
        Some(("inspect", _)) => commands::inspect(&settings.engine).await,
        Some(("dlq", dlq)) => match dlq.subcommand() {
            Some(("replay", replay)) => commands::replay(&settings.engine, replay).await,
            _ => unreachable!("clap requires a dlq subcommand"),
        },
        _ => return serve(processor, settings).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The command line: the settings (global) and the subcommands.
fn command(name: &str) -> Command {
    Command::new(name.to_owned())
        .about(format!(
            "The `{name}` stream processor (onceflow): every input's effects happen exactly once.\n\
             Settings come from flags, then ONCEFLOW_* variables, then the --config file, then the defaults."
        ))
        .args(settings::arguments())
        .subcommand(Command::new("run").about("Consume, process and commit until stopped (the default)"))
        .subcommand(Command::new("verify-config").about(
            "Check the configuration without connecting, and print every setting with where it came from",
        ))
        .subcommand(Command::new("inspect").about(
            "Show what this instance's transaction log holds, per partition (with the instance stopped)",
        ))
        .subcommand(
            Command::new("dlq")
                .about("Work with the dead-letter topic")
                .subcommand_required(true)
                .subcommand(
                    Command::new("replay")
                        .about("Re-publish dead-lettered records to the topic they came from, exactly once")
                        .arg(Arg::new("error_class").long("error-class").value_name("CLASS").help(
                            "Only records dead-lettered with this class (decode, permanent, panic, transient-exhausted, …)",
                        ))
                        .arg(Arg::new("from_offset").long("from-offset").value_name("OFFSET")
                            .value_parser(clap::value_parser!(i64)).help("Only dead-letter offsets from this one…"))
                        .arg(Arg::new("to_offset").long("to-offset").value_name("OFFSET")
                            .value_parser(clap::value_parser!(i64)).help("…up to this one (inclusive)"))
                        .arg(Arg::new("to_topic").long("to-topic").value_name("TOPIC")
                            .help("Re-publish to this topic instead of each record's source topic"))
                        .arg(Arg::new("replay_group").long("replay-group").value_name("NAME").help(
                            "Consumer group of the replay [default: <group>-dlq-replay]; records it passed over stay passed over for it",
                        )),
                ),
        )
}

/// Logs to stderr, human-readable or JSON, filtered by `log` (or `RUST_LOG`).
fn init_logging(settings: &Settings) {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| settings.log_filter.clone());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    // A second runner in one process (tests) keeps the first subscriber.
    let _ = match settings.log_format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The `run` subcommand: the engine, its endpoint and the signal handling.
async fn serve<P: Processor>(processor: P, settings: Settings) -> ExitCode {
    let engine = match Engine::new(settings.engine.clone()) {
        Ok(engine) => engine,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(address) = settings.metrics_address {
        match endpoint::serve(address, engine.stats(), &settings.engine).await {
            Ok(bound) => tracing::info!(%bound, "serving /metrics and /healthz"),
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    tokio::spawn(stop_on_signals(engine.shutdown_handle()));
    match engine.run(processor).await {
        Ok(stats) => {
            tracing::info!(?stats, "stopped");
            ExitCode::SUCCESS
        }
        Err(error @ Error::Fenced { .. }) => {
            tracing::error!(%error, "fenced");
            eprintln!("error: {error}");
            ExitCode::from(EXIT_FENCED)
        }
        Err(error) => {
            tracing::error!(%error, "stopped on an error");
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// First SIGINT or SIGTERM: finish and commit the open batch, then stop. Second: exit now
/// (the open transaction is then aborted by the broker, nothing of it is visible).
async fn stop_on_signals(shutdown: Shutdown) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops gracefully");
                return wait_for_interrupts(shutdown).await;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::warn!("stopping after the open batch commits; signal again to exit at once");
    shutdown.trigger();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    eprintln!(
        "second signal: exiting now; the open batch is not committed and will be processed again"
    );
    std::process::exit(130);
}

async fn wait_for_interrupts(shutdown: Shutdown) {
    if tokio::signal::ctrl_c().await.is_ok() {
        shutdown.trigger();
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_well_formed() {
        command("billing").debug_assert();
    }

    #[test]
    fn help_lists_every_setting_with_its_default() {
        let help = command("billing").render_long_help().to_string();
        for key in settings::keys() {
            assert!(
                help.contains(&format!("--{}", key.replace('_', "-"))),
                "{key} missing:\n{help}"
            );
        }
        assert!(help.contains("[default: 100ms]"), "{help}");
        assert!(help.contains("ONCEFLOW_COMMIT_INTERVAL"), "{help}");
    }
}
