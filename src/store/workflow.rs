//! What stores keep for workflows — groups, chords, chains — and for runs in progress: the
//! records written once when a workflow is enqueued, the per-member count that decides,
//! exactly once, "this completion finished the group", progress values, and claim details.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ResultStatus, StoreError, Token};
use crate::wire::{TaskId, TaskResult};

/// What to do with a chord's callback when members failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChordPolicy {
    /// Run the callback only if every member succeeded; otherwise the callback's result is
    /// an error naming the first failed member (the default).
    #[default]
    AllSucceeded,
    /// Run the callback once every member finished, however they ended.
    Always,
}

/// A group as enqueued: its size, and the chord callback to send once every member is done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupRecord {
    /// The group's id.
    pub id: TaskId,
    /// How many members.
    pub size: u32,
    /// The chord's callback message (JSON body), when the group is a chord's.
    #[serde(default)]
    pub callback: Option<Value>,
    /// The chord's policy.
    #[serde(default)]
    pub policy: ChordPolicy,
}

impl GroupRecord {
    /// A group of `size` members, without a callback.
    pub fn new(id: TaskId, size: u32) -> Self {
        GroupRecord {
            id,
            size,
            callback: None,
            policy: ChordPolicy::default(),
        }
    }

    /// With a chord callback.
    pub fn with_callback(mut self, message: Value, policy: ChordPolicy) -> Self {
        self.callback = Some(message);
        self.policy = policy;
        self
    }
}

/// A group's count after a member was counted (or looked at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupMark {
    /// Members counted as finished.
    pub done: u32,
    /// Of those, members that failed.
    pub failed: u32,
    /// The group's size.
    pub size: u32,
    /// Whether the group's completion was already acted on (callback sent, or the group's
    /// result written).
    pub settled: bool,
}

impl GroupMark {
    /// A count: `done` of `size` members finished, `failed` of them failed.
    pub fn new(done: u32, failed: u32, size: u32, settled: bool) -> Self {
        GroupMark {
            done,
            failed,
            size,
            settled,
        }
    }

    /// Whether every member finished.
    pub fn complete(&self) -> bool {
        self.done >= self.size
    }
}

/// A group's record and count.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GroupState {
    /// The record written when the group was enqueued.
    pub record: GroupRecord,
    /// Its count.
    pub mark: GroupMark,
}

impl GroupState {
    /// A group's state.
    pub fn new(record: GroupRecord, mark: GroupMark) -> Self {
        GroupState { record, mark }
    }
}

/// A chain as enqueued: the steps after the first, each a message body whose first argument
/// the previous step's result becomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ChainRecord {
    /// The chain's id.
    pub id: TaskId,
    /// Every step's message body (JSON), the first included, in order.
    pub steps: Vec<Value>,
}

impl ChainRecord {
    /// A chain of `steps`.
    pub fn new(id: TaskId, steps: Vec<Value>) -> Self {
        ChainRecord { id, steps }
    }
}

/// A claim as the store holds it, for status pages and operators.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimInfo {
    /// What the claim says.
    pub state: ClaimState,
    /// The current fencing token.
    pub token: Token,
    /// Who holds (or last held) it.
    pub holder: String,
    /// When the current run started (unix ms), while running.
    pub started_at_ms: Option<u64>,
    /// When the holder's lease ends (unix ms), while running.
    pub lease_until_ms: Option<u64>,
    /// Failed attempts recorded.
    pub failures: u32,
    /// Runs granted.
    pub starts: u32,
    /// Runs whose holder's lease ran out before they finished.
    pub takeovers: u32,
}

impl ClaimInfo {
    /// A claim in `state` under `token`, held (or last held) by `holder`.
    pub fn new(state: ClaimState, token: Token, holder: impl Into<String>) -> Self {
        ClaimInfo {
            state,
            token,
            holder: holder.into(),
            started_at_ms: None,
            lease_until_ms: None,
            failures: 0,
            starts: 0,
            takeovers: 0,
        }
    }

    /// With the current run's start and lease end (unix ms).
    pub fn with_run(mut self, started_at_ms: Option<u64>, lease_until_ms: Option<u64>) -> Self {
        self.started_at_ms = started_at_ms;
        self.lease_until_ms = lease_until_ms;
        self
    }

    /// With its counts: failed attempts, runs granted, runs taken over.
    pub fn with_counts(mut self, failures: u32, starts: u32, takeovers: u32) -> Self {
        self.failures = failures;
        self.starts = starts;
        self.takeovers = takeovers;
        self
    }
}

/// The state of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimState {
    /// A run holds it.
    Running,
    /// Given back (between attempts, or by a drain).
    Released,
    /// Finished: its result is stored (or it stores none).
    Done,
    /// Revoked.
    Revoked,
}

/// A task's progress, in taskiq's `TaskProgress` shape (`{"state": …, "meta": …}`), so Python's
/// taskiq-redis reads it too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskProgress {
    /// taskiq's `TaskState` (`STARTED`, …) or any string.
    pub state: String,
    /// The value the task reported.
    pub meta: Value,
}

impl TaskProgress {
    /// A progress value reported by a running task.
    pub fn started(meta: Value) -> Self {
        TaskProgress {
            state: "STARTED".to_owned(),
            meta,
        }
    }
}

/// Groups, chords and chains, and results written outside a run. Object-safe.
#[async_trait]
pub trait WorkflowStore: Send + Sync + 'static {
    /// Writes a group's record; `false` when one with this id exists (the group was enqueued
    /// before: a retried enqueue).
    async fn create_group(&self, record: &GroupRecord) -> Result<bool, StoreError>;
    /// A group's record and count.
    async fn group(&self, id: &TaskId) -> Result<Option<GroupState>, StoreError>;
    /// Counts member `index` of group `id` as finished (`failed` or not): once per index,
    /// however often it is called, atomically with deciding whether the group is complete.
    async fn count_member(
        &self,
        id: &TaskId,
        index: u32,
        failed: bool,
    ) -> Result<GroupMark, StoreError>;
    /// Records that the group's completion was acted on; `true` for the first caller.
    async fn settle_group(&self, id: &TaskId) -> Result<bool, StoreError>;
    /// Writes a chain's record; `false` when one with this id exists.
    async fn create_chain(&self, record: &ChainRecord) -> Result<bool, StoreError>;
    /// A chain's record.
    async fn chain(&self, id: &TaskId) -> Result<Option<ChainRecord>, StoreError>;
    /// Writes a result outside any run (a workflow's outcome): only if none is stored, and
    /// marks the task done so it never runs; `false` when a result was there. Waiters wake.
    async fn store_result_once(&self, id: &TaskId, result: &TaskResult)
        -> Result<bool, StoreError>;
    /// Many results at once, in order.
    async fn get_many(&self, ids: &[TaskId]) -> Result<Vec<ResultStatus>, StoreError>;
}

/// Progress of runs in flight and what their claims say. Object-safe.
#[async_trait]
pub trait ProgressStore: Send + Sync + 'static {
    /// Stores a running task's progress, if `token` is still the claim's (a run taken over
    /// reports nothing); `false` when it was not.
    async fn set_progress(
        &self,
        id: &TaskId,
        token: Token,
        progress: &TaskProgress,
    ) -> Result<bool, StoreError>;
    /// A task's last reported progress.
    async fn progress(&self, id: &TaskId) -> Result<Option<TaskProgress>, StoreError>;
    /// What a task's claim says, if it has one.
    async fn claim_info(&self, id: &TaskId) -> Result<Option<ClaimInfo>, StoreError>;
}
