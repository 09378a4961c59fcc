//! The two processors and the warehouse effect.

use std::time::Duration;

use onceflow::effects::{Effect, Intent, Outcome};
use onceflow::{Context, Event, Processor, Result};
use serde::{Deserialize, Serialize};

/// Units of every item in stock before the first order.
pub(crate) const STOCK_PER_ITEM: u32 = 100;
/// The catalogue: `item-0` … `item-7`.
pub(crate) const ITEMS: u32 = 8;
/// Points per unit bought.
pub(crate) const POINTS_PER_UNIT: u64 = 10;

/// An order, as the order service stores and publishes it (keyed by item).
#[derive(Event, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct Order {
    #[event(id)]
    pub(crate) id: String,
    pub(crate) customer: String,
    #[event(key)]
    pub(crate) item: String,
    pub(crate) quantity: u32,
}

/// An order the stock covered: the units are taken (keyed by customer).
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Reserved {
    #[event(id)]
    pub(crate) order: String,
    #[event(key)]
    pub(crate) customer: String,
    pub(crate) item: String,
    pub(crate) quantity: u32,
    /// Units of the item left after this order.
    pub(crate) stock_left: u32,
}

/// An order the stock did not cover, or that names no item of the catalogue.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Rejected {
    pub(crate) order: String,
    pub(crate) item: String,
    pub(crate) quantity: u32,
    pub(crate) reason: String,
}

/// Points granted for a reserved order.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Granted {
    pub(crate) order: String,
    pub(crate) customer: String,
    pub(crate) points: u64,
    /// The customer's points after this order.
    pub(crate) total: u64,
}

/// What the warehouse is asked to ship.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Shipment {
    pub(crate) order: String,
    pub(crate) customer: String,
    pub(crate) item: String,
    pub(crate) quantity: u32,
}

/// Stock per item: an order takes its units or is rejected whole.
#[derive(Processor, Debug, Clone)]
#[processor(name = "shop-inventory", input = "orders", input_type = Order,
            outputs = ["reserved-orders", "rejected-orders"])]
pub(crate) struct Inventory;

impl Inventory {
    async fn handle(&mut self, order: Order, ctx: &mut Context<'_>) -> Result<()> {
        let known = order
            .item
            .strip_prefix("item-")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n < ITEMS);
        let key = format!("stock/{}", order.item);
        let left = ctx.state().get::<u32>(&key)?.unwrap_or(STOCK_PER_ITEM);
        let refusal = if !known {
            Some(format!("{} is not in the catalogue", order.item))
        } else if order.quantity == 0 || order.quantity > left {
            Some(format!(
                "{} of {} asked, {left} in stock",
                order.quantity, order.item
            ))
        } else {
            None
        };
        if let Some(reason) = refusal {
            let rejected = Rejected {
                order: order.id,
                item: order.item.clone(),
                quantity: order.quantity,
                reason,
            };
            return ctx.emit(Self::REJECTED_ORDERS, &order.item, &rejected);
        }
        let stock_left = left - order.quantity;
        ctx.state().put(&key, &stock_left)?;
        let reserved = Reserved {
            order: order.id,
            customer: order.customer,
            item: order.item,
            quantity: order.quantity,
            stock_left,
        };
        // Keyed by its `#[event(key)]`, the customer: the points processor's partitions.
        ctx.emit_event(Self::RESERVED_ORDERS, &reserved)
    }
}

/// Points per customer, and the shipment as an effect in the same transaction.
#[derive(Processor, Debug, Clone)]
#[processor(name = "shop-points", input = "reserved-orders", input_type = Reserved,
            outputs = ["points"])]
pub(crate) struct Points;

impl Points {
    async fn handle(&mut self, reserved: Reserved, ctx: &mut Context<'_>) -> Result<()> {
        let key = format!("points/{}", reserved.customer);
        let points = u64::from(reserved.quantity) * POINTS_PER_UNIT;
        let total = ctx.state().get::<u64>(&key)?.unwrap_or(0) + points;
        ctx.state().put(&key, &total)?;
        let granted = Granted {
            order: reserved.order.clone(),
            customer: reserved.customer.clone(),
            points,
            total,
        };
        ctx.emit(Self::POINTS, &reserved.customer, &granted)?;
        let shipment = Shipment {
            order: reserved.order,
            customer: reserved.customer.clone(),
            item: reserved.item,
            quantity: reserved.quantity,
        };
        // Recorded with the outputs; the executor POSTs it after the commit.
        ctx.effect("ship", &reserved.customer, &shipment)
    }
}

/// The warehouse over HTTP: `POST {SHOP_WAREHOUSE_URL}/shipments` with the intent's
/// idempotency key in `Idempotency-Key`, which the warehouse honours; so an ambiguous
/// answer is simply tried again with the same key (no check-back needed).
#[derive(Debug, Clone)]
pub(crate) struct WarehouseClient {
    url: String,
    client: reqwest::Client,
}

impl WarehouseClient {
    /// The warehouse at `$SHOP_WAREHOUSE_URL` (default `http://127.0.0.1:8081`).
    pub(crate) fn from_env() -> Self {
        let url = std::env::var("SHOP_WAREHOUSE_URL")
            .unwrap_or_else(|_| "http://127.0.0.1:8081".to_owned());
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client without TLS always builds");
        WarehouseClient { url, client }
    }
}

#[onceflow::async_trait]
impl Effect for WarehouseClient {
    fn name(&self) -> &str {
        "warehouse"
    }

    async fn apply(&mut self, intent: &Intent) -> Outcome {
        let sent = self
            .client
            .post(format!("{}/shipments", self.url))
            .header("Idempotency-Key", &intent.idempotency_key)
            .json(&intent.payload)
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {
                Outcome::Applied(response.json().await.ok())
            }
            Ok(response) if response.status().is_client_error() => {
                Outcome::Refused(format!("HTTP {}", response.status()))
            }
            // 5xx, a timeout, a connection refused or cut: perhaps shipped, perhaps not.
            Ok(response) => Outcome::Ambiguous(format!("HTTP {}", response.status())),
            Err(error) => Outcome::Ambiguous(error.to_string()),
        }
    }
}

/// Driver tests of both processors: the engine's own code, no broker (`tests/shop.rs`
/// runs all six parts as processes through kills).
#[cfg(test)]
mod tests {
    use onceflow::testing::{CrashPoint, TestDriver};

    use super::*;

    fn order(n: u32, item: &str, quantity: u32) -> Order {
        Order {
            id: format!("order-{n}"),
            customer: format!("customer-{}", n % 3),
            item: item.into(),
            quantity,
        }
    }

    #[tokio::test]
    async fn stock_is_taken_once_per_order_and_what_it_cannot_cover_is_rejected() -> Result<()> {
        let mut driver = TestDriver::new(Inventory).input_partitions(2);
        for n in 0..12 {
            driver.pipe(&order(n, "item-1", 10))?;
        }
        driver.pipe(&order(3, "item-1", 10))?; // the relay published order 3 twice
        driver.pipe(&order(20, "item-9", 1))?; // not in the catalogue
        driver.crash_at(CrashPoint::AfterCommitBeforeApply, 1);
        driver.process().await?;

        let reserved: Vec<Reserved> = driver.output_values(Inventory::RESERVED_ORDERS)?;
        let left: Vec<u32> = reserved.iter().map(|r| r.stock_left).collect();
        assert_eq!(left, [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]);
        let rejected: Vec<Rejected> = driver.output_values(Inventory::REJECTED_ORDERS)?;
        let orders: Vec<&str> = rejected.iter().map(|r| r.order.as_str()).collect();
        assert_eq!(orders, ["order-10", "order-11", "order-20"]);
        let order_3 = reserved.iter().filter(|r| r.order == "order-3").count();
        assert_eq!(order_3, 1, "the copy was skipped");
        Ok(())
    }

    #[tokio::test]
    async fn points_add_up_once_and_each_shipment_is_one_intent_in_the_same_transaction()
    -> Result<()> {
        let mut driver = TestDriver::new(Points).configure(|config| config.with_effects());
        let effects = driver.config().effects_topic.clone().expect("effects on");
        for n in 0..6 {
            let reserved = Reserved {
                order: format!("order-{n}"),
                customer: "customer-1".into(),
                item: "item-2".into(),
                quantity: n + 1,
                stock_left: 0,
            };
            driver.pipe(&reserved)?;
            if n == 2 {
                driver.pipe(&reserved)?;
            }
        }
        driver.crash_at(CrashPoint::BeforeSendOffsets, 1);
        driver.process().await?;

        let granted: Vec<Granted> = driver.output_values(Points::POINTS)?;
        let totals: Vec<u64> = granted.iter().map(|g| g.total).collect();
        assert_eq!(totals, [10, 30, 60, 100, 150, 210]);
        assert_eq!(
            driver.output(&effects).len(),
            6,
            "one ship intent per order"
        );
        Ok(())
    }
}
