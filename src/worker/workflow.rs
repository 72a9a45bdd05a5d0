//! The worker's part in workflows: once a grouped or chained message's outcome is stored, the
//! group is counted (and its completion acted on) or the chain's next step is sent — before
//! the message is settled, so a worker dying in between leaves it to its redelivery.

use std::time::Duration;

use super::running::Outcome;
use super::{settle, Inner};
use crate::broker::Delivery;
use crate::store::ResultStatus;
use crate::wire::{ErrorKind, TaskMessage, TaskResult};
use crate::workflow::advance::after_outcome;

/// Advances the message's workflow, if it is in one, after its outcome (`None`: a success
/// that stores no result) is stored. `false` when that cannot be done now: the caller
/// releases the message instead of settling it, and its redelivery advances it.
pub(super) async fn advance(w: &Inner, msg: &TaskMessage, outcome: Option<&TaskResult>) -> bool {
    if msg.labels.group_member().is_none() && msg.labels.chain_step().is_none() {
        return true;
    }
    // Boxed: most tasks are in no workflow, and every delivery's future would otherwise
    // carry this one's size.
    match Box::pin(after_outcome(
        w.store.as_ref(),
        w.broker.as_ref(),
        &w.config.clock,
        msg,
        outcome,
    ))
    .await
    {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "the workflow could not be advanced now: releasing the message to do it on its redelivery");
            false
        }
    }
}

/// A revoked task's message: its `Cancelled` result counts as its workflow's outcome, then
/// the message is acked.
pub(super) async fn revoked(w: &Inner, d: &Delivery, msg: &TaskMessage) -> Outcome {
    if msg.labels.group_member().is_some() || msg.labels.chain_step().is_some() {
        let stored = match w.store.get(&msg.task_id).await {
            Ok(ResultStatus::Ready(r)) => r,
            _ => TaskResult::failure(
                ErrorKind::Cancelled,
                "the task was revoked",
                false,
                0,
                0.0,
                Default::default(),
            ),
        };
        if !advance(w, msg, Some(&stored)).await {
            return settle::release(w, d, w.config.store_retry_after, Outcome::Released).await;
        }
    }
    tracing::info!("task revoked: acking its message");
    settle::ack(w, d, Outcome::Revoked).await
}

/// How long a message whose workflow could not be advanced waits before it is tried again.
pub(super) fn retry_after(w: &Inner) -> Duration {
    w.config.store_retry_after
}
