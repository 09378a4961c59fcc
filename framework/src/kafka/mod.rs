//! Kafka: the only module that names rdkafka types.
//!
//! Everything above it speaks the crate's own types ([`Record`], [`Isolation`],
//! [`crate::Error`]). Every librdkafka call that blocks a thread goes through
//! [`blocking`], so no tokio worker ever waits on the broker.

mod admin;
mod blocking;
mod consumer;
mod dlq;
mod error;
mod producer;
#[cfg(feature = "testkit")]
mod read;
mod replay;
mod types;
#[cfg(feature = "testkit")]
mod write;

#[cfg(feature = "testkit")]
pub(crate) use admin::probe;
pub(crate) use admin::{create_topic, partition_count, topic_config};
pub(crate) use blocking::blocking;
pub(crate) use consumer::{InputConsumer, Rebalanced};
pub(crate) use dlq::{ReplayPlan, replay_dead_letters};
pub(crate) use error::kafka_error;
pub(crate) use producer::{OutputProducer, Pending};
#[cfg(feature = "testkit")]
pub(crate) use read::{committed_offsets, read_to_end};
pub(crate) use replay::read_partition;
#[cfg(feature = "testkit")]
pub use types::{Isolation, OutgoingRecord, Record};
#[cfg(not(feature = "testkit"))]
pub(crate) use types::{Isolation, Record};
#[cfg(feature = "testkit")]
pub(crate) use write::produce;

use rdkafka::ClientConfig;

/// How to reach the cluster, and any client property to pass through unchanged.
#[derive(Debug, Clone)]
pub(crate) struct ClientOptions {
    pub(crate) bootstrap_servers: String,
    pub(crate) properties: Vec<(String, String)>,
}

impl ClientOptions {
    #[cfg(feature = "testkit")]
    pub(crate) fn new(bootstrap_servers: impl Into<String>) -> Self {
        ClientOptions {
            bootstrap_servers: bootstrap_servers.into(),
            properties: Vec::new(),
        }
    }

    /// A librdkafka configuration with the bootstrap servers, the pass-through
    /// properties, and then `overrides` (which win).
    fn config(&self, overrides: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        // librdkafka logs through its own callback; keep it to errors unless asked.
        config.set("log_level", "3");
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        for (key, value) in overrides {
            config.set(*key, *value);
        }
        config
    }
}
