//! The test stores wrap a store for its claims and results; every other store trait is
//! handed to the store they wrap, written once here for both.

use std::time::Duration;

use async_trait::async_trait;

use super::{CountingStore, FaultyStore};
use crate::schedule::ScheduleSpec;
use crate::store::{
    ChainRecord, ClaimInfo, GroupMark, GroupRecord, GroupState, OpsStore, ProgressStore,
    RedriveReset, ResultStatus, ScheduleStore, StoreError, TaskProgress, Token, WorkerInfo,
    WorkflowStore,
};
use crate::wire::{TaskId, TaskResult};

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
forward_store_traits!([S: WorkflowStore + ProgressStore + ScheduleStore + OpsStore + crate::store::FlowStore] CountingStore<S>, |s| s.inner());
