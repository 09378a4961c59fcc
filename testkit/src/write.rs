//! Plain (non-transactional, idempotent) writes.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::client::ClientOptions;
use crate::{Error, OutgoingRecord, Result};

/// Writes `records` to `topic` with an idempotent producer (`acks=all`) and returns the
/// `(partition, offset)` each landed at, in order. Fails on the first record the broker
/// did not acknowledge within `timeout`.
pub(crate) async fn produce(
    options: &ClientOptions,
    topic: &str,
    records: Vec<OutgoingRecord>,
    timeout: Duration,
) -> Result<Vec<(i32, i64)>> {
    let timeout_ms = timeout.as_millis().to_string();
    let producer: FutureProducer = options
        .config(&[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", "5"),
            ("message.timeout.ms", &timeout_ms),
        ])
        .create()
        .map_err(|e| Error::kafka("create producer", e))?;
    // Send everything first, then await: one round trip per batch, not per record.
    let mut pending = Vec::with_capacity(records.len());
    for record in &records {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        let mut future = FutureRecord::<[u8], [u8]>::to(topic).headers(headers);
        if let Some(key) = &record.key {
            future = future.key(key.as_slice());
        }
        if let Some(value) = &record.value {
            future = future.payload(value.as_slice());
        }
        if let Some(partition) = record.partition {
            future = future.partition(partition);
        }
        if let Some(timestamp) = record.timestamp_ms {
            future = future.timestamp(timestamp);
        }
        let delivery = producer
            .send_result(future)
            .map_err(|(e, _)| Error::kafka(format!("enqueue a record for `{topic}`"), e))?;
        pending.push(delivery);
    }
    let mut positions = Vec::with_capacity(pending.len());
    for delivery in pending {
        match delivery.await {
            Ok(Ok(delivered)) => positions.push((delivered.partition, delivered.offset)),
            Ok(Err((e, _))) => return Err(Error::kafka(format!("produce to `{topic}`"), e)),
            Err(_cancelled) => {
                return Err(Error::Environment(format!(
                    "the producer for `{topic}` went away before acknowledging a record"
                )));
            }
        }
    }
    Ok(positions)
}
