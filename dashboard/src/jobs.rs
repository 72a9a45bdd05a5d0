//! Bulk actions (a redrive or purge of every dead letter a filter matches) run in the
//! background while the page shows their progress. Each job is recorded in the store (every
//! second while it runs, and when it ends), so a restarted dashboard — or another replica —
//! still lists it. A job whose dashboard stopped mid-way shows as interrupted: what it did
//! is done in the broker (each dead letter redriven once: the redrive resets its task once,
//! and running it again skips none and repeats none), and the rest stay parked for the next.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ferriq::Client;
use serde::{Deserialize, Serialize};

/// How long the store keeps job records after the last one.
const KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A running job's record older than this belongs to a dashboard that stopped.
const STALE_MS: u64 = 10_000;

/// One bulk action.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Job {
    /// Its id.
    pub(crate) id: String,
    /// `redrive` or `purge`.
    pub(crate) kind: String,
    /// The lane.
    pub(crate) lane: String,
    /// Dead letters looked at so far.
    pub(crate) seen: u64,
    /// Redriven or purged so far.
    pub(crate) done: u64,
    /// It ended (or its dashboard stopped: see `outcome`).
    pub(crate) finished: bool,
    /// How it ended: its report, or why it stopped.
    pub(crate) outcome: Option<String>,
    /// When it started and was last recorded (unix ms).
    pub(crate) started_ms: u64,
    pub(crate) updated_ms: u64,
}

/// This process's jobs (what the store has of others is read when listed).
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    mine: Mutex<HashMap<String, Job>>,
}

impl Jobs {
    /// Registers a job; its id.
    pub(crate) fn start(&self, kind: &str, lane: &str, now_ms: u64) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let job = Job {
            id: id.clone(),
            kind: kind.to_owned(),
            lane: lane.to_owned(),
            seen: 0,
            done: 0,
            finished: false,
            outcome: None,
            started_ms: now_ms,
            updated_ms: now_ms,
        };
        self.lock().insert(id.clone(), job);
        id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Job>> {
        self.mine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes job `id`.
    pub(crate) fn update(&self, id: &str, change: impl FnOnce(&mut Job)) {
        if let Some(job) = self.lock().get_mut(id) {
            change(job);
        }
    }

    /// Records job `id` in the store as it stands (a failure only delays the record).
    pub(crate) async fn record(&self, client: &Client, id: &str) {
        let job = {
            let mut mine = self.lock();
            let Some(job) = mine.get_mut(id) else {
                return;
            };
            job.updated_ms = client.clock().now_unix_ms();
            job.clone()
        };
        let Ok(json) = serde_json::to_string(&job) else {
            return;
        };
        if let Err(e) = client.store().record_job(id, &json, KEPT).await {
            tracing::debug!(error = %e, "dashboard job not recorded");
        }
        if job.finished {
            // Recorded for good: the store's copy is the one listed from now on.
            self.lock().remove(id);
        }
    }

    /// Records job `id` every second until it ends, and once when it has.
    pub(crate) async fn keep_recorded(&self, client: &Client, id: &str) {
        loop {
            let finished = self.lock().get(id).is_none_or(|j| j.finished);
            self.record(client, id).await;
            if finished {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The newest 20 jobs: this process's as they stand, the store's for the rest (a running
    /// one not recorded for a while is shown as interrupted).
    pub(crate) async fn list(&self, client: &Client) -> Vec<Job> {
        let now = client.clock().now_unix_ms();
        let mut all: HashMap<String, Job> = HashMap::new();
        match client.store().jobs().await {
            Ok(recorded) => {
                for json in recorded {
                    if let Ok(job) = serde_json::from_str::<Job>(&json) {
                        all.insert(job.id.clone(), job);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "dashboard jobs not read"),
        }
        let mine = self.lock().clone();
        for job in all.values_mut() {
            if !job.finished
                && !mine.contains_key(&job.id)
                && now.saturating_sub(job.updated_ms) > STALE_MS
            {
                job.finished = true;
                job.outcome = Some(
                    "interrupted: its dashboard stopped; what it did stays done (each dead \
                     letter redriven once) — run it again to go on"
                        .into(),
                );
            }
        }
        all.extend(mine);
        let mut jobs: Vec<Job> = all.into_values().collect();
        jobs.sort_by_key(|j| j.started_ms);
        let excess = jobs.len().saturating_sub(20);
        jobs.drain(..excess);
        jobs
    }
}
