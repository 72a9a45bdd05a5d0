//! What stores keep for operators: workers and the runs they hold (each entry expiring when its
//! worker stops reporting), and the reset that gives a dead-lettered task a fresh start.

use std::borrow::Cow;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{DeadEntry, DeadPage, StoreError};
use crate::dead_letters::DeadFilter;
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

/// Upper bounds (seconds) of the run-time buckets history keeps (a last bucket is +Inf): the
/// same as the `/metrics` run-duration histogram.
pub const HISTORY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// How long the store keeps a minute of history (a day, and an hour to read it whole).
pub const HISTORY_KEPT: Duration = Duration::from_secs(25 * 3600);

/// How one task's runs ended within one minute, summed over every worker: what the
/// dashboard's charts read. Workers add theirs every few seconds ([`OpsStore::add_history`]).
///
/// ```
/// let m = ferriq::store::MinuteStats::new(29_000_000, "reports.render");
/// assert_eq!(m.durations.len(), ferriq::store::HISTORY_BUCKETS.len() + 1);
/// assert_eq!(m.runs(), 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MinuteStats {
    /// The minute: unix seconds ÷ 60.
    pub minute: u64,
    /// The task's name.
    pub task: String,
    /// Results written as successes.
    pub succeeded: u64,
    /// Results written as errors.
    pub failed: u64,
    /// Runs per run-time bucket of [`HISTORY_BUCKETS`] (not cumulative; +Inf last).
    pub durations: Vec<u64>,
}

impl MinuteStats {
    /// Nothing yet, for `task` in `minute`.
    pub fn new(minute: u64, task: impl Into<String>) -> Self {
        MinuteStats {
            minute,
            task: task.into(),
            succeeded: 0,
            failed: 0,
            durations: vec![0; HISTORY_BUCKETS.len() + 1],
        }
    }

    /// Runs timed (each ends in one bucket).
    pub fn runs(&self) -> u64 {
        self.durations.iter().sum()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &MinuteStats) {
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        for (a, b) in self.durations.iter_mut().zip(&other.durations) {
            *a += b;
        }
    }

    /// The run time under which `q` (0–1) of the runs ended, as its bucket's upper bound
    /// (seconds); `None` without runs, `f64::INFINITY` past the last bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.runs();
        if total == 0 {
            return None;
        }
        let wanted = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.durations.iter().enumerate() {
            seen += n;
            if seen >= wanted {
                return Some(HISTORY_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY));
            }
        }
        Some(f64::INFINITY)
    }
}

/// A task whose result was written, as the finished-task index keeps it (with the history, for
/// [`HISTORY_KEPT`]): what the dashboard's task search reads.
///
/// ```
/// let f = ferriq::store::FinishedTask::new(ferriq::wire::TaskId::random(), "reports.render", true, 1_700_000_000_000);
/// assert!(f.failed);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FinishedTask {
    /// The task.
    pub task_id: TaskId,
    /// Its name (a registered task's own, not a copy).
    pub task: Cow<'static, str>,
    /// Its result is an error.
    pub failed: bool,
    /// When the result was written (unix ms).
    pub at_ms: u64,
}

impl FinishedTask {
    /// One finished task.
    pub fn new(
        task_id: TaskId,
        task: impl Into<Cow<'static, str>>,
        failed: bool,
        at_ms: u64,
    ) -> Self {
        FinishedTask {
            task_id,
            task: task.into(),
            failed,
            at_ms,
        }
    }
}

/// Workers, resets and history. Object-safe.
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
    /// Adds workers' counts to the minutes they name (kept [`HISTORY_KEPT`]); a minute and
    /// task seen twice adds up.
    async fn add_history(&self, stats: &[MinuteStats]) -> Result<(), StoreError>;
    /// The minutes `from..=to` (unix minutes), one entry per minute and task with any count,
    /// in minute order.
    async fn history(&self, from: u64, to: u64) -> Result<Vec<MinuteStats>, StoreError>;
    /// Records an operator's job under `id` (its JSON, e.g. a dashboard's bulk redrive and
    /// its progress), replacing the last record of it; kept `ttl` after the last record.
    async fn record_job(&self, id: &str, json: &str, ttl: Duration) -> Result<(), StoreError>;
    /// Every job recorded and not expired, as recorded.
    async fn jobs(&self) -> Result<Vec<String>, StoreError>;
    /// Adds finished tasks to the index (kept [`HISTORY_KEPT`]).
    async fn add_finished(&self, finished: &[FinishedTask]) -> Result<(), StoreError>;
    /// Finished tasks named `task` (only failed ones, only successes, or both for `None`)
    /// whose results were written within `from_ms..=to_ms`: newest first, at most `limit`.
    async fn finished(
        &self,
        task: &str,
        failed: Option<bool>,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<FinishedTask>, StoreError>;

    /// Adds dead letters to the index ([`DeadEntry`]), each replacing an entry of the same
    /// key in its lane. A store without an index ignores them (the default).
    async fn index_dead(&self, entries: &[DeadEntry]) -> Result<(), StoreError> {
        let _ = entries;
        Ok(())
    }
    /// Removes the entries `keys` of `lane` from the index (a key not there is skipped).
    async fn unindex_dead(&self, lane: &str, keys: &[String]) -> Result<(), StoreError> {
        let _ = (lane, keys);
        Ok(())
    }
    /// Removes every entry of `lane` from the index (before it is rebuilt from the queue).
    async fn clear_dead_index(&self, lane: &str) -> Result<(), StoreError> {
        let _ = lane;
        Ok(())
    }
    /// The entries of `lane` matching `filter` at `now_ms`, newest first: `limit` from
    /// `offset`, with how many match in all. `None` when this store keeps no index (the
    /// default): callers then read the broker's queue.
    async fn dead_index(
        &self,
        lane: &str,
        filter: &DeadFilter,
        now_ms: u64,
        offset: usize,
        limit: usize,
    ) -> Result<Option<DeadPage>, StoreError> {
        let _ = (lane, filter, now_ms, offset, limit);
        Ok(None)
    }
}
