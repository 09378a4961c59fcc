//! Catching up: the group's stable committed offsets read, each partition's changelog
//! replayed to them, and where each partition must go on from decided.

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::state::Floor;
use super::{HOLD_AFTER_ASSIGNMENT, Resync};
use crate::Result;
use crate::config::DeliveryMode;
use crate::engine::backoff::{RECOVERY_PATIENCE, retry_transient, retry_transient_for};
use crate::engine::seams::Cancel;
use crate::engine::seams::{Restore, Source};
use crate::engine::stats::Phase;

impl<R: Restore, N> Resync<'_, R, N> {
    /// Brings the transaction log of `partitions` up to what the group committed: reads
    /// the group's stable committed offsets (a transaction that is still committing its
    /// offsets is waited for), then replays each partition's changelog until its progress
    /// records reach them. Returns the committed offsets.
    pub(in crate::engine) async fn catch_up<C: Source>(
        &self,
        consumer: &C,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>> {
        self.holding(
            consumer,
            HOLD_AFTER_ASSIGNMENT,
            self.catch_up_now(consumer, partitions),
        )
        .await
    }

    pub(super) async fn catch_up_now<C: Source>(
        &self,
        consumer: &C,
        partitions: &[i32],
    ) -> Result<Vec<(i32, Option<i64>)>> {
        // Patient: the group coordinator may be moving (NotCoordinator) after a fault.
        let committed =
            retry_transient_for("read the committed offsets", RECOVERY_PATIENCE, || {
                consumer.committed(partitions.to_vec())
            })
            .await?;
        // At most once commits before it processes: the changelog lags the committed
        // offsets by design, so there is nothing to wait for.
        let must_reach = self.config.delivery != DeliveryMode::AtMostOnce;
        self.stats.set_phase(Phase::Replaying);
        // Each replay is mostly waiting on the broker (its readers' connections, offsets
        // and fetches: 134-776 ms for an empty partition), so up to `replay_concurrency`
        // partitions are replayed side by side. After a failed replay no more are
        // started, and those under way are waited for, so none is left writing to the
        // log behind the caller.
        // Dropped before they end (the hold gave up: the consumer was fenced, or the
        // instance stops), the replays are cancelled: a read on the blocking pool must
        // not go on applying older records after the engine moved on (hole B).
        let cancel = Cancel::default();
        let cancel_on_drop = cancel.on_drop();
        let at_once = self.config.replay_concurrency.max(1);
        let mut queued = committed.iter().copied();
        let mut running = FuturesUnordered::new();
        let mut failed = None;
        loop {
            while failed.is_none() && running.len() < at_once {
                let Some((partition, offset)) = queued.next() else {
                    break;
                };
                let cancel = &cancel;
                running.push(retry_transient("replay the changelog", move || {
                    self.restore
                        .restore(partition, offset.filter(|_| must_reach), cancel)
                }));
            }
            match running.next().await {
                Some(Ok(())) => {}
                Some(Err(error)) => {
                    failed.get_or_insert(error);
                }
                None => break,
            }
        }
        drop(running);
        cancel_on_drop.disarm();
        if let Some(error) = failed {
            return Err(error);
        }
        let committed = self.read_again_where_unsure(consumer, committed).await?;
        let mut positions = Vec::with_capacity(committed.len());
        for (partition, offset) in committed {
            positions.push((partition, self.go_on_from(partition, offset)?));
        }
        Ok(positions)
    }

    /// `committed`, read again for the partitions read with no committed offset whose
    /// replayed changelog shows a commit (exactly once only). The changelog's progress
    /// commits in the same transaction as the group's offsets, so the first read came
    /// before that commit's markers landed (a commit in doubt, hole M of issue 40): the
    /// replay waited for them, so a read now sees the offsets. Taken for a new group, the
    /// partition would start at its beginning, and the batch's records that no dedup
    /// entry stops (refused ones, records without an ID) would be done again.
    pub(super) async fn read_again_where_unsure<C: Source>(
        &self,
        consumer: &C,
        mut committed: Vec<(i32, Option<i64>)>,
    ) -> Result<Vec<(i32, Option<i64>)>> {
        if self.config.delivery != DeliveryMode::ExactlyOnce {
            return Ok(committed);
        }
        let mut unsure = Vec::new();
        for (partition, offset) in &committed {
            if offset.is_none() && self.restore.progress(*partition)?.is_some() {
                unsure.push(*partition);
            }
        }
        if unsure.is_empty() {
            return Ok(committed);
        }
        let again = retry_transient_for("read the committed offsets", RECOVERY_PATIENCE, || {
            consumer.committed(unsure.clone())
        })
        .await?;
        for (partition, offset) in again {
            tracing::info!(
                partition,
                committed = ?offset,
                "no committed offset was read before the replay, but the changelog shows a \
                 commit: read again"
            );
            if let Some(entry) = committed.iter_mut().find(|(p, _)| *p == partition) {
                entry.1 = offset;
            }
        }
        Ok(committed)
    }

    /// Where `partition` goes on from, the group's committed offset read as `committed`:
    /// there, unless the changelog just replayed shows a batch committed past it. The
    /// changelog's progress commits in the same transaction as the offsets, so it is
    /// never ahead of what committed; the offsets read may lag a commit whose outcome was
    /// in doubt (seen after a killed coordinator). They are read before the replay, so a
    /// replay that outlasts the session (the instance cut off the network while catching
    /// up, seen in the cut soak test) also sees the commits of the partition's new owner:
    /// the instance is a zombie for it then (the group's generation check refuses its
    /// offsets, KIP-447), and the revocation its next poll serves forgets the floor. With
    /// no committed offset at all, the group starts afresh (a new group, or an input made
    /// again) and nothing is skipped.
    /// Going past the committed offset is exactly once's only: at least once lands the
    /// changelog before it commits the offsets, so its changelog may rightly be ahead, and
    /// the batch is processed again (that is its guarantee); at most once commits the
    /// offsets first. The floor is set in every mode.
    pub(super) fn go_on_from(&self, partition: i32, committed: Option<i64>) -> Result<Option<i64>> {
        let Some(committed) = committed else {
            // Nothing committed: the partition starts at its beginning (the consumer's
            // `auto.offset.reset` is `earliest`), and a first record past offset 0 is
            // sought back to the beginning once, as any start past its floor.
            if self.config.delivery == DeliveryMode::ExactlyOnce
                && let Some(progress) = self.restore.progress(partition)?
            {
                // Read twice (see `read_again_where_unsure`): the group's offsets were
                // removed (they expired, or the input was deleted and made again), and
                // its state is kept.
                tracing::warn!(
                    partition,
                    progress,
                    "the group has no committed offset, but the changelog shows work \
                     committed up to here: the group's offsets were removed (expired or \
                     deleted, or the input topic was made again); starting the partition \
                     at its beginning with the state kept (records with an ID already \
                     done are dropped as copies)"
                );
            }
            let floor = Floor {
                at: 0,
                seek_to: None,
                seen_before_seek: None,
            };
            self.state
                .floor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(partition, floor);
            return Ok(None);
        };
        let progress = if self.config.delivery == DeliveryMode::ExactlyOnce {
            self.restore.progress(partition)?
        } else {
            None
        };
        let at = match progress {
            Some(progress) if progress > committed => {
                tracing::warn!(
                    partition,
                    committed,
                    progress,
                    "the changelog shows work committed past the group's committed offset \
                     read before the replay (a commit whose outcome was in doubt, or the \
                     commits of a new owner while the replay ran); going on after it"
                );
                progress
            }
            _ => committed,
        };
        self.state
            .floor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                partition,
                Floor {
                    at,
                    seek_to: Some(at),
                    seen_before_seek: None,
                },
            );
        Ok(Some(at))
    }
}
