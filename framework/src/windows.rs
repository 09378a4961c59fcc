//! Windowed aggregation by event time, on top of timers: tumbling and hopping windows
//! with a grace period. A record adds to the windows its timestamp falls in; a window's
//! aggregate is kept in the partition's state and handed over once, when the event time
//! passes the window's end plus the grace period (an event-time timer). Like all state,
//! it commits with the batch and survives restarts and partition moves.
//!
//! ```
//! use std::time::Duration;
//! use onceflow::windows::Windows;
//! use onceflow::{Context, Result, Timer};
//!
//! const PER_MINUTE: Windows = Windows::tumbling("per-minute", Duration::from_secs(60))
//!     .grace(Duration::from_secs(10));
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Tally { payments: u32 }
//!
//! fn on_payment(ctx: &mut Context<'_>, card: &str) -> Result<()> {
//!     PER_MINUTE.add(ctx, card, |tally: &mut Tally| tally.payments += 1).map(drop)
//! }
//!
//! fn on_timer(ctx: &mut Context<'_>, timer: &Timer) -> Result<()> {
//!     if let Some(closed) = PER_MINUTE.close::<Tally>(ctx, timer)? {
//!         ctx.emit("card-minutes", &closed.key, &closed.value.payments)?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! A record is **late** for a window whose end plus grace the partition's watermark
//! ([`Context::watermark`]) already passed: that window was handed over. A record late
//! for every window it falls in is counted (`onceflow_late_records_total`) and, by
//! default, fails as a permanent error, so `on_error` dead-letters it (or skips it);
//! [`Windows::drop_late`] drops it instead (still counted).

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::timers::{Timer, TimerClock, millis};
use crate::{Context, Error, Result};

/// A set of windows by event time: their size, how far apart they start, and how long
/// after its end a window still takes late records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    name: &'static str,
    size: Duration,
    advance: Duration,
    grace: Duration,
    drop_late: bool,
}

/// One window: `start_ms` (inclusive) to `end_ms` (exclusive), by event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    /// Its first millisecond.
    pub start_ms: i64,
    /// The millisecond after its last.
    pub end_ms: i64,
}

/// What [`Windows::add`] did with the record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Added {
    /// Added to these open windows.
    To(Vec<Window>),
    /// Every window it falls in was already handed over (with [`Windows::drop_late`]).
    Late,
}

/// A window handed over by [`Windows::close`]: its key, bounds and final aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed<A> {
    /// The key the records were added under.
    pub key: String,
    /// The window.
    pub window: Window,
    /// The aggregate, as the last record left it.
    pub value: A,
}

impl Windows {
    /// Windows of `size` one after the other (each record in exactly one). `name` keeps
    /// the state and timers of several window sets of one processor apart.
    pub const fn tumbling(name: &'static str, size: Duration) -> Self {
        Windows::hopping(name, size, size)
    }

    /// Windows of `size` starting every `advance` (a record is in `size / advance` of
    /// them, rounded up).
    pub const fn hopping(name: &'static str, size: Duration, advance: Duration) -> Self {
        Windows {
            name,
            size,
            advance,
            grace: Duration::ZERO,
            drop_late: false,
        }
    }

    /// A window takes records up to `grace` after its end (by event time) and is handed
    /// over then (default none).
    pub const fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Late records are dropped (and counted) instead of failing.
    pub const fn drop_late(mut self) -> Self {
        self.drop_late = true;
        self
    }

    /// The windows a record at `timestamp_ms` falls in, earliest first.
    pub fn windows_of(&self, timestamp_ms: i64) -> Vec<Window> {
        let size = millis(self.size).max(1);
        let advance = millis(self.advance).clamp(1, size);
        let last_start = timestamp_ms.div_euclid(advance) * advance;
        let mut windows = Vec::new();
        let mut start = last_start;
        while start > timestamp_ms - size {
            windows.push(Window {
                start_ms: start,
                end_ms: start.saturating_add(size),
            });
            start -= advance;
        }
        windows.reverse();
        windows
    }

    /// Adds the record being processed, under `key`, to each open window its timestamp
    /// falls in: `update` changes the window's aggregate (a new window's starts as
    /// `A::default()`). A window's first record schedules its hand-over.
    ///
    /// A record without a timestamp is an error; one late for every window it falls in
    /// is too (dead-lettered per `on_error`), unless [`Windows::drop_late`].
    pub fn add<A: Serialize + DeserializeOwned + Default>(
        &self,
        ctx: &mut Context<'_>,
        key: &str,
        mut update: impl FnMut(&mut A),
    ) -> Result<Added> {
        let Some(timestamp) = ctx.record().timestamp_ms else {
            return Err(Error::processing(format!(
                "a record without a timestamp cannot be put in windows `{}`",
                self.name
            )));
        };
        let watermark = ctx.watermark()?;
        let grace = millis(self.grace);
        let mut open = Vec::new();
        for window in self.windows_of(timestamp) {
            let due = window.end_ms.saturating_add(grace);
            if watermark.is_some_and(|w| due <= w) {
                continue;
            }
            let name = self.entry(window, key);
            let mut value: A = ctx.state().get(&name)?.unwrap_or_default();
            update(&mut value);
            ctx.state().put(&name, &value)?;
            if ctx.scheduled(&name)?.is_none() {
                ctx.schedule(&name, TimerClock::EventTime, due)?;
            }
            open.push(window);
        }
        if !open.is_empty() {
            return Ok(Added::To(open));
        }
        metrics::counter!("onceflow_late_records_total", "windows" => self.name).increment(1);
        if self.drop_late {
            return Ok(Added::Late);
        }
        Err(Error::processing(format!(
            "late for windows `{}`: timestamp {timestamp} ms, its windows closed at watermark \
             {} ms (grace {:?})",
            self.name,
            watermark.unwrap_or_default(),
            self.grace
        )))
    }

    /// When `timer` is the hand-over of one of these windows: the window, its key and
    /// its aggregate, removed from the state. `None` for any other timer.
    pub fn close<A: DeserializeOwned + Default>(
        &self,
        ctx: &mut Context<'_>,
        timer: &Timer,
    ) -> Result<Option<Closed<A>>> {
        let Some(rest) = timer.key.strip_prefix(&self.prefix()) else {
            return Ok(None);
        };
        let Some((start, key)) = rest.split_once('/') else {
            return Ok(None);
        };
        let Ok(start_ms) = start.parse::<i64>() else {
            return Ok(None);
        };
        let window = Window {
            start_ms,
            end_ms: start_ms.saturating_add(millis(self.size).max(1)),
        };
        let value = ctx.state().get(&timer.key)?.unwrap_or_default();
        ctx.state().delete(&timer.key);
        Ok(Some(Closed {
            key: key.to_owned(),
            window,
            value,
        }))
    }

    fn prefix(&self) -> String {
        format!("window/{}/", self.name)
    }

    /// The state key and timer key of `key`'s `window`.
    fn entry(&self, window: Window, key: &str) -> String {
        format!("{}{}/{key}", self.prefix(), window.start_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_falls_in_one_tumbling_window_and_in_size_over_advance_hopping_ones() {
        let tumbling = Windows::tumbling("t", Duration::from_secs(60));
        assert_eq!(
            tumbling.windows_of(61_000),
            [Window {
                start_ms: 60_000,
                end_ms: 120_000
            }]
        );
        assert_eq!(
            tumbling.windows_of(-1),
            [Window {
                start_ms: -60_000,
                end_ms: 0
            }]
        );
        let hopping = Windows::hopping("h", Duration::from_secs(60), Duration::from_secs(20));
        let starts: Vec<i64> = hopping
            .windows_of(61_000)
            .iter()
            .map(|w| w.start_ms)
            .collect();
        assert_eq!(starts, [20_000, 40_000, 60_000]);
        assert!(
            hopping
                .windows_of(61_000)
                .iter()
                .all(|w| w.start_ms <= 61_000 && 61_000 < w.end_ms)
        );
    }
}
