//! Timers through the test driver: event-time timers fire once, in order, as the event
//! time passes them, through every crash point and a rebuild from the changelog;
//! wall-clock timers fire when the driver's clock passes them; a cancelled timer never
//! fires; a failing handler's timer is dead-lettered, not retried for ever.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow::testing::{CrashPoint, OutgoingRecord, TestDriver};
use onceflow::{Context, Error, Processor, Result, Timer, TimerClock};
use serde::{Deserialize, Serialize};

const OUT: &str = "closed";
/// The buckets of event time the test sums per key.
const BUCKET_MS: i64 = 1_000;

#[derive(Debug, Clone, Deserialize, Serialize)]
struct Tick {
    id: String,
    key: String,
    amount: i64,
    /// Also set a wall-clock reminder this many ms from now.
    #[serde(default)]
    remind_in_ms: Option<i64>,
    /// Cancel the key's reminder.
    #[serde(default)]
    cancel: bool,
}

impl onceflow::Event for Tick {
    fn event_id(&self) -> Option<String> {
        Some(self.id.clone())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
struct Closed {
    key: String,
    bucket: i64,
    sum: i64,
}

/// Sums each key's amounts per bucket of event time; a bucket is emitted when the event
/// time passes its end (an event-time timer), reminders when the wall clock passes them.
#[derive(Debug, Clone, Default)]
struct Buckets {
    /// on_timer fails for reminders of this key.
    failing_key: Option<String>,
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

fn tick(n: usize, key: &str, amount: i64) -> Tick {
    Tick {
        id: format!("t-{n}"),
        key: key.into(),
        amount,
        remind_in_ms: None,
        cancel: false,
    }
}

fn at(tick: &Tick, timestamp_ms: i64) -> OutgoingRecord {
    OutgoingRecord::keyed(tick.key.clone(), serde_json::to_vec(tick).expect("json"))
        .at_ms(timestamp_ms)
}

/// 400 ticks over 4 keys, 40 ms of event time apart (16 buckets), every 9th sent twice.
fn pipe_ticks(driver: &mut TestDriver<Buckets>) -> BTreeMap<(String, i64), i64> {
    let mut expected = BTreeMap::new();
    for n in 0..400 {
        let key = format!("k{}", n % 4);
        let event = tick(n, &key, (n % 5) as i64 + 1);
        let timestamp = 10_000 + n as i64 * 40;
        let (partition, offset) = driver.pipe_record(at(&event, timestamp));
        if n % 9 == 4 {
            driver.pipe_again(partition, offset);
        }
        *expected
            .entry((key, timestamp.div_euclid(BUCKET_MS)))
            .or_default() += event.amount;
    }
    expected
}

fn closed(driver: &TestDriver<Buckets>) -> Vec<Closed> {
    driver.output_values(OUT).expect("outputs")
}

/// Every bucket whose end the event time passed is emitted once with its exact sum, in
/// bucket order per key; the last bucket of each key is still open.
fn assert_buckets(closed: &[Closed], expected: &BTreeMap<(String, i64), i64>, what: &str) {
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

#[tokio::test]
async fn event_time_timers_fire_once_in_order_as_the_event_time_passes_them() {
    let mut driver = TestDriver::new(Buckets::default()).input_partitions(2);
    let expected = pipe_ticks(&mut driver);
    driver.process().await.expect("process");
    assert_buckets(&closed(&driver), &expected, "one run");
    let stats = driver.stats();
    assert_eq!(stats.timers_fired as usize, closed(&driver).len());
    // Batches cut anywhere give the same: one record per batch.
    let mut one_by_one = TestDriver::new(Buckets::default())
        .input_partitions(2)
        .configure(|c| c.batching(Duration::from_millis(100), 1));
    pipe_ticks(&mut one_by_one);
    one_by_one.process().await.expect("process");
    assert_eq!(closed(&one_by_one), closed(&driver));
}

#[tokio::test]
async fn timers_fire_once_through_a_crash_at_every_point_and_a_rebuild() {
    for point in CrashPoint::ALL {
        let mut driver = TestDriver::new(Buckets::default())
            .input_partitions(2)
            .configure(|c| c.batching(Duration::from_millis(100), 37));
        let expected = pipe_ticks(&mut driver);
        if point == CrashPoint::DuringReplay {
            driver.lose_local_state().expect("lose the log");
        }
        driver.crash_at(point, 4);
        driver.process().await.expect("process");
        if point != CrashPoint::DuringReplay {
            assert_eq!(driver.crashes(), [point]);
        }
        assert_buckets(&closed(&driver), &expected, &format!("{point:?}"));
    }
    // A rebuild from the changelog keeps the timers still pending: the open buckets
    // close when the event time moves on after it.
    let mut driver = TestDriver::new(Buckets::default()).input_partitions(2);
    let mut expected = pipe_ticks(&mut driver);
    driver.process().await.expect("first run");
    driver.lose_local_state().expect("lose the log");
    for n in 0..4 {
        let key = format!("k{n}");
        driver.pipe_record(at(&tick(1_000 + n, &key, 0), 60_000));
        expected.entry((key, 60)).or_default();
    }
    driver.process().await.expect("after the rebuild");
    assert_buckets(&closed(&driver), &expected, "after a rebuild");
}

#[tokio::test]
async fn wall_clock_timers_fire_when_the_clock_passes_them_and_cancelled_ones_never() {
    let mut driver = TestDriver::new(Buckets::default());
    let mut remind = tick(0, "a", 1);
    remind.remind_in_ms = Some(60_000);
    driver.pipe_record(at(&remind, 1));
    let mut other = tick(1, "b", 1);
    other.remind_in_ms = Some(60_000);
    driver.pipe_record(at(&other, 2));
    let mut cancel = tick(2, "b", 1);
    cancel.cancel = true;
    driver.pipe_record(at(&cancel, 3));
    driver.process().await.expect("process");
    let reminders = |driver: &TestDriver<Buckets>| {
        closed(driver)
            .into_iter()
            .filter(|c| c.bucket == -1)
            .count()
    };
    assert_eq!(reminders(&driver), 0, "not due yet");

    driver.advance_time(Duration::from_secs(59));
    driver.process().await.expect("process");
    assert_eq!(reminders(&driver), 0, "not due yet");
    driver.advance_time(Duration::from_secs(2));
    driver.process().await.expect("process");
    assert_eq!(
        reminders(&driver),
        1,
        "a's reminder, once; b's was cancelled"
    );
    driver.advance_time(Duration::from_secs(600));
    driver.process().await.expect("process");
    assert_eq!(reminders(&driver), 1, "still once");
}

#[tokio::test]
async fn a_timer_whose_handler_fails_is_dead_lettered_once_and_gone() {
    let mut driver = TestDriver::new(Buckets {
        failing_key: Some("a".into()),
    });
    let mut remind = tick(0, "a", 1);
    remind.remind_in_ms = Some(1_000);
    driver.pipe_record(at(&remind, 1));
    driver.process().await.expect("process");
    driver.advance_time(Duration::from_secs(5));
    driver.process().await.expect("process");
    driver.process().await.expect("process");
    let dead = driver.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].header("onceflow-timer"), Some(&b"remind/a"[..]));
    assert_eq!(
        dead[0].header("onceflow-error-class"),
        Some(&b"permanent"[..])
    );
    assert!(dead[0].value_str().contains("\"clock\":\"wall-clock\""));
}

#[tokio::test]
async fn a_processor_that_does_not_say_it_uses_timers_cannot_schedule() {
    #[derive(Debug, Clone)]
    struct Silent;
    #[onceflow::async_trait]
    impl Processor for Silent {
        type Input = Tick;
        fn name(&self) -> &str {
            "silent"
        }
        async fn process(&mut self, _: Tick, ctx: &mut Context<'_>) -> Result<()> {
            ctx.schedule_after("x", Duration::from_secs(1))
        }
    }
    let mut driver = TestDriver::new(Silent).configure(|c| {
        let mut c = c;
        c.on_error = onceflow::ErrorPolicy::Stop;
        c
    });
    driver.pipe_record(at(&tick(0, "a", 1), 1));
    let error = driver.process().await.expect_err("refused");
    assert!(error.to_string().contains("uses_timers"), "{error}");
}
