//! The workload every contender runs: keyed JSON events in, one JSON output per event out.
//!
//! ```text
//!  input  {"id":"t17","key":"k3","amount":5,"sent_us":…,"pad":"xx…"}
//!    ──► decode ──► sum[key] += amount ──►
//!  output {"id":"t17","key":"k3","sum":42,"sent_us":…,"processed_us":…}
//! ```
//!
//! `sent_us` is the wall-clock time at which the load generator handed the event to its
//! producer; every contender copies it into the output, so the driver measures latency
//! from send to visible under `read_committed` without trusting any contender's clock
//! (all processes share this machine's). `processed_us` is when a contender handled the
//! event: the earliest of them is "first consumed" for throughput.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::{Deserialize, Serialize};

/// An input event.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Input {
    /// Business event ID (duplicates repeat it).
    pub id: String,
    /// The key whose sum this event adds to.
    pub key: String,
    /// What is added.
    pub amount: i64,
    /// When the load generator sent it, µs since the epoch.
    pub sent_us: i64,
    /// Filler up to the configured event size.
    #[serde(default)]
    pub pad: String,
}

/// An output, one per processed input.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Output {
    /// The input's event ID.
    pub id: String,
    /// The input's key.
    pub key: String,
    /// The key's running sum, this event included.
    pub sum: i64,
    /// The input's `sent_us`.
    pub sent_us: i64,
    /// When the contender processed the input, µs since the epoch.
    pub processed_us: i64,
}

impl Output {
    /// The output for `input` given the key's new sum.
    pub fn of(input: Input, sum: i64) -> Output {
        Output {
            id: input.id,
            key: input.key,
            sum,
            sent_us: input.sent_us,
            processed_us: now_us(),
        }
    }
}

/// Wall-clock µs since the epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// What the load generator produces.
#[derive(Debug, Clone)]
pub struct Load {
    /// Input topic.
    pub topic: String,
    /// Number of events (duplicates included).
    pub events: u64,
    /// Approximate size of one serialized event, in bytes.
    pub size: usize,
    /// Number of distinct keys.
    pub keys: u64,
    /// Share of events (0.0 … 1.0) that repeat an earlier event's ID (and key).
    pub duplicates: f64,
    /// Events per second, or 0 for as fast as the producer goes.
    pub rate: u64,
    /// Prefix of the event IDs, to tell runs and phases apart.
    pub id_prefix: String,
}

impl Load {
    /// How many outputs a contender that skips duplicates emits.
    pub fn unique_events(&self) -> u64 {
        self.events - self.duplicate_count()
    }

    /// How many events repeat an earlier ID: every `1/share`-th one, never the first.
    pub fn duplicate_count(&self) -> u64 {
        (1..self.events).filter(|&i| self.is_duplicate(i)).count() as u64
    }

    fn is_duplicate(&self, index: u64) -> bool {
        if self.duplicates <= 0.0 || index == 0 {
            return false;
        }
        let every = (1.0 / self.duplicates).round().max(1.0) as u64;
        index.is_multiple_of(every)
    }
}

/// What the generator did.
#[derive(Debug, Clone, Copy)]
pub struct Produced {
    /// Events acknowledged by the broker.
    pub events: u64,
    /// From the first send to the last acknowledgement.
    pub elapsed: Duration,
}

impl Produced {
    /// Events per second.
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Produces `load` to `brokers` (blocking; run it on a thread of its own).
pub fn produce(brokers: &str, load: &Load) -> Result<Produced, KafkaError> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", if load.rate > 0 { "1" } else { "5" })
        // librdkafka pipelines up to a million requests per connection: at a modest rate
        // with a short linger that is one tiny request per message, which a loaded broker
        // queues, and the queue becomes the latency measured. Kafka's Java producer
        // allows 5 in flight; so does this one.
        .set("max.in.flight.requests.per.connection", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("acks", "all")
        .create()?;
    // Connected and with the topic's leaders known before the clock starts, so that the
    // first events' latency is not the producer's start-up.
    producer
        .client()
        .fetch_metadata(Some(&load.topic), Duration::from_secs(30))?;
    let padding = "x".repeat(load.size.saturating_sub(90));
    let start = Instant::now();
    let mut last_original = 0u64;
    for index in 0..load.events {
        if load.rate > 0 {
            let due = start + Duration::from_secs_f64(index as f64 / load.rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let original = if load.is_duplicate(index) {
            last_original
        } else {
            last_original = index;
            index
        };
        let event = Input {
            id: format!("{}{original}", load.id_prefix),
            key: format!("k{}", original % load.keys.max(1)),
            amount: (original % 100) as i64,
            sent_us: now_us(),
            pad: padding.clone(),
        };
        let value = serde_json::to_vec(&event).expect("an event serializes");
        let mut record = BaseRecord::<str, [u8]>::to(&load.topic)
            .key(&event.key)
            .payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((error, _)) => return Err(error),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(Produced {
        events: load.events,
        elapsed: start.elapsed(),
    })
}
