//! What a worker counts: delivery outcomes and run durations, in total and per task (the task
//! label is bounded by the registry: names it does not serve count as `_other`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::running::Outcome;
use crate::registry::Registry;

/// The task label of deliveries whose task this worker does not serve (or cannot read).
pub(crate) const OTHER_TASK: &str = "_other";

/// Upper bounds (seconds) of the run-duration histogram's buckets.
pub(crate) const RUN_SECONDS_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// A histogram of durations over [`RUN_SECONDS_BUCKETS`] (the last bucket is +Inf).
#[derive(Default)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; RUN_SECONDS_BUCKETS.len() + 1],
    micros: AtomicU64,
}

impl Histogram {
    pub(crate) fn observe(&self, micros: u64) {
        self.micros.fetch_add(micros, Ordering::Relaxed);
        let secs = micros as f64 / 1e6;
        let bucket = RUN_SECONDS_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(RUN_SECONDS_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts per bucket (not cumulative) and the sum in seconds.
    pub(crate) fn read(&self) -> (Vec<u64>, f64) {
        (
            self.buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            self.micros.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

/// One task's series.
#[derive(Default)]
pub(crate) struct TaskCounters {
    pub(crate) outcomes: [AtomicU64; Outcome::ALL.len()],
    pub(crate) started: AtomicU64,
    pub(crate) run_seconds: Histogram,
}

fn index(outcome: Outcome) -> usize {
    Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0)
}

/// Counters of delivery outcomes and runs, shared by a worker and its handles.
pub(crate) struct Counters {
    total: TaskCounters,
    tasks: HashMap<&'static str, TaskCounters>,
}

impl Counters {
    pub(crate) fn new(registry: &Registry) -> Self {
        let tasks = registry
            .names()
            .chain([OTHER_TASK])
            .map(|name| (name, TaskCounters::default()))
            .collect();
        Counters {
            total: TaskCounters::default(),
            tasks,
        }
    }

    fn task(&self, name: Option<&str>) -> &TaskCounters {
        name.and_then(|n| self.tasks.get(n))
            .or_else(|| self.tasks.get(OTHER_TASK))
            .unwrap_or(&self.total)
    }

    pub(crate) fn record(&self, outcome: Outcome, task: Option<&str>) {
        let i = index(outcome);
        self.total.outcomes[i].fetch_add(1, Ordering::Relaxed);
        self.task(task).outcomes[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn started(&self, task: &str) {
        self.total.started.fetch_add(1, Ordering::Relaxed);
        self.task(Some(task))
            .started
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ran_for(&self, micros: u64, task: &str) {
        self.total.run_seconds.observe(micros);
        self.task(Some(task)).run_seconds.observe(micros);
    }

    /// Every task's series, by name (sorted), `_other` included.
    pub(crate) fn per_task(&self) -> Vec<(&'static str, &TaskCounters)> {
        let mut all: Vec<_> = self.tasks.iter().map(|(k, v)| (*k, v)).collect();
        all.sort_by_key(|(k, _)| *k);
        all
    }

    pub(crate) fn snapshot(&self, in_flight: usize) -> WorkerStats {
        let (run_histogram, run_seconds) = self.total.run_seconds.read();
        WorkerStats {
            started: self.total.started.load(Ordering::Relaxed),
            in_flight,
            run_seconds,
            outcomes: Outcome::ALL
                .iter()
                .map(|o| (*o, self.total.outcomes[index(*o)].load(Ordering::Relaxed)))
                .collect(),
            run_histogram,
        }
    }
}

/// A snapshot of a worker's counters.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Runs started.
    pub started: u64,
    /// Runs in progress.
    pub in_flight: usize,
    /// Total seconds spent running tasks.
    pub run_seconds: f64,
    /// Deliveries per outcome.
    pub outcomes: Vec<(Outcome, u64)>,
    /// Runs per duration bucket (not cumulative), for the upper bounds in seconds
    /// 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60, 300 and +Inf.
    pub run_histogram: Vec<u64>,
}

impl WorkerStats {
    /// Deliveries that ended with `outcome`.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.outcomes
            .iter()
            .find(|(o, _)| *o == outcome)
            .map_or(0, |(_, n)| *n)
    }
}
