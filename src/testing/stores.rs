//! Test stores: one that fails on demand as an unreachable Valkey would, and one that counts
//! result writes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::broker::Health;
use crate::memory::MemoryStore;
use crate::schedule::ScheduleSpec;
use crate::store::{
    ChainRecord, ClaimInfo, ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, FailureRecord,
    GroupMark, GroupRecord, GroupState, OpsStore, ProgressStore, RedriveReset, ResultStatus,
    ResultStore, ScheduleStore, StoreError, TaskProgress, Token, WorkerInfo, WorkflowStore,
};
use crate::wire::{TaskId, TaskResult};

/// Which store operations fail.
#[derive(Debug, Default)]
struct Faults {
    claim: AtomicBool,
    heartbeat: AtomicBool,
    release: AtomicBool,
    record_failure: AtomicBool,
    complete: AtomicBool,
    complete_after_write: AtomicBool,
    reads: AtomicBool,
    calls_failed: AtomicU32,
}

/// A store operation that [`FaultyStore`] can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreOp {
    /// `claim`.
    Claim,
    /// `heartbeat`.
    Heartbeat,
    /// `release`.
    Release,
    /// `record_failure`.
    RecordFailure,
    /// `complete`, failing before anything is written (store unreachable).
    Complete,
    /// `complete`, failing after the write was applied (the reply was lost).
    CompleteAfterWrite,
    /// `get` and `wait`.
    Reads,
}

/// A [`MemoryStore`] whose operations fail on demand with [`StoreError::Unavailable`], as an
/// unreachable Valkey would.
#[derive(Debug, Clone)]
pub struct FaultyStore {
    /// The store behind it.
    pub inner: MemoryStore,
    faults: Arc<Faults>,
}

impl FaultyStore {
    /// Wraps a store; nothing fails until asked.
    pub fn new(inner: MemoryStore) -> Self {
        FaultyStore {
            inner,
            faults: Arc::default(),
        }
    }

    fn flag(&self, op: StoreOp) -> &AtomicBool {
        let f = &self.faults;
        match op {
            StoreOp::Claim => &f.claim,
            StoreOp::Heartbeat => &f.heartbeat,
            StoreOp::Release => &f.release,
            StoreOp::RecordFailure => &f.record_failure,
            StoreOp::Complete => &f.complete,
            StoreOp::CompleteAfterWrite => &f.complete_after_write,
            StoreOp::Reads => &f.reads,
        }
    }

    /// Makes `op` fail (`true`) or work (`false`).
    pub fn set_failing(&self, op: StoreOp, failing: bool) {
        self.flag(op).store(failing, Ordering::SeqCst);
    }

    /// Calls that failed on purpose.
    pub fn failed_calls(&self) -> u32 {
        self.faults.calls_failed.load(Ordering::SeqCst)
    }

    fn check(&self, op: StoreOp) -> Result<(), StoreError> {
        if self.flag(op).load(Ordering::SeqCst) {
            self.faults.calls_failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable(format!("injected fault on {op:?}")));
        }
        Ok(())
    }
}

#[async_trait]
impl ClaimStore for FaultyStore {
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.check(StoreOp::Claim)?;
        self.inner.claim(id, worker, lease, deadline_at).await
    }
    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        self.check(StoreOp::Heartbeat)?;
        self.inner.heartbeat(claims, lease).await
    }
    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.check(StoreOp::Release)?;
        ClaimStore::release(&self.inner, id, token).await
    }
    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.check(StoreOp::Release)?;
        self.inner.release_interrupted(id, token).await
    }
    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        self.check(StoreOp::RecordFailure)?;
        self.inner.record_failure(id, token).await
    }
    async fn health(&self) -> Health {
        match self.check(StoreOp::Claim) {
            Ok(()) => self.inner.health().await,
            Err(e) => Health::Unhealthy(e.to_string()),
        }
    }
}

#[async_trait]
impl ResultStore for FaultyStore {
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError> {
        self.check(StoreOp::Complete)?;
        let outcome = self.inner.complete(id, token, result, reply_to).await?;
        self.check(StoreOp::CompleteAfterWrite)?;
        Ok(outcome)
    }
    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError> {
        self.check(StoreOp::Reads)?;
        self.inner.get(id).await
    }
    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError> {
        self.check(StoreOp::Reads)?;
        self.inner.wait(id, timeout).await
    }
    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
        self.check(StoreOp::Complete)?;
        self.inner.revoke(id, result).await
    }
}

/// Wraps any claim/result store and counts, per task, the result writes it reports as
/// `Stored`: the oracle's "result writes" for exactly-once tests on real backends.
///
/// ```
/// use std::sync::Arc;
/// use ferriq::memory::MemoryStore;
/// use ferriq::testing::CountingStore;
/// let store = CountingStore::new(Arc::new(MemoryStore::new()));
/// assert_eq!(store.total_writes(), 0);
/// ```
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: Arc<S>,
    writes: Mutex<HashMap<TaskId, u32>>,
    fenced: AtomicU64,
}

impl<S> CountingStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<S>) -> Self {
        CountingStore {
            inner,
            writes: Mutex::default(),
            fenced: AtomicU64::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// Writes reported as `Stored` for `id`.
    pub fn writes(&self, id: &TaskId) -> u32 {
        self.lock().get(id).copied().unwrap_or(0)
    }

    /// Writes over all tasks.
    pub fn total_writes(&self) -> u64 {
        self.lock().values().map(|n| u64::from(*n)).sum()
    }

    /// Result writes refused as `Stale`: a holder whose claim was taken over tried to write
    /// (fencing at work, whatever the worker then did with its delivery).
    pub fn fenced_writes(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    /// Tasks written more than once (must stay empty).
    pub fn duplicate_writes(&self) -> Vec<TaskId> {
        self.lock()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, u32>> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl<S: ClaimStore> ClaimStore for CountingStore<S> {
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(id, worker, lease, deadline_at).await
    }
    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        self.inner.heartbeat(claims, lease).await
    }
    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.release(id, token).await
    }
    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.release_interrupted(id, token).await
    }
    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        self.inner.record_failure(id, token).await
    }
    async fn health(&self) -> Health {
        self.inner.health().await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

#[async_trait]
impl<S: ResultStore> ResultStore for CountingStore<S> {
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError> {
        let outcome = self.inner.complete(id, token, result, reply_to).await?;
        match outcome {
            CompleteOutcome::Stored => *self.lock().entry(id.clone()).or_default() += 1,
            CompleteOutcome::Stale => {
                self.fenced.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(outcome)
    }
    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError> {
        self.inner.get(id).await
    }
    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError> {
        self.inner.wait(id, timeout).await
    }
    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
        self.inner.revoke(id, result).await
    }
    fn reply_channel(&self) -> Option<String> {
        self.inner.reply_channel()
    }
    fn reply_channel_for(&self, id: &TaskId) -> Option<String> {
        self.inner.reply_channel_for(id)
    }
    fn reads_results_here(&self, reply_to: &str) -> bool {
        self.inner.reads_results_here(reply_to)
    }
}

/// Implements the workflow, progress and schedule traits for a wrapper by handing every call to the
/// store it wraps (`$inner` is an expression on `self`).
macro_rules! forward_store_traits {
    ([$($generics:tt)*] $ty:ty, |$this:ident| $inner:expr) => {
        #[async_trait]
        impl<$($generics)*> WorkflowStore for $ty {
            async fn create_group(&self, record: &GroupRecord) -> Result<bool, StoreError> {
                let $this = self;
                $inner.create_group(record).await
            }
            async fn group(&self, id: &TaskId) -> Result<Option<GroupState>, StoreError> {
                let $this = self;
                $inner.group(id).await
            }
            async fn count_member(&self, id: &TaskId, index: u32, failed: bool) -> Result<GroupMark, StoreError> {
                let $this = self;
                $inner.count_member(id, index, failed).await
            }
            async fn settle_group(&self, id: &TaskId) -> Result<bool, StoreError> {
                let $this = self;
                $inner.settle_group(id).await
            }
            async fn create_chain(&self, record: &ChainRecord) -> Result<bool, StoreError> {
                let $this = self;
                $inner.create_chain(record).await
            }
            async fn chain(&self, id: &TaskId) -> Result<Option<ChainRecord>, StoreError> {
                let $this = self;
                $inner.chain(id).await
            }
            async fn store_result_once(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
                let $this = self;
                $inner.store_result_once(id, result).await
            }
            async fn get_many(&self, ids: &[TaskId]) -> Result<Vec<ResultStatus>, StoreError> {
                let $this = self;
                $inner.get_many(ids).await
            }
        }

        #[async_trait]
        impl<$($generics)*> ProgressStore for $ty {
            async fn set_progress(&self, id: &TaskId, token: Token, progress: &TaskProgress) -> Result<bool, StoreError> {
                let $this = self;
                $inner.set_progress(id, token, progress).await
            }
            async fn progress(&self, id: &TaskId) -> Result<Option<TaskProgress>, StoreError> {
                let $this = self;
                $inner.progress(id).await
            }
            async fn claim_info(&self, id: &TaskId) -> Result<Option<ClaimInfo>, StoreError> {
                let $this = self;
                $inner.claim_info(id).await
            }
        }


        #[async_trait]
        impl<$($generics)*> ScheduleStore for $ty {
            async fn put_schedule(&self, spec: &ScheduleSpec) -> Result<(), StoreError> {
                let $this = self;
                $inner.put_schedule(spec).await
            }
            async fn remove_schedule(&self, id: &str, limit: Duration) -> Result<bool, StoreError> {
                let $this = self;
                $inner.remove_schedule(id, limit).await
            }
            async fn schedules(&self) -> Result<Vec<ScheduleSpec>, StoreError> {
                let $this = self;
                $inner.schedules().await
            }
            async fn begin_sending(&self, id: &str, limit: Duration) -> Result<bool, StoreError> {
                let $this = self;
                $inner.begin_sending(id, limit).await
            }
            async fn end_sending(&self, id: &str) -> Result<(), StoreError> {
                let $this = self;
                $inner.end_sending(id).await
            }
            async fn last_tick(&self, id: &str) -> Result<Option<i64>, StoreError> {
                let $this = self;
                $inner.last_tick(id).await
            }
            async fn last_sent_tick(&self, id: &str) -> Result<Option<i64>, StoreError> {
                let $this = self;
                $inner.last_sent_tick(id).await
            }
            async fn record_tick(&self, id: &str, tick: i64, sent: bool) -> Result<(), StoreError> {
                let $this = self;
                $inner.record_tick(id, tick, sent).await
            }
            async fn lead(&self, scheduler: &str, lease: Duration) -> Result<bool, StoreError> {
                let $this = self;
                $inner.lead(scheduler, lease).await
            }
            async fn leader(&self) -> Result<Option<String>, StoreError> {
                let $this = self;
                $inner.leader().await
            }
            async fn set_paused(&self, id: &str, paused: bool) -> Result<(), StoreError> {
                let $this = self;
                $inner.set_paused(id, paused).await
            }
            async fn paused(&self) -> Result<Vec<String>, StoreError> {
                let $this = self;
                $inner.paused().await
            }
            async fn put_declared(&self, specs: &[ScheduleSpec]) -> Result<(), StoreError> {
                let $this = self;
                $inner.put_declared(specs).await
            }
            async fn declared(&self) -> Result<Vec<ScheduleSpec>, StoreError> {
                let $this = self;
                $inner.declared().await
            }
        }

        // `claim_past_limit` is not passed on: a wrapper's limiter decisions and claims are
        // asked apart, so what it does to each (fail, count, delay) still happens.
        #[async_trait]
        impl<$($generics)*> crate::store::FlowStore for $ty {
            async fn admit_rate(
                &self,
                limiter: &str,
                id: &TaskId,
                rate: crate::task::Rate,
            ) -> Result<crate::store::RateDecision, StoreError> {
                let $this = self;
                $inner.admit_rate(limiter, id, rate).await
            }
            async fn acquire_slot(
                &self,
                limiter: &str,
                id: &TaskId,
                limit: u32,
                lease: Duration,
            ) -> Result<crate::store::SlotDecision, StoreError> {
                let $this = self;
                $inner.acquire_slot(limiter, id, limit, lease).await
            }
            async fn renew_slots(&self, slots: &[(String, TaskId)], lease: Duration) -> Result<(), StoreError> {
                let $this = self;
                $inner.renew_slots(slots, lease).await
            }
            async fn release_slot(&self, limiter: &str, id: &TaskId, held: Duration) -> Result<(), StoreError> {
                let $this = self;
                $inner.release_slot(limiter, id, held).await
            }
            async fn reserve_dedup(
                &self,
                key: &str,
                id: &TaskId,
                ttl: Duration,
            ) -> Result<Option<TaskId>, StoreError> {
                let $this = self;
                $inner.reserve_dedup(key, id, ttl).await
            }
            async fn release_dedup(&self, key: &str, id: &TaskId) -> Result<(), StoreError> {
                let $this = self;
                $inner.release_dedup(key, id).await
            }
            async fn debounce(
                &self,
                key: &str,
                id: &TaskId,
                window: Duration,
            ) -> Result<crate::store::DebounceTurn, StoreError> {
                let $this = self;
                $inner.debounce(key, id, window).await
            }
            async fn take_debounced(
                &self,
                key: &str,
                id: &TaskId,
                seq: u64,
            ) -> Result<crate::store::Debounced, StoreError> {
                let $this = self;
                $inner.take_debounced(key, id, seq).await
            }
            async fn set_limit_override(
                &self,
                target: &str,
                limits: Option<crate::store::LimitOverride>,
            ) -> Result<bool, StoreError> {
                let $this = self;
                $inner.set_limit_override(target, limits).await
            }
            async fn limit_overrides(
                &self,
            ) -> Result<Vec<(String, crate::store::LimitOverride)>, StoreError> {
                let $this = self;
                $inner.limit_overrides().await
            }
            async fn note_limiters(
                &self,
                seen: &[crate::store::LimiterSeen],
            ) -> Result<(), StoreError> {
                let $this = self;
                $inner.note_limiters(seen).await
            }
            async fn limiters(&self) -> Result<Vec<crate::store::LimiterUsage>, StoreError> {
                let $this = self;
                $inner.limiters().await
            }
        }

        #[async_trait]
        impl<$($generics)*> OpsStore for $ty {
            async fn report_worker(&self, info: &WorkerInfo, ttl: Duration) -> Result<(), StoreError> {
                let $this = self;
                $inner.report_worker(info, ttl).await
            }
            async fn forget_worker(&self, id: &str) -> Result<(), StoreError> {
                let $this = self;
                $inner.forget_worker(id).await
            }
            async fn workers(&self) -> Result<Vec<WorkerInfo>, StoreError> {
                let $this = self;
                $inner.workers().await
            }
            async fn reset_for_redrive(&self, id: &TaskId, dead_letter_id: &str) -> Result<RedriveReset, StoreError> {
                let $this = self;
                $inner.reset_for_redrive(id, dead_letter_id).await
            }
            async fn add_history(&self, stats: &[crate::store::MinuteStats]) -> Result<(), StoreError> {
                let $this = self;
                $inner.add_history(stats).await
            }
            async fn history(&self, from: u64, to: u64) -> Result<Vec<crate::store::MinuteStats>, StoreError> {
                let $this = self;
                $inner.history(from, to).await
            }
            async fn record_job(&self, id: &str, json: &str, ttl: Duration) -> Result<(), StoreError> {
                let $this = self;
                $inner.record_job(id, json, ttl).await
            }
            async fn jobs(&self) -> Result<Vec<String>, StoreError> {
                let $this = self;
                $inner.jobs().await
            }
            async fn add_finished(&self, finished: &[crate::store::FinishedTask]) -> Result<(), StoreError> {
                let $this = self;
                $inner.add_finished(finished).await
            }
            async fn finished(&self, task: &str, failed: Option<bool>, from_ms: u64, to_ms: u64, limit: usize) -> Result<Vec<crate::store::FinishedTask>, StoreError> {
                let $this = self;
                $inner.finished(task, failed, from_ms, to_ms, limit).await
            }
            async fn index_dead(&self, entries: &[crate::store::DeadEntry]) -> Result<(), StoreError> {
                let $this = self;
                $inner.index_dead(entries).await
            }
            async fn unindex_dead(&self, lane: &str, keys: &[String]) -> Result<(), StoreError> {
                let $this = self;
                $inner.unindex_dead(lane, keys).await
            }
            async fn clear_dead_index(&self, lane: &str) -> Result<(), StoreError> {
                let $this = self;
                $inner.clear_dead_index(lane).await
            }
            async fn dead_index(&self, lane: &str, filter: &crate::dead_letters::DeadFilter, now_ms: u64, offset: usize, limit: usize) -> Result<Option<crate::store::DeadPage>, StoreError> {
                let $this = self;
                $inner.dead_index(lane, filter, now_ms, offset, limit).await
            }
        }
    };
}

forward_store_traits!([] FaultyStore, |s| s.inner);
forward_store_traits!([S: WorkflowStore + ProgressStore + ScheduleStore + OpsStore + crate::store::FlowStore] CountingStore<S>, |s| s.inner);
