//! Orders in, invoices out, with a running total per customer: the whole processor.
//!
//! `cargo run --example billing -- --brokers localhost:9092` (topics `orders` and
//! `invoices` must exist); `--help` lists every setting.
use onceflow::{Context, Event, Processor, Result};
use serde::{Deserialize, Serialize};

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
pub struct Order {
    #[event(id)]
    pub id: String,
    #[event(key)]
    pub customer: String,
    pub amount_cents: i64,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Invoice {
    pub order: String,
    pub customer: String,
    pub amount_cents: i64,
    pub customer_total_cents: i64,
}

#[derive(Processor, Debug)]
#[processor(name = "billing", input = "orders", input_type = Order, outputs = ["invoices"])]
pub struct Billing;

impl Billing {
    async fn handle(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
        let total = ctx.state().get::<i64>(&order.customer)?.unwrap_or(0) + order.amount_cents;
        ctx.state().put(&order.customer, &total)?;
        let invoice = Invoice {
            order: order.id,
            customer: order.customer.clone(),
            amount_cents: order.amount_cents,
            customer_total_cents: total,
        };
        ctx.emit(Self::INVOICES, &order.customer, &invoice)
    }
}

#[tokio::main]
pub async fn main() -> std::process::ExitCode {
    onceflow::run(Billing).await
}
