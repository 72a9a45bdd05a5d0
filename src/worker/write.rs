//! Write: the task's outcome stored once, fenced by its claim token (`complete`), and what
//! follows it — the workflow advanced, then the message settled. Also the error results of
//! messages that never run (unreadable, unknown, copies of finished tasks).

use std::time::Duration;

use tokio::time::Instant;

use super::pending::PendingResult;
use super::running::Outcome;
use super::settle::{self, Settle};
use super::{claim, history, slots, workflow, Inner};
use crate::broker::{DeadLetter, DeadLetterReason, Delivery};
use crate::store::{ClaimOutcome, CompleteOutcome, ResultStatus, StoreError, Token};
use crate::wire::{ErrorKind, TaskId, TaskMessage, TaskResult};

/// Why writing an error result for an unrunnable message did not happen now.
enum NotWritten {
    /// A valid copy of the task is running elsewhere; try again later.
    Busy(Duration),
    /// The store failed.
    Store(StoreError),
}

/// The fenced result write, then the message's settlement.
pub(super) async fn finish(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    token: Token,
    mut result: Option<TaskResult>,
    settle: Settle,
    outcome: Outcome,
) -> Outcome {
    finish_returning(w, d, msg, token, &mut result, settle, outcome)
        .await
        .0
}

/// [`finish`], saying whether `result` was written (for the middleware's `after_result`).
/// The result is the caller's, lent: a future that took it by value held it twice (its
/// argument and its local), and every delivery's future carried those bytes. It is taken
/// from the caller only when kept for the redelivery.
pub(super) async fn finish_returning(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    token: Token,
    result: &mut Option<TaskResult>,
    settle: Settle,
    outcome: Outcome,
) -> (Outcome, bool) {
    let reply_to = msg.labels.reply_to();
    if let Some(channel) = reply_to {
        check_reply_channel(w, msg, channel);
    }
    // Before the write that wakes the waiters: one that enqueues the same call again once
    // its wait returns sends a new task. (If the write is then fenced off or fails, the task
    // runs on with its key free: a second enqueue meanwhile sends a second task.)
    release_dedup(w, msg).await;
    let written = match slots::held_slot(w, &msg.task_id, token) {
        None => {
            w.store
                .complete(&msg.task_id, token, result.as_ref(), reply_to)
                .await
        }
        Some(slot) => {
            let id = &msg.task_id;
            Box::pin(slots::complete_freeing(
                w,
                id,
                token,
                result.as_ref(),
                reply_to,
                slot,
            ))
            .await
        }
    };
    match written {
        Ok(written @ (CompleteOutcome::Stored | CompleteOutcome::AlreadyStored)) => {
            if let (CompleteOutcome::Stored, Some(r)) = (written, &*result) {
                let registered = w.counters.result_written(&msg.task_name, r.is_err);
                history::note_finished(w, msg, registered, r.is_err);
            }

            if !workflow::advance(w, msg, result.as_ref()).await {
                let released =
                    settle::release(w, d, workflow::retry_after(w), Outcome::Released).await;
                return (released, false);
            }
            (settle::settle(w, d, &settle, outcome).await, true)
        }
        Ok(CompleteOutcome::Revoked) => {
            tracing::info!("task revoked while it ran: its result is not stored");
            (Box::pin(workflow::revoked(w, d, msg)).await, false)
        }
        Ok(_) => {
            // Fenced off: another holder owns the task and its message now.
            tracing::warn!("result write rejected: the claim was taken over; not acking");
            (
                settle::release(w, d, w.config.min_defer, Outcome::Stale).await,
                false,
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "result store unreachable: keeping the result for the redelivery");
            w.pending.keep(
                &msg.task_id,
                PendingResult {
                    token,
                    result: result.take(),
                    // Still the run's: a write that failed forgets nothing. Read again here
                    // rather than held through the write in every delivery's future.
                    slot: slots::held_slot(w, &msg.task_id, token),
                    settle,
                    outcome,
                    kept_at: Instant::now(),
                },
            );
            let released =
                settle::release(w, d, w.config.store_retry_after, Outcome::Released).await;
            (released, false)
        }
    }
}

/// Gives back the deduplication key an enqueue reserved for this task while it was queued
/// or running (`ferriq_dedup_mode` `active`): its outcome is stored, so the next enqueue
/// of the key sends a new task. A key kept for its whole window stays.
async fn release_dedup(w: &Inner, msg: &TaskMessage) {
    let Some(key) = msg.labels.get(crate::wire::names::DEDUP_KEY) else {
        return;
    };
    // A key kept for its window stays; a debounced task gave its key up when it was let
    // run.
    let kept = msg
        .labels
        .get(crate::wire::names::DEDUP_MODE)
        .is_some_and(|m| m.header_value() != crate::task::Dedup::WhileActive.as_str());
    if kept {
        return;
    }
    if let Err(e) = w
        .store
        .release_dedup(&key.header_value(), &msg.task_id)
        .await
    {
        tracing::warn!(error = %e, "could not give the deduplication key back; it lasts its window");
    }
}

/// Warns, once per worker, of a message from a client whose store has another result prefix:
/// that client's `status()` and fresh waits never find the results written here.
fn check_reply_channel(w: &Inner, msg: &TaskMessage, channel: &str) {
    use std::sync::atomic::Ordering;
    if w.store.reads_results_here(channel) || w.warned_foreign_client.swap(true, Ordering::Relaxed)
    {
        return;
    }
    tracing::warn!(
        task_name = %msg.task_name,
        task_id = %msg.task_id,
        "this task's client waits for results under another key prefix than this worker \
         writes them (its reply channel {channel:?}): give the client and the workers the \
         same FERRIQ_RESULT_PREFIX, or the client's status() and later waits find nothing \
         (reported once)"
    );
}

/// A copy of a finished task: acked, unless the task failed for good, in which case the
/// copy is parked too. A failed task's first copy may never have reached the dead-letter
/// queue (the worker died between the result write and the dead-letter).
pub(super) async fn duplicate_of_finished(w: &Inner, d: &Delivery, msg: &TaskMessage) -> Outcome {
    let stored = match w.store.get(&msg.task_id).await {
        Ok(ResultStatus::Ready(r)) => Some(r),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "result store unreachable: releasing the duplicate");
            return settle::release(w, d, w.config.store_retry_after, Outcome::Released).await;
        }
    };
    // The copy of a workflow's member or step: its first copy's worker may have died
    // between storing the outcome and acting on it.
    if !workflow::advance(w, msg, stored.as_ref()).await {
        return settle::release(w, d, workflow::retry_after(w), Outcome::Released).await;
    }
    let failure = stored.as_ref().and_then(TaskResult::failure_details);
    // A task with `park_fatal = false` answered its own fatal errors with the result alone.
    let parks_fatal = w
        .registry
        .get(&msg.task_name)
        .is_none_or(|t| t.options().get_park_fatal());
    // An expired schedule tick is answered and acked, never parked (see `expired`).
    let tick = msg.labels.get(crate::wire::names::SCHEDULE).is_some();
    let park = failure.filter(|f| {
        let answered = (f.kind == Some(ErrorKind::TaskError) && !f.retryable && !parks_fatal)
            || (f.kind == Some(ErrorKind::DeadlineExceeded) && tick);
        f.kind != Some(ErrorKind::Cancelled) && !answered
    });
    match park {
        Some(f) => {
            let reason = match f.kind {
                Some(ErrorKind::RetriesExhausted | ErrorKind::Timeout) => {
                    DeadLetterReason::RetriesExhausted
                }
                Some(ErrorKind::InvalidMessage) => DeadLetterReason::InvalidMessage,
                Some(ErrorKind::UnknownTask) => DeadLetterReason::UnknownTask,
                Some(ErrorKind::DeadlineExceeded) => DeadLetterReason::Expired,
                _ => DeadLetterReason::NonRetryable,
            };
            let name = TaskMessage::peek_task_name(&d.body);
            let why = DeadLetter::new(reason, f.message, name, f.attempts);
            match settle::park(w, d, &why).await {
                Ok(()) => Outcome::Duplicate,
                Err(e) => settle::broker_failed("dead-letter", e),
            }
        }
        None => settle::ack(w, d, Outcome::Duplicate).await,
    }
}

/// Writes an error result through the claim (so it is written once) and dead-letters the
/// message. While the store is down or a valid copy runs elsewhere, the message is
/// released to try again, up to twice the unroutable limit; then it is parked without a
/// result rather than looped.
pub(super) async fn reject_with_result(
    w: &Inner,
    d: &Delivery,
    id: Option<TaskId>,
    reason: DeadLetterReason,
    kind: ErrorKind,
    detail: String,
    task_name: Option<String>,
) -> Outcome {
    if let Some(id) = id {
        let result = TaskResult::failure(kind, detail.clone(), false, 0, 0.0, Default::default());
        let retries_left = d.receive_count < w.config.max_unroutable_receives.saturating_mul(2);
        match write_unclaimed_failure(w, &id, &result).await {
            Ok(()) => {}
            Err(NotWritten::Busy(after)) if retries_left => {
                return settle::release(w, d, after, Outcome::Deferred).await;
            }
            Err(NotWritten::Store(e)) if retries_left => {
                tracing::warn!(error = %e, "store unreachable: releasing to write the error result later");
                return settle::release(w, d, w.config.store_retry_after, Outcome::Released).await;
            }
            Err(_) => {
                tracing::error!("could not write the error result; dead-lettering without it")
            }
        }
    }
    let why = DeadLetter::new(reason, detail, task_name, 0);
    settle::dead_letter(w, d, &why).await
}

async fn write_unclaimed_failure(
    w: &Inner,
    id: &TaskId,
    result: &TaskResult,
) -> Result<(), NotWritten> {
    let claim = w
        .store
        .claim(id, &w.config.worker_id, w.config.lease, None)
        .await
        .map_err(NotWritten::Store)?;
    match claim {
        ClaimOutcome::Run { token, .. } | ClaimOutcome::Expired { token } => {
            if let Err(e) = w.store.complete(id, token, Some(result), None).await {
                // Do not leave our claim in the way of the next try.
                claim::give_back(w, id, token).await;
                return Err(NotWritten::Store(e));
            }
            Ok(())
        }
        ClaimOutcome::Defer { retry_after } => Err(NotWritten::Busy(retry_after)),
        // Already answered.
        ClaimOutcome::Done | ClaimOutcome::Revoked => Ok(()),
    }
}
