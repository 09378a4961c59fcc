//! The settings table: one row per setting, with everything the runner knows of it.
//!
//! A row's default is rendered from the settings the runner starts from
//! ([`Settings::start`]), which for engine settings is `EngineConfig::new`'s own value, so
//! `--help`, `verify-config` and the engine cannot disagree on it. Its setter parses the
//! text a flag, variable or file gave and stores it; `resolve` calls the setters in table
//! order, so building the settings is one loop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{Declared, LogFormat, Role, Settings, Source};
use crate::Error;
use crate::config::GroupTopic;

/// One setting.
pub(super) struct Setting {
    /// Its name in the file; the flag and the variable are made from it.
    pub(super) key: &'static str,
    /// What `--help` calls its value.
    pub(super) value_name: &'static str,
    /// What it means, for `--help`.
    pub(super) help: &'static str,
    /// What it is when no source sets it.
    pub(super) default: Fallback,
    /// Parses its text into the settings; `Err` holds what it accepts instead.
    pub(super) set: fn(&str, &mut Settings) -> Result<(), String>,
}

/// What a setting is when neither the command line, the environment nor the file sets it.
#[derive(Clone, Copy)]
pub(super) enum Fallback {
    /// The value the runner starts from, as a flag would give it.
    Value(fn(&Settings) -> String),
    /// A value worked out from the processor, the host or another setting.
    Derived(Derived),
    /// No value: the setting stays off, or the broker decides. The text is for `--help`.
    Unset(&'static str),
}

/// Where a derived default comes from.
#[derive(Clone, Copy)]
pub(super) enum Derived {
    /// The processor's name.
    ProcessorName,
    /// The host name, made into an instance ID.
    HostName,
    /// The input topic the processor declares; without one, the setting is required.
    DeclaredInput,
    /// The output topics the processor declares.
    DeclaredOutputs,
    /// A topic named after the group.
    GroupTopic(GroupTopic),
    /// The effects topic, named after the group once it is known that the binary has an
    /// effect executor (the runner's `with_executor`).
    EffectsTopic,
}

impl Setting {
    /// The help text with the default when clap does not show it itself (a
    /// [`Fallback::Value`] is clap's `default_value`): `Dead-letter topic [default: <group>-dlq]`.
    pub(super) fn help_text(&self) -> String {
        match self.default.shown() {
            Some(default) => format!("{} [default: {default}]", self.help),
            None => self.help.to_owned(),
        }
    }
}

impl Fallback {
    /// What `--help` says of a default that is not a value.
    fn shown(self) -> Option<String> {
        match self {
            Fallback::Value(_) => None,
            Fallback::Unset(text) => Some(text.to_owned()),
            Fallback::Derived(derived) => match derived {
                Derived::ProcessorName => Some("the processor's name".into()),
                Derived::HostName => Some("the host name".into()),
                Derived::DeclaredInput => {
                    Some("the topic the processor declares; this one replaces it".into())
                }
                Derived::DeclaredOutputs => None,
                Derived::GroupTopic(topic) => Some(topic.pattern().into()),
                Derived::EffectsTopic => Some(format!(
                    "{} when the binary has an effect executor, else effects are off",
                    GroupTopic::Effects.pattern()
                )),
            },
        }
    }
}

impl Derived {
    /// The value and where it came from; `group` is the group resolved so far.
    pub(super) fn value(
        self,
        declared: &Declared,
        host: &str,
        group: &str,
    ) -> Option<(String, Source)> {
        let declaration = Source::Derived("the processor's declaration");
        match self {
            Derived::ProcessorName => Some((
                declared.name.clone(),
                Source::Derived("the processor's name"),
            )),
            Derived::HostName => Some((instance_id_from(host), Source::Derived("the host name"))),
            Derived::DeclaredInput => declared.input.clone().map(|topic| (topic, declaration)),
            Derived::DeclaredOutputs if declared.outputs.is_empty() => None,
            Derived::DeclaredOutputs => Some((declared.outputs.join(","), declaration)),
            Derived::GroupTopic(topic) => {
                Some((topic.name(group), Source::Derived(topic.pattern())))
            }
            Derived::EffectsTopic => None,
        }
    }

    /// What a setting accepts when it has no value and must have one.
    pub(super) fn required(self) -> Option<&'static str> {
        match self {
            Derived::DeclaredInput => Some(
                "a topic: set --input (ONCEFLOW_INPUT, or input in the file), or declare it \
                 with #[processor(input = \"...\")]",
            ),
            _ => None,
        }
    }
}

/// A host name made into an instance ID: characters Kafka does not take in a
/// transactional ID are replaced by `-`.
pub(super) fn instance_id_from(host: &str) -> String {
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

/// Every setting the runner takes (besides `config` and the Kafka pass-through), in the
/// order `--help` and `verify-config` list them.
pub(super) const SETTINGS: &[Setting] = &[
    Setting {
        key: "brokers",
        value_name: "HOST:PORT,…",
        help: "Kafka bootstrap servers",
        default: Fallback::Value(|s| s.engine.bootstrap_servers.clone()),
        set: |text, s| {
            s.engine.bootstrap_servers = text.to_owned();
            Ok(())
        },
    },
    Setting {
        key: "group",
        value_name: "NAME",
        help: "Consumer group, one per operator",
        default: Fallback::Derived(Derived::ProcessorName),
        set: |text, s| {
            s.engine.group = text.to_owned();
            Ok(())
        },
    },
    Setting {
        key: "instance_id",
        value_name: "ID",
        help: "This instance's ID, unique in the group and stable across restarts",
        default: Fallback::Derived(Derived::HostName),
        set: |text, s| {
            s.engine.instance_id = text.to_owned();
            Ok(())
        },
    },
    Setting {
        key: "input",
        value_name: "TOPIC",
        help: "Input topic",
        default: Fallback::Derived(Derived::DeclaredInput),
        set: |text, s| {
            s.engine.input_topic = text.to_owned();
            Ok(())
        },
    },
    Setting {
        key: "outputs",
        value_name: "TOPIC|NAME=TOPIC,…",
        help: "Output topics added to those the processor declares (TOPIC), or a declared output sent to another topic (NAME=TOPIC, e.g. invoices=prod.invoices)",
        default: Fallback::Derived(Derived::DeclaredOutputs),
        set: set_outputs,
    },
    Setting {
        key: "state_dir",
        value_name: "DIR",
        help: "Where the transaction log lives (<state_dir>/<group>/<instance_id>/)",
        default: Fallback::Value(|s| s.engine.state_dir.display().to_string()),
        set: |text, s| {
            s.engine.state_dir = PathBuf::from(text);
            Ok(())
        },
    },
    Setting {
        key: "commit_interval",
        value_name: "DURATION",
        help: "A batch closes after this long…",
        default: Fallback::Value(|s| duration_text(s.engine.commit_interval)),
        set: |text, s| {
            s.engine.commit_interval = duration(text)?;
            Ok(())
        },
    },
    Setting {
        key: "max_batch_records",
        value_name: "N",
        help: "…or after this many input records",
        default: Fallback::Value(|s| s.engine.max_batch_records.to_string()),
        set: |text, s| {
            s.engine.max_batch_records = usize::try_from(whole_number(text)?)
                .map_err(|_| "a whole number that fits in memory")?;
            Ok(())
        },
    },
    Setting {
        key: "delivery",
        value_name: "MODE",
        help: "exactly-once, at-least-once or at-most-once",
        default: Fallback::Value(|s| s.engine.delivery.as_str().into()),
        set: |text, s| {
            s.engine.delivery = text.parse().map_err(accepted)?;
            Ok(())
        },
    },
    Setting {
        key: "dedup_window",
        value_name: "DURATION",
        help: "Dedup entries older than this expire",
        default: Fallback::Value(|s| duration_text(s.engine.dedup_window)),
        set: |text, s| {
            s.engine.dedup_window = duration(text)?;
            Ok(())
        },
    },
    Setting {
        key: "dedup_max_entries",
        value_name: "N",
        help: "At most this many dedup entries per partition (oldest expire first)",
        default: Fallback::Value(|s| none_or(s.engine.dedup_max_entries)),
        set: |text, s| {
            s.engine.dedup_max_entries = match text {
                "none" | "" => None,
                number => Some(whole_number(number)?),
            };
            Ok(())
        },
    },
    Setting {
        key: "event_id_header",
        value_name: "HEADER",
        help: "Header holding the event ID when the event has none",
        default: Fallback::Value(|s| s.engine.event_id_header.clone()),
        set: |text, s| {
            s.engine.event_id_header = text.to_owned();
            Ok(())
        },
    },
    Setting {
        key: "require_event_id",
        value_name: "BOOL",
        help: "A record without an event ID is handled per on_error",
        default: Fallback::Value(|s| s.engine.require_event_id.to_string()),
        set: |text, s| {
            s.engine.require_event_id = boolean(text)?;
            Ok(())
        },
    },
    Setting {
        key: "transaction_timeout",
        value_name: "DURATION",
        help: "Bound on one Kafka transaction, and on how long a dead instance stalls readers",
        default: Fallback::Value(|s| duration_text(s.engine.transaction_timeout)),
        set: |text, s| {
            s.engine.transaction_timeout = duration(text)?;
            Ok(())
        },
    },
    Setting {
        key: "txlog_sync_interval",
        value_name: "DURATION",
        help: "How long the transaction log may keep applies in memory only before it syncs them (0s: every batch); a crash replays them from the changelog",
        default: Fallback::Value(|s| duration_text(s.engine.txlog_sync_interval)),
        set: |text, s| {
            s.engine.txlog_sync_interval = duration(text)?;
            Ok(())
        },
    },
    Setting {
        key: "txlog_cache_size",
        value_name: "BYTES",
        help: "Memory the transaction log may keep as its page cache, such as 16MiB or 256MiB",
        default: Fallback::Value(|s| byte_size_text(s.engine.txlog_cache_size)),
        set: |text, s| {
            s.engine.txlog_cache_size = byte_size(text)?;
            Ok(())
        },
    },
    Setting {
        key: "replay_concurrency",
        value_name: "N",
        help: "Changelog partitions replayed at the same time when catching up (more: faster, and two Kafka clients each)",
        default: Fallback::Value(|s| s.engine.replay_concurrency.to_string()),
        set: |text, s| {
            s.engine.replay_concurrency = usize::try_from(whole_number(text)?)
                .map_err(|_| "a whole number that fits in memory")?;
            Ok(())
        },
    },
    Setting {
        key: "accept_changelog_behind",
        value_name: "BOOL",
        help: "Go on when a changelog's progress does not reach the group's committed offsets",
        default: Fallback::Value(|s| s.engine.accept_changelog_behind.to_string()),
        set: |text, s| {
            s.engine.accept_changelog_behind = boolean(text)?;
            Ok(())
        },
    },
    Setting {
        key: "on_error",
        value_name: "POLICY",
        help: "dead-letter, skip or stop: what happens to a record that cannot be processed",
        default: Fallback::Value(|s| s.engine.on_error.as_str().into()),
        set: |text, s| {
            s.engine.on_error = text.parse().map_err(accepted)?;
            Ok(())
        },
    },
    Setting {
        key: "dead_letter_topic",
        value_name: "TOPIC",
        help: "Dead-letter topic",
        default: Fallback::Derived(Derived::GroupTopic(GroupTopic::DeadLetters)),
        set: |text, s| {
            s.engine.dead_letter_topic = Some(text.to_owned());
            Ok(())
        },
    },
    Setting {
        key: "changelog_topic",
        value_name: "TOPIC",
        help: "Changelog topic",
        default: Fallback::Derived(Derived::GroupTopic(GroupTopic::Changelog)),
        set: |text, s| {
            s.engine.changelog_topic = Some(text.to_owned());
            Ok(())
        },
    },
    Setting {
        key: "changelog_replication_factor",
        value_name: "N",
        help: "Replication factor of the changelog and dead-letter topics onceflow creates",
        default: Fallback::Unset("the broker's"),
        set: |text, s| {
            s.engine.changelog_replication_factor = match text {
                "" => None,
                number => Some(
                    i32::try_from(whole_number(number)?)
                        .map_err(|_| "a whole number below 2147483648")?,
                ),
            };
            Ok(())
        },
    },
    Setting {
        key: "role",
        value_name: "ROLE",
        help: "processor, effects or all: with an effect executor (onceflow::run_with_effects), whether this process runs the processor, the executor of its effects, or both",
        default: Fallback::Value(|s| s.role.as_str().into()),
        set: |text, s| {
            s.role = Role::ALL
                .into_iter()
                .find(|role| role.as_str() == text)
                .ok_or("processor, effects or all")?;
            Ok(())
        },
    },
    Setting {
        key: "effects_topic",
        value_name: "TOPIC",
        help: "Topic of the processor's effect intents",
        default: Fallback::Derived(Derived::EffectsTopic),
        set: |text, s| {
            s.engine.effects_topic = Some(text.to_owned()).filter(|t| !t.is_empty());
            Ok(())
        },
    },
    Setting {
        key: "effect_results",
        value_name: "TOPIC|none",
        help: "Where the executor records each applied effect's result (an existing topic), or none",
        default: Fallback::Value(|s| none_or(s.effect_results.as_ref())),
        set: |text, s| {
            s.effect_results = match text {
                "none" | "" => None,
                topic => Some(topic.to_owned()),
            };
            Ok(())
        },
    },
    Setting {
        key: "max_attempts",
        value_name: "N",
        help: "Attempts at a record that fails transiently…",
        default: Fallback::Value(|s| s.engine.max_attempts.to_string()),
        set: |text, s| {
            s.engine.max_attempts = u32::try_from(whole_number(text)?)
                .map_err(|_| "a whole number below 4294967296")?;
            Ok(())
        },
    },
    Setting {
        key: "max_retry_time",
        value_name: "DURATION",
        help: "…within at most this long",
        default: Fallback::Value(|s| duration_text(s.engine.max_retry_time)),
        set: |text, s| {
            s.engine.max_retry_time = duration(text)?;
            Ok(())
        },
    },
    Setting {
        key: "timer_lateness",
        value_name: "DURATION",
        help: "How far behind a partition's event time its event-time timers fire",
        default: Fallback::Value(|s| duration_text(s.engine.timer_lateness)),
        set: |text, s| {
            s.engine.timer_lateness = duration(text)?;
            Ok(())
        },
    },
    Setting {
        key: "metrics_address",
        value_name: "ADDR|off",
        help: "Where /metrics and /healthz are served",
        default: Fallback::Value(|s| {
            s.metrics_address
                .map_or_else(|| "off".into(), |address| address.to_string())
        }),
        set: |text, s| {
            s.metrics_address = match text {
                "off" | "none" | "" => None,
                address => Some(
                    address
                        .parse::<SocketAddr>()
                        .map_err(|_| "ip:port, e.g. 127.0.0.1:9464 or 0.0.0.0:9464, or off")?,
                ),
            };
            Ok(())
        },
    },
    Setting {
        key: "log_format",
        value_name: "FORMAT",
        help: "human or json",
        default: Fallback::Value(|s| s.log_format.as_str().into()),
        set: |text, s| {
            s.log_format = LogFormat::ALL
                .into_iter()
                .find(|format| format.as_str() == text)
                .ok_or("human or json")?;
            Ok(())
        },
    },
    Setting {
        key: "log",
        value_name: "FILTER",
        help: "Log filter (tracing's EnvFilter syntax, e.g. onceflow=debug)",
        default: Fallback::Value(|s| s.log_filter.clone()),
        set: |text, s| {
            s.log_filter = text.to_owned();
            Ok(())
        },
    },
];

/// `outputs`: plain topics are added, `NAME=TOPIC` entries rename a declared output.
fn set_outputs(text: &str, settings: &mut Settings) -> Result<(), String> {
    let engine = &mut settings.engine;
    for entry in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match entry.split_once('=') {
            None => engine.output_topics.push(entry.to_owned()),
            Some((name, topic)) if !name.trim().is_empty() && !topic.trim().is_empty() => {
                engine
                    .renamed_outputs
                    .insert(name.trim().to_owned(), topic.trim().to_owned());
            }
            Some(_) => {
                return Err(
                    "TOPIC or NAME=TOPIC entries, comma-separated (NAME a declared output)".into(),
                );
            }
        }
    }
    Ok(())
}

/// A duration such as `250ms` or `7days`.
/// A BOOL setting's value: `true`, `yes`, `1` or `false`, `no`, `0`.
fn boolean(text: &str) -> Result<bool, String> {
    match text {
        "true" | "yes" | "1" => Ok(true),
        "false" | "no" | "0" => Ok(false),
        _ => Err("true or false".into()),
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|_| "a duration such as 250ms, 5s, 2min, 7days".into())
}

/// A duration as [`duration`] reads it back: `100ms`, `7days`.
fn duration_text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A size in bytes: a whole number, alone or followed by `KiB`, `MiB` or `GiB`.
fn byte_size(text: &str) -> Result<usize, String> {
    let problem = || String::from("a size such as 16MiB, 512KiB, 1GiB or 1048576 (bytes)");
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number.parse().map_err(|_| problem())?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return Err(problem()),
    };
    number.checked_mul(1 << shift).ok_or_else(problem)
}

/// A size as [`byte_size`] reads it back, in the largest unit that divides it.
fn byte_size_text(bytes: usize) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A whole number, not negative.
fn whole_number(text: &str) -> Result<u64, String> {
    text.parse().map_err(|_| "a whole number".into())
}

/// An optional value as its setting writes it: `none` when there is none.
fn none_or(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "none".into(), |value| value.to_string())
}

/// What a parser that returns [`Error::Config`] accepts.
fn accepted(error: Error) -> String {
    match error {
        Error::Config { accepted, .. } => accepted,
        other => other.to_string(),
    }
}
