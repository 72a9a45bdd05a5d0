//! One delivery, top to bottom (design §6): the order of the stages, each in its own file.
//! Every stage either passes the message on or says what became of the delivery (an
//! [`Outcome`]: acked, released, parked…), and then the rest is skipped.
//!
//! decode → due → debounce → route → kept result → rate turn → concurrency slot → claim → run
//! → write → settle.

use tracing::field::Empty;
use tracing::Instrument;

use super::decode::{self, NotRunnable};
use super::running::Outcome;
use super::slots::{self, SlotHolder};
use super::{claim, due, limits, pending, route, settle, write, Inner};
use crate::broker::Delivery;
use crate::task::{Limiter, Rate, TaskRegistration};
use crate::wire::{ErrorKind, TaskMessage};

/// Takes one delivery through the stages, inside a span that records the task and the
/// outcome, and counts the outcome.
pub(super) async fn process(w: &Inner, d: &Delivery) -> Outcome {
    let span = tracing::info_span!(
        "ferriq.delivery",
        queue = %d.queue,
        receive_count = d.receive_count,
        task_id = Empty,
        task_name = Empty,
        attempt = Empty,
        outcome = Empty,
    );
    let mut task = None;
    // The span is held once, by the future it instruments (a clone beside it was 40 more
    // bytes in every delivery's future), and read back from it at the end.
    let (outcome, span) = {
        let staged = stages(w, d, &mut task).instrument(span);
        tokio::pin!(staged);
        let outcome = staged.as_mut().await;
        (outcome, staged.span().clone())
    };
    span.record("outcome", outcome.as_str());
    w.counters.record(outcome, task);
    tracing::debug!(parent: &span, outcome = outcome.as_str(), "delivery settled");
    outcome
}

/// The stages in order; `served` is set to the task's name once it is known to be one this
/// worker serves (the metrics' task label). Rare paths are boxed (`Box::pin`): a future is as
/// large as its largest state, and this one is moved into its task on every delivery.
async fn stages(w: &Inner, d: &Delivery, served: &mut Option<&'static str>) -> Outcome {
    let config = &w.config;
    let mut msg = match decode::decode(d, config.max_payload, config.max_unroutable_receives) {
        Ok(msg) => msg,
        // Moved whole into a boxed future: nothing of it stays in this one's state.
        Err(not_runnable) => return Box::pin(not_run(w, d, not_runnable)).await,
    };
    {
        // Dropped at once: a span held to the end would sit in the future's state.
        let span = tracing::Span::current();
        span.record("task_id", msg.task_id.as_str());
        span.record("task_name", msg.task_name.as_str());
    }

    if let Some(outcome) = due::wait_until_due(w, d, &msg).await {
        return outcome;
    }
    if let Some(outcome) = due::debounced(w, d, &msg).await {
        return outcome;
    }

    let Some(task) = w.registry.get(&msg.task_name) else {
        return Box::pin(route::unknown_task(w, d, &msg)).await;
    };
    *served = Some(task.name);

    if let Some(kept) = w.pending.take(&msg.task_id) {
        if let Some(outcome) = Box::pin(pending::write_kept(w, d, &msg, kept)).await {
            return outcome;
        }
    }

    // Over its rate limit, or every slot taken: its turn comes later. Decided before the
    // claim (with it, where the store answers both at once), so no attempt is spent and no
    // claim taken while it waits.
    // Asked as a yes or no first, without building the limiters: held in a local (or a
    // match's scrutinee) they would sit in the future's state through the run, beside it.
    if limits::may_be_limited(w, task, &msg) {
        let rate = limits::rate_limiter(w, task, &msg);
        let slots = limits::concurrency_limiter(w, task, &msg);
        return Box::pin(limited(w, d, &mut msg, task, rate, slots)).await;
    }
    claim::claim_and_run(w, d, &mut msg, task, None).await
}

/// A body that cannot run here: parked with an error result for its task, parked, or
/// released for a newer worker.
async fn not_run(w: &Inner, d: &Delivery, not_runnable: NotRunnable) -> Outcome {
    match not_runnable {
        NotRunnable::Unrunnable {
            id,
            reason,
            detail,
            task_name,
        } => {
            write::reject_with_result(
                w,
                d,
                id,
                reason,
                ErrorKind::InvalidMessage,
                detail,
                task_name,
            )
            .await
        }
        NotRunnable::Newer {
            park: Some(why), ..
        } => settle::dead_letter(w, d, &why).await,
        NotRunnable::Newer { detail, park: None } => {
            tracing::warn!(%detail, "releasing for a newer worker");
            settle::release(w, d, w.config.unsupported_release, Outcome::Released).await
        }
    }
}

/// A task under a rate limit, a concurrency limit or both: its turn, its slot, then its run.
/// The slot is the task's and belongs to the run holding its claim (see `SlotHolder`): freed
/// with the result's write or the failed attempt's record, or once the delivery is settled
/// when the task is over for good.
async fn limited(
    w: &Inner,
    d: &Delivery,
    msg: &mut TaskMessage,
    task: &'static TaskRegistration,
    rate: Option<(Limiter, Rate)>,
    slots: Option<(Limiter, u32)>,
) -> Outcome {
    let Some((limiter, limit)) = slots else {
        let Some((limiter, rate)) = rate else {
            return claim::claim_and_run(w, d, msg, task, None).await;
        };
        return match limits::claim_in_turn(w, d, msg, &limiter, rate).await {
            Ok(claim) => claim::claim_and_run(w, d, msg, task, Some(claim)).await,
            Err(outcome) => outcome,
        };
    };
    if let Some((limiter, rate)) = rate {
        if let Some(outcome) = limits::wait_for_turn(w, d, msg, &limiter, rate).await {
            return outcome;
        }
    }
    let (claimed, holder) = match slots::claim_with_slot(w, d, msg, &limiter, limit).await {
        Ok(claimed) => claimed,
        Err(outcome) => return outcome,
    };
    let id = msg.task_id.clone();
    match holder {
        SlotHolder::This(token) => {
            let slot = slots::RunSlot::hold(w, &id, &limiter, token);
            let outcome = claim::claim_and_run(w, d, msg, task, Some(claimed)).await;
            slot.after_run(outcome).await;
            outcome
        }
        // The slot is the running copy's (or a revoked run's that has not stopped yet).
        SlotHolder::Other => claim::claim_and_run(w, d, msg, task, Some(claimed)).await,
        SlotHolder::Nobody => {
            let outcome = claim::claim_and_run(w, d, msg, task, Some(claimed)).await;
            slots::free_untimed(w, &limiter, &id).await;
            outcome
        }
    }
}
