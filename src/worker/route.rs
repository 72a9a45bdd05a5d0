//! Route: a message whose task this worker does not serve. Another lane may serve it, so it
//! goes back; after enough receives it is parked with an `UnknownTask` result — unless the
//! task ran somewhere before, which shows a worker that serves it exists.

use super::running::Outcome;
use super::settle::{self, Settle};
use super::{claim, workflow, write, Inner};
use crate::broker::{DeadLetter, DeadLetterReason, Delivery};
use crate::store::ClaimOutcome;
use crate::wire::{ErrorKind, TaskMessage, TaskResult};

/// A task name this worker does not serve: another lane may; after enough receives it is
/// parked with an `UnknownTask` result, unless some worker has run it before (then a lane
/// that serves it exists, and the message goes back to it, up to a higher bound).
pub(super) async fn unknown_task(w: &Inner, d: &Delivery, msg: &TaskMessage) -> Outcome {
    let config = &w.config;
    if d.receive_count < config.max_unroutable_receives {
        // Loud once per message (its first receive here): a task name nobody on this queue
        // serves is a deployment mistake, and the debug line alone left it silent.
        if d.receive_count <= 1 {
            tracing::warn!(
                task_name = %msg.task_name,
                task_id = %msg.task_id,
                queue = %d.queue,
                "this worker does not serve the task: handing it back ({} receives before \
                 it is parked); every worker on a queue must serve every task sent to it",
                config.max_unroutable_receives
            );
        } else {
            tracing::debug!("task not served here: releasing for another lane");
        }
        return settle::release(w, d, config.unknown_task_release, Outcome::Released).await;
    }
    let detail = format!("no worker serves task {:?}", msg.task_name);
    let last_chance = d.receive_count >= config.max_unroutable_receives.saturating_mul(4);
    match w
        .store
        .claim(&msg.task_id, &config.worker_id, config.lease, None)
        .await
    {
        Ok(ClaimOutcome::Run { token, starts, .. }) if starts > 0 && !last_chance => {
            // Served elsewhere (it ran before): hand it back.
            claim::give_back(w, &msg.task_id, token).await;
            settle::release(w, d, config.unknown_task_release, Outcome::Released).await
        }
        Ok(ClaimOutcome::Run { token, .. } | ClaimOutcome::Expired { token }) => {
            tracing::warn!(
                task_name = %msg.task_name,
                task_id = %msg.task_id,
                queue = %d.queue,
                "no worker served the task: parked with an UnknownTask result"
            );
            let result = TaskResult::failure(
                ErrorKind::UnknownTask,
                detail.clone(),
                false,
                0,
                0.0,
                msg.labels.clone(),
            );
            let why = DeadLetter::new(
                DeadLetterReason::UnknownTask,
                detail,
                Some(msg.task_name.to_string()),
                0,
            );
            write::finish(
                w,
                d,
                msg,
                token,
                Some(result),
                Settle::DeadLetter(why),
                Outcome::DeadLettered,
            )
            .await
        }
        Ok(ClaimOutcome::Done) => write::duplicate_of_finished(w, d, msg).await,
        Ok(ClaimOutcome::Revoked) => workflow::revoked(w, d, msg).await,
        Ok(ClaimOutcome::Defer { retry_after }) => {
            settle::release(w, d, retry_after, Outcome::Deferred).await
        }
        Err(e) => {
            tracing::warn!(error = %e, "claim store unreachable: releasing the message");
            settle::release(w, d, config.store_retry_after, Outcome::Released).await
        }
    }
}
