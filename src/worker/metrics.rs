//! What a worker counts: delivery outcomes and run durations, in total and per task (the task
//! label is bounded by the registry: names it does not serve count as `_other`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::running::Outcome;
use crate::registry::Registry;

/// The task label of deliveries whose task this worker does not serve (or cannot read).
pub(crate) const OTHER_TASK: &str = "_other";

/// Upper bounds (seconds) of the run-duration histogram's buckets.
pub(crate) const RUN_SECONDS_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Upper bounds (seconds) of the queue-wait histogram's buckets (enqueue, or due time, to the
/// run's start).
pub(crate) const QUEUE_WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0,
];

/// Upper bounds of the attempts histogram's buckets (attempts a task took to finish).
pub(crate) const ATTEMPT_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 5.0, 10.0, 25.0];

/// A histogram over fixed upper bounds (a last bucket is +Inf); values are kept in millionths.
pub(crate) struct Histogram {
    pub(crate) bounds: &'static [f64],
    buckets: Box<[AtomicU64]>,
    micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::over(&RUN_SECONDS_BUCKETS)
    }
}

impl Histogram {
    pub(crate) fn over(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            micros: AtomicU64::new(0),
        }
    }

    /// Observes `micros` millionths (of a second, or of one attempt).
    pub(crate) fn observe(&self, micros: u64) {
        self.micros.fetch_add(micros, Ordering::Relaxed);
        let value = micros as f64 / 1e6;
        let bucket = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
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
pub(crate) struct TaskCounters {
    pub(crate) outcomes: [AtomicU64; Outcome::ALL.len()],
    pub(crate) started: AtomicU64,
    pub(crate) run_seconds: Histogram,
    pub(crate) queue_wait: Histogram,
    pub(crate) attempts: Histogram,
    /// Results written: successes, errors.
    pub(crate) results: [AtomicU64; 2],
    /// Claims this worker was refused (a live holder) or took over (an expired holder).
    pub(crate) claims_deferred: AtomicU64,
    pub(crate) claims_taken_over: AtomicU64,
}

impl Default for TaskCounters {
    fn default() -> Self {
        TaskCounters {
            outcomes: Default::default(),
            started: AtomicU64::new(0),
            run_seconds: Histogram::over(&RUN_SECONDS_BUCKETS),
            queue_wait: Histogram::over(&QUEUE_WAIT_BUCKETS),
            attempts: Histogram::over(&ATTEMPT_BUCKETS),
            results: Default::default(),
            claims_deferred: AtomicU64::new(0),
            claims_taken_over: AtomicU64::new(0),
        }
    }
}

fn index(outcome: Outcome) -> usize {
    Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0)
}

/// Counters of delivery outcomes and runs, shared by a worker and its handles.
pub(crate) struct Counters {
    total: TaskCounters,
    /// Each served task's series, and `_other`'s last.
    series: Vec<(&'static str, TaskCounters)>,
    /// Where each name's series is.
    by_name: crate::FastMap<&'static str, usize>,
    /// The series found last: a run counts its task six or seven times in a row, and a
    /// worker often runs one task after another of the same name.
    last_found: AtomicUsize,
}

impl Counters {
    pub(crate) fn new(registry: &Registry) -> Self {
        // A task registered as `_other` shares `_other`'s series (one series per name).
        let series: Vec<_> = registry
            .names()
            .filter(|name| *name != OTHER_TASK)
            .chain([OTHER_TASK])
            .map(|name| (name, TaskCounters::default()))
            .collect();
        let by_name = series
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (*name, i))
            .collect();
        Counters {
            total: TaskCounters::default(),
            series,
            by_name,
            last_found: AtomicUsize::new(0),
        }
    }

    /// Where `name`'s series is, if this worker serves it.
    fn position(&self, name: &str) -> Option<usize> {
        // A run counts its task six or seven times, and a worker often runs one task after
        // another of the same name: the series found last is tried first, by the text's
        // address and length (the registration's own `&'static str`), then by its bytes (a
        // name read from a message is a copy). Any other name is hashed.
        let hint = self.last_found.load(Ordering::Relaxed);
        if self.series.get(hint).is_some_and(|(known, _)| {
            (known.as_ptr(), known.len()) == (name.as_ptr(), name.len()) || *known == name
        }) {
            return Some(hint);
        }
        let found = self.by_name.get(name).copied();
        if let Some(at) = found {
            self.last_found.store(at, Ordering::Relaxed);
        }
        found
    }

    fn task(&self, name: Option<&str>) -> &TaskCounters {
        let at = name.and_then(|n| self.position(n));
        // `_other`'s series is the last.
        match at.or(self.series.len().checked_sub(1)) {
            Some(at) => &self.series[at].1,
            None => &self.total,
        }
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

    /// The run of `task` started `secs` after it was enqueued (or due).
    pub(crate) fn waited(&self, secs: f64, task: &str) {
        let micros = (secs.max(0.0) * 1e6) as u64;
        self.task(Some(task)).queue_wait.observe(micros);
    }

    /// A result of `task` was written.
    ///
    /// Returns the task's registered name, if it is registered here: the finished-task index
    /// keeps it without a copy.
    pub(crate) fn result_written(&self, task: &str, is_err: bool) -> Option<&'static str> {
        let (name, counters) = match self.position(task) {
            Some(at) => (Some(self.series[at].0), &self.series[at].1),
            None => (None, self.task(None)),
        };
        counters.results[usize::from(is_err)].fetch_add(1, Ordering::Relaxed);
        name
    }

    /// A run of `task` finished it (its result written) at attempt `attempts`.
    pub(crate) fn finished_after(&self, task: &str, attempts: u32) {
        self.task(Some(task))
            .attempts
            .observe(u64::from(attempts) * 1_000_000);
    }

    /// A claim of `task` was deferred (`false`) or taken over (`true`).
    pub(crate) fn claim(&self, task: &str, taken_over: bool) {
        let c = self.task(Some(task));
        if taken_over {
            c.claims_taken_over.fetch_add(1, Ordering::Relaxed);
        } else {
            c.claims_deferred.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every task's series, by name (sorted), `_other` included.
    pub(crate) fn per_task(&self) -> Vec<(&'static str, &TaskCounters)> {
        let mut all: Vec<_> = self.series.iter().map(|(k, v)| (*k, v)).collect();
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
