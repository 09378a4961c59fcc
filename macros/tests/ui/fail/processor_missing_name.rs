use onceflow::{Context, Result};

#[derive(serde::Deserialize, onceflow::Event)]
struct Order {}

#[derive(onceflow::Processor)]
#[processor(input = "orders", input_type = Order)]
struct Billing;

impl Billing {
    async fn handle(&mut self, _order: Order, _ctx: &mut Context<'_>) -> Result<()> {
        Ok(())
    }
}

fn main() {}
