//! Payments in; per card and minute of event time, a tally out, and an alert for a card
//! over the limits: windows on top of event-time timers.
//!
//! A minute's tally is handed over once the partition's event time passes the minute's
//! end plus a grace period of 10 s; a payment later than that is dead-lettered (class
//! `permanent`, "late for windows"), never silently counted in a minute already
//! reported. Payments are keyed by card, so a card's minutes are on one partition.
//!
//! `cargo run --example fraud_check -- --brokers localhost:9092` (topics `payments`,
//! `card-minutes` and `fraud-alerts` must exist).
use std::time::Duration;

use onceflow::windows::Windows;
use onceflow::{Context, Event, Processor, Result, Timer};
use serde::{Deserialize, Serialize};

/// More payments than this in one minute raise an alert…
pub const MAX_PAYMENTS_PER_MINUTE: u32 = 5;
/// …and so does more than this many cents.
pub const MAX_CENTS_PER_MINUTE: i64 = 100_000;

/// Minutes of event time, open for 10 s after their end.
pub const PER_MINUTE: Windows =
    Windows::tumbling("per-minute", Duration::from_secs(60)).grace(Duration::from_secs(10));

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
pub struct Payment {
    #[event(id)]
    pub id: String,
    #[event(key)]
    pub card: String,
    pub amount_cents: i64,
}

/// One card's payments in one minute.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub payments: u32,
    pub total_cents: i64,
}

/// A card's minute, as handed over.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CardMinute {
    pub card: String,
    pub minute_start_ms: i64,
    pub payments: u32,
    pub total_cents: i64,
}

#[derive(Processor, Debug, Clone)]
#[processor(name = "fraud-check", input = "payments", input_type = Payment,
            outputs = ["card-minutes", "fraud-alerts"], timer = on_timer)]
pub struct FraudCheck;

impl FraudCheck {
    async fn handle(&mut self, payment: Payment, ctx: &mut Context<'_>) -> Result<()> {
        PER_MINUTE
            .add(ctx, &payment.card, |tally: &mut Tally| {
                tally.payments += 1;
                tally.total_cents += payment.amount_cents;
            })
            .map(drop)
    }

    async fn on_timer(&mut self, timer: Timer, ctx: &mut Context<'_>) -> Result<()> {
        let Some(closed) = PER_MINUTE.close::<Tally>(ctx, &timer)? else {
            return Ok(());
        };
        let minute = CardMinute {
            card: closed.key.clone(),
            minute_start_ms: closed.window.start_ms,
            payments: closed.value.payments,
            total_cents: closed.value.total_cents,
        };
        ctx.emit(Self::CARD_MINUTES, &closed.key, &minute)?;
        if minute.payments > MAX_PAYMENTS_PER_MINUTE || minute.total_cents > MAX_CENTS_PER_MINUTE {
            ctx.emit(Self::FRAUD_ALERTS, &closed.key, &minute)?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    onceflow::run(FraudCheck).await
}

/// Driver tests: the processor over the engine's own code, no broker
/// (`tests/fraud_check.rs` runs it against one, through a SIGKILL).
#[cfg(test)]
mod tests {
    use onceflow::testing::{CrashPoint, OutgoingRecord, TestDriver};

    use super::*;

    const MINUTE: i64 = 60_000;

    fn payment(n: u32, card: &str, cents: i64, at_ms: i64) -> OutgoingRecord {
        let value = Payment {
            id: format!("p-{n}"),
            card: card.into(),
            amount_cents: cents,
        };
        OutgoingRecord::keyed(card, serde_json::to_vec(&value).expect("json")).at_ms(at_ms)
    }

    #[tokio::test]
    async fn each_minute_is_tallied_once_and_a_busy_card_is_flagged() -> Result<()> {
        let mut driver = TestDriver::new(FraudCheck);
        // Minute 0: card a pays 7 times (flagged), card b twice.
        for n in 0..7 {
            driver.pipe_record(payment(n, "a", 100, n as i64 * 1_000));
        }
        driver.pipe_record(payment(10, "b", 500, 20_000));
        driver.pipe_record(payment(11, "b", 500, 30_000));
        driver.pipe_record(payment(11, "b", 500, 30_000)); // delivered twice
        // 5 s after the minute: inside the grace period, still minute 0.
        driver.pipe_record(payment(12, "b", 1, 59_999));
        driver.pipe_record(payment(13, "b", 1, MINUTE + 5_000));
        driver.crash_at(CrashPoint::AfterCommitBeforeApply, 1);
        driver.process().await?;
        assert!(
            driver.output(FraudCheck::CARD_MINUTES).is_empty(),
            "minute 0 is in its grace period"
        );

        // The event time passes minute 0's end plus grace: it is handed over, once.
        driver.pipe_record(payment(14, "b", 1, MINUTE + 10_000));
        driver.process().await?;
        let minutes: Vec<CardMinute> = driver.output_values(FraudCheck::CARD_MINUTES)?;
        let tallies: Vec<(&str, i64, u32, i64)> = minutes
            .iter()
            .map(|m| {
                (
                    m.card.as_str(),
                    m.minute_start_ms,
                    m.payments,
                    m.total_cents,
                )
            })
            .collect();
        assert_eq!(tallies, [("a", 0, 7, 700), ("b", 0, 3, 1_001)]);
        let alerts: Vec<CardMinute> = driver.output_values(FraudCheck::FRAUD_ALERTS)?;
        assert_eq!(
            alerts.iter().map(|a| a.card.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_payment_for_a_minute_already_reported_is_dead_lettered_not_counted() -> Result<()> {
        let mut driver = TestDriver::new(FraudCheck);
        driver.pipe_record(payment(0, "a", 100, 1_000));
        driver.pipe_record(payment(1, "a", 100, 2 * MINUTE));
        driver.pipe_record(payment(2, "a", 100, 2_000)); // minute 0 was reported
        driver.process().await?;
        let minutes: Vec<CardMinute> = driver.output_values(FraudCheck::CARD_MINUTES)?;
        assert_eq!(minutes.len(), 1);
        assert_eq!(minutes[0].payments, 1);
        let dead = driver.dead_letters();
        assert_eq!(dead.len(), 1);
        assert!(dead[0].header("onceflow-error-message").is_some_and(|m| {
            String::from_utf8_lossy(m).contains("late for windows `per-minute`")
        }));
        Ok(())
    }
}
