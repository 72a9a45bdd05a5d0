//! Schedules at run time: add, list and remove them through the store, from any client.

use thiserror::Error;

use super::scheduler::{static_schedules, SENDING_LIMIT};
use super::{ScheduleError, ScheduleSpec};
use crate::client::{Client, TaskStatus};
use crate::store::StoreError;

/// Why a schedule could not be added or listed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ScheduleAdminError {
    /// The schedule is invalid.
    #[error(transparent)]
    Invalid(#[from] ScheduleError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A schedule as the store and the clock see it now.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The schedule.
    pub spec: ScheduleSpec,
    /// Declared on a task (`#[task(schedule = …)]`) rather than added at run time.
    pub declared: bool,
    /// Its next tick after now (unix seconds), when there is one.
    pub next_run: Option<i64>,
    /// The latest tick sent (unix seconds).
    pub last_tick: Option<i64>,
    /// How the latest tick's run stands.
    pub last_status: Option<TaskStatus>,
    /// Paused: its ticks pass unsent until it is resumed.
    pub paused: bool,
}

/// The schedules of one store: add, list, remove. From [`Client::schedules`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use ferriq::schedule::ScheduleSpec;
/// let env = ferriq::testing::TestEnv::new();
/// let report = ScheduleSpec::cron("report-acme", "reports.weekly", "0 0 8 * * MON")
///     .in_timezone("Europe/Berlin")
///     .with_args(vec![serde_json::json!("acme")]);
/// env.client.schedules().add(report).await.unwrap();
/// let listed = env.client.schedules().list().await.unwrap();
/// assert!(listed.iter().any(|s| s.spec.id == "report-acme" && s.next_run.is_some()));
/// assert!(env.client.schedules().remove("report-acme").await.unwrap());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Schedules {
    client: Client,
}

impl Client {
    /// The schedules in this client's store.
    pub fn schedules(&self) -> Schedules {
        Schedules {
            client: self.clone(),
        }
    }
}

impl Schedules {
    /// Adds (or replaces, by id) a schedule, after checking it. Every scheduler sends its
    /// ticks from its next round; it survives restarts of every scheduler.
    pub async fn add(&self, spec: ScheduleSpec) -> Result<(), ScheduleAdminError> {
        spec.compile()?;
        self.client.store().put_schedule(&spec).await?;
        Ok(())
    }

    /// Removes a run-time schedule; `false` when there was none. When this returns, no
    /// scheduler sends a tick of it any more (a send under way finishes first).
    pub async fn remove(&self, id: &str) -> Result<bool, StoreError> {
        self.client.store().remove_schedule(id, SENDING_LIMIT).await
    }

    /// Pauses schedule `id` (declared or added at run time): its ticks pass unsent until
    /// [`Schedules::resume`], which does not catch them up. A tick already sent still runs.
    pub async fn pause(&self, id: &str) -> Result<(), StoreError> {
        self.client.store().set_paused(id, true).await
    }

    /// Resumes schedule `id`: its next tick is sent as usual.
    pub async fn resume(&self, id: &str) -> Result<(), StoreError> {
        self.client.store().set_paused(id, false).await
    }

    /// Every schedule — declared on tasks (this binary's, and those a scheduler recorded in
    /// the store), and added at run time — with its next tick, how its latest tick stands,
    /// and whether it is paused.
    pub async fn list(&self) -> Result<Vec<ScheduleInfo>, ScheduleAdminError> {
        let store = self.client.store();
        let mut specs: Vec<(ScheduleSpec, bool)> =
            static_schedules()?.into_iter().map(|s| (s, true)).collect();
        for spec in store.declared().await? {
            if !specs.iter().any(|(s, _)| s.id == spec.id) {
                specs.push((spec, true));
            }
        }
        specs.extend(store.schedules().await?.into_iter().map(|s| (s, false)));
        let paused = store.paused().await?;
        let now = self.client.clock().now_unix().floor() as i64;
        let mut out = Vec::with_capacity(specs.len());
        for (spec, declared) in specs {
            let next_run = spec.compile().ok().and_then(|c| c.next_after(now));
            let last_tick = store.last_sent_tick(&spec.id).await?;
            let last_status = match last_tick {
                Some(t) => Some(self.client.handle::<()>(spec.tick_id(t)).status().await?),
                None => None,
            };
            out.push(ScheduleInfo {
                paused: paused.contains(&spec.id),
                spec,
                declared,
                next_run,
                last_tick,
                last_status,
            });
        }
        Ok(out)
    }

    /// The scheduler sending ticks now (the leader lease's holder), if any.
    pub async fn leader(&self) -> Result<Option<String>, StoreError> {
        self.client.store().leader().await
    }
}
