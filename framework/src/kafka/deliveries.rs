//! Where the producer's records landed, kept in one ledger per producer instead of a
//! channel per record.
//!
//! rust-rdkafka's `FutureProducer` gives each record a boxed oneshot channel, and the
//! engine kept the topic's name beside it: three allocations per record, about two
//! records per input event (the output and its dedup entry), held until the batch
//! commits. heaptrack counted 5.6 MiB of the benchmark's peak heap in them (2026-12-05).
//!
//! Here a record's delivery opaque is its sequence number, and the delivery report,
//! served by the producer's polling thread, writes the outcome into the ledger's slot for
//! it. Sequence numbers are handed out in order, so the slots are a ring: a slot is freed
//! once its outcome was taken (or its [`Pending`] dropped unawaited) and every slot before
//! it was freed too. A [`Pending`] waits for its own slot only: the report of a record
//! wakes the task that waits for that record, and no other.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext};

use super::error::log_client_error;
use super::kafka_error;
use crate::{Error, Result};

/// One record's place in the ledger.
enum Slot {
    /// Sent, not acknowledged yet.
    InFlight,
    /// Acknowledged: `(partition, offset)`.
    Landed(i32, i64),
    /// Refused or not delivered.
    Failed(Error),
    /// Its outcome was taken, or nobody waits for it any more.
    Free,
}

#[derive(Default)]
struct Ledger {
    /// The sequence number of `slots[0]`.
    first: u64,
    slots: VecDeque<Slot>,
    /// The tasks waiting, each for its own record.
    waiters: Vec<(u64, Waker)>,
    /// The producer is gone: what is still in flight will never be reported.
    closed: bool,
}

impl Ledger {
    fn slot(&mut self, seq: u64) -> Option<&mut Slot> {
        let index = usize::try_from(seq.checked_sub(self.first)?).ok()?;
        self.slots.get_mut(index)
    }

    /// Frees `seq`'s slot, and with it every freed slot at the front of the ring.
    fn free(&mut self, seq: u64) {
        if let Some(slot) = self.slot(seq) {
            *slot = Slot::Free;
        }
        while matches!(self.slots.front(), Some(Slot::Free)) {
            self.slots.pop_front();
            self.first += 1;
        }
    }

    fn wake(&mut self, seq: u64) {
        if let Some(at) = self.waiters.iter().position(|(s, _)| *s == seq) {
            self.waiters.swap_remove(at).1.wake();
        }
    }
}

/// The ledger a producer and its sent records share.
#[derive(Default)]
pub(super) struct Deliveries {
    ledger: Mutex<Ledger>,
}

impl Deliveries {
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a record about to be sent, held by the returned [`Pending`] (its
    /// [`Pending::opaque`] is the record's delivery opaque). Dropped unawaited, it frees
    /// the slot, so a record librdkafka refused to queue holds none.
    pub(super) fn reserve(self: &Arc<Self>) -> Pending {
        let mut ledger = self.lock();
        ledger.slots.push_back(Slot::InFlight);
        let seq = ledger.first + ledger.slots.len() as u64 - 1;
        Pending {
            seq,
            deliveries: self.clone(),
            taken: false,
        }
    }

    /// The outcome of `seq`'s record, from its delivery report.
    fn report(&self, seq: u64, outcome: std::result::Result<(i32, i64), Error>) {
        let mut ledger = self.lock();
        if let Some(slot) = ledger.slot(seq)
            && matches!(slot, Slot::InFlight)
        {
            *slot = match outcome {
                Ok((partition, offset)) => Slot::Landed(partition, offset),
                Err(error) => Slot::Failed(error),
            };
            ledger.wake(seq);
        }
    }

    /// No report will come any more: wakes every waiting task.
    fn close(&self) {
        let mut ledger = self.lock();
        ledger.closed = true;
        for (_, waker) in ledger.waiters.drain(..) {
            waker.wake();
        }
    }

    /// Slots not freed yet (a test's view of leaks).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.lock().slots.len()
    }
}

/// A record sent and not yet known to have landed.
pub(crate) struct Pending {
    seq: u64,
    deliveries: Arc<Deliveries>,
    taken: bool,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("seq", &self.seq).finish()
    }
}

impl Pending {
    /// The record's delivery opaque: its sequence number.
    pub(super) fn opaque(&self) -> usize {
        usize::try_from(self.seq).expect("fewer records than usize::MAX")
    }

    /// Waits for the broker's acknowledgement: `(partition, offset)`.
    pub(crate) async fn landed(mut self) -> Result<(i32, i64)> {
        std::future::poll_fn(|cx| {
            let mut ledger = self.deliveries.lock();
            let closed = ledger.closed;
            let seq = self.seq;
            let Some(slot) = ledger.slot(seq) else {
                return Poll::Ready(Err(Error::Broker(
                    "a record's delivery report was taken twice".into(),
                )));
            };
            let outcome = match std::mem::replace(slot, Slot::Free) {
                Slot::Landed(partition, offset) => Ok((partition, offset)),
                Slot::Failed(error) => Err(error),
                Slot::InFlight if closed => Err(Error::Broker(
                    "the producer went away before the record was acknowledged".into(),
                )),
                Slot::InFlight => {
                    *slot = Slot::InFlight;
                    let waker = cx.waker().clone();
                    match ledger.waiters.iter_mut().find(|(s, _)| *s == seq) {
                        Some((_, old)) => *old = waker,
                        None => ledger.waiters.push((seq, waker)),
                    }
                    return Poll::Pending;
                }
                Slot::Free => Err(Error::Broker(
                    "a record's delivery report was taken twice".into(),
                )),
            };
            ledger.free(seq);
            self.taken = true;
            Poll::Ready(outcome)
        })
        .await
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.taken {
            let mut ledger = self.deliveries.lock();
            ledger.waiters.retain(|(s, _)| *s != self.seq);
            ledger.free(self.seq);
        }
    }
}

/// The engine producer's context: delivery reports go to its [`Deliveries`]; librdkafka's
/// errors are logged by [`log_client_error`].
pub(super) struct Ledgered {
    pub(super) deliveries: Arc<Deliveries>,
}

impl ClientContext for Ledgered {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(error, reason);
    }
}

impl ProducerContext for Ledgered {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        let outcome = match result {
            Ok(message) => Ok((message.partition(), message.offset())),
            Err((error, message)) => Err(kafka_error(
                crate::Operation::produce(message.topic()),
                error.clone(),
            )),
        };
        self.deliveries.report(seq as u64, outcome);
    }
}

impl Drop for Ledgered {
    fn drop(&mut self) {
        self.deliveries.close();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Deliveries, Pending};
    use crate::Error;

    fn sent(deliveries: &Arc<Deliveries>) -> Pending {
        deliveries.reserve()
    }

    #[tokio::test]
    async fn reports_in_any_order_reach_their_own_record_and_free_every_slot() {
        let deliveries = Arc::new(Deliveries::default());
        let pending: Vec<Pending> = (0..5).map(|_| sent(&deliveries)).collect();
        for (seq, offset) in [(3, 30), (0, 0), (4, 40), (1, 10)] {
            deliveries.report(seq, Ok((seq as i32, offset)));
        }
        deliveries.report(2, Err(Error::Broker("refused".into())));
        let mut outcomes = Vec::new();
        for p in pending.into_iter().rev() {
            outcomes.push(p.landed().await.map_err(|e| e.to_string()));
        }
        let refused = Error::Broker("refused".into()).to_string();
        assert_eq!(
            outcomes,
            [
                Ok((4, 40)),
                Ok((3, 30)),
                Err(refused),
                Ok((1, 10)),
                Ok((0, 0))
            ]
        );
        assert_eq!(deliveries.held(), 0, "every slot freed");
    }

    #[tokio::test]
    async fn a_waiting_record_is_woken_by_its_own_report() {
        let deliveries = Arc::new(Deliveries::default());
        let first = sent(&deliveries);
        let second = sent(&deliveries);
        let waiting = tokio::spawn(second.landed());
        tokio::time::sleep(Duration::from_millis(20)).await;
        deliveries.report(0, Ok((0, 7)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "finished on another record's report"
        );
        deliveries.report(1, Ok((2, 8)));
        assert_eq!(waiting.await.expect("task").expect("landed"), (2, 8));
        assert_eq!(first.landed().await.expect("landed"), (0, 7));
        assert_eq!(deliveries.held(), 0);
    }

    #[tokio::test]
    async fn records_dropped_unawaited_or_never_queued_hold_no_slot() {
        let deliveries = Arc::new(Deliveries::default());
        let dropped = sent(&deliveries);
        let kept = sent(&deliveries);
        let never_queued = sent(&deliveries);
        drop(dropped);
        drop(never_queued);
        // Its report comes after it was dropped: nothing is kept for it.
        deliveries.report(0, Ok((0, 1)));
        assert_eq!(
            deliveries.held(),
            2,
            "the kept record and the one before it"
        );
        deliveries.report(1, Ok((0, 2)));
        assert_eq!(kept.landed().await.expect("landed"), (0, 2));
        assert_eq!(deliveries.held(), 0);
    }

    #[tokio::test]
    async fn a_record_in_flight_when_the_producer_goes_away_is_an_error_not_a_hang() {
        let deliveries = Arc::new(Deliveries::default());
        let pending = sent(&deliveries);
        let waiting = tokio::spawn(pending.landed());
        tokio::time::sleep(Duration::from_millis(20)).await;
        deliveries.close();
        let outcome = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("task");
        assert!(
            matches!(&outcome, Err(Error::Broker(text)) if text.contains("went away")),
            "{outcome:?}"
        );
    }
}
