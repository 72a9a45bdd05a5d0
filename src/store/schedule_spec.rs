//! What a schedule is: which task, when (cron in a time zone, or every N seconds), with which
//! arguments, and what to do about ticks nobody sent.

use std::fmt;

use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::wire::TaskId;
use ferriq_cron::{Cron, CronError};

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Timing {
    /// A cron expression (with seconds) in an IANA time zone (`UTC` when absent).
    Cron {
        /// The expression.
        expr: String,
        /// The time zone, e.g. `Europe/Berlin`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
    },
    /// Every `seconds`, at whole multiples of it since the unix epoch.
    Every {
        /// The interval.
        seconds: u64,
    },
}

/// What a scheduler does with ticks whose time passed while no scheduler sent them (all were
/// down, or a leader died).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "policy")]
#[non_exhaustive]
pub enum MissedTicks {
    /// Drop them: only ticks due from now on run.
    Skip,
    /// Run the latest of them once (the default): a nightly job missed during an outage
    /// runs once when a scheduler is back.
    #[default]
    Latest,
    /// Run every one of them, the last `max` at most. They are sent together, oldest first,
    /// and start as free slots take them — concurrently, unless the schedule has
    /// `no_overlap` (then only the latest runs).
    CatchUp {
        /// The most missed ticks to run.
        max: u32,
    },
}

/// A schedule: a task sent at its ticks. Each tick's message has a task id derived from the
/// schedule's id and the tick's time ([`ScheduleSpec::tick_id`]), so any number of schedulers
/// sending the same tick make one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScheduleSpec {
    /// The schedule's id (a `#[task]`'s schedule has the task's name).
    pub id: String,
    /// The task to send.
    pub task: String,
    /// When.
    pub timing: Timing,
    /// Positional arguments of each call.
    #[serde(default)]
    pub args: Vec<Value>,
    /// Keyword arguments of each call.
    #[serde(default)]
    pub kwargs: Map<String, Value>,
    /// The queue (lane) to send to; the default lane when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Missed ticks.
    #[serde(default)]
    pub missed: MissedTicks,
    /// Skip every tick while the latest tick sent has not finished (running, waiting for a
    /// retry, or still queued until its deadline): runs of the schedule never overlap.
    #[serde(default)]
    pub no_overlap: bool,
}

/// Why a schedule is invalid.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error("schedule {id:?}: {error}")]
    Cron {
        /// The schedule.
        id: String,
        /// What is wrong.
        error: CronError,
    },
    /// The time zone is not in the tz database.
    #[error(
        "schedule {id:?}: unknown time zone {timezone:?} (use an IANA name such as Europe/Berlin)"
    )]
    TimeZone {
        /// The schedule.
        id: String,
        /// The name given.
        timezone: String,
    },
    /// Something else is wrong with it.
    #[error("schedule {id:?}: {reason}")]
    Invalid {
        /// The schedule.
        id: String,
        /// What.
        reason: String,
    },
}

/// A schedule checked and ready to compute ticks.
#[derive(Clone)]
pub struct Compiled {
    spec: ScheduleSpec,
    when: When,
}

#[derive(Clone)]
enum When {
    Cron(Box<Cron>, TimeZone),
    Every(u64),
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiled")
            .field("spec", &self.spec)
            .finish()
    }
}

impl ScheduleSpec {
    /// A schedule of `task` on a cron expression (UTC unless [`ScheduleSpec::in_timezone`]).
    pub fn cron(id: impl Into<String>, task: impl Into<String>, expr: impl Into<String>) -> Self {
        Self::new(
            id,
            task,
            Timing::Cron {
                expr: expr.into(),
                timezone: None,
            },
        )
    }

    /// A schedule of `task` every `seconds`.
    pub fn every(id: impl Into<String>, task: impl Into<String>, seconds: u64) -> Self {
        Self::new(id, task, Timing::Every { seconds })
    }

    fn new(id: impl Into<String>, task: impl Into<String>, timing: Timing) -> Self {
        ScheduleSpec {
            id: id.into(),
            task: task.into(),
            timing,
            args: Vec::new(),
            kwargs: Map::new(),
            queue: None,
            missed: MissedTicks::default(),
            no_overlap: false,
        }
    }

    /// The cron expression's time zone (an IANA name).
    pub fn in_timezone(mut self, tz: impl Into<String>) -> Self {
        if let Timing::Cron { timezone, .. } = &mut self.timing {
            *timezone = Some(tz.into());
        }
        self
    }

    /// The calls' positional arguments.
    pub fn with_args(mut self, args: Vec<Value>) -> Self {
        self.args = args;
        self
    }

    /// The calls' keyword arguments.
    pub fn with_kwargs(mut self, kwargs: Map<String, Value>) -> Self {
        self.kwargs = kwargs;
        self
    }

    /// The queue (lane) to send to.
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// What to do with missed ticks.
    pub fn with_missed(mut self, missed: MissedTicks) -> Self {
        self.missed = missed;
        self
    }

    /// Skip every tick while the latest tick sent has not finished (running, waiting for a
    /// retry, or still queued until its deadline): runs of the schedule never overlap.
    pub fn without_overlap(mut self) -> Self {
        self.no_overlap = true;
        self
    }

    /// The task id of the tick due at `at_unix` seconds: the same for every scheduler.
    pub fn tick_id(&self, at_unix: i64) -> TaskId {
        TaskId::derived(&["ferriq-schedule", &self.id, &at_unix.to_string()])
    }

    /// Checks the schedule (cron syntax, time zone, interval).
    pub fn compile(&self) -> Result<Compiled, ScheduleError> {
        let invalid = |reason: &str| ScheduleError::Invalid {
            id: self.id.clone(),
            reason: reason.to_owned(),
        };
        if self.id.is_empty() || self.id.len() > 200 || self.id.contains(['{', '}']) {
            return Err(invalid("ids are 1-200 characters without braces"));
        }
        if self.task.is_empty() {
            return Err(invalid("no task name"));
        }
        let when = match &self.timing {
            Timing::Every { seconds: 0 } => return Err(invalid("every 0 seconds")),
            Timing::Every { seconds } => When::Every(*seconds),
            Timing::Cron { expr, timezone } => {
                let cron = Cron::parse(expr).map_err(|error| ScheduleError::Cron {
                    id: self.id.clone(),
                    error,
                })?;
                let tz = match timezone.as_deref() {
                    None | Some("UTC") | Some("Etc/UTC") => TimeZone::UTC,
                    Some(name) => TimeZone::get(name).map_err(|_| ScheduleError::TimeZone {
                        id: self.id.clone(),
                        timezone: name.to_owned(),
                    })?,
                };
                When::Cron(Box::new(cron), tz)
            }
        };
        Ok(Compiled {
            spec: self.clone(),
            when,
        })
    }
}

impl Compiled {
    /// The schedule.
    pub fn spec(&self) -> &ScheduleSpec {
        &self.spec
    }

    /// The first tick strictly after `after_unix` seconds; `None` when there is none within
    /// 100 years.
    pub fn next_after(&self, after_unix: i64) -> Option<i64> {
        match &self.when {
            When::Every(n) => {
                let n = *n as i64;
                Some(after_unix.div_euclid(n).checked_add(1)?.checked_mul(n)?)
            }
            When::Cron(cron, tz) => {
                let after = Timestamp::from_second(after_unix).ok()?;
                cron.next_after(after, tz).map(Timestamp::as_second)
            }
        }
    }

    /// Every tick in `(after, until]`, oldest first, at most `limit` (the latest kept).
    pub fn ticks_between(&self, after: i64, until: i64, limit: usize) -> Vec<i64> {
        let mut ticks = std::collections::VecDeque::new();
        let mut t = after;
        while let Some(next) = self.next_after(t).filter(|n| *n <= until) {
            ticks.push_back(next);
            if ticks.len() > limit {
                ticks.pop_front();
            }
            t = next;
            // A fast interval over a long outage: jump near the end instead of walking.
            if let When::Every(n) = self.when {
                let n = n as i64;
                let skip_to = until - n * (limit as i64 + 1);
                if t < skip_to {
                    t = skip_to.div_euclid(n) * n;
                }
            }
        }
        ticks.into()
    }
}
