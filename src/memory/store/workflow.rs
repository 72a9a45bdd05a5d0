//! The memory store's workflows and progress: the same semantics as Valkey's, under the same
//! lock as claims and results.

use async_trait::async_trait;
use tokio::time::Instant;

use super::{MemoryStore, Phase};
use crate::store::{
    ChainRecord, ClaimInfo, ClaimState, GroupMark, GroupRecord, GroupState, ProgressStore,
    ResultStatus, StoreError, TaskProgress, Token, WorkflowStore,
};
use crate::wire::{TaskId, TaskResult};

/// A group: its record, a bit per member counted, and its counts.
pub(crate) struct MemGroup {
    record: GroupRecord,
    counted: Vec<u64>,
    done: u32,
    failed: u32,
    settled: bool,
}

impl MemGroup {
    fn mark(&self) -> GroupMark {
        GroupMark {
            done: self.done,
            failed: self.failed,
            size: self.record.size,
            settled: self.settled,
        }
    }
}

fn unknown_group(id: &TaskId) -> StoreError {
    StoreError::Corrupt {
        task_id: id.to_string(),
        reason: "no such group (never created, or forgotten after its retention)".into(),
    }
}

#[async_trait]
impl WorkflowStore for MemoryStore {
    async fn create_group(&self, record: &GroupRecord) -> Result<bool, StoreError> {
        let mut state = self.lock();
        if state.groups.contains_key(&record.id) {
            return Ok(false);
        }
        let words = (record.size as usize).div_ceil(64);
        state.groups.insert(
            record.id.clone(),
            MemGroup {
                record: record.clone(),
                counted: vec![0; words],
                done: 0,
                failed: 0,
                settled: false,
            },
        );
        Ok(true)
    }

    async fn group(&self, id: &TaskId) -> Result<Option<GroupState>, StoreError> {
        Ok(self.lock().groups.get(id).map(|g| GroupState {
            record: g.record.clone(),
            mark: g.mark(),
        }))
    }

    async fn count_member(
        &self,
        id: &TaskId,
        index: u32,
        failed: bool,
    ) -> Result<GroupMark, StoreError> {
        let mut state = self.lock();
        let g = state.groups.get_mut(id).ok_or_else(|| unknown_group(id))?;
        if index >= g.record.size {
            return Err(StoreError::Corrupt {
                task_id: id.to_string(),
                reason: format!("member {index} of a group of {}", g.record.size),
            });
        }
        let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
        if g.counted[word] & bit == 0 {
            g.counted[word] |= bit;
            g.done += 1;
            g.failed += u32::from(failed);
        }
        Ok(g.mark())
    }

    async fn settle_group(&self, id: &TaskId) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let g = state.groups.get_mut(id).ok_or_else(|| unknown_group(id))?;
        let first = !g.settled;
        g.settled = true;
        if first {
            self.finished(&mut state, id);
        }
        Ok(first)
    }

    async fn create_chain(&self, record: &ChainRecord) -> Result<bool, StoreError> {
        let mut state = self.lock();
        if state.chains.contains_key(&record.id) {
            return Ok(false);
        }
        state.chains.insert(record.id.clone(), record.clone());
        self.finished(&mut state, &record.id);
        Ok(true)
    }

    async fn chain(&self, id: &TaskId) -> Result<Option<ChainRecord>, StoreError> {
        Ok(self.lock().chains.get(id).cloned())
    }

    async fn store_result_once(
        &self,
        id: &TaskId,
        result: &TaskResult,
    ) -> Result<bool, StoreError> {
        let mut state = self.lock();
        self.sweep(&mut state);
        if !MemoryStore::store_result(&mut state, id, result) {
            return Ok(false);
        }
        // Done for good: a message of this task that still arrives is a duplicate.
        let now = Instant::now();
        let claim = state
            .claims
            .entry(id.clone())
            .or_insert_with(|| super::Claim::new(now));
        if claim.phase != Phase::Revoked {
            claim.phase = Phase::Done;
            claim.token += 1;
        }
        self.finished(&mut state, id);
        Ok(true)
    }

    async fn get_many(&self, ids: &[TaskId]) -> Result<Vec<ResultStatus>, StoreError> {
        let state = self.lock();
        Ok(ids
            .iter()
            .map(|id| match state.results.get(id) {
                Some(r) => ResultStatus::Ready(r.clone()),
                None => ResultStatus::Pending,
            })
            .collect())
    }
}

#[async_trait]
impl ProgressStore for MemoryStore {
    async fn set_progress(
        &self,
        id: &TaskId,
        token: Token,
        progress: &TaskProgress,
    ) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let current = state
            .claims
            .get(id)
            .is_some_and(|c| c.phase == Phase::Running && c.token == token.0);
        if current {
            state.progress.insert(id.clone(), progress.clone());
        }
        Ok(current)
    }

    async fn progress(&self, id: &TaskId) -> Result<Option<TaskProgress>, StoreError> {
        Ok(self.lock().progress.get(id).cloned())
    }

    async fn claim_info(&self, id: &TaskId) -> Result<Option<ClaimInfo>, StoreError> {
        let now = Instant::now();
        let now_unix = self.inner.clock.now_unix();
        let state = self.lock();
        Ok(state.claims.get(id).map(|c| {
            let running = c.phase == Phase::Running;
            let ms = |unix: f64| (unix * 1000.0).max(0.0) as u64;
            ClaimInfo {
                state: match c.phase {
                    Phase::Running => ClaimState::Running,
                    Phase::Released => ClaimState::Released,
                    Phase::Done => ClaimState::Done,
                    Phase::Revoked => ClaimState::Revoked,
                },
                token: Token(c.token),
                holder: c.holder.to_string(),
                started_at_ms: running.then(|| ms(c.started_at)),
                lease_until_ms: running.then(|| {
                    let left = c.lease_until.saturating_duration_since(now);
                    ms(now_unix + left.as_secs_f64())
                }),
                failures: c.failures,
                starts: c.starts,
                takeovers: c.takeovers,
            }
        }))
    }
}
