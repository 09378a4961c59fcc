//! What the settings are: the values a run is configured with, each with where it came
//! from. The table of settings (`table.rs`) writes them, the sources (`sources.rs`) read
//! what they are written from; this module needs neither.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use crate::config::EngineConfig;

/// Where a value came from, for `verify-config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// `--flag` on the command line.
    CommandLine,
    /// An `ONCEFLOW_*` variable.
    Environment(String),
    /// The configuration file.
    File(PathBuf),
    /// The built-in default.
    Default,
    /// Derived from the processor or the host.
    Derived(&'static str),
    /// Read from a file (a Kafka property `<key>.file`) named by another source.
    SecretFile {
        /// The file.
        path: PathBuf,
        /// Where its name came from.
        named_by: Box<Source>,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::CommandLine => f.write_str("command line"),
            Source::Environment(name) => write!(f, "${name}"),
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Default => f.write_str("default"),
            Source::Derived(from) => f.write_str(from),
            Source::SecretFile { path, named_by } => {
                write!(f, "file {} (named by {named_by})", path.display())
            }
        }
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// One readable line per event, to stderr.
    Human,
    /// One JSON object per event, to stderr.
    Json,
}

impl LogFormat {
    /// Every format.
    pub(super) const ALL: [LogFormat; 2] = [LogFormat::Human, LogFormat::Json];

    /// The format's name in settings.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        }
    }
}

/// Which engines a process runs, when the binary has an effect executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The processor only.
    Processor,
    /// The executor of the processor's effects only.
    Effects,
    /// Both, side by side (the default).
    All,
}

impl Role {
    /// Every role.
    pub(super) const ALL: [Role; 3] = [Role::Processor, Role::Effects, Role::All];

    /// The role's name in settings.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Role::Processor => "processor",
            Role::Effects => "effects",
            Role::All => "all",
        }
    }
}

/// What the processor declares, for the defaults that depend on it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Declared {
    pub(crate) name: String,
    pub(crate) input: Option<String>,
    pub(crate) outputs: Vec<String>,
}

/// The resolved settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) engine: EngineConfig,
    pub(crate) metrics_address: Option<SocketAddr>,
    pub(crate) log_format: LogFormat,
    pub(crate) log_filter: String,
    /// Which engines this process runs.
    pub(crate) role: Role,
    /// Where the executor records results (`effect_results`).
    pub(crate) effect_results: Option<String>,
    /// Every setting's final value and where it came from, in table order.
    pub(crate) resolved: Vec<(String, String, Source)>,
    /// What the processor declares (the topics the configuration may rename).
    pub(crate) declared: Declared,
}

impl Settings {
    /// What the settings are before any is read: the defaults. The engine's are those of
    /// `EngineConfig::new`; the runner adds the ones the engine has no default for
    /// (brokers, state directory) and its own. Group, instance and topics are derived in
    /// `resolve` (`settings/mod.rs`).
    pub(super) fn start() -> Settings {
        Settings {
            engine: EngineConfig::new("localhost:9092", "", "", "", "onceflow-state"),
            metrics_address: Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 9464))),
            log_format: LogFormat::Human,
            log_filter: "info".into(),
            role: Role::All,
            effect_results: None,
            resolved: Vec::new(),
            declared: Declared::default(),
        }
    }
}

/// The environment variable of a setting.
pub(super) fn env_name(key: &str) -> String {
    format!("ONCEFLOW_{}", key.to_ascii_uppercase())
}
