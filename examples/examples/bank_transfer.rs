//! Transfer requests in, debit and credit entries out, balances in state.
//!
//! A ledger's accounts live on one partition (requests are keyed by `ledger`), so a
//! transfer reads and changes both balances in one step. The invariants, exactly once:
//! money is only created by deposits (`from: null`) and otherwise moves without loss,
//! no transfer is applied twice however often it is delivered, and no balance goes
//! below zero: a transfer the balance does not cover is rejected, not applied.
use onceflow::{Context, Event, Processor, Result};
use serde::{Deserialize, Serialize};

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
pub struct TransferRequest {
    #[event(id)]
    pub id: String,
    #[event(key)]
    pub ledger: String,
    /// `None` for a deposit from outside the ledger.
    pub from: Option<String>,
    pub to: String,
    pub amount_cents: i64,
}

/// One side of an applied transfer: `change` is negative for a debit.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Entry {
    pub transfer: String,
    pub account: String,
    pub change: i64,
    pub balance: i64,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Rejection {
    pub transfer: String,
    pub reason: String,
}

#[derive(Processor, Debug, Clone)]
#[processor(name = "bank-transfer", input = "transfer-requests", input_type = TransferRequest,
            outputs = ["ledger-entries", "rejected-transfers"])]
pub struct Bank;

impl Bank {
    async fn handle(&mut self, request: TransferRequest, ctx: &mut Context<'_>) -> Result<()> {
        let key = |account: &str| format!("{}/{account}", request.ledger);
        if request.amount_cents <= 0 || request.from.as_deref() == Some(request.to.as_str()) {
            let reason = "the amount must be positive and the accounts different".to_owned();
            return reject(ctx, request, reason);
        }
        let mut entries = Vec::new();
        if let Some(from) = &request.from {
            let balance = ctx.state().get::<i64>(&key(from))?.unwrap_or(0);
            if balance < request.amount_cents {
                let reason = format!("{from} has {balance}, less than {}", request.amount_cents);
                return reject(ctx, request, reason);
            }
            entries.push((
                from.clone(),
                -request.amount_cents,
                balance - request.amount_cents,
            ));
        }
        let balance = ctx.state().get::<i64>(&key(&request.to))?.unwrap_or(0);
        entries.push((
            request.to.clone(),
            request.amount_cents,
            balance + request.amount_cents,
        ));
        for (account, change, balance) in entries {
            ctx.state().put(&key(&account), &balance)?;
            let entry = Entry {
                transfer: request.id.clone(),
                account,
                change,
                balance,
            };
            ctx.emit(Self::LEDGER_ENTRIES, &request.ledger, &entry)?;
        }
        Ok(())
    }
}

fn reject(ctx: &mut Context<'_>, request: TransferRequest, reason: String) -> Result<()> {
    let rejection = Rejection {
        transfer: request.id,
        reason,
    };
    ctx.emit(Bank::REJECTED_TRANSFERS, &request.ledger, &rejection)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    onceflow::run(Bank).await
}

/// Driver tests: the processor over the engine's own code, no broker
/// (`tests/bank_transfer.rs` runs it against one, through kills).
#[cfg(test)]
mod tests {
    use onceflow::testing::{CrashPoint, TestDriver};

    use super::*;

    fn transfer(id: &str, from: Option<&str>, to: &str, amount_cents: i64) -> TransferRequest {
        TransferRequest {
            id: id.into(),
            ledger: "main".into(),
            from: from.map(str::to_owned),
            to: to.into(),
            amount_cents,
        }
    }

    #[tokio::test]
    async fn money_moves_once_and_never_below_zero_through_every_crash_point() -> Result<()> {
        for point in CrashPoint::ALL {
            let mut driver = TestDriver::new(Bank);
            driver.pipe(&transfer("d-1", None, "alice", 1_000))?;
            driver.process().await?;
            // A new machine for the replay crash: the start rebuilds from the changelog.
            driver.lose_local_state()?;
            driver.crash_at(point, 1);
            for n in 0..30 {
                let request = transfer(&format!("t-{n}"), Some("alice"), "bob", 70);
                driver.pipe(&request)?;
                if n % 4 == 0 {
                    driver.pipe(&request)?;
                }
            }
            driver.process().await?;

            let entries: Vec<Entry> = driver.output_values(Bank::LEDGER_ENTRIES)?;
            let rejected: Vec<Rejection> = driver.output_values(Bank::REJECTED_TRANSFERS)?;
            // 1,000 covers 14 transfers of 70; the other 16 are rejected, each once.
            assert_eq!(entries.len(), 1 + 2 * 14, "{point:?}");
            assert_eq!(rejected.len(), 16, "{point:?}");
            assert_eq!(driver.state::<i64>(0, "main/alice")?, Some(20), "{point:?}");
            assert_eq!(driver.state::<i64>(0, "main/bob")?, Some(980), "{point:?}");
        }
        Ok(())
    }
}
