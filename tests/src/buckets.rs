//! The workload of the timer tests: ticks with timestamps, summed per key and bucket of
//! event time, each bucket emitted by an event-time timer when the event time passes its
//! end; reminders by the wall clock. Used through the test driver and against the broker.

use std::collections::BTreeMap;

use onceflow::{Context, Error, Processor, Result, Timer, TimerClock};
use onceflow_testkit::OutgoingRecord;
use serde::{Deserialize, Serialize};

/// The output topic.
pub const OUT: &str = "closed";
/// The buckets of event time the test sums per key.
pub const BUCKET_MS: i64 = 1_000;

/// An input event.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Tick {
    /// Its event ID.
    pub id: String,
    /// The key it adds to.
    pub key: String,
    /// The amount.
    pub amount: i64,
    /// Also set a wall-clock reminder this many ms from now.
    #[serde(default)]
    pub remind_in_ms: Option<i64>,
    /// Cancel the key's reminder.
    #[serde(default)]
    pub cancel: bool,
}

impl onceflow::Event for Tick {
    fn event_id(&self) -> Option<String> {
        Some(self.id.clone())
    }
}

/// An output: a key's bucket and its sum (bucket -1: a reminder, sum its due time).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Closed {
    /// The key.
    pub key: String,
    /// The bucket (event time / BUCKET_MS).
    pub bucket: i64,
    /// Its sum.
    pub sum: i64,
}

/// Sums each key's amounts per bucket of event time; a bucket is emitted when the event
/// time passes its end (an event-time timer), reminders when the wall clock passes them.
#[derive(Debug, Clone, Default)]
pub struct Buckets {
    /// on_timer fails for reminders of this key.
    pub failing_key: Option<String>,
}

#[onceflow::async_trait]
impl Processor for Buckets {
    type Input = Tick;

    fn name(&self) -> &str {
        "buckets"
    }

    fn output_topics(&self) -> &[&str] {
        &[OUT]
    }

    fn uses_timers(&self) -> bool {
        true
    }

    async fn process(&mut self, tick: Tick, ctx: &mut Context<'_>) -> Result<()> {
        let at = ctx.record().timestamp_ms.expect("a timestamp");
        let bucket = at.div_euclid(BUCKET_MS);
        let state = format!("sum/{}/{bucket}", tick.key);
        let sum = ctx.state().get::<i64>(&state)?.unwrap_or(0) + tick.amount;
        ctx.state().put(&state, &sum)?;
        ctx.schedule(
            &format!("close/{}/{bucket}", tick.key),
            TimerClock::EventTime,
            (bucket + 1) * BUCKET_MS,
        )?;
        if let Some(after) = tick.remind_in_ms {
            ctx.schedule(
                &format!("remind/{}", tick.key),
                TimerClock::WallClock,
                ctx.now_ms() + after,
            )?;
        }
        if tick.cancel {
            assert!(
                ctx.cancel(&format!("remind/{}", tick.key))?,
                "a reminder to cancel"
            );
        }
        Ok(())
    }

    async fn on_timer(&mut self, timer: Timer, ctx: &mut Context<'_>) -> Result<()> {
        if let Some(rest) = timer.key.strip_prefix("close/") {
            let (key, bucket) = rest.rsplit_once('/').expect("close/<key>/<bucket>");
            let state = format!("sum/{key}/{bucket}");
            let sum = ctx.state().get::<i64>(&state)?.unwrap_or(0);
            ctx.state().delete(&state);
            assert_eq!(timer.clock, TimerClock::EventTime);
            let closed = Closed {
                key: key.into(),
                bucket: bucket.parse().expect("bucket"),
                sum,
            };
            return ctx.emit(OUT, key, &closed);
        }
        let key = timer.key.strip_prefix("remind/").expect("remind/<key>");
        if self.failing_key.as_deref() == Some(key) {
            return Err(Error::processing(format!("no reminder for {key}")));
        }
        ctx.emit(
            OUT,
            key,
            &Closed {
                key: key.into(),
                bucket: -1,
                sum: timer.due_ms,
            },
        )
    }
}

/// Tick `n` of `key`.
pub fn tick(n: usize, key: &str, amount: i64) -> Tick {
    Tick {
        id: format!("t-{n}"),
        key: key.into(),
        amount,
        remind_in_ms: None,
        cancel: false,
    }
}

/// `tick` as a record with its timestamp.
pub fn at(tick: &Tick, timestamp_ms: i64) -> OutgoingRecord {
    OutgoingRecord::keyed(tick.key.clone(), serde_json::to_vec(tick).expect("json"))
        .at_ms(timestamp_ms)
}

/// 400 ticks over 4 keys, 40 ms of event time apart from `base` (16 buckets), every 9th
/// sent twice: the records, and each (key, bucket)'s expected sum.
pub fn ticks(base: i64) -> (Vec<OutgoingRecord>, BTreeMap<(String, i64), i64>) {
    let mut records = Vec::new();
    let mut expected = BTreeMap::new();
    for n in 0..400 {
        let key = format!("k{}", n % 4);
        let event = tick(n, &key, (n % 5) as i64 + 1);
        let timestamp = base + n as i64 * 40;
        let record = at(&event, timestamp);
        if n % 9 == 4 {
            records.push(record.clone());
        }
        records.push(record);
        *expected
            .entry((key, timestamp.div_euclid(BUCKET_MS)))
            .or_default() += event.amount;
    }
    (records, expected)
}

/// Every bucket whose end the event time passed is emitted once with its exact sum, in
/// bucket order per key; the last bucket of each key is still open.
pub fn assert_buckets(closed: &[Closed], expected: &BTreeMap<(String, i64), i64>, what: &str) {
    let last_bucket = expected.keys().map(|(_, b)| *b).max().expect("buckets");
    let mut by_key: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for c in closed {
        by_key.entry(&c.key).or_default().push((c.bucket, c.sum));
    }
    for key in ["k0", "k1", "k2", "k3"] {
        let want: Vec<(i64, i64)> = expected
            .iter()
            .filter(|((k, b), _)| k == key && *b < last_bucket)
            .map(|((_, b), sum)| (*b, *sum))
            .collect();
        let got = by_key.get(key).cloned().unwrap_or_default();
        if got != want {
            let at = (0..got.len().max(want.len())).find(|i| got.get(*i) != want.get(*i));
            panic!(
                "{what}: key {key}: {} buckets closed, {} expected; first difference at {at:?}: \
                 got {:?}, want {:?}",
                got.len(),
                want.len(),
                at.and_then(|i| got.get(i)),
                at.and_then(|i| want.get(i))
            );
        }
    }
}
