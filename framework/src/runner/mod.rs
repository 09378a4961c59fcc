//! `onceflow::run`: a processor becomes a complete service binary.
//!
//! ```text
//!  argv, ONCEFLOW_*, --config file ─► settings (all problems at once, before connecting)
//!        │
//!        ├─ run (default) ─► logs, /metrics + /healthz, signals ─► Engine::run
//!        │     └─ role = processor | effects | all (with run_with_effects): the
//!        │        processor, the executor of its effects, or both side by side
//!        ├─ verify-config ─► every setting with its value and where it came from
//!        ├─ inspect ──────► what the transaction log holds, per partition
//!        └─ dlq replay ───► re-publish dead letters, exactly once
//! ```
//!
//! Exit codes: [`EXIT_CODES`], listed by `--help` and the reference page
//! (`docs/src/reference/exit-codes.md`).

mod commands;
mod endpoint;
#[cfg(test)]
mod reference;
mod settings;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Arg, Command};

use crate::Error;
use crate::config::GroupTopic;
use crate::effects::{Effect, Intent, Outcome};
use crate::engine::Engine;
use crate::engine::Shutdown;
use crate::processor::Processor;
use settings::{LogFormat, Role, Settings};

/// Exit code of a failure: an engine stopped on an error, or a subcommand failed.
const EXIT_FAILED: u8 = 1;
/// Exit code of a bad command line or configuration.
const EXIT_USAGE: u8 = 2;
/// Exit code of an instance fenced by a newer one.
const EXIT_FENCED: u8 = 3;
/// Exit code of a second signal while stopping: 128 + SIGINT, as a shell reports it.
const EXIT_INTERRUPTED: u8 = 130;

/// An exit code of the process, and when it is given.
pub(crate) struct Exit {
    /// The code.
    pub(crate) code: u8,
    /// When the process exits with it, in Markdown (code in backquotes).
    pub(crate) meaning: &'static str,
}

/// Every exit code of a runner binary: `--help` lists them, and so does the reference
/// page (`docs/src/reference/exit-codes.md`).
pub(crate) const EXIT_CODES: &[Exit] = &[
    Exit {
        code: 0,
        meaning: "Stopped as asked: the first SIGINT or SIGTERM finished and committed the open \
                  batch and left the group. Also a subcommand (`verify-config`, `inspect`, \
                  `dlq replay`) that succeeded, and `--help` or `--version`.",
    },
    Exit {
        code: EXIT_FAILED,
        meaning: "Failed: the processor or the effect executor stopped on an error (a refused \
                  credential, a missing ACL, a state directory refused at start, a changelog \
                  behind the group's offsets, `on_error = stop`, ...), or a subcommand failed. \
                  The error is on stderr and in the log. With two engines in one process \
                  (`role = all`), one stopping on an error stops the other.",
    },
    Exit {
        code: EXIT_USAGE,
        meaning: "Bad command line or configuration: every problem is printed, and nothing was \
                  started. Also a `metrics_address` that cannot be listened on.",
    },
    Exit {
        code: EXIT_FENCED,
        meaning: "Fenced: another instance with the same group and instance ID started, so \
                  this one stopped without committing its open batch. Give every running \
                  instance its own `instance_id`.",
    },
    Exit {
        code: EXIT_INTERRUPTED,
        meaning: "A second SIGINT or SIGTERM while stopping: the process exits at once. The \
                  open batch is not committed (the broker aborts its transaction) and is \
                  processed again by whoever gets the partition.",
    },
];

/// The exit codes as `--help` ends with them.
fn exit_codes_help() -> String {
    let mut help = String::from("Exit codes:\n");
    for exit in EXIT_CODES {
        help.push_str(&format!(
            "  {:<5}{}\n",
            exit.code,
            settings::plain(exit.meaning)
        ));
    }
    help
}

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

/// [`run`] for a processor that records side effects ([`crate::Context::effect`]), with
/// the executor that applies them ([`crate::effects`]). The setting `role` picks what a
/// process runs: `all` (the default) the processor and the executor side by side,
/// `processor` or `effects` one of them, so each can be scaled on its own (the
/// executor is its own consumer group, `<group>-effects-executor`). Intents go to
/// `effects_topic` (default `<group>-effects`); `effect_results` names a topic for the
/// results.
///
/// ```no_run
/// # use onceflow::{Context, Event, Processor, Result};
/// # use onceflow::effects::{Effect, Intent, Outcome};
/// # #[derive(Event, serde::Deserialize)]
/// # struct Order { #[event(id)] id: String }
/// # #[derive(Processor)]
/// # #[processor(name = "shipping", input = "orders", input_type = Order)]
/// # struct Shipping;
/// # impl Shipping {
/// #     async fn handle(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
/// #         ctx.effect("ship", &order.id, &order.id)
/// #     }
/// # }
/// struct Warehouse;
///
/// #[onceflow::async_trait]
/// impl Effect for Warehouse {
///     fn name(&self) -> &str { "warehouse" }
///     async fn apply(&mut self, intent: &Intent) -> Outcome {
///         // POST intent.payload with the header Idempotency-Key: intent.idempotency_key
///         Outcome::Applied(None)
///     }
/// }
///
/// #[tokio::main]
/// async fn main() -> std::process::ExitCode {
///     onceflow::run_with_effects(Shipping, Warehouse).await
/// }
/// ```
pub async fn run_with_effects<P: Processor, E: Effect>(processor: P, effect: E) -> ExitCode {
    run_service(processor, Some(effect), std::env::args_os()).await
}

/// [`run_with_effects`] with the given command line (the first item is the program name).
pub async fn run_with_effects_and_args<P, E, I, T>(processor: P, effect: E, args: I) -> ExitCode
where
    P: Processor,
    E: Effect,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_service(processor, Some(effect), args).await
}

/// [`run`] for a processor built from the application's own settings: `make` gets them
/// as `S`, read from the `[app]` table of the `--config` file, `ONCEFLOW_APP_<KEY>`
/// variables and `--app key=value` flags (each over the one before), through serde, so
/// they are checked with onceflow's own before anything connects (a problem exits 2) and
/// `verify-config` shows them with where each came from.
///
/// ```no_run
/// # use onceflow::{Context, Event, Processor, Result};
/// # #[derive(Event, serde::Deserialize)]
/// # struct Payment { #[event(id)] id: String, account: String, cents: i64 }
/// #[derive(serde::Deserialize)]
/// struct Limits {
///     daily_limit_cents: i64,
/// }
///
/// #[derive(Processor)]
/// #[processor(name = "payments", input = "payments", input_type = Payment, outputs = ["approved"])]
/// struct Payments {
///     limit: i64,
/// }
/// # impl Payments {
/// #     async fn handle(&mut self, p: Payment, ctx: &mut Context<'_>) -> Result<()> {
/// #         if p.cents <= self.limit { ctx.emit(Self::APPROVED, &p.account, &p.id)?; }
/// #         Ok(())
/// #     }
/// # }
///
/// #[tokio::main]
/// async fn main() -> std::process::ExitCode {
///     // payments --app daily_limit_cents=50000, ONCEFLOW_APP_DAILY_LIMIT_CENTS=50000,
///     // or daily_limit_cents = 50000 under [app] in the --config file
///     onceflow::run_with_settings(|limits: Limits| Payments { limit: limits.daily_limit_cents })
///         .await
/// }
/// ```
///
/// The binary's name in `--help` is its file's; `--version` shows onceflow's (the
/// processor, and so its version, exists only once the settings are read).
pub async fn run_with_settings<S, P>(make: impl FnOnce(S) -> P + 'static) -> ExitCode
where
    S: serde::de::DeserializeOwned,
    P: Processor,
{
    run_with_settings_and_args(make, std::env::args_os()).await
}

/// [`run_with_settings`] with the given command line (the first item is the program name).
pub async fn run_with_settings_and_args<S, P, I, T>(
    make: impl FnOnce(S) -> P + 'static,
    args: I,
) -> ExitCode
where
    S: serde::de::DeserializeOwned,
    P: Processor,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let make: Make<P, NoEffect> = Box::new(move |app| Ok((make(app_settings(app)?), None)));
    run_built(program_name(&args), None, make, args).await
}

/// [`run_with_effects`] for a processor and an effect built from the application's own
/// settings (as [`run_with_settings`] reads them): a payment API's address, say.
pub async fn run_with_effects_and_settings<S, P, E>(
    make: impl FnOnce(S) -> (P, E) + 'static,
) -> ExitCode
where
    S: serde::de::DeserializeOwned,
    P: Processor,
    E: Effect,
{
    let args: Vec<OsString> = std::env::args_os().collect();
    let make: Make<P, E> = Box::new(move |app| {
        let (processor, effect) = make(app_settings(app)?);
        Ok((processor, Some(effect)))
    });
    run_built(program_name(&args), None, make, args).await
}

/// The application's settings as `S`, or why not.
fn app_settings<S: serde::de::DeserializeOwned>(app: toml::Table) -> Result<S, String> {
    S::deserialize(toml::Value::Table(app)).map_err(|error| {
        format!(
            "the application's settings ([app], ONCEFLOW_APP_*, --app): {}",
            error.to_string().trim()
        )
    })
}

/// The program's file name, for `--help`, when no processor names the binary yet.
fn program_name(args: &[OsString]) -> String {
    args.first()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "onceflow".into())
}

/// [`run`] with the given command line (the first item is the program name).
pub async fn run_with_args<P, I, T>(processor: P, args: I) -> ExitCode
where
    P: Processor,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_service::<P, NoEffect, I, T>(processor, None, args).await
}

/// The effect of a binary without an executor: never constructed.
enum NoEffect {}

#[crate::async_trait]
impl Effect for NoEffect {
    fn name(&self) -> &str {
        match *self {}
    }
    async fn apply(&mut self, _: &Intent) -> Outcome {
        match *self {}
    }
}

/// A binary's processor (and effect): given, or built from the application's settings.
type Make<P, E> = Box<dyn FnOnce(toml::Table) -> Result<(P, Option<E>), String>>;

async fn run_service<P, E, I, T>(processor: P, effect: Option<E>, args: I) -> ExitCode
where
    P: Processor,
    E: Effect,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let name = processor.name().to_owned();
    let version = processor.version().map(str::to_owned);
    let make: Make<P, E> = Box::new(move |app: toml::Table| {
        if app.is_empty() {
            Ok((processor, effect))
        } else {
            let keys: Vec<&String> = app.keys().collect();
            Err(format!(
                "this binary takes no application settings (given: {keys:?}); build it with \
                 onceflow::run_with_settings to read them"
            ))
        }
    });
    run_built(name, version, make, args).await
}

/// The service: the command line, the application's settings and the processor built
/// from them, then onceflow's settings, the subcommands or the engines.
async fn run_built<P, E, I, T>(
    name: String,
    version: Option<String>,
    make: Make<P, E>,
    args: I,
) -> ExitCode
where
    P: Processor,
    E: Effect,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let version = format!(
        "{} (onceflow {})",
        version.as_deref().unwrap_or("(version unknown)"),
        env!("CARGO_PKG_VERSION")
    );
    let matches = match command(&name)
        .version(version.clone())
        .try_get_matches_from(args)
    {
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
    let refused = |problems: Vec<Error>| {
        for problem in &problems {
            eprintln!("error: {problem}");
        }
        eprintln!(
            "{name}: {} configuration problem(s); nothing was started (see --help)",
            problems.len()
        );
        ExitCode::from(EXIT_USAGE)
    };
    let (app, app_shown) = match settings::app(&matches, &env) {
        Ok(app) => app,
        Err(problems) => return refused(problems),
    };
    let (processor, effect) = match make(app) {
        Ok(parts) => parts,
        Err(accepted) => {
            return refused(vec![Error::Config {
                key: "app".into(),
                value: app_shown
                    .iter()
                    .map(|(key, value, _)| format!("{key} = {value}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                accepted,
            }]);
        }
    };
    let declared = settings::declared(&processor);
    let settings = settings::resolve(&matches, &env, &declared, &host)
        .and_then(|settings| with_executor(settings, effect.is_some()));
    let mut settings = match settings {
        Ok(settings) => settings,
        Err(problems) => return refused(problems),
    };
    settings.resolved.extend(app_shown);
    init_logging(&settings);
    // Listened for before anything of `run` starts: a SIGTERM while the engines start
    // (a rollout stopping a pod that has just started) stops them as a later one does,
    // where the signal's default action would kill the process (a repeat run of
    // issue 40 saw that exit status). The other subcommands keep the default action.
    let serving = !matches!(
        matches.subcommand_name(),
        Some("verify-config" | "inspect" | "dlq")
    );
    let signals = serving.then(Signals::listen);
    tracing::info!(processor = %declared.name, %version, "onceflow runner");

    let outcome = match matches.subcommand() {
        Some(("verify-config", _)) => commands::verify_config(&settings),
        Some(("inspect", _)) => commands::inspect(&settings.engine).await,
        Some(("dlq", dlq)) => match dlq.subcommand() {
            Some(("replay", replay)) => commands::replay(&settings.engine, replay).await,
            _ => unreachable!("clap requires a dlq subcommand"),
        },
        _ => {
            return serve(
                processor,
                effect,
                settings,
                signals.unwrap_or_else(Signals::listen),
            )
            .await;
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(EXIT_FAILED)
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
        .after_long_help(exit_codes_help())
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

/// The settings once it is known whether the binary has an effect executor: with one,
/// effects are on (`<group>-effects` unless `effects_topic` names another); without,
/// `role = effects` has nothing to run.
fn with_executor(mut settings: Settings, has_executor: bool) -> Result<Settings, Vec<Error>> {
    if !has_executor {
        if settings.role == Role::Effects {
            return Err(vec![Error::Config {
                key: "role".into(),
                value: "effects".into(),
                accepted: "processor or all: this binary has no effect executor \
                           (build it with onceflow::run_with_effects)"
                    .into(),
            }]);
        }
        return Ok(settings);
    }
    if settings.engine.effects_topic.is_none() {
        let topic = GroupTopic::Effects.name(&settings.engine.group);
        settings.resolved.push((
            "effects_topic".into(),
            topic.clone(),
            settings::Source::Derived(GroupTopic::Effects.pattern()),
        ));
        settings.engine.effects_topic = Some(topic);
    }
    Ok(settings)
}

/// The `run` subcommand: the engines the role asks for, the endpoint and the signals.
async fn serve<P: Processor, E: Effect>(
    processor: P,
    effect: Option<E>,
    settings: Settings,
    signals: Signals,
) -> ExitCode {
    let processor_engine = match settings.role {
        Role::Effects if effect.is_some() => None,
        _ => match Engine::new(settings.engine.clone()) {
            Ok(engine) => Some(engine),
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    let executor = match (effect, settings.role) {
        (Some(effect), Role::Effects | Role::All) => {
            let started = async {
                if processor_engine.is_some() {
                    // The processor creates the effects topic when it starts, and it starts
                    // after this: on a group that never ran, the executor would wait out
                    // its bound for a topic nobody creates yet. Make the processor's
                    // topics first (what its start would do; it finds them there).
                    let options = crate::kafka::ClientOptions::with_properties(
                        &settings.engine.bootstrap_servers,
                        &settings.engine.kafka_properties,
                    );
                    crate::engine::check_topics(&options, &settings.engine).await?;
                }
                let config = crate::effects::executor_config(
                    &settings.engine,
                    &settings.engine.instance_id,
                )?;
                crate::effects::executor(config, effect, settings.effect_results.as_deref()).await
            };
            match started.await {
                Ok(executor) => Some(executor),
                Err(error) => {
                    eprintln!("error: the effect executor: {error}");
                    return ExitCode::from(if matches!(error, Error::Config { .. }) {
                        EXIT_USAGE
                    } else {
                        EXIT_FAILED
                    });
                }
            }
        }
        _ => None,
    };
    if let Some(address) = settings.metrics_address {
        // /healthz follows the processor where this process runs one.
        let stats = match (&processor_engine, &executor) {
            (Some(engine), _) | (None, Some((engine, _))) => engine.stats(),
            (None, None) => unreachable!("a role runs at least one engine"),
        };
        match endpoint::serve(address, stats, &settings.engine).await {
            Ok(bound) => tracing::info!(%bound, "serving /metrics and /healthz"),
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    let shutdowns: Vec<Shutdown> = processor_engine
        .iter()
        .chain(executor.iter().map(|(engine, _)| engine))
        .map(Engine::shutdown_handle)
        .collect();
    tokio::spawn(stop_on_signals(shutdowns.clone(), signals));
    // Either engine stopping on an error stops the other one too: a process that runs
    // half of its role is worse than one that exits and is restarted.
    let stop_all = |what: &'static str, outcome: crate::Result<crate::StatsSnapshot>| {
        if outcome.is_err() {
            shutdowns.iter().for_each(Shutdown::trigger);
        }
        (what, outcome)
    };
    let (first, second) = tokio::join!(
        async {
            match processor_engine {
                Some(engine) => Some(stop_all("processor", engine.run(processor).await)),
                None => None,
            }
        },
        async {
            match executor {
                Some((engine, executor)) => {
                    Some(stop_all("effect executor", engine.run(executor).await))
                }
                None => None,
            }
        },
    );
    let mut code = ExitCode::SUCCESS;
    for (what, outcome) in [first, second].into_iter().flatten() {
        match outcome {
            Ok(stats) => tracing::info!(engine = what, ?stats, "stopped"),
            Err(error @ Error::Fenced { .. }) => {
                tracing::error!(engine = what, %error, "fenced");
                eprintln!("error: the {what}: {error}");
                code = ExitCode::from(EXIT_FENCED);
            }
            Err(error) => {
                tracing::error!(engine = what, %error, "stopped on an error");
                eprintln!("error: the {what}: {error}");
                if code == ExitCode::SUCCESS {
                    code = ExitCode::from(EXIT_FAILED);
                }
            }
        }
    }
    code
}

/// SIGTERM and SIGINT, listened for from when it is made: a signal that comes before
/// anyone waits for it is not lost (nor does it kill the process).
struct Signals {
    terminate: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(signal) => Some(signal),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for {name}: it does not stop gracefully");
                None
            }
        };
        Signals {
            terminate: listen(SignalKind::terminate(), "SIGTERM"),
            interrupt: listen(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// The next SIGTERM or SIGINT (never, when neither could be listened for).
    async fn next(&mut self) {
        tokio::select! {
            () = received(self.terminate.as_mut()) => {}
            () = received(self.interrupt.as_mut()) => {}
        }
    }
}

/// The next delivery of `signal`; never without one.
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// First SIGINT or SIGTERM: every engine of the process finishes and commits its open
/// batch, then stops. Second: exit now (the open transactions are then aborted by the
/// broker, nothing of them is visible).
async fn stop_on_signals(shutdowns: Vec<Shutdown>, mut signals: Signals) {
    signals.next().await;
    tracing::warn!("stopping after the open batch commits; signal again to exit at once");
    shutdowns.iter().for_each(Shutdown::trigger);
    signals.next().await;
    eprintln!(
        "second signal: exiting now; the open batch is not committed and will be processed again"
    );
    std::process::exit(i32::from(EXIT_INTERRUPTED));
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
