//! Payments in, one result per payment out, a balance per account in state: the processor
//! the guide's tutorial (`docs/src/tutorial.md`) builds step by step.
//!
//! `cargo run --example payments -- --brokers localhost:9092` (topics `payments` and
//! `payment-results` must exist); `--help` lists every setting.

// ANCHOR: imports
use onceflow::{Context, Error, Event, Processor, Result};
use serde::{Deserialize, Serialize};
// ANCHOR_END: imports

// ANCHOR: event
/// A payment as it arrives on `payments`, keyed by account:
/// `{"id":"p-1","account":"ada","kind":"deposit","amount_cents":5000}`.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
struct Payment {
    /// The payment's own ID: a payment delivered twice is recognised by it.
    #[event(id)]
    id: String,
    /// The record key: all payments of an account go to one partition, in order.
    #[event(key)]
    account: String,
    kind: Kind,
    amount_cents: i64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Deposit,
    Withdrawal,
}
// ANCHOR_END: event

// ANCHOR: result
/// What `payment-results` receives for each payment.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct PaymentResult {
    payment: String,
    account: String,
    status: Status,
    /// The account's balance after the payment.
    balance_cents: i64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Status {
    Accepted,
    /// A withdrawal the balance does not cover: nothing changes.
    Declined,
}
// ANCHOR_END: result

// ANCHOR: processor
#[derive(Processor, Clone)]
#[processor(name = "payments", input = "payments", input_type = Payment,
            outputs = ["payment-results"])]
struct Payments;

impl Payments {
    async fn handle(&mut self, payment: Payment, ctx: &mut Context<'_>) -> Result<()> {
        let amount = payment.amount_cents;
        if amount <= 0 {
            // An error fails this record alone: it goes to the dead-letter topic.
            return Err(Error::processing(format!(
                "amount {amount} is not positive"
            )));
        }
        let balance = ctx.state().get::<i64>(&payment.account)?.unwrap_or(0);
        let (status, balance) = match payment.kind {
            Kind::Deposit => match balance.checked_add(amount) {
                Some(balance) => (Status::Accepted, balance),
                None => return Err(Error::processing("the balance would overflow")),
            },
            Kind::Withdrawal if amount <= balance => (Status::Accepted, balance - amount),
            Kind::Withdrawal => (Status::Declined, balance),
        };
        if status == Status::Accepted {
            ctx.state().put(&payment.account, &balance)?;
        }
        let result = PaymentResult {
            payment: payment.id,
            account: payment.account.clone(),
            status,
            balance_cents: balance,
        };
        ctx.emit(Self::PAYMENT_RESULTS, &payment.account, &result)
    }
}
// ANCHOR_END: processor

// ANCHOR: main
#[tokio::main]
async fn main() -> std::process::ExitCode {
    onceflow::run(Payments).await
}
// ANCHOR_END: main

// ANCHOR: test_setup
/// Driver tests: the processor through the engine's own code, without a broker.
#[cfg(test)]
mod tests {
    use onceflow::testing::{CrashPoint, OutgoingRecord, TestDriver};

    use super::*;

    fn payment(id: &str, kind: Kind, amount_cents: i64) -> Payment {
        Payment {
            id: id.into(),
            account: "ada".into(),
            kind,
            amount_cents,
        }
    }

    fn results(driver: &TestDriver<Payments>) -> Result<Vec<PaymentResult>> {
        driver.output_values(Payments::PAYMENT_RESULTS)
    }
    // ANCHOR_END: test_setup

    // ANCHOR: test_twice
    #[tokio::test]
    async fn a_payment_delivered_twice_is_applied_once() -> Result<()> {
        let mut driver = TestDriver::new(Payments);
        driver.pipe(&payment("p-1", Kind::Deposit, 5_000))?;
        driver.process().await?;
        driver.restart()?; // a new process, as after a deploy
        driver.pipe(&payment("p-1", Kind::Deposit, 5_000))?; // upstream sent it again
        driver.process().await?;

        assert_eq!(results(&driver)?.len(), 1);
        assert_eq!(driver.state::<i64>(0, "ada")?, Some(5_000));
        assert_eq!(driver.stats().duplicates_skipped, 1);
        Ok(())
    }
    // ANCHOR_END: test_twice

    // ANCHOR: test_declined
    #[tokio::test]
    async fn a_withdrawal_the_balance_does_not_cover_is_declined() -> Result<()> {
        let mut driver = TestDriver::new(Payments);
        driver.pipe(&payment("p-1", Kind::Deposit, 1_000))?;
        driver.pipe(&payment("p-2", Kind::Withdrawal, 1_500))?;
        driver.process().await?;

        let results = results(&driver)?;
        assert_eq!(results[1].status, Status::Declined);
        assert_eq!(results[1].balance_cents, 1_000);
        assert_eq!(driver.state::<i64>(0, "ada")?, Some(1_000));
        Ok(())
    }
    // ANCHOR_END: test_declined

    // ANCHOR: test_crash
    #[tokio::test]
    async fn a_crash_at_any_point_changes_nothing() -> Result<()> {
        for point in CrashPoint::ALL {
            let mut driver = TestDriver::new(Payments);
            for n in 0..100 {
                driver.pipe(&payment(&format!("d-{n}"), Kind::Deposit, 10))?;
            }
            driver.process().await?;
            // A new machine: the next start rebuilds the state from Kafka (the changelog),
            // and a crash can strike in the middle of that too (`DuringReplay`).
            driver.lose_local_state()?;
            driver.crash_at(point, 1);
            driver.pipe(&payment("w-1", Kind::Withdrawal, 700))?;
            driver.pipe(&payment("w-2", Kind::Withdrawal, 700))?;
            driver.process().await?; // crashes once, starts again, goes on

            assert_eq!(driver.crashes(), [point]);
            let results = results(&driver)?;
            assert_eq!(results.len(), 102, "{point:?}"); // one result per payment
            assert_eq!(results[100].status, Status::Accepted, "{point:?}");
            assert_eq!(results[101].status, Status::Declined, "{point:?}");
            assert_eq!(driver.state::<i64>(0, "ada")?, Some(300), "{point:?}");
        }
        Ok(())
    }
    // ANCHOR_END: test_crash

    // ANCHOR: test_bad_input
    #[tokio::test]
    async fn bad_input_is_dead_lettered_and_the_rest_goes_on() -> Result<()> {
        let mut driver = TestDriver::new(Payments);
        driver.pipe_record(OutgoingRecord::keyed("ada", "not json"));
        driver.pipe(&payment("p-1", Kind::Deposit, -5))?;
        driver.pipe(&payment("p-2", Kind::Deposit, 300))?;
        driver.process().await?;

        let dead = driver.dead_letters();
        let class = |n: usize| dead[n].header("onceflow-error-class");
        assert_eq!(dead.len(), 2);
        assert_eq!(class(0), Some(&b"decode"[..])); // not a `Payment`
        assert_eq!(class(1), Some(&b"permanent"[..])); // `Error::processing`
        assert_eq!(results(&driver)?.len(), 1);
        assert_eq!(driver.state::<i64>(0, "ada")?, Some(300));
        Ok(())
    }
}
// ANCHOR_END: test_bad_input
