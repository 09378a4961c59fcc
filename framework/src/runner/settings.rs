//! The runner's settings: one table, read from the command line, `ONCEFLOW_*` variables
//! and a TOML file, in that order of precedence, then checked all at once.
//!
//! ```text
//!  --flag value ─┐
//!  ONCEFLOW_KEY ─┼─► first one set ─► typed value ─► EngineConfig + runner options
//!  file: key = ──┤                      │ problem?
//!  default ──────┘                      └─► one Error::Config per problem, before connecting
//! ```
//!
//! Every setting has one name: `commit_interval` in the file, `--commit-interval` on the
//! command line, `ONCEFLOW_COMMIT_INTERVAL` in the environment. Kafka client properties
//! pass through unchanged: `--kafka key=value`, `ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SSL`
//! (underscores become dots) or a `[kafka]` table in the file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches};

use crate::Error;
use crate::config::{DeliveryMode, EngineConfig, ErrorPolicy, GroupTopic};
use crate::redact;

/// One setting: its name in the file, its default (`None` when it depends on the
/// processor or the host), and what it means.
struct Setting {
    key: &'static str,
    default: Option<&'static str>,
    value_name: &'static str,
    help: &'static str,
}

const fn setting(
    key: &'static str,
    default: Option<&'static str>,
    value_name: &'static str,
    help: &'static str,
) -> Setting {
    Setting {
        key,
        default,
        value_name,
        help,
    }
}

/// Every setting the runner takes (besides `config` and the Kafka pass-through).
const SETTINGS: &[Setting] = &[
    setting(
        "brokers",
        Some("localhost:9092"),
        "HOST:PORT,…",
        "Kafka bootstrap servers",
    ),
    setting(
        "group",
        None,
        "NAME",
        "Consumer group, one per operator [default: the processor's name]",
    ),
    setting(
        "instance_id",
        None,
        "ID",
        "This instance's ID, unique in the group and stable across restarts [default: the host name]",
    ),
    setting(
        "input",
        None,
        "TOPIC",
        "Input topic [default: the topic the processor declares; this one replaces it]",
    ),
    setting(
        "outputs",
        None,
        "TOPIC|NAME=TOPIC,…",
        "Output topics added to those the processor declares (TOPIC), or a declared output sent to another topic (NAME=TOPIC, e.g. invoices=prod.invoices)",
    ),
    setting(
        "state_dir",
        Some("onceflow-state"),
        "DIR",
        "Where the transaction log lives (<state_dir>/<group>/<instance_id>/)",
    ),
    setting(
        "commit_interval",
        Some("100ms"),
        "DURATION",
        "A batch closes after this long…",
    ),
    setting(
        "max_batch_records",
        Some("1000"),
        "N",
        "…or after this many input records",
    ),
    setting(
        "delivery",
        Some("exactly-once"),
        "MODE",
        "exactly-once, at-least-once or at-most-once",
    ),
    setting(
        "dedup_window",
        Some("7days"),
        "DURATION",
        "Dedup entries older than this expire",
    ),
    setting(
        "dedup_max_entries",
        Some("none"),
        "N",
        "At most this many dedup entries per partition (oldest expire first)",
    ),
    setting(
        "event_id_header",
        Some("onceflow-event-id"),
        "HEADER",
        "Header holding the event ID when the event has none",
    ),
    setting(
        "require_event_id",
        Some("false"),
        "BOOL",
        "A record without an event ID is handled per on_error",
    ),
    setting(
        "transaction_timeout",
        Some("10s"),
        "DURATION",
        "Bound on one Kafka transaction, and on how long a dead instance stalls readers",
    ),
    setting(
        "on_error",
        Some("dead-letter"),
        "POLICY",
        "dead-letter, skip or stop: what happens to a record that cannot be processed",
    ),
    setting(
        "dead_letter_topic",
        None,
        "TOPIC",
        "Dead-letter topic [default: <group>-dlq]",
    ),
    setting(
        "changelog_topic",
        None,
        "TOPIC",
        "Changelog topic [default: <group>-txlog]",
    ),
    setting(
        "changelog_replication_factor",
        None,
        "N",
        "Replication factor of the changelog and dead-letter topics onceflow creates [default: the broker's]",
    ),
    setting(
        "role",
        Some("all"),
        "ROLE",
        "processor, effects or all: with an effect executor (onceflow::run_with_effects), whether this process runs the processor, the executor of its effects, or both",
    ),
    setting(
        "effects_topic",
        None,
        "TOPIC",
        "Topic of the processor's effect intents [default: <group>-effects when the binary has an effect executor, else effects are off]",
    ),
    setting(
        "effect_results",
        Some("none"),
        "TOPIC|none",
        "Where the executor records each applied effect's result (an existing topic), or none",
    ),
    setting(
        "max_attempts",
        Some("5"),
        "N",
        "Attempts at a record that fails transiently…",
    ),
    setting(
        "max_retry_time",
        Some("10s"),
        "DURATION",
        "…within at most this long",
    ),
    setting(
        "metrics_address",
        Some("127.0.0.1:9464"),
        "ADDR|off",
        "Where /metrics and /healthz are served",
    ),
    setting("log_format", Some("human"), "FORMAT", "human or json"),
    setting(
        "log",
        Some("info"),
        "FILTER",
        "Log filter (tracing's EnvFilter syntax, e.g. onceflow=debug)",
    ),
];

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

/// The environment variable of a setting.
fn env_name(key: &str) -> String {
    format!("ONCEFLOW_{}", key.to_ascii_uppercase())
}

/// The command-line flag of a setting.
fn flag(key: &str) -> String {
    key.replace('_', "-")
}

/// The settings as command-line arguments (global, so they may follow a subcommand).
pub(crate) fn arguments() -> Vec<Arg> {
    let mut args = vec![
        Arg::new("config")
            .long("config")
            .env("ONCEFLOW_CONFIG")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .global(true)
            .help("TOML file with any of these settings (keys as in the long flag, with _), and a [kafka] table"),
        Arg::new("kafka")
            .long("kafka")
            .value_name("KEY=VALUE")
            .action(ArgAction::Append)
            .global(true)
            .help("Any librdkafka property, for every client (repeatable; also ONCEFLOW_KAFKA_<KEY> with _ for .)"),
    ];
    for s in SETTINGS {
        let mut arg = Arg::new(s.key)
            .long(flag(s.key))
            .env(env_name(s.key))
            .value_name(s.value_name)
            .help(s.help)
            .global(true);
        if let Some(default) = s.default {
            arg = arg.default_value(default);
        }
        if s.key == "outputs" {
            arg = arg.visible_alias("output");
        }
        if s.key == "require_event_id" {
            arg = arg.num_args(0..=1).default_missing_value("true");
        }
        args.push(arg);
    }
    args
}

/// Reads the settings `matches` (from a command built with [`arguments`]) and the file
/// it names, and checks them. `env` is the process environment (for the Kafka
/// pass-through variables); `host` the host name.
pub(crate) fn resolve(
    matches: &ArgMatches,
    env: &BTreeMap<String, String>,
    declared: &Declared,
    host: &str,
) -> Result<Settings, Vec<Error>> {
    let file = match matches.get_one::<PathBuf>("config") {
        Some(path) => Some((path.clone(), read_file(path).map_err(|e| vec![e])?)),
        None => None,
    };
    let mut problems = Vec::new();
    let mut resolved = Vec::new();
    let mut values: BTreeMap<&str, String> = BTreeMap::new();
    for s in SETTINGS {
        let from_args = match matches.value_source(s.key) {
            Some(ValueSource::CommandLine) => Some(Source::CommandLine),
            Some(ValueSource::EnvVariable) => Some(Source::Environment(env_name(s.key))),
            _ => None,
        };
        let picked = match from_args {
            Some(source) => matches
                .get_one::<String>(s.key)
                .map(|value| (value.clone(), source)),
            None => match file
                .as_ref()
                .and_then(|(path, table)| table.get(s.key).map(|value| (path, value)))
            {
                Some((path, value)) => match scalar(value) {
                    Some(text) => Some((text, Source::File(path.clone()))),
                    None => {
                        problems.push(Error::Config {
                            key: s.key.into(),
                            value: value.to_string(),
                            accepted: format!(
                                "a string, number or boolean in {} ({})",
                                path.display(),
                                s.help
                            ),
                        });
                        None
                    }
                },
                None => s.default.map(|d| (d.to_owned(), Source::Default)),
            },
        };
        let picked = picked.or_else(|| derived(s.key, declared, host, &values));
        if let Some((value, source)) = picked {
            values.insert(s.key, value.clone());
            resolved.push((s.key.to_owned(), value, source));
        }
    }
    let kafka = kafka_properties(matches, env, file.as_ref(), &mut problems);
    for (key, value, source) in &kafka {
        resolved.push((
            format!("kafka.{key}"),
            redact::shown(key, value).to_owned(),
            source.clone(),
        ));
    }

    let settings = build(&values, kafka, &mut problems);
    match settings {
        Some(mut settings) if problems.is_empty() => {
            problems.extend(settings.engine.problems());
            let outputs: Vec<&str> = declared.outputs.iter().map(String::as_str).collect();
            problems.extend(crate::config::unknown_rename(
                &settings.engine.renamed_outputs,
                &outputs,
                &declared.name,
            ));
            if problems.is_empty() {
                settings.resolved = resolved;
                settings.declared = declared.clone();
                Ok(settings)
            } else {
                Err(problems)
            }
        }
        _ => Err(problems),
    }
}

/// Defaults that come from the processor or the host.
fn derived(
    key: &str,
    declared: &Declared,
    host: &str,
    values: &BTreeMap<&str, String>,
) -> Option<(String, Source)> {
    let group = || values.get("group").cloned().unwrap_or_default();
    match key {
        "group" => Some((
            declared.name.clone(),
            Source::Derived("the processor's name"),
        )),
        "instance_id" => Some((instance_id_from(host), Source::Derived("the host name"))),
        "input" => declared
            .input
            .clone()
            .map(|topic| (topic, Source::Derived("the processor's declaration"))),
        "outputs" if !declared.outputs.is_empty() => Some((
            declared.outputs.join(","),
            Source::Derived("the processor's declaration"),
        )),
        "dead_letter_topic" => Some(group_topic(GroupTopic::DeadLetters, &group())),
        "changelog_topic" => Some(group_topic(GroupTopic::Changelog, &group())),
        _ => None,
    }
}

/// A topic named after the group, and its pattern as where it came from.
fn group_topic(topic: GroupTopic, group: &str) -> (String, Source) {
    (topic.name(group), Source::Derived(topic.pattern()))
}

/// A host name made into an instance ID: characters Kafka does not take in a
/// transactional ID are replaced by `-`.
pub(crate) fn instance_id_from(host: &str) -> String {
    let id: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if id.is_empty() { "instance".into() } else { id }
}

/// The file as a table; unknown keys are errors, each named with the known ones.
fn read_file(path: &Path) -> Result<toml::Table, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
        key: "config".into(),
        value: path.display().to_string(),
        accepted: format!("a readable TOML file ({e})"),
    })?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Config {
        key: "config".into(),
        value: path.display().to_string(),
        accepted: format!("valid TOML: {}", e.message()),
    })?;
    let unknown: Vec<&String> = table
        .keys()
        .filter(|key| *key != "kafka" && !SETTINGS.iter().any(|s| s.key == key.as_str()))
        .collect();
    if let Some(key) = unknown.first() {
        let known: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
        return Err(Error::Config {
            key: (*key).clone(),
            value: format!("(in {})", path.display()),
            accepted: format!(
                "one of the known keys: {}, or a [kafka] table",
                known.join(", ")
            ),
        });
    }
    Ok(table)
}

/// A TOML scalar as the text a flag would carry; lists become comma-separated.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(|items| items.join(",")),
        _ => None,
    }
}

/// Kafka client properties: the command line over the environment over the file.
fn kafka_properties(
    matches: &ArgMatches,
    env: &BTreeMap<String, String>,
    file: Option<&(PathBuf, toml::Table)>,
    problems: &mut Vec<Error>,
) -> Vec<(String, String, Source)> {
    let mut properties: BTreeMap<String, (String, Source)> = BTreeMap::new();
    if let Some((path, table)) = file
        && let Some(kafka) = table.get("kafka")
    {
        match kafka.as_table() {
            Some(kafka) => {
                for (key, value) in kafka {
                    match scalar(value) {
                        Some(text) => {
                            properties.insert(key.clone(), (text, Source::File(path.clone())));
                        }
                        None => problems.push(Error::Config {
                            key: format!("kafka.{key}"),
                            value: redact::shown(key, &value.to_string()).to_owned(),
                            accepted: "a string, number or boolean".into(),
                        }),
                    }
                }
            }
            None => problems.push(Error::Config {
                key: "kafka".into(),
                value: kafka.to_string(),
                accepted: "a table of librdkafka properties: [kafka] then key = \"value\" lines"
                    .into(),
            }),
        }
    }
    for (name, value) in env {
        if let Some(rest) = name.strip_prefix("ONCEFLOW_KAFKA_")
            && !rest.is_empty()
        {
            let key = rest.to_ascii_lowercase().replace('_', ".");
            properties.insert(key, (value.clone(), Source::Environment(name.clone())));
        }
    }
    for pair in matches.get_many::<String>("kafka").into_iter().flatten() {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                properties.insert(
                    key.trim().to_owned(),
                    (value.to_owned(), Source::CommandLine),
                );
            }
            _ => problems.push(Error::Config {
                key: "kafka".into(),
                value: redact::shown(pair, pair).to_owned(),
                accepted: "key=value, e.g. --kafka security.protocol=SSL".into(),
            }),
        }
    }
    read_secret_files(properties, problems)
}

/// Suffix of a Kafka property whose value is read from a file: `sasl.password.file=/run/x`
/// sets `sasl.password` to the file's contents (without its trailing newline).
const FILE_SUFFIX: &str = ".file";

/// Replaces every `<key>.file` property by `<key>` with the file's contents, so secrets
/// need not be on the command line or in the configuration file.
fn read_secret_files(
    properties: BTreeMap<String, (String, Source)>,
    problems: &mut Vec<Error>,
) -> Vec<(String, String, Source)> {
    let mut resolved = Vec::new();
    for (key, (value, source)) in &properties {
        let Some(target) = key.strip_suffix(FILE_SUFFIX) else {
            resolved.push((key.clone(), value.clone(), source.clone()));
            continue;
        };
        if properties.contains_key(target) {
            problems.push(Error::Config {
                key: format!("kafka.{key}"),
                value: value.clone(),
                accepted: format!("either {target} or {key}, not both"),
            });
            continue;
        }
        match std::fs::read_to_string(value) {
            Ok(contents) => resolved.push((
                target.to_owned(),
                contents.trim_end_matches(['\n', '\r']).to_owned(),
                Source::SecretFile {
                    path: PathBuf::from(value),
                    named_by: Box::new(source.clone()),
                },
            )),
            Err(error) => problems.push(Error::Config {
                key: format!("kafka.{key}"),
                value: value.clone(),
                accepted: format!("a readable file holding the value of {target} ({error})"),
            }),
        }
    }
    resolved.sort_by(|a, b| a.0.cmp(&b.0));
    resolved
}

/// Typed values from the resolved text; every value that does not parse is a problem.
fn build(
    values: &BTreeMap<&str, String>,
    kafka: Vec<(String, String, Source)>,
    problems: &mut Vec<Error>,
) -> Option<Settings> {
    let text = |key: &str| values.get(key).cloned().unwrap_or_default();
    let mut bad = |key: &str, accepted: &str| {
        problems.push(Error::Config {
            key: key.into(),
            value: text(key),
            accepted: accepted.into(),
        })
    };
    let duration = |key: &str, bad: &mut dyn FnMut(&str, &str)| {
        humantime::parse_duration(&text(key))
            .map_err(|_| bad(key, "a duration such as 250ms, 5s, 2min, 7days"))
            .ok()
    };
    let number = |key: &str, bad: &mut dyn FnMut(&str, &str)| {
        text(key)
            .parse::<u64>()
            .map_err(|_| bad(key, "a whole number"))
            .ok()
    };

    if !values.contains_key("input") {
        bad(
            "input",
            "a topic: set --input (ONCEFLOW_INPUT, or input in the file), or declare it with #[processor(input = \"...\")]",
        );
    }
    let commit_interval = duration("commit_interval", &mut bad);
    let dedup_window = duration("dedup_window", &mut bad);
    let transaction_timeout = duration("transaction_timeout", &mut bad);
    let max_retry_time = duration("max_retry_time", &mut bad);
    let max_batch_records = number("max_batch_records", &mut bad);
    let max_attempts = number("max_attempts", &mut bad);
    let changelog_replication_factor = match text("changelog_replication_factor").as_str() {
        "" => None,
        _ => number("changelog_replication_factor", &mut bad).and_then(|n| i32::try_from(n).ok()),
    };
    let dedup_max_entries = match text("dedup_max_entries").as_str() {
        "none" | "" => Some(None),
        _ => number("dedup_max_entries", &mut bad).map(Some),
    };
    let delivery = text("delivery")
        .parse::<DeliveryMode>()
        .map_err(|e| problems_push(&mut bad, "delivery", &e))
        .ok();
    let on_error = text("on_error")
        .parse::<ErrorPolicy>()
        .map_err(|e| problems_push(&mut bad, "on_error", &e))
        .ok();
    let require_event_id = match text("require_event_id").as_str() {
        "true" | "yes" | "1" => Some(true),
        "false" | "no" | "0" => Some(false),
        _ => {
            bad("require_event_id", "true or false");
            None
        }
    };
    let metrics_address = match text("metrics_address").as_str() {
        "off" | "none" | "" => Some(None),
        address => address
            .parse::<SocketAddr>()
            .map(Some)
            .map_err(|_| {
                bad(
                    "metrics_address",
                    "ip:port, e.g. 127.0.0.1:9464 or 0.0.0.0:9464, or off",
                )
            })
            .ok(),
    };
    let log_format = match text("log_format").as_str() {
        "human" => Some(LogFormat::Human),
        "json" => Some(LogFormat::Json),
        _ => {
            bad("log_format", "human or json");
            None
        }
    };
    let role = match text("role").as_str() {
        "processor" => Some(Role::Processor),
        "effects" => Some(Role::Effects),
        "all" => Some(Role::All),
        _ => {
            bad("role", "processor, effects or all");
            None
        }
    };
    let effect_results = match text("effect_results").as_str() {
        "none" | "" => None,
        topic => Some(topic.to_owned()),
    };
    let max_batch_records = max_batch_records.and_then(|n| {
        usize::try_from(n)
            .map_err(|_| bad("max_batch_records", "a whole number that fits in memory"))
            .ok()
    });
    let max_attempts = max_attempts.and_then(|n| {
        u32::try_from(n)
            .map_err(|_| bad("max_attempts", "a whole number below 4294967296"))
            .ok()
    });

    let mut engine = EngineConfig::new(
        text("brokers"),
        text("group"),
        text("instance_id"),
        text("input"),
        text("state_dir"),
    );
    for entry in text("outputs")
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        match entry.split_once('=') {
            None => engine.output_topics.push(entry.to_owned()),
            Some((name, topic)) if !name.trim().is_empty() && !topic.trim().is_empty() => {
                engine
                    .renamed_outputs
                    .insert(name.trim().to_owned(), topic.trim().to_owned());
            }
            Some(_) => bad(
                "outputs",
                "TOPIC or NAME=TOPIC entries, comma-separated (NAME a declared output)",
            ),
        }
    }
    engine.event_id_header = text("event_id_header");
    engine.dead_letter_topic = Some(text("dead_letter_topic"));
    engine.changelog_topic = Some(text("changelog_topic"));
    engine.changelog_replication_factor = changelog_replication_factor;
    engine.effects_topic = Some(text("effects_topic")).filter(|t| !t.is_empty());
    engine.kafka_properties = kafka.into_iter().map(|(k, v, _)| (k, v)).collect();
    engine.commit_interval = commit_interval?;
    engine.dedup_window = dedup_window?;
    engine.transaction_timeout = transaction_timeout?;
    engine.max_retry_time = max_retry_time?;
    engine.max_batch_records = max_batch_records?;
    engine.max_attempts = max_attempts?;
    engine.dedup_max_entries = dedup_max_entries?;
    engine.delivery = delivery?;
    engine.on_error = on_error?;
    engine.require_event_id = require_event_id?;
    Some(Settings {
        engine,
        metrics_address: metrics_address?,
        log_format: log_format?,
        log_filter: text("log"),
        role: role?,
        effect_results,
        resolved: Vec::new(),
        declared: Declared::default(),
    })
}

/// Reports a parse error of `key` with the accepted values the parser gave.
fn problems_push(bad: &mut dyn FnMut(&str, &str), key: &str, error: &Error) {
    match error {
        Error::Config { accepted, .. } => bad(key, accepted),
        other => bad(key, &other.to_string()),
    }
}

/// The processor's declaration, for the runner's defaults.
pub(crate) fn declared<P: crate::Processor>(processor: &P) -> Declared {
    Declared {
        name: processor.name().to_owned(),
        input: processor.input_topic().map(str::to_owned),
        outputs: processor
            .output_topics()
            .iter()
            .map(|t| (*t).to_owned())
            .collect(),
    }
}

/// Every setting key.
#[cfg(test)]
pub(crate) fn keys() -> impl Iterator<Item = &'static str> {
    SETTINGS.iter().map(|s| s.key)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Command;

    use super::*;

    fn command() -> Command {
        Command::new("test").args(arguments())
    }

    fn declared() -> Declared {
        Declared {
            name: "billing".into(),
            input: Some("orders".into()),
            outputs: vec!["invoices".into()],
        }
    }

    fn resolve_args(args: &[&str]) -> Result<Settings, Vec<Error>> {
        let matches = command()
            .try_get_matches_from(std::iter::once("test").chain(args.iter().copied()))
            .expect("arguments parse");
        resolve(&matches, &BTreeMap::new(), &declared(), "host-1")
    }

    /// Settings from `config`, one `--kafka` flag and one variable.
    fn resolve_with(
        config: &tempfile::NamedTempFile,
        kafka: &str,
        (name, value): (&str, &str),
    ) -> Settings {
        let matches = command()
            .try_get_matches_from([
                "test",
                "--config",
                config.path().to_str().expect("utf-8"),
                "--kafka",
                kafka,
            ])
            .expect("parse");
        let env = BTreeMap::from([(name.to_owned(), value.to_owned())]);
        resolve(&matches, &env, &declared(), "h").expect("valid")
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), text).expect("write");
        file
    }

    fn keys_of(problems: &[Error]) -> Vec<String> {
        problems
            .iter()
            .map(|e| match e {
                Error::Config { key, .. } => key.clone(),
                other => panic!("not a config error: {other}"),
            })
            .collect()
    }

    /// Issue 16, part 3: the same binary against `staging.orders` and `prod.invoices`.
    #[test]
    fn declared_topics_are_defaults_that_flags_variables_and_the_file_rename() {
        let settings = resolve_args(&[
            "--input",
            "staging.orders",
            "--output",
            "invoices=prod.invoices,audit",
        ])
        .expect("valid");
        let engine = &settings.engine;
        assert_eq!(engine.input_topic, "staging.orders");
        assert_eq!(
            engine.renamed_outputs,
            BTreeMap::from([("invoices".to_owned(), "prod.invoices".to_owned())])
        );
        assert_eq!(engine.output_topics, ["audit"], "a plain topic is added");

        let config = file("input = \"prod.orders\"\noutputs = \"invoices = prod.invoices\"\n");
        let from_file = resolve_with(&config, "linger.ms=5", ("ONCEFLOW_KAFKA_ACKS", "all"));
        assert_eq!(from_file.engine.input_topic, "prod.orders");
        assert_eq!(
            from_file.engine.renamed_outputs["invoices"],
            "prod.invoices"
        );

        // A rename names a declared output; an empty side is no rename.
        let problems = resolve_args(&["--outputs", "receipts=prod.receipts"]).expect_err("unknown");
        assert_eq!(keys_of(&problems), ["outputs"]);
        assert!(
            problems[0].to_string().contains("invoices"),
            "{}",
            problems[0]
        );
        let problems = resolve_args(&["--outputs", "invoices="]).expect_err("empty");
        assert_eq!(keys_of(&problems), ["outputs"]);
    }

    #[test]
    fn the_role_and_the_effect_settings_parse_and_bad_roles_are_named() {
        let settings = resolve_args(&[]).expect("defaults");
        assert_eq!(settings.role, Role::All);
        assert_eq!(settings.effect_results, None);
        assert_eq!(settings.engine.effects_topic, None, "off unless asked for");
        let settings = resolve_args(&[
            "--role",
            "effects",
            "--effects-topic",
            "shop-intents",
            "--effect-results",
            "shipped",
        ])
        .expect("valid");
        assert_eq!(settings.role, Role::Effects);
        assert_eq!(settings.effect_results.as_deref(), Some("shipped"));
        assert_eq!(
            settings.engine.effects_topic.as_deref(),
            Some("shop-intents")
        );
        let problems = resolve_args(&["--role", "executor"]).expect_err("unknown role");
        assert_eq!(keys_of(&problems), ["role"]);
        assert!(
            problems[0]
                .to_string()
                .contains("processor, effects or all"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn verify_config_shows_each_declared_topic_and_where_it_goes() {
        let settings = resolve_args(&[
            "--input",
            "staging.orders",
            "--outputs",
            "invoices=prod.invoices,audit",
        ])
        .expect("valid");
        let shown = crate::runner::commands::topic_mapping(&settings);
        assert_eq!(
            shown,
            "topics:\n  input  orders -> staging.orders  (renamed)\n  output invoices -> \
             prod.invoices  (renamed)\n  output audit  (not declared)\n"
        );
        let plain = crate::runner::commands::topic_mapping(&resolve_args(&[]).expect("valid"));
        assert_eq!(plain, "topics:\n  input  orders\n  output invoices\n");
    }

    #[test]
    fn defaults_come_from_the_table_the_processor_and_the_host() {
        let settings = resolve_args(&[]).expect("valid");
        let engine = &settings.engine;
        assert_eq!(engine.bootstrap_servers, "localhost:9092");
        assert_eq!(engine.group, "billing");
        assert_eq!(engine.instance_id, "host-1");
        assert_eq!(engine.input_topic, "orders");
        assert_eq!(engine.commit_interval, Duration::from_millis(100));
        assert_eq!(engine.dedup_window, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(engine.dead_letter_topic(), "billing-dlq");
        assert_eq!(engine.changelog_topic(), "billing-txlog");
        assert_eq!(settings.metrics_address, "127.0.0.1:9464".parse().ok());
        let defaults = EngineConfig::new("b", "g", "i", "t", "s");
        assert_eq!(engine.max_batch_records, defaults.max_batch_records);
        assert_eq!(engine.max_attempts, defaults.max_attempts);
        assert_eq!(engine.max_retry_time, defaults.max_retry_time);
        assert_eq!(engine.transaction_timeout, defaults.transaction_timeout);
        assert_eq!(engine.event_id_header, defaults.event_id_header);
    }

    #[test]
    fn the_command_line_wins_over_the_file_which_wins_over_defaults() {
        let config = file(
            "brokers = \"file:9092\"\ncommit_interval = \"250ms\"\nmax_batch_records = 50\n\
             [kafka]\n\"linger.ms\" = 7\n\"client.id\" = \"from-file\"\n",
        );
        let path = config.path().to_str().expect("utf-8 path");
        let settings = resolve_args(&[
            "--config",
            path,
            "--brokers",
            "cli:9092",
            "--kafka",
            "client.id=from-cli",
        ])
        .expect("valid");
        assert_eq!(settings.engine.bootstrap_servers, "cli:9092");
        assert_eq!(settings.engine.commit_interval, Duration::from_millis(250));
        assert_eq!(settings.engine.max_batch_records, 50);
        assert_eq!(
            settings.engine.kafka_properties,
            [
                ("client.id".to_owned(), "from-cli".to_owned()),
                ("linger.ms".to_owned(), "7".to_owned())
            ]
        );
        let source = |key: &str| {
            settings
                .resolved
                .iter()
                .find(|(k, _, _)| k == key)
                .map(|(_, _, s)| s.clone())
        };
        assert_eq!(source("brokers"), Some(Source::CommandLine));
        assert_eq!(
            source("commit_interval"),
            Some(Source::File(config.path().into()))
        );
        assert_eq!(source("delivery"), Some(Source::Default));
    }

    #[test]
    fn kafka_variables_override_the_file_and_lose_to_the_command_line() {
        let config = file("[kafka]\n\"linger.ms\" = \"1\"\n\"acks\" = \"all\"\n");
        let settings = resolve_with(&config, "acks=-1", ("ONCEFLOW_KAFKA_LINGER_MS", "5"));
        assert_eq!(
            settings.engine.kafka_properties,
            [
                ("acks".to_owned(), "-1".to_owned()),
                ("linger.ms".to_owned(), "5".to_owned())
            ]
        );
    }

    #[test]
    fn secrets_come_from_files_or_variables_and_are_never_shown() {
        let secret_file = file("s3cret-from-file\n");
        let config = file("[kafka]\n\"ssl.key.password\" = \"s3cret-in-toml\"\n");
        let settings = resolve_with(
            &config,
            &format!("sasl.password.file={}", secret_file.path().display()),
            (
                "ONCEFLOW_KAFKA_SSL_KEY_PEM",
                "-----BEGIN PRIVATE KEY-----s3cret-pem",
            ),
        );
        let value = |key: &str| {
            settings
                .engine
                .kafka_properties
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(value("sasl.password").as_deref(), Some("s3cret-from-file"));
        assert_eq!(value("sasl.password.file"), None);
        assert!(value("ssl.key.pem").is_some() && value("ssl.key.password").is_some());

        let shown = format!("{:?} {:?}", settings.resolved, settings);
        assert!(!shown.contains("s3cret"), "{shown}");
        let (_, password, source) = settings
            .resolved
            .iter()
            .find(|(key, _, _)| key == "kafka.sasl.password")
            .expect("listed");
        assert_eq!(password, "[redacted]");
        assert!(
            source
                .to_string()
                .contains(&secret_file.path().display().to_string()),
            "{source}"
        );
    }

    #[test]
    fn a_secret_file_that_cannot_be_read_or_a_doubled_secret_is_a_problem() {
        let problems = resolve_args(&[
            "--kafka",
            "sasl.password.file=/nonexistent/password",
            "--kafka",
            "ssl.key.password=x",
            "--kafka",
            "ssl.key.password.file=/etc/hostname",
        ])
        .expect_err("invalid");
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 2, "{text:?}");
        assert!(text[0].contains("/nonexistent/password"), "{text:?}");
        assert!(text[1].contains("not both"), "{text:?}");
    }

    #[test]
    fn every_bad_value_is_one_problem_naming_its_key() {
        let problems = resolve_args(&[
            "--commit-interval",
            "fast",
            "--delivery",
            "twice",
            "--max-batch-records",
            "many",
            "--metrics-address",
            "everywhere",
            "--kafka",
            "no-equals-sign",
        ])
        .expect_err("invalid");
        assert_eq!(
            keys_of(&problems),
            [
                "kafka",
                "commit_interval",
                "max_batch_records",
                "delivery",
                "metrics_address"
            ]
        );
        let message = problems[1].to_string();
        assert!(
            message.contains("`fast`") && message.contains("250ms"),
            "{message}"
        );
    }

    #[test]
    fn engine_level_problems_are_reported_too() {
        let problems = resolve_args(&["--max-retry-time", "200s", "--group", "has space"])
            .expect_err("invalid");
        assert_eq!(keys_of(&problems), ["group", "max_retry_time"]);
    }

    #[test]
    fn unknown_file_keys_are_errors_that_list_the_known_ones() {
        let config = file("brokers = \"a:1\"\ncommit_intervall = \"1s\"\n");
        let matches = command()
            .try_get_matches_from(["test", "--config", config.path().to_str().expect("utf-8")])
            .expect("parse");
        let problems =
            resolve(&matches, &BTreeMap::new(), &declared(), "h").expect_err("unknown key");
        assert_eq!(keys_of(&problems), ["commit_intervall"]);
        assert!(
            problems[0].to_string().contains("commit_interval,"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn a_processor_without_an_input_needs_one_configured() {
        let matches = command().try_get_matches_from(["test"]).expect("parse");
        let none = Declared {
            name: "p".into(),
            ..Declared::default()
        };
        let problems = resolve(&matches, &BTreeMap::new(), &none, "h").expect_err("no input");
        assert_eq!(keys_of(&problems), ["input"]);
    }

    #[test]
    fn host_names_become_valid_instance_ids() {
        assert_eq!(instance_id_from("billing-0"), "billing-0");
        assert_eq!(instance_id_from("my host:1"), "my-host-1");
        assert_eq!(instance_id_from(""), "instance");
    }

    #[test]
    fn every_setting_has_a_flag_and_a_variable() {
        let command = command();
        for key in keys() {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id() == key)
                .expect("an argument per setting");
            assert_eq!(arg.get_long(), Some(flag(key).as_str()));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(env_name(key).as_str())
            );
        }
    }
}
