//! The input as the broker hands it over: compressed with any codec Kafka producers use,
//! damaged on the broker's disk (the instance stops rather than skip it), and read by a
//! consumer whose settings the engine's poll loop depends on.

use onceflow::{Engine, Error};
use onceflow_e2e::harness::{WITHIN, run_to_end, setup};
use onceflow_e2e::sum::{self, Amount, Sum};
use onceflow_testkit::Kafka;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Input compressed with each codec Kafka producers use is processed exactly once, and
/// the engine writes its outputs and changelog with it too. Until librdkafka was built
/// with zstd, a zstd batch failed to decompress on every fetch (a warning every 500 ms):
/// its partition never moved, and nothing said why but the log. A state directory wiped
/// after the run comes back from the compressed changelog: the same events again are
/// duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_compressed_with_any_codec_is_processed_exactly_once() -> TestResult {
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let s = setup(&format!("codec-{codec}"), 2).await?;
        let compressed = Kafka::connect_with(
            s.kafka.bootstrap_servers(),
            &[("compression.type", codec), ("linger.ms", "50")],
        );
        let inputs = sum::amounts(0, 500, 10);
        sum::produce(&compressed, &s.input, &inputs).await?;
        let config = || s.config("a").kafka("compression.type", codec);
        let stats = run_to_end(&s, config(), Sum::new(&s.output)).await?;
        assert_eq!(stats.outputs, inputs.len() as u64, "{codec}");
        sum::assert_exactly_once(&inputs, &sum::committed_outputs(s.kafka, &s.output).await?);

        std::fs::remove_dir_all(s.state.path().join(&s.group))?;
        sum::produce(&compressed, &s.input, &inputs).await?;
        let again = run_to_end(&s, config(), Sum::new(&s.output)).await?;
        assert!(again.replayed_records > 0, "{codec}: {again:?}");
        assert_eq!(again.duplicates_skipped, inputs.len() as u64, "{codec}");
        sum::assert_exactly_once(&inputs, &sum::committed_outputs(s.kafka, &s.output).await?);
    }
    Ok(())
}

/// A batch damaged on the broker's disk is neither processed nor polled past.
/// - Before, with librdkafka's default (`check.crcs` off), the damaged record reached the
///   processor as other data: 60 outputs for 60 inputs, one of them for an event `#-25`
///   that was never sent.
/// - With CRCs checked but consumer errors only logged, as the engine did, librdkafka
///   skipped the batch. It then misread the bytes after it as a batch at offset
///   39,601,396,991,611, found that out of range, and reset the partition to its
///   beginning, again and again, with a warning each time. Had it read on correctly,
///   the next commit would have moved past records never processed.
/// - The input consumer now checks CRCs by default and the instance stops at the error,
///   with nothing past the damage committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_damaged_on_the_brokers_disk_stops_the_instance() -> TestResult {
    let s = setup("bit-rot", 1).await?;
    // Three batches, one write each: the second is damaged.
    let batches = [
        sum::amounts(0, 20, 5),
        sum::amounts(20, 20, 5),
        sum::amounts(40, 20, 5),
    ];
    for batch in &batches {
        sum::produce(s.kafka, &s.input, batch).await?;
    }
    s.kafka.corrupt(&s.input, 0, "e-25").await?;

    let engine = Engine::new(s.config("a"))?;
    let shutdown = engine.shutdown_handle();
    let mut running = tokio::spawn(engine.run(Sum::new(&s.output)));
    let ended = tokio::time::timeout(WITHIN, &mut running).await;
    let committed = s.kafka.committed_offsets(&s.group, &s.input).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let Ok(ended) = ended else {
        shutdown.trigger();
        let _ = running.await;
        panic!(
            "the instance went on past the damaged batch: committed {committed:?}, {} outputs",
            outputs.len()
        );
    };
    let error = ended?.expect_err("the instance stopped without an error");
    assert!(error.is_fatal(), "{error}");
    assert!(
        error.to_string().contains("could not read a batch"),
        "{error}"
    );
    // Nothing at or past the damaged batch (offsets 20..40) is committed or output.
    let at = committed.get(&0).copied().flatten().unwrap_or(0);
    assert!(at <= 20, "committed past the damaged batch: {committed:?}");
    let first: Vec<Amount> = batches[0].iter().take(at as usize).cloned().collect();
    sum::assert_exactly_once(&first, &outputs);
    Ok(())
}

/// Item 6. A property that breaks the engine's poll loop is refused at start, with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_property_that_breaks_the_poll_loop_is_refused() -> TestResult {
    let s = setup("holes-eof", 1).await?;
    for (key, value) in [
        ("enable.partition.eof", "true"),
        ("enable.idempotence", "false"),
        ("acks", "1"),
    ] {
        let refused = Engine::new(s.config("a").kafka(key, value));
        match refused {
            Err(Error::Config { key: refused, .. }) => assert_eq!(refused, key),
            other => panic!("{key}={value}: expected a configuration error, got {other:?}"),
        }
    }
    Ok(())
}
