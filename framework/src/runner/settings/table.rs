//! The settings table: one row per setting, with everything the runner knows of it.
//!
//! A row's default is rendered from the settings the runner starts from
//! ([`Settings::start`]), which for engine settings is `EngineConfig::new`'s own value, so
//! `--help`, `verify-config` and the engine cannot disagree on it. Its setter parses the
//! text a flag, variable or file gave and stores it; `resolve` calls the setters in table
//! order, so building the settings is one loop. Its `help` and `doc` are what `-h`,
//! `--help` and the reference page (`docs/src/reference/settings.md`, checked by the test
//! `runner::reference`) say of it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::values::{Declared, LogFormat, Role, Settings, Source};
use crate::Error;
use crate::config::GroupTopic;

/// One setting.
pub(super) struct Setting {
    /// Its name in the file; the flag and the variable are made from it.
    pub(super) key: &'static str,
    /// What `--help` calls its value.
    pub(super) value_name: &'static str,
    /// What it means, in one line: `-h` and the reference page.
    pub(super) help: &'static str,
    /// What else to know of it, in Markdown (code in backquotes): `--help` adds it to
    /// `help`, and so does the reference page (`docs/src/reference/settings.md`). Empty
    /// when `help` says it all.
    pub(super) doc: &'static str,
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

impl Fallback {
    /// The default as the reference page shows it, in Markdown: a value in backquotes, or
    /// where it comes from.
    #[cfg(test)]
    pub(super) fn documented(self, start: &Settings) -> String {
        match self {
            Fallback::Value(render) => format!("`{}`", render(start)),
            Fallback::Unset(text) => text.to_owned(),
            Fallback::Derived(derived) => match derived {
                Derived::ProcessorName => "the processor's name".into(),
                Derived::HostName => "the host name (characters a transactional ID does not \
                                      take become `-`)"
                    .into(),
                Derived::DeclaredInput => {
                    "the topic the processor declares; required without one".into()
                }
                Derived::DeclaredOutputs => "the topics the processor declares".into(),
                Derived::GroupTopic(topic) => format!("`{}`", topic.pattern()),
                Derived::EffectsTopic => format!(
                    "`{}` when the binary has an effect executor, else effects are off",
                    GroupTopic::Effects.pattern()
                ),
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
        doc: "",
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
        doc: "One group is one operator: the changelog, dead-letter and effects topics and \
              the transactional ID are named after it.",
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
        doc: "The transactional ID is `<group>-<instance_id>` and the consumer is a static \
              group member with this ID, so a restarted instance fences its previous \
              incarnation and takes its place at once. A host name such as a StatefulSet \
              pod's is stable, which is what it must be; run one instance per input partition \
              at most.",
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
        doc: "Declared names are defaults: `--input staging.orders` reads another topic. \
              `verify-config` shows each declared topic and where it goes.",
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
        doc: "`--outputs invoices=prod.invoices` (alias `--output`) sends the declared \
              output, and so `Self::INVOICES`, to another topic; a plain `TOPIC` entry adds \
              an output. `verify-config` shows each declared topic and where it goes; a \
              rename of an output the processor does not declare is refused at start. \
              Embedded: `EngineConfig::rename_output`.",
        default: Fallback::Derived(Derived::DeclaredOutputs),
        set: set_outputs,
    },
    Setting {
        key: "state_dir",
        value_name: "DIR",
        help: "Where the transaction log lives (<state_dir>/<group>/<instance_id>/)",
        doc: "The file is `<state_dir>/<group>/<instance_id>/txlog.redb`. Directories are \
              created 0700, and one owned by another user or writable by group or others is \
              refused at start (exit 1, naming the path, owner and mode).",
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
        doc: "",
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
        doc: "",
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
        doc: "`exactly-once`: one Kafka transaction per batch, outputs, changelog and offsets \
              commit together. `at-least-once`: no transaction, offsets are committed after \
              the outputs are acknowledged; a crash in between processes the batch again \
              (events with an ID are still skipped, events without one may be output twice). \
              `at-most-once`: offsets are committed before the batch is processed; a crash \
              loses the rest of that batch, nothing is output twice.",
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
        doc: "",
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
        doc: "`none`: no bound but `dedup_window`.",
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
        doc: "",
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
        doc: "Its class is `missing-event-id`; an ID is missing when there is none or it is \
              empty. Off, such a record is processed without dedup by ID. A header ID that is \
              not UTF-8 is an ID, kept byte for byte. `--require-event-id` alone means `true`.",
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
        doc: "A batch commits at half of it, and it bounds a hung commit too. The readers \
              stalled are the `read_committed` readers of the outputs of an instance that died \
              mid-batch. The default is Kafka Streams' under exactly-once. It sets the \
              producers' `transaction.timeout.ms`, which is refused as a Kafka property.",
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
        doc: "One fsync then makes the applied batches durable. Kafka is the source of truth: \
              after a crash the log opens at its last synced batch and the start-up replay of \
              the changelog restores the rest.",
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
        doc: "In `KiB`, `MiB`, `GiB` or bytes. redb's own default, 1 GiB, is never given back \
              once filled: a large dedup log held the process at hundreds of MB. Pages \
              outside the cache are read from the operating system's page cache.",
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
        doc: "An instance catches up at start, after a rebalance or after a failed batch. A \
              replay mostly waits on the broker: 8 caught up 64 empty partitions in 3.9 s \
              instead of 16.8 s, and each one at the same time adds two Kafka clients (4 to 8 \
              raised the benchmark's peak RSS by 12 to 18 MiB).",
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
        doc: "By default such a partition stops the instance (`Error::ChangelogBehind`): \
              going on would lose that partition's state and dedup entries. `true` goes on, \
              for one start after the offsets were moved on purpose.",
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
        doc: "A record that does not decode, a permanent error, a panic or retries that run \
              out: `dead-letter` writes it to `dead_letter_topic` with its error class, \
              `skip` counts and logs it, `stop` stops the instance without committing the \
              batch.",
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
        doc: "Created at start if missing. Each dead letter carries the record's own key, \
              value and headers and the `onceflow-*` headers of the dead-letter reference.",
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
        doc: "Created at start if missing; refused if its partition count differs from the \
              input's, or if its `cleanup.policy` is not `compact`.",
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
        doc: "A warning names a topic with fewer than 3 replicas or `min.insync.replicas` below 2.",
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
        doc: "Each can then be scaled on its own: the executor is its own consumer group, \
              `<group>-effects-executor`.",
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
        doc: "Only with an effect executor (`onceflow::run_with_effects`).",
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
        doc: "",
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
        doc: "",
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
        doc: "Attempts are made with exponential backoff and jitter, keeping nothing a failed \
              attempt did; past either bound the record is handled per `on_error` (class \
              `transient-exhausted`). No poll happens during a retry wait, so it must stay \
              under half of the consumer's `max.poll.interval.ms`, and `transaction_timeout / \
              2 + max_retry_time` under all of it (both checked at start).",
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
        doc: "A partition's event time is its highest record timestamp processed, so records \
              this late still come before its timers.",
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
        doc: "`off` to disable. Only the local host by default: another address \
              (`0.0.0.0:9464`) must be given, and is logged as a warning, since the endpoint \
              has no authentication.",
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
        doc: "`human`: one readable line per event; `json`: one JSON object per line. Logs go \
              to stderr.",
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
        doc: "`RUST_LOG`, when set, wins over it.",
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
