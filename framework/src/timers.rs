//! Timers a processor schedules ([`crate::Context::schedule`]), and how they are kept:
//! as state entries of their input partition under reserved keys, so they are written in
//! the batch's transaction, replicated by the changelog, restored by its replay and move
//! with the partition, exactly like the processor's own state.
//!
//! ```text
//!  \0onceflow/timer/<clock>/<due, 20 digits>/<key>  → ""              (in due order)
//!  \0onceflow/timer-key/<key>                      → the entry above  (cancel, reschedule)
//!  \0onceflow/event-time                           → the partition's event time (JSON i64)
//! ```
//!
//! Invariants:
//! - A partition has at most one timer per key: scheduling a key again moves it.
//! - A timer fires in the transaction that deletes it: its effects (outputs, state, a
//!   dead letter) and its removal commit together, or neither does. So it fires once.
//! - Timers fire in due order (then key order), each clock on its own: wall-clock timers
//!   when the engine's clock passes them, event-time timers when the partition's event
//!   time (its highest record timestamp seen, minus `timer_lateness`) does.

use crate::state::StateStore;
use crate::{Error, Result};

pub(crate) use crate::wire::RESERVED_STATE_PREFIX as RESERVED;
const DUE: &str = "\0onceflow/timer/";
const BY_KEY: &str = "\0onceflow/timer-key/";
/// The partition's event time: the highest record timestamp processed.
pub(crate) const EVENT_TIME: &[u8] = b"\0onceflow/event-time";

/// Which clock a timer is due by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerClock {
    /// The engine's wall clock (the system's; the test driver's own in tests).
    WallClock,
    /// The partition's event time: its highest record timestamp processed, minus the
    /// configured `timer_lateness`.
    EventTime,
}

impl TimerClock {
    fn letter(self) -> char {
        match self {
            TimerClock::WallClock => 'w',
            TimerClock::EventTime => 'e',
        }
    }
}

/// A timer as it fires ([`crate::Processor::on_timer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timer {
    /// The key it was scheduled under (unique per partition).
    pub key: String,
    /// When it was due, in milliseconds since the epoch, by its clock.
    pub due_ms: i64,
    /// The clock it was due by.
    pub clock: TimerClock,
    /// The input partition it belongs to: its state is the one the handler sees.
    pub partition: i32,
}

/// `duration` in whole milliseconds (saturating).
pub(crate) fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// `due_ms` as 20 digits that sort like the numbers, negatives included.
fn sortable(due_ms: i64) -> String {
    format!("{:020}", (i128::from(due_ms) - i128::from(i64::MIN)) as u64)
}

fn due_entry(clock: TimerClock, due_ms: i64, key: &str) -> Vec<u8> {
    format!("{DUE}{}/{}/{key}", clock.letter(), sortable(due_ms)).into_bytes()
}

fn by_key(key: &str) -> Vec<u8> {
    format!("{BY_KEY}{key}").into_bytes()
}

/// The range of `clock`'s entries due at or before `up_to`.
pub(crate) fn due_range(clock: TimerClock, up_to: i64) -> (Vec<u8>, Vec<u8>) {
    let from = format!("{DUE}{}/", clock.letter()).into_bytes();
    // Keys of timers due at `up_to` continue with '/' after the digits; '0' sorts after it.
    let to = format!("{DUE}{}/{}0", clock.letter(), sortable(up_to)).into_bytes();
    (from, to)
}

/// The timer an entry of [`due_range`] stands for.
pub(crate) fn parse_due_entry(entry: &[u8], partition: i32) -> Option<Timer> {
    let rest = std::str::from_utf8(entry).ok()?.strip_prefix(DUE)?;
    let (letter, rest) = rest.split_once('/')?;
    let (digits, key) = rest.split_once('/')?;
    let clock = match letter {
        "w" => TimerClock::WallClock,
        "e" => TimerClock::EventTime,
        _ => return None,
    };
    let biased: u64 = digits.parse().ok()?;
    let due_ms = i64::try_from(i128::from(biased) + i128::from(i64::MIN)).ok()?;
    Some(Timer {
        key: key.to_owned(),
        due_ms,
        clock,
        partition,
    })
}

/// Schedules timer `key` of `partition` at `due_ms` by `clock`, moving it if it exists.
pub(crate) fn schedule(
    store: &mut dyn StateStore,
    partition: i32,
    key: &str,
    clock: TimerClock,
    due_ms: i64,
) -> Result<()> {
    if key.is_empty() {
        return Err(Error::processing("a timer needs a non-empty key"));
    }
    cancel(store, partition, key)?;
    let entry = due_entry(clock, due_ms, key);
    store.put(partition, entry.clone(), Vec::new());
    store.put(partition, by_key(key), entry);
    Ok(())
}

/// Cancels timer `key` of `partition`; whether it was scheduled.
pub(crate) fn cancel(store: &mut dyn StateStore, partition: i32, key: &str) -> Result<bool> {
    let index = by_key(key);
    let Some(entry) = store.get(partition, &index)? else {
        return Ok(false);
    };
    store.delete(partition, entry);
    store.delete(partition, index);
    Ok(true)
}

/// Removes `timer`, which fires: its due entry, and its key's entry if that names this
/// one. Not by its key alone: a due entry whose key entry is gone (a changelog written
/// outside a transaction, of which only a part landed before the instance stopped)
/// would stay, and fire again and again.
pub(crate) fn remove_fired(store: &mut dyn StateStore, timer: &Timer) -> Result<()> {
    let entry = due_entry(timer.clock, timer.due_ms, &timer.key);
    let index = by_key(&timer.key);
    if store.get(timer.partition, &index)?.as_deref() == Some(entry.as_slice()) {
        store.delete(timer.partition, index);
    }
    store.delete(timer.partition, entry);
    Ok(())
}

/// When timer `key` of `partition` is due, and by which clock, if it is scheduled.
pub(crate) fn scheduled(
    store: &dyn StateStore,
    partition: i32,
    key: &str,
) -> Result<Option<(TimerClock, i64)>> {
    Ok(store
        .get(partition, &by_key(key))?
        .and_then(|entry| parse_due_entry(&entry, partition))
        .map(|timer| (timer.clock, timer.due_ms)))
}

/// The partition's event time, if a record with a timestamp was processed.
pub(crate) fn event_time(store: &dyn StateStore, partition: i32) -> Result<Option<i64>> {
    store
        .get(partition, EVENT_TIME)?
        .map(|bytes| {
            serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                what: "the partition's event time".into(),
                message: e.to_string(),
                cause: Some(Box::new(e)),
            })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition's state as a map.
    #[derive(Default)]
    struct Map(std::collections::BTreeMap<Vec<u8>, Vec<u8>>);

    impl StateStore for Map {
        fn get(&self, _partition: i32, key: &[u8]) -> Result<Option<Vec<u8>>> {
            Ok(self.0.get(key).cloned())
        }
        fn put(&mut self, _partition: i32, key: Vec<u8>, value: Vec<u8>) {
            self.0.insert(key, value);
        }
        fn delete(&mut self, _partition: i32, key: Vec<u8>) {
            self.0.remove(&key);
        }
    }

    /// Seen in the group simulation: an at-most-once changelog of which only the key
    /// entry's deletion landed left a due entry alone; removing a fired timer by its key
    /// missed it, and it fired 10,000 times per pass.
    #[test]
    fn a_fired_timer_goes_even_without_its_key_entry_and_spares_a_newer_one() {
        let mut store = Map::default();
        schedule(&mut store, 0, "r", TimerClock::WallClock, 5).expect("schedule");
        let fired = parse_due_entry(&due_entry(TimerClock::WallClock, 5, "r"), 0).expect("due");
        store.delete(0, by_key("r"));
        remove_fired(&mut store, &fired).expect("remove");
        assert!(store.0.is_empty(), "left: {:?}", store.0.keys());

        // An orphan due entry fires; the key's newer timer stays.
        schedule(&mut store, 0, "r", TimerClock::WallClock, 9).expect("schedule");
        store.put(0, due_entry(TimerClock::WallClock, 5, "r"), Vec::new());
        remove_fired(&mut store, &fired).expect("remove");
        assert_eq!(
            scheduled(&store, 0, "r").expect("read"),
            Some((TimerClock::WallClock, 9))
        );
        assert_eq!(store.0.len(), 2, "the newer timer's two entries");
    }

    #[test]
    fn due_entries_sort_by_time_negatives_included_and_parse_back() {
        let times = [i64::MIN, -5, 0, 7, 1_767_225_600_000, i64::MAX];
        let entries: Vec<Vec<u8>> = times
            .iter()
            .map(|t| due_entry(TimerClock::EventTime, *t, "k"))
            .collect();
        let mut sorted = entries.clone();
        sorted.sort();
        assert_eq!(sorted, entries);
        for (t, entry) in times.iter().zip(&entries) {
            let timer = parse_due_entry(entry, 3).expect("parses");
            assert_eq!(
                (
                    timer.due_ms,
                    timer.clock,
                    timer.key.as_str(),
                    timer.partition
                ),
                (*t, TimerClock::EventTime, "k", 3)
            );
        }
        // A key with slashes survives.
        let timer =
            parse_due_entry(&due_entry(TimerClock::WallClock, 1, "card/7/min"), 0).expect("parses");
        assert_eq!(timer.key, "card/7/min");
    }

    #[test]
    fn the_due_range_holds_exactly_the_timers_due_by_then() {
        let (from, to) = due_range(TimerClock::WallClock, 100);
        let inside = |t: i64, clock: TimerClock| {
            let entry = due_entry(clock, t, "zzz");
            entry >= from && entry < to
        };
        assert!(inside(100, TimerClock::WallClock));
        assert!(inside(-3, TimerClock::WallClock));
        assert!(!inside(101, TimerClock::WallClock));
        assert!(!inside(50, TimerClock::EventTime));
    }
}
