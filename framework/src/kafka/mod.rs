//! Kafka: the only module that names rdkafka types.
//!
//! Everything above it speaks the crate's own types ([`Record`],
//! [`crate::Error`]). Every librdkafka call that blocks a thread goes through
//! [`blocking`], so no tokio worker ever waits on the broker.

mod admin;
mod consumer;
mod deliveries;
mod dlq;
mod error;
mod member;
mod producer;
mod replay;
mod security;
mod topic_id;
mod types;

pub(crate) use admin::{create_topic, ensure_topic, partition_count, replica_count, topic_config};
pub(crate) use consumer::{Holder, InputConsumer, Polled, Rebalanced};
pub(crate) use dlq::{ReplayPlan, replay_dead_letters};
#[cfg(any(test, feature = "testing"))]
pub(crate) use error::classify;
pub(crate) use error::{kafka_error, known_topic_error};
pub(crate) use member::{GroupMember, GroupMetadata, Start};
pub(crate) use producer::{Linger, Pending, Producer};
// The test driver's replay decides when to end as the engine's does.
#[cfg(any(test, feature = "testing"))]
pub(crate) use replay::{AtTheEnd, at_the_end};
pub(crate) use replay::{ReadEnd, Until, read_partition, read_partition_to_end};
pub(crate) use security::{Resources, check_connection, explain};
pub(crate) use topic_id::topic_id;
#[cfg(not(feature = "testing"))]
pub(crate) use types::Record;
#[cfg(feature = "testing")]
pub use types::{OutgoingRecord, Record};

use rdkafka::ClientConfig;
use secrecy::{ExposeSecret, SecretString};

use crate::redact;

/// Defaults of every transactional producer, set before the pass-through properties, so a
/// user's own value wins.
///
/// `retry.backoff.ms`: a transaction begun soon after the last one committed can find its
/// coordinator still writing the last one's commit markers. The coordinator then answers
/// AddOffsetsToTxn with CONCURRENT_TRANSACTIONS, and librdkafka sends it again after
/// `retry.backoff.ms`, 100 ms by default (AddPartitionsToTxn has its own 20 ms). At a 10 ms
/// commit interval that wait was most of the engine's p99 (`bench/results/2026-12-06-c.md`).
/// From 10 ms, a retry waits twice as long as the one before, up to `retry.backoff.max.ms`
/// (1 s), so a broker that stays unavailable is not asked much more often.
pub(crate) const TRANSACTIONAL_DEFAULTS: &[(&str, &str)] = &[("retry.backoff.ms", "10")];

/// How to reach the cluster, and any client property to pass through unchanged.
///
/// Secret properties (see [`redact::is_secret`]) are held apart as [`SecretString`]s: they
/// reach librdkafka's configuration and nothing else (`Debug` shows them redacted).
#[derive(Debug, Clone)]
pub(crate) struct ClientOptions {
    pub(crate) bootstrap_servers: String,
    properties: Vec<(String, String)>,
    secrets: Vec<(String, SecretString)>,
}

impl ClientOptions {
    /// Options with `properties` passed to every client (later ones win).
    pub(crate) fn with_properties(
        bootstrap_servers: impl Into<String>,
        properties: &[(String, String)],
    ) -> Self {
        let mut options = ClientOptions {
            bootstrap_servers: bootstrap_servers.into(),
            properties: Vec::new(),
            secrets: Vec::new(),
        };
        for (key, value) in properties {
            if redact::is_secret(key) {
                options
                    .secrets
                    .push((key.clone(), SecretString::from(value.clone())));
            } else {
                options.properties.push((key.clone(), value.clone()));
            }
        }
        options
    }

    /// The value of a (non-secret) pass-through property.
    pub(crate) fn property(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, value)| value.as_str())
    }

    /// Who the broker sees this client as, for error messages: the SASL user, or the
    /// subject of the client certificate, or `User:ANONYMOUS`.
    pub(crate) fn principal(&self) -> String {
        let protocol = self
            .property("security.protocol")
            .unwrap_or("plaintext")
            .to_ascii_lowercase();
        if protocol.starts_with("sasl") {
            return match self.property("sasl.username") {
                Some(user) => format!("User:{user}"),
                None => "the SASL user (sasl.username is not set)".into(),
            };
        }
        if protocol == "ssl" {
            if let Some(path) = self.property("ssl.certificate.location") {
                return format!("the subject of the client certificate `{path}` (User:CN=…)");
            }
            if self.property("ssl.certificate.pem").is_some() {
                return "the subject of the client certificate in ssl.certificate.pem (User:CN=…)"
                    .into();
            }
        }
        "User:ANONYMOUS".into()
    }

    /// A librdkafka configuration with the bootstrap servers, the pass-through
    /// properties, and then `overrides` (which win).
    pub(crate) fn config(&self, overrides: &[(&str, &str)]) -> ClientConfig {
        self.config_with_defaults(&[], overrides)
    }

    /// As [`ClientOptions::config`], with `defaults` set before the pass-through
    /// properties, so a user's own value of one of them wins.
    pub(crate) fn config_with_defaults(
        &self,
        defaults: &[(&str, &str)],
        overrides: &[(&str, &str)],
    ) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        // librdkafka logs through its own callback; keep it to errors unless asked.
        config.set("log_level", "3");
        for (key, value) in defaults {
            config.set(*key, *value);
        }
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        for (key, value) in &self.secrets {
            config.set(key, value.expose_secret());
        }
        for (key, value) in overrides {
            config.set(*key, *value);
        }
        config
    }
}
