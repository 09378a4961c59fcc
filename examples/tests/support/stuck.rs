//! Test support, not an example to copy: a processor whose handler never returns once it
//! has emitted, for the test of what a second SIGTERM does (`tests/signals.rs`).
use onceflow::{Context, Event, Processor, Result};
use serde::{Deserialize, Serialize};

#[derive(Event, Serialize, Deserialize, Debug)]
struct Order {
    #[event(id)]
    id: String,
}

#[derive(Processor, Debug)]
#[processor(name = "stuck", input = "orders", input_type = Order, outputs = ["invoices"])]
struct Stuck;

impl Stuck {
    async fn handle(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit(Self::INVOICES, &order.id, &order.id)?;
        eprintln!("stuck: handling {}", order.id);
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    onceflow::run(Stuck).await
}
