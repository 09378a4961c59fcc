//! What recovery remembers between batches, as data: the polls a held consumer brought,
//! the fences taken, and where each partition must go on from. The files named after
//! each (`hold.rs`, `fences.rs`, `floor.rs`, `catch_up.rs`) say how it changes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::kafka;

/// Fences (of the producer or of the static member) an instance takes for its own within
/// [`FENCE_WINDOW`]; one more stops it as fenced.
pub(in crate::engine) const MAX_FENCES: usize = 5;
/// See [`MAX_FENCES`].
pub(in crate::engine) const FENCE_WINDOW: Duration = Duration::from_secs(600);

/// What recovery remembers between batches, in one place: what a held consumer's polls
/// brought (`hold.rs`), the fences taken (`fences.rs`), and where each partition must go
/// on from (`floor.rs`, set by `catch_up.rs`). It lives as long as the process: the
/// engine's loop keeps it across a rejoin, and the driver from one run to the next.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// What the polls of a held consumer brought, poll by poll in the order they came
    /// (rebalances and any record), for the engine's loop to act on before it polls again.
    pub(in crate::engine) held: Mutex<Vec<kafka::Polled>>,
    /// The fences taken for the instance's own so far.
    pub(in crate::engine) fences: Mutex<Fences>,
    /// Set while a fenced producer waits for the grace and is not yet replaced: a fence
    /// of the consumer meanwhile means both were fenced, which only a successor does.
    pub(in crate::engine) producer_fenced: AtomicBool,
    /// Per partition, where the last catch-up found it must go on from: a record below it
    /// was processed and committed, and is never processed again; the first record past
    /// it makes the engine seek back to it once (see [`Resync::drop_committed`](super::Resync::drop_committed)).
    pub(in crate::engine) floor: Mutex<BTreeMap<i32, Floor>>,
}

/// The fences an instance took for its own (it made a new producer, or joined the group
/// again), within [`FENCE_WINDOW`]: one a coordinator's failure causes is rare; many mean
/// another instance runs with the same instance ID, and the two would fence each other
/// for ever (neither could commit much; exactly once holds, progress does not).
#[derive(Debug, Default)]
pub(in crate::engine) struct Fences {
    taken: VecDeque<tokio::time::Instant>,
}

impl Fences {
    /// Takes one more fence for the instance's own, if the budget allows: `Ok` with how
    /// many were taken within the window, or `Err` with that count when it is spent.
    pub(in crate::engine) fn take(&mut self) -> Result<usize, usize> {
        let now = tokio::time::Instant::now();
        while self
            .taken
            .front()
            .is_some_and(|at| now.duration_since(*at) >= FENCE_WINDOW)
        {
            self.taken.pop_front();
        }
        if self.taken.len() >= MAX_FENCES {
            return Err(self.taken.len());
        }
        self.taken.push_back(now);
        Ok(self.taken.len())
    }
}

/// Where a partition must go on from after a catch-up, until a record of it is taken.
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct Floor {
    /// The offset: records below it were committed.
    pub(in crate::engine) at: i64,
    /// Where a start past it seeks back to: `at`, or the beginning when nothing was
    /// committed (the log's first offset may be past 0).
    pub(in crate::engine) seek_to: Option<i64>,
    /// The first offset the consumer brought, when it was past `at` and the engine
    /// sought back (once).
    pub(in crate::engine) seen_before_seek: Option<i64>,
}

/// What [`Resync::drop_committed`] did to a poll's records.
#[derive(Debug, Default)]
pub(in crate::engine) struct Placed {
    /// Records dropped as below their partition's floor (already committed).
    pub(in crate::engine) below: usize,
    /// Partitions whose first record was past their floor, to seek back to it.
    pub(in crate::engine) seek: Vec<(i32, Option<i64>)>,
    /// Partitions the seek back found records the consumer had started past.
    pub(in crate::engine) corrected: usize,
}
