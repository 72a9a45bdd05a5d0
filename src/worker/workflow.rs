//! The worker's part in workflows: once a grouped or chained message's outcome is stored, the
//! group is counted (and its completion acted on) or the chain's next step is sent — before
//! the message is settled, so a worker dying in between leaves it to its redelivery.

use std::time::Duration;

use super::running::Outcome;
use super::Inner;
use crate::broker::Delivery;
use crate::store::ResultStatus;
use crate::wire::{ErrorKind, TaskMessage, TaskResult};
use crate::workflow::advance::after_outcome;

impl Inner {
    /// Advances the message's workflow, if it is in one, after its outcome (`None`: a success
    /// that stores no result) is stored. `false` when that cannot be done now: the caller
    /// releases the message instead of settling it, and its redelivery advances it.
    pub(crate) async fn advance_workflow(
        &self,
        msg: &TaskMessage,
        outcome: Option<&TaskResult>,
    ) -> bool {
        if msg.labels.group_member().is_none() && msg.labels.chain_step().is_none() {
            return true;
        }
        // Boxed: most tasks are in no workflow, and every delivery's future would otherwise
        // carry this one's size.
        match Box::pin(after_outcome(
            self.store.as_ref(),
            self.broker.as_ref(),
            &self.config.clock,
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
    pub(crate) async fn revoked(&self, d: &Delivery, msg: &TaskMessage) -> Outcome {
        if msg.labels.group_member().is_some() || msg.labels.chain_step().is_some() {
            let stored = match self.store.get(&msg.task_id).await {
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
            if !self.advance_workflow(msg, Some(&stored)).await {
                return self
                    .release(d, self.config.store_retry_after, Outcome::Released)
                    .await;
            }
        }
        tracing::info!("task revoked: acking its message");
        self.ack(d, Outcome::Revoked).await
    }

    /// How long a message whose workflow could not be advanced waits before it is tried again.
    pub(crate) fn advance_retry(&self) -> Duration {
        self.config.store_retry_after
    }
}
