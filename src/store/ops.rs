//! What stores keep for operators: workers and the runs they hold (each entry expiring when its
//! worker stops reporting), and the reset that gives a dead-lettered task a fresh start.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::wire::TaskId;

/// A run in flight, as its worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunInfo {
    /// The task.
    pub task_id: TaskId,
    /// Its name.
    pub task_name: String,
    /// When the run started (unix ms).
    pub started_at_ms: u64,
    /// Which attempt.
    pub attempt: u32,
    /// The lane its delivery came from.
    #[serde(default)]
    pub lane: String,
}

impl RunInfo {
    /// A run of a delivery from `lane`.
    pub fn new(
        task_id: TaskId,
        task_name: String,
        started_at_ms: u64,
        attempt: u32,
        lane: String,
    ) -> Self {
        RunInfo {
            task_id,
            task_name,
            started_at_ms,
            attempt,
            lane,
        }
    }
}

/// A worker as it reports itself, every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// Its id (as in claims).
    pub id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// ferriq's version.
    pub version: String,
    /// The lanes it consumes.
    pub lanes: Vec<String>,
    /// Most runs at once.
    pub concurrency: usize,
    /// When it started (unix ms).
    pub started_at_ms: u64,
    /// When it last reported (unix ms).
    pub seen_at_ms: u64,
    /// Its runs in flight.
    pub runs: Vec<RunInfo>,
}

impl WorkerInfo {
    /// A worker's report.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        host: String,
        pid: u32,
        lanes: Vec<String>,
        concurrency: usize,
        started_at_ms: u64,
        seen_at_ms: u64,
        runs: Vec<RunInfo>,
    ) -> Self {
        WorkerInfo {
            id,
            host,
            pid,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            lanes,
            concurrency,
            started_at_ms,
            seen_at_ms,
            runs,
        }
    }
}

/// What a redrive's reset did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedriveReset {
    /// The task's error result was removed and its claim given a fresh attempt budget under
    /// a new, larger token: it runs again, and no writer from before can store over it.
    Reset,
    /// This dead letter was reset before (a redrive that died midway and ran again): nothing
    /// changed, and the copy sent now is a duplicate the claims absorb.
    AlreadyReset,
    /// A run holds the task now (a live lease): not reset.
    Running,
}

/// Workers and resets. Object-safe.
#[async_trait]
pub trait OpsStore: Send + Sync + 'static {
    /// Records a worker's report; it expires after `ttl` unless reported again.
    async fn report_worker(&self, info: &WorkerInfo, ttl: Duration) -> Result<(), StoreError>;
    /// Removes a worker's report (it stopped).
    async fn forget_worker(&self, id: &str) -> Result<(), StoreError>;
    /// Every worker whose report has not expired.
    async fn workers(&self) -> Result<Vec<WorkerInfo>, StoreError>;
    /// Gives a dead-lettered task a fresh start before its copy is sent back: removes its
    /// result, and resets its claim (released, no failures, a larger token) — once per dead
    /// letter (`dead_letter_id`), however often the redrive runs.
    async fn reset_for_redrive(
        &self,
        id: &TaskId,
        dead_letter_id: &str,
    ) -> Result<RedriveReset, StoreError>;
}
