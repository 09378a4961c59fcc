//! Crashes for the test driver (feature `testing`): a test arms a named crash point, the
//! engine's task reaches it, and from there its future never finishes. The driver sees
//! the crash, drops that future (nothing after the point runs, no transaction is ended,
//! redb is not touched: what a process killed there leaves) and starts the engine again.
//!
//! The plan is task-local: tests running in parallel in one binary do not see each
//! other's crashes, and the engine outside a driver never has one.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

tokio::task_local! {
    static PLAN: Arc<CrashPlan>;
}

/// Which crash points are armed, and which one was hit.
#[derive(Debug, Default)]
pub(crate) struct CrashPlan {
    inner: Mutex<Armed>,
    hit: Notify,
}

#[derive(Debug, Default)]
struct Armed {
    /// (point, crash at the nth pass, passes so far).
    points: Vec<(&'static str, u32, u32)>,
    /// The point the engine crashed at, once it did.
    crashed: Option<&'static str>,
}

impl CrashPlan {
    /// Crashes at the `nth` pass (1: the next) through `point`.
    pub(crate) fn arm(&self, point: &'static str, nth: u32) {
        let mut armed = self.lock();
        armed.points.push((point, nth.max(1), 0));
    }

    /// The point the engine crashed at since the last call, if it did (and forgets it).
    pub(crate) fn take_crash(&self) -> Option<&'static str> {
        self.lock().crashed.take()
    }

    /// Waits until the engine crashes.
    pub(crate) async fn crashed(&self) {
        loop {
            let notified = self.hit.notified();
            if self.lock().crashed.is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Runs `work` with this plan: its crash points consult it.
    pub(crate) async fn scope<T>(self: &Arc<Self>, work: impl Future<Output = T>) -> T {
        PLAN.scope(Arc::clone(self), work).await
    }

    fn pass(&self, point: &str) -> bool {
        let mut armed = self.lock();
        let mut due = None;
        for (name, nth, seen) in &mut armed.points {
            if *name == point {
                *seen += 1;
                if *seen == *nth && due.is_none() {
                    due = Some(*name);
                }
            }
        }
        armed.points.retain(|(_, nth, seen)| seen < nth);
        if let Some(name) = due {
            armed.crashed = Some(name);
            drop(armed);
            self.hit.notify_waiters();
            return true;
        }
        false
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Armed> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether this task is a test driver's engine (it runs inside a plan's scope).
pub(crate) fn in_driver() -> bool {
    PLAN.try_with(|_| ()).is_ok()
}

/// Whether the task's plan crashes at `point` now (counting the pass).
pub(crate) fn due(point: &str) -> bool {
    PLAN.try_with(|plan| plan.pass(point)).unwrap_or(false)
}

/// The crashed engine: it never goes on.
pub(crate) async fn hang() {
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_armed_point_crashes_at_its_nth_pass_only_inside_its_scope() {
        let plan = Arc::new(CrashPlan::default());
        plan.arm("p", 2);
        assert!(!due("p"), "outside the scope nothing crashes");
        let passes = plan
            .scope(async { [due("p"), due("q"), due("p"), due("p")] })
            .await;
        assert_eq!(passes, [false, false, true, false]);
        assert_eq!(plan.take_crash(), Some("p"));
        assert_eq!(plan.take_crash(), None);
    }
}
