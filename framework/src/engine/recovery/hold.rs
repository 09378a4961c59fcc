//! Holding the consumer: work that does not poll (catching up, back-off, a fence's
//! grace) runs with its partitions paused and polled twice a second, so the member
//! stays in the group; what those polls bring waits for the engine's loop.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{KEEP_ALIVE_EVERY, Resync};
use crate::Result;
use crate::engine::seams::{Restore, Source};
use crate::kafka;

impl<R: Restore, N> Resync<'_, R, N> {
    /// Waits `delay` (back-off after a failed batch) with the consumer held.
    pub(in crate::engine) async fn pause_for<C: Source>(
        &self,
        consumer: &C,
        delay: Duration,
    ) -> Result<()> {
        self.holding(consumer, Duration::ZERO, async {
            tokio::time::sleep(delay).await;
            Ok(())
        })
        .await
    }

    /// Takes what the polls of a held consumer brought, poll by poll, in order.
    pub(in crate::engine) fn take_held(&self) -> Vec<kafka::Polled> {
        std::mem::take(&mut *self.state.held.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The partitions the rebalances a held consumer served (and the engine has not
    /// taken yet) revoked or assigned.
    pub(in crate::engine) fn rebalanced_partitions(&self) -> BTreeSet<i32> {
        let held = self.state.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter()
            .flat_map(|polled| &polled.rebalances)
            .flat_map(|event| match event {
                kafka::Rebalanced::Revoked(partitions)
                | kafka::Rebalanced::Assigned(partitions) => partitions.iter().copied(),
            })
            .collect()
    }

    /// Whether a held consumer served a rebalance that the engine has not taken yet.
    pub(in crate::engine) fn rebalanced_meanwhile(&self) -> bool {
        self.state
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|polled| !polled.rebalances.is_empty())
    }

    /// Runs `work` with the consumer held (see the module's invariants) once it has run
    /// for `after` (at once when zero; [`HOLD_AFTER_ASSIGNMENT`](super::HOLD_AFTER_ASSIGNMENT) for newly assigned
    /// partitions): the member stays in the group however long `work` takes. Work over
    /// within `after` is never held. No transaction may be open.
    pub(super) async fn holding<C: Source, T>(
        &self,
        consumer: &C,
        after: Duration,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut work = std::pin::pin!(work);
        if !after.is_zero() {
            tokio::select! {
                outcome = &mut work => return outcome,
                () = tokio::time::sleep(after) => {}
            }
        }
        consumer.hold().await?;
        let outcome = {
            let mut ticks = tokio::time::interval(KEEP_ALIVE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    outcome = &mut work => break outcome,
                    _ = ticks.tick() => match consumer.keep_alive().await {
                        Ok(polled) => {
                            if !polled.records.is_empty() || !polled.rebalances.is_empty() {
                                self.state.held
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push(polled);
                            }
                        }
                        // Fenced or fatal: the instance stops; the work's result no
                        // longer matters.
                        Err(error) => break Err(error),
                    },
                }
            }
        };
        let released = consumer.release().await;
        let value = outcome?;
        released?;
        Ok(value)
    }
}
