//! The per-event hot path without Kafka: decode, dedup lookup, overlay, txlog apply, and
//! all of them together as one event costs the engine, with 0, 10 k and 1 M IDs already
//! in the dedup log. Each benchmark handles a batch of `BATCH` events, so criterion's
//! time divided by `BATCH` (it reports elements/s) is the per-event cost.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use onceflow::__bench::{Overlay, TxLog};
use onceflow::{Codec, Json};
use onceflow_bench::workload::Input;

/// Events per batch (the engine's default `max_batch_records`).
const BATCH: usize = 1000;
/// Dedup log sizes compared.
const LOG_SIZES: [u64; 3] = [0, 10_000, 1_000_000];
/// IDs per redb transaction while preloading the log.
const PRELOAD_CHUNK: u64 = 50_000;

fn event(index: u64) -> Vec<u8> {
    serde_json::to_vec(&Input {
        id: format!("e{index}"),
        key: format!("k{}", index % 1000),
        amount: (index % 100) as i64,
        sent_us: 1_796_000_000_000_000,
        pad: "x".repeat(110),
    })
    .expect("an event serializes")
}

/// A transaction log holding `ids` processed IDs (e0 …) in partition 0 and 1000 sums.
fn preloaded(ids: u64) -> (tempfile::TempDir, TxLog) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = TxLog::open(dir.path()).expect("the log opens");
    let mut next = 0;
    while next < ids {
        let mut overlay = Overlay::default();
        for id in next..(next + PRELOAD_CHUNK).min(ids) {
            overlay.mark_processed(0, format!("e{id}"), id as i64, 0);
        }
        log.apply(overlay).expect("preload");
        next += PRELOAD_CHUNK;
    }
    let mut overlay = Overlay::default();
    for key in 0..1000 {
        overlay.put(
            0,
            format!("k{key}").into_bytes(),
            0i64.to_le_bytes().to_vec(),
        );
    }
    log.apply(overlay).expect("preload state");
    (dir, log)
}

fn decode(c: &mut Criterion) {
    let events: Vec<Vec<u8>> = (0..BATCH as u64).map(event).collect();
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("json 200 B", |b| {
        b.iter(|| {
            for bytes in &events {
                black_box(Json.decode::<Input>(bytes).expect("decodes"));
            }
        })
    });
    group.finish();
}

fn overlay(c: &mut Criterion) {
    let mut group = c.benchmark_group("overlay");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("mark, check, put, get", |b| {
        b.iter(|| {
            let mut overlay = Overlay::default();
            for i in 0..BATCH as u64 {
                let id = format!("e{i}");
                black_box(overlay.processed(0, &id));
                overlay.mark_processed(0, id, i as i64, 0);
                let key = format!("k{}", i % 1000).into_bytes();
                black_box(overlay.get(0, &key));
                overlay.put(0, key, i.to_le_bytes().to_vec());
            }
            overlay
        })
    });
    group.finish();
}

fn with_log(c: &mut Criterion) {
    let mut lookup = c.benchmark_group("dedup lookup");
    lookup.throughput(Throughput::Elements(BATCH as u64));
    let logs: Vec<(u64, tempfile::TempDir, TxLog)> = LOG_SIZES
        .iter()
        .map(|&ids| {
            let (dir, log) = preloaded(ids);
            (ids, dir, log)
        })
        .collect();
    for (ids, _, log) in &logs {
        // New IDs: the common case, a miss in the overlay and in the log.
        lookup.bench_with_input(BenchmarkId::new("miss", ids), log, |b, log| {
            let mut next = 10_000_000u64;
            b.iter(|| {
                // One snapshot per batch, as the engine reads.
                let snapshot = log.snapshot().expect("snapshot");
                for _ in 0..BATCH {
                    next += 1;
                    black_box(
                        snapshot
                            .is_processed(0, &format!("e{next}"))
                            .expect("lookup"),
                    );
                }
            })
        });
        if *ids > 0 {
            lookup.bench_with_input(BenchmarkId::new("hit", ids), log, |b, log| {
                let mut next = 0u64;
                b.iter(|| {
                    let snapshot = log.snapshot().expect("snapshot");
                    for _ in 0..BATCH {
                        next = (next + 7919) % ids;
                        black_box(
                            snapshot
                                .is_processed(0, &format!("e{next}"))
                                .expect("lookup"),
                        );
                    }
                })
            });
        }
    }
    lookup.finish();

    let mut apply = c.benchmark_group("txlog apply");
    apply.throughput(Throughput::Elements(BATCH as u64));
    apply.sample_size(20);
    for (ids, _, log) in &logs {
        apply.bench_with_input(BenchmarkId::new("batch of 1000", ids), log, |b, log| {
            let mut next = 20_000_000u64;
            b.iter_batched(
                || {
                    let mut overlay = Overlay::default();
                    for i in 0..BATCH as u64 {
                        next += 1;
                        overlay.mark_processed(0, format!("e{next}"), next as i64, 0);
                        overlay.put(0, format!("k{}", i % 1000).into_bytes(), vec![0; 8]);
                    }
                    overlay
                },
                |overlay| log.apply(overlay).expect("apply"),
                BatchSize::PerIteration,
            )
        });
    }
    apply.finish();

    // What the engine does per event besides Kafka: decode, dedup check (overlay, then the
    // log), state read (overlay, then the log), state write and dedup mark in the overlay,
    // and its share of the batch's apply.
    let mut event_group = c.benchmark_group("per event");
    event_group.throughput(Throughput::Elements(BATCH as u64));
    event_group.sample_size(20);
    let events: Vec<Vec<u8>> = (30_000_000..30_000_000 + BATCH as u64).map(event).collect();
    for (ids, _, log) in &logs {
        event_group.bench_with_input(
            BenchmarkId::new("decode+dedup+state+apply", ids),
            log,
            |b, log| {
                let mut round = 0u64;
                b.iter(|| {
                    round += 1;
                    let mut overlay = Overlay::default();
                    let snapshot = log.snapshot().expect("snapshot");
                    for bytes in &events {
                        let input: Input = Json.decode(bytes).expect("decodes");
                        let id = format!("{}-{round}", input.id);
                        let seen = overlay
                            .processed(0, &id)
                            .unwrap_or_else(|| snapshot.is_processed(0, &id).expect("lookup"));
                        if seen {
                            continue;
                        }
                        let key = input.key.into_bytes();
                        let previous = match overlay.get(0, &key) {
                            Some(value) => value.map(<[u8]>::to_vec),
                            None => snapshot.state(0, &key).expect("state"),
                        };
                        let sum = previous
                            .and_then(|v| v.try_into().ok())
                            .map_or(0, i64::from_le_bytes)
                            + input.amount;
                        overlay.put(0, key, sum.to_le_bytes().to_vec());
                        overlay.mark_processed(0, id, 0, 0);
                    }
                    drop(snapshot);
                    log.apply(overlay).expect("apply");
                })
            },
        );
    }
    event_group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = decode, overlay, with_log
}
criterion_main!(benches);
