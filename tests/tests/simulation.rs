//! A seeded simulation of the fault space, over the engine's own code (the test driver's
//! in-memory Kafka): each seed makes one schedule of records and faults, runs it, and an
//! oracle checks the delivery mode's promise. One seed replays one schedule exactly.
//!
//! What a schedule draws (see `Fault`): a group of one to three instances (each its own
//! member, producer and state directory; eager rebalances at every start, stop, kill
//! and lost session; one instance at a time or the whole group in turn); errors of every
//! class at every Kafka call the driver can fail (retriable, abortable, fatal), per
//! instance; a crash at every crash point; kills that lose the applies not yet synced
//! (and leave their transaction open until the transaction timeout); a lost state
//! directory; an instance that lost its session and goes on as a zombie for some polls
//! while the others take its partitions; a hand-over to another instance with its own
//! state directory (which may come back later, stale); the changelog compacted a day
//! and a half later (values and tombstones gone); a consumer that starts a partition
//! past its committed offset; a partition revoked and assigned back while the consumer
//! is held (its records coming in the same poll); a send that times out on the client
//! and lands later unless fenced; and a workload of keyed amounts with copies sent at
//! once (same batch) and much later, refused records (dead letters), resets that delete
//! state, and a wall-clock reminder (a timer) per event of amount 3 or 7.
//!
//! The oracle, per delivery mode: exactly once: every event's output (or dead letter)
//! and reminder once, each key's outputs in order with the exact running sum, the state
//! exact, every event's dedup entry there; at least once: nothing lost, the state never
//! behind; at most once: no record twice, the state never ahead of its records.
//!
//! A failure names its seed and the command that replays it:
//! `SIM_SEED=<seed> cargo test -p onceflow-e2e --test simulation one_seed -- --nocapture`
//! (`SIM_DUMP=1` prints the changelog too). CI runs 2,000 schedules; `--features soak`
//! runs 100,000.

use std::collections::BTreeMap;
use std::time::Duration;

use onceflow::testing::{CommitFate, CrashPoint, KafkaCall, OutgoingRecord, TestDriver};
use onceflow::{Context, DeliveryMode, ErrorClass, Processor, Timer, TimerClock};
use onceflow_e2e::sum::{Amount, Sum, Summed};

const OUT: &str = "sums";
const REMINDERS: &str = "reminders";
/// How long after an event its reminder is due (of the driver's wall clock).
const REMIND_AFTER_MS: i64 = 5_000;

/// The workload: the running sum per key (`Sum`'s), and for each event of amount 3 or 7
/// a wall-clock reminder that emits its ID to `reminders` once due.
#[derive(Debug, Clone)]
struct Remindful(Sum);

fn wants_reminder(event: &Amount) -> bool {
    matches!(event.amount, 3 | 7)
}

#[onceflow::async_trait]
impl Processor for Remindful {
    type Input = Amount;

    fn name(&self) -> &str {
        "sum"
    }

    fn output_topics(&self) -> &[&str] {
        &[OUT, REMINDERS]
    }

    fn uses_timers(&self) -> bool {
        true
    }

    async fn process(&mut self, input: Amount, ctx: &mut Context<'_>) -> onceflow::Result<()> {
        if wants_reminder(&input) {
            let id = input.id.clone().unwrap_or_default();
            let due = ctx.now_ms() + REMIND_AFTER_MS;
            ctx.schedule(&format!("remind/{id}"), TimerClock::WallClock, due)?;
        }
        self.0.process(input, ctx).await
    }

    async fn on_timer(&mut self, timer: Timer, ctx: &mut Context<'_>) -> onceflow::Result<()> {
        let id = timer.key.strip_prefix("remind/").unwrap_or(&timer.key);
        ctx.emit(REMINDERS, id, &id)
    }
}

/// Schedules per test function (four of them run side by side).
#[cfg(not(feature = "soak"))]
const SCHEDULES: u64 = 500;
#[cfg(feature = "soak")]
const SCHEDULES: u64 = 25_000;

/// What one schedule is about, drawn from its seed.
#[derive(Debug)]
struct Schedule {
    delivery: DeliveryMode,
    /// Instances of the group (one: the single-instance faults too).
    instances: usize,
    partitions: i32,
    batch: usize,
    keys: usize,
    events: usize,
}

/// One step of a schedule.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Pipe the next events (each now and then with a copy at once, or a copy of an
    /// earlier one).
    Pipe(usize),
    /// Process what is there (every instance, until the group settles).
    Process,
    /// One instance processes what it has, the others do nothing meanwhile.
    ProcessInstance(usize),
    /// The wall clock moves on (reminders come due).
    AdvanceTime(i64),
    Fault(Fault),
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Instance `.0`'s nth call of a kind fails.
    Fail(usize, KafkaCall, u32, ErrorClass),
    /// Whichever instance passes the point the nth time crashes there.
    Crash(CrashPoint, u32),
    Kill(usize),
    LoseLocalState(usize),
    /// Instance `.0` loses its session and goes on as a zombie for `.1` polls, while the
    /// others take its partitions.
    Zombie(usize, u32),
    /// (One instance only.)
    SwitchInstance(usize),
    CompactAfterADayAndAHalf,
    MisplaceStart(i32, i64),
    RebalanceWhileHeld(i32),
    Restart(usize),
    /// Instance `.0`'s nth send times out on the client; its record lands later, with
    /// the producer's next transaction unless a new producer fenced it.
    TimeOutSend(usize, u32),
    /// Instance `.0`'s nth commit is in doubt (its markers land late, its request
    /// times out though it went through) or times out on its way and lands later.
    Commit(usize, u32, CommitFate),
    /// Instance `.0`'s static membership is fenced at its nth keep-alive poll while
    /// held; it joins again in the same process.
    FenceWhileHeld(usize, u32),
}

const CALLS: [KafkaCall; 7] = [
    KafkaCall::Begin,
    KafkaCall::Send,
    KafkaCall::SendOffsets,
    KafkaCall::Commit,
    KafkaCall::Abort,
    KafkaCall::CommittedOffsets,
    KafkaCall::KeepAlive,
];
const FATES: [CommitFate; 3] = [
    CommitFate::MarkersLate,
    CommitFate::TimesOutInDoubt,
    CommitFate::TimesOutLate,
];
const CLASSES: [ErrorClass; 3] = [
    ErrorClass::Retriable,
    ErrorClass::Abortable,
    ErrorClass::Fatal,
];

fn draw_schedule(rng: &mut fastrand::Rng) -> (Schedule, Vec<Step>) {
    let delivery = match rng.u8(0..10) {
        0..7 => DeliveryMode::ExactlyOnce,
        7..9 => DeliveryMode::AtLeastOnce,
        _ => DeliveryMode::AtMostOnce,
    };
    let schedule = Schedule {
        delivery,
        instances: if rng.bool() { 1 } else { rng.usize(2..=3) },
        partitions: rng.i32(1..=3),
        batch: rng.usize(1..=40),
        keys: rng.usize(1..=6),
        events: rng.usize(10..=80),
    };
    let mut steps = Vec::new();
    let mut left = schedule.events;
    while left > 0 {
        let n = rng.usize(1..=left.min(25));
        steps.push(Step::Pipe(n));
        left -= n;
        for _ in 0..rng.usize(0..=2) {
            steps.push(Step::Fault(draw_fault(rng, &schedule)));
        }
        if rng.u8(0..3) == 0 {
            steps.push(Step::AdvanceTime(rng.i64(1_000..=8_000)));
        }
        if schedule.instances > 1 && rng.bool() {
            for _ in 0..rng.usize(1..=3) {
                steps.push(Step::ProcessInstance(rng.usize(0..schedule.instances)));
            }
        } else {
            steps.push(Step::Process);
        }
    }
    (schedule, steps)
}

fn draw_fault(rng: &mut fastrand::Rng, schedule: &Schedule) -> Fault {
    let partitions = schedule.partitions;
    let instance = rng.usize(0..schedule.instances);
    match rng.u8(0..29) {
        27..29 => Fault::FenceWhileHeld(instance, rng.u32(1..=3)),
        24..27 => Fault::Commit(instance, rng.u32(1..=6), FATES[rng.usize(0..FATES.len())]),
        22..24 => Fault::TimeOutSend(instance, rng.u32(1..=6)),
        20..22 => Fault::RebalanceWhileHeld(rng.i32(0..partitions)),
        0..7 => Fault::Fail(
            instance,
            CALLS[rng.usize(0..CALLS.len())],
            rng.u32(1..=6),
            CLASSES[rng.usize(0..CLASSES.len())],
        ),
        7..11 => Fault::Crash(
            CrashPoint::ALL[rng.usize(0..CrashPoint::ALL.len())],
            rng.u32(1..=4),
        ),
        11 => Fault::Kill(instance),
        12 => Fault::LoseLocalState(instance),
        13..15 => Fault::Zombie(instance, rng.u32(0..=4)),
        15..17 if schedule.instances == 1 => Fault::SwitchInstance(rng.usize(0..3)),
        // A group: a zombie racing its successor, or a kill.
        15 => Fault::Zombie(instance, rng.u32(1..=4)),
        16 => Fault::Kill(instance),
        17 => Fault::CompactAfterADayAndAHalf,
        18 => Fault::MisplaceStart(rng.i32(0..partitions), rng.i64(1..=3)),
        _ => Fault::Restart(instance),
    }
}

/// An input event: keyed, with an ID; a negative amount is refused (dead-lettered); an
/// amount of 0 resets the key (deletes its state), in exactly-once schedules only (at
/// least once may do a reset again after later additions, at most once may skip one:
/// their promises about state hold for sums that only grow).
fn event(rng: &mut fastrand::Rng, index: usize, keys: usize, resets: bool) -> Amount {
    let amount = match rng.u8(0..25) {
        0 => -rng.i64(1..=9),
        1..=2 if resets => 0,
        _ => rng.i64(1..=9),
    };
    Amount {
        id: Some(format!("e-{index}")),
        key: format!("k{}", rng.usize(0..keys)),
        amount,
        anonymous: false,
    }
}

fn keyed(event: &Amount) -> OutgoingRecord {
    OutgoingRecord::keyed(event.key.clone(), serde_json::to_vec(event).expect("json"))
}

/// Runs the schedule of `seed`; `Err` says what the oracle found.
async fn run(seed: u64) -> Result<(), String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (schedule, steps) = draw_schedule(&mut rng);
    let mut driver = TestDriver::new(Remindful(Sum::new(OUT)))
        .configure(|config| {
            let mut config = config
                .output(OUT)
                .output(REMINDERS)
                .delivery(schedule.delivery)
                .batching(Duration::from_millis(100), schedule.batch);
            // Every copy, however late, stays inside the dedup window.
            config.dedup_window = Duration::from_secs(30 * 24 * 3600);
            config
        })
        .input_partitions(schedule.partitions)
        .topic_partitions(OUT, schedule.partitions)
        .instances(schedule.instances);
    let mut events: Vec<Amount> = Vec::new();
    // How many input records each event has (copies included).
    let mut records: Vec<usize> = Vec::new();
    // Where each event's first record landed.
    let mut landed: Vec<(i32, i64)> = Vec::new();
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    let note = |at: (i32, i64), ends: &mut BTreeMap<i32, i64>| {
        let end = ends.entry(at.0).or_default();
        *end = (*end).max(at.1 + 1);
    };
    for step in &steps {
        match *step {
            Step::Pipe(n) => {
                for _ in 0..n {
                    let resets = schedule.delivery == DeliveryMode::ExactlyOnce;
                    let next = event(&mut rng, events.len(), schedule.keys, resets);
                    let at = driver.pipe_record(keyed(&next));
                    note(at, &mut ends);
                    let refused = next.amount < 0;
                    events.push(next);
                    landed.push(at);
                    records.push(1);
                    // A producer's retry: a copy at once, often in the same batch.
                    if !refused && rng.u8(0..8) == 0 {
                        let copy = driver.pipe_again(at.0, at.1).expect("just piped");
                        note(copy, &mut ends);
                        *records.last_mut().expect("just pushed") += 1;
                    }
                    // An upstream's replay: a copy of an earlier event, much later.
                    if rng.u8(0..12) == 0 {
                        let earlier = rng.usize(0..events.len());
                        if events[earlier].amount >= 0 {
                            let (p, o) = landed[earlier];
                            let copy = driver.pipe_again(p, o).expect("piped before");
                            note(copy, &mut ends);
                            records[earlier] += 1;
                        }
                    }
                }
            }
            Step::Process => {
                // A stopped instance (a fatal error) starts again at the next call.
                let _ = driver.process().await;
            }
            Step::ProcessInstance(index) => {
                let _ = driver.process_instance(index).await;
            }
            Step::AdvanceTime(ms) => driver.advance_time(Duration::from_millis(ms as u64)),
            Step::Fault(fault) => apply(&mut driver, fault)?,
        }
    }
    // Settle: every reminder comes due; faults still armed fire or not; the group runs
    // until every input record is committed.
    let mut settled = false;
    for round in 0..30 {
        // Reminders of events processed in the last round come due.
        driver.advance_time(Duration::from_millis(REMIND_AFTER_MS as u64 + 1));
        let outcome = driver.process().await;
        // Commits in doubt land (their coordinator writes the markers).
        tokio::time::sleep(Duration::from_secs(10)).await;
        if outcome.is_ok()
            && ends
                .iter()
                .all(|(p, end)| driver.committed_offset(*p) == Some(*end))
        {
            settled = true;
            break;
        }
        // A consumer started past its floor is noticed by the partition's next record
        // (then the engine seeks back): on a partition that gets none it waits. A live
        // stream's next record, on each partition short of its end.
        if round == 4 {
            for partition in 0..schedule.partitions {
                let end = ends.get(&partition).copied();
                if end.is_some() && driver.committed_offset(partition) != end {
                    let next = Amount {
                        id: Some(format!("e-{}", events.len())),
                        key: format!("tail-{partition}"),
                        amount: 1,
                        anonymous: false,
                    };
                    let mut record = keyed(&next);
                    record.partition = Some(partition);
                    let at = driver.pipe_record(record);
                    note(at, &mut ends);
                    events.push(next);
                    landed.push(at);
                    records.push(1);
                }
            }
        }
    }
    // The reminders of the last round's events come due and fire. A failed timer
    // batch fires them again at the next run (a live instance's next poll), and each
    // injected fault, crash or timeout fires once at most: with one run more than
    // there are of those, one run at least has none, and fires every reminder due.
    let armed = steps
        .iter()
        .filter(|step| {
            matches!(
                step,
                Step::Fault(
                    Fault::Fail(..)
                        | Fault::Crash(..)
                        | Fault::TimeOutSend(..)
                        | Fault::Commit(..)
                        | Fault::FenceWhileHeld(..)
                )
            )
        })
        .count();
    for _ in 0..=armed {
        driver.advance_time(Duration::from_millis(REMIND_AFTER_MS as u64 + 1));
        let _ = driver.process().await;
    }
    // The markers of commits still in doubt land, as their coordinator writes them.
    tokio::time::sleep(Duration::from_secs(10)).await;
    if !settled {
        return Err(format!(
            "the input was not committed to its end after 30 runs: committed {:?}, ends {ends:?}",
            (0..schedule.partitions)
                .map(|p| driver.committed_offset(p))
                .collect::<Vec<_>>()
        ));
    }
    if std::env::var_os("SIM_DUMP").is_some() {
        // The changelog, to see who wrote what when a seed fails.
        for record in driver.output(driver.config().changelog_topic()) {
            let text = |bytes: Option<&[u8]>| {
                bytes.map_or("-".into(), |b| String::from_utf8_lossy(b).into_owned())
            };
            println!(
                "changelog {}@{} {} = {}",
                record.partition,
                record.offset,
                text(record.key.as_deref()),
                text(record.value.as_deref())
            );
        }
    }
    check(&driver, &schedule, &events, &landed, &records)
}

fn apply(driver: &mut TestDriver<Remindful>, fault: Fault) -> Result<(), String> {
    let failed = |what: &str, e: onceflow::Error| format!("{what}: {e}");
    match fault {
        Fault::Fail(index, call, nth, class) => driver.fail_instance(index, call, nth, class),
        Fault::Crash(point, nth) => driver.crash_at(point, nth),
        Fault::Kill(index) => driver.kill_instance(index).map_err(|e| failed("kill", e))?,
        Fault::LoseLocalState(index) => driver
            .lose_local_state_of(index)
            .map_err(|e| failed("lose the local state", e))?,
        Fault::Zombie(index, polls) => driver.lose_session_of(index, polls),
        Fault::SwitchInstance(n) => driver
            .switch_instance(&format!("instance-{n}"))
            .map_err(|e| failed("switch instance", e))?,
        Fault::CompactAfterADayAndAHalf => {
            driver.advance_time(Duration::from_secs(36 * 3600));
            driver.compact_changelog();
        }
        Fault::MisplaceStart(partition, by) => {
            driver.misplace_next_assignment(partition, by);
            driver.restart().map_err(|e| failed("restart", e))?;
        }
        Fault::RebalanceWhileHeld(partition) => driver.rebalance_while_held(partition),
        Fault::TimeOutSend(index, nth) => driver.time_out_send(index, nth),
        Fault::Commit(index, nth, fate) => driver.commit_fate(index, nth, fate),
        Fault::FenceWhileHeld(index, nth) => driver.fence_member_while_held(index, nth),
        Fault::Restart(index) => driver
            .restart_instance(index)
            .map_err(|e| failed("restart", e))?,
    }
    Ok(())
}

/// Whether `got` copies of one event's effect keep the promise of `mode` for an event
/// that came in `records` input records.
fn delivered(mode: DeliveryMode, got: usize, records: usize) -> bool {
    match mode {
        DeliveryMode::ExactlyOnce => got == 1,
        DeliveryMode::AtLeastOnce => got >= 1,
        // At most once is a promise per record: each copy at most once. Dedup by event
        // ID is best effort there (an entry not yet applied when a copy comes).
        _ => got <= records,
    }
}

/// The oracle.
fn check(
    driver: &TestDriver<Remindful>,
    schedule: &Schedule,
    events: &[Amount],
    landed: &[(i32, i64)],
    records: &[usize],
) -> Result<(), String> {
    let outputs: Vec<Summed> = driver
        .output_values(OUT)
        .map_err(|e| format!("outputs: {e}"))?;
    let mut output_count: BTreeMap<&str, usize> = BTreeMap::new();
    for output in &outputs {
        *output_count
            .entry(output.id.as_deref().unwrap_or("?"))
            .or_default() += 1;
    }
    let mut dead_count: BTreeMap<String, usize> = BTreeMap::new();
    for dead in driver.dead_letters() {
        let value: Amount = serde_json::from_slice(dead.value.as_deref().unwrap_or_default())
            .map_err(|e| format!("a dead letter's value: {e}"))?;
        *dead_count.entry(value.id.unwrap_or_default()).or_default() += 1;
    }
    let mut reminded: BTreeMap<String, usize> = BTreeMap::new();
    for reminder in driver.output(REMINDERS) {
        let id: String = serde_json::from_slice(reminder.value.as_deref().unwrap_or_default())
            .map_err(|e| format!("a reminder's value: {e}"))?;
        *reminded.entry(id).or_default() += 1;
    }
    let mode = schedule.delivery;
    let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
    // At most once promises each input record at most once, and dedups copies only at
    // best: its state is bounded by every record's amount, copies included (it has no
    // resets).
    let mut per_record: BTreeMap<&str, i64> = BTreeMap::new();
    for ((event, at), records) in events.iter().zip(landed).zip(records) {
        let id = event.id.as_deref().unwrap_or_default();
        let (out, dead) = (
            output_count.get(id).copied().unwrap_or(0),
            dead_count.get(id).copied().unwrap_or(0),
        );
        let (wanted, got) = if event.amount < 0 {
            if out > 0 {
                return Err(format!("{id} (refused) has {out} outputs"));
            }
            ("dead letters", dead)
        } else {
            *per_record.entry(&event.key).or_default() += event.amount * *records as i64;
            let sum = sums.entry(&event.key).or_default();
            *sum = if event.amount == 0 {
                0
            } else {
                *sum + event.amount
            };
            if dead > 0 {
                return Err(format!("{id} was dead-lettered {dead} times"));
            }
            ("outputs", out)
        };
        if !delivered(mode, got, *records) {
            return Err(format!(
                "{id} has {got} {wanted} from {records} input records ({mode:?})"
            ));
        }
        let reminders = reminded.remove(id).unwrap_or(0);
        let kept = if wants_reminder(event) {
            delivered(mode, reminders, *records)
        } else {
            reminders == 0
        };
        if !kept {
            return Err(format!(
                "{id} has {reminders} reminders from {records} input records ({mode:?})"
            ));
        }
        if event.amount >= 0
            && mode != DeliveryMode::AtMostOnce
            && !driver
                .is_processed(at.0, id)
                .map_err(|e| format!("dedup entry of {id}: {e}"))?
        {
            return Err(format!("{id} has no dedup entry in partition {}", at.0));
        }
    }
    if let Some((id, count)) = reminded.into_iter().next() {
        return Err(format!("{count} reminders of {id}, which is no event"));
    }
    for (key, sum) in &sums {
        let state: Vec<i64> = (0..schedule.partitions)
            .filter_map(|p| driver.state::<i64>(p, key).ok().flatten())
            .collect();
        let found = state.iter().sum::<i64>();
        let kept = match mode {
            // A key reset last has no state (0 is never stored: a reset deletes it).
            DeliveryMode::ExactlyOnce if *sum == 0 => state.is_empty(),
            DeliveryMode::ExactlyOnce => state.len() == 1 && found == *sum,
            DeliveryMode::AtLeastOnce => found >= *sum,
            _ => found <= per_record.get(key).copied().unwrap_or(0),
        };
        if !kept {
            return Err(format!(
                "the state of {key} is {state:?}, the sum of its events {sum} ({mode:?})"
            ));
        }
    }
    if mode == DeliveryMode::ExactlyOnce {
        // Each key's outputs in the order its events were first piped, with the exact
        // running sum.
        let first_at: BTreeMap<&str, usize> = events
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id.as_deref().unwrap_or_default(), i))
            .collect();
        let mut by_key: BTreeMap<&str, Vec<&Summed>> = BTreeMap::new();
        for output in &outputs {
            by_key.entry(&output.key).or_default().push(output);
        }
        for (key, list) in by_key {
            let mut running = 0;
            let mut last = None;
            for output in list {
                running = if output.amount == 0 {
                    0
                } else {
                    running + output.amount
                };
                let at = first_at.get(output.id.as_deref().unwrap_or_default());
                if output.sum != running || at < last {
                    return Err(format!(
                        "{key}'s outputs are out of order or their sums wrong at {output:?} \
                         (running sum {running})"
                    ));
                }
                last = at;
            }
        }
    }
    Ok(())
}

/// Runs `seeds`; panics with every failing seed and how to replay it.
async fn run_seeds(seeds: impl IntoIterator<Item = u64>) {
    let mut count = 0;
    let mut failed = Vec::new();
    for seed in seeds {
        count += 1;
        if let Err(why) = run(seed).await {
            failed.push(format!(
                "seed {seed}: {why}\n  replay: SIM_SEED={seed} cargo test -p onceflow-e2e \
                 --test simulation one_seed -- --nocapture"
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {count} schedules broke the promise:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[tokio::test(start_paused = true)]
async fn schedules_from_seed_0() {
    run_seeds(0..SCHEDULES).await;
}

#[tokio::test(start_paused = true)]
async fn schedules_from_seed_1m() {
    run_seeds(1_000_000..1_000_000 + SCHEDULES).await;
}

#[tokio::test(start_paused = true)]
async fn schedules_from_seed_2m() {
    run_seeds(2_000_000..2_000_000 + SCHEDULES).await;
}

#[tokio::test(start_paused = true)]
async fn schedules_from_seed_3m() {
    run_seeds(3_000_000..3_000_000 + SCHEDULES).await;
}

/// Seeds the soak (`--features soak`) found broken, run in every CI run since: hole M
/// of issue 40 (a refused record's dead letter twice after the partition's first commit
/// was in doubt: 3580 and the rest) and seed 19387 (at least once's timers going on
/// from a progress that landed without a dedup entry beside it).
const SOAK_FOUND: [u64; 19] = [
    3580, 4258, 17518, 19247, 19387, 21027, 23578, 1023533, 2001978, 2006823, 2012115, 2017789,
    2018381, 2018814, 2022343, 3006134, 3009154, 3014393, 3024121,
];

#[tokio::test(start_paused = true)]
async fn seeds_the_soak_found() {
    run_seeds(SOAK_FOUND).await;
}

/// Replays one schedule: `SIM_SEED` (else seed 7), printing it.
#[tokio::test(start_paused = true)]
async fn one_seed() {
    let seed = std::env::var("SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let mut rng = fastrand::Rng::with_seed(seed);
    let (schedule, steps) = draw_schedule(&mut rng);
    println!("seed {seed}: {schedule:?}\n{steps:?}");
    if let Err(why) = run(seed).await {
        panic!("seed {seed}: {why}");
    }
}
