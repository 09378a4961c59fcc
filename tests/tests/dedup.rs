//! Deduplication against the real broker: what an event ID is (an empty ID is none; a
//! header ID that is not UTF-8 keeps its bytes) and how long an ID is remembered (the
//! dedup window).

use std::time::Duration;

use onceflow_e2e::harness::{amount, dead_letters, header, keyed, run_to_end, setup};
use onceflow_e2e::sum::{self, Amount, Sum};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Item 2. Five events whose ID is `""`: before, the first was processed and the other
/// four skipped as its duplicates, silently. An empty ID is no ID: all five are
/// processed (not deduplicated by ID) and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_event_id_is_no_id() -> TestResult {
    let s = setup("holes-empty-id", 1).await?;
    let events: Vec<Amount> = (1..=5).map(|i| amount(Some(""), "k", i)).collect();
    s.kafka.produce(&s.input, events.iter().map(keyed)).await?;
    let stats = run_to_end(&s, s.config("a"), Sum::new(&s.output)).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let sums: Vec<i64> = outputs.iter().map(|o| o.sum).collect();
    assert_eq!(sums, [1, 3, 6, 10, 15]);
    assert_eq!(stats.duplicates_skipped, 0);
    assert_eq!(stats.without_event_id, 5);

    // With IDs required, the same records are dead-lettered as missing their ID.
    let s = setup("holes-empty-id-required", 1).await?;
    s.kafka.produce(&s.input, events.iter().map(keyed)).await?;
    let stats = run_to_end(
        &s,
        s.config("a").require_event_id(true),
        Sum::new(&s.output),
    )
    .await?;
    assert_eq!(stats.dead_lettered, 5);
    let dead = dead_letters(&s).await?;
    assert!(
        dead.iter()
            .all(|r| header(r, "onceflow-error-class") == "missing-event-id"),
        "{dead:?}"
    );
    Ok(())
}

/// Item 10. Header event IDs that are not UTF-8 went through a lossy conversion, so
/// `\xff` and `\xfe` both became U+FFFD and the second was skipped as a duplicate of the
/// first. They are two IDs; a real re-send of one is still a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_event_ids_that_are_not_utf8_do_not_collide() -> TestResult {
    let s = setup("holes-binary-id", 1).await?;
    let first = amount(None, "k", 1);
    let second = amount(None, "k", 2);
    let records = [
        keyed(&first).header("onceflow-event-id", vec![0xff]),
        keyed(&second).header("onceflow-event-id", vec![0xfe]),
        // The first again: a duplicate.
        keyed(&first).header("onceflow-event-id", vec![0xff]),
    ];
    s.kafka.produce(&s.input, records).await?;
    let stats = run_to_end(&s, s.config("a"), Sum::new(&s.output)).await?;
    let outputs = sum::committed_outputs(s.kafka, &s.output).await?;
    let sums: Vec<i64> = outputs.iter().map(|o| o.sum).collect();
    assert_eq!(sums, [1, 3]);
    assert_eq!(stats.duplicates_skipped, 1);
    Ok(())
}

/// Item 13. An ID re-sent after the dedup window is a new event, even while its old
/// entry still waits for lazy expiry (before, it was skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_re_sent_after_the_dedup_window_is_processed() -> TestResult {
    let s = setup("holes-window", 1).await?;
    let config = || s.config("a").dedup(Duration::from_secs(2), None);
    let event = amount(Some("e-1"), "k", 5);
    s.kafka.produce(&s.input, [keyed(&event)]).await?;
    run_to_end(&s, config(), Sum::new(&s.output)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.kafka.produce(&s.input, [keyed(&event)]).await?;
    let stats = run_to_end(&s, config(), Sum::new(&s.output)).await?;
    let sums: Vec<i64> = sum::committed_outputs(s.kafka, &s.output)
        .await?
        .iter()
        .map(|o| o.sum)
        .collect();
    assert_eq!(sums, [5, 10]);
    assert_eq!(stats.duplicates_skipped, 0);
    Ok(())
}
