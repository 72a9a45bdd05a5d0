//! Results kept while the store was unreachable: a run finished, its outcome could not be
//! written, and its message went back. The result is written on the message's redelivery,
//! with the claim token it was computed under (design §6, "Valkey unreachable at complete"),
//! instead of running the task again.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::running::Outcome;
use super::settle::{self, Settle};
use super::{slots, workflow, Inner};
use crate::broker::Delivery;
use crate::store::{CompleteOutcome, Token};
use crate::task::Limiter;
use crate::wire::{TaskId, TaskMessage, TaskResult};

/// A result computed while the store was unreachable. (No `Debug`: the limiter's name may
/// hold a task argument's value.)
pub(super) struct PendingResult {
    pub(super) token: Token,
    pub(super) result: Option<TaskResult>,
    /// The concurrency slot the run held (its limiter, and how long it had held it when the
    /// write failed): freed when the result is written. Kept, not worked out again from the
    /// redelivered message, whose labels or the limits set since may name another limiter.
    pub(super) slot: Option<(Limiter, Duration)>,
    pub(super) settle: Settle,
    pub(super) outcome: Outcome,
    pub(super) kept_at: Instant,
}

/// The results a worker keeps, by task id, each for a bounded time.
pub(super) struct PendingResults {
    kept: Mutex<crate::FastMap<TaskId, PendingResult>>,
    /// How long a kept result is worth keeping. It stays writable (the write is fenced by
    /// token, not by lease) until another worker takes the task over, which needs the store
    /// back: long enough to ride out an outage, bounded so a result whose redelivery went to
    /// another worker does not stay forever.
    ttl: Duration,
    max: usize,
}

impl PendingResults {
    /// Kept for ten leases and three store retries, at most `max` of them.
    pub(super) fn new(lease: Duration, store_retry_after: Duration, max: usize) -> Self {
        Self {
            kept: Mutex::default(),
            ttl: lease * 10 + store_retry_after * 3,
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, crate::FastMap<TaskId, PendingResult>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `result` for the task's redelivery (unless too many are kept already: the task
    /// then runs again, its outcome written once all the same).
    pub(super) fn keep(&self, id: &TaskId, result: PendingResult) {
        let mut kept = self.lock();
        kept.retain(|_, p| p.kept_at.elapsed() < self.ttl);
        if kept.len() < self.max {
            kept.insert(id.clone(), result);
        } else {
            tracing::warn!("too many results pending: this task will run again");
        }
    }

    /// The result kept for the task, if it is still worth writing.
    pub(super) fn take(&self, id: &TaskId) -> Option<PendingResult> {
        self.lock()
            .remove(id)
            .filter(|p| p.kept_at.elapsed() < self.ttl)
    }

    /// Drops kept results that are too old to matter (run from the heartbeat loop).
    pub(super) fn sweep(&self) {
        self.lock().retain(|_, p| p.kept_at.elapsed() < self.ttl);
    }
}

/// Stores a result kept from a run while the store was down. `None` when the write was
/// fenced off and the delivery should go through the claim as usual.
///
/// The run that made the result may have held a concurrency slot (kept with the result), and
/// could not free it with the failed write: the kept result is written the way a run's
/// result is (`slots::complete_freeing`: the slot freed with the write, in one round trip where
/// the store can, unless the write is fenced off) — not left to run out a lease, a slot fewer
/// for every result kept through an outage.
pub(super) async fn write_kept(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    p: PendingResult,
) -> Option<Outcome> {
    let reply_to = msg.labels.reply_to();
    let (id, result) = (&msg.task_id, p.result.as_ref());
    let written = match &p.slot {
        Some((limiter, held)) => {
            // Cloned: the result stays kept (with its slot) if the store is still down.
            let held = (limiter.clone(), *held);
            slots::complete_freeing(w, id, p.token, result, reply_to, held).await
        }
        None => w.store.complete(id, p.token, result, reply_to).await,
    };
    match written {
        Ok(CompleteOutcome::Stored | CompleteOutcome::AlreadyStored) => {
            if !workflow::advance(w, msg, p.result.as_ref()).await {
                return Some(
                    settle::release(w, d, workflow::retry_after(w), Outcome::Released).await,
                );
            }
            Some(settle::settle(w, d, &p.settle, p.outcome).await)
        }
        Ok(outcome) => {
            // Fenced off (another run took the task over) or revoked: the result is dropped,
            // and the delivery goes through its claim, which says what became of the task.
            tracing::warn!(
                ?outcome,
                "a result kept through a store outage was not written: the task's claim \
                 moved on since its run; the delivery goes through its claim"
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "result store still unreachable");
            w.pending.keep(&msg.task_id, p);
            Some(settle::release(w, d, w.config.store_retry_after, Outcome::Released).await)
        }
    }
}
