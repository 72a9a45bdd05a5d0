//! What stores keep for schedulers: schedules added at run time, the last tick sent per
//! schedule, and the leader lease that makes one scheduler the sender in normal operation.

use std::time::Duration;

use async_trait::async_trait;

use super::schedule_spec::ScheduleSpec;
use super::StoreError;

/// Schedules and their bookkeeping. Object-safe.
#[async_trait]
pub trait ScheduleStore: Send + Sync + 'static {
    /// Adds or replaces a schedule (by id).
    async fn put_schedule(&self, spec: &ScheduleSpec) -> Result<(), StoreError>;
    /// Removes a schedule; `false` when there was none. Returns only when no scheduler is in
    /// the middle of sending one of its ticks (a send under way when it is called finishes
    /// first, bounded by `sending_limit`): after it returns, the schedule sends nothing.
    async fn remove_schedule(&self, id: &str, sending_limit: Duration) -> Result<bool, StoreError>;
    /// Every schedule added at run time.
    async fn schedules(&self) -> Result<Vec<ScheduleSpec>, StoreError>;
    /// Marks that a scheduler is about to send ticks of run-time schedule `id` (for at most
    /// `limit`); `false` when the schedule no longer exists.
    async fn begin_sending(&self, id: &str, limit: Duration) -> Result<bool, StoreError>;
    /// The send that `begin_sending` announced is over.
    async fn end_sending(&self, id: &str) -> Result<(), StoreError>;
    /// The latest tick (unix seconds) handled for schedule `id`: sent, or passed over (missed
    /// while no scheduler ran, or skipped because the previous run still ran). Schedulers
    /// carry on after it.
    async fn last_tick(&self, id: &str) -> Result<Option<i64>, StoreError>;
    /// The latest tick (unix seconds) sent for schedule `id`: the one whose run `no_overlap`
    /// waits for, and whose status listings show.
    async fn last_sent_tick(&self, id: &str) -> Result<Option<i64>, StoreError>;
    /// Records `tick` as handled for schedule `id`, and as sent when `sent`; neither mark
    /// ever moves back (a later one recorded already stays).
    async fn record_tick(&self, id: &str, tick: i64, sent: bool) -> Result<(), StoreError>;
    /// Takes or keeps the leader lease for `scheduler` for `lease`; `true` when it holds it.
    async fn lead(&self, scheduler: &str, lease: Duration) -> Result<bool, StoreError>;
    /// The scheduler holding the leader lease, if any.
    async fn leader(&self) -> Result<Option<String>, StoreError>;
    /// Pauses (`true`) or resumes schedule `id`, declared or added at run time: a paused
    /// schedule's ticks pass unsent, and resuming does not catch them up. The default refuses
    /// (a store written before pauses existed).
    async fn set_paused(&self, id: &str, paused: bool) -> Result<(), StoreError> {
        let _ = (id, paused);
        Err(StoreError::Config(
            "this store cannot pause schedules".into(),
        ))
    }
    /// The ids of the paused schedules. The default knows none.
    async fn paused(&self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
    /// Records the schedules declared on the tasks of a scheduler's binary, so operators see
    /// them from anywhere (the `ferriq` command has no tasks of its own); replaces the record.
    /// The default keeps nothing.
    async fn put_declared(&self, specs: &[ScheduleSpec]) -> Result<(), StoreError> {
        let _ = specs;
        Ok(())
    }
    /// The declared schedules last recorded by a scheduler. The default knows none.
    async fn declared(&self) -> Result<Vec<ScheduleSpec>, StoreError> {
        Ok(Vec::new())
    }
}
