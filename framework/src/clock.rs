//! Where the engine reads the wall clock: the system's, or a test driver's own, which
//! only moves when the test moves it (`onceflow::testing::TestDriver::advance_time`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The engine's wall clock: the time of dedup entries and of their expiry.
#[derive(Clone, Debug, Default)]
pub(crate) enum Clock {
    /// The system's clock.
    #[default]
    System,
    /// Milliseconds since the epoch, set by a test.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// Now, in milliseconds since the epoch.
    pub(crate) fn now_ms(&self) -> i64 {
        match self {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .unwrap_or(0),
            Clock::Manual(now) => now.load(Ordering::SeqCst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_reads_what_was_set_and_the_system_clock_moves_on() {
        let now = Arc::new(AtomicI64::new(42));
        let clock = Clock::Manual(Arc::clone(&now));
        assert_eq!(clock.now_ms(), 42);
        now.store(1_000, Ordering::SeqCst);
        assert_eq!(clock.now_ms(), 1_000);
        // 2026-01-01 in ms: the system clock is not a manual one stuck at zero.
        assert!(Clock::System.now_ms() > 1_767_225_600_000);
    }
}
