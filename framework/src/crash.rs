//! Crashes for the test driver (feature `testing`): a test arms a named crash point, the
//! engine's task reaches it, and from there its future never finishes. The driver sees
//! the crash, drops that future (nothing after the point runs, no transaction is ended,
//! redb is not touched: what a process killed there leaves) and starts the engine again.
//!
//! The plan is task-local: tests running in parallel in one binary do not see each
//! other's crashes, and the engine outside a driver never has one.
//!
//! `crash_point!` marks the points, for the test driver and for the `failpoints` feature
//! alike; this module imports nothing of the crate, so any module may mark one.

#[cfg(feature = "testing")]
use std::sync::{Arc, Mutex};

#[cfg(feature = "testing")]
use tokio::sync::Notify;

/// Named points (feature `failpoints`): `onceflow-after-process`, `onceflow-after-produce`,
/// `onceflow-before-send-offsets`, `onceflow-before-commit`,
/// `onceflow-after-commit-before-apply` and `onceflow-during-replay` crash the process;
/// `onceflow-fail-batch` fails the batch with a retriable error instead.
///
/// Crashes the process at a named point when the failpoint is configured (feature
/// `failpoints`; e.g. `FAILPOINTS=onceflow-before-commit=3*off->return` crashes at the
/// fourth pass). A crash is `abort()`: no destructor, no flush, like a power cut.
///
/// `crash_point!(await "name")`, in the batch's async code, also crashes a test driver's
/// engine there when the test armed it (feature `testing`): the engine's future never
/// finishes, the driver drops it, like the process that died (see the module's documentation).
macro_rules! crash_point {
    (await $name:literal) => {
        $crate::crash::crash_point!($name);
        #[cfg(feature = "testing")]
        if $crate::crash::due($name) {
            $crate::crash::hang().await;
        }
    };
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        if ::fail::eval($name, |_| ()).is_some() {
            eprintln!("onceflow: failpoint {} hit: crashing", $name);
            std::process::abort();
        }
    };
}
pub(crate) use crash_point;

#[cfg(feature = "testing")]
tokio::task_local! {
    static PLAN: Arc<CrashPlan>;
}

#[cfg(feature = "testing")]
/// Which crash points are armed, and which one was hit.
#[derive(Debug, Default)]
pub(crate) struct CrashPlan {
    inner: Mutex<Armed>,
    hit: Notify,
}

#[cfg(feature = "testing")]
#[derive(Debug, Default)]
struct Armed {
    /// (point, crash at the nth pass, passes so far).
    points: Vec<(&'static str, u32, u32)>,
    /// The point the engine crashed at, once it did.
    crashed: Option<&'static str>,
}

#[cfg(feature = "testing")]
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

#[cfg(feature = "testing")]
/// Whether this task is a test driver's engine (it runs inside a plan's scope).
pub(crate) fn in_driver() -> bool {
    PLAN.try_with(|_| ()).is_ok()
}

#[cfg(feature = "testing")]
/// Whether the task's plan crashes at `point` now (counting the pass).
pub(crate) fn due(point: &str) -> bool {
    PLAN.try_with(|plan| plan.pass(point)).unwrap_or(false)
}

#[cfg(feature = "testing")]
/// The crashed engine: it never goes on.
pub(crate) async fn hang() {
    std::future::pending::<()>().await;
}

#[cfg(all(test, feature = "testing"))]
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
