//! The testkit's own Kafka client calls: how to reach the broker, creating and altering
//! topics, proving the broker answers, reading its metadata. The engine has its own; these
//! only serve tests.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigSource, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::{Error, Result};

/// How to reach the broker, and the properties every client is given.
#[derive(Debug, Clone)]
pub(crate) struct ClientOptions {
    pub(crate) bootstrap_servers: String,
    properties: Vec<(String, String)>,
}

impl ClientOptions {
    pub(crate) fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self::with_properties(bootstrap_servers, &[])
    }

    /// Options with `properties` passed to every client (later ones win).
    pub(crate) fn with_properties(
        bootstrap_servers: impl Into<String>,
        properties: &[(String, String)],
    ) -> Self {
        ClientOptions {
            bootstrap_servers: bootstrap_servers.into(),
            properties: properties.to_vec(),
        }
    }

    /// A client configuration with the bootstrap servers, the properties, and then
    /// `overrides` (which win).
    pub(crate) fn config(&self, overrides: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        // librdkafka logs through its own callback; keep it to errors.
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

/// Runs a call that blocks its thread (a metadata read, a synchronous poll) on tokio's
/// blocking pool.
pub(crate) async fn blocking<T, F>(operation: &str, call: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|e| Error::Environment(format!("{operation}: {e}")))?
}

/// Creates `name` with `partitions` partitions (replication factor: `configs`'
/// `replication.factor`, else the broker's default), then waits until every partition has
/// a leader, so the caller can write to it at once. An existing topic is an error.
pub(crate) async fn create_topic(
    options: &ClientOptions,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
    timeout: Duration,
) -> Result<()> {
    let operation = format!("create topic `{name}`");
    let admin: AdminClient<DefaultClientContext> = options
        .config(&[])
        .create()
        .map_err(|e| Error::kafka(&operation, e))?;
    let replication = match configs.iter().find(|(key, _)| *key == "replication.factor") {
        Some((_, value)) => value.parse::<i32>().map_err(|_| {
            Error::Environment(format!(
                "{operation}: replication.factor `{value}` is not a whole number"
            ))
        })?,
        // -1: the broker's default.replication.factor (KIP-464).
        None => -1,
    };
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
    for (key, value) in configs
        .iter()
        .filter(|(key, _)| *key != "replication.factor")
    {
        topic = topic.set(key, value);
    }
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(timeout)),
        )
        .await
        .map_err(|e| Error::kafka(&operation, e))?;
    for result in results {
        result.map_err(|(_, code)| Error::kafka(&operation, KafkaError::AdminOp(code)))?;
    }
    wait_for_leaders(options, name, partitions, timeout).await
}

/// Waits until metadata shows `topic` with `partitions` partitions, each with a leader.
async fn wait_for_leaders(
    options: &ClientOptions,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let name = topic.to_owned();
        let led = with_metadata_within(options, Some(topic), Duration::from_secs(2), move |m| {
            m.topics()
                .iter()
                .find(|t| t.name() == name && t.error().is_none())
                .map(|t| {
                    let partitions = t.partitions();
                    partitions
                        .iter()
                        .filter(|p| p.leader() >= 0 && p.error().is_none())
                        .count()
                })
        })
        .await;
        let seen = match led {
            Ok(Some(led)) if led == partitions as usize => return Ok(()),
            Ok(Some(led)) => format!("{led} of {partitions} partitions have a leader"),
            Ok(None) => "the topic is not in the metadata yet".to_owned(),
            Err(error) => error.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: format!("leaders for every partition of `{topic}`"),
                after: timeout,
                detail: seen,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The number of partitions of `topic`, or `None` when it does not exist.
pub(crate) async fn partition_count(
    options: &ClientOptions,
    topic: &str,
    timeout: Duration,
) -> Result<Option<i32>> {
    let name = topic.to_owned();
    with_metadata_within(options, Some(topic), timeout, move |metadata| {
        metadata
            .topics()
            .iter()
            .find(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len() as i32)
    })
    .await
}

/// Proves the broker answers: metadata lists at least one broker, and a record written
/// to `topic` (auto-created or existing) is acknowledged by all in-sync replicas.
pub(crate) async fn probe(options: &ClientOptions, topic: &str, timeout: Duration) -> Result<()> {
    let timeout_ms = timeout.as_millis().to_string();
    let producer: FutureProducer = options
        .config(&[("acks", "all"), ("message.timeout.ms", &timeout_ms)])
        .create()
        .map_err(|e| Error::kafka("create the probe producer", e))?;
    let metadata_client = producer.clone();
    let brokers = blocking("fetch metadata", move || {
        metadata_client
            .client()
            .fetch_metadata(None, timeout)
            .map(|metadata| metadata.brokers().len())
            .map_err(|e| Error::kafka("fetch metadata", e))
    })
    .await?;
    if brokers == 0 {
        return Err(Error::Environment("metadata lists no broker".into()));
    }
    producer
        .send(
            FutureRecord::to(topic).key("probe").payload("probe"),
            timeout,
        )
        .await
        .map_err(|(e, _)| Error::kafka(format!("produce to `{topic}`"), e))?;
    Ok(())
}

/// Sets topic-level configuration `name` = `value` on `topic`; the topic's other settings
/// stay as they are.
pub(crate) async fn alter_topic_config(
    options: &ClientOptions,
    topic: &str,
    name: &str,
    value: &str,
    timeout: Duration,
) -> Result<()> {
    let operation = format!("set `{name}` = `{value}` on `{topic}`");
    let admin: AdminClient<DefaultClientContext> = options
        .config(&[])
        .create()
        .map_err(|e| Error::kafka(&operation, e))?;
    let admin_options = AdminOptions::new().request_timeout(Some(timeout));
    // The admin API's alter is not incremental: keep the settings set on the topic.
    let described = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &admin_options)
        .await
        .map_err(|e| Error::kafka(&operation, e))?;
    let mut alteration = AlterConfig::new(ResourceSpecifier::Topic(topic));
    let mut kept = Vec::new();
    for result in described {
        let resource =
            result.map_err(|code| Error::kafka(&operation, KafkaError::AdminOp(code)))?;
        for entry in resource.entries {
            if entry.source == ConfigSource::DynamicTopic
                && entry.name != name
                && let Some(value) = entry.value
            {
                kept.push((entry.name, value));
            }
        }
    }
    for (key, value) in &kept {
        alteration = alteration.set(key, value);
    }
    alteration = alteration.set(name, value);
    let results = admin
        .alter_configs(&[alteration], &admin_options)
        .await
        .map_err(|e| Error::kafka(&operation, e))?;
    for result in results {
        result.map_err(|(_, code)| Error::kafka(&operation, KafkaError::AdminOp(code)))?;
    }
    Ok(())
}

/// Reads the cluster's metadata (of `topic`, or of every topic) and gives it to `read`.
pub(crate) async fn with_metadata<T: Send + 'static>(
    options: &ClientOptions,
    topic: Option<&str>,
    read: impl FnOnce(&Metadata) -> T + Send + 'static,
) -> Result<T> {
    with_metadata_within(options, topic, Duration::from_secs(10), read).await
}

async fn with_metadata_within<T: Send + 'static>(
    options: &ClientOptions,
    topic: Option<&str>,
    timeout: Duration,
    read: impl FnOnce(&Metadata) -> T + Send + 'static,
) -> Result<T> {
    let consumer: BaseConsumer = options
        .config(&[])
        .create()
        .map_err(|e| Error::kafka("create a metadata client", e))?;
    let topic = topic.map(str::to_owned);
    blocking("fetch metadata", move || {
        let metadata = consumer
            .fetch_metadata(topic.as_deref(), timeout)
            .map_err(|e| Error::kafka("fetch metadata", e))?;
        Ok(read(&metadata))
    })
    .await
}
