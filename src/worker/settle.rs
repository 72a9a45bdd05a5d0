//! Settle: telling the broker what became of a message — acked (done with), released (back
//! to its queue after a while), or parked in its dead-letter queue (then indexed in the store
//! and told to the middleware). "Settle" means this and nothing else in the worker. A broker
//! call that fails loses nothing: an unsettled message comes back by itself.

use std::time::Duration;

use super::running::Outcome;
use super::Inner;
use crate::broker::{BrokerError, DeadLetter, Delivery};
use crate::store::DeadEntry;
use crate::wire::TaskMessage;

/// What to do with the message once its outcome is stored.
#[derive(Debug, Clone)]
pub(super) enum Settle {
    /// Done with: acked.
    Ack,
    /// Parked, with why.
    DeadLetter(DeadLetter),
}

/// Settles the message as `settle` says; `outcome` is what the delivery counts as when the
/// broker took it.
pub(super) async fn settle(w: &Inner, d: &Delivery, settle: &Settle, outcome: Outcome) -> Outcome {
    match settle {
        Settle::Ack => ack(w, d, outcome).await,
        // Boxed: parking is rare, and its future is ten times the ack's; unboxed, every
        // delivery's future would carry its size (and copy it at every move).
        Settle::DeadLetter(why) => match Box::pin(park(w, d, why)).await {
            Ok(()) => outcome,
            Err(e) => broker_failed("dead-letter", e),
        },
    }
}

pub(super) async fn ack(w: &Inner, d: &Delivery, outcome: Outcome) -> Outcome {
    match w.broker.ack(&d.handle).await {
        Ok(()) => outcome,
        Err(e) => broker_failed("ack", e),
    }
}

/// Gives the message back after `after`, never sooner than `min_defer`: every receive
/// costs (SQS counts it toward the redrive limit), so nothing is released for 0 s except a
/// drain's hand-back.
pub(super) async fn release(w: &Inner, d: &Delivery, after: Duration, outcome: Outcome) -> Outcome {
    release_after(w, d, after.max(w.config.min_defer), outcome).await
}

/// Gives the message back visible at once (a drain's leftovers, for another worker).
pub(super) async fn release_now(w: &Inner, d: &Delivery, outcome: Outcome) -> Outcome {
    release_after(w, d, Duration::ZERO, outcome).await
}

pub(super) async fn release_after(
    w: &Inner,
    d: &Delivery,
    after: Duration,
    outcome: Outcome,
) -> Outcome {
    match w.broker.release(&d.handle, after).await {
        Ok(()) => outcome,
        Err(e) => broker_failed("release", e),
    }
}

/// Dead-letters the message, then tells the middleware.
pub(super) async fn park(
    w: &Inner,
    d: &Delivery,
    why: &DeadLetter,
) -> Result<(), crate::broker::BrokerError> {
    w.broker.dead_letter(d, why).await?;
    index_dead(w, d, why).await;
    if !w.middleware.is_empty() {
        let id = d
            .task_id
            .clone()
            .or_else(|| TaskMessage::peek_task_id(&d.body));
        let dead = crate::middleware::DeadLettered {
            task_id: id.as_ref(),
            task_name: why.task_name.as_deref(),
            lane: &d.queue,
            reason: why.reason,
            detail: &why.detail,
            attempts: why.attempts,
        };
        w.middleware.on_dead_letter(&dead).await;
    }
    Ok(())
}

/// Adds a parked message to the store's dead-letter index. Only what an operator's page
/// lists depends on it: a failure is logged, and a re-index finds the letter in its queue.
async fn index_dead(w: &Inner, d: &Delivery, why: &DeadLetter) {
    let task_id = d.task_id.clone();
    let mut entry = DeadEntry::new(&*d.queue, task_id, &d.body)
        .reason(why.reason.as_str())
        .detail(&why.detail)
        .attempts(why.attempts)
        .dead_at_ms(w.config.clock.now_unix_ms());
    if let (None, Some(name)) = (&entry.task_name, &why.task_name) {
        entry = entry.task_name(name.as_str());
    }
    if let Err(e) = w.store.index_dead(&[entry]).await {
        tracing::warn!(error = %e, lane = %d.queue,
            "could not add the dead letter to the store's index; it is parked, and a re-index lists it");
    }
}

pub(super) async fn dead_letter(w: &Inner, d: &Delivery, why: &DeadLetter) -> Outcome {
    match park(w, d, why).await {
        Ok(()) => Outcome::DeadLettered,
        Err(e) => broker_failed("dead-letter", e),
    }
}

pub(super) fn broker_failed(op: &str, e: BrokerError) -> Outcome {
    // Nothing is lost: an unsettled message comes back (its lease runs out, or its broker
    // puts it back).
    tracing::warn!(error = %e, op, "broker call failed; the message will be redelivered");
    Outcome::BrokerError
}
