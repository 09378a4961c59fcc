//! The HTTP endpoint: Prometheus `/metrics` and the readiness check `/healthz`.
//!
//! Counters live in the engine's [`Stats`] (one source of truth, also returned by
//! `Engine::run`) and are copied into the Prometheus registry at each scrape; histograms
//! and gauges are recorded where they happen through the `metrics` facade, which costs
//! nothing when no recorder is installed (an engine embedded without the runner).
//!
//! [`METRICS`] lists every metric onceflow records, with its type, labels and help: the
//! endpoint describes them and sets histogram buckets from it, and the reference page
//! (`docs/src/reference/metrics.md`) is rendered from it (the test `runner::reference`
//! also checks that every `onceflow_*` name in the crate's source is listed).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use metrics::{KeyName, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::config::EngineConfig;
use crate::engine::{Phase, Stats};
use crate::{Error, Result};

/// Seconds: a commit is a round trip to the coordinator and the partition leaders.
const COMMIT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Records per batch, up to the largest sane `max_batch_records`.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1_000.0, 5_000.0, 10_000.0, 50_000.0,
];

/// Installs the Prometheus recorder and serves it on `address`; returns the address bound
/// (port 0 picks a free one).
pub(super) async fn serve(
    address: SocketAddr,
    stats: Arc<Stats>,
    config: &EngineConfig,
) -> Result<SocketAddr> {
    let problem = |e: metrics_exporter_prometheus::BuildError| Error::Config {
        key: "metrics_address".into(),
        value: address.to_string(),
        accepted: format!("a working metrics set-up ({e})"),
    };
    let mut builder = PrometheusBuilder::new()
        .add_global_label("group", &config.group)
        .add_global_label("instance", &config.instance_id);
    for metric in METRICS {
        if let Kind::Histogram(buckets) = metric.kind {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(metric.name.into()), buckets)
                .map_err(problem)?;
        }
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!(
            "a metrics recorder was already installed; /metrics shows only the counters"
        );
    }
    describe();

    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| Error::Config {
            key: "metrics_address".into(),
            value: address.to_string(),
            accepted: format!("an address this host can listen on ({e}); or off"),
        })?;
    let bound = listener.local_addr().unwrap_or(address);
    if !bound.ip().is_loopback() {
        // The default is 127.0.0.1; anything else was asked for, but say so: the endpoint
        // has no authentication.
        tracing::warn!(%bound, "/metrics and /healthz are reachable from other hosts (no authentication)");
    }
    let scrape_stats = Arc::clone(&stats);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let stats = Arc::clone(&scrape_stats);
                let handle = handle.clone();
                async move { render(&stats, &handle) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let stats = Arc::clone(&stats);
                async move { health(&stats) }
            }),
        );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the metrics endpoint stopped");
        }
    });
    Ok(bound)
}

/// The counters as of now, then the registry in Prometheus' text format.
fn render(stats: &Stats, handle: &PrometheusHandle) -> String {
    let s = stats.snapshot();
    for (name, value) in [
        ("onceflow_records_in_total", s.records_in),
        ("onceflow_outputs_total", s.outputs),
        ("onceflow_duplicates_skipped_total", s.duplicates_skipped),
        ("onceflow_dead_lettered_total", s.dead_lettered),
        ("onceflow_skipped_total", s.skipped),
        (
            "onceflow_records_without_event_id_total",
            s.without_event_id,
        ),
        ("onceflow_commits_total", s.commits),
        ("onceflow_aborts_total", s.aborts),
        ("onceflow_replayed_records_total", s.replayed_records),
        ("onceflow_expired_entries_total", s.expired_entries),
        ("onceflow_assignments_total", s.assignments),
        ("onceflow_timers_fired_total", s.timers_fired),
        (
            "onceflow_already_committed_records_total",
            s.already_committed,
        ),
        ("onceflow_producers_replaced_total", s.producers_replaced),
    ] {
        metrics::counter!(name).absolute(value);
    }
    metrics::gauge!("onceflow_ready").set(if stats.phase() == Phase::Running {
        1.0
    } else {
        0.0
    });
    handle.run_upkeep();
    handle.render()
}

/// 200 when the engine processes; 503 while it starts, replays or after it stopped.
fn health(stats: &Stats) -> (StatusCode, &'static str) {
    match stats.phase() {
        Phase::Running => (StatusCode::OK, "ready\n"),
        Phase::Replaying => (StatusCode::SERVICE_UNAVAILABLE, "replaying the changelog\n"),
        Phase::WaitingForTransaction => (
            StatusCode::SERVICE_UNAVAILABLE,
            "replaying the changelog: waiting for an open transaction on it to end\n",
        ),
        Phase::Starting => (StatusCode::SERVICE_UNAVAILABLE, "starting\n"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "stopped\n"),
    }
}

/// Help text for every metric, shown by Prometheus.
fn describe() {
    metrics::with_recorder(|recorder| {
        for metric in METRICS {
            let name = KeyName::from_const_str(metric.name);
            let help = SharedString::const_str(metric.help);
            match metric.kind {
                Kind::Counter => recorder.describe_counter(name, metric.unit, help),
                Kind::Gauge => recorder.describe_gauge(name, metric.unit, help),
                Kind::Histogram(_) | Kind::Summary => {
                    recorder.describe_histogram(name, metric.unit, help)
                }
            }
        }
    });
}

/// What Prometheus sees of a metric.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A histogram with these bucket bounds.
    Histogram(&'static [f64]),
    /// A histogram recorded without buckets: the exporter renders it as a summary
    /// (quantiles of this instance's recent values).
    Summary,
}

impl Kind {
    /// The Prometheus type.
    #[cfg(test)]
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram(_) => "histogram",
            Kind::Summary => "summary",
        }
    }
}

/// One metric onceflow records.
pub(super) struct MetricDoc {
    /// Its name, `onceflow_*`.
    pub(super) name: &'static str,
    /// Its type.
    pub(super) kind: Kind,
    /// Its unit, for the recorder.
    pub(super) unit: Option<Unit>,
    /// Its labels besides `group` and `instance`, which every metric has (for the page:
    /// the recording call gives them).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) labels: &'static [&'static str],
    /// What it counts or measures: Prometheus' `# HELP` and the reference page.
    pub(super) help: &'static str,
}

/// Every metric onceflow records, in the order the reference page lists them. A metric
/// of the effect executor, the outbox relay or the half-message checker is exported when
/// that runs in the runner's process.
pub(super) const METRICS: &[MetricDoc] = &[
    MetricDoc {
        name: "onceflow_ready",
        kind: Kind::Gauge,
        unit: None,
        labels: &[],
        help: "1 while the engine processes, 0 while it starts, replays its changelog or after \
               it stopped (as /healthz answers 200 or 503)",
    },
    MetricDoc {
        name: "onceflow_records_in_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Input records in committed batches",
    },
    MetricDoc {
        name: "onceflow_outputs_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Output records in committed batches",
    },
    MetricDoc {
        name: "onceflow_duplicates_skipped_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Inputs skipped because their event ID was already processed, in committed \
               batches",
    },
    MetricDoc {
        name: "onceflow_dead_lettered_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Inputs that failed and were written to the dead-letter topic \
               (on_error = dead-letter), in committed batches",
    },
    MetricDoc {
        name: "onceflow_skipped_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Inputs that failed and were skipped (on_error = skip), in committed batches",
    },
    MetricDoc {
        name: "onceflow_records_without_event_id_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Inputs processed without an event ID (none, or an empty one), so not \
               deduplicated by ID, in committed batches",
    },
    MetricDoc {
        name: "onceflow_commits_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Batches committed (a commit that answered with an error but went through, as \
               recovery learns from the committed offsets, counts as committed)",
    },
    MetricDoc {
        name: "onceflow_aborts_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Batches aborted and rewound (not those whose commit went through after all)",
    },
    MetricDoc {
        name: "onceflow_consecutive_aborts",
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        labels: &[],
        help: "Batches aborted in a row, 0 once one commits. Failed batches back off (100 ms, \
               doubling to 5 s); after two in a row the records go one per transaction, and \
               the one that fails alone is handled per on_error (class rejected or \
               transaction-timeout)",
    },
    MetricDoc {
        name: "onceflow_producers_replaced_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Transactional producers replaced by recovery (a timed-out request, a \
               transaction aborted under it, a failed abort, a fence taken for the instance's \
               own)",
    },
    MetricDoc {
        name: "onceflow_commit_seconds",
        kind: Kind::Histogram(COMMIT_BUCKETS),
        unit: Some(Unit::Seconds),
        labels: &[],
        help: "Time to commit a batch: send the offsets and commit the transaction",
    },
    MetricDoc {
        name: "onceflow_batch_stage_seconds",
        kind: Kind::Histogram(COMMIT_BUCKETS),
        unit: Some(Unit::Seconds),
        labels: &["stage"],
        help: "Time a batch spent in each stage: handle (its records), offsets (sent to the \
               transaction or committed), commit (the transaction, or the outputs landing), \
               apply (to the transaction log)",
    },
    MetricDoc {
        name: "onceflow_batch_records",
        kind: Kind::Histogram(BATCH_BUCKETS),
        unit: Some(Unit::Count),
        labels: &[],
        help: "Input records per committed batch",
    },
    MetricDoc {
        name: "onceflow_consumer_lag",
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        labels: &["partition"],
        help: "Records between the engine's position and the partition's last stable offset \
               (from librdkafka's statistics, every 5 s)",
    },
    MetricDoc {
        name: "onceflow_assignments_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Rebalances that gave this instance partitions, each followed by a changelog \
               replay (more than one per start: the member left the group and joined again)",
    },
    MetricDoc {
        name: "onceflow_replayed_records_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Changelog records replayed into the transaction log",
    },
    MetricDoc {
        name: "onceflow_replay_remaining_records",
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        labels: &["partition"],
        help: "Changelog records still to replay, per partition",
    },
    MetricDoc {
        name: "onceflow_partitions_rebuilt_total",
        kind: Kind::Counter,
        unit: None,
        labels: &["reason"],
        help: "Partitions whose transaction log was cleared and rebuilt from the changelog; \
               reason out_of_step: not in step with the changelog for longer than half its \
               delete.retention.ms, so deletions may have been compacted away meanwhile",
    },
    MetricDoc {
        name: "onceflow_already_committed_records_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Records polled again from below where the changelog shows their partition \
               committed (a consumer position that lagged a commit in doubt), dropped \
               unprocessed; exactly-once only",
    },
    MetricDoc {
        name: "onceflow_positions_corrected_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Partitions the consumer started past where catching up found they must go on \
               from, whose records the seek back found (logged as an error: without it they \
               would have been skipped)",
    },
    MetricDoc {
        name: "onceflow_expired_entries_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Dedup entries expired (dedup_window, dedup_max_entries)",
    },
    MetricDoc {
        name: "onceflow_timers_fired_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Timers fired (Processor::on_timer), in committed batches",
    },
    MetricDoc {
        name: "onceflow_late_records_total",
        kind: Kind::Counter,
        unit: None,
        labels: &["windows"],
        help: "Records late for every window they fall in (onceflow::windows), by window set: \
               dead-lettered as late, or dropped with drop_late",
    },
    MetricDoc {
        name: "onceflow_effects_applied_total",
        kind: Kind::Counter,
        unit: None,
        labels: &["kind"],
        help: "Effect intents the executor applied",
    },
    MetricDoc {
        name: "onceflow_effects_retried_total",
        kind: Kind::Counter,
        unit: None,
        labels: &["kind"],
        help: "Effect applies or check-backs that were ambiguous or unknown and are tried \
               again with the same key, within the executor's bounds",
    },
    MetricDoc {
        name: "onceflow_effects_checked_back_total",
        kind: Kind::Counter,
        unit: None,
        labels: &["kind"],
        help: "Effect intents found pending (perhaps applied) and checked back with \
               Effect::check before an apply",
    },
    MetricDoc {
        name: "onceflow_effects_unresolved_total",
        kind: Kind::Counter,
        unit: None,
        labels: &["kind"],
        help: "Effect intents still ambiguous or unknown past the executor's bounds, \
               dead-lettered for a person to resolve",
    },
    MetricDoc {
        name: "onceflow_effects_pending",
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        labels: &["partition"],
        help: "Effect intents marked pending (perhaps applied) when the executor last read \
               the partition's pending markers",
    },
    MetricDoc {
        name: "onceflow_effect_apply_seconds",
        kind: Kind::Summary,
        unit: Some(Unit::Seconds),
        labels: &["kind"],
        help: "Time an effect's apply took (Effect::apply)",
    },
    MetricDoc {
        name: "onceflow_outbox_published_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Outbox rows the relay published to Kafka (onceflow::outbox, feature outbox)",
    },
    MetricDoc {
        name: "onceflow_half_unresolved_total",
        kind: Kind::Counter,
        unit: None,
        labels: &[],
        help: "Half messages whose check-back stayed unknown past its bounds, dead-lettered \
               for a person to resolve (onceflow::half)",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_phase() {
        let stats = Stats::default();
        assert_eq!(health(&stats).0, StatusCode::SERVICE_UNAVAILABLE);
        stats.set_phase(Phase::Replaying);
        assert_eq!(health(&stats).1, "replaying the changelog\n");
        stats.set_phase(Phase::Running);
        assert_eq!(health(&stats).0, StatusCode::OK);
        stats.set_phase(Phase::Stopped);
        assert_eq!(health(&stats).0, StatusCode::SERVICE_UNAVAILABLE);
    }
}
