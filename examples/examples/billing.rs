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

#[derive(Processor, Debug, Clone)]
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

/// Driver tests: the processor over the engine's own code, no broker (`tests/billing.rs`
/// runs it against one).
#[cfg(test)]
mod tests {
    use onceflow::testing::{CrashPoint, TestDriver};

    use super::*;

    fn order(id: &str, customer: &str, amount_cents: i64) -> Order {
        Order {
            id: id.into(),
            customer: customer.into(),
            amount_cents,
        }
    }

    #[tokio::test]
    async fn each_order_is_invoiced_once_with_the_customers_running_total() -> Result<()> {
        let mut driver = TestDriver::new(Billing);
        driver.pipe(&order("o-1", "ada", 500))?;
        driver.pipe(&order("o-1", "ada", 500))?; // delivered twice upstream: skipped
        driver.crash_at(CrashPoint::BeforeCommit, 1); // the next batch dies before its commit
        driver.pipe(&order("o-2", "ada", 250))?;
        driver.process().await?; // crashes, restarts, goes on
        let invoices: Vec<Invoice> = driver.output_values(Billing::INVOICES)?;
        assert_eq!(invoices[1].customer_total_cents, 750);
        assert_eq!(driver.state::<i64>(0, "ada")?, Some(750));

        assert_eq!(invoices.len(), 2);
        assert_eq!(driver.crashes(), [CrashPoint::BeforeCommit]);
        Ok(())
    }

    #[tokio::test]
    async fn a_renamed_output_receives_what_the_processor_emits_to_its_declared_name() -> Result<()>
    {
        let mut driver = TestDriver::new(Billing)
            .configure(|config| config.rename_output("invoices", "prod.invoices"));
        driver.pipe(&order("o-1", "ada", 500))?;
        driver.process().await?;
        assert!(driver.output("invoices").is_empty());
        assert_eq!(driver.output("prod.invoices").len(), 1);
        Ok(())
    }
}
