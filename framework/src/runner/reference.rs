//! The guide's reference pages (`docs/src/reference/*.md`), rendered from the tables the
//! code itself uses, and the tests that keep the pages and the code the same.
//!
//! ```text
//!  settings::SETTINGS ──────────────┐
//!  endpoint::METRICS ───────────────┤
//!  EXIT_CODES ──────────────────────┼─► render_*() ─► == docs/src/reference/*.md ?
//!  dead_letters::{HEADERS, RECORD,  │                   no: the test fails
//!    FailureClass}, ErrorClass ─────┘                   (ONCEFLOW_BLESS=1 rewrites)
//! ```
//!
//! - A page is never edited by hand: change the table in the code, then run
//!   `ONCEFLOW_BLESS=1 cargo test -p onceflow --lib reference` to write it.
//! - The tables are checked against the source too: every `onceflow_*` metric name and
//!   every `onceflow-*` dead-letter header the crate writes is listed, and every variant
//!   of the error-class enums.

use std::fmt::Write;
use std::path::Path;

use super::endpoint::{Kind, METRICS};
use super::settings;
use super::{EXIT_CODES, EXIT_FAILED, EXIT_FENCED, EXIT_INTERRUPTED, EXIT_USAGE};
use crate::engine::batch::dead_letters::{FailureClass, HEADERS, RECORD};
use crate::error::ErrorClass;
use crate::{Error, KafkaCode};

/// The command that writes the pages.
const BLESS: &str = "ONCEFLOW_BLESS=1 cargo test -p onceflow --lib reference";

/// The first line of every page.
fn generated() -> String {
    format!(
        "<!-- Generated from the code by the test `runner::reference` \
         (framework/src/runner/reference.rs): do not edit; change the code, then run \
         `{BLESS}`. -->\n"
    )
}

/// Text as a Markdown table cell: `|` escaped, and `<` too outside code spans (HTML
/// otherwise).
fn cell(text: &str) -> String {
    text.split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.replace('|', "\\|").replace('\n', " ");
            if i % 2 == 0 {
                part.replace('<', "&lt;")
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// One row of a Markdown table.
fn row(page: &mut String, cells: &[&str]) {
    let cells: Vec<String> = cells.iter().map(|c| cell(c)).collect();
    let _ = writeln!(page, "| {} |", cells.join(" | "));
}

/// The head of a Markdown table.
fn head(page: &mut String, titles: &[&str]) {
    let _ = writeln!(page, "| {} |", titles.join(" | "));
    let _ = writeln!(page, "|{}", " --- |".repeat(titles.len()));
}

/// A one-line help as a sentence.
fn sentence(text: &str) -> String {
    if text.ends_with(['.', '…']) {
        text.to_owned()
    } else {
        format!("{text}.")
    }
}

/// `docs/src/reference/settings.md`.
fn render_settings() -> String {
    let mut page = generated();
    page.push_str(
        "# Settings\n\n\
         Every setting of a binary made with `onceflow::run` is a flag, an `ONCEFLOW_*` \
         variable and a key of the TOML file given with `--config`, in that order of \
         precedence, then its default. Unknown keys in the file are errors, and all \
         problems are reported at once, before anything connects (exit code ",
    );
    let _ = write!(page, "{EXIT_USAGE}");
    page.push_str(
        "). `--help` lists every setting with its default and variable; `verify-config` \
         prints each value and where it came from.\n\n",
    );
    head(
        &mut page,
        &["setting", "flag", "variable", "default", "meaning"],
    );
    for s in settings::documented() {
        let meaning = if s.doc.is_empty() {
            sentence(s.help)
        } else {
            format!("{} {}", sentence(s.help), s.doc)
        };
        row(
            &mut page,
            &[&s.key, &s.flag, &s.variable, &s.default, &meaning],
        );
    }
    page
}

/// `docs/src/reference/metrics.md`.
fn render_metrics() -> String {
    let mut page = generated();
    page.push_str(
        "# Metrics\n\n\
         The runner serves `/metrics` (Prometheus text format) and `/healthz` on \
         `metrics_address`. Every metric has the labels `group` and `instance`; the table \
         gives the others. The engine's counters are copied from its statistics at each \
         scrape, the rest are recorded where they happen. A metric of the effect executor \
         (`onceflow::run_with_effects`), the outbox relay or the half-message checker \
         appears once that runs in the runner's process. `/healthz` answers 200 while the \
         engine processes, and 503 while it starts, replays its changelog or after it \
         stopped.\n\n",
    );
    head(&mut page, &["metric", "type", "labels", "what"]);
    for metric in METRICS {
        let labels: Vec<String> = metric.labels.iter().map(|l| format!("`{l}`")).collect();
        row(
            &mut page,
            &[
                &format!("`{}`", metric.name),
                metric.kind.as_str(),
                &labels.join(", "),
                &sentence(metric.help),
            ],
        );
    }
    page.push_str("\nHistogram buckets (upper bounds):\n\n");
    for metric in METRICS {
        if let Kind::Histogram(buckets) = metric.kind {
            let bounds: Vec<String> = buckets.iter().map(f64::to_string).collect();
            let _ = writeln!(page, "- `{}`: {}", metric.name, bounds.join(", "));
        }
    }
    page
}

/// `docs/src/reference/exit-codes.md`.
fn render_exit_codes() -> String {
    let mut page = generated();
    page.push_str(
        "# Exit codes\n\n\
         A binary made with `onceflow::run` or `onceflow::run_with_effects` exits with one \
         of these codes; `--help` lists them too.\n\n",
    );
    head(&mut page, &["code", "meaning"]);
    for exit in EXIT_CODES {
        row(&mut page, &[&format!("`{}`", exit.code), exit.meaning]);
    }
    page
}

/// `docs/src/reference/dead-letters.md`.
fn render_dead_letters() -> String {
    let mut page = generated();
    page.push_str(
        "# Dead-letter records\n\n\
         A record that cannot be processed is handled per `on_error`. With `dead-letter` \
         (the default) a copy of it goes to the dead-letter topic, with headers that say \
         why and where it came from. The classes are in [Error classes](error-classes.md); \
         `dlq replay` re-publishes dead letters after a fix.\n\n",
    );
    head(&mut page, &["part", "rule"]);
    for (part, rule) in RECORD {
        row(&mut page, &[part, rule]);
    }
    page.push_str(
        "\n## Headers\n\n\
         Values are UTF-8 text, numbers in decimal.\n\n",
    );
    head(&mut page, &["header", "on", "meaning"]);
    for header in HEADERS {
        row(
            &mut page,
            &[&format!("`{}`", header.name), header.on, header.meaning],
        );
    }
    page
}

/// `docs/src/reference/error-classes.md`.
fn render_error_classes() -> String {
    let mut page = generated();
    page.push_str(
        "# Error classes\n\n\
         ## Dead-letter error classes\n\n\
         Why a record could not be processed: the `onceflow-error-class` header of its dead \
         letter (see [Dead-letter records](dead-letters.md)), and the `class` of the warning \
         logged when it is skipped. `dlq replay --error-class` selects by it.\n\n",
    );
    head(&mut page, &["class", "meaning"]);
    for class in FailureClass::ALL {
        row(
            &mut page,
            &[&format!("`{}`", class.as_str()), class.meaning()],
        );
    }

    page.push_str(
        "\n## The processor's errors\n\n\
         What becomes of an error the processor returns for a record:\n\n",
    );
    head(&mut page, &["returned", "`is_retriable()`", "what happens"]);
    for (returned, error) in [
        ("`Error::transient(..)`", Error::transient("")),
        ("`Error::processing(..)`", Error::processing("")),
    ] {
        let happens = if error.is_retriable() {
            format!(
                "tried again with exponential backoff and jitter, within `max_attempts` and \
                 `max_retry_time`; then handled per `on_error`, class `{}`",
                FailureClass::TransientExhausted
            )
        } else {
            format!(
                "handled per `on_error` at once, class `{}`",
                FailureClass::Permanent
            )
        };
        row(&mut page, &[returned, yes(error.is_retriable()), &happens]);
    }

    page.push_str(
        "\n## Kafka error classes\n\n\
         An `Error::Kafka` carries an `ErrorClass`, from librdkafka's classification of the \
         failure; `Error`'s methods tell what to do with it.\n\n",
    );
    head(
        &mut page,
        &[
            "`ErrorClass`",
            "`is_retriable()`",
            "`requires_abort()`",
            "`is_fatal()`",
            "`is_rejection()`",
            "meaning",
        ],
    );
    for class in ErrorClass::ALL {
        let error = Error::Kafka {
            operation: "commit_transaction".into(),
            code: KafkaCode::UNKNOWN,
            message: String::new(),
            class,
            cause: None,
        };
        row(
            &mut page,
            &[
                &format!("`{class:?}`"),
                yes(error.is_retriable()),
                yes(error.requires_abort()),
                yes(error.is_fatal()),
                yes(error.is_rejection()),
                class.meaning(),
            ],
        );
    }
    page.push_str(
        "\nThe library's own error stays an error's cause (`std::error::Error::source`, an\n\
         `onceflow::Cause` to downcast): the Kafka client's for `Error::Kafka`, redb's or the\n\
         filesystem's for `Error::State`, serde's where onceflow decodes JSON itself, the\n\
         database's for `Error::Outbox`. Its type is not part of onceflow's API (it changes\n\
         when the library does), so decide on the class and the code, and log or inspect the\n\
         cause.\n",
    );
    page
}

fn yes(answer: bool) -> &'static str {
    if answer { "yes" } else { "no" }
}

/// Compares `rendered` with the page at `path`; writes it under `ONCEFLOW_BLESS=1`.
fn check(path: &str, rendered: &str) {
    let current = std::fs::read_to_string(path).unwrap_or_default();
    if current == rendered {
        return;
    }
    if std::env::var("ONCEFLOW_BLESS").as_deref() == Ok("1") {
        std::fs::write(path, rendered).unwrap_or_else(|e| panic!("writing {path}: {e}"));
        return;
    }
    let line = current
        .lines()
        .zip(rendered.lines())
        .position(|(page, code)| page != code)
        .unwrap_or_else(|| current.lines().count().min(rendered.lines().count()));
    panic!(
        "{} is not what the code renders (first difference at line {}):\n  page: {}\n  code: \
         {}\nThe page is generated: change the table in the code, then run `{BLESS}` to \
         rewrite the pages.",
        Path::new(path).display(),
        line + 1,
        current.lines().nth(line).unwrap_or("(end of page)"),
        rendered.lines().nth(line).unwrap_or("(end of page)"),
    );
}

/// Every `.rs` file under `framework/src`, with its path relative to it.
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, files: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, files);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                let name = path.strip_prefix(root).expect("under src");
                files.push((name.display().to_string(), text));
            }
        }
    }
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut files = Vec::new();
    walk(root, root, &mut files);
    files
}

/// The string literals in `text` that are `prefix` followed by `[a-z0-9_-]` characters.
fn literals<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let quoted = format!("\"{prefix}");
    text.match_indices(&quoted)
        .filter_map(|(at, _)| {
            let rest = &text[at + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c)))
                .unwrap_or(rest.len());
            (end > prefix.len() && rest[end..].starts_with('"')).then(|| &rest[..end])
        })
        .collect()
}

/// The variants of `enum <name>` in `source`, as its body lists them.
fn variants(source: &str, name: &str) -> Vec<String> {
    let start = source
        .find(&format!("enum {name} {{"))
        .unwrap_or_else(|| panic!("no enum {name}"));
    source[start..]
        .lines()
        .skip(1)
        .take_while(|line| line.trim() != "}")
        .map(str::trim)
        .filter(|line| line.starts_with(char::is_uppercase))
        .map(|line| line.trim_end_matches(',').to_owned())
        .collect()
}

#[test]
fn the_settings_page_is_rendered_from_the_settings_table() {
    check(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/reference/settings.md"
        ),
        &render_settings(),
    );
}

#[test]
fn the_metrics_page_is_rendered_from_the_metric_list() {
    check(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/reference/metrics.md"
        ),
        &render_metrics(),
    );
}

#[test]
fn the_exit_codes_page_is_rendered_from_the_exit_codes() {
    check(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/reference/exit-codes.md"
        ),
        &render_exit_codes(),
    );
}

#[test]
fn the_dead_letters_page_is_rendered_from_the_dead_letter_contract() {
    check(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/reference/dead-letters.md"
        ),
        &render_dead_letters(),
    );
}

#[test]
fn the_error_classes_page_is_rendered_from_the_error_classes() {
    check(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/reference/error-classes.md"
        ),
        &render_error_classes(),
    );
}

#[test]
fn every_metric_the_crate_records_is_listed_and_every_listed_one_is_recorded() {
    let files = sources();
    let mut unlisted = Vec::new();
    for (file, text) in &files {
        for name in literals(text, "onceflow_") {
            if !METRICS.iter().any(|m| m.name == name) {
                unlisted.push(format!("{name} ({file})"));
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "metrics missing from endpoint::METRICS: {unlisted:?}"
    );
    for metric in METRICS {
        let quoted = format!("\"{}\"", metric.name);
        let uses: usize = files.iter().map(|(_, t)| t.matches(&quoted).count()).sum();
        assert!(
            uses >= 2,
            "{} is listed in endpoint::METRICS but nothing records it",
            metric.name
        );
    }
    let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), METRICS.len(), "a metric is listed twice");
}

#[test]
fn every_dead_letter_header_written_or_read_is_documented() {
    let files = sources();
    let dead_letter_code = [
        "engine/batch/dead_letters.rs",
        "engine/batch/on_error.rs",
        "engine/batch/timers.rs",
        "kafka/dlq.rs",
        "dlq.rs",
    ];
    // A file moved or renamed must not drop out of the check unnoticed.
    for listed in dead_letter_code {
        assert!(
            files.iter().any(|(file, _)| file == listed),
            "{listed} is gone: list where its dead-letter code went"
        );
    }
    let mut undocumented = Vec::new();
    for (file, text) in &files {
        if !dead_letter_code.contains(&file.as_str()) {
            continue;
        }
        for name in literals(text, "onceflow-") {
            if !HEADERS.iter().any(|h| h.name == name) {
                undocumented.push(format!("{name} ({file})"));
            }
        }
    }
    for name in crate::wire::DEAD_LETTER_HEADERS {
        if !HEADERS.iter().any(|h| h.name == *name) {
            undocumented.push(format!("{name} (wire.rs)"));
        }
    }
    assert!(
        undocumented.is_empty(),
        "dead-letter headers missing from dead_letters::HEADERS: {undocumented:?}"
    );
    let unknown: Vec<&str> = HEADERS
        .iter()
        .map(|h| h.name)
        .filter(|name| !crate::wire::DEAD_LETTER_HEADERS.contains(name))
        .collect();
    assert!(
        unknown.is_empty(),
        "documented dead-letter headers that `dlq replay` would keep: {unknown:?}"
    );
}

#[test]
fn every_error_class_is_documented() {
    let files = sources();
    let source = |name: &str| {
        &files
            .iter()
            .find(|(file, _)| file == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
    };
    let listed: Vec<String> = FailureClass::ALL.iter().map(|c| format!("{c:?}")).collect();
    assert_eq!(
        listed,
        variants(source("engine/batch/dead_letters.rs"), "FailureClass"),
        "FailureClass::ALL"
    );
    let listed: Vec<String> = ErrorClass::ALL.iter().map(|c| format!("{c:?}")).collect();
    assert_eq!(
        listed,
        variants(source("error.rs"), "ErrorClass"),
        "ErrorClass::ALL"
    );
}

#[test]
fn every_exit_code_is_documented_once() {
    let codes: Vec<u8> = EXIT_CODES.iter().map(|exit| exit.code).collect();
    for code in [0, EXIT_FAILED, EXIT_USAGE, EXIT_FENCED, EXIT_INTERRUPTED] {
        assert_eq!(
            codes.iter().filter(|c| **c == code).count(),
            1,
            "exit code {code} in EXIT_CODES"
        );
    }
    assert_eq!(codes.len(), 5, "{codes:?}");
}

#[test]
fn pages_have_no_rust_blocks_and_escape_table_cells() {
    assert_eq!(cell("a|b `x|<y>` <z>"), "a\\|b `x\\|<y>` &lt;z>");
    for page in [
        render_settings(),
        render_metrics(),
        render_exit_codes(),
        render_dead_letters(),
        render_error_classes(),
    ] {
        assert!(!page.contains("```"), "{page}");
        assert!(page.starts_with("<!-- Generated from the code"), "{page}");
    }
}
