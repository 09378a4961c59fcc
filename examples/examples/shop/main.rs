//! The shop of the seed article, end to end, exactly once from a database row to a
//! warehouse's door:
//!
//! ```text
//!  POST /orders ─► order-service ─► PostgreSQL: the order row + its outbox row, one transaction
//!                                        │ relay (one Kafka transaction per batch + its position)
//!                                        ▼
//!                                     orders (key: item)
//!                                        │ inventory: stock per item in state
//!                          ┌─────────────┴──────────────┐
//!                          ▼                            ▼
//!             reserved-orders (key: customer)    rejected-orders
//!                          │ points: points per customer in state
//!                          ├─► points
//!                          └─► ship intent ─► effect executor ─► POST /shipments
//!                              (same transaction)                 Idempotency-Key ─► warehouse
//! ```
//!
//! One binary, one part per process: `shop order-service`, `shop relay`, `shop inventory`,
//! `shop points` (with `--role processor|effects|all`) and `shop warehouse`. The
//! processors take every setting of `onceflow::run` (`shop inventory --help`).

mod domain;
mod services;

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let part = (args.len() > 1).then(|| args.remove(1));
    let part = part.as_ref().and_then(|p| p.to_str());
    match part {
        Some("inventory") => onceflow::run_with_args(domain::Inventory, args).await,
        Some("points") => {
            let warehouse = domain::WarehouseClient::from_env();
            onceflow::run_with_effects_and_args(domain::Points, warehouse, args).await
        }
        Some("order-service") => services::order_service(args).await,
        Some("relay") => services::relay(args).await,
        Some("warehouse") => services::warehouse(args).await,
        _ => {
            eprintln!(
                "usage: shop <order-service|relay|inventory|points|warehouse> [options]\n\
                 (each part takes --help)"
            );
            ExitCode::from(2)
        }
    }
}
