//! Exactly once on a three-node cluster while its nodes, its network and its instances
//! fail (issue 13). The cluster runs topics with three replicas and
//! `min.insync.replicas=2`, so one node down at a time is what it must survive without
//! losing or doubling anything, and without stopping. In every test a `read_committed`
//! reader runs through the faults: what it saw must be what a final read sees. The tests:
//!
//! - an in-process instance through a killed transaction coordinator, a restarted input
//!   leader and a stalled group coordinator;
//! - [`the_fault_matrix`]: Kafka's own transaction test with two `sum_processor`
//!   processes as the copier, every bounce target hard and clean, a node cut off its
//!   peers, an instance cut off the network (CI's size; `--features soak` for the full one);
//! - a frozen instance that wakes as a zombie;
//! - an instance started while its transaction coordinator is down.
//!
//! The first test's events are a third without an event ID the engine sees, so a batch
//! processed again shows as doubled outputs, not as dedup's skips. That is how it failed
//! one run in seven: a killed transaction coordinator left a commit in doubt that went
//! through, the group's offsets still read the batch's start, and its records came again
//! (dedup skipped them then; events without an ID would have been doubled). Recovery now
//! goes on from the changelog's progress, committed in the same transaction.
//!
//! The first test's history: the stall (or a killed node that coordinated the group) made librdkafka fence the
//! instance's own static member: the session expired, the member rejoined under the same
//! `group.instance.id`, and a request with the old member ID was answered
//! `FENCED_INSTANCE_ID`, fatal for the consumer. Before the engine joined again in that
//! case, this test failed with the instance stopped as `Fenced` (1,400 of 6,000 outputs).
//!
//! The killed transaction coordinator can also fence the instance's producer with no
//! successor anywhere: the abort's epoch bump reached the old coordinator, its answer did
//! not, and the new coordinator refused the old epoch ("Failed to end transaction: …
//! fenced by a newer instance"). Before recovery told that from a successor by the
//! group's membership, this test failed one run in six or seven that way (stopped at
//! 1,300 and 1,700 of 6,000 outputs).

use std::time::{Duration, Instant};

use onceflow::Engine;
use onceflow_e2e::child::Instance;
use onceflow_e2e::sum::{self, Amount, Sum};
use onceflow_e2e::{Operator, Watcher};
use onceflow_testkit::Cluster;
use onceflow_testkit::Isolation;

const WITHIN: Duration = Duration::from_secs(240);

/// The final checks of every test here: each event exactly once with exact running
/// sums, and the reader that ran through the faults saw what a final read sees (no
/// aborted record ever visible, none in another order).
async fn check_exactly_once(
    op: &Operator,
    events: &[Amount],
    watcher: Watcher,
) -> Result<(), Box<dyn std::error::Error>> {
    let outputs = sum::committed_outputs(op.kafka, &op.output).await?;
    sum::assert_exactly_once(events, &outputs);
    let last = op
        .kafka
        .read_to_end(&op.output, Isolation::ReadCommitted)
        .await?;
    watcher.finish(events.len(), Duration::from_secs(60), &last);
    Ok(())
}

/// The end of a test with an in-process instance: waits until the group committed the
/// whole input, stops the instance, heals the cluster, then fails on whichever of the
/// wait or the instance failed.
async fn stop_caught_up(
    cluster: &Cluster,
    op: &Operator,
    shutdown: onceflow::Shutdown,
    running: tokio::task::JoinHandle<onceflow::Result<onceflow::StatsSnapshot>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let done = sum::wait_for_caught_up(op.kafka, &op.group, &op.input, WITHIN).await;
    shutdown.trigger();
    let stopped = running.await?;
    cluster.heal().await?;
    done?;
    stopped?;
    Ok(())
}

/// One fault test at a time: the tests share the binary's cluster, and one test's
/// faults would land in the middle of another's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_and_alive_through_a_killed_coordinator_a_restarted_leader_and_a_stall()
-> Result<(), Box<dyn std::error::Error>> {
    let _alone = ONE_AT_A_TIME.lock().await;
    onceflow_e2e::test_logs();
    let cluster: &'static Cluster = onceflow_testkit::cluster().await;
    eprintln!("three-node cluster started in {:?}", cluster.started_in);
    // A node's log can be read: what a cluster that does not heal shows of its nodes.
    let log = cluster.log_tail(cluster.node_ids()[0], 20).await;
    assert!(
        log.lines().count() >= 5 && !log.starts_with("(no log"),
        "node 1's log: {log}"
    );
    let op = Operator::on(cluster.kafka(), "cluster", 3).await?;
    // Reads the outputs while the faults happen.
    let watcher = Watcher::start(op.kafka, &op.output, 3);

    // A third of the events carry no event ID the engine sees: only offsets keep them
    // from being processed twice, so a batch handled again after a commit that went
    // through doubles their outputs and sums (dedup would hide it for the others).
    let mut events = sum::amounts(0, 6_000, 30);
    for event in events.iter_mut().skip(1).step_by(3) {
        event.anonymous = true;
    }
    // 5% of those with an ID sent again with the same event ID.
    let again: Vec<Amount> = events
        .iter()
        .filter(|event| !event.anonymous)
        .step_by(20)
        .cloned()
        .collect();
    sum::produce(op.kafka, &op.input, &events).await?;
    sum::produce(op.kafka, &op.input, &again).await?;

    // Small batches, so the faults land in the middle of the stream (60 odd batches).
    let config = op.config("a").batching(Duration::from_millis(100), 100);
    let transactional_id = config.transactional_id();
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(&op.output)));
    let deadline = Instant::now() + WITHIN;

    sum::outputs_reach(op.kafka, &op.output, 1_200, deadline, &running).await;
    let coordinator = cluster.transaction_coordinator(&transactional_id).await?;
    eprintln!("killing node {coordinator}, the transaction coordinator");
    cluster.kill(coordinator).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.start_node(coordinator).await?;

    sum::outputs_reach(op.kafka, &op.output, 3_000, deadline, &running).await;
    let leader = cluster.leader(&op.input, 0).await?;
    eprintln!("restarting node {leader}, the leader of the input's partition 0");
    cluster.restart(leader).await?;

    sum::outputs_reach(op.kafka, &op.output, 4_500, deadline, &running).await;
    // Longer than the 6 s session timeout of the tests' configuration.
    let group = cluster.group_coordinator(&op.group).await?;
    eprintln!("pausing node {group}, the group coordinator, for 8 s");
    cluster.pause(group).await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.unpause(group).await?;

    if running.is_finished() {
        let stopped = running.await?;
        cluster.heal().await?;
        panic!("the instance stopped during the faults: {stopped:?}");
    }
    let deadline = Instant::now() + WITHIN;
    sum::outputs_reach(op.kafka, &op.output, events.len(), deadline, &running).await;
    let visible = sum::committed_outputs(op.kafka, &op.output).await?.len();
    if visible < events.len() {
        // Say where they are before anything stops: stuck, uncommitted, or lost.
        let why = sum::explain_missing(op.kafka, &op.group, &op.input, &op.output, &events).await;
        let outcome = if running.is_finished() {
            format!("stopped with {:?}", running.await?)
        } else {
            "still running".to_owned()
        };
        panic!(
            "only {visible} of {} outputs after {WITHIN:?}: {why}; the instance ({:?}, \
             {outcome}): {:?}",
            events.len(),
            stats.phase(),
            stats.snapshot()
        );
    }
    stop_caught_up(cluster, &op, shutdown, running).await?;

    check_exactly_once(&op, &events, watcher).await?;
    let snapshot = stats.snapshot();
    // Whether a commit in doubt was gone past (`already_committed`, `replayed_records`).
    eprintln!("counters: {snapshot:?}");
    assert_eq!(
        (snapshot.duplicates_skipped, snapshot.without_event_id),
        (
            again.len() as u64,
            events.iter().filter(|event| event.anonymous).count() as u64
        ),
        "{snapshot:?}"
    );
    // Item 11 of the holes issue: onceflow's own topics take the broker's default
    // replication factor (3 here), not 1. The replicas, not the in-sync set: a node the
    // faults restarted or paused may still be catching up, which says nothing of the
    // factor the topic was made with.
    let changelog = format!("{}-txlog", op.group);
    let replicas = cluster.replicas(&changelog, 0).await?;
    let in_sync = cluster.in_sync(&changelog, 0).await?;
    eprintln!("changelog [0]: replicas {replicas:?}, in sync {in_sync:?}");
    assert_eq!(
        replicas.len(),
        3,
        "replicas {replicas:?}, in sync {in_sync:?}"
    );
    Ok(())
}

/// Fail closed (issue 40): librdkafka has no Transactions V2 (KIP-890 part 2), so a
/// transactional request that timed out on the client may still land in a later
/// transaction of the same producer epoch. The node coordinating the instance's
/// transactions is paused (every request to it hangs) for longer than the producer's
/// calls wait, so a commit or `send_offsets` of a batch under way times out on the
/// client; the paused node stays the coordinator (its broker session outlives the
/// pause). The instance must replace the producer rather than use it again, and every
/// event must come out exactly once when the node is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_when_transactional_requests_time_out_on_a_paused_coordinator()
-> Result<(), Box<dyn std::error::Error>> {
    let _alone = ONE_AT_A_TIME.lock().await;
    onceflow_e2e::test_logs();
    let cluster: &'static Cluster = onceflow_testkit::cluster().await;
    let op = Operator::on(cluster.kafka(), "stalled-txn", 3).await?;
    let watcher = Watcher::start(op.kafka, &op.output, 3);
    // A third without an event ID the engine sees: a batch done again after a commit
    // that went through would double their outputs.
    let mut events = sum::amounts(0, 3_000, 30);
    for event in events.iter_mut().skip(1).step_by(3) {
        event.anonymous = true;
    }
    sum::produce(op.kafka, &op.input, &events).await?;
    let config = op.config("a").batching(Duration::from_millis(100), 50);
    let transactional_id = config.transactional_id();
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let stats = engine.stats();
    let running = tokio::spawn(engine.run(Sum::new(&op.output)));
    let deadline = Instant::now() + WITHIN;

    sum::outputs_reach(op.kafka, &op.output, 1_000, deadline, &running).await;
    let coordinator = cluster.transaction_coordinator(&transactional_id).await?;
    eprintln!("pausing node {coordinator}, the transaction coordinator, for 15 s");
    cluster.pause(coordinator).await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    cluster.unpause(coordinator).await?;
    if running.is_finished() {
        let stopped = running.await?;
        cluster.heal().await?;
        panic!("the instance stopped during the pause: {stopped:?}");
    }
    let deadline = Instant::now() + WITHIN;
    sum::outputs_reach(op.kafka, &op.output, events.len(), deadline, &running).await;
    stop_caught_up(cluster, &op, shutdown, running).await?;
    check_exactly_once(&op, &events, watcher).await?;
    let snapshot = stats.snapshot();
    eprintln!("counters: {snapshot:?}");
    assert!(
        snapshot.producers_replaced >= 1,
        "no producer was replaced: the pause timed nothing out, or a timed-out producer \
         was used again: {snapshot:?}"
    );
    Ok(())
}

/// An instance that starts while its transaction coordinator is down waits for the cluster
/// to move the coordinator, as recovery does, instead of stopping. The node is killed just
/// before the start, so the instance's first `init_transactions` finds no coordinator until
/// the node's broker session ends (`broker.session.timeout.ms`: 60 s in the testkit,
/// Kafka's default is 9 s): then the controller fences it and another node takes its
/// transaction log's partition, or the restarted node may register again. A 3 s transaction
/// timeout (the call's own limit) makes the first calls time out; CI's fault matrix hit the
/// same with the default 10 s, and its instance, restarted then, stopped with
/// "init_transactions failed: Timed out" (exit 2) before this wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_while_its_transaction_coordinator_is_down_waits_for_it()
-> Result<(), Box<dyn std::error::Error>> {
    let _alone = ONE_AT_A_TIME.lock().await;
    onceflow_e2e::test_logs();
    let cluster: &'static Cluster = onceflow_testkit::cluster().await;
    let op = Operator::on(cluster.kafka(), "late", 3).await?;
    let events = sum::amounts(0, 600, 12);
    sum::produce(op.kafka, &op.input, &events).await?;

    let mut config = op.config("a");
    config.transaction_timeout = Duration::from_secs(3);
    let transactional_id = config.transactional_id();
    // Kafka makes its transaction log at the first transactional producer: on a new
    // cluster (this test alone) it is not there yet.
    let warm_up = format!("{}-warm-up", op.group);
    drop(tokio::task::block_in_place(|| {
        onceflow_e2e::transactional_producer(op.kafka, &warm_up)
    }));
    let coordinator = cluster.transaction_coordinator(&transactional_id).await?;
    eprintln!("killing node {coordinator}, the transaction coordinator, before the start");
    cluster.kill(coordinator).await?;
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(Sum::new(&op.output)));

    // Five of the call's 3 s, all while the coordinator is gone: the start must keep
    // trying through them.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let stopped_early = running.is_finished();
    cluster.start_node(coordinator).await?;
    if stopped_early {
        let stopped = running.await?;
        cluster.heal().await?;
        panic!("the instance stopped while its transaction coordinator was down: {stopped:?}");
    }
    let deadline = Instant::now() + WITHIN;
    sum::outputs_reach(op.kafka, &op.output, events.len(), deadline, &running).await;
    if running.is_finished() {
        panic!(
            "the instance stopped after its coordinator came back: {:?}",
            running.await?
        );
    }
    stop_caught_up(cluster, &op, shutdown, running).await?;
    let outputs = sum::committed_outputs(op.kafka, &op.output).await?;
    sum::assert_exactly_once(&events, &outputs);
    Ok(())
}

/// Two `sum_processor` instances, `a` and `b`, of `op`, each with its own disk.
fn two_instances(op: &Operator, disks: &[tempfile::TempDir; 2]) -> [Instance; 2] {
    let a = Instance {
        binary: env!("CARGO_BIN_EXE_sum_processor").into(),
        brokers: op.kafka.bootstrap_servers().to_owned(),
        group: op.group.clone(),
        instance: "a".into(),
        input: op.input.clone(),
        output: op.output.clone(),
        state_dir: disks[0].path().to_owned(),
        env: Vec::new(),
        user: None,
    };
    let b = Instance {
        instance: "b".into(),
        state_dir: disks[1].path().to_owned(),
        ..a.clone()
    };
    [a, b]
}

/// How big [`the_fault_matrix`] is: events, and rounds of every fault. CI runs one round
/// on 20,000 events; `cargo test -p onceflow-e2e --features soak --test cluster --
/// fault_matrix` runs issue 13's full matrix, three rounds on 100,000 (its last result is
/// in `tests/RESULTS.md`).
#[cfg(not(feature = "soak"))]
const MATRIX: (usize, usize) = (20_000, 1);
#[cfg(feature = "soak")]
const MATRIX: (usize, usize) = (100_000, 3);
/// Partitions of the matrix's input and output (and so of its changelog).
const MATRIX_PARTITIONS: i32 = 6;
/// Roughly how long one fault takes: the feeder spreads the events over the faults.
const PER_FAULT: Duration = Duration::from_secs(14);

/// Which node a node fault hits.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The transaction coordinator of one instance's transactional ID.
    TransactionCoordinator,
    /// The coordinator of the group.
    GroupCoordinator,
    /// The leader of an input partition.
    InputLeader,
    /// The leader of an output partition.
    OutputLeader,
    /// The leader of a changelog partition.
    ChangelogLeader,
}

/// One fault of the matrix.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// One instance SIGKILLed (hard) or SIGTERMed (clean), started again at once.
    Instance { which: usize, hard: bool },
    /// A node SIGKILLed and started again 5 s later (hard), or restarted cleanly.
    Node { target: Target, hard: bool },
    /// A node cut off from the other nodes, not from clients, for 20 s.
    Isolated(Target),
    /// One instance's network cut for 12 s (twice the session timeout) while it works.
    Cut { which: usize },
}

/// Round `round` of the matrix: every bounce target hard or clean (the modes swap from
/// one round to the next), a node cut off its peers, an instance cut off the network.
fn matrix_round(round: usize) -> Vec<Fault> {
    use Target::*;
    let hard = round.is_multiple_of(2);
    let which = round % 2;
    vec![
        Fault::Instance { which, hard },
        Fault::Instance {
            which: 1 - which,
            hard: !hard,
        },
        Fault::Node {
            target: TransactionCoordinator,
            hard,
        },
        Fault::Node {
            target: GroupCoordinator,
            hard: !hard,
        },
        Fault::Node {
            target: InputLeader,
            hard,
        },
        Fault::Node {
            target: OutputLeader,
            hard: !hard,
        },
        Fault::Node {
            target: ChangelogLeader,
            hard,
        },
        Fault::Isolated([TransactionCoordinator, InputLeader, ChangelogLeader][round % 3]),
        Fault::Cut { which },
    ]
}

/// The node `target` names now.
async fn target_node(
    cluster: &Cluster,
    op: &Operator,
    target: Target,
    round: usize,
) -> Result<i32, Box<dyn std::error::Error>> {
    let partition = (round as i32) % MATRIX_PARTITIONS;
    let instance = ["a", "b"][round % 2];
    Ok(match target {
        Target::TransactionCoordinator => {
            cluster
                .transaction_coordinator(&format!("{}-{instance}", op.group))
                .await?
        }
        Target::GroupCoordinator => cluster.group_coordinator(&op.group).await?,
        Target::InputLeader => cluster.leader(&op.input, partition).await?,
        Target::OutputLeader => cluster.leader(&op.output, partition).await?,
        Target::ChangelogLeader => {
            cluster
                .leader(&format!("{}-txlog", op.group), partition)
                .await?
        }
    })
}

/// The matrix's events: numbered, keyed, about 1% of them refused by the processor (a
/// negative amount: dead-lettered), each slice followed by 5% of it sent again with
/// the same event IDs.
fn matrix_events(count: usize) -> Vec<Amount> {
    let mut events = sum::amounts(0, count, 60);
    for event in events.iter_mut().skip(13).step_by(97) {
        event.amount = -event.amount;
    }
    events
}

/// Writes `events` in slices of 100 spread evenly over `over`, each slice with 5% of it
/// again; a slice whose write failed (a node down) is written again, which the
/// processor must also absorb. Returns when everything is written.
async fn feed(
    kafka: &'static onceflow_testkit::Kafka,
    input: String,
    events: Vec<Amount>,
    over: Duration,
) -> Result<(), String> {
    let slices = events.len().div_ceil(100).max(1);
    let pause = over / slices as u32;
    let start = tokio::time::Instant::now();
    for (i, slice) in events.chunks(100).enumerate() {
        // On a schedule, not a pause after each write: a slow write does not slow the rate.
        tokio::time::sleep_until(start + pause * i as u32).await;
        let again: Vec<Amount> = slice.iter().step_by(20).cloned().collect();
        let records = [slice, &again].concat();
        let mut attempts = 0;
        while let Err(error) = sum::produce(kafka, &input, &records).await {
            attempts += 1;
            if attempts >= 10 {
                return Err(format!("feeding the input: {error} ({attempts} attempts)"));
            }
            eprintln!("feeder: {error}; writing the slice again");
        }
    }
    Ok(())
}

/// Issue 13's fault matrix, Kafka's `transactions_test.py` with onceflow as the copier:
/// two `sum_processor` instances share six partitions while events arrive at a steady
/// rate (5% sent twice, 1% refused and dead-lettered). Once 20% are through, the faults
/// of [`matrix_round`] follow one another at even steps of progress: each instance
/// killed and terminated; the transaction coordinator, the group coordinator and the
/// leaders of an input, output and changelog partition each killed or restarted; a node
/// cut off from its peers for 20 s; one instance's network cut for twice the session
/// timeout in the middle of its work. Then: every distinct event's output exactly once
/// in each key's order with the exact running sum; every refused record dead-lettered
/// exactly once (by its input position); a `read_committed` reader that ran throughout
/// saw what the final read sees; both instances alive and stopping cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_matrix() -> Result<(), Box<dyn std::error::Error>> {
    let (count, rounds) = MATRIX;
    let faults: Vec<Fault> = (0..rounds).flat_map(matrix_round).collect();
    let feed_over = PER_FAULT * faults.len() as u32;
    run_matrix("matrix", count, rounds, faults, feed_over).await
}

/// The matrix's last two faults, again and again (`--features soak`): an instance's
/// transaction coordinator cut off its peers, then that instance cut off the network
/// for twice the session timeout, each instance in turn, the input written ahead of the
/// processors so that each cut finds a full prefetch queue and, often, a batch open.
/// CI's matrix lost 17 events once right after these two (2026-12-03: their outputs
/// written in an aborted transaction, never again, the group's offsets past them).
#[cfg(feature = "soak")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_cut_off_in_turn() -> Result<(), Box<dyn std::error::Error>> {
    let rounds = 3;
    let faults: Vec<Fault> = (0..rounds)
        .flat_map(|round| {
            [
                Fault::Isolated(Target::TransactionCoordinator),
                Fault::Cut { which: round % 2 },
            ]
        })
        .collect();
    run_matrix("cuts", 15_000, rounds, faults, Duration::from_secs(60)).await
}

/// The body of the matrix: `count` events fed over `feed_over`, `faults` at even steps
/// of progress (`rounds` rounds of them), then the exact checks.
async fn run_matrix(
    name: &str,
    count: usize,
    rounds: usize,
    faults: Vec<Fault>,
    feed_over: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster: &'static Cluster = onceflow_testkit::cluster().await;
    let started = Instant::now();
    let op = Operator::on(cluster.kafka(), name, MATRIX_PARTITIONS).await?;
    let watcher = Watcher::start(op.kafka, &op.output, MATRIX_PARTITIONS);
    let disks = [tempfile::tempdir()?, tempfile::tempdir()?];
    let instances = two_instances(&op, &disks).map(|i| i.as_own_user());

    let events = matrix_events(count);
    let good = events.iter().filter(|e| e.amount >= 0).count();
    let (seed, rest) = events.split_at(count / 5);
    sum::produce(op.kafka, &op.input, seed).await?;
    let mut running = instances.each_ref().map(|i| Some(i.spawn()));
    let seeded = seed.iter().filter(|e| e.amount >= 0).count();
    sum::wait_for_outputs(op.kafka, &op.output, seeded, WITHIN).await?;
    let feeder = tokio::spawn(feed(op.kafka, op.input.clone(), rest.to_vec(), feed_over));

    for (i, fault) in faults.iter().enumerate() {
        // Evenly from 20% to 95% of the outputs.
        let step = good * (20 + 75 * i / faults.len()) / 100;
        sum::wait_for_outputs(op.kafka, &op.output, step, WITHIN).await?;
        let round = i / (faults.len() / rounds);
        for (name, instance) in ["a", "b"].iter().zip(running.iter_mut()) {
            let alive = instance.as_mut().is_some_and(|r| r.is_running());
            assert!(alive, "instance {name} died before fault {i} ({fault:?})");
        }
        let at = started.elapsed();
        match *fault {
            Fault::Instance { which, hard } => {
                let old = running[which].take().expect("running");
                if hard {
                    old.kill();
                } else {
                    old.terminate(WITHIN);
                }
                running[which] = Some(instances[which].spawn());
            }
            Fault::Node { target, hard } => {
                let node = target_node(cluster, &op, target, round).await?;
                eprintln!("matrix: node {node} is the {target:?}");
                if hard {
                    cluster.kill(node).await?;
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    cluster.start_node(node).await?;
                } else {
                    cluster.restart(node).await?;
                }
                cluster.heal().await?;
            }
            Fault::Isolated(target) => {
                let node = target_node(cluster, &op, target, round).await?;
                eprintln!("matrix: node {node} is the {target:?}");
                cluster.isolate(node).await?;
                tokio::time::sleep(Duration::from_secs(20)).await;
                cluster.rejoin(node).await?;
                cluster.heal().await?;
            }
            Fault::Cut { which } => {
                let cut = running[which].as_ref().expect("running");
                tokio::task::block_in_place(|| {
                    std::thread::scope(|scope| {
                        scope.spawn(|| cut.cut_off_for(Duration::from_secs(12)));
                        // The cut bites: the group goes on without the instance...
                        onceflow_e2e::wait_for_members(
                            op.kafka,
                            &op.group,
                            1,
                            Duration::from_secs(12),
                        );
                    });
                    // ...and it joins again once its network is back.
                    onceflow_e2e::wait_for_members(op.kafka, &op.group, 2, WITHIN);
                });
            }
        }
        eprintln!(
            "matrix: fault {i} {fault:?} at {at:?} (after {step} outputs) took {:?}",
            started.elapsed() - at
        );
    }

    feeder.await??;
    let deadline = Instant::now() + WITHIN;
    while sum::committed_outputs(op.kafka, &op.output).await?.len() < good
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let visible = sum::committed_outputs(op.kafka, &op.output).await?.len();
    if visible < good {
        let why = sum::explain_missing(op.kafka, &op.group, &op.input, &op.output, &events).await;
        panic!("only {visible} of {good} outputs after {WITHIN:?}: {why}");
    }
    let done = sum::wait_for_caught_up(op.kafka, &op.group, &op.input, WITHIN).await;
    // Both alive to the end: a graceful stop of each succeeds.
    for instance in running.into_iter().flatten() {
        instance.stop(WITHIN);
    }
    cluster.heal().await?;
    done?;
    // With both instances stopped, no transaction of theirs may stay open on the outputs
    // or the changelog: one that does (hanging) stops every `read_committed` reader there
    // for good. A zombie's is ended by its coordinator within the transaction timeout.
    for topic in [op.output.clone(), format!("{}-txlog", op.group)] {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ends = op.kafka.stable_ends(&topic).await?;
            let open: Vec<_> = ends.iter().filter(|(_, (lso, hw))| lso < hw).collect();
            if open.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "transactions still open on `{topic}` 90 s after both instances stopped \
                 (partition, (last stable offset, high watermark)): {open:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    eprintln!(
        "matrix: {count} events, {} faults in {:?}",
        faults.len(),
        started.elapsed()
    );

    // What the processor must have seen: the input as written (a slice written again
    // after a failed write lands twice), first copies in input order.
    let written = op
        .kafka
        .read_to_end(&op.input, Isolation::ReadUncommitted)
        .await?;
    let mut first_copies = std::collections::BTreeSet::new();
    let mut inputs = Vec::new();
    let mut refused = std::collections::BTreeSet::new();
    for record in &written {
        let event: Amount = serde_json::from_slice(record.value.as_deref().unwrap_or_default())?;
        if event.amount < 0 {
            // Never marked processed, so each copy is refused and dead-lettered.
            refused.insert((record.partition, record.offset));
        } else if first_copies.insert(event.id.clone()) {
            inputs.push(event);
        }
    }
    assert_eq!(inputs.len(), good, "distinct good events written");
    check_exactly_once(&op, &inputs, watcher).await?;

    let dead = op
        .kafka
        .read_to_end(&format!("{}-dlq", op.group), Isolation::ReadCommitted)
        .await?;
    let mut dead_lettered = std::collections::BTreeSet::new();
    for record in &dead {
        let position = |name: &str| -> String {
            String::from_utf8_lossy(record.header(name).unwrap_or_default()).into_owned()
        };
        let at: (i32, i64) = (
            position("onceflow-source-partition").parse()?,
            position("onceflow-source-offset").parse()?,
        );
        assert!(
            dead_lettered.insert(at),
            "input record {at:?} dead-lettered twice"
        );
    }
    assert_eq!(
        dead_lettered, refused,
        "dead letters and refused records differ"
    );
    eprintln!(
        "matrix: exact: {} input records written, {} distinct events output once each, \
         {} refused records dead-lettered once each",
        written.len(),
        inputs.len(),
        dead_lettered.len()
    );
    Ok(())
}

/// A zombie (issue 13): one of two instances is frozen (SIGSTOP) in the middle of its
/// work for longer than the 6 s session timeout, so its partitions move to the other;
/// then it wakes (SIGCONT) and goes on, in some runs with its batch open (seen: its
/// offsets refused, the batch aborted and rewound), in others between two batches. Nothing it commits
/// after waking may be visible twice (the group's generation refuses its offsets,
/// KIP-447), it must join the group again and take its share back, and both instances
/// must still run at the end and stop cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_wakes_as_a_zombie_commits_nothing_twice_and_rejoins()
-> Result<(), Box<dyn std::error::Error>> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster: &'static Cluster = onceflow_testkit::cluster().await;
    let op = Operator::on(cluster.kafka(), "zombie", 6).await?;
    let watcher = Watcher::start(op.kafka, &op.output, 6);
    let disks = [tempfile::tempdir()?, tempfile::tempdir()?];
    let [a, b] = two_instances(&op, &disks);
    let events = sum::amounts(0, 20_000, 60);
    let (first, rest) = events.split_at(8_000);
    let (during, after) = rest.split_at(4_000);
    let log = disks[0].path().join("a.log");
    let running_a = a.spawn_logging_to(&log);
    let running_b = b.spawn();
    // Both in the group with three partitions each before anything arrives.
    tokio::task::block_in_place(|| onceflow_e2e::wait_for_members(op.kafka, &op.group, 2, WITHIN));
    sum::produce(op.kafka, &op.input, first).await?;
    sum::wait_for_outputs(op.kafka, &op.output, 4_000, WITHIN).await?;
    // More arrives while `a` is frozen, so it wakes up in the middle of a stream.
    let producing = {
        let (kafka, input, during) = (op.kafka, op.input.clone(), during.to_vec());
        tokio::spawn(async move { sum::produce(kafka, &input, &during).await })
    };
    eprintln!("freezing instance a for 10 s");
    tokio::task::block_in_place(|| running_a.freeze_for(Duration::from_secs(10)));
    producing.await??;
    // And more once it joined again (the other instance could otherwise finish all of it
    // first): its share comes back to it.
    tokio::task::block_in_place(|| onceflow_e2e::wait_for_members(op.kafka, &op.group, 2, WITHIN));
    sum::produce(op.kafka, &op.input, after).await?;

    let done = async {
        sum::wait_for_outputs(op.kafka, &op.output, events.len(), WITHIN).await?;
        sum::wait_for_caught_up(op.kafka, &op.group, &op.input, WITHIN).await
    }
    .await;
    // Both alive: a graceful stop of each succeeds; `a` was in the group before its
    // freeze and joined it again after.
    let woke = running_a.stop(WITHIN);
    running_b.stop(WITHIN);
    assert!(woke["assignments"].as_u64() >= Some(2), "{woke}");
    done?;
    check_exactly_once(&op, &events, watcher).await?;
    // Three replicas and min.insync.replicas 2 everywhere: no durability warning
    // (engine_crash.rs checks the one-broker cluster gets one for each topic).
    let log = std::fs::read_to_string(&log)?;
    assert!(
        !log.contains("not durable"),
        "a durability warning on a durable cluster:\n{log}"
    );
    Ok(())
}
