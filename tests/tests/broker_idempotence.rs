//! 5. An idempotent producer's retries create no duplicates.
//!
//! The broker is frozen (`docker pause`) while produce requests are in flight, so they
//! time out and their records are sent again, while the broker may already hold the first
//! copy in its socket buffer and append it on waking. The test proves that a produce
//! request did time out in flight (librdkafka's own log says so) and that the partition
//! still holds every record exactly once, in order.
//!
//! It has a binary of its own because freezing the broker would stall every other test
//! sharing it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use onceflow_testkit::{self as testkit, Isolation};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, ProducerContext};

const WARM_UP: usize = 500;
const STEADY: usize = 4_000;
const PAUSE_FOR: Duration = Duration::from_secs(5);

/// Counts produce requests that librdkafka reports as timed out while in flight.
#[derive(Clone, Default)]
struct TimedOutProduceRequests(Arc<AtomicU64>);

impl ClientContext for TimedOutProduceRequests {
    fn log(&self, _level: RDKafkaLogLevel, facility: &str, message: &str) {
        // e.g. "REQTMOUT ... Timed out ProduceRequest in flight (after 1001ms, timeout #0)"
        if facility == "REQTMOUT" && message.contains("Timed out ProduceRequest in flight") {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl ProducerContext for TimedOutProduceRequests {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

fn send_range(
    producer: &FutureProducer<TimedOutProduceRequests>,
    topic: &str,
    range: std::ops::Range<usize>,
) -> Result<Vec<DeliveryFuture>, rdkafka::error::KafkaError> {
    range
        .map(|i| {
            let value = i.to_string();
            producer
                .send_result(FutureRecord::to(topic).key("one-key").payload(&value))
                .map_err(|(e, _)| e)
        })
        .collect()
}

async fn all_delivered(deliveries: Vec<DeliveryFuture>) -> Result<(), Box<dyn std::error::Error>> {
    for delivery in deliveries {
        delivery.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_retries_create_no_duplicates() -> Result<(), Box<dyn std::error::Error>> {
    let kafka = testkit::kafka().await;
    if !kafka.is_managed() {
        eprintln!(
            "skipped: needs a broker the testkit started, to pause it (ONCEFLOW_TEST_BOOTSTRAP is set)"
        );
        return Ok(());
    }
    let topic = testkit::unique_name("conformance-idempotence");
    kafka.create_topic(&topic, 1).await?;

    let timed_out = TimedOutProduceRequests::default();
    let producer: FutureProducer<TimedOutProduceRequests> = ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // Requests time out fast and are retried; records never time out.
        .set("request.timeout.ms", "1000")
        .set("socket.timeout.ms", "1000")
        .set("message.timeout.ms", "120000")
        .set("retry.backoff.ms", "100")
        .set("linger.ms", "1")
        .set("batch.num.messages", "100")
        .set("debug", "msg")
        .set_log_level(RDKafkaLogLevel::Debug)
        .create_with_context(timed_out.clone())?;

    // The producer has its ID and a live connection before the broker freezes.
    all_delivered(send_range(&producer, &topic, 0..WARM_UP)?).await?;

    // Keep records flowing, one every millisecond or so, while the broker is frozen for
    // a while in the middle: requests written during the freeze time out in flight.
    let freeze = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        kafka.pause().await?;
        tokio::time::sleep(PAUSE_FOR).await;
        kafka.unpause().await
    });
    let total = WARM_UP + STEADY;
    let mut deliveries = Vec::with_capacity(STEADY);
    for i in WARM_UP..total {
        deliveries.extend(send_range(&producer, &topic, i..i + 1)?);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    freeze.await??;
    all_delivered(deliveries).await?;

    let retried = timed_out.0.load(Ordering::Relaxed);
    assert!(
        retried > 0,
        "no produce request timed out in flight: the pause proved nothing"
    );

    let records = kafka
        .read_to_end(&topic, Isolation::ReadUncommitted)
        .await?;
    let seen: Vec<usize> = records
        .iter()
        .map(|r| r.value_str().parse().expect("number"))
        .collect();
    assert_eq!(
        seen.len(),
        total,
        "{} records for {total} sent ({retried} requests retried)",
        seen.len()
    );
    assert_eq!(
        seen,
        (0..total).collect::<Vec<_>>(),
        "records duplicated or reordered"
    );
    eprintln!(
        "{retried} produce requests timed out in flight and were retried; {total} records, no duplicate"
    );
    Ok(())
}
