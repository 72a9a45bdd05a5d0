//! What happens once a workflow member's or step's outcome is stored: count the member and act
//! on the group's completion (send the chord callback, or its error, and the group's summary),
//! or send the chain's next step (or stop the chain with the failure). Run by the worker that
//! stored the outcome — and again by whichever worker gets a redelivered copy, so every step
//! here is idempotent: members are counted once, the callback and next steps have derived ids,
//! and results outside runs are written once.

use serde_json::Value;
use thiserror::Error;

use super::{callback_id, member_id, step_id, GroupSummary};
use crate::broker::{Broker, BrokerError, OutgoingMessage};
use crate::clock::Clock;
use crate::store::{ChordPolicy, GroupState, ResultStatus, Store, StoreError};
use crate::wire::{ErrorKind, TaskId, TaskMessage, TaskResult, WireError};

/// Why a workflow could not be advanced now (the message is released, and its redelivery
/// advances it).
#[derive(Debug, Error)]
pub(crate) enum AdvanceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("a stored workflow message is unreadable: {0}")]
    Wire(#[from] WireError),
}

/// The worker's view of a stored outcome: `None` when the task stores no result (a success).
pub(crate) async fn after_outcome(
    store: &dyn Store,
    broker: &dyn Broker,
    clock: &Clock,
    msg: &TaskMessage,
    outcome: Option<&TaskResult>,
) -> Result<(), AdvanceError> {
    let failed = outcome.is_some_and(|r| r.is_err);
    if let Some((group, index)) = msg.labels.group_member() {
        let mark = store.count_member(&group, index, failed).await?;
        if mark.complete() && !mark.settled {
            if let Some(state) = store.group(&group).await? {
                complete_group(store, broker, clock, &state).await?;
            }
        }
    }
    if let Some((chain, index)) = msg.labels.chain_step() {
        advance_chain(store, broker, clock, &chain, index, outcome).await?;
    }
    Ok(())
}

/// Acts on a complete group: sends the chord's callback (or stores its error), stores the
/// group's summary, and marks the group settled. Safe to repeat.
pub(crate) async fn complete_group(
    store: &dyn Store,
    broker: &dyn Broker,
    clock: &Clock,
    state: &GroupState,
) -> Result<(), AdvanceError> {
    let record = &state.record;
    if let Some(callback) = &record.callback {
        let failed = state.mark.failed > 0;
        if failed && record.policy == ChordPolicy::AllSucceeded {
            let why = first_failure(store, &record.id, record.size).await?;
            let result = TaskResult::failure(
                ErrorKind::TaskError,
                format!(
                    "the chord's callback did not run: {} of {} members failed; {why}",
                    state.mark.failed, record.size
                ),
                false,
                0,
                0.0,
                Default::default(),
            );
            store
                .store_result_once(&callback_id(&record.id), &result)
                .await?;
        } else {
            let body =
                serde_json::to_vec(callback).map_err(|e| WireError::NotJson(e.to_string()))?;
            let message = TaskMessage::from_json(&body)?;
            let out = OutgoingMessage::from_message_at(&message, clock.now_unix())?;
            broker.publish(vec![out]).await?;
        }
    }
    let summary = GroupSummary::new(record.size, state.mark.failed);
    let value = serde_json::to_value(summary).map_err(|e| WireError::NotJson(e.to_string()))?;
    store
        .store_result_once(
            &record.id,
            &TaskResult::success(value, 0.0, Default::default()),
        )
        .await?;
    store.settle_group(&record.id).await?;
    Ok(())
}

/// Which member failed first, for the chord's error.
async fn first_failure(store: &dyn Store, group: &TaskId, size: u32) -> Result<String, StoreError> {
    let ids: Vec<TaskId> = (0..size).map(|i| member_id(group, i)).collect();
    for (i, chunk) in ids.chunks(1000).enumerate() {
        let stored = store.get_many(chunk).await?;
        for (j, status) in stored.into_iter().enumerate() {
            if let ResultStatus::Ready(r) = status {
                if let Some(f) = r.failure_details() {
                    return Ok(format!("member {} failed first: {f}", i * 1000 + j));
                }
            }
        }
    }
    Ok("a member was revoked".to_owned())
}

async fn advance_chain(
    store: &dyn Store,
    broker: &dyn Broker,
    clock: &Clock,
    chain: &TaskId,
    index: u32,
    outcome: Option<&TaskResult>,
) -> Result<(), AdvanceError> {
    let Some(record) = store.chain(chain).await? else {
        tracing::warn!(%chain, "chain record missing (expired?): the chain stops here");
        return Ok(());
    };
    let last = record.steps.len().saturating_sub(1) as u32;
    if index >= last {
        return Ok(());
    }
    match outcome.and_then(TaskResult::failure_details) {
        Some(f) => {
            // The chain's result is its last step's: the failure stops it there.
            let result = TaskResult::failure(
                f.kind.unwrap_or(ErrorKind::TaskError),
                format!("chain step {index} failed: {}", f.message),
                false,
                f.attempts,
                0.0,
                Default::default(),
            );
            store
                .store_result_once(&step_id(chain, last), &result)
                .await?;
        }
        None => {
            let previous = outcome.map_or(Value::Null, |r| r.return_value.clone());
            let next = &record.steps[(index + 1) as usize];
            let body = serde_json::to_vec(next).map_err(|e| WireError::NotJson(e.to_string()))?;
            let mut message = TaskMessage::from_json(&body)?;
            message.args.insert(0, previous);
            let out = OutgoingMessage::from_message_at(&message, clock.now_unix())?;
            broker.publish(vec![out]).await?;
        }
    }
    Ok(())
}
