//! Why an enqueue or a wait did not give what was asked, and what to do about it.

use std::time::Duration;

use thiserror::Error;

use crate::broker::BrokerError;
use crate::store::StoreError;
use crate::wire::{TaskFailure, TaskId, WireError};

/// Why a task could not be enqueued. Nothing was published when this is returned, except for
/// a batch whose broker failed part-way ([`EnqueueError::Broker`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// An argument or label cannot be written as JSON.
    #[error("cannot write the message: {0}")]
    Wire(#[from] WireError),
    /// The broker did not confirm the publish; retrying with the same task ids is safe
    /// (claims and the once-only result write absorb duplicates).
    #[error("publish failed: {0}")]
    Broker(#[from] BrokerError),
    /// A workflow's record could not be written; nothing of it was published.
    #[error("the workflow's record could not be stored: {0}")]
    Store(StoreError),
    /// The message body is larger than workers accept: nothing was sent (a worker would park
    /// it unread as `too_large`).
    #[error(
        "the message of task {task_name} is {size} bytes, over the {limit}-byte limit \
         (FERRIQ_MAX_PAYLOAD_BYTES): pass large data by reference (an object store key), or \
         raise the limit on the workers and clients alike"
    )]
    TooLarge {
        /// The task's name.
        task_name: String,
        /// The body's size in bytes.
        size: usize,
        /// The limit (`FERRIQ_MAX_PAYLOAD_BYTES`, [`Client::with_max_payload`](super::Client::with_max_payload)).
        limit: usize,
    },
    /// A middleware's `before_send` refused the message; nothing of the call was published.
    #[error("middleware {middleware} refused the message: {reason}")]
    Middleware {
        /// The middleware's name.
        middleware: String,
        /// What it said.
        reason: String,
    },
}

/// Why waiting for a result did not give a value.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WaitError {
    /// No result within the timeout; the task may still run. Wait again or check `status`.
    #[error("no result within {0:?}; the task may still be queued or running")]
    TimedOut(Duration),
    /// No result within the timeout, and no worker consumes the task's queue: it waits
    /// there until one does.
    #[error(
        "no result within {waited:?}: no worker consumes queue {queue:?} (the broker reports \
         0 consumers); start a worker for it (FERRIQ_QUEUES) or send the task to a queue that \
         is served"
    )]
    NoConsumers {
        /// The queue the task waits in.
        queue: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The task finished without a stored result: its task does not store results
    /// (`store_result = false`), or the result outlived its TTL. The wait ends with this as
    /// soon as the store hears of the completion (at the latest when it times out). Waiting
    /// again will not help.
    #[error(
        "task {task_id} finished but has no stored result: its task has store_result = false, \
         or the result expired (FERRIQ_RESULT_TTL_SECS)"
    )]
    NoResult {
        /// The task.
        task_id: TaskId,
    },
    /// The task failed; its error is here.
    #[error(transparent)]
    Failed(#[from] TaskFailure),
    /// The stored value does not deserialize into the expected output type.
    #[error("the result of task {task_id} does not match the expected type: {reason}")]
    Decode {
        /// The task.
        task_id: TaskId,
        /// serde's explanation.
        reason: String,
    },
    /// The result store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
