//! Timers through the test driver: event-time timers fire once, in order, as the event
//! time passes them, through every crash point and a rebuild from the changelog;
//! wall-clock timers fire when the driver's clock passes them; a cancelled timer never
//! fires; a failing handler's timer is dead-lettered, not retried for ever.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow::testing::{CommitFate, CrashPoint, KafkaCall, TestDriver};
use onceflow::{Context, ErrorClass, Processor, Result};
use onceflow_e2e::buckets::{Buckets, Closed, OUT, Tick, assert_buckets, at, tick, ticks};

/// Pipes the ticks of `ticks(10_000)`, copies included.
fn pipe_ticks(driver: &mut TestDriver<Buckets>) -> BTreeMap<(String, i64), i64> {
    let (records, expected) = ticks(10_000);
    for record in records {
        driver.pipe_record(record);
    }
    expected
}

fn closed(driver: &TestDriver<Buckets>) -> Vec<Closed> {
    driver.output_values(OUT).expect("outputs")
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

/// Counts records per key in hopping windows of 60 s every 20 s, late ones dropped.
#[derive(Debug, Clone)]
struct Hopping;

const HOPPING: onceflow::windows::Windows =
    onceflow::windows::Windows::hopping("h", Duration::from_secs(60), Duration::from_secs(20))
        .drop_late();

#[onceflow::async_trait]
impl Processor for Hopping {
    type Input = Tick;

    fn name(&self) -> &str {
        "hopping"
    }

    fn output_topics(&self) -> &[&str] {
        &[OUT]
    }

    fn uses_timers(&self) -> bool {
        true
    }

    async fn process(&mut self, tick: Tick, ctx: &mut Context<'_>) -> Result<()> {
        HOPPING
            .add(ctx, &tick.key, |count: &mut i64| *count += 1)
            .map(drop)
    }

    async fn on_timer(&mut self, timer: onceflow::Timer, ctx: &mut Context<'_>) -> Result<()> {
        if let Some(closed) = HOPPING.close::<i64>(ctx, &timer)? {
            let out = Closed {
                key: closed.key.clone(),
                bucket: closed.window.start_ms,
                sum: closed.value,
            };
            ctx.emit(OUT, &closed.key, &out)?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn hopping_windows_count_each_record_in_every_window_it_falls_in_and_drop_late_ones() {
    let mut driver = TestDriver::new(Hopping);
    // Records at 5 s, 25 s, 45 s and 65 s; then 130 s closes every window up to 120 s.
    for (n, at_s) in [5, 25, 45, 65, 130].into_iter().enumerate() {
        driver.pipe_record(at(&tick(n, "a", 1), at_s * 1_000));
    }
    // Late: every window holding 10 s ended by 70 s, and the watermark is at 130 s.
    driver.pipe_record(at(&tick(9, "a", 1), 10_000));
    driver.process().await.expect("process");
    let closed: Vec<Closed> = driver.output_values(OUT).expect("outputs");
    let windows: Vec<(i64, i64)> = closed.iter().map(|c| (c.bucket / 1_000, c.sum)).collect();
    // Windows by start (s): [-40,20) holds 5; [-20,40) 5, 25; [0,60) 5, 25, 45;
    // [20,80) 25, 45, 65; [40,100) 45, 65; [60,120) 65. Those ending by 130 s are closed.
    assert_eq!(
        windows,
        [(-40, 1), (-20, 2), (0, 3), (20, 3), (40, 2), (60, 1)]
    );
    assert!(
        driver.dead_letters().is_empty(),
        "late records are dropped, not dead-lettered"
    );
}

/// Hole D of issue 40, seen against the broker: an instance frozen past its session
/// fired its wall-clock timers when it ran again and committed their outputs in a
/// transaction with no input offsets, which the group's generation check never sees
/// (KIP-447), while the new owner fired the same timers: every reminder twice. A
/// zombie's timer transaction must be refused; the timer fires once, after it rejoined.
#[tokio::test(start_paused = true)]
async fn a_zombie_that_lost_its_session_cannot_commit_the_wall_clock_timers_it_fires() {
    let mut driver = TestDriver::new(Buckets::default());
    let reminders = |driver: &TestDriver<Buckets>| {
        closed(driver)
            .into_iter()
            .filter(|c| c.bucket == -1)
            .count()
    };
    let mut remind = tick(0, "a", 1);
    remind.remind_in_ms = Some(60_000);
    driver.pipe_record(at(&remind, 1));
    driver.process().await.expect("process");

    driver.lose_session(1);
    driver.advance_time(Duration::from_secs(61));
    driver.process().await.expect("the zombie's run");
    assert_eq!(
        reminders(&driver),
        0,
        "the zombie committed the reminder it fired after losing its session"
    );
    assert!(driver.stats().aborts >= 1, "its transaction was aborted");

    driver.process().await.expect("after joining again");
    assert_eq!(
        reminders(&driver),
        1,
        "the reminder fires once, once it rejoined"
    );
}

/// At most once commits a batch's offsets before it processes its records, so a record
/// is never done twice; but a timer is state. Before the fix a timer's outputs were sent
/// while it fired, before its removal was recorded: a failed changelog send after them
/// (the simulation's seed: an abortable error) made the batch go again, and its timer
/// fire again: the reminder twice. Its outputs now go out only once its removal landed
/// and was applied. Each of the timer batch's sends fails in turn.
#[tokio::test(start_paused = true)]
async fn at_most_once_never_fires_a_wall_clock_timer_twice_when_its_batch_fails() {
    for nth in 1..=4 {
        let mut driver = TestDriver::new(Buckets::default())
            .configure(|c| c.delivery(onceflow::DeliveryMode::AtMostOnce));
        let mut remind = tick(0, "a", 1);
        remind.remind_in_ms = Some(60_000);
        driver.pipe_record(at(&remind, 1));
        driver.process().await.expect("process");
        driver.advance_time(Duration::from_secs(61));
        driver.fail(KafkaCall::Send, nth, ErrorClass::Abortable);
        driver.process().await.expect("the timers' run");
        driver.process().await.expect("again");
        let reminders = closed(&driver)
            .into_iter()
            .filter(|c| c.bucket == -1)
            .count();
        assert!(
            reminders <= 1,
            "send {nth} of the timers' batch failed: the reminder came {reminders} times"
        );
    }
}

/// Found by the simulation (seed 1000401, once it had commits in doubt): a batch of
/// timers alone commits the group's offsets of its partitions again, for the
/// generation check (hole D); it read them from the group, and that read can lag a
/// batch whose commit is in doubt (hole F's premise). The timers' transaction then
/// committed the older offset over the newer one, the group's offset went back, and
/// the records between were done again: their outputs skipped as duplicates, but a
/// refused record's dead letter twice. The offsets it commits again are never older
/// than what the transaction log has seen committed.
#[tokio::test(start_paused = true)]
async fn a_timer_batch_never_moves_the_groups_offset_back_over_a_batch_in_doubt() {
    let mut driver = TestDriver::new(Buckets::default());
    let mut remind = tick(0, "a", 1);
    remind.remind_in_ms = Some(60_000);
    driver.pipe_record(at(&remind, 1));
    driver.process().await.expect("process");
    assert_eq!(driver.committed_offset(0), Some(1));

    // The next batch commits, its markers late: the group's offset still reads 1.
    driver.pipe_record(at(&tick(1, "b", 1), 2));
    driver.commit_fate(0, 1, CommitFate::MarkersLate);
    driver.process().await.expect("the batch in doubt");
    // The reminder comes due: a batch of timers alone.
    driver.advance_time(Duration::from_secs(61));
    driver.process().await.expect("the timers' run");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        driver.committed_offset(0),
        Some(2),
        "the timers' transaction moved the group's offset back"
    );
}
