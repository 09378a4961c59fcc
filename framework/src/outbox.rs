//! The transactional outbox for a service that owns a PostgreSQL database (feature
//! `outbox`): business rows and the message that announces them are written in **one
//! database transaction**, and a relay publishes the messages to Kafka exactly once.
//!
//! ```no_run
//! # async fn f(pool: onceflow::outbox::sqlx::PgPool) -> onceflow::Result<()> {
//! use onceflow::outbox::{self, Message};
//! outbox::install(&pool).await?; // once: the table `onceflow_outbox`
//! let mut tx = pool.begin().await.map_err(outbox::db_error)?;
//! // sqlx::query("INSERT INTO orders ...").execute(&mut *tx).await?;
//! outbox::enqueue(&mut tx, &Message::json("orders", "o-17", &serde_json::json!({"total": 42}))?).await?;
//! tx.commit().await.map_err(outbox::db_error)?;
//! # Ok(()) }
//! ```
//!
//! # The guarantee
//!
//! - A message is published if and only if the transaction that enqueued it committed:
//!   a rolled-back transaction's rows never exist, so never reach Kafka.
//! - Each message is published **once** as `read_committed` readers see it: the relay
//!   writes a batch of messages and its position (a *progress* record on
//!   `<name>-outbox-progress`) in one Kafka transaction, and resumes after a crash from the
//!   last committed position, so an aborted batch is written again and the aborted copy
//!   is never visible. Each message also carries its row as its event ID (header
//!   `onceflow-event-id`, `outbox:<id>`), so an onceflow processor downstream skips a copy
//!   even a `read_uncommitted` path let through.
//! - **In order**: messages are published in the order of their transactions' IDs, then of
//!   their rows. A row is published only once every transaction that started before it
//!   has ended (PostgreSQL's snapshot `xmin`), so a transaction that commits late never has
//!   its rows skipped by a position that already moved past them: the classic hole of an
//!   outbox read by `id > last` is closed. Messages of one key (one partition) therefore
//!   keep their transactions' order.
//! - **One relay active**: several may run; the one the group `onceflow-outbox-<name>` gives
//!   the progress topic's single partition publishes, the others wait. The active one's
//!   transactional ID is fixed (`onceflow-outbox-<name>`) and its offsets go with every
//!   transaction, so a relay replaced while it hung is fenced (by the ID and by the
//!   group's generation) and cannot publish anything after its successor started.
//!
//! Published rows are deleted after their transaction committed (a crash in between
//! leaves rows behind the position, never read again). Limits: a transaction kept open
//! for long holds every later message back (that is the price of order); rows of one
//! transaction are published together in one Kafka transaction, or split into several
//! when there are more than the relay's batch.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use sqlx;
use sqlx::{PgConnection, PgPool, Row};

use crate::kafka::{self, ClientOptions, GroupMember, Linger, Producer, Start};
use crate::{Error, Result};

/// The header carrying each message's event ID (the engine's default event-ID header).
pub use crate::wire::EVENT_ID_HEADER;

/// A message to publish, as a service enqueues it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The Kafka topic.
    pub topic: String,
    /// The record key (its partition, and so its order).
    pub key: Option<Vec<u8>>,
    /// The record value.
    pub payload: Vec<u8>,
    /// Headers besides the event ID.
    pub headers: Vec<(String, String)>,
}

impl Message {
    /// A message of `value` as JSON with `key`.
    pub fn json<V: Serialize + ?Sized>(topic: &str, key: &str, value: &V) -> Result<Message> {
        let payload = serde_json::to_vec(value).map_err(|e| Error::Encode {
            what: format!("an outbox message for `{topic}`"),
            message: e.to_string(),
            cause: Some(Box::new(e)),
        })?;
        Ok(Message {
            topic: topic.to_owned(),
            key: Some(key.as_bytes().to_vec()),
            payload,
            headers: Vec::new(),
        })
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// A database error as onceflow's.
pub fn db_error(error: sqlx::Error) -> Error {
    Error::Outbox {
        what: "the database".into(),
        cause: Some(Box::new(error)),
    }
}

/// Creates the outbox table and its index when they do not exist.
pub async fn install(pool: &PgPool) -> Result<()> {
    for statement in [
        "CREATE TABLE IF NOT EXISTS onceflow_outbox (
             id BIGSERIAL PRIMARY KEY,
             xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
             topic TEXT NOT NULL,
             key BYTEA,
             payload BYTEA NOT NULL,
             headers JSONB NOT NULL DEFAULT '[]',
             created_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
        "CREATE INDEX IF NOT EXISTS onceflow_outbox_order ON onceflow_outbox (xid, id)",
    ] {
        sqlx::query(statement)
            .execute(pool)
            .await
            .map_err(db_error)?;
    }
    Ok(())
}

/// Enqueues `message` in the caller's transaction (`&mut tx` of `pool.begin()`): it is
/// published if and only if that transaction commits. Returns the row's ID.
pub async fn enqueue(connection: &mut PgConnection, message: &Message) -> Result<i64> {
    let headers = serde_json::to_value(&message.headers).map_err(|e| Error::Encode {
        what: "outbox headers".into(),
        message: e.to_string(),
        cause: Some(Box::new(e)),
    })?;
    let row = sqlx::query(
        "INSERT INTO onceflow_outbox (topic, key, payload, headers) VALUES ($1, $2, $3, $4)
         RETURNING id",
    )
    .bind(&message.topic)
    .bind(message.key.as_deref())
    .bind(&message.payload)
    .bind(headers)
    .fetch_one(connection)
    .await
    .map_err(db_error)?;
    row.try_get::<i64, _>("id").map_err(db_error)
}

/// Where the relay stands: the last published row, by (transaction ID, row ID).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    /// The transaction ID (`xid8`) of the last published row.
    pub xid: u64,
    /// Its row ID.
    pub id: i64,
}

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// `host:port,…` of the Kafka cluster.
    pub bootstrap_servers: String,
    /// Other librdkafka properties (security), for every client.
    pub kafka_properties: Vec<(String, String)>,
    /// The relay's name: its progress topic, group and transactional ID derive from it.
    pub name: String,
    /// Messages per Kafka transaction at most (default 500).
    pub batch: i64,
    /// How long to wait when the outbox is empty (default 100 ms).
    pub idle: Duration,
    /// The transaction timeout (default 10 s).
    pub transaction_timeout: Duration,
}

impl RelayConfig {
    /// A relay named `name` for the cluster at `bootstrap_servers`.
    pub fn new(bootstrap_servers: impl Into<String>, name: impl Into<String>) -> Self {
        RelayConfig {
            bootstrap_servers: bootstrap_servers.into(),
            kafka_properties: Vec::new(),
            name: name.into(),
            batch: 500,
            idle: Duration::from_millis(100),
            transaction_timeout: Duration::from_secs(10),
        }
    }

    /// The topic of the relay's position.
    pub fn progress_topic(&self) -> String {
        format!("{}-outbox-progress", self.name)
    }

    fn options(&self) -> ClientOptions {
        ClientOptions::with_properties(&self.bootstrap_servers, &self.kafka_properties)
    }
}

/// What a relay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Messages published (in committed transactions).
    pub published: u64,
    /// Kafka transactions committed.
    pub transactions: u64,
    /// Times this relay became the active one.
    pub activations: u64,
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// Publishes the outbox of `pool` until `stop` resolves; see the [module](self).
/// Waits as a standby while another relay of the same name is active.
pub async fn relay(
    pool: PgPool,
    config: RelayConfig,
    stop: impl Future<Output = ()>,
) -> Result<RelayStats> {
    let options = config.options();
    let progress = config.progress_topic();
    kafka::ensure_topic(
        &options,
        &progress,
        1,
        &[("cleanup.policy", "compact")],
        TIMEOUT,
    )
    .await?;
    let group = format!("onceflow-outbox-{}", config.name);
    // Left at the end of the progress topic: the member is there for its membership.
    let membership = GroupMember::join(
        &options,
        &group,
        &progress,
        Start::Latest,
        Some(Duration::from_secs(6)),
    )?;
    let mut stats = RelayStats::default();
    let mut active: Option<Active> = None;
    let mut stop = std::pin::pin!(stop);
    let mut failures = 0u32;
    loop {
        // Membership: polled on every turn, so the group sees the relay alive.
        if let Some(Err(error)) = membership.poll() {
            tracing::debug!(%error, "relay's group member");
        }
        let owns = membership.owns_partitions();
        if !owns {
            if active.take().is_some() {
                tracing::warn!(relay = %config.name, "no longer the active relay");
            }
            tokio::select! {
                () = &mut stop => return Ok(stats),
                () = tokio::time::sleep(Duration::from_millis(200)) => continue,
            }
        }
        if active.is_none() {
            match Active::start(&options, &config, &progress).await {
                Ok(started) => {
                    tracing::info!(relay = %config.name, position = ?started.position, "active relay");
                    stats.activations += 1;
                    active = Some(started);
                }
                Err(error) => {
                    failures += 1;
                    tracing::warn!(%error, failures, "could not become the active relay");
                    tokio::select! {
                        () = &mut stop => return Ok(stats),
                        () = tokio::time::sleep(backoff(failures)) => continue,
                    }
                }
            }
        }
        let turn = active
            .as_mut()
            .expect("active above")
            .publish(&pool, &config, &progress, &membership)
            .await;
        let idle = match turn {
            Ok(0) => {
                failures = 0;
                true
            }
            Ok(published) => {
                failures = 0;
                stats.published += published;
                stats.transactions += 1;
                false
            }
            Err(error) => {
                failures += 1;
                tracing::warn!(%error, failures, "relay batch failed; starting again from the committed position");
                // A new producer (fencing whatever the old one left open) and the
                // position read again.
                active = None;
                tokio::select! {
                    () = &mut stop => return Ok(stats),
                    () = tokio::time::sleep(backoff(failures)) => continue,
                }
            }
        };
        if idle {
            tokio::select! {
                () = &mut stop => return Ok(stats),
                () = tokio::time::sleep(config.idle) => {}
            }
        }
    }
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100 * (1 << failures.min(6))).min(Duration::from_secs(5))
}

/// The active relay: its transactional producer and its position.
struct Active {
    producer: Producer,
    position: Position,
}

impl Active {
    /// A transactional producer (fencing a predecessor) and the last committed position.
    async fn start(options: &ClientOptions, config: &RelayConfig, progress: &str) -> Result<Self> {
        let transactional_id = format!("onceflow-outbox-{}", config.name);
        let producer = Producer::transactional(
            options,
            &transactional_id,
            config.transaction_timeout,
            Linger::Batches,
        )
        .await?;
        let (options, topic) = (options.clone(), progress.to_owned());
        let position = crate::blocking::blocking("read the relay's position", move || {
            last_position(&options, &topic)
        })
        .await?;
        Ok(Active { producer, position })
    }

    /// Publishes the next batch in one transaction with the new position; the number of
    /// messages published.
    async fn publish(
        &mut self,
        pool: &PgPool,
        config: &RelayConfig,
        progress: &str,
        membership: &GroupMember,
    ) -> Result<u64> {
        let rows = sqlx::query(
            // `xid_text`, not `xid`: ORDER BY takes an output column's name first, and
            // sorting xids as text put "1000" before "999" (the order test saw it).
            "SELECT id, xid::text AS xid_text, topic, key, payload, headers FROM onceflow_outbox
             WHERE (xid, id) > ($1::text::xid8, $2)
               AND xid < pg_snapshot_xmin(pg_current_snapshot())
             ORDER BY xid, id LIMIT $3",
        )
        .bind(self.position.xid.to_string())
        .bind(self.position.id)
        .bind(config.batch)
        .fetch_all(pool)
        .await
        .map_err(db_error)?;
        if rows.is_empty() {
            return Ok(0);
        }
        self.producer.begin()?;
        let mut last = self.position;
        let mut ids = Vec::with_capacity(rows.len());
        let mut deliveries = Vec::with_capacity(rows.len() + 1);
        for row in &rows {
            let id: i64 = row.try_get("id").map_err(db_error)?;
            let xid: String = row.try_get("xid_text").map_err(db_error)?;
            let topic: String = row.try_get("topic").map_err(db_error)?;
            let key: Option<Vec<u8>> = row.try_get("key").map_err(db_error)?;
            let payload: Vec<u8> = row.try_get("payload").map_err(db_error)?;
            let headers: serde_json::Value = row.try_get("headers").map_err(db_error)?;
            let headers: Vec<(String, String)> =
                serde_json::from_value(headers).unwrap_or_default();
            let event_id = format!("outbox:{id}");
            let mut owned: Vec<(&str, Option<&[u8]>)> = Vec::with_capacity(headers.len() + 1);
            owned.push((EVENT_ID_HEADER, Some(event_id.as_bytes())));
            owned.extend(
                headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), Some(value.as_bytes()))),
            );
            let sent = self
                .producer
                .send_with_headers(
                    &topic,
                    None,
                    key.as_deref(),
                    Some(payload.as_slice()),
                    &owned,
                    None,
                )
                .await;
            match sent {
                Ok(delivery) => deliveries.push(delivery),
                Err(error) => return Err(self.abort(error).await),
            }
            last = Position {
                xid: xid.parse().map_err(|e| Error::Outbox {
                    what: format!("xid `{xid}`"),
                    cause: Some(Box::new(e)),
                })?,
                id,
            };
            ids.push(id);
        }
        let value = serde_json::to_vec(&last).expect("a position encodes");
        let sent = self
            .producer
            .send_with_headers(
                progress,
                Some(0),
                Some(b"position"),
                Some(value.as_slice()),
                &[],
                None,
            )
            .await;
        match sent {
            Ok(delivery) => deliveries.push(delivery),
            Err(error) => return Err(self.abort(error).await),
        }
        for delivery in deliveries {
            if let Err(error) = delivery.landed().await {
                return Err(self.abort(error).await);
            }
        }
        // The group's offsets go with the transaction: a relay that lost its turn (its
        // generation is old) cannot commit.
        let committed = async {
            let metadata = membership.group_metadata()?;
            self.producer
                .send_offsets_of(metadata, progress, vec![(0, 0)])
                .await?;
            crate::crash::crash_point!("onceflow-outbox-before-commit");
            self.producer.commit().await
        }
        .await;
        if let Err(error) = committed {
            return Err(self.abort(error).await);
        }
        self.position = last;
        metrics::counter!("onceflow_outbox_published_total").increment(ids.len() as u64);
        // Behind the position now: never read again, so a failed delete only leaves rows.
        if let Err(error) = sqlx::query("DELETE FROM onceflow_outbox WHERE id = ANY($1)")
            .bind(&ids)
            .execute(pool)
            .await
        {
            tracing::warn!(%error, "deleting published outbox rows");
        }
        Ok(ids.len() as u64)
    }

    /// Aborts the open transaction (best effort) and returns `error`. The relay then
    /// starts again on a new producer (see [`relay`]).
    async fn abort(&self, error: Error) -> Error {
        if let Err(abort) = self.producer.abort().await {
            tracing::warn!(%abort, "aborting the relay's transaction");
        }
        error
    }
}

/// The last committed position on `topic` (partition 0), or the start. The
/// predecessor's open transaction, if any, was aborted by `init_transactions`, so the
/// read does not wait long.
fn last_position(options: &ClientOptions, topic: &str) -> Result<Position> {
    let mut position = Position::default();
    kafka::read_partition_to_end(options, topic, 0, TIMEOUT, |record| {
        if let Some(value) = &record.value {
            position = serde_json::from_slice(value).map_err(|e| Error::Outbox {
                what: format!("progress record {topic}@{}", record.offset),
                cause: Some(Box::new(e)),
            })?;
        }
        Ok(())
    })?;
    Ok(position)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::db_error;

    /// The database's error stays the cause, for a caller that wants to look at it
    /// (a unique violation, say), and its text stays in the message, for the log.
    #[test]
    fn a_database_error_is_kept_as_the_cause() {
        let error = db_error(sqlx::Error::RowNotFound);
        let cause = error.source().expect("a cause");
        assert!(
            matches!(
                cause.downcast_ref::<sqlx::Error>(),
                Some(sqlx::Error::RowNotFound)
            ),
            "{cause:?}"
        );
        assert_eq!(
            error.to_string(),
            format!("outbox: the database: {}", sqlx::Error::RowNotFound)
        );
    }
}
