//! Bulk actions (a redrive or purge of every dead letter a filter matches) run in the
//! background while the page shows their progress. What a job has done is done in the
//! broker: a dashboard restarted mid-way forgets the job, not its effect — each dead letter
//! is redriven once (the redrive resets its task once, and a redrive run again skips none
//! and repeats none), and the rest stay parked for the next one.

use std::sync::Mutex;

use serde::Serialize;

/// One bulk action.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Job {
    /// Its number in this process.
    pub(crate) id: u64,
    /// `redrive` or `purge`.
    pub(crate) kind: &'static str,
    /// The lane.
    pub(crate) lane: String,
    /// Dead letters looked at so far.
    pub(crate) seen: u64,
    /// Redriven or purged so far.
    pub(crate) done: u64,
    /// It ended.
    pub(crate) finished: bool,
    /// How it ended: its report, or why it failed.
    pub(crate) outcome: Option<String>,
}

/// This process's jobs, newest last (the last 20 kept).
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    all: Mutex<Vec<Job>>,
}

impl Jobs {
    /// Registers a job; its id.
    pub(crate) fn start(&self, kind: &'static str, lane: &str) -> u64 {
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        let id = all.last().map_or(1, |j| j.id + 1);
        all.push(Job {
            id,
            kind,
            lane: lane.to_owned(),
            seen: 0,
            done: 0,
            finished: false,
            outcome: None,
        });
        let excess = all.len().saturating_sub(20);
        all.drain(..excess);
        id
    }

    /// Changes job `id`.
    pub(crate) fn update(&self, id: u64, change: impl FnOnce(&mut Job)) {
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(job) = all.iter_mut().find(|j| j.id == id) {
            change(job);
        }
    }

    /// Every job kept.
    pub(crate) fn list(&self) -> Vec<Job> {
        self.all.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
