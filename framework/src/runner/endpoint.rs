//! The HTTP endpoint: Prometheus `/metrics` and the readiness check `/healthz`.
//!
//! Counters live in the engine's [`Stats`] (one source of truth, also returned by
//! `Engine::run`) and are copied into the Prometheus registry at each scrape; histograms
//! and gauges are recorded where they happen through the `metrics` facade, which costs
//! nothing when no recorder is installed (an engine embedded without the runner).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
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
    let recorder = PrometheusBuilder::new()
        .add_global_label("group", &config.group)
        .add_global_label("instance", &config.instance_id)
        .set_buckets_for_metric(
            Matcher::Full("onceflow_commit_seconds".into()),
            COMMIT_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("onceflow_batch_stage_seconds".into()),
                COMMIT_BUCKETS,
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("onceflow_batch_records".into()),
                BATCH_BUCKETS,
            )
        })
        .map_err(|e| Error::Config {
            key: "metrics_address".into(),
            value: address.to_string(),
            accepted: format!("a working metrics set-up ({e})"),
        })?
        .build_recorder();
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
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "onceflow_records_in_total",
        "Input records in batches that committed or aborted"
    );
    describe_counter!("onceflow_outputs_total", "Output records emitted");
    describe_counter!(
        "onceflow_duplicates_skipped_total",
        "Inputs skipped because their event ID was already processed"
    );
    describe_counter!(
        "onceflow_dead_lettered_total",
        "Inputs written to the dead-letter topic"
    );
    describe_counter!(
        "onceflow_skipped_total",
        "Inputs that failed and were skipped (on_error = skip)"
    );
    describe_counter!(
        "onceflow_records_without_event_id_total",
        "Inputs processed without an event ID (none or empty), so not deduplicated by ID"
    );
    describe_counter!("onceflow_commits_total", "Batches committed");
    describe_counter!("onceflow_aborts_total", "Batches aborted and rewound");
    describe_counter!(
        "onceflow_producers_replaced_total",
        "Transactional producers replaced by recovery (a timed-out request, a transaction aborted under it, a failed abort, a fence taken for the instance's own)"
    );
    describe_counter!(
        "onceflow_replayed_records_total",
        "Changelog records replayed into the transaction log"
    );
    describe_counter!("onceflow_expired_entries_total", "Dedup entries expired");
    describe_counter!(
        "onceflow_timers_fired_total",
        "Timers fired (Processor::on_timer), in committed batches"
    );
    describe_counter!(
        "onceflow_already_committed_records_total",
        "Records polled again from below what the changelog shows committed, dropped \
         unprocessed (exactly-once)"
    );
    describe_counter!(
        "onceflow_late_records_total",
        "Records late for every window they fall in (onceflow::windows), by window set"
    );
    describe_counter!(
        "onceflow_assignments_total",
        "Rebalances that gave this instance partitions (more than one per start: the member \
         left the group and joined again)"
    );
    describe_histogram!(
        "onceflow_commit_seconds",
        Unit::Seconds,
        "Time to commit a batch (send offsets and commit the transaction)"
    );
    describe_histogram!(
        "onceflow_batch_stage_seconds",
        Unit::Seconds,
        "Time a batch spent in each stage: handle (its records), offsets (sent to the \
         transaction or committed), commit (the transaction, or the outputs landing), apply \
         (to the transaction log)"
    );
    describe_histogram!(
        "onceflow_batch_records",
        Unit::Count,
        "Input records per committed batch"
    );
    describe_gauge!(
        "onceflow_consumer_lag",
        Unit::Count,
        "Records between the engine's position and the partition's last stable offset"
    );
    describe_gauge!(
        "onceflow_replay_remaining_records",
        Unit::Count,
        "Changelog records still to replay, per partition"
    );
    describe_gauge!(
        "onceflow_consecutive_aborts",
        Unit::Count,
        "Batches aborted in a row (0 once one commits); over 2 after a refusal, records go one per transaction"
    );
    describe_gauge!(
        "onceflow_ready",
        "1 while the engine processes, 0 while it starts, replays or after it stopped"
    );
}

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
