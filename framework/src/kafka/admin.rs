//! Topic administration and broker probes.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::{ClientOptions, kafka_error};
use crate::blocking::blocking;
use crate::{Error, Result};

/// Creates `name` with `partitions` partitions (replication factor 1 unless `configs`
/// says `replication.factor`), then waits until every partition has a leader, so the
/// caller can write to it at once. An existing topic is an error.
pub(crate) async fn create_topic(
    options: &ClientOptions,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
    timeout: Duration,
) -> Result<()> {
    let operation = crate::Operation::create_topic(name);
    let admin: AdminClient<DefaultClientContext> = options
        .config(&[])
        .create()
        .map_err(|e| kafka_error(&operation, e))?;
    let replication = configs
        .iter()
        .find(|(key, _)| *key == "replication.factor")
        .map(|(_, value)| {
            value.parse::<i32>().map_err(|_| Error::Config {
                key: "replication.factor".into(),
                value: (*value).into(),
                accepted: "a positive whole number".into(),
            })
        })
        .transpose()?
        // -1: the broker's default.replication.factor (KIP-464), as every tool does.
        .unwrap_or(-1);
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
    for (key, value) in configs
        .iter()
        .filter(|(key, _)| *key != "replication.factor")
    {
        topic = topic.set(key, value);
    }
    let admin_options = AdminOptions::new().operation_timeout(Some(timeout));
    let results = admin
        .create_topics([&topic], &admin_options)
        .await
        .map_err(|e| kafka_error(&operation, e))?;
    for result in results {
        if let Err((topic, code)) = result {
            return Err(Error::Kafka {
                operation: crate::Operation::create_topic(topic),
                code: super::error::code_of(code),
                message: code.to_string(),
                class: crate::error::ErrorClass::Other,
                cause: None,
            });
        }
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
    let consumer: BaseConsumer = options
        .config(&[])
        .create()
        .map_err(|e| kafka_error("create metadata client", e))?;
    let topic = topic.to_owned();
    blocking("wait for topic leaders", move || {
        let deadline = Instant::now() + timeout;
        let mut seen = String::from("no metadata yet");
        while Instant::now() < deadline {
            match consumer.fetch_metadata(Some(&topic), Duration::from_secs(2)) {
                Ok(metadata) => {
                    if let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) {
                        let led = found
                            .partitions()
                            .iter()
                            .filter(|p| p.leader() >= 0 && p.error().is_none())
                            .count();
                        if found.error().is_none() && led == partitions as usize {
                            return Ok(());
                        }
                        seen = format!("{led} of {partitions} partitions have a leader");
                    }
                }
                Err(error) => seen = error.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Error::Timeout {
            what: format!("leaders for every partition of `{topic}`"),
            after: timeout,
            detail: seen,
        })
    })
    .await
}

/// The number of partitions of `topic`, or `None` when it does not exist.
pub(crate) async fn partition_count(
    options: &ClientOptions,
    topic: &str,
    timeout: Duration,
) -> Result<Option<i32>> {
    Ok(shape(options, topic, timeout)
        .await?
        .map(|(partitions, _)| partitions))
}

/// How many replicas the first partition of `topic` has (`None`: no such topic).
pub(crate) async fn replica_count(
    options: &ClientOptions,
    topic: &str,
    timeout: Duration,
) -> Result<Option<usize>> {
    Ok(shape(options, topic, timeout)
        .await?
        .map(|(_, replicas)| replicas))
}

/// `topic`'s partition count and its first partition's replica count, or `None` when it
/// does not exist.
async fn shape(
    options: &ClientOptions,
    topic: &str,
    timeout: Duration,
) -> Result<Option<(i32, usize)>> {
    let consumer: BaseConsumer = options
        .config(&[])
        .create()
        .map_err(|e| kafka_error("create metadata client", e))?;
    let topic = topic.to_owned();
    blocking("fetch topic metadata", move || {
        let operation = format!("fetch metadata of `{topic}`");
        let metadata = consumer
            .fetch_metadata(Some(&topic), timeout)
            .map_err(|e| kafka_error(&operation, e))?;
        // A topic the principal may not describe is listed with an error; it is not missing.
        if let Some(code) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .and_then(|t| t.error())
            .map(RDKafkaErrorCode::from)
            .filter(|code| *code == RDKafkaErrorCode::TopicAuthorizationFailed)
        {
            return Err(kafka_error(operation, KafkaError::MetadataFetch(code)));
        }
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| {
                let replicas = t.partitions().first().map_or(0, |p| p.replicas().len());
                (t.partitions().len() as i32, replicas)
            }))
    })
    .await
}

/// The value of topic-level setting `name` for `topic`, as the broker reports it.
pub(crate) async fn topic_config(
    options: &ClientOptions,
    topic: &str,
    name: &str,
    timeout: Duration,
) -> Result<Option<String>> {
    let operation = format!("describe the configuration of `{topic}`");
    let admin: AdminClient<DefaultClientContext> = options
        .config(&[])
        .create()
        .map_err(|e| kafka_error(&operation, e))?;
    let resources = [ResourceSpecifier::Topic(topic)];
    let results = admin
        .describe_configs(
            &resources,
            &AdminOptions::new().request_timeout(Some(timeout)),
        )
        .await
        .map_err(|e| kafka_error(&operation, e))?;
    for result in results {
        let resource = result.map_err(|code| kafka_error(&operation, KafkaError::AdminOp(code)))?;
        if let Some(entry) = resource.get(name) {
            return Ok(entry.value.clone());
        }
    }
    Ok(None)
}

/// Creates a topic onceflow owns when it does not exist yet; another client creating it
/// at the same moment is fine.
pub(crate) async fn ensure_topic(
    options: &ClientOptions,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
    timeout: Duration,
) -> Result<()> {
    if partition_count(options, name, timeout).await?.is_some() {
        return Ok(());
    }
    tracing::info!(topic = name, partitions, "creating topic");
    match create_topic(options, name, partitions, configs, timeout).await {
        Err(error)
            if error.has_code(super::error::code_of(RDKafkaErrorCode::TopicAlreadyExists)) =>
        {
            Ok(())
        }
        other => other,
    }
}
