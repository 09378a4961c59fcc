//! The ops subcommands: `verify-config`, `inspect` and `dlq replay`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::ArgMatches;

use super::settings::Settings;
use crate::Result;
use crate::config::EngineConfig;
use crate::dlq::DeadLetterReplay;
use crate::txlog::TxLog;

/// Prints every setting, its value and where it came from. The settings were checked
/// before this runs, so reaching it means they are valid.
pub(super) fn verify_config(settings: &Settings) -> Result<()> {
    let width = settings
        .resolved
        .iter()
        .map(|(key, _, _)| key.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (key, value, source) in &settings.resolved {
        out.push_str(&format!("{key:width$} = {value:?}  # {source}\n"));
    }
    out.push_str(&topic_mapping(settings));
    out.push_str(&format!(
        "configuration OK: transactional ID `{}`, state in {}\n",
        settings.engine.transactional_id(),
        settings.engine.instance_dir().display()
    ));
    print(&out);
    Ok(())
}

/// The processor's declared topics and the topics they are read from and written to
/// here, one line each (a rename marked), plus outputs the configuration adds.
pub(super) fn topic_mapping(settings: &Settings) -> String {
    let engine = &settings.engine;
    let declared = &settings.declared;
    let mut out = String::from("topics:\n");
    match &declared.input {
        Some(name) if *name != engine.input_topic => out.push_str(&format!(
            "  input  {name} -> {}  (renamed)\n",
            engine.input_topic
        )),
        Some(name) => out.push_str(&format!("  input  {name}\n")),
        None => out.push_str(&format!(
            "  input  {}  (not declared)\n",
            engine.input_topic
        )),
    }
    for name in &declared.outputs {
        match engine.renamed_outputs.get(name) {
            Some(topic) => out.push_str(&format!("  output {name} -> {topic}  (renamed)\n")),
            None => out.push_str(&format!("  output {name}\n")),
        }
    }
    for topic in &engine.output_topics {
        if !declared.outputs.contains(topic) && !engine.renamed_outputs.values().any(|t| t == topic)
        {
            out.push_str(&format!("  output {topic}  (not declared)\n"));
        }
    }
    out
}

/// Prints what the instance's transaction log holds per partition, read-only. Refused
/// while the instance runs (the file is locked), so it never reads a half-applied batch.
pub(super) async fn inspect(config: &EngineConfig) -> Result<()> {
    let dir = config.instance_dir();
    let (partitions, bytes, path) =
        crate::blocking::blocking("inspect the transaction log", move || {
            let txlog = TxLog::open_read_only(&dir)?;
            Ok((txlog.stats()?, txlog.file_size()?, txlog.path().to_owned()))
        })
        .await?;
    let mut out = format!(
        "transaction log {} ({bytes} bytes), group `{}`, instance `{}`\n",
        path.display(),
        config.group,
        config.instance_id
    );
    if partitions.is_empty() {
        out.push_str("no partitions: this instance has not processed or replayed anything yet\n");
    } else {
        out.push_str(&format!(
            "{:>9}  {:>12}  {:>12}  {:>18}  {}\n",
            "partition", "dedup", "state keys", "changelog offset", "oldest dedup entry"
        ));
    }
    for p in &partitions {
        let checkpoint = p
            .checkpoint
            .map_or_else(|| "never replayed".to_owned(), |c| c.to_string());
        let oldest = p.oldest_processed_at_ms.map_or_else(|| "-".to_owned(), age);
        out.push_str(&format!(
            "{:>9}  {:>12}  {:>12}  {:>18}  {}\n",
            p.partition, p.processed_entries, p.state_entries, checkpoint, oldest
        ));
    }
    print(&out);
    Ok(())
}

/// `dlq replay`: re-publishes dead letters with the filters given.
pub(super) async fn replay(config: &EngineConfig, args: &ArgMatches) -> Result<()> {
    let mut replay = DeadLetterReplay::new(config);
    if let Some(class) = args.get_one::<String>("error_class") {
        replay = replay.error_class(class);
    }
    let from = args.get_one::<i64>("from_offset").copied();
    let to = args.get_one::<i64>("to_offset").copied();
    if from.is_some() || to.is_some() {
        replay = replay.offsets(from.unwrap_or(0), to.unwrap_or(i64::MAX));
    }
    if let Some(topic) = args.get_one::<String>("to_topic") {
        replay = replay.to_topic(topic);
    }
    if let Some(group) = args.get_one::<String>("replay_group") {
        replay = replay.group(group);
    }
    tracing::info!(dead_letter_topic = %config.dead_letter_topic(), "replaying dead letters");
    let summary = replay.run().await?;
    print(&format!(
        "replayed {} dead-lettered record(s) from `{}`; {} passed over by the filters\n",
        summary.replayed,
        config.dead_letter_topic(),
        summary.passed_over
    ));
    Ok(())
}

/// "2025-01-01T00:00:00Z (3h 2m ago)"-style age of a timestamp in ms.
fn age(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let ago = SystemTime::now()
        .duration_since(at)
        .map(|d| Duration::from_secs(d.as_secs()))
        .unwrap_or_default();
    format!(
        "{} ({} ago)",
        humantime::format_rfc3339_seconds(at),
        humantime::format_duration(ago)
    )
}

/// Command output goes to stdout (logs go to stderr).
#[allow(clippy::print_stdout)]
fn print(text: &str) {
    print!("{text}");
}
