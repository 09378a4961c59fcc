//! Fences: telling a successor's fence from one the cluster caused (a coordinator that
//! moved at the wrong moment), and how many an instance may take for its own.

use super::state::FENCE_WINDOW;
use super::{DESCRIBE_EVERY, FENCE_GRACE, Resync, SESSION_MARGIN, SUCCESSOR_WAIT, new_producer};
use crate::engine::backoff::retry_transient;
use crate::engine::seams::{Renew, Sink, Source};
use crate::{Error, Result};

impl<R, N> Resync<'_, R, N> {
    /// Takes a fence for the instance's own, if the budget of [`Fences`](super::state::Fences) allows; `Err`
    /// (the instance stops) when it is spent.
    pub(in crate::engine) fn allow_fence(&self, fence: &Error) -> Result<usize> {
        let taken = self
            .state
            .fences
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        taken.map_err(|count| match fence {
            Error::Fenced { what, detail } => Error::Fenced {
                what: what.clone(),
                detail: format!(
                    "{detail}; fenced {count} times within {FENCE_WINDOW:?} before this: is \
                     another instance running with this instance ID?"
                ),
            },
            other => Error::Fenced {
                what: "this instance".into(),
                detail: format!("{other}; fenced {count} times within {FENCE_WINDOW:?}"),
            },
        })
    }

    /// A fenced producer, while the consumer is held. librdkafka reports a fence when a
    /// successor initialised the transactional ID, but also when the transaction
    /// coordinator moved while the producer bumped its own epoch (the bump reached the
    /// old coordinator, its answer did not; the cluster test saw it when it killed the
    /// coordinator). Group membership tells them apart: a successor joins under the same
    /// instance ID, which fences this consumer within a heartbeat. So the consumer is kept
    /// in the group for [`FENCE_GRACE`]; fenced meanwhile, the consumer's error ends the
    /// batch and the engine's loop asks the group who holds the instance ID
    /// ([`Resync::after_member_fenced`]); otherwise a new producer takes over. Exactly once
    /// holds either way: the new producer's initialisation ends what the old one left
    /// open, and catching up follows.
    pub(super) async fn take_fence<C, P>(
        &self,
        consumer: &C,
        producer: &mut P,
        fence: &Error,
    ) -> Result<()>
    where
        C: Source,
        P: Send,
        N: Renew<P>,
    {
        use std::sync::atomic::Ordering;
        self.state.producer_fenced.store(true, Ordering::Relaxed);
        tokio::time::sleep(FENCE_GRACE).await;
        if let Some(fatal) = consumer.fatal_error() {
            tracing::warn!(error = %fatal, producer = %fence, "the consumer was fenced too");
            return Err(fatal);
        }
        let taken = self.allow_fence(fence)?;
        tracing::warn!(
            error = %fence,
            fences = taken,
            "the producer was fenced, but no successor joined the group under this instance \
             ID: taking the fence for the instance's own (a coordinator moved) and making a \
             new producer"
        );
        *producer = new_producer(&self.renew, self.stats).await?;
        self.state.producer_fenced.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// What to do when the consumer's static membership was fenced (librdkafka's fatal
    /// `FENCED_INSTANCE_ID`) in exactly-once mode: `Ok` to join the group again, `Err`
    /// to stop.
    ///
    /// The producer fenced as well used to mean "replaced" at once. The fault matrix
    /// showed otherwise (CI, 2026-12-02): after the coordinators were restarted, an
    /// instance found both fenced with no successor anywhere, and stopped for nothing.
    /// The consumer can be fenced by its own join whose answer was lost, the producer by
    /// the transaction coordinator. Neither the member's ID nor its client ID (the
    /// coordinator keeps a replaced static member's client ID) tells a successor from
    /// that; liveness does: only a live consumer heartbeats for the member under the
    /// instance ID (this one's is fenced), so a member that outlives the session timeout
    /// is a successor's ([`Resync::successor_alive`]). Replaced, the instance stops and
    /// makes no new producer (that would fence the successor's). Not replaced, it makes
    /// a new producer (whose initialisation ends whatever the old one left open) and
    /// joins again. With only the consumer fenced it makes a new producer (which ends a
    /// transaction a hold given up may have left open) and joins again at once.
    /// Each rejoin spends one of the budget of fences.
    ///
    /// Joining again is safe in exactly-once mode either way: the group's generation
    /// check refuses a zombie's offsets (KIP-447), so nothing it commits becomes visible.
    pub(in crate::engine) async fn after_member_fenced<C, P>(
        &self,
        consumer: &C,
        producer: &mut P,
        changelog: &str,
        error: Error,
    ) -> Result<()>
    where
        C: Source,
        P: Sink<C>,
        N: Renew<P>,
    {
        let fenced_too = self.producer_fenced()
            || match producer.probe_fenced(changelog).await {
                Ok(fenced) => fenced,
                Err(unknown) => {
                    tracing::warn!(error = %unknown, "could not learn whether the producer is fenced too");
                    false
                }
            };
        if !fenced_too {
            let fences = self.allow_fence(&error)?;
            tracing::warn!(%error, fences, "the consumer's static membership was fenced, the producer was not: making a new producer and joining the group again");
            // The fence may have ended a hold half-way through undoing a failed batch,
            // its transaction still open: the producer would refuse to begin the next
            // one, and the open transaction would hold the changelog's last stable
            // offset until it timed out (found by the simulation of issue 40). A new
            // producer's initialisation aborts it; the ID is still this instance's.
            *producer = new_producer(&self.renew, self.stats).await?;
            return Ok(());
        }
        match self.successor_alive(consumer).await {
            Ok(true) => {
                tracing::error!(%error, "this instance was replaced: its producer is fenced too, and a member under its instance ID outlived the session; stopping");
                Err(error)
            }
            Ok(false) => {
                let fences = self.allow_fence(&error)?;
                tracing::warn!(
                    %error,
                    fences,
                    "the consumer and the producer were fenced, but no member under the \
                     instance ID outlived the session: no successor; making a new producer \
                     and joining the group again"
                );
                *producer = new_producer(&self.renew, self.stats).await?;
                self.state
                    .producer_fenced
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(unknown) => {
                tracing::error!(%error, group = %unknown, "this instance was likely replaced: its producer is fenced too, and the group could not be described; stopping");
                Err(error)
            }
        }
    }

    /// Whether a member under the instance ID stays in the group past the consumer's
    /// session timeout (and a margin), the group stable: then someone heartbeats for it,
    /// a successor. Gone before, it was left over from this instance. A rebalance under
    /// way keeps members that stopped heartbeating until it ends, so an unstable group
    /// is waited for, up to [`SUCCESSOR_WAIT`].
    pub(super) async fn successor_alive<C: Source>(&self, consumer: &C) -> Result<bool> {
        let started = tokio::time::Instant::now();
        let session = consumer.session_timeout() + SESSION_MARGIN;
        let mut seen = None;
        loop {
            let holder = retry_transient("describe the group", || consumer.holder()).await?;
            let Some(member) = holder.member else {
                return Ok(false);
            };
            let waited = started.elapsed();
            if (waited >= session && holder.stable) || waited >= SUCCESSOR_WAIT {
                tracing::info!(%member, ?waited, stable = holder.stable, "a member under the instance ID outlived the session");
                return Ok(true);
            }
            if seen.as_ref() != Some(&member) {
                tracing::info!(%member, ?session, "a member is under the instance ID: waiting whether it outlives the session");
                seen = Some(member);
            }
            tokio::time::sleep(DESCRIBE_EVERY).await;
        }
    }

    /// Whether the producer was fenced and not replaced since: with the consumer fenced
    /// too, a successor has the instance ID (see [`Self::take_fence`]).
    pub(in crate::engine) fn producer_fenced(&self) -> bool {
        self.state
            .producer_fenced
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}
