use onceflow::{Context, Result};

#[derive(serde::Deserialize, onceflow::Event)]
struct Order {
    #[event(id)]
    id: String,
}

#[derive(onceflow::Processor)]
#[processor(name = "billing", input_type = Order, outputs = ["invoices"])]
struct Billing;

impl Billing {
    async fn handle(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
        // Misspelt, or not declared in `outputs`: there is no such constant.
        ctx.emit(Self::INVOICE, &order.id, &order.id)?;
        ctx.emit(Self::AUDIT, &order.id, &order.id)
    }
}

fn main() {}
