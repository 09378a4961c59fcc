//! The result file: `bench/results/<date>.md`, its tables and its charts.
//!
//! Every figure is the median of the repeats with their min and max; ratios are of
//! medians, against contender a (the no-framework limit) and d (Kafka Streams).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::driver::{RunResult, RunSettings, System};

/// One measured run, with where it belongs in the report.
#[derive(Debug, Clone)]
pub struct Measured {
    /// `main` or a sweep's name.
    pub section: String,
    /// The sweep's value for this run (empty in `main`).
    pub point: String,
    /// What was run.
    pub settings: RunSettings,
    /// What it measured.
    pub result: RunResult,
}

/// min, median, max of `values` (empty: zeros).
pub fn spread(values: &[f64]) -> [f64; 3] {
    if values.is_empty() {
        return [0.0; 3];
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    [sorted[0], median, sorted[n - 1]]
}

fn cell(values: &[f64], decimals: usize) -> String {
    if values.is_empty() {
        return "–".into();
    }
    let [min, median, max] = spread(values);
    format!("{median:.decimals$} ({min:.decimals$}–{max:.decimals$})")
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> String {
    match (numerator, denominator) {
        (Some(n), Some(d)) if d > 0.0 => format!("{:.2}×", n / d),
        _ => "–".into(),
    }
}

/// The runs of one section, by point and system.
pub type Grouped<'a> = BTreeMap<(String, System), Vec<&'a Measured>>;

/// Groups the runs of `section`.
pub fn group<'a>(runs: &'a [Measured], section: &str) -> Grouped<'a> {
    let mut groups: Grouped<'a> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.section == section) {
        groups
            .entry((run.point.clone(), run.settings.system))
            .or_default()
            .push(run);
    }
    groups
}

fn values(runs: &[&Measured], pick: impl Fn(&RunResult) -> Option<f64>) -> Vec<f64> {
    runs.iter().filter_map(|r| pick(&r.result)).collect()
}

/// Median of one figure of one system in the main section.
pub fn median_of(
    groups: &Grouped<'_>,
    system: System,
    pick: impl Fn(&RunResult) -> Option<f64>,
) -> Option<f64> {
    let runs = groups.get(&(String::new(), system))?;
    let values = values(runs, pick);
    (!values.is_empty()).then(|| spread(&values)[1])
}

/// What the report says about the conditions of the runs.
#[derive(Debug, Clone)]
pub struct Conditions {
    /// The settings of the main runs.
    pub base: RunSettings,
    /// Repeats of the main runs.
    pub repeats: usize,
    /// Repeats of each sweep point.
    pub sweep_repeats: usize,
    /// The command that produced the report.
    pub command: String,
    /// Wall time of the whole report.
    pub elapsed: Duration,
    /// The broker's bootstrap address and version.
    pub broker: String,
    /// Charts written next to the file, by title.
    pub charts: Vec<(String, String)>,
    /// librdkafka properties given to the onceflow contenders.
    pub onceflow_kafka: Vec<String>,
}

/// The Markdown report.
pub fn markdown(date: &str, conditions: &Conditions, runs: &[Measured]) -> String {
    let base = &conditions.base;
    let mut md = String::new();
    let _ = writeln!(md, "# onceflow benchmark, {date}\n");
    let _ = writeln!(
        md,
        "Produced by `{}` in {:.0} s on {}.\n",
        conditions.command,
        conditions.elapsed.as_secs_f64(),
        machine()
    );
    let _ = writeln!(
        md,
        "Broker: {}. Workload: {} events of ~{} B, {} keys, {} partitions, {:.0}% duplicate IDs; \
         commit interval {} ms, at most {} records per batch (onceflow and b), {} instance(s). \
         Latency at {} events/s offered, {} events. Main runs repeated {}×, interleaved; \
         sweep points {}×. Load generator's own rate while preloading: {:.0} events/s (median).\n",
        conditions.broker,
        base.events,
        base.size,
        base.keys,
        base.partitions,
        base.duplicates * 100.0,
        base.commit_interval.as_millis(),
        base.max_batch,
        base.instances,
        base.latency_rate,
        base.latency_events,
        conditions.repeats,
        conditions.sweep_repeats,
        spread(
            &runs
                .iter()
                .map(|r| r.result.generator_rate)
                .collect::<Vec<_>>()
        )[1],
    );
    if !conditions.onceflow_kafka.is_empty() {
        let _ = writeln!(
            md,
            "librdkafka properties given to the onceflow contenders: `{}`.\n",
            conditions.onceflow_kafka.join("`, `")
        );
    }
    let _ = writeln!(
        md,
        "Each cell: median (min–max) of the repeats. Throughput: input events per second, from \
         the first event processed to the last output visible to a `read_committed` reader. \
         Latency: producer send → visible under `read_committed`, at the fixed offered rate \
         (not at full load). CPU seconds and peak RSS: the contender's process(es) only, from its start to the end of \
         the throughput phase; CPU µs/event: CPU from the first output seen to the last, per \
         output in between (start-up excluded). Ratios are of medians.\n"
    );

    let groups = group(runs, "main");
    let throughput = |r: &RunResult| Some(r.throughput);
    let a = median_of(&groups, System::Raw, throughput);
    let d = median_of(&groups, System::Streams, throughput);

    let _ = writeln!(md, "## Throughput\n");
    let _ = writeln!(
        md,
        "| contender | events/s | vs a | vs d | CPU s | CPU µs/event | peak RSS MiB |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for system in System::ALL {
        let Some(runs) = groups.get(&(String::new(), system)) else {
            continue;
        };
        let tp = values(runs, throughput);
        let median = Some(spread(&tp)[1]);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            system.label(),
            cell(&tp, 0),
            ratio(median, a),
            ratio(median, d),
            cell(&values(runs, |r| Some(r.usage.cpu_seconds)), 2),
            cell(&values(runs, |r| Some(r.cpu_us_per_event)), 1),
            cell(&values(runs, |r| Some(r.usage.peak_rss_mib)), 1),
        );
    }
    let _ = writeln!(md);

    let _ = writeln!(md, "## Latency at {} events/s\n", base.latency_rate);
    let _ = writeln!(
        md,
        "| contender | p50 ms | p99 ms | p99.9 ms | p99 vs a | p99 vs d |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: |");
    let p99 = |r: &RunResult| r.latency_ms.map(|l| l[1]);
    let a99 = median_of(&groups, System::Raw, p99);
    let d99 = median_of(&groups, System::Streams, p99);
    for system in System::ALL {
        let Some(runs) = groups.get(&(String::new(), system)) else {
            continue;
        };
        let cells: Vec<String> = (0..3)
            .map(|i| cell(&values(runs, |r| r.latency_ms.map(|l| l[i])), 1))
            .collect();
        let median = median_of(&groups, system, p99);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            system.label(),
            cells[0],
            cells[1],
            cells[2],
            ratio(median, a99),
            ratio(median, d99)
        );
    }
    let _ = writeln!(md);

    let _ = writeln!(md, "## Targets (issue 6)\n");
    let _ = writeln!(md, "| target | measured | met |");
    let _ = writeln!(md, "| --- | --- | --- |");
    let eo = median_of(&groups, System::ExactlyOnce, throughput);
    let alo = median_of(&groups, System::AtLeastOnce, throughput);
    let eo99 = median_of(&groups, System::ExactlyOnce, p99);
    let eo_rss = median_of(&groups, System::ExactlyOnce, |r| Some(r.usage.peak_rss_mib));
    let mut target = |name: &str, measured: String, met: Option<bool>| {
        let met = match met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "not measured",
        };
        let _ = writeln!(md, "| {name} | {measured} | {met} |");
    };
    let share = |n: Option<f64>, d: Option<f64>| n.zip(d).map(|(n, d)| n / d.max(1e-9));
    let eo_alo = share(eo, alo);
    target(
        &format!(
            "exactly-once ≥ 90% of at-least-once throughput ({} ms commit interval)",
            base.commit_interval.as_millis()
        ),
        eo_alo.map_or("–".into(), |r| format!("{:.0}%", r * 100.0)),
        eo_alo.map(|r| r >= 0.9),
    );
    let eo_d = share(eo, d);
    target(
        "exactly-once ≥ 2× Kafka Streams exactly_once_v2 throughput",
        eo_d.map_or("–".into(), |r| format!("{r:.2}×")),
        eo_d.map(|r| r >= 2.0),
    );
    target(
        "exactly-once p99 latency lower than Kafka Streams'",
        eo99.zip(d99)
            .map_or("–".into(), |(e, d)| format!("{e:.1} ms vs {d:.1} ms")),
        eo99.zip(d99).map(|(e, d)| e < d),
    );
    let eo_a = share(eo, a);
    target(
        "exactly-once ≥ 70% of contender a",
        eo_a.map_or("–".into(), |r| format!("{:.0}%", r * 100.0)),
        eo_a.map(|r| r >= 0.7),
    );
    target(
        "exactly-once peak RSS under 64 MiB at full load",
        eo_rss.map_or("–".into(), |r| format!("{r:.1} MiB")),
        eo_rss.map(|r| r < 64.0),
    );
    let _ = writeln!(
        md,
        "\nThe per-event framework overhead target (micro, < 2 µs with 1 M IDs in the dedup \
         log) is measured by `cargo bench -p onceflow-bench`, not by this run.\n"
    );

    let sections: Vec<String> = {
        let mut names: Vec<String> = runs
            .iter()
            .map(|r| r.section.clone())
            .filter(|s| s != "main")
            .collect();
        names.dedup();
        names
    };
    for section in sections {
        let groups = group(runs, &section);
        let _ = writeln!(md, "## Sweep: {section}\n");
        let _ = writeln!(md, "Throughput only (events/s), no latency phase.\n");
        let _ = writeln!(
            md,
            "| {section} | contender | events | events/s | CPU µs/event | peak RSS MiB |"
        );
        let _ = writeln!(md, "| --- | --- | ---: | ---: | ---: | ---: |");
        let mut keys: Vec<&(String, System)> = groups.keys().collect();
        keys.sort_by_key(|(point, system)| (point_order(point), point.clone(), *system));
        for key in keys {
            let runs = &groups[key];
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                key.0,
                key.1.label(),
                runs[0].settings.events,
                cell(&values(runs, |r| Some(r.throughput)), 0),
                cell(&values(runs, |r| Some(r.cpu_us_per_event)), 1),
                cell(&values(runs, |r| Some(r.usage.peak_rss_mib)), 1),
            );
        }
        let _ = writeln!(md);
    }

    if !conditions.charts.is_empty() {
        let _ = writeln!(md, "## Charts\n");
        for (title, file) in &conditions.charts {
            let _ = writeln!(md, "![{title}]({file})\n");
        }
    }
    md
}

/// Sweep points sort by their number, then by their text.
pub fn point_order(point: &str) -> u64 {
    let digits: String = point.chars().take_while(char::is_ascii_digit).collect();
    let number: u64 = digits.parse().unwrap_or(0);
    let scale = match &point[digits.len()..] {
        "s" => 1000,
        _ => 1,
    };
    number * scale
}

/// Cores, memory and kernel of this machine.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores, {memory_gib:.0} GiB, Linux {} (broker, load generator, reader and \
         contender all on this machine)",
        kernel.trim()
    )
}

/// Today's date (UTC) as YYYY-MM-DD.
pub fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Writes `text` to `path`, creating its directory.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)
}
