//! Contender c: the same work as an onceflow processor, run by the engine in the delivery
//! mode given on the command line. The sum lives in onceflow's per-partition state (redb
//! plus changelog), and every event's ID goes through the dedup log.

use std::path::PathBuf;
use std::time::Duration;

use onceflow::{Context, DeliveryMode, Engine, EngineConfig, Event, Processor, Result};

use crate::workload::Output;

/// The input as onceflow sees it: the workload's event with its ID and key marked.
#[derive(Event, serde::Deserialize, Debug)]
pub struct Keyed {
    #[event(id)]
    pub(crate) id: String,
    #[event(key)]
    pub(crate) key: String,
    pub(crate) amount: i64,
    pub(crate) sent_us: i64,
}

/// The benchmark processor.
#[derive(Debug)]
pub struct Sum {
    output: String,
}

/// The line the contender prints when its partitions are restored and it is about to
/// process them; the restore measurement (`driver::restore_once`) reads it from the log.
pub const RESTORED: &str = "onceflow-bench: partitions restored at_us=";

// Written out instead of derived for `partitions_assigned`, which the derive does not
// offer.
#[onceflow::async_trait]
impl Processor for Sum {
    type Input = Keyed;

    fn name(&self) -> &str {
        "bench"
    }

    async fn process(&mut self, event: Keyed, ctx: &mut Context<'_>) -> Result<()> {
        let sum = ctx.state().get::<i64>(&event.key)?.unwrap_or(0) + event.amount;
        ctx.state().put(&event.key, &sum)?;
        let output = Output {
            id: event.id,
            key: event.key,
            sum,
            sent_us: event.sent_us,
            processed_us: crate::workload::now_us(),
        };
        let key = output.key.clone();
        ctx.emit(&self.output, &key, &output)
    }

    fn partitions_assigned(&mut self, partitions: &[i32]) {
        eprintln!(
            "{RESTORED}{} partitions={partitions:?}",
            crate::workload::now_us()
        );
    }
}

/// What the onceflow contender is told.
#[derive(Debug, Clone)]
pub struct FlowArgs {
    /// Bootstrap servers.
    pub brokers: String,
    /// Input topic.
    pub input: String,
    /// Output topic.
    pub output: String,
    /// Consumer group.
    pub group: String,
    /// This instance's ID.
    pub instance: String,
    /// Where the transaction log lives.
    pub state_dir: PathBuf,
    /// Batch length.
    pub commit_interval: Duration,
    /// Records per batch at most.
    pub max_batch: usize,
    /// Delivery mode.
    pub delivery: DeliveryMode,
    /// librdkafka properties for every client of the engine.
    pub kafka: Vec<(String, String)>,
}

/// Runs the engine until it stops (the driver kills it).
pub async fn run(args: FlowArgs) -> Result<()> {
    let mut config = EngineConfig::new(
        args.brokers,
        args.group,
        args.instance,
        args.input,
        args.state_dir,
    )
    .output(args.output.clone())
    .batching(args.commit_interval, args.max_batch)
    .delivery(args.delivery);
    for (key, value) in args.kafka {
        config = config.kafka(key, value);
    }
    Engine::new(config)?
        .run(Sum {
            output: args.output,
        })
        .await?;
    Ok(())
}
