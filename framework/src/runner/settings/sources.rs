//! Where settings are read from: the command line and `ONCEFLOW_*` variables (through
//! clap), the TOML file, and for Kafka properties also `ONCEFLOW_KAFKA_*` variables and
//! secret files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::ArgMatches;
use clap::parser::ValueSource;

use super::table::{SETTINGS, Setting};
use super::values::{Source, env_name};
use crate::Error;
use crate::redact;

/// The configuration file, read and checked for unknown keys.
pub(super) struct File {
    /// Where it is.
    pub(super) path: PathBuf,
    /// Its contents.
    pub(super) table: toml::Table,
}

/// The file as a table; unknown keys are errors, each named with the known ones.
pub(super) fn read_file(path: &Path) -> Result<File, Error> {
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
        .filter(|key| {
            !["kafka", "app"].contains(&key.as_str())
                && !SETTINGS.iter().any(|s| s.key == key.as_str())
        })
        .collect();
    if let Some(key) = unknown.first() {
        let known: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
        return Err(Error::Config {
            key: (*key).clone(),
            value: format!("(in {})", path.display()),
            accepted: format!(
                "one of the known keys: {}, or a [kafka] or [app] table",
                known.join(", ")
            ),
        });
    }
    Ok(File {
        path: path.to_owned(),
        table,
    })
}

/// The value `setting` is given on the command line, in its variable or in the file (in
/// that order), and where it came from; `None` when none of them sets it. A file value
/// that is not a scalar is a problem.
pub(super) fn given(
    setting: &Setting,
    matches: &ArgMatches,
    file: Option<&File>,
    problems: &mut Vec<Error>,
) -> Option<(String, Source)> {
    let key = setting.key;
    let from_args = match matches.value_source(key) {
        Some(ValueSource::CommandLine) => Some(Source::CommandLine),
        Some(ValueSource::EnvVariable) => Some(Source::Environment(env_name(key))),
        _ => None,
    };
    if let Some(source) = from_args {
        return matches
            .get_one::<String>(key)
            .map(|value| (value.clone(), source));
    }
    let file = file?;
    let value = file.table.get(key)?;
    match scalar(value) {
        Some(text) => Some((text, Source::File(file.path.clone()))),
        None => {
            problems.push(Error::Config {
                key: key.into(),
                value: value.to_string(),
                accepted: format!(
                    "a string, number or boolean in {} ({})",
                    file.path.display(),
                    setting.help_text()
                ),
            });
            None
        }
    }
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
pub(super) fn kafka_properties(
    matches: &ArgMatches,
    env: &BTreeMap<String, String>,
    file: Option<&File>,
    problems: &mut Vec<Error>,
) -> Vec<(String, String, Source)> {
    let mut properties: BTreeMap<String, (String, Source)> = BTreeMap::new();
    if let Some(file) = file
        && let Some(kafka) = file.table.get("kafka")
    {
        match kafka.as_table() {
            Some(kafka) => {
                for (key, value) in kafka {
                    match scalar(value) {
                        Some(text) => {
                            properties.insert(key.clone(), (text, Source::File(file.path.clone())));
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

/// The application's own settings (`onceflow::run_with_settings`): the file's `[app]`
/// table, then `ONCEFLOW_APP_<KEY>` variables (`ONCEFLOW_APP_DAILY_LIMIT` is
/// `daily_limit`), then `--app key=value` flags, each over the one before. A value from a
/// variable or a flag is read as a TOML value when it is one (`42`, `true`, `[1, 2]`,
/// `"text"`), else taken as the string it is. Returns the table and, per key, the value
/// as shown (secrets redacted) and where it came from.
pub(super) fn app_settings(
    matches: &ArgMatches,
    env: &BTreeMap<String, String>,
    file: Option<&File>,
    problems: &mut Vec<Error>,
) -> (toml::Table, Vec<(String, String, Source)>) {
    let mut table = toml::Table::new();
    let mut sources: BTreeMap<String, Source> = BTreeMap::new();
    if let Some(file) = file
        && let Some(app) = file.table.get("app")
    {
        match app.as_table() {
            Some(app) => {
                for (key, value) in app {
                    table.insert(key.clone(), value.clone());
                    sources.insert(key.clone(), Source::File(file.path.clone()));
                }
            }
            None => problems.push(Error::Config {
                key: "app".into(),
                value: app.to_string(),
                accepted: format!("a table ([app]) in {}", file.path.display()),
            }),
        }
    }
    for (name, value) in env {
        if let Some(key) = name.strip_prefix("ONCEFLOW_APP_")
            && !key.is_empty()
        {
            let key = key.to_ascii_lowercase();
            table.insert(key.clone(), toml_value(value));
            sources.insert(key, Source::Environment(name.clone()));
        }
    }
    for given in matches.get_many::<String>("app").into_iter().flatten() {
        match given.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                let key = key.trim().to_owned();
                table.insert(key.clone(), toml_value(value));
                sources.insert(key, Source::CommandLine);
            }
            _ => problems.push(Error::Config {
                key: "app".into(),
                value: given.clone(),
                accepted: "KEY=VALUE".into(),
            }),
        }
    }
    let shown = sources
        .into_iter()
        .map(|(key, source)| {
            let value = table.get(&key).map(ToString::to_string).unwrap_or_default();
            let value = redact::shown(&key, &value).to_owned();
            (format!("app.{key}"), value, source)
        })
        .collect();
    (table, shown)
}

/// A flag's or a variable's text as a TOML value when it is one, else as a string.
fn toml_value(text: &str) -> toml::Value {
    format!("value = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut parsed| parsed.remove("value"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}
