//! Half messages for a service that is not a stream processor (RocketMQ's transactional
//! messages, on Kafka): send a message, run the local transaction, and the message is
//! published if and only if the local transaction committed — even when the sender dies
//! in between, because a *check-back* asks the service what happened.
//!
//! ```no_run
//! # async fn f(sender: onceflow::half::TransactionalSender) -> onceflow::Result<()> {
//! use onceflow::half::{Decision, HalfMessage};
//! let message = HalfMessage::json("o-17", "orders", "c-3", &serde_json::json!({"total": 42}))?;
//! let resolved = sender.send(message, |half| async move {
//!     // the local transaction: insert the order `half.id`, commit or roll back
//!     Decision::Commit
//! }).await?;
//! # Ok(()) }
//! ```
//!
//! # How, and the guarantee
//!
//! 1. The half message is written to `<name>-half` (a compacted topic, keyed by the
//!    message ID, the target topic and key in headers) and acknowledged by every in-sync
//!    replica **before** the local transaction runs. Consumers of the target topic never
//!    see it there.
//! 2. The local transaction runs and decides: [`Decision::Commit`] publishes the message
//!    to its topic **and** removes the half (a tombstone) in one Kafka transaction;
//!    [`Decision::Rollback`] removes the half; [`Decision::Unknown`] leaves it for the
//!    check-back.
//! 3. A checker ([`check_back`], run by any instance of the service, a consumer group
//!    of its own) keeps the halves that are still there; one older than
//!    [`HalfConfig::check_after`] is handed to the service's [`CheckBack::check`] (did the
//!    local transaction of `id` commit?), which resolves it the same way. A check that
//!    stays [`Decision::Unknown`] past its [`crate::effects::Bounds`] sends the half to
//!    `<name>-half-dlq` with the reason, an ERROR log and
//!    `onceflow_half_unresolved_total`: never dropped, never checked forever (RocketMQ
//!    drops after 15 checks).
//!
//! So a message whose local transaction committed is published, one whose local
//! transaction rolled back never is. Published messages carry `onceflow-event-id:
//! half:<id>`: a check-back that races a slow sender may publish a second copy, which
//! every onceflow processor downstream skips as a duplicate; `read_committed` readers
//! that are not onceflow processors may see both then. The check-back must answer from
//! the local transaction's own durable state (a row keyed by the message ID), and a
//! sender should finish well within `check_after`.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::effects::Bounds;
use crate::kafka::{self, ClientOptions, GroupMember, Linger, Producer, Start};
use crate::{Error, Result};

/// Header of a published message: its event ID, `half:<id>` (the engine's default
/// event-ID header, so onceflow processors deduplicate by it).
pub use crate::wire::EVENT_ID_HEADER;
pub use crate::wire::{HALF_KEY_HEADER as KEY_HEADER, HALF_TOPIC_HEADER as TOPIC_HEADER};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A message to send once its local transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HalfMessage {
    /// The message ID: the key the check-back is asked about (an order ID, say), and
    /// the published message's event ID (`half:<id>`).
    pub id: String,
    /// The topic it is published to.
    pub topic: String,
    /// Its record key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub payload: Vec<u8>,
}

impl HalfMessage {
    /// A message `id` of `value` as JSON for `topic`, keyed `key`.
    pub fn json<V: Serialize + ?Sized>(
        id: &str,
        topic: &str,
        key: &str,
        value: &V,
    ) -> Result<HalfMessage> {
        let payload = serde_json::to_vec(value).map_err(|e| Error::Encode {
            what: format!("half message {id}"),
            message: e.to_string(),
            cause: Some(Box::new(e)),
        })?;
        Ok(HalfMessage {
            id: id.to_owned(),
            topic: topic.to_owned(),
            key: Some(key.as_bytes().to_vec()),
            payload,
        })
    }
}

/// What the local transaction (or a check-back) decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It committed: publish the message.
    Commit,
    /// It rolled back: never publish.
    Rollback,
    /// Not known (yet): left for the check-back.
    Unknown(String),
}

/// How a send ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Published.
    Committed,
    /// Removed unpublished.
    RolledBack,
    /// Left for the check-back, with the reason.
    Pending(String),
}

/// The service's answer to "did the local transaction of this message commit?".
#[crate::async_trait]
pub trait CheckBack: Send + 'static {
    /// Looks the message's local transaction up (by `half.id`) in its own durable state.
    async fn check(&mut self, half: &HalfMessage) -> Decision;
}

/// Where half messages live.
#[derive(Debug, Clone)]
pub struct HalfConfig {
    /// `host:port,…` of the Kafka cluster.
    pub bootstrap_servers: String,
    /// Other librdkafka properties (security), for every client.
    pub kafka_properties: Vec<(String, String)>,
    /// The service's name: `<name>-half`, `<name>-half-dlq`, the checker's group.
    pub name: String,
    /// How old a half must be before it is checked back (default 10 s).
    pub check_after: Duration,
    /// How long a check may stay unknown (default 20 tries or 5 minutes).
    pub bounds: Bounds,
    /// Partitions of the half topic when it is created (default 3).
    pub partitions: i32,
}

impl HalfConfig {
    /// Half messages of service `name` on the cluster at `bootstrap_servers`.
    pub fn new(bootstrap_servers: impl Into<String>, name: impl Into<String>) -> Self {
        HalfConfig {
            bootstrap_servers: bootstrap_servers.into(),
            kafka_properties: Vec::new(),
            name: name.into(),
            check_after: Duration::from_secs(10),
            bounds: Bounds {
                tries: 20,
                within: Duration::from_secs(300),
            },
            partitions: 3,
        }
    }

    /// The topic of the halves.
    pub fn half_topic(&self) -> String {
        format!("{}-half", self.name)
    }

    /// The topic of the halves that no check resolved.
    pub fn dead_letter_topic(&self) -> String {
        format!("{}-half-dlq", self.name)
    }

    fn options(&self) -> ClientOptions {
        ClientOptions::with_properties(&self.bootstrap_servers, &self.kafka_properties)
    }
}

/// Creates the half and dead-letter topics when they do not exist.
async fn prepare(config: &HalfConfig) -> Result<ClientOptions> {
    let options = config.options();
    for (topic, configs) in [
        (config.half_topic(), vec![("cleanup.policy", "compact")]),
        (config.dead_letter_topic(), Vec::new()),
    ] {
        kafka::ensure_topic(&options, &topic, config.partitions, &configs, TIMEOUT).await?;
    }
    Ok(options)
}

/// Publishes a half (with its removal) in one Kafka transaction, or removes it.
struct Resolver {
    plain: Producer,
    transactional: tokio::sync::Mutex<Publisher>,
    half_topic: String,
}

/// The transactional producer that publishes halves, and whether it must be replaced
/// before its next transaction.
struct Publisher {
    producer: Producer,
    /// A publication failed on it: a request of that transaction (its commit, say) may
    /// still land later, so the next one starts on a new producer, which fences it.
    spent: bool,
}

/// How long a half's publication may stay open: the broker aborts it after that, so a
/// publisher that died mid-way holds `read_committed` readers back no longer.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

impl Resolver {
    async fn new(options: &ClientOptions, config: &HalfConfig, role: &str) -> Result<Resolver> {
        let plain = Producer::idempotent(options, Linger::Not)?;
        // Its own transactional ID per process: its transactions are short, and a copy
        // published twice (a sender and a check-back racing) is a duplicate by event ID.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let transactional_id = format!(
            "onceflow-half-{}-{role}-{}-{nanos}",
            config.name,
            std::process::id()
        );
        let producer =
            Producer::transactional(options, &transactional_id, PUBLISH_TIMEOUT, Linger::Not)
                .await?;
        Ok(Resolver {
            plain,
            transactional: tokio::sync::Mutex::new(Publisher {
                producer,
                spent: false,
            }),
            half_topic: config.half_topic(),
        })
    }

    /// Writes the half, acknowledged by every in-sync replica; returns its partition.
    async fn write(&self, half: &HalfMessage) -> Result<i32> {
        let mut headers: Vec<(&str, Option<&[u8]>)> =
            vec![(TOPIC_HEADER, Some(half.topic.as_bytes()))];
        if let Some(key) = &half.key {
            headers.push((KEY_HEADER, Some(key.as_slice())));
        }
        self.send(
            &self.half_topic,
            None,
            &half.id,
            Some(&half.payload),
            &headers,
        )
        .await
    }

    /// Sends a record keyed `id` outside any transaction and waits until every in-sync
    /// replica has it; returns its partition.
    async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        id: &str,
        value: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
    ) -> Result<i32> {
        let sent = self
            .plain
            .send_with_headers(topic, partition, Some(id.as_bytes()), value, headers, None)
            .await?;
        Ok(sent.landed().await?.0)
    }

    /// Removes the half at `partition` unpublished.
    async fn remove(&self, id: &str, partition: i32) -> Result<()> {
        self.send(&self.half_topic, Some(partition), id, None, &[])
            .await
            .map(|_| ())
    }

    /// Publishes the message and removes the half at `partition`, in one transaction.
    async fn publish(&self, half: &HalfMessage, partition: i32) -> Result<()> {
        let mut publisher = self.transactional.lock().await;
        if publisher.spent {
            publisher.producer = publisher.producer.replaced().await?;
            publisher.spent = false;
        }
        let producer = &publisher.producer;
        let event_id = format!("half:{}", half.id);
        let published = async {
            producer.begin()?;
            let published = producer
                .send_with_headers(
                    &half.topic,
                    None,
                    half.key.as_deref(),
                    Some(half.payload.as_slice()),
                    &[(EVENT_ID_HEADER, Some(event_id.as_bytes()))],
                    None,
                )
                .await?;
            let removed = producer
                .send_with_headers(
                    &self.half_topic,
                    Some(partition),
                    Some(half.id.as_bytes()),
                    None,
                    &[],
                    None,
                )
                .await?;
            published.landed().await?;
            removed.landed().await?;
            producer.commit().await
        }
        .await;
        if let Err(error) = published {
            if let Err(abort) = producer.abort().await {
                tracing::debug!(%abort, "aborting a half's publication");
            }
            publisher.spent = true;
            return Err(error);
        }
        Ok(())
    }
}

/// Sends half messages; see the [module](self).
pub struct TransactionalSender {
    resolver: Resolver,
}

impl std::fmt::Debug for TransactionalSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalSender")
            .field("half_topic", &self.resolver.half_topic)
            .finish_non_exhaustive()
    }
}

impl TransactionalSender {
    /// A sender for service `config.name` (creates its topics when missing).
    pub async fn new(config: &HalfConfig) -> Result<TransactionalSender> {
        let options = prepare(config).await?;
        Ok(TransactionalSender {
            resolver: Resolver::new(&options, config, "sender").await?,
        })
    }

    /// Writes `message` as a half, runs `local` (the local transaction) and resolves the
    /// half as it decides. A failure after the half was written leaves it to the
    /// check-back (`Resolved::Pending`), never to chance.
    pub async fn send<F, Fut>(&self, message: HalfMessage, local: F) -> Result<Resolved>
    where
        F: FnOnce(HalfMessage) -> Fut,
        Fut: Future<Output = Decision>,
    {
        let partition = self.resolver.write(&message).await?;
        let decided = local(message.clone()).await;
        // A sender that dies here, its local transaction ended and the half unresolved,
        // is what the check-back is for (the tests crash a child process here).
        crate::crash::crash_point!("onceflow-half-after-local");
        let resolved = match decided {
            Decision::Commit => self
                .resolver
                .publish(&message, partition)
                .await
                .map(|()| Resolved::Committed),
            Decision::Rollback => self
                .resolver
                .remove(&message.id, partition)
                .await
                .map(|()| Resolved::RolledBack),
            Decision::Unknown(why) => Ok(Resolved::Pending(why)),
        };
        Ok(resolved.unwrap_or_else(|error| {
            tracing::warn!(id = %message.id, %error, "resolving a half message failed; the check-back will");
            Resolved::Pending(error.to_string())
        }))
    }
}

/// What a checker did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckStats {
    /// Halves checked back (each check counted).
    pub checks: u64,
    /// Halves the checks published.
    pub committed: u64,
    /// Halves the checks removed.
    pub rolled_back: u64,
    /// Halves dead-lettered unresolved.
    pub unresolved: u64,
}

/// A half the checker holds: where it is, since when, how often checked.
struct Held {
    half: HalfMessage,
    partition: i32,
    written_ms: i64,
    tries: u32,
    first_check: Option<Instant>,
}

/// Checks back the halves of service `config.name` until `stop` resolves; see the
/// [module](self). Run it in any instance of the service (several share the work).
pub async fn check_back<C: CheckBack>(
    config: HalfConfig,
    mut checker: C,
    stop: impl Future<Output = ()>,
) -> Result<CheckStats> {
    let options = prepare(&config).await?;
    let resolver = Resolver::new(&options, &config, "checker").await?;
    let half_topic = config.half_topic();
    let group = format!("onceflow-half-{}-checker", config.name);
    // No offsets are committed: each assignment reads its partitions from the start
    // (compacted: what is left is what is unresolved).
    let member = GroupMember::join(&options, &group, &half_topic, Start::Earliest, None)?;
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    let mut stats = CheckStats::default();
    let mut stop = std::pin::pin!(stop);
    let mut last_check = Instant::now();
    loop {
        // Take in what arrived: halves, and their removals.
        while let Some(polled) = member.poll() {
            let Ok(record) = polled else { continue };
            let id = record.key_str();
            match &record.value {
                None => {
                    held.remove(&id);
                }
                Some(payload) => {
                    let topic = record
                        .header(TOPIC_HEADER)
                        .map(|t| String::from_utf8_lossy(t).into_owned())
                        .unwrap_or_default();
                    held.insert(
                        id.clone(),
                        Held {
                            half: HalfMessage {
                                id,
                                topic,
                                key: record.header(KEY_HEADER).map(<[u8]>::to_vec),
                                payload: payload.clone(),
                            },
                            partition: record.partition,
                            written_ms: record.timestamp_ms.unwrap_or(0),
                            tries: 0,
                            first_check: None,
                        },
                    );
                }
            }
        }
        // Forget what moved to another checker.
        if let Ok(mine) = member.assigned() {
            held.retain(|_, h| mine.contains(&h.partition));
        }
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let due: Vec<String> = held
                .iter()
                .filter(|(_, h)| now_ms - h.written_ms >= config.check_after.as_millis() as i64)
                .map(|(id, _)| id.clone())
                .collect();
            for id in due {
                let Some(entry) = held.get_mut(&id) else {
                    continue;
                };
                stats.checks += 1;
                entry.tries += 1;
                let first = *entry.first_check.get_or_insert_with(Instant::now);
                let resolved = match checker.check(&entry.half).await {
                    Decision::Commit => resolver
                        .publish(&entry.half, entry.partition)
                        .await
                        .map(|()| stats.committed += 1),
                    Decision::Rollback => resolver
                        .remove(&id, entry.partition)
                        .await
                        .map(|()| stats.rolled_back += 1),
                    Decision::Unknown(why)
                        if entry.tries >= config.bounds.tries
                            || first.elapsed() >= config.bounds.within =>
                    {
                        tracing::error!(%id, tries = entry.tries, %why, "half message unresolved past its bounds; dead-lettered for a person to resolve");
                        metrics::counter!("onceflow_half_unresolved_total").increment(1);
                        dead_letter(
                            &resolver,
                            &config,
                            &entry.half,
                            entry.partition,
                            entry.tries,
                            &why,
                        )
                        .await
                        .map(|()| stats.unresolved += 1)
                    }
                    Decision::Unknown(why) => {
                        tracing::warn!(%id, tries = entry.tries, %why, "half message still unknown; asking again later");
                        continue;
                    }
                };
                match resolved {
                    // The removal comes back through the consumer; until then it is held
                    // (checked again only after the next `check_after`).
                    Ok(()) => {
                        held.remove(&id);
                    }
                    Err(error) => {
                        tracing::warn!(%id, %error, "resolving a half message failed; trying again")
                    }
                }
            }
        }
        tokio::select! {
            () = &mut stop => return Ok(stats),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Writes an unresolved half to the dead-letter topic with the reason, then removes it.
async fn dead_letter(
    resolver: &Resolver,
    config: &HalfConfig,
    half: &HalfMessage,
    partition: i32,
    tries: u32,
    why: &str,
) -> Result<()> {
    let reason = format!("unresolved after {tries} check-backs: {why}");
    let tries = tries.to_string();
    let headers: [(&str, Option<&[u8]>); 3] = [
        (TOPIC_HEADER, Some(half.topic.as_bytes())),
        (crate::wire::DLQ_ERROR_MESSAGE, Some(reason.as_bytes())),
        (crate::wire::DLQ_ATTEMPTS, Some(tries.as_bytes())),
    ];
    let topic = config.dead_letter_topic();
    resolver
        .send(&topic, None, &half.id, Some(&half.payload), &headers)
        .await?;
    resolver.remove(&half.id, partition).await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;

    use super::{HalfConfig, HalfMessage, Resolver};
    use crate::kafka::ClientOptions;

    /// librdkafka's mock cluster drives the error (no exactly-once claim). A publication
    /// that failed (here its removal went to a partition that does not exist) may have
    /// left a request in flight that lands later: the next publication starts on a new
    /// producer, whose initialisation fences the old one, and publishes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_publication_replaces_the_publisher_before_the_next() {
        let mock: MockCluster<'_, DefaultProducerContext> =
            MockCluster::new(1).expect("mock cluster");
        let config = HalfConfig::new(mock.bootstrap_servers(), "shop");
        mock.create_topic(&config.half_topic(), 1, 1)
            .expect("topic");
        mock.create_topic("orders", 1, 1).expect("topic");
        let options = ClientOptions::with_properties(mock.bootstrap_servers(), &[]);
        let resolver = Resolver::new(&options, &config, "test")
            .await
            .expect("resolver");
        let half = HalfMessage::json("o-1", "orders", "o-1", &1).expect("message");
        let partition = resolver.write(&half).await.expect("written");
        let first = resolver.transactional.lock().await.producer.instance();

        let failed = tokio::time::timeout(
            Duration::from_secs(30),
            resolver.publish(&half, partition + 7),
        )
        .await
        .expect("within the transaction timeout");
        assert!(failed.is_err(), "partition {} of 1", partition + 7);
        assert!(resolver.transactional.lock().await.spent);

        resolver.publish(&half, partition).await.expect("published");
        let publisher = resolver.transactional.lock().await;
        assert!(!publisher.spent);
        assert_ne!(publisher.producer.instance(), first, "a new producer");
    }
}
