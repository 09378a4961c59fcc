//! When the transaction log's commits reach the disk (why that may be late: `store.rs`).
//!
//! ```text
//!  write (Soon) ─► durable now? ── the oldest unsynced commit is `interval` old, or 0 ──► fsync
//!       │                     └─ no: Durability::None, and the syncer's clock starts
//!       ▼
//!  syncer thread: sleeps until the oldest unsynced commit is `interval` old, then commits
//!                 durably (empty), unless a write did it first; an idle log is synced too
//! ```

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{Database, Durability};

/// How long an apply may stay in memory only, until the engine's first batch brings the
/// configured `txlog_sync_interval`.
pub(crate) const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// How long the syncer waits after a failed sync before it tries again, at least.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How durable one write must be.
#[derive(Debug, Clone, Copy)]
pub(super) enum Durable {
    /// When it returns.
    Now,
    /// Within the log's sync interval.
    Soon,
}

/// Which commits are not durable yet, shared by the log's writes and its syncer.
#[derive(Debug)]
pub(super) struct Syncing {
    /// A commit is made durable once the oldest commit not yet durable is this old.
    pub(super) interval: Duration,
    /// When the oldest commit that is not durable yet was made (None: every one is).
    pub(super) unsynced_since: Option<Instant>,
    /// The log is closing: the syncer stops.
    closing: bool,
}

impl Syncing {
    /// Whether a write that must be `durable` is to be committed durably now.
    pub(super) fn durable_now(&self, durable: Durable) -> bool {
        match durable {
            Durable::Now => true,
            Durable::Soon => self.interval.is_zero() || self.due(),
        }
    }

    /// Records a commit (durable or not) that just succeeded.
    pub(super) fn committed(&mut self, durable: bool) {
        if durable {
            self.unsynced_since = None;
        } else {
            self.unsynced_since.get_or_insert_with(Instant::now);
        }
    }

    /// Whether the oldest unsynced commit is a sync interval old.
    fn due(&self) -> bool {
        self.unsynced_since
            .is_some_and(|since| since.elapsed() >= self.interval)
    }
}

/// [`Syncing`] and the syncer's wake-up call.
#[derive(Debug)]
pub(super) struct Shared {
    syncing: Mutex<Syncing>,
    changed: Condvar,
}

impl Shared {
    /// Nothing unsynced, syncing every [`DEFAULT_SYNC_INTERVAL`].
    pub(super) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            syncing: Mutex::new(Syncing {
                interval: DEFAULT_SYNC_INTERVAL,
                unsynced_since: None,
                closing: false,
            }),
            changed: Condvar::new(),
        })
    }

    /// The record of unsynced commits (a panic while it was held leaves it as it was).
    /// Held through a write's commit: redb runs one write transaction at a time anyway, and
    /// the record must follow the commits' order.
    pub(super) fn lock(&self) -> MutexGuard<'_, Syncing> {
        self.syncing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the syncer: what is unsynced, or the interval, changed.
    pub(super) fn wake(&self) {
        self.changed.notify_all();
    }
}

/// The thread that syncs what writes left unsynced once it is due, even when no write
/// comes after them: an idle instance would otherwise keep its last applies in memory for
/// as long as it is idle, and a crash then replays from checkpoints that old, past
/// tombstones that compaction may have removed meanwhile.
#[derive(Debug)]
pub(super) struct Syncer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the syncer of `db` (at `path`, for its log lines). Without a thread (the
    /// system refused one) the writes still sync when due; only an idle log waits.
    pub(super) fn start(db: &Arc<Database>, path: &std::path::Path, shared: &Arc<Shared>) -> Self {
        let (db, path, state) = (Arc::clone(db), path.to_owned(), Arc::clone(shared));
        let thread = std::thread::Builder::new()
            .name("onceflow-txlog-sync".into())
            .spawn(move || sync_when_due(&db, &path, &state));
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(error) => {
                tracing::warn!(%error, "no thread to sync an idle transaction log; its writes still sync it");
                None
            }
        };
        Syncer {
            shared: Arc::clone(shared),
            thread,
        }
    }

    /// Stops the thread (it is never in the middle of a commit when it stops).
    pub(super) fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.shared.lock().closing = true;
        self.shared.wake();
        if thread.join().is_err() {
            tracing::warn!("the transaction log's sync thread panicked");
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The syncer's loop (see [`Syncer`]).
fn sync_when_due(db: &Database, path: &std::path::Path, shared: &Shared) {
    let mut syncing = shared.lock();
    loop {
        if syncing.closing {
            return;
        }
        let wait = match syncing.unsynced_since {
            None => None,
            Some(_) if syncing.due() => match commit_durably(db) {
                Ok(()) => {
                    syncing.committed(true);
                    continue;
                }
                Err(error) => {
                    tracing::warn!(
                        path = %path.display(),
                        %error,
                        "syncing the transaction log failed; trying again (a crash meanwhile \
                         replays the unsynced applies from the changelog)"
                    );
                    Some(syncing.interval.max(RETRY_AFTER))
                }
            },
            Some(since) => Some(syncing.interval.saturating_sub(since.elapsed())),
        };
        syncing = match wait {
            None => shared
                .changed
                .wait(syncing)
                .unwrap_or_else(|e| e.into_inner()),
            Some(wait) => {
                let waited = shared.changed.wait_timeout(syncing, wait);
                waited.unwrap_or_else(|e| e.into_inner()).0
            }
        };
    }
}

/// An empty durable commit: redb makes non-durable commits durable only by a durable one
/// after them.
pub(super) fn commit_durably(db: &Database) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.commit()?;
    Ok(())
}
