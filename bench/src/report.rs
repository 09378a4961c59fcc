//! The result file: `bench/results/<date>.md`, its tables and its charts.
//!
//! Every figure is the median of the repeats with their min and max; ratios are of
//! medians, against contender a (the no-framework limit) and d (Kafka Streams).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::driver::{RestoreResult, RunResult, RunSettings, System};

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

/// The median alone, to one decimal (`–` without values): for cells that hold several.
fn median_cell(values: &[f64]) -> String {
    if values.is_empty() {
        "–".into()
    } else {
        format!("{:.1}", spread(values)[1])
    }
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
    /// The restore measurement's partition, when it ran.
    pub restore: Option<RestoreConditions>,
    /// The Rust peers asked for, and why any of them did not run.
    pub peers: Vec<PeerNote>,
}

/// A Rust peer asked for: what it runs, and why it did not, if it did not.
#[derive(Debug, Clone)]
pub struct PeerNote {
    /// Its contender.
    pub system: System,
    /// The crate, its version and the API used.
    pub what: String,
    /// Why it has no figures: its build's or its run's error.
    pub problem: Option<String>,
    /// Set when its throughput run ran out of time: run once, measured on the outputs it
    /// made, no latency phase.
    pub unfinished: Option<crate::driver::Unfinished>,
}

/// What the restore measurement's partition held.
#[derive(Debug, Clone, Copy)]
pub struct RestoreConditions {
    /// Distinct event IDs (dedup entries).
    pub ids: u64,
    /// State keys.
    pub keys: u64,
}

/// Median of one figure of one system at one point of a sweep.
fn sweep_median(
    runs: &[Measured],
    section: &str,
    point: &str,
    system: System,
    pick: impl Fn(&RunResult) -> Option<f64>,
) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter(|r| r.section == section && r.point == point && r.settings.system == system)
        .filter_map(|r| pick(&r.result))
        .collect();
    (!values.is_empty()).then(|| spread(&values)[1])
}

/// The Markdown report.
pub fn markdown(
    date: &str,
    conditions: &Conditions,
    runs: &[Measured],
    restores: &[RestoreResult],
) -> String {
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

    peer_notes(&mut md, &conditions.peers, base.latency_rate);

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
        let unfinished = runs.iter().any(|r| r.result.unfinished.is_some());
        let _ = writeln!(
            md,
            "| {}{} | {} | {} | {} | {} | {} | {} |",
            system.label(),
            if unfinished { " (did not finish)" } else { "" },
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
        "Send → visible, and its two parts: send → handler (to the contender's handler, \
         the wait for a batch to start included) and handler → visible (the rest of the \
         batch, its commit, the reader). Each part is a percentile of its own, so the \
         parts do not add up to the total.\n"
    );
    let _ = writeln!(
        md,
        "| contender | p50 ms | p99 ms | p99.9 ms | p99 vs a | p99 vs d | send → handler p50 / p99 ms | handler → visible p50 / p99 ms |"
    );
    let _ = writeln!(
        md,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let p99 = |r: &RunResult| r.latency_ms.map(|l| l[1]);
    let a99 = median_of(&groups, System::Raw, p99);
    let d99 = median_of(&groups, System::Streams, p99);
    for system in System::ALL {
        let Some(runs) = groups.get(&(String::new(), system)) else {
            continue;
        };
        if values(runs, p99).is_empty() {
            continue;
        }
        let cells: Vec<String> = (0..3)
            .map(|i| cell(&values(runs, |r| r.latency_ms.map(|l| l[i])), 1))
            .collect();
        let part = |which: usize| {
            let at =
                |i: usize| median_cell(&values(runs, |r| r.latency_parts_ms.map(|p| p[which][i])));
            format!("{} / {}", at(0), at(1))
        };
        let median = median_of(&groups, system, p99);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            system.label(),
            cells[0],
            cells[1],
            cells[2],
            ratio(median, a99),
            ratio(median, d99),
            part(0),
            part(1),
        );
    }
    let _ = writeln!(md);

    let _ = writeln!(md, "## Changelog written per input event\n");
    let _ = writeln!(
        md,
        "What each contender with a changelog (onceflow's `-txlog`, Kafka Streams' store \
         `-changelog`) had written by the end of the throughput phase, read back with \
         `read_committed`, per input event of that phase. Bytes are keys plus values, before \
         compression and without the record framing.\n"
    );
    let _ = writeln!(md, "| contender | records/event | bytes/event |");
    let _ = writeln!(md, "| --- | ---: | ---: |");
    for system in System::ALL {
        let Some(runs) = groups.get(&(String::new(), system)) else {
            continue;
        };
        let per_event = |pick: fn(&crate::driver::Volume) -> u64| -> Vec<f64> {
            runs.iter()
                .filter_map(|run| {
                    let events = (run.settings.events + run.settings.dedup_preload).max(1);
                    run.result
                        .changelog
                        .map(|v| pick(&v) as f64 / events as f64)
                })
                .collect()
        };
        let records = per_event(|v| v.records);
        if records.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            system.label(),
            cell(&records, 2),
            cell(&per_event(|v| v.bytes), 0),
        );
    }
    let _ = writeln!(md);

    if !restores.is_empty() {
        restore_table(&mut md, conditions, restores);
    }

    targets(&mut md, conditions, runs, restores);

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
        let with_latency = groups
            .values()
            .flatten()
            .any(|r| r.result.latency_ms.is_some());
        if with_latency {
            let _ = writeln!(
                md,
                "Throughput at full load, and latency at {} events/s (p50 / p99 / p99.9 ms, \
                 medians of the repeats).\n",
                base.latency_rate
            );
        } else {
            let _ = writeln!(md, "Throughput only (events/s), no latency phase.\n");
        }
        let latency_header = if with_latency { " latency ms |" } else { "" };
        let latency_rule = if with_latency { " ---: |" } else { "" };
        let _ = writeln!(
            md,
            "| {section} | contender | events | events/s | CPU µs/event | peak RSS MiB |{latency_header}"
        );
        let _ = writeln!(
            md,
            "| --- | --- | ---: | ---: | ---: | ---: |{latency_rule}"
        );
        let mut keys: Vec<&(String, System)> = groups.keys().collect();
        keys.sort_by_key(|(point, system)| (point_order(point), point.clone(), *system));
        for key in keys {
            let runs = &groups[key];
            let latency = if with_latency {
                let at = |i: usize| median_cell(&values(runs, |r| r.latency_ms.map(|l| l[i])));
                format!(" {} / {} / {} |", at(0), at(1), at(2))
            } else {
                String::new()
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |{latency}",
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

/// The restore table: one row per repeat, then the median.
fn restore_table(md: &mut String, conditions: &Conditions, restores: &[RestoreResult]) {
    let (ids, keys) = conditions.restore.map_or((0, 0), |r| (r.ids, r.keys));
    let _ = writeln!(md, "## Restore (onceflow exactly-once)\n");
    let _ = writeln!(
        md,
        "One input partition of {ids} distinct event IDs over {keys} keys, processed exactly \
         once; the instance killed (SIGKILL); then started again, once on an empty state \
         directory (a lost disk or a new machine: the whole changelog partition is replayed \
         into redb) and once on the killed instance's own (a crash: only what follows its \
         last synced checkpoint is replayed). Ready: from the process's start to its \
         partition handed to the processor, so start-up and the group join are included. \
         Replay: the replay alone, as the engine logged it. Entries/s: the changelog's \
         records over the replay. First output: start to the output of an event sent at \
         the start.\n"
    );
    let _ = writeln!(
        md,
        "| changelog records | changelog MiB | cold: ready s | cold: replay s | cold: entries/s | cold: first output s | warm: ready s |"
    );
    let _ = writeln!(md, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let column =
        |pick: fn(&RestoreResult) -> f64| -> Vec<f64> { restores.iter().map(pick).collect() };
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} | {} | {} | {} |\n",
        cell(&column(|r| r.changelog.records as f64), 0),
        cell(&column(|r| r.changelog.bytes as f64 / 1048576.0), 1),
        cell(&column(|r| r.cold_ready.as_secs_f64()), 2),
        cell(
            &column(|r| r.cold_replay.unwrap_or(r.cold_ready).as_secs_f64()),
            2
        ),
        cell(&column(restore_rate), 0),
        cell(&column(|r| r.cold_first_output.as_secs_f64()), 2),
        cell(&column(|r| r.warm_ready.as_secs_f64()), 2),
    );
}

/// Changelog records restored per second of the cold start's replay (of the whole
/// start when the replay's own time was not logged).
fn restore_rate(result: &RestoreResult) -> f64 {
    let seconds = result
        .cold_replay
        .unwrap_or(result.cold_ready)
        .as_secs_f64();
    result.changelog.records as f64 / seconds.max(1e-9)
}

/// The targets of the performance issue, each met or not by this run's medians.
fn targets(
    md: &mut String,
    conditions: &Conditions,
    runs: &[Measured],
    restores: &[RestoreResult],
) {
    let base = &conditions.base;
    let groups = group(runs, "main");
    let throughput = |r: &RunResult| Some(r.throughput);
    let p99 = |r: &RunResult| r.latency_ms.map(|l| l[1]);
    let cpu = |r: &RunResult| Some(r.cpu_us_per_event);
    let of =
        |system: System, pick: &dyn Fn(&RunResult) -> Option<f64>| median_of(&groups, system, pick);
    let a = of(System::Raw, &throughput);
    let b = of(System::RawTransactional, &throughput);
    let d = of(System::Streams, &throughput);
    let eo = of(System::ExactlyOnce, &throughput);
    let alo = of(System::AtLeastOnce, &throughput);
    let eo99 = of(System::ExactlyOnce, &p99);
    let d99 = of(System::Streams, &p99);
    let interval_ms = base.commit_interval.as_secs_f64() * 1000.0;

    let _ = writeln!(md, "## Targets (issue 15)\n");
    let _ = writeln!(
        md,
        "From this run's medians; \"not measured\" where a contender or sweep it needs did \
         not run.\n"
    );
    let _ = writeln!(md, "| target | measured | met |");
    let _ = writeln!(md, "| --- | --- | --- |");
    let mut target = |name: String, measured: Option<(String, bool)>| {
        let (measured, met) = match measured {
            Some((text, true)) => (text, "yes"),
            Some((text, false)) => (text, "no"),
            None => ("–".to_owned(), "not measured"),
        };
        let _ = writeln!(md, "| {name} | {measured} | {met} |");
    };
    let times = |n: Option<f64>, d: Option<f64>, at_least: f64| {
        n.zip(d).filter(|(_, d)| *d > 0.0).map(|(n, d)| {
            let r = n / d;
            (format!("{r:.2}×"), r >= at_least)
        })
    };
    target(
        "exactly-once throughput ≥ 2.5× Kafka Streams exactly_once_v2 (d)".into(),
        times(eo, d, 2.5),
    );
    target(
        "exactly-once throughput ≥ 1.2× the rdkafka transactional loop (b)".into(),
        times(eo, b, 1.2),
    );
    target(
        "exactly-once ≥ 90% of onceflow at-least-once".into(),
        times(eo, alo, 0.9),
    );
    target(
        "onceflow at-least-once ≥ 70% of contender a".into(),
        times(alo, a, 0.7),
    );
    target(
        format!(
            "exactly-once p99 at {} events/s ≤ commit interval + 25 ms ({:.0} ms)",
            base.latency_rate,
            interval_ms + 25.0
        ),
        eo99.map(|p| (format!("{p:.1} ms"), p <= interval_ms + 25.0)),
    );
    target(
        "exactly-once p99 below Kafka Streams' p99".into(),
        eo99.zip(d99)
            .map(|(e, d)| (format!("{e:.1} ms vs {d:.1} ms"), e < d)),
    );
    let eo_cpu = of(System::ExactlyOnce, &cpu);
    let b_cpu = of(System::RawTransactional, &cpu);
    target(
        "exactly-once CPU per event ≤ 1.5× contender b's".into(),
        eo_cpu
            .zip(b_cpu)
            .filter(|(_, b)| *b > 0.0)
            .map(|(e, b)| (format!("{e:.1} vs {b:.1} µs ({:.2}×)", e / b), e / b <= 1.5)),
    );
    let eo_rss = of(System::ExactlyOnce, &|r: &RunResult| {
        Some(r.usage.peak_rss_mib)
    });
    target(
        format!(
            "exactly-once peak RSS ≤ 64 MiB on the {} event load",
            base.events
        ),
        eo_rss.map(|r| (format!("{r:.1} MiB"), r <= 64.0)),
    );
    let at = |section: &str, point: &str| {
        sweep_median(runs, section, point, System::ExactlyOnce, throughput)
    };
    target(
        "exactly-once at 64 partitions within 20% of 8 partitions".into(),
        times(at("partitions", "64"), at("partitions", "8"), 0.8),
    );
    target(
        "3 exactly-once instances ≥ 2.5× one instance".into(),
        times(at("instances", "3"), at("instances", "1"), 2.5),
    );
    let rates: Vec<f64> = restores.iter().map(restore_rate).collect();
    target(
        "changelog restore ≥ 500,000 entries/s (cold start, the replay)".into(),
        (!rates.is_empty()).then(|| {
            let median = spread(&rates)[1];
            (format!("{median:.0} entries/s"), median >= 500_000.0)
        }),
    );
    target(
        "onceflow leads the Rust peers (ruststream, crabka) on throughput, p99, CPU".into(),
        peers_led(&groups, &conditions.peers, conditions.base.latency_rate),
    );
    let _ = writeln!(md);
}

/// What each Rust peer asked for runs, or why it did not run.
fn peer_notes(md: &mut String, notes: &[PeerNote], latency_rate: u64) {
    if notes.is_empty() {
        return;
    }
    let _ = writeln!(md, "## Rust peers\n");
    for note in notes {
        let _ = writeln!(md, "- {}: {}.", note.system.label(), note.what);
        if let Some(problem) = &note.problem {
            let _ = writeln!(md, "  **Not run here**: {problem}");
        }
        if let Some(cut) = &note.unfinished {
            let _ = writeln!(
                md,
                "  **Did not finish**: {} of {} outputs within the run timeout ({} s), so it ran \
                 once and its throughput, CPU and RSS are of the outputs it made. No latency \
                 phase: that load would queue behind the rest of the throughput load, and \
                 {latency_rate} events/s offered is above the rate it sustained, so its latency \
                 there grows with the run.",
                cut.seen,
                cut.expected,
                cut.patience.as_secs()
            );
        }
    }
    let _ = writeln!(md);
}

/// Whether onceflow exactly-once beats every Rust peer that ran on throughput, p99 and CPU
/// per event; None when no peer ran (or onceflow exactly-once did not), or without a latency
/// phase. The peers that did not run are named.
fn peers_led(
    groups: &Grouped<'_>,
    notes: &[PeerNote],
    latency_rate: u64,
) -> Option<(String, bool)> {
    let throughput = |r: &RunResult| Some(r.throughput);
    let p99 = |r: &RunResult| r.latency_ms.map(|l| l[1]);
    let cpu = |r: &RunResult| Some(r.cpu_us_per_event);
    let eo = [
        median_of(groups, System::ExactlyOnce, throughput)?,
        median_of(groups, System::ExactlyOnce, p99)?,
        median_of(groups, System::ExactlyOnce, cpu)?,
    ];
    let mut parts = Vec::new();
    let mut met = true;
    let mut any = false;
    for note in notes {
        let id = note.system.id();
        let figures = [
            median_of(groups, note.system, throughput),
            median_of(groups, note.system, p99),
            median_of(groups, note.system, cpu),
        ];
        // A peer slower than the offered rate has no bounded p99 to compare: its
        // latency there grows with the run (the note says so).
        let unbounded = |tp: f64| note.unfinished.is_some() && tp < latency_rate as f64;
        // (events/s, p99 as the row says it, whether onceflow's p99 is lower, CPU µs/event)
        let (tp, p99, led_p99, cpu) = match figures {
            [Some(tp), Some(p99), Some(cpu)] => (tp, format!("{p99:.1} ms"), eo[1] < p99, cpu),
            [Some(tp), None, Some(cpu)] if unbounded(tp) => (
                tp,
                format!("unbounded (it sustained {tp:.0} events/s, {latency_rate} offered)"),
                true,
                cpu,
            ),
            _ => {
                parts.push(format!("{id} not run"));
                continue;
            }
        };
        let finished = note.unfinished.is_none();
        any = true;
        met &= eo[0] > tp && led_p99 && eo[2] < cpu;
        parts.push(format!(
            "vs {id}{}: {:.2}× events/s, p99 {:.1} ms vs {p99}, CPU {:.1} vs {cpu:.1} µs/event",
            if finished { "" } else { " (did not finish)" },
            eo[0] / tp.max(1e-9),
            eo[1],
            eo[2]
        ));
    }
    any.then(|| (parts.join("; "), met))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Unfinished;

    fn run(system: System, throughput: f64, p99: Option<f64>, cpu: f64) -> Measured {
        Measured {
            section: "main".into(),
            point: String::new(),
            settings: RunSettings {
                system,
                events: 200_000,
                size: 200,
                keys: 1000,
                duplicates: 0.0,
                partitions: 8,
                commit_interval: Duration::from_millis(100),
                max_batch: 10_000,
                instances: 1,
                latency_rate: 2000,
                latency_events: 10_000,
                dedup_preload: 0,
            },
            result: RunResult {
                throughput,
                latency_ms: p99.map(|p99| [p99 / 2.0, p99, p99]),
                cpu_us_per_event: cpu,
                ..RunResult::default()
            },
        }
    }

    fn ruststream(unfinished: Option<Unfinished>) -> PeerNote {
        PeerNote {
            system: System::RustStream,
            what: "ruststream-rdkafka".into(),
            problem: None,
            unfinished,
        }
    }

    fn cut() -> Unfinished {
        Unfinished {
            seen: 46_410,
            expected: 200_000,
            patience: Duration::from_secs(300),
        }
    }

    #[test]
    fn a_peer_that_finished_is_compared_on_all_three() {
        let runs = [
            run(System::ExactlyOnce, 50_000.0, Some(200.0), 12.0),
            run(System::RustStream, 40_000.0, Some(150.0), 20.0),
        ];
        let groups = group(&runs, "main");
        let (text, met) = peers_led(&groups, &[ruststream(None)], 2000).expect("compared");
        assert!(!met, "its p99 is lower: {text}");
        assert!(text.contains("vs ruststream-eo: 1.25× events/s"), "{text}");
    }

    #[test]
    fn a_peer_below_the_offered_rate_that_did_not_finish_has_no_bounded_p99() {
        let runs = [
            run(System::ExactlyOnce, 50_000.0, Some(200.0), 12.0),
            run(System::RustStream, 155.0, None, 40.0),
        ];
        let groups = group(&runs, "main");
        let (text, met) = peers_led(&groups, &[ruststream(Some(cut()))], 2000).expect("compared");
        assert!(met, "{text}");
        assert!(text.contains("(did not finish)"), "{text}");
        assert!(
            text.contains("unbounded (it sustained 155 events/s"),
            "{text}"
        );
        let mut md = String::new();
        peer_notes(&mut md, &[ruststream(Some(cut()))], 2000);
        assert!(
            md.contains("**Did not finish**: 46410 of 200000 outputs"),
            "{md}"
        );
    }

    #[test]
    fn without_a_p99_a_peer_that_finished_or_kept_up_is_not_compared() {
        let runs = [
            run(System::ExactlyOnce, 50_000.0, Some(200.0), 12.0),
            run(System::RustStream, 3_000.0, None, 40.0),
        ];
        let groups = group(&runs, "main");
        assert_eq!(peers_led(&groups, &[ruststream(None)], 2000), None);
        assert_eq!(peers_led(&groups, &[ruststream(Some(cut()))], 2000), None);
    }
}
