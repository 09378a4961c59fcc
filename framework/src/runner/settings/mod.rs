//! The runner's settings: one table, read from the command line, `ONCEFLOW_*` variables
//! and a TOML file, in that order of precedence, then checked all at once.
//!
//! ```text
//!  --flag value ─┐
//!  ONCEFLOW_KEY ─┼─► first one set ─► row's setter ─► EngineConfig + runner options
//!  file: key = ──┤                      │ problem?
//!  default ──────┘                      └─► one Error::Config per problem, before connecting
//! ```
//!
//! Every setting has one name: `commit_interval` in the file, `--commit-interval` on the
//! command line, `ONCEFLOW_COMMIT_INTERVAL` in the environment. Kafka client properties
//! pass through unchanged: `--kafka key=value`, `ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SSL`
//! (underscores become dots) or a `[kafka]` table in the file.
//!
//! - Each setting is one row of [`table::SETTINGS`]: its names, help, default and setter.
//!   `-h` shows its one-line help, `--help` adds its longer `doc`, and the reference page
//!   (`docs/src/reference/settings.md`) is rendered from the same rows (`documented`).
//! - A default is rendered from [`Settings::start`], which takes the engine's from
//!   `EngineConfig::new`: there is no second copy to fall out of step.
//! - Topic names derived from the group are made in `config.rs` only.

mod sources;
mod table;
#[cfg(test)]
mod tests;
mod values;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches};

use crate::Error;
use crate::redact;
use table::{Fallback, SETTINGS};
use values::env_name;
pub(crate) use values::{Declared, LogFormat, Role, Settings, Source};

/// The command-line flag of a setting.
fn flag(key: &str) -> String {
    key.replace('_', "-")
}

/// `--config`, in one line.
const CONFIG_HELP: &str =
    "TOML file with any of these settings (keys as in the long flag, with _), and a [kafka] table";
/// `--kafka`, in one line.
const KAFKA_HELP: &str = "Any librdkafka property, for every client (repeatable; also ONCEFLOW_KAFKA_<KEY> with _ for .)";
/// `--kafka`: what else to know, in Markdown (as a setting's `doc`).
const KAFKA_DOC: &str = "Also `ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SSL` (`_` for `.`) or a `[kafka]` \
     table in the file; the command line wins over variables, which win over the file. \
     `key.file=PATH` reads the value of `key` from a file (for secrets, which are never shown: \
     `verify-config` prints `[redacted]`). The input consumer's own defaults, which these \
     override: `queued.min.messages` = `max_batch_records` (at least 1,000; librdkafka's \
     100,000 per partition held a whole backlog in memory), `queued.max.messages.kbytes` = \
     2048 across all partitions (or `max_batch_records` / 8 when more; librdkafka's 64 MiB let \
     eight partitions hold eight batches), `fetch.queue.backoff.ms` = 1 (librdkafka's 1 s \
     starves a queue that small, and 10 ms held records of 1 kB and more back), \
     `statistics.interval.ms` = 5000 (the lag metric) and `check.crcs` = true (a damaged batch \
     stops the instance). The engine's producers' own defaults: `linger.ms` = 5, and for every \
     transactional producer `retry.backoff.ms` = 10 (a transaction begun while its coordinator \
     still finishes the last one is told CONCURRENT_TRANSACTIONS, and librdkafka's 100 ms wait \
     before asking again was most of the p99 at a 10 ms commit interval). Properties onceflow \
     sets itself (group, instance, transactional ID, isolation, auto-commit; \
     `auto.offset.reset` and `partition.assignment.strategy` unless they are its own values, \
     `earliest` and `range,roundrobin`) and ones that break the engine \
     (`enable.partition.eof=true`, `enable.idempotence=false`, `acks=0` or `1`) are refused \
     at start, each with the reason.";

/// `--app`'s one-line help.
pub(crate) const APP_HELP: &str =
    "A setting of the application's own (binaries made with onceflow::run_with_settings)";

/// What else `--app` takes.
pub(crate) const APP_DOC: &str = "Also `ONCEFLOW_APP_<KEY>` variables and an `[app]` table \
     in the file, each flag over its variable over the file. A value is read as TOML when it \
     is one (`42`, `true`, `\"text\"`), else as a string. The application's type says which \
     keys it takes; `verify-config` shows each with where it came from (secrets redacted).";

/// Markdown as a terminal shows it: without the backquotes.
pub(crate) fn plain(markdown: &str) -> String {
    markdown.replace('`', "")
}

/// `--help`'s text of a setting: its one-line help, then what else to know.
fn long_help(help: String, doc: &str) -> String {
    if doc.is_empty() {
        help
    } else {
        format!("{help}\n{}", plain(doc))
    }
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
            .help(CONFIG_HELP),
        Arg::new("kafka")
            .long("kafka")
            .value_name("KEY=VALUE")
            .action(ArgAction::Append)
            .global(true)
            .help(KAFKA_HELP)
            .long_help(long_help(KAFKA_HELP.into(), KAFKA_DOC)),
    ];
    args.push(
        Arg::new("app")
            .long("app")
            .value_name("KEY=VALUE")
            .action(ArgAction::Append)
            .global(true)
            .help(APP_HELP)
            .long_help(long_help(APP_HELP.into(), APP_DOC)),
    );
    let start = Settings::start();
    for s in SETTINGS {
        let mut arg = Arg::new(s.key)
            .long(flag(s.key))
            .env(env_name(s.key))
            .value_name(s.value_name)
            .help(s.help_text())
            .long_help(long_help(s.help_text(), s.doc))
            .global(true);
        if let Fallback::Value(render) = s.default {
            arg = arg.default_value(render(&start));
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
/// Each setting's key, its value as shown, and where it came from.
pub(crate) type Shown = Vec<(String, String, Source)>;

/// The application's own settings as a table, and per key the value shown and where it
/// came from (see [`sources::app_settings`]).
pub(crate) fn app(
    matches: &ArgMatches,
    env: &BTreeMap<String, String>,
) -> Result<(toml::Table, Shown), Vec<Error>> {
    let file = match matches.get_one::<PathBuf>("config") {
        Some(path) => Some(sources::read_file(path).map_err(|e| vec![e])?),
        None => None,
    };
    let mut problems = Vec::new();
    let app = sources::app_settings(matches, env, file.as_ref(), &mut problems);
    if problems.is_empty() {
        Ok(app)
    } else {
        Err(problems)
    }
}

pub(crate) fn resolve(
    matches: &ArgMatches,
    env: &BTreeMap<String, String>,
    declared: &Declared,
    host: &str,
) -> Result<Settings, Vec<Error>> {
    let file = match matches.get_one::<PathBuf>("config") {
        Some(path) => Some(sources::read_file(path).map_err(|e| vec![e])?),
        None => None,
    };
    // Problems reading the sources come first, then the values that are not valid.
    let mut problems = Vec::new();
    let mut invalid = Vec::new();
    let start = Settings::start();
    let mut settings = start.clone();
    let mut resolved = Vec::new();
    for s in SETTINGS {
        let picked =
            sources::given(s, matches, file.as_ref(), &mut problems).or_else(|| match s.default {
                Fallback::Value(render) => Some((render(&start), Source::Default)),
                Fallback::Derived(derived) => derived.value(declared, host, &settings.engine.group),
                Fallback::Unset(_) => None,
            });
        match picked {
            Some((value, source)) => {
                if let Err(accepted) = (s.set)(&value, &mut settings) {
                    invalid.push(Error::Config {
                        key: s.key.into(),
                        value: value.clone(),
                        accepted,
                    });
                }
                resolved.push((s.key.to_owned(), value, source));
            }
            None => {
                if let Fallback::Derived(derived) = s.default
                    && let Some(accepted) = derived.required()
                {
                    invalid.push(Error::Config {
                        key: s.key.into(),
                        value: String::new(),
                        accepted: accepted.into(),
                    });
                }
            }
        }
    }
    let kafka = sources::kafka_properties(matches, env, file.as_ref(), &mut problems);
    for (key, value, source) in &kafka {
        resolved.push((
            format!("kafka.{key}"),
            redact::shown(key, value).to_owned(),
            source.clone(),
        ));
    }
    settings.engine.kafka_properties = kafka.into_iter().map(|(k, v, _)| (k, v)).collect();
    problems.append(&mut invalid);

    if problems.is_empty() {
        problems.extend(settings.engine.problems());
        let outputs: Vec<&str> = declared.outputs.iter().map(String::as_str).collect();
        problems.extend(crate::config::unknown_rename(
            &settings.engine.renamed_outputs,
            &outputs,
            &declared.name,
        ));
    }
    if problems.is_empty() {
        settings.resolved = resolved;
        settings.declared = declared.clone();
        Ok(settings)
    } else {
        Err(problems)
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

/// A row of the settings reference page (`docs/src/reference/settings.md`), in Markdown.
#[cfg(test)]
pub(crate) struct Documented {
    /// The key in the file.
    pub(crate) key: String,
    /// The flag, with its value and aliases, as clap takes it.
    pub(crate) flag: String,
    /// The environment variable.
    pub(crate) variable: String,
    /// The default, or where it comes from.
    pub(crate) default: String,
    /// The one-line help (plain text).
    pub(crate) help: &'static str,
    /// What else to know (Markdown).
    pub(crate) doc: &'static str,
}

/// Every setting of the runner as the reference page lists it: the table's rows, then
/// `config` and `kafka`. Flags and variables are read back from the arguments clap is
/// given, so the page shows what `--help` shows.
#[cfg(test)]
pub(crate) fn documented() -> Vec<Documented> {
    let args = arguments();
    let arg = |id: &str| {
        args.iter()
            .find(|arg| arg.get_id() == id)
            .unwrap_or_else(|| panic!("no argument `{id}`"))
    };
    let flag = |arg: &Arg| {
        let long = arg.get_long().expect("a long flag");
        let values: Vec<String> = arg
            .get_value_names()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect();
        let value = values.join(" ");
        let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
        let mut text = if optional {
            format!("`--{long} [{value}]`")
        } else {
            format!("`--{long} {value}`")
        };
        for alias in arg.get_visible_aliases().unwrap_or_default() {
            text.push_str(&format!(" (alias `--{alias}`)"));
        }
        text
    };
    let variable = |arg: &Arg| {
        let env = arg.get_env().expect("a variable");
        format!("`{}`", env.to_string_lossy())
    };
    let start = Settings::start();
    let mut rows: Vec<Documented> = SETTINGS
        .iter()
        .map(|s| Documented {
            key: format!("`{}`", s.key),
            flag: flag(arg(s.key)),
            variable: variable(arg(s.key)),
            default: s.default.documented(&start),
            help: s.help,
            doc: s.doc,
        })
        .collect();
    rows.push(Documented {
        key: "none (not in the file)".into(),
        flag: flag(arg("config")),
        variable: variable(arg("config")),
        default: "none".into(),
        help: CONFIG_HELP,
        doc: "",
    });
    rows.push(Documented {
        key: "`[kafka]` table".into(),
        flag: format!("{} (repeatable)", flag(arg("kafka"))),
        variable: "`ONCEFLOW_KAFKA_<KEY>`".into(),
        default: "librdkafka's, but for the engine's own (below)".into(),
        help: KAFKA_HELP,
        doc: KAFKA_DOC,
    });
    rows.push(Documented {
        key: "`[app]` table".into(),
        flag: format!("{} (repeatable)", flag(arg("app"))),
        variable: "`ONCEFLOW_APP_<KEY>`".into(),
        default: "none".into(),
        help: APP_HELP,
        doc: APP_DOC,
    });
    rows
}
