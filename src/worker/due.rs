//! Due: when a message may run. One not due yet is handed back until shortly before its time
//! and held here for the rest; a debounced one waits until its key has been quiet for its
//! window. Nothing is claimed and no attempt is spent while it waits.

use std::time::Duration;

use super::limits::MAX_HOLDS;
use super::running::Outcome;
use super::settle;
use super::Inner;
use crate::broker::{Delivery, HOLD_WINDOW};
use crate::store::Debounced;
use crate::wire::{TaskMessage, MAX_DELAY};

/// A message that is not due yet is released for the whole seconds left (`None` when it
/// is due now), and held here for the last fraction of a second: brokers time releases in
/// whole seconds (SQS) or coarse tiers (RabbitMQ), and may hand a message back early but
/// never late, so it runs on time to the millisecond. Nothing is claimed and no attempt is
/// spent while it waits.
pub(super) async fn wait_until_due(w: &Inner, d: &Delivery, msg: &TaskMessage) -> Option<Outcome> {
    let due = match (msg.labels.due_at(), d.not_before) {
        (Some(a), Some(b)) => a.max(b),
        (a, b) => a.or(b)?,
    };
    let wait = w.config.clock.until(due).min(MAX_DELAY);
    if wait.is_zero() {
        return None;
    }
    if wait < crate::broker::HOLD_WINDOW {
        tokio::time::sleep(wait).await;
        return None;
    }
    tracing::debug!(due_in = ?wait, "not due yet: released until due");
    let whole_seconds = Duration::from_secs(wait.as_secs());
    // Not floored at `min_defer`: at least a second, and it must not come back late.
    Some(settle::release_after(w, d, whole_seconds, Outcome::NotDue).await)
}

/// A debounced message (`ferriq_dedup_mode` `debounce`) runs once its key has been quiet
/// for its window: the latest enqueue's copy runs (with its own arguments, the latest),
/// handed back while the key is enqueued again (like a task not due yet); an earlier copy
/// is acked unrun. `None`: it runs now (or is not debounced); else what became of it.
pub(super) async fn debounced(w: &Inner, d: &Delivery, msg: &TaskMessage) -> Option<Outcome> {
    use crate::wire::names;
    let debounce = msg
        .labels
        .get(names::DEDUP_MODE)
        .is_some_and(|m| m.header_value() == crate::task::Dedup::Debounce.as_str());
    let key = match msg.labels.get(names::DEDUP_KEY) {
        Some(key) if debounce => key.header_value().into_owned(),
        _ => return None,
    };
    let seq = msg
        .labels
        .get(names::DEBOUNCE_SEQ)
        .and_then(|s| s.as_i64())
        .map_or(1, |s| s.max(1) as u64);
    for _ in 0..MAX_HOLDS {
        match w.store.take_debounced(&key, &msg.task_id, seq).await {
            Ok(Debounced::Wait(wait)) if wait < HOLD_WINDOW => {
                tokio::time::sleep(wait).await;
            }
            Ok(Debounced::Wait(wait)) => {
                tracing::debug!(quiet_in = ?wait, "debounced: enqueued again, released until its key is quiet");
                let whole_seconds = Duration::from_secs(wait.as_secs());
                return Some(settle::release_after(w, d, whole_seconds, Outcome::NotDue).await);
            }
            Ok(Debounced::Run) => return None,
            Ok(Debounced::Superseded) => {
                tracing::debug!("debounced: a later enqueue's copy replaced this one");
                return Some(settle::ack(w, d, Outcome::Superseded).await);
            }
            Err(e) => {
                tracing::warn!(error = %e, "debounce state unreachable: releasing the message");
                return Some(
                    settle::release(w, d, w.config.store_retry_after, Outcome::Released).await,
                );
            }
        }
    }
    // Enqueued again and again while held: back to the broker, as a task not due.
    Some(settle::release_after(w, d, HOLD_WINDOW, Outcome::NotDue).await)
}
