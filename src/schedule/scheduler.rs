//! The scheduler: sends each schedule's ticks, a little ahead and with their due time. Any
//! number may run; the leader lease keeps the others quiet in normal operation.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{Compiled, MissedTicks, ScheduleError, ScheduleSpec, Timing};
use crate::broker::{Broker, OutgoingMessage};
use crate::clock::Clock;
use crate::store::{ClaimState, ResultStatus, Store, StoreError};
use crate::wire::{names, Labels, TaskMessage};
use crate::Shutdown;

/// A tick due more than this long ago is missed (its schedule's policy decides).
const GRACE_SECS: f64 = 1.0;

/// How long after its time a tick may still start: a tick is worth running near its time, and
/// a later tick follows. Workers park it later, as `expired` (logged, redrivable).
const TICK_DEADLINE_SECS: i64 = 24 * 3600;

/// How long a send of run-time ticks may take before a removal stops waiting for it.
pub(crate) const SENDING_LIMIT: Duration = Duration::from_secs(60);

/// Every schedule declared with `#[task(schedule = …)]` or `#[task(every = …)]` in this binary.
pub fn static_schedules() -> Result<Vec<ScheduleSpec>, ScheduleError> {
    let mut out = Vec::new();
    for reg in inventory::iter::<crate::task::TaskRegistration> {
        let Some(s) = reg.schedule else { continue };
        let invalid = |reason: String| ScheduleError::Invalid {
            id: reg.name.to_owned(),
            reason,
        };
        let timing = match (s.cron, s.every) {
            (Some(expr), _) => Timing::Cron {
                expr: expr.to_owned(),
                timezone: s.timezone.map(str::to_owned),
            },
            (None, Some(seconds)) => Timing::Every { seconds },
            (None, None) => continue,
        };
        let args: Vec<Value> = serde_json::from_str(s.args)
            .map_err(|e| invalid(format!("schedule_args is not a JSON array: {e}")))?;
        let missed = match s.missed {
            "skip" => MissedTicks::Skip,
            "catch_up" => MissedTicks::CatchUp {
                max: s.catch_up_max,
            },
            _ => MissedTicks::Latest,
        };
        let spec = ScheduleSpec {
            id: reg.name.to_owned(),
            task: reg.name.to_owned(),
            timing,
            args,
            kwargs: Default::default(),
            queue: reg.options.get_queue().map(str::to_owned),
            missed,
            no_overlap: s.no_overlap,
        };
        spec.compile()?;
        out.push(spec);
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Builds a [`Scheduler`].
#[derive(Debug)]
pub struct SchedulerBuilder {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    clock: Clock,
    id: String,
    lease: Duration,
    lookahead: Duration,
    leader_election: bool,
    declared: bool,
}

impl SchedulerBuilder {
    /// The wall clock ticks are computed on (default: the system clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// This scheduler's id in the leader lease (default: random).
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The leader lease (default 5 s): after a leader dies, another takes over within it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How far ahead ticks are sent with their due time (default 2 s).
    pub fn lookahead(mut self, lookahead: Duration) -> Self {
        self.lookahead = lookahead;
        self
    }

    /// Whether to take part in the leader election (default) or send every tick regardless
    /// (several such schedulers send the same ticks: still one run each).
    pub fn leader_election(mut self, on: bool) -> Self {
        self.leader_election = on;
        self
    }

    /// Whether to send the schedules declared on tasks (`#[task(schedule = …)]`; default) or
    /// only those added at run time.
    pub fn declared_schedules(mut self, on: bool) -> Self {
        self.declared = on;
        self
    }

    /// Checks the declared schedules and builds the scheduler.
    pub fn build(self) -> Result<Scheduler, ScheduleError> {
        let declared = if self.declared {
            static_schedules()?
                .iter()
                .map(ScheduleSpec::compile)
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        Ok(Scheduler {
            inner: Arc::new(Inner {
                broker: self.broker,
                store: self.store,
                clock: self.clock,
                id: self.id,
                lease: self.lease.max(Duration::from_millis(300)),
                lookahead: self.lookahead,
                leader_election: self.leader_election,
                declared,
                recorded_declared: Default::default(),
            }),
        })
    }
}

/// Sends the ticks of every schedule — declared on tasks, and added at run time — to the
/// broker. Run one in any number of processes.
///
/// ```no_run
/// # async fn demo(client: ferriq::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let scheduler = ferriq::schedule::Scheduler::builder(client.broker().clone(), client.store().clone())
///     .build()?;
/// scheduler.run(ferriq::Shutdown::new()).await;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    clock: Clock,
    id: String,
    lease: Duration,
    lookahead: Duration,
    leader_election: bool,
    declared: Vec<Compiled>,
    /// Set once this scheduler, leading, recorded its declared schedules in the store.
    recorded_declared: std::sync::atomic::AtomicBool,
}

impl Scheduler {
    /// A builder for a scheduler on `broker` and `store`.
    pub fn builder(broker: Arc<dyn Broker>, store: Arc<dyn Store>) -> SchedulerBuilder {
        SchedulerBuilder {
            broker,
            store,
            clock: Clock::system(),
            id: format!(
                "scheduler-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            lease: Duration::from_secs(5),
            lookahead: Duration::from_secs(2),
            leader_election: true,
            declared: true,
        }
    }

    /// This scheduler's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Sends ticks until `shutdown` asks for a drain.
    pub async fn run(&self, shutdown: Shutdown) {
        let inner = &self.inner;
        tracing::info!(scheduler = %inner.id, declared = inner.declared.len(), "scheduler started");
        loop {
            let wake = match self.round().await {
                Ok(wake) => wake,
                Err(e) => {
                    tracing::warn!(error = %e, "scheduler round failed; trying again");
                    Duration::from_millis(500)
                }
            };
            tokio::select! {
                _ = shutdown.draining() => break,
                _ = tokio::time::sleep(wake) => {}
            }
        }
        tracing::info!(scheduler = %inner.id, "scheduler stopped");
    }

    /// One round: takes or keeps the lease, sends what is due; how long until the next round.
    pub async fn round(&self) -> Result<Duration, StoreError> {
        let inner = &self.inner;
        let beat = inner.lease / 3;
        if inner.leader_election && !inner.store.lead(&inner.id, inner.lease).await? {
            // Followers look often (one cheap call), so one takes over within about a lease
            // of the leader's last renewal.
            return Ok(inner.lease / 10);
        }
        if !inner
            .recorded_declared
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            let specs: Vec<ScheduleSpec> =
                inner.declared.iter().map(|c| c.spec().clone()).collect();
            inner.store.put_declared(&specs).await?;
            inner
                .recorded_declared
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let paused = inner.store.paused().await?;
        let now = inner.clock.now_unix();
        let mut next_due = f64::INFINITY;
        let mut schedules = inner.declared.clone();
        for spec in inner.store.schedules().await? {
            match spec.compile() {
                Ok(c) => schedules.push(c),
                Err(e) => tracing::warn!(error = %e, "skipping an invalid run-time schedule"),
            }
        }
        for compiled in &schedules {
            let runtime = !inner
                .declared
                .iter()
                .any(|d| d.spec().id == compiled.spec().id);
            let is_paused = paused.iter().any(|id| *id == compiled.spec().id);
            match self.send_due(compiled, now, runtime, is_paused).await {
                Ok(Some(send_at)) => next_due = next_due.min(send_at),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(schedule = %compiled.spec().id, error = %e, "sending ticks failed; trying again")
                }
            }
        }
        // Wake when the next tick is to be sent, and at least every third of the lease.
        let until_next = next_due - inner.clock.now_unix();
        let wake = Duration::from_secs_f64(until_next.clamp(0.01, beat.as_secs_f64()));
        Ok(wake)
    }

    /// Sends a schedule's due ticks; when to send its next one (unix seconds): as it enters
    /// the lookahead, or when it is due for a schedule without overlap (which sends nothing
    /// ahead, as it must see the previous run end first).
    async fn send_due(
        &self,
        compiled: &Compiled,
        now: f64,
        runtime: bool,
        paused: bool,
    ) -> Result<Option<f64>, SendError> {
        let ahead = self.ahead(compiled.spec());
        Ok(self
            .send_due_ticks(compiled, now, runtime, paused)
            .await?
            .map(|next| next as f64 - ahead))
    }

    /// How far ahead of their time the schedule's ticks are sent (seconds).
    fn ahead(&self, spec: &ScheduleSpec) -> f64 {
        if spec.no_overlap {
            0.0
        } else {
            self.inner.lookahead.as_secs_f64()
        }
    }

    /// Sends a schedule's due ticks (none while it is `paused`: they pass as handled, so a
    /// resume does not catch them up); the next tick after those sent.
    async fn send_due_ticks(
        &self,
        compiled: &Compiled,
        now: f64,
        runtime: bool,
        paused: bool,
    ) -> Result<Option<i64>, SendError> {
        let inner = &self.inner;
        let spec = compiled.spec();
        let horizon = (now + self.ahead(spec)).floor() as i64;
        let last = inner.store.last_tick(&spec.id).await?;
        let from = last.unwrap_or(now.floor() as i64 - 1);
        let ticks = compiled.ticks_between(from, horizon, 100_000);
        let (missed, due): (Vec<i64>, Vec<i64>) = ticks
            .into_iter()
            .partition(|t| (*t as f64) < now - GRACE_SECS);
        let kept_missed: Vec<i64> = match spec.missed {
            MissedTicks::Skip => Vec::new(),
            MissedTicks::Latest => missed.last().copied().into_iter().collect(),
            MissedTicks::CatchUp { max } => {
                let skip = missed.len().saturating_sub(max as usize);
                missed[skip..].to_vec()
            }
        };
        if missed.len() > kept_missed.len() {
            tracing::info!(schedule = %spec.id, missed = missed.len(), sent = kept_missed.len(), "ticks missed while no scheduler ran");
        }
        let mut send: Vec<i64> = kept_missed.into_iter().chain(due).collect();
        let newest = send.last().copied().or(missed.last().copied());
        let after = newest.unwrap_or(from).max(horizon);
        let next = compiled.next_after(after);
        let Some(newest) = newest else {
            return Ok(next);
        };
        if paused {
            send.clear();
        } else if spec.no_overlap {
            if let Some(previous) = self.previous_still_runs(spec, now).await? {
                tracing::info!(schedule = %spec.id, previous, "the previous tick has not finished: skipping");
                send.clear();
            } else {
                // Ticks sent together start together: of those caught up, only the latest.
                send.drain(..send.len().saturating_sub(1));
            }
        }
        if send.is_empty() {
            inner.store.record_tick(&spec.id, newest, false).await?;
            return Ok(next);
        }
        if runtime && !inner.store.begin_sending(&spec.id, SENDING_LIMIT).await? {
            // Removed meanwhile.
            return Ok(None);
        }
        let sent = self.publish(spec, &send).await;
        if runtime {
            inner.store.end_sending(&spec.id).await?;
        }
        sent?;
        inner.store.record_tick(&spec.id, newest, true).await?;
        tracing::debug!(schedule = %spec.id, ticks = send.len(), "ticks sent");
        Ok(next)
    }

    /// The schedule's latest sent tick when its run has not finished — checked on that tick,
    /// not on the latest tick handled (which may have been skipped, so never claimed). A run
    /// holding a live lease counts; until the tick's deadline passes (after which workers
    /// discard it), so does one whose lease lapsed (its worker died: another takes it over)
    /// or that waits for a retry, and a tick not started yet, unless a stored result says it
    /// ended without a claim (a backed-up queue would otherwise hold two ticks that free
    /// slots start together). Past the deadline a lapsed or unstarted tick no longer holds
    /// the schedule: one the broker parked (a task that kills its worker) stops it a day at
    /// most.
    async fn previous_still_runs(
        &self,
        spec: &ScheduleSpec,
        now: f64,
    ) -> Result<Option<i64>, StoreError> {
        let store = &self.inner.store;
        let Some(last) = store.last_sent_tick(&spec.id).await? else {
            return Ok(None);
        };
        let id = spec.tick_id(last);
        let live = (last + TICK_DEADLINE_SECS) as f64 > now;
        let unfinished = match store.claim_info(&id).await? {
            Some(claim) => match claim.state {
                ClaimState::Running => {
                    let lease_live = claim
                        .lease_until_ms
                        .is_some_and(|until| until as f64 > now * 1000.0);
                    lease_live || live
                }
                ClaimState::Released => live,
                _ => false,
            },
            None => live && matches!(store.get(&id).await?, ResultStatus::Pending),
        };
        Ok(unfinished.then_some(last))
    }

    async fn publish(&self, spec: &ScheduleSpec, ticks: &[i64]) -> Result<(), SendError> {
        let mut batch = Vec::with_capacity(ticks.len());
        for tick in ticks {
            let mut labels = Labels::new();
            // Always: this scheduler's clock may be ahead of the workers'; they hold the tick
            // until it is due by theirs.
            labels.insert_named(names::DUE_AT, *tick as f64);
            labels.insert_named(names::DEADLINE_AT, tick + TICK_DEADLINE_SECS);
            labels.insert_named(names::SCHEDULE, spec.id.as_str());
            labels.insert_named(names::TICK, *tick);
            if let Some(q) = &spec.queue {
                labels.insert_named(names::QUEUE_NAME, q.as_str());
            }
            let msg = TaskMessage {
                task_id: spec.tick_id(*tick),
                task_name: spec.task.as_str().into(),
                labels,
                args: spec.args.clone(),
                kwargs: spec.kwargs.clone(),
            };
            batch.push(OutgoingMessage::from_message_at(
                &msg,
                self.inner.clock.now_unix(),
            )?);
        }
        self.inner.broker.publish(batch).await?;
        Ok(())
    }
}

/// Why a schedule's ticks could not be sent this round.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Broker(#[from] crate::broker::BrokerError),
    #[error(transparent)]
    Wire(#[from] crate::wire::WireError),
}
