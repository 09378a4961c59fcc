//! Helpers of the broker tests that run one operator to the end of its input: a fresh
//! operator, the run itself, the events and orders they write, and what they read back
//! (outputs, dead letters, headers).

use std::time::Duration;

use onceflow::{Engine, EngineConfig, StatsSnapshot};
use onceflow_testkit::{Isolation, OutgoingRecord, Record};

use crate::Operator;
use crate::poison::{Behaviour, Order};
use crate::sum::{self, Amount};

/// How long a run may take to reach the end of its input.
pub const WITHIN: Duration = Duration::from_secs(90);

/// A fresh operator (its own topics, group and state directory) on the shared broker,
/// with the engines' logs in the test's output.
pub async fn setup(name: &str, partitions: i32) -> Result<Operator, Box<dyn std::error::Error>> {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    Operator::new(name, partitions).await
}

/// Runs `processor` until the group has committed the whole input, then stops it.
pub async fn run_to_end<P: onceflow::Processor>(
    s: &Operator,
    config: EngineConfig,
    processor: P,
) -> Result<StatsSnapshot, Box<dyn std::error::Error>> {
    let engine = Engine::new(config)?;
    let shutdown = engine.shutdown_handle();
    let running = tokio::spawn(engine.run(processor));
    let caught_up = sum::wait_for_caught_up(s.kafka, &s.group, &s.input, WITHIN).await;
    shutdown.trigger();
    let stats = running.await??;
    caught_up?;
    Ok(stats)
}

/// An amount event with `id` (none: no event ID), keyed by `key`.
pub fn amount(id: Option<&str>, key: &str, amount: i64) -> Amount {
    Amount {
        id: id.map(str::to_owned),
        key: key.into(),
        amount,
        anonymous: false,
    }
}

/// `event` as a record keyed by its key.
pub fn keyed(event: &Amount) -> OutgoingRecord {
    OutgoingRecord::keyed(event.key.clone(), serde_json::to_vec(event).expect("json"))
}

/// Order `o-<i>`, keyed `k`, that behaves as `behaviour` in [`Picky`](crate::poison::Picky).
pub fn order(i: usize, behaviour: Behaviour) -> Order {
    Order {
        id: format!("o-{i}"),
        key: "k".into(),
        behaviour,
    }
}

/// Writes `orders` to the operator's input, keyed by their key.
pub async fn produce_orders(
    s: &Operator,
    orders: &[Order],
) -> Result<(), Box<dyn std::error::Error>> {
    let records = orders
        .iter()
        .map(|o| OutgoingRecord::keyed(o.key.clone(), serde_json::to_vec(o).expect("json")));
    s.kafka.produce(&s.input, records).await?;
    Ok(())
}

/// The order IDs on the output topic under `read_committed`, in offset order.
pub async fn output_ids(s: &Operator) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let outputs = s
        .kafka
        .read_to_end(&s.output, Isolation::ReadCommitted)
        .await?;
    Ok(outputs
        .iter()
        .filter(|r| r.value.as_ref().is_some_and(|v| v.len() < 100))
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap_or_default()))
        .collect::<Result<_, _>>()?)
}

/// The operator's dead letters under `read_committed`, in partition and offset order.
pub async fn dead_letters(s: &Operator) -> Result<Vec<Record>, Box<dyn std::error::Error>> {
    let dlq = format!("{}-dlq", s.group);
    Ok(s.kafka.read_to_end(&dlq, Isolation::ReadCommitted).await?)
}

/// The value of `record`'s header `name` as text (`""` when it has none).
pub fn header(record: &Record, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).unwrap_or_default()).into_owned()
}
