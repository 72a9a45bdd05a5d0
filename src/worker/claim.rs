//! Claim: the task taken in the store under a lease and a fencing token before it runs, so
//! one run at a time holds it (design §5); every answer of the claim handled here, and the
//! claim given back when a run ends without a result.

use std::time::Duration;

use tokio::time::Instant;

use super::running::Outcome;
use super::settle::{self, Settle};
use super::{run, workflow, write, Inner};
use crate::broker::{DeadLetter, DeadLetterReason, Delivery};
use crate::store::{ClaimOutcome, StoreError, Token};
use crate::wire::{names, ErrorKind, TaskId, TaskMessage, TaskResult};

/// Claims the task and runs it (design §6, from the claim on). `claimed`: the claim's answer
/// when it was asked for already (with the task's limit, in one round trip).
pub(super) async fn claim_and_run(
    w: &Inner,
    d: &Delivery,
    msg: &mut TaskMessage,
    task: &'static crate::task::TaskRegistration,
    claimed: Option<ClaimOutcome>,
) -> Outcome {
    let config = &w.config;
    let claim = match claimed {
        Some(claim) => claim,
        None => {
            let claim = w.store.claim(
                &msg.task_id,
                &config.worker_id,
                config.lease,
                msg.labels.deadline_at(),
            );
            match claim.await {
                Ok(claim) => claim,
                Err(e) => return unreachable(w, d, &e).await,
            }
        }
    };
    // Rare paths are boxed (`Box::pin`) throughout: a future is as large as its largest
    // state, and this one is moved into its task on every delivery. The message is the
    // caller's, lent: each future that took it by value held a copy of it (and of its
    // argument's slot), and every such byte is copied whenever the whole future moves.
    match claim {
        ClaimOutcome::Done => Box::pin(write::duplicate_of_finished(w, d, msg)).await,
        ClaimOutcome::Revoked => Box::pin(workflow::revoked(w, d, msg)).await,
        ClaimOutcome::Defer { retry_after } => {
            w.counters.claim(task.name, false);
            settle::release(w, d, retry_after, Outcome::Deferred).await
        }
        ClaimOutcome::Expired { token } => Box::pin(expired(w, d, msg, token)).await,
        ClaimOutcome::Run {
            token,
            failures,
            takeovers,
            took_over,
            ..
        } => {
            if took_over {
                w.counters.claim(task.name, true);
            }
            run::run(w, d, msg, task, token, failures, takeovers).await
        }
    }
}

/// The claim store could not answer: the message goes back for a later try. Released first:
/// nothing to give back on the claim side, and the message must not wait on a store that may
/// hang.
pub(super) async fn unreachable(w: &Inner, d: &Delivery, e: &StoreError) -> Outcome {
    tracing::warn!(error = %e, "claim store unreachable: releasing the message");
    settle::release(w, d, w.config.store_retry_after, Outcome::Released).await
}

/// Its deadline passed before it could start: it never runs. Loud and recoverable —
/// a WARN naming it, a `DeadlineExceeded` result for its waiter, and the message parked as
/// `expired` (the middleware's `on_dead_letter` hears it), so an outage's backlog can be
/// listed and redriven rather than silently dropped.
async fn expired(w: &Inner, d: &Delivery, msg: &TaskMessage, token: Token) -> Outcome {
    let deadline = msg.labels.deadline_at().unwrap_or_default();
    let late = (w.config.clock.now_unix() - deadline).max(0.0);
    let detail = format!(
        "its deadline (deadline_at {deadline:.0}) passed {late:.0} s before a worker could \
         start it: not run"
    );
    // A schedule's tick is worth running near its time only, and a later tick follows: it
    // is answered and acked, not parked (an outage would park a day of ticks).
    let tick = msg.labels.get(names::SCHEDULE).is_some();
    if tick {
        tracing::info!(task_name = %msg.task_name, task_id = %msg.task_id, "a schedule's tick expired before it could start: not run");
    } else {
        tracing::warn!(
            task_name = %msg.task_name,
            task_id = %msg.task_id,
            queue = %d.queue,
            late_secs = late.round(),
            "the task's deadline passed before it could start: not run, parked as `expired` \
             (`ferriq dlq redrive --reason expired` runs it)"
        );
    }
    let result = TaskResult::failure(
        ErrorKind::DeadlineExceeded,
        detail.clone(),
        false,
        0,
        0.0,
        msg.labels.clone(),
    );
    let settle = if tick {
        Settle::Ack
    } else {
        Settle::DeadLetter(DeadLetter::new(
            DeadLetterReason::Expired,
            detail,
            Some(msg.task_name.to_string()),
            0,
        ))
    };
    write::finish(w, d, msg, token, Some(result), settle, Outcome::Expired).await
}

/// Releases a claim in the background, retrying while the store is unreachable (for up to
/// a lease: after that the claim has run out anyway).
pub(super) fn give_back_later(w: &Inner, id: TaskId, token: Token) {
    let claims = std::sync::Arc::clone(&w.store);
    let lease = w.config.lease;
    tokio::spawn(async move {
        let deadline = Instant::now() + lease;
        while Instant::now() < deadline {
            if claims.release(&id, token).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

pub(super) async fn give_back(w: &Inner, id: &TaskId, token: Token) {
    if let Err(e) = w.store.release(id, token).await {
        tracing::warn!(error = %e, "could not release the claim; it expires with its lease");
    }
}
