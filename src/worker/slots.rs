//! Concurrency slots at the worker: a limited task takes one of its limiter's slots with its
//! claim, or is handed back until its turn among the waiting. The store keeps a slot per task,
//! held by the run that holds the task's claim: renewed with the claims' heartbeats, freed with
//! the run's result (or its failure's record), and left alone by a copy of the task that does
//! not run.

use std::time::Duration;

use tokio::time::Instant;

use super::limits::{ask, claim, limiter_unreachable};
use super::running::Outcome;
use super::{settle, Inner};
use crate::broker::Delivery;
use crate::store::{
    ClaimOutcome, CompleteOutcome, FailureRecord, Gated, HeldSlot, LimitGate, SlotDecision,
    StoreError, Token,
};
use crate::task::Limiter;
use crate::wire::{TaskId, TaskMessage, TaskResult};

/// Takes a slot of `limiter` for the message's run and claims the task: the claim, and whose
/// the slot is (`Err`: what became of the delivery — handed back until its turn among the
/// waiting, or released). The slot and the claim go out together where the store can answer
/// both at once. The store keeps a slot per task, not per delivery: the claim's answer, and
/// whether the task held the slot before this ask, say whose it is ([`SlotHolder`]).
pub(super) async fn claim_with_slot(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    limiter: &Limiter,
    limit: u32,
) -> Result<(ClaimOutcome, SlotHolder), Outcome> {
    let gate = LimitGate::Slot {
        limiter,
        limit,
        lease: w.config.lease,
    };
    let decision = match w
        .store
        .claim_past_limit(gate, &msg.task_id, ask(w, msg))
        .await
    {
        None => {
            let taken = take_slot(w, d, msg, limiter, limit).await?;
            let claimed = claim(w, d, msg).await?;
            return Ok((claimed, SlotHolder::of(&claimed, taken)));
        }
        Some(answer) => answer,
    };
    match decision {
        Ok(Gated::Claimed(claim)) => Ok((claim, SlotHolder::of(&claim, Taken::Now))),
        Ok(Gated::ClaimedInHeldSlot(claim)) => Ok((claim, SlotHolder::of(&claim, Taken::Before))),
        Ok(Gated::Wait(wait)) => Err(every_slot_taken(w, d, wait).await),
        Err(e) => Err(limiter_unreachable(w, d, &e).await),
    }
}

/// Whether the task's slot was taken by this ask, or held by the task before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    Now,
    Before,
}

/// Takes a slot of `limiter` for the message's run, or hands the message back until its
/// turn among the waiting (`Err`: what became of it).
async fn take_slot(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    limiter: &Limiter,
    limit: u32,
) -> Result<Taken, Outcome> {
    match w
        .store
        .acquire_slot(limiter, &msg.task_id, limit, w.config.lease)
        .await
    {
        Ok(SlotDecision::Held) => Ok(Taken::Now),
        Ok(SlotDecision::AlreadyHeld) => Ok(Taken::Before),
        Ok(SlotDecision::Wait(wait)) => Err(every_slot_taken(w, d, wait).await),
        Err(e) => Err(limiter_unreachable(w, d, &e).await),
    }
}

/// Whose a task's slot is, once its claim answered. The store keeps one slot per task (a
/// redelivery of a task whose run died takes that run's slot again), so a copy of a task
/// received while another copy runs is told its slot is held — and must not free it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotHolder {
    /// This delivery's run, under its claim's token: renewed from now on, freed when the run
    /// ends ([`RunSlot::after_run`]).
    This(Token),
    /// Another delivery's run: the one holding the task's live claim, or one that held it
    /// before (a run revoked but not yet stopped frees it when it stops; a dead run's lapses
    /// within a lease). Left alone.
    Other,
    /// Nobody's: the task runs no more (finished, or revoked) and this copy took the slot
    /// for nothing. It is freed now.
    Nobody,
}

impl SlotHolder {
    /// Whose the slot is, by what the claim answered and whether this ask took the slot.
    fn of(claim: &ClaimOutcome, taken: Taken) -> SlotHolder {
        match (claim, taken) {
            (ClaimOutcome::Run { token, .. } | ClaimOutcome::Expired { token }, _) => {
                SlotHolder::This(*token)
            }
            (ClaimOutcome::Defer { .. }, _) | (_, Taken::Before) => SlotHolder::Other,
            (_, Taken::Now) => SlotHolder::Nobody,
        }
    }
}

/// A slot held by one of this worker's runs: its limiter, when the run took it, and the
/// run's claim token (a copy of the task received meanwhile takes nothing from it).
pub(crate) struct HeldByRun {
    limiter: Limiter,
    since: Instant,
    token: Token,
}

/// The slot a run of this worker holds, from its claim to its end: renewed with the claims'
/// heartbeats meanwhile, then freed or left to the task's next run ([`RunSlot::after_run`]).
/// If the run ends without saying so (a panic in the worker's own code, the delivery's future
/// dropped), the slot is no longer renewed: it lapses within a lease instead of being renewed
/// for as long as the worker lives.
pub(super) struct RunSlot<'a> {
    w: &'a Inner,
    id: &'a TaskId,
    token: Token,
    ended: bool,
}

impl<'a> RunSlot<'a> {
    /// The run under `token` holds task `id`'s slot of `limiter`.
    pub(super) fn hold(w: &'a Inner, id: &'a TaskId, limiter: &Limiter, token: Token) -> Self {
        let held = HeldByRun {
            limiter: limiter.clone(),
            since: Instant::now(),
            token,
        };
        w.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), held);
        RunSlot {
            w,
            id,
            token,
            ended: false,
        }
    }

    /// The run ended as `outcome`, its slot not freed by a result's write or a failed
    /// attempt's record. The slot is freed when the task is over for good; otherwise its
    /// message is back in its queue, or another run holds its claim: the slot is the task's,
    /// its next run takes it again, and it lapses within a lease if none comes (freed now, a
    /// redelivery that took it back already would run without one).
    pub(super) async fn after_run(mut self, outcome: Outcome) {
        // Both ways forget the entry before their first await.
        self.ended = true;
        if outcome.removed() {
            free_held(self.w, self.id, self.token).await;
        } else {
            forget(self.w, self.id, self.token);
        }
    }
}

impl Drop for RunSlot<'_> {
    fn drop(&mut self) {
        if !self.ended {
            forget(self.w, self.id, self.token);
        }
    }
}

async fn every_slot_taken(w: &Inner, d: &Delivery, wait: Duration) -> Outcome {
    tracing::debug!(turn_in = ?wait, "every slot of its concurrency limit is taken: handed back");
    settle::release(w, d, wait, Outcome::ConcurrencyLimited).await
}

/// The slot the run under `token` holds, if any: its limiter and how long it has held it.
pub(super) fn held_slot(w: &Inner, id: &TaskId, token: Token) -> Option<(Limiter, Duration)> {
    let slots = w.slots.lock().unwrap_or_else(|p| p.into_inner());
    // Most workers hold no slot: the id is not hashed then.
    if slots.is_empty() {
        return None;
    }
    slots
        .get(id)
        .filter(|held| held.token == token)
        .map(|held| (held.limiter.clone(), held.since.elapsed()))
}

/// Stops renewing the slot of the run under `token` (it is freed, or no longer its).
fn forget(w: &Inner, id: &TaskId, token: Token) -> Option<HeldByRun> {
    let mut slots = w.slots.lock().unwrap_or_else(|p| p.into_inner());
    match slots.get(id) {
        Some(held) if held.token == token => slots.remove(id),
        _ => None,
    }
}

/// Writes the result of the run under `token`, which holds a slot of `limiter`
/// ([`crate::store::ResultStore::complete`]), and frees the slot before the message is
/// settled — in the same round trip where the store can. A write fenced off (`Stale`)
/// frees nothing: the task's claim, and its slot, belong to another run now; nor does one
/// that failed (the result is kept for the redelivery, which writes it through here:
/// `pending::write_kept`).
pub(super) async fn complete_freeing(
    w: &Inner,
    id: &TaskId,
    token: Token,
    result: Option<&TaskResult>,
    reply_to: Option<&str>,
    (limiter, held): (Limiter, Duration),
) -> Result<CompleteOutcome, StoreError> {
    let slot = HeldSlot {
        limiter: &limiter,
        held,
    };
    let written = match w
        .store
        .complete_freeing_slot(id, token, result, reply_to, slot)
        .await
    {
        Some(written) => written,
        None => {
            // A store that does them apart: the slot is freed next, still before the message
            // is settled (a retry released at once could otherwise take it back first).
            let written = w.store.complete(id, token, result, reply_to).await;
            if matches!(written, Ok(ref outcome) if frees_slot(*outcome)) {
                free(w, &limiter, id, held).await;
            }
            written
        }
    };
    if written.is_ok() {
        forget(w, id, token);
    }
    written
}

/// Whether a write that answered `outcome` ends its run's hold on the task's slot.
fn frees_slot(outcome: CompleteOutcome) -> bool {
    !matches!(outcome, CompleteOutcome::Stale)
}

/// Records the failed attempt under `token` and gives its claim back
/// ([`crate::store::ClaimStore::record_failure`]), and frees the slot its run holds (if any)
/// before its message goes back for the retry — its retry then waits for its turn like any
/// other task instead of keeping a slot through its backoff. In one step where the store can:
/// apart, a copy of the task that claims between the two would run in a slot freed under it.
/// A stale token frees nothing (the claim, and the slot, are another run's).
pub(super) async fn record_failure(
    w: &Inner,
    id: &TaskId,
    token: Token,
) -> Result<FailureRecord, StoreError> {
    let Some((limiter, held)) = held_slot(w, id, token) else {
        return w.store.record_failure(id, token).await;
    };
    let slot = HeldSlot {
        limiter: &limiter,
        held,
    };
    let recorded = match w.store.record_failure_freeing_slot(id, token, slot).await {
        Some(recorded) => recorded,
        None => {
            let recorded = w.store.record_failure(id, token).await;
            if matches!(recorded, Ok(FailureRecord::Recorded { .. })) {
                free(w, &limiter, id, held).await;
            }
            recorded
        }
    };
    if recorded.is_ok() {
        forget(w, id, token);
    }
    recorded
}

/// Frees the slot the run under `token` holds, if any.
async fn free_held(w: &Inner, id: &TaskId, token: Token) {
    if let Some(held) = forget(w, id, token) {
        free(w, &held.limiter, id, held.since.elapsed()).await;
    }
}

/// Frees task `id`'s slot of `limiter`, held for `held`. A slot that cannot be freed now runs
/// out with its lease, no longer renewed (as does one a store took but could not say so).
async fn free(w: &Inner, limiter: &str, id: &TaskId, held: Duration) {
    if let Err(e) = w.store.release_slot(limiter, id, held).await {
        tracing::warn!(error = %e, "could not free a concurrency slot; it frees itself within a lease");
    }
}

/// Frees task `id`'s slot of `limiter` with no run's length to count (the store does not count
/// a zero as one): a slot a copy of a finished or revoked task took without running.
pub(super) async fn free_untimed(w: &Inner, limiter: &str, id: &TaskId) {
    free(w, limiter, id, Duration::ZERO).await;
}

/// The slots held by this worker's runs, to renew with their claims.
pub(super) fn held_slots(w: &Inner) -> Vec<(String, TaskId)> {
    w.slots
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(id, held)| (held.limiter.to_string(), id.clone()))
        .collect()
}
