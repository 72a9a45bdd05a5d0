//! The memory store's workers and redrive resets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Claim, MemoryStore, Phase};
use crate::dead_letters::DeadFilter;
use crate::store::{
    DeadEntry, DeadPage, FinishedTask, MinuteStats, OpsStore, RedriveReset, StoreError, WorkerInfo,
    HISTORY_KEPT,
};
use crate::wire::TaskId;

/// Workers' reports and the dead letters already reset.
#[derive(Default)]
pub(crate) struct MemOps {
    workers: HashMap<String, (WorkerInfo, Instant)>,
    resets: HashSet<String>,
    /// History by (minute, task).
    history: BTreeMap<(u64, String), MinuteStats>,
    /// Finished tasks, in the order added.
    finished: Vec<FinishedTask>,
    /// Operators' jobs: id → (JSON, until).
    jobs: HashMap<String, (String, Instant)>,
    /// The dead-letter index: lane → key → entry.
    dead: HashMap<String, HashMap<String, DeadEntry>>,
}

#[async_trait]
impl OpsStore for MemoryStore {
    async fn report_worker(&self, info: &WorkerInfo, ttl: Duration) -> Result<(), StoreError> {
        self.lock()
            .ops
            .workers
            .insert(info.id.clone(), (info.clone(), Instant::now() + ttl));
        Ok(())
    }

    async fn forget_worker(&self, id: &str) -> Result<(), StoreError> {
        self.lock().ops.workers.remove(id);
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerInfo>, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        state.ops.workers.retain(|_, (_, until)| *until > now);
        let mut all: Vec<WorkerInfo> = state.ops.workers.values().map(|(w, _)| w.clone()).collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    async fn reset_for_redrive(
        &self,
        id: &TaskId,
        dead_letter_id: &str,
    ) -> Result<RedriveReset, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let key = format!("{id}/{dead_letter_id}");
        if state.ops.resets.contains(&key) {
            return Ok(RedriveReset::AlreadyReset);
        }
        let claim = state
            .claims
            .entry(id.clone())
            .or_insert_with(|| Claim::new(now));
        if claim.phase == Phase::Running && claim.lease_until > now {
            return Ok(RedriveReset::Running);
        }
        // A new token: a run from before the redrive can neither heartbeat nor write.
        claim.token += 1;
        claim.phase = Phase::Released;
        claim.failures = 0;
        claim.takeovers = 0;
        state.results.remove(id);
        state.progress.remove(id);
        state.ops.resets.insert(key);
        Ok(RedriveReset::Reset)
    }

    async fn add_history(&self, stats: &[MinuteStats]) -> Result<(), StoreError> {
        let mut state = self.lock();
        let history = &mut state.ops.history;
        for s in stats {
            history
                .entry((s.minute, s.task.clone()))
                .or_insert_with(|| MinuteStats::new(s.minute, s.task.as_str()))
                .add(s);
        }
        // Kept as long as the Valkey store keeps it (by the newest minute seen).
        let newest = history.keys().next_back().map_or(0, |(m, _)| *m);
        let oldest = newest.saturating_sub(HISTORY_KEPT.as_secs() / 60);
        history.retain(|(m, _), _| *m >= oldest);
        Ok(())
    }

    async fn history(&self, from: u64, to: u64) -> Result<Vec<MinuteStats>, StoreError> {
        let state = self.lock();
        Ok(state
            .ops
            .history
            .range((from, String::new())..)
            .take_while(|((m, _), _)| *m <= to)
            .map(|(_, s)| s.clone())
            .collect())
    }

    async fn record_job(&self, id: &str, json: &str, ttl: Duration) -> Result<(), StoreError> {
        self.lock()
            .ops
            .jobs
            .insert(id.to_owned(), (json.to_owned(), Instant::now() + ttl));
        Ok(())
    }

    async fn jobs(&self) -> Result<Vec<String>, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        state.ops.jobs.retain(|_, (_, until)| *until > now);
        Ok(state.ops.jobs.values().map(|(j, _)| j.clone()).collect())
    }

    async fn add_finished(&self, finished: &[FinishedTask]) -> Result<(), StoreError> {
        let mut state = self.lock();
        let all = &mut state.ops.finished;
        all.extend_from_slice(finished);
        let newest = all.iter().map(|f| f.at_ms).max().unwrap_or(0);
        let oldest = newest.saturating_sub(HISTORY_KEPT.as_millis() as u64);
        all.retain(|f| f.at_ms >= oldest);
        // In process memory: the newest 100,000 only.
        let excess = all.len().saturating_sub(100_000);
        all.drain(..excess);
        Ok(())
    }

    async fn finished(
        &self,
        task: &str,
        failed: Option<bool>,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<FinishedTask>, StoreError> {
        let state = self.lock();
        let mut found: Vec<FinishedTask> = state
            .ops
            .finished
            .iter()
            .filter(|f| {
                f.task == task
                    && failed.is_none_or(|x| f.failed == x)
                    && (from_ms..=to_ms).contains(&f.at_ms)
            })
            .cloned()
            .collect();
        found.sort_by_key(|f| std::cmp::Reverse(f.at_ms));
        found.truncate(limit);
        Ok(found)
    }

    async fn index_dead(&self, entries: &[DeadEntry]) -> Result<(), StoreError> {
        let mut state = self.lock();
        for e in entries {
            state
                .ops
                .dead
                .entry(e.lane.clone())
                .or_default()
                .insert(e.key.clone(), e.clone());
        }
        Ok(())
    }

    async fn unindex_dead(&self, lane: &str, keys: &[String]) -> Result<(), StoreError> {
        if let Some(index) = self.lock().ops.dead.get_mut(lane) {
            for k in keys {
                index.remove(k);
            }
        }
        Ok(())
    }

    async fn clear_dead_index(&self, lane: &str) -> Result<(), StoreError> {
        self.lock().ops.dead.remove(lane);
        Ok(())
    }

    async fn dead_index(
        &self,
        lane: &str,
        filter: &DeadFilter,
        now_ms: u64,
        offset: usize,
        limit: usize,
    ) -> Result<Option<DeadPage>, StoreError> {
        let state = self.lock();
        let Some(index) = state.ops.dead.get(lane) else {
            return Ok(Some(DeadPage::default()));
        };
        let mut found: Vec<&DeadEntry> = index
            .values()
            .filter(|e| e.matches(filter, now_ms))
            .collect();
        // Newest first; the key breaks ties so pages do not overlap.
        found.sort_by(|a, b| b.dead_at_ms.cmp(&a.dead_at_ms).then(b.key.cmp(&a.key)));
        let total = found.len() as u64;
        let entries = found
            .into_iter()
            .skip(offset)
            .take(limit)
            .cloned()
            .collect();
        Ok(Some(DeadPage::new(entries, total, index.len() as u64)))
    }
}
