use onceflow::{Context, Event, Processor, Result};
use serde::Deserialize;

#[derive(Deserialize, Event)]
struct Order {
    #[event(id)]
    id: String,
    #[event(key)]
    customer: String,
    amount: i64,
}

#[derive(Default, Processor)]
#[processor(
    name = "billing",
    input = "orders",
    input_type = Order,
    outputs = ["invoices", "audit", "audit-log.v2"],
    handler = bill,
    timer = remind
)]
struct Billing {
    billed: usize,
}

impl Billing {
    async fn bill(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
        self.billed += 1;
        let total = ctx.state().get::<i64>(&order.customer)?.unwrap_or(0) + order.amount;
        ctx.state().put(&order.customer, &total)?;
        ctx.emit(Self::INVOICES, &order.customer, &total)?;
        ctx.schedule_after(&order.id, std::time::Duration::from_secs(60))?;
        ctx.emit("audit", &order.id, &order.amount)
    }

    async fn remind(&mut self, timer: onceflow::Timer, ctx: &mut Context<'_>) -> Result<()> {
        ctx.emit("audit", &timer.key, &timer.due_ms)
    }
}

/// Holds only for the real trait, with `Input = Order`.
fn is_processor<P: Processor<Input = Order>>(processor: &P) -> &P {
    processor
}

fn main() {
    let billing = Billing::default();
    let billing = is_processor(&billing);
    assert_eq!(billing.name(), "billing");
    assert_eq!(billing.input_topic(), Some("orders"));
    assert_eq!(billing.output_topics(), &["invoices", "audit", "audit-log.v2"]);
    // One `Topic` constant per output, named after it.
    let constants: [onceflow::Topic; 3] = [Billing::INVOICES, Billing::AUDIT, Billing::AUDIT_LOG_V2];
    let names: Vec<&str> = constants.iter().map(|t| t.name()).collect();
    assert_eq!(names, billing.output_topics());
    assert_eq!(billing.billed, 0);
    assert!(billing.uses_timers(), "`timer = ...` says the processor uses timers");
}
