//! The worker's share of the store's history: every [`HISTORY_EVERY`] it adds what its
//! counters gained since (results per task, run times), under the current minute — the
//! counters `/metrics` keeps anyway, read and differenced here — and the tasks whose results
//! it wrote (id, name, outcome, time: one push per task into a buffer) to the finished-task
//! index.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::metrics::{Counters, OTHER_TASK};
use super::Inner;
use crate::store::{FinishedTask, MinuteStats};
use crate::wire::TaskMessage;

/// The most finished tasks a worker holds while the store does not take them: beyond it, the
/// index misses some (the counts stay whole). About 150 bytes each.
const MAX_FINISHED: usize = 50_000;

/// A round starts early when this many finished tasks wait: at thousands of tasks a second, ten
/// seconds' worth would otherwise be the largest thing in a worker's memory (tens of MiB).
const ADD_AT: usize = 2_000;

/// Finished tasks waiting to be added to the store's index.
#[derive(Default)]
pub(crate) struct FinishedTasks {
    held: std::sync::Mutex<Vec<FinishedTask>>,
    /// Woken when [`ADD_AT`] tasks wait.
    filled: tokio::sync::Notify,
}

impl FinishedTasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<FinishedTask>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self) -> Vec<FinishedTask> {
        let mut held = self.lock();
        // The next round's room sized as this one's was (up to a flush's worth): at a steady
        // rate it is not grown again from nothing, a copy of every entry at each doubling.
        let room = held.len().min(ADD_AT);
        std::mem::replace(&mut *held, Vec::with_capacity(room))
    }

    /// Tasks the store did not take, back for the next round (within the bound).
    fn put_back(&self, tasks: Vec<FinishedTask>) {
        let mut held = self.lock();
        let room = MAX_FINISHED.saturating_sub(held.len());
        held.extend(tasks.into_iter().take(room));
    }
}

/// Notes a task whose result this worker wrote, for the finished-task index (`registered`:
/// its name as registered here, kept without a copy).
pub(super) fn note_finished(
    w: &Inner,
    msg: &TaskMessage,
    registered: Option<&'static str>,
    failed: bool,
) {
    if !w.config.history {
        return;
    }
    let mut held = w.finished.lock();
    if held.len() < MAX_FINISHED {
        let task = match registered {
            Some(name) => Cow::Borrowed(name),
            None => Cow::Owned(msg.task_name.to_string()),
        };
        held.push(FinishedTask::new(
            msg.task_id.clone(),
            task,
            failed,
            w.config.clock.now_unix_ms(),
        ));
        if held.len() == ADD_AT {
            w.finished.filled.notify_one();
        }
    }
}

/// How often a worker adds its counts.
pub(crate) const HISTORY_EVERY: Duration = Duration::from_secs(10);

/// What was added last, per task: succeeded, failed, run-time buckets.
type Sent = HashMap<&'static str, (u64, u64, Vec<u64>)>;

/// What the counters gained over `sent`, as stats of `minute` (tasks without any left out),
/// and the counters as read.
fn gains(counters: &Counters, sent: &Sent, minute: u64) -> (Vec<MinuteStats>, Sent) {
    let mut out = Vec::new();
    let mut now = Sent::new();
    for (task, c) in counters.per_task() {
        if task == OTHER_TASK {
            continue;
        }
        let ok = c.results[0].load(std::sync::atomic::Ordering::Relaxed);
        let failed = c.results[1].load(std::sync::atomic::Ordering::Relaxed);
        let (buckets, _) = c.run_seconds.read();
        let (ok0, failed0, buckets0) = sent.get(task).cloned().unwrap_or_default();
        let mut s = MinuteStats::new(minute, task);
        s.succeeded = ok.saturating_sub(ok0);
        s.failed = failed.saturating_sub(failed0);
        for (i, n) in buckets.iter().enumerate() {
            s.durations[i] = n.saturating_sub(buckets0.get(i).copied().unwrap_or(0));
        }
        if s.succeeded + s.failed + s.runs() > 0 {
            out.push(s);
        }
        now.insert(task, (ok, failed, buckets));
    }
    (out, now)
}

/// Adds this worker's gains to the store every [`HISTORY_EVERY`] (sooner when [`ADD_AT`]
/// finished tasks wait), and once more when stopped.
pub(crate) async fn run(inner: Arc<Inner>, stop: CancellationToken) {
    let mut sent = Sent::new();
    let mut tick = tokio::time::interval(HISTORY_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
            _ = inner.finished.filled.notified() => false,
        };
        let minute = inner.config.clock.now_unix_ms() / 60_000;
        let (stats, now) = gains(&inner.counters, &sent, minute);
        if stats.is_empty() {
            sent = now;
        } else {
            match inner.store.add_history(&stats).await {
                Ok(()) => sent = now,
                // Kept for the next round: counts are added late rather than lost.
                Err(e) => tracing::debug!(error = %e, "history not added"),
            }
        }
        let finished = inner.finished.take();
        if !finished.is_empty() {
            if let Err(e) = inner.store.add_finished(&finished).await {
                tracing::debug!(error = %e, "finished tasks not indexed");
                inner.finished.put_back(finished);
            }
        }
        if stopping {
            return;
        }
    }
}
