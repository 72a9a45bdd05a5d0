//! A handle on an enqueued task: its status, and waiting for its result.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::WaitError;
use crate::broker::Broker;
use crate::store::{ClaimState, ResultStatus, Store, StoreError};
use crate::wire::{ErrorKind, TaskFailure, TaskId, TaskResult};

/// Where a task stands, as its store sees it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TaskStatus {
    /// No result yet, and no run holds it: queued, or waiting to be retried.
    Pending,
    /// A run holds it now.
    Started {
        /// The worker running it.
        worker: String,
        /// When the run started (unix ms), when the store knows.
        started_at_ms: Option<u64>,
    },
    /// Finished successfully.
    Succeeded,
    /// Finished with an error.
    Failed(TaskFailure),
    /// Not started by its deadline: it never ran (or, when an earlier attempt failed, its
    /// retry came too late). Its message is parked with reason `expired`; redriving it
    /// (`ferriq dlq redrive --reason expired`) runs it. A schedule's tick is not parked.
    Expired(TaskFailure),
    /// Finished (or revoked), but no result is stored: its task does not store results
    /// (`store_result = false`), or the result outlived its TTL.
    FinishedWithoutResult,
}

/// A handle on one enqueued task, typed by its output.
pub struct TaskHandle<T> {
    pub(super) task_id: TaskId,
    pub(super) store: Arc<dyn Store>,
    /// Where the task was sent, when this handle sent it: asked for consumers on a timeout.
    pub(super) sent_to: Option<(Arc<dyn Broker>, Option<String>)>,
    pub(super) _output: PhantomData<fn() -> T>,
}

impl<T> Clone for TaskHandle<T> {
    fn clone(&self) -> Self {
        TaskHandle {
            task_id: self.task_id.clone(),
            store: Arc::clone(&self.store),
            sent_to: self.sent_to.clone(),
            _output: PhantomData,
        }
    }
}

impl<T> fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskHandle({})", self.task_id)
    }
}

impl<T: DeserializeOwned> TaskHandle<T> {
    /// The task's id.
    pub fn task_id(&self) -> &TaskId {
        &self.task_id
    }

    /// Waits up to `timeout` for the result (woken by the completion, not by polling). On a
    /// timeout of a task this handle sent, the broker is asked whether anyone consumes its
    /// queue ([`WaitError::NoConsumers`] when nobody does). A task that finished without
    /// storing a result ends the wait as soon as the store hears of it, with
    /// [`WaitError::NoResult`].
    pub async fn wait(&self, timeout: Duration) -> Result<T, WaitError> {
        match self.store.wait(&self.task_id, timeout).await? {
            ResultStatus::Ready(result) => self.decode(result),
            // Boxed: the timed-out path's future (a broker call under a timer) would make
            // every wait's future several times larger, and an app awaiting thousands of
            // handles at once moves each of those futures a few times.
            _ => Box::pin(self.timed_out(timeout)).await,
        }
    }

    async fn timed_out(&self, waited: Duration) -> Result<T, WaitError> {
        // A finished task whose result is not stored never gives one: say so rather than
        // "may still be running" (a store error here leaves the plain timeout). Read again
        // first: the result may have been stored since the wait's last read.
        if let Ok(Some(c)) = self.store.claim_info(&self.task_id).await {
            if finished(c.state) {
                return match self.store.get(&self.task_id).await? {
                    ResultStatus::Ready(result) => self.decode(result),
                    _ => Err(WaitError::NoResult {
                        task_id: self.task_id.clone(),
                    }),
                };
            }
        }
        let Some((broker, queue)) = &self.sent_to else {
            return Err(WaitError::TimedOut(waited));
        };
        let asked = tokio::time::timeout(
            Duration::from_secs(2),
            broker.consumer_count(queue.as_deref()),
        );
        Err(match asked.await {
            Ok(Some((queue, 0))) => WaitError::NoConsumers { queue, waited },
            _ => WaitError::TimedOut(waited),
        })
    }

    /// The status now, without waiting: finished (with or without a stored result), started
    /// (with the worker and start time) or pending.
    pub async fn status(&self) -> Result<TaskStatus, StoreError> {
        if let ResultStatus::Ready(r) = self.store.get(&self.task_id).await? {
            return Ok(finished_with(&r));
        }
        Ok(match self.store.claim_info(&self.task_id).await? {
            Some(c) if c.state == ClaimState::Running => TaskStatus::Started {
                worker: c.holder,
                started_at_ms: c.started_at_ms,
            },
            // Read again: the result may have been stored between the two reads.
            Some(c) if finished(c.state) => match self.store.get(&self.task_id).await? {
                ResultStatus::Ready(r) => finished_with(&r),
                _ => TaskStatus::FinishedWithoutResult,
            },
            _ => TaskStatus::Pending,
        })
    }

    /// The progress the running task last reported
    /// ([`TaskContext::set_progress`](crate::TaskContext::set_progress)), if any.
    pub async fn progress(&self) -> Result<Option<Value>, StoreError> {
        Ok(self.store.progress(&self.task_id).await?.map(|p| p.meta))
    }

    /// The stored result now, if any.
    pub async fn try_result(&self) -> Result<Option<T>, WaitError> {
        match self.store.get(&self.task_id).await? {
            ResultStatus::Ready(r) => self.decode(r).map(Some),
            _ => Ok(None),
        }
    }

    fn decode(&self, result: TaskResult) -> Result<T, WaitError> {
        if let Some(failure) = result.failure_details() {
            return Err(WaitError::Failed(failure));
        }
        serde_json::from_value(result.return_value).map_err(|e| WaitError::Decode {
            task_id: self.task_id.clone(),
            reason: e.to_string(),
        })
    }
}

/// A claim that says its task will not run again (done, or revoked).
fn finished(state: ClaimState) -> bool {
    matches!(state, ClaimState::Done | ClaimState::Revoked)
}

/// The status a stored result gives.
fn finished_with(result: &TaskResult) -> TaskStatus {
    match result.failure_details() {
        Some(f) if f.kind == Some(ErrorKind::DeadlineExceeded) => TaskStatus::Expired(f),
        Some(f) => TaskStatus::Failed(f),
        None => TaskStatus::Succeeded,
    }
}
