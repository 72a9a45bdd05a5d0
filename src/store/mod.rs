//! The [`ClaimStore`] and [`ResultStore`] traits: who may run a task now, and its one result.
//!
//! Exactly-once lives in [`ResultStore::complete`]: it writes only for the current claim token
//! (fencing) and only if no result is stored yet. Claims only save duplicate work (design §5).

mod dead_index;
mod flow;
mod gate;
mod ops;
mod rate;
pub(crate) mod schedule_spec;
mod schedules;
mod workflow;

pub use crate::broker::dead_letters::dead_index_key;
pub use dead_index::{DeadEntry, DeadPage, DEAD_ARGS_KEPT, DEAD_DETAIL_KEPT};
pub use flow::{
    DebounceTurn, Debounced, FlowStore, LimitOverride, LimiterKind, LimiterSeen, LimiterUsage,
    RateDecision, SlotDecision, LIMITER_LISTED_FOR, OVERRIDES_REFRESH, TURN_GRACE, TURN_LATE,
};
pub use gate::{ClaimAsk, Gated, HeldSlot, LimitGate};
pub use ops::{
    FinishedTask, MinuteStats, OpsStore, RedriveReset, RunInfo, WorkerInfo, HISTORY_BUCKETS,
    HISTORY_KEPT,
};
pub use rate::Rate;
pub use schedules::ScheduleStore;

pub use workflow::{
    ChainRecord, ChordPolicy, ClaimInfo, ClaimState, GroupMark, GroupRecord, GroupState,
    ProgressStore, TaskProgress, WorkflowStore,
};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use thiserror::Error;

use crate::broker::Health;
use crate::wire::{TaskId, TaskResult};

/// A claim's fencing token: strictly increasing per task, across store restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub u64);

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a claim attempt decided (design §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// Run it: the claim is ours under `token`.
    Run {
        /// The fencing token for heartbeats and the result write.
        token: Token,
        /// Failed attempts recorded so far.
        failures: u32,
        /// Runs granted before this one, by any worker (0: the task never started anywhere).
        starts: u32,
        /// Runs whose holder's lease ran out before they finished (a crashed or stalled
        /// worker): the worker bounds crash loops with it.
        takeovers: u32,
        /// This claim took the task over from a holder whose lease had run out.
        took_over: bool,
    },
    /// Another worker holds a live claim; try again after `retry_after`.
    Defer {
        /// Time left on the holder's lease.
        retry_after: Duration,
    },
    /// The task is done; the delivery is a duplicate.
    Done,
    /// The deadline passed before it ran; the claim is ours under `token` to write the
    /// `DeadlineExceeded` result.
    Expired {
        /// The fencing token for the result write.
        token: Token,
    },
    /// The task was revoked (its `Cancelled` result is already stored).
    Revoked,
}

/// A claim after a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimLease {
    /// Still ours; the lease is extended.
    Kept,
    /// Another holder has it now (our lease ran out and it was taken over), or it is gone.
    Lost,
    /// The task was revoked: its `Cancelled` result is stored; stop and settle the message.
    Revoked,
}

/// After a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureRecord {
    /// Recorded and the claim released; `failures` attempts have now failed.
    Recorded {
        /// Failed attempts so far.
        failures: u32,
    },
    /// The token is no longer current: nothing was recorded.
    Stale,
}

/// What a fenced result write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompleteOutcome {
    /// Written now.
    Stored,
    /// This claim's result was already written (an earlier call whose reply was lost).
    AlreadyStored,
    /// The token is no longer current: nothing was written.
    Stale,
    /// The task was revoked while it ran: its `Cancelled` result stands; nothing was written.
    Revoked,
}

/// A result read back.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ResultStatus {
    /// No result yet.
    Pending,
    /// The stored result.
    Ready(TaskResult),
}

/// What went wrong talking to a claim or result store.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached, or the call timed out; the worker releases messages
    /// rather than run them unclaimed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored value could not be read.
    #[error("stored value for task {task_id} is unreadable: {reason}")]
    Corrupt {
        /// The task.
        task_id: String,
        /// Why.
        reason: String,
    },
    /// The store is misconfigured.
    #[error("store configuration error: {0}")]
    Config(String),
}

/// Claims: who may run a task now (design §4, §5). Object-safe.
#[async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// Tries to take the claim for `lease`. `deadline_at` (unix seconds) makes a late claim
    /// `Expired`. Taking over a running claim whose lease ran out counts one takeover.
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError>;
    /// Extends the lease of every current `(id, token)`; per entry, whether it is still held.
    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError>;
    /// Gives the claim back so another delivery may run now; `false` when the token was stale.
    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError>;
    /// Gives back the claim of a run cut off from outside the task (its broker delivery was
    /// lost: a dropped connection, RabbitMQ's `consumer_timeout`, an SQS visibility that ran
    /// out) and counts it with the takeovers, so a task whose runs keep being cut off ends
    /// after the worker's `max_takeovers` instead of starting again forever. The default only
    /// releases (a store that cannot count keeps the old, unbounded behaviour).
    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.release(id, token).await
    }
    /// Counts a failed attempt and releases the claim.
    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError>;
    /// Whether the store answers, for readiness probes (a worker that cannot claim runs
    /// nothing). The default says healthy.
    async fn health(&self) -> Health {
        Health::Healthy
    }
    /// Closes the store's connections and waits until nothing of it runs in the background,
    /// so a process ends without the warnings of connections cut mid-way. Calls on the store
    /// after it fail. Idempotent. The default has nothing to close.
    async fn close(&self) {}
}

/// Results: written once, read and awaited (design §4, §5). Object-safe.
#[async_trait]
pub trait ResultStore: Send + Sync + 'static {
    /// The fenced write: if `token` is the current claim's, stores `result` unless one is
    /// stored (`None` stores nothing, for `store_result = false`), marks the claim done and
    /// wakes waiters (on `reply_to` when given).
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError>;
    /// The stored result, if any.
    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError>;
    /// Waits up to `timeout` for the result, woken by the completion, not by polling.
    /// `Pending` when the timeout passed, or sooner when the store learned that the task
    /// finished without a stored result (its claim then says so).
    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError>;
    /// Revokes a task: stores `result` (a `Cancelled` error) unless a result exists and marks
    /// the claim revoked, so the task never starts and a running one loses its claim.
    /// `false` when a result was already stored.
    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError>;
    /// The channel this process's waiters listen on, put on messages as `reply_to`; `None` when
    /// the store wakes waiters another way.
    fn reply_channel(&self) -> Option<String> {
        None
    }
    /// [`reply_channel`](Self::reply_channel), asked for the message of task `id` as the client
    /// puts it on that message: a store may note that `id`'s completion will be announced to
    /// this process, and spare its waits any other way of hearing it.
    fn reply_channel_for(&self, id: &TaskId) -> Option<String> {
        let _ = id;
        self.reply_channel()
    }
    /// Whether the client that put `reply_to` on a message reads results where this store
    /// writes them. A store with a key prefix says `false` for another prefix's channel: that
    /// client was configured with another prefix, and finds none of the results written here
    /// (its wait may still end through the channel). The default says yes.
    fn reads_results_here(&self, reply_to: &str) -> bool {
        let _ = reply_to;
        true
    }
}

/// Everything a backend store provides: claims and results (which fencing needs answered by
/// one server), workflows, progress, schedules and what operators look at. Workers and clients hold an
/// `Arc<dyn Store>`.
pub trait Store:
    ClaimStore + ResultStore + WorkflowStore + ProgressStore + ScheduleStore + OpsStore + FlowStore
{
    /// This store as a trait object.
    fn into_dyn(self: Arc<Self>) -> Arc<dyn Store>;
    /// This store as a claim store.
    fn claims(self: Arc<Self>) -> Arc<dyn ClaimStore>;
    /// This store as a result store.
    fn results(self: Arc<Self>) -> Arc<dyn ResultStore>;
}

impl<T> Store for T
where
    T: ClaimStore
        + ResultStore
        + WorkflowStore
        + ProgressStore
        + ScheduleStore
        + OpsStore
        + FlowStore,
{
    fn into_dyn(self: Arc<Self>) -> Arc<dyn Store> {
        self
    }
    fn claims(self: Arc<Self>) -> Arc<dyn ClaimStore> {
        self
    }
    fn results(self: Arc<Self>) -> Arc<dyn ResultStore> {
        self
    }
}

impl fmt::Debug for dyn Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn Store")
    }
}
