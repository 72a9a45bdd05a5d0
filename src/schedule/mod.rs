//! Schedules: cron expressions and intervals that fire exactly once per tick, with any number
//! of schedulers running, a scheduler killed at any moment, and clock changes.
//!
//! Declared on a task — `#[task(name = "…", schedule = "0 */5 * * * *", timezone =
//! "Europe/Berlin")]` or `#[task(name = "…", every = 30)]` — or added at run time through
//! [`Client::schedules`](crate::Client::schedules) and kept in the store.
//!
//! Each tick's message has a task id derived from the schedule and the tick's time
//! ([`ScheduleSpec::tick_id`]): two schedulers sending the same tick send the same task, and
//! the claims and the once-only result make it one run. A lease in the store makes one
//! scheduler the sender in normal operation (cheap); correctness does not depend on it. Ticks
//! are sent a little ahead with their due time, so they start on time to the millisecond
//! whatever the scheduler's pace. Ticks nobody sent (every scheduler down, a leader killed)
//! follow the schedule's [`MissedTicks`] policy (default: run the latest once).

mod admin;
mod scheduler;

pub use admin::{ScheduleAdminError, ScheduleInfo, Schedules};
pub use ferriq_cron::{Cron, CronError};
pub use scheduler::{static_schedules, Scheduler, SchedulerBuilder};
// What a schedule is lives with the store that keeps it (`store/schedule_spec.rs`).
pub use crate::store::schedule_spec::{Compiled, MissedTicks, ScheduleError, ScheduleSpec, Timing};

#[cfg(test)]
mod tests;
