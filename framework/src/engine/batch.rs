//! One batch: process every record, then commit outputs, changelog and offsets together.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::{DeliveryMode, EngineConfig};
use crate::engine::crash_point;
use crate::engine::stats::Stats;
use crate::event::{Codec, Event, Json};
use crate::kafka::{self, InputConsumer, OutputProducer, Pending};
use crate::processor::{Context, Output, Processor, RecordMeta};
use crate::txlog::{Change, Overlay, TxLog};
use crate::{Error, Result};

/// Attempts at a record whose processing fails transiently, before the batch fails.
const TRANSIENT_ATTEMPTS: u32 = 5;
/// Dedup entries expired per partition per batch, at most: expiry keeps pace with load
/// without making any one batch large.
const EXPIRE_PER_BATCH: usize = 1_000;

pub(super) struct Batch<'a> {
    pub(super) config: &'a EngineConfig,
    pub(super) consumer: &'a InputConsumer,
    pub(super) producer: &'a OutputProducer,
    pub(super) txlog: &'a Arc<TxLog>,
    pub(super) stats: &'a Arc<Stats>,
    pub(super) declared: &'a BTreeSet<String>,
    pub(super) changelog: &'a str,
}

impl Batch<'_> {
    /// Processes `records` and commits the result. On error nothing of the batch is
    /// committed (exactly-once) and the caller aborts and rewinds.
    pub(super) async fn run<P: Processor>(
        &self,
        processor: &mut P,
        records: Vec<kafka::Record>,
    ) -> Result<()> {
        let config = self.config;
        let next_offsets = next_offsets(&records);
        match config.delivery {
            DeliveryMode::ExactlyOnce => self.producer.begin()?,
            DeliveryMode::AtMostOnce => self.consumer.commit(next_offsets.clone()).await?,
            DeliveryMode::AtLeastOnce => {}
        }

        let now_ms = now_ms();
        let mut overlay = Overlay::new();
        let mut pending_outputs = Vec::new();
        let mut duplicates = 0u64;
        for record in &records {
            let event_id = self.event_id::<P>(record)?;
            if let Some(id) = &event_id
                && (overlay.is_processed(record.partition, id)
                    || self.txlog.is_processed(record.partition, id)?)
            {
                tracing::debug!(
                    partition = record.partition,
                    offset = record.offset,
                    id,
                    "duplicate skipped"
                );
                duplicates += 1;
                continue;
            }
            let meta = RecordMeta {
                topic: record.topic.clone(),
                partition: record.partition,
                offset: record.offset,
                timestamp_ms: record.timestamp_ms,
                headers: record.headers.clone(),
                event_id: event_id.clone(),
            };
            let (outputs, writes) = self.process_one(processor, record, &meta, &overlay).await?;
            crash_point!("onceflow-after-process");
            merge(&mut overlay, writes);
            for output in outputs {
                pending_outputs.push(
                    self.producer
                        .send(
                            &output.topic,
                            None,
                            output.key.as_deref(),
                            Some(&output.value),
                        )
                        .await?,
                );
            }
            crash_point!("onceflow-after-produce");
            if let Some(id) = event_id {
                overlay.mark_processed(record.partition, id, record.offset, now_ms);
            }
        }
        self.expire(&mut overlay, &next_offsets, now_ms)?;

        let changes = if overlay.is_empty() {
            Vec::new()
        } else {
            overlay.into_changes()
        };
        let mut pending_changelog: Vec<(i32, Pending)> = Vec::new();
        for (partition, list) in &changes {
            for change in list {
                let (key, value) = change.encode();
                let pending = self
                    .producer
                    .send(
                        self.changelog,
                        Some(*partition),
                        Some(&key),
                        value.as_deref(),
                    )
                    .await?;
                pending_changelog.push((*partition, pending));
            }
        }

        crash_point!("onceflow-before-send-offsets");
        match config.delivery {
            DeliveryMode::ExactlyOnce => {
                self.producer
                    .send_offsets(self.consumer, &config.input_topic, next_offsets.clone())
                    .await?;
                crash_point!("onceflow-before-commit");
                self.producer.commit().await?;
            }
            DeliveryMode::AtLeastOnce => {
                self.producer.flush().await?;
                for pending in pending_outputs.drain(..) {
                    pending.landed().await?;
                }
                crash_point!("onceflow-before-commit");
                self.consumer.commit(next_offsets.clone()).await?;
            }
            DeliveryMode::AtMostOnce => self.producer.flush().await?,
        }
        crash_point!("onceflow-after-commit-before-apply");

        // Committed: the outputs and changelog records are acknowledged; learn where the
        // changelog records landed, so replay knows where to start next time.
        let outputs = pending_outputs.len() as u64;
        drop(pending_outputs);
        let mut checkpoints: BTreeMap<i32, i64> = BTreeMap::new();
        for (partition, pending) in pending_changelog {
            let (_, offset) = pending.landed().await?;
            let next = checkpoints.entry(partition).or_insert(offset + 1);
            *next = (*next).max(offset + 1);
        }
        let expired: u64 = changes
            .iter()
            .flat_map(|(_, list)| list)
            .filter(|c| matches!(c, Change::Expired { .. }))
            .count() as u64;
        let applied: Vec<(i32, Vec<Change>, Option<i64>)> = changes
            .into_iter()
            .map(|(partition, list)| {
                let checkpoint = checkpoints.get(&partition).copied();
                (partition, list, checkpoint)
            })
            .collect();
        let txlog = Arc::clone(self.txlog);
        kafka::blocking("apply the batch to the transaction log", move || {
            txlog.apply(&applied)
        })
        .await?;

        Stats::add(&self.stats.records_in, records.len() as u64);
        Stats::add(&self.stats.outputs, outputs);
        Stats::add(&self.stats.duplicates_skipped, duplicates);
        Stats::add(&self.stats.expired_entries, expired);
        Stats::add(&self.stats.commits, 1);
        tracing::debug!(
            records = records.len(),
            outputs,
            duplicates,
            "batch committed"
        );
        Ok(())
    }

    /// The event ID of a record: the decoded event's own, else the configured header's.
    fn event_id<P: Processor>(&self, record: &kafka::Record) -> Result<Option<String>> {
        let event: P::Input = decode(record)?;
        if let Some(id) = event.event_id() {
            return Ok(Some(id));
        }
        Ok(record
            .header(&self.config.event_id_header)
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned()))
    }

    /// Runs the processor on one record; a transient failure is tried again (with a fresh
    /// decode and empty writes) a few times before it fails the batch.
    async fn process_one<P: Processor>(
        &self,
        processor: &mut P,
        record: &kafka::Record,
        meta: &RecordMeta,
        batch: &Overlay,
    ) -> Result<(Vec<Output>, Overlay)> {
        let mut attempt = 1;
        loop {
            let input: P::Input = decode(record)?;
            let mut outputs = Vec::new();
            let mut writes = Overlay::new();
            let mut ctx = Context {
                meta,
                overlay: &mut writes,
                batch,
                txlog: self.txlog,
                outputs: &mut outputs,
                declared_outputs: self.declared,
            };
            match processor.process(input, &mut ctx).await {
                Ok(()) => return Ok((outputs, writes)),
                Err(error) if error.is_retriable() && attempt < TRANSIENT_ATTEMPTS => {
                    tracing::warn!(%error, attempt, partition = meta.partition, offset = meta.offset, "transient failure; trying again");
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Adds this batch's share of dedup expiries to the overlay.
    fn expire(&self, overlay: &mut Overlay, partitions: &[(i32, i64)], now_ms: i64) -> Result<()> {
        let window_ms = i64::try_from(self.config.dedup_window.as_millis()).unwrap_or(i64::MAX);
        let older_than = now_ms.saturating_sub(window_ms);
        for (partition, _) in partitions {
            for id in self.txlog.expired(
                *partition,
                older_than,
                self.config.dedup_max_entries,
                EXPIRE_PER_BATCH,
            )? {
                if !overlay.is_processed(*partition, &id) {
                    overlay.expire(*partition, id);
                }
            }
        }
        Ok(())
    }
}

fn decode<T: serde::de::DeserializeOwned>(record: &kafka::Record) -> Result<T> {
    Json.decode(record.value.as_deref().unwrap_or_default())
        .map_err(|message| Error::Decode {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            message,
        })
}

/// Moves one record's writes into the batch's overlay.
fn merge(batch: &mut Overlay, writes: Overlay) {
    for (partition, changes) in writes.into_changes() {
        for change in changes {
            match change {
                Change::State {
                    key,
                    value: Some(value),
                } => batch.put(partition, key, value),
                Change::State { key, value: None } => batch.delete(partition, key),
                Change::Processed {
                    id,
                    offset,
                    processed_at_ms,
                } => batch.mark_processed(partition, id, offset, processed_at_ms),
                Change::Expired { id } => batch.expire(partition, id),
            }
        }
    }
}

/// The offset after the last record of each partition: what the group commits.
fn next_offsets(records: &[kafka::Record]) -> Vec<(i32, i64)> {
    let mut next = BTreeMap::new();
    for record in records {
        next.insert(record.partition, record.offset + 1);
    }
    next.into_iter().collect()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
