//! Where each partition must go on from after a catch-up (its floor): records below it
//! were committed and are dropped; a first record past it is sought back to, once.

use super::Resync;
use super::state::Placed;
use crate::engine::stats::Stats;
use crate::kafka;

impl<R, N> Resync<'_, R, N> {
    /// Keeps each partition where catching up found it must go on from (its floor): drops
    /// from `records` those below it (already committed), and when a partition's first
    /// record is past it, drops that partition's records and returns it with its floor
    /// to seek back to, once. The engine's position is the authority, not librdkafka's:
    /// the floor alone caught a start below the committed offset, not one above it, which
    /// librdkafka's pause/assign races can make (its issues 2190, 5591, 3567) and which
    /// would skip the records between for good. After the seek, a first record still
    /// past the floor is a real gap (transaction markers, compaction, retention); one
    /// lower than the first seen before it shows the position was wrong, which is logged
    /// as an error and counted (`onceflow_positions_corrected_total`). A floor is
    /// forgotten once a record of its partition is taken, so after the first poll that
    /// follows a catch-up this is one lock per poll and no look-up per record.
    pub(in crate::engine) fn drop_committed(&self, records: &mut Vec<kafka::Record>) -> Placed {
        let mut floor = self.state.floor.lock().unwrap_or_else(|e| e.into_inner());
        let mut placed = Placed::default();
        if floor.is_empty() || records.is_empty() {
            return placed;
        }
        let before = records.len();
        records.retain(|r| floor.get(&r.partition).is_none_or(|f| r.offset >= f.at));
        placed.below = before - records.len();
        if placed.below > 0 {
            Stats::add(&self.stats.already_committed, placed.below as u64);
            tracing::warn!(
                dropped = placed.below,
                ?floor,
                "records below where catching up found their partitions came again (the \
                 consumer's position lagged the committed work); not processed again"
            );
        }
        let mut first: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        for record in records.iter() {
            first.entry(record.partition).or_insert(record.offset);
        }
        for (partition, offset) in first {
            let Some(at) = floor.get_mut(&partition) else {
                continue;
            };
            match at.seen_before_seek {
                None if offset > at.at => {
                    tracing::info!(
                        partition,
                        first = offset,
                        floor = at.at,
                        "the first record after catching up is past where the partition \
                         must go on from: seeking back there once, so nothing between is \
                         skipped (transaction markers leave such gaps too)"
                    );
                    at.seen_before_seek = Some(offset);
                    placed.seek.push((partition, at.seek_to));
                    continue;
                }
                Some(seen) if offset < seen => {
                    metrics::counter!("onceflow_positions_corrected_total").increment(1);
                    tracing::error!(
                        partition,
                        floor = at.at,
                        started_at = seen,
                        first = offset,
                        "the consumer started the partition past where it must go on from: \
                         records would have been skipped; the seek back found them"
                    );
                    placed.corrected += 1;
                }
                // Once per partition per catch-up: where the consumer started against where
                // the committed offsets and the changelog's progress said to go on from,
                // what would explain a record lost or doubled next time.
                _ => tracing::info!(
                    partition,
                    floor = at.at,
                    first = offset,
                    "the partition's first record after catching up"
                ),
            }
            floor.remove(&partition);
        }
        if !placed.seek.is_empty() {
            records.retain(|r| !placed.seek.iter().any(|(p, _)| *p == r.partition));
        }
        placed
    }

    /// Forgets the floors of `partitions`, revoked: whoever owns them next catches up
    /// and sets its own.
    pub(in crate::engine) fn forget_floors(&self, partitions: &[i32]) {
        self.state
            .floor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|partition, _| !partitions.contains(partition));
    }

    /// The partitions with a floor still to pass (for tests).
    #[cfg(test)]
    pub(in crate::engine) fn floors(&self) -> Vec<i32> {
        let floor = self.state.floor.lock().unwrap_or_else(|e| e.into_inner());
        floor.keys().copied().collect()
    }
}
