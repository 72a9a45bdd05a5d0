//! What stores keep for flow control: rate limiters shared by every worker.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    ClaimAsk, CompleteOutcome, FailureRecord, Gated, HeldSlot, LimitGate, StoreError, Token,
};
use crate::wire::{TaskId, TaskResult};

/// At most `limit` starts in any window of `period`, across every worker: `"50/s"`, `"300/m"`,
/// `"1000/h"`. Starts over it are not run, failed or counted as attempts: they wait, each for
/// its own later turn.
///
/// ```
/// use std::time::Duration;
/// use ferriq::task::Rate;
/// let r = Rate::parse("50/s").unwrap();
/// assert_eq!((r.limit(), r.period()), (50, Duration::from_secs(1)));
/// assert_eq!(Rate::parse("5/10s").unwrap().period(), Duration::from_secs(10));
/// assert_eq!(r.to_string(), "50/s");
/// assert!(Rate::parse("fast").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    limit: u32,
    period: Duration,
}

impl Rate {
    /// `limit` starts per `period` (a limit of 0 reads as 1; a period under a millisecond as a
    /// millisecond).
    pub const fn new(limit: u32, period: Duration) -> Self {
        let limit = if limit == 0 { 1 } else { limit };
        let period = if period.as_millis() == 0 {
            Duration::from_millis(1)
        } else {
            period
        };
        Rate { limit, period }
    }

    /// Reads `N/s`, `N/m`, `N/h` or `N/<count><ms|s|m|h>` (`5/10s`, `10/500ms`): what the
    /// `rate` task option and the `ferriq_rate` label hold.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let bad =
            || format!("rate {text:?}: write starts per period, as 50/s, 300/m, 1000/h or 5/10s");
        let (limit, per) = text.trim().split_once('/').ok_or_else(bad)?;
        let limit: u32 = limit.trim().parse().map_err(|_| bad())?;
        let per = per.trim();
        let unit_at = per.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let count: u64 = match &per[..unit_at] {
            "" => 1,
            digits => digits.parse().map_err(|_| bad())?,
        };
        let unit_ms = match &per[unit_at..] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        if limit == 0 || count == 0 {
            return Err(bad());
        }
        let ms = count.checked_mul(unit_ms).ok_or_else(bad)?;
        Ok(Rate::new(limit, Duration::from_millis(ms)))
    }

    /// Starts allowed per period.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The window the limit counts over.
    pub const fn period(&self) -> Duration {
        self.period
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.period.subsec_nanos() != 0 {
            // What `parse` reads back (a period of whole milliseconds, as `new` keeps it).
            return write!(f, "{}/{}ms", self.limit, self.period.as_millis());
        }
        let secs = self.period.as_secs();
        let (count, unit) = if secs.is_multiple_of(3600) {
            (secs / 3600, "h")
        } else if secs.is_multiple_of(60) {
            (secs / 60, "m")
        } else {
            (secs, "s")
        };
        match count {
            1 => write!(f, "{}/{unit}", self.limit),
            _ => write!(f, "{}/{count}{unit}", self.limit),
        }
    }
}

/// A rate limiter's answer for one start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RateDecision {
    /// Start now: the start is counted.
    Run,
    /// Not now: this task's turn comes after this long (it holds that turn: asking again
    /// then runs it, unless late starts filled the window meanwhile).
    Wait(Duration),
}

/// A concurrency limiter's answer for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotDecision {
    /// The task holds a slot now, taken by this ask (for the lease given; renew it with the
    /// run's heartbeats and release it when the run ends).
    Held,
    /// The task held a slot already and still does (its lease renewed): a run of it whose
    /// worker died, or a copy of it running now. This ask took nothing: the slot belongs to
    /// the run that holds the task's claim, and a copy told `Done`, `Revoked` or `Defer` by
    /// its claim leaves it alone.
    AlreadyHeld,
    /// Every slot is taken: ask again after this long (an estimate of when this task's turn
    /// among the waiting comes; it keeps its place meanwhile).
    Wait(Duration),
}

/// What a debounced enqueue is to do ([`FlowStore::debounce`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DebounceTurn {
    /// No task of the key waits: this enqueue's task is the key's, sent as it is.
    New,
    /// A task of the key waits: send a copy of it — its id, this enqueue's arguments, the
    /// `ferriq_debounce_seq` label `seq` — due a window from now. The copy with the highest
    /// `seq` runs once the key is quiet; the earlier ones are acked unrun.
    Joined {
        /// The waiting task.
        task: TaskId,
        /// This enqueue's place among the key's enqueues (the first is 1).
        seq: u64,
    },
}

/// A debounced copy's turn, as the worker asks for it ([`FlowStore::take_debounced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Debounced {
    /// Its key was enqueued again since: come back after this long.
    Wait(Duration),
    /// Run it (the claims decide whether it already ran): the latest copy with its key quiet,
    /// a redelivery of the copy let run, or a copy the store knows nothing of (a producer that
    /// does not debounce, or lost state).
    Run,
    /// A later enqueue's copy replaced it: ack it, run nothing.
    Superseded,
}

/// What an operator set at run time over the limits tasks declare (and over the labels
/// producers set): read by every worker within [`OVERRIDES_REFRESH`]. A field left `None` keeps
/// what the task declares.
///
/// ```
/// use ferriq::store::LimitOverride;
/// use ferriq::task::Rate;
/// let o = LimitOverride::default().rate(Rate::parse("10/s").unwrap()).concurrency(2);
/// assert_eq!(o.to_string(), "rate 10/s, concurrency 2");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LimitOverride {
    /// The rate limit, instead of the declared one.
    pub rate: Option<Rate>,
    /// The number of slots, instead of the declared one.
    pub concurrency: Option<u32>,
}

impl LimitOverride {
    /// With this rate limit.
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// With this many slots (0 reads as 1).
    pub fn concurrency(mut self, slots: u32) -> Self {
        self.concurrency = Some(slots.max(1));
        self
    }

    /// The form stores keep: `{"rate":"10/s","concurrency":2}`.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "rate": self.rate.map(|r| r.to_string()),
            "concurrency": self.concurrency,
        })
        .to_string()
    }

    /// Reads [`LimitOverride::to_json`]'s form (what it cannot read is left `None`).
    pub fn from_json(text: &str) -> Self {
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        LimitOverride {
            rate: v["rate"].as_str().and_then(|r| Rate::parse(r).ok()),
            concurrency: v["concurrency"]
                .as_u64()
                .map(|n| n.clamp(1, u64::from(u32::MAX)) as u32),
        }
    }
}

impl std::fmt::Display for LimitOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.rate, self.concurrency) {
            (Some(r), Some(c)) => write!(f, "rate {r}, concurrency {c}"),
            (Some(r), None) => write!(f, "rate {r}"),
            (None, Some(c)) => write!(f, "concurrency {c}"),
            (None, None) => f.write_str("none"),
        }
    }
}

/// Part of the [`FlowStore`] contract: a task back this much before its turn (rate) or its
/// time to come back (concurrency) still counts as on time — brokers round the times they
/// hand messages back for.
pub const TURN_GRACE: Duration = Duration::from_millis(2);

/// Part of the [`FlowStore`] contract: a task waiting for a concurrency slot that is late by
/// more than this keeps no free slot for itself. Hand-backs come back a little late (SQS
/// rounds them up to whole seconds, a receive takes its time), so a slot is kept a while for
/// the task whose turn it is; one that does not come back at all (its message purged,
/// dead-lettered, or held by a worker that died) must not keep a slot from everyone else.
pub const TURN_LATE: Duration = Duration::from_secs(1);

/// How soon a worker applies a limit changed at run time: it reads the overrides this often.
pub const OVERRIDES_REFRESH: Duration = Duration::from_secs(2);

/// What a limiter limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimiterKind {
    /// Starts per period.
    Rate,
    /// Runs at once.
    Concurrency,
}

impl LimiterKind {
    /// `rate` or `concurrency`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LimiterKind::Rate => "rate",
            LimiterKind::Concurrency => "concurrency",
        }
    }
}

/// A limiter a worker used, and the limit it applied (a [`Rate`] as text, or a slot count).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimiterSeen {
    /// What it limits.
    pub kind: LimiterKind,
    /// Its name: the task name, or the task name, a newline and the key's value.
    pub limiter: String,
    /// The limit applied: `50/s`, or `4`.
    pub limit: String,
}

/// A limiter's use, as [`FlowStore::limiters`] reads it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LimiterUsage {
    /// The limiter and the limit last applied to it.
    pub seen: LimiterSeen,
    /// Rate: starts in the last period. Concurrency: slots held now.
    pub used: u64,
    /// Tasks handed back that wait for their turn or a slot.
    pub waiting: u64,
    /// When a worker last reported it (unix seconds).
    pub last_seen: f64,
}

impl LimiterUsage {
    /// A limiter's use, as a store reads it.
    pub fn new(seen: LimiterSeen, used: u64, waiting: u64, last_seen: f64) -> Self {
        LimiterUsage {
            seen,
            used,
            waiting,
            last_seen,
        }
    }
}

/// Rate limiters, one atomic decision per call. Object-safe.
///
/// A limiter lets at most `rate.limit()` starts happen in any window of `rate.period()`,
/// counted from the starts it granted. A start it refuses gets a turn: the earliest time the
/// limiter's schedule has room, after every turn handed out before it, so the tasks waiting
/// on one limiter come back one after another instead of all at once.
#[async_trait]
pub trait FlowStore: Send + Sync + 'static {
    /// Decides whether task `id` may start now under limiter `limiter` at `rate`.
    async fn admit_rate(
        &self,
        limiter: &str,
        id: &TaskId,
        rate: Rate,
    ) -> Result<RateDecision, StoreError> {
        let _ = (limiter, id, rate);
        Err(StoreError::Config(
            "this store keeps no rate limiters: use one that does (Valkey, memory) for tasks \
             with a rate"
                .into(),
        ))
    }

    /// Takes one of `limit` slots of `limiter` for task `id`'s run, for `lease` (a task that
    /// holds one already — its redelivery, or a copy of it — keeps it:
    /// [`SlotDecision::AlreadyHeld`]). Slots whose lease ran out (their worker
    /// died) are free. The tasks waiting take free slots in the order they were told to come
    /// back.
    async fn acquire_slot(
        &self,
        limiter: &str,
        id: &TaskId,
        limit: u32,
        lease: Duration,
    ) -> Result<SlotDecision, StoreError> {
        let _ = (limiter, id, limit, lease);
        Err(StoreError::Config(
            "this store keeps no concurrency limiters: use one that does (Valkey, memory) for \
             tasks with a concurrency limit"
                .into(),
        ))
    }

    /// Extends the slots held by these runs (`(limiter, task id)`) to `lease` from now; a slot
    /// the store lost (it restarted without its data) is taken again, so a restart lets at
    /// most one heartbeat interval's starts past the limit.
    async fn renew_slots(
        &self,
        slots: &[(String, TaskId)],
        lease: Duration,
    ) -> Result<(), StoreError> {
        let _ = (slots, lease);
        Ok(())
    }

    /// Frees task `id`'s slot of `limiter`: its run ended after holding it for `held` (folded
    /// into the limiter's average, which times the waiting tasks' returns; `held` zero — a
    /// copy of a finished task that took the slot and did not run — is not).
    async fn release_slot(
        &self,
        limiter: &str,
        id: &TaskId,
        held: Duration,
    ) -> Result<(), StoreError> {
        let _ = (limiter, id, held);
        Ok(())
    }

    /// The limit's decision for task `id` and, when it lets the task start, its claim (as
    /// [`ClaimStore::claim`](super::ClaimStore::claim) answers), in one round trip: what a
    /// limit that does not bind then costs is the limiter's steps in the store, not a round
    /// trip of its own. `None`, the default: this store answers them apart (the worker asks
    /// [`admit_rate`](Self::admit_rate) or [`acquire_slot`](Self::acquire_slot), then claims).
    /// A store that answers must decide exactly as those two calls in turn would.
    async fn claim_past_limit(
        &self,
        gate: LimitGate<'_>,
        id: &TaskId,
        claim: ClaimAsk<'_>,
    ) -> Option<Result<Gated, StoreError>> {
        let _ = (gate, id, claim);
        None
    }

    /// [`ResultStore::complete`](super::ResultStore::complete), and the run's concurrency
    /// `slot` freed (as [`release_slot`](Self::release_slot) would) unless the write answered
    /// [`CompleteOutcome::Stale`] — the task's claim belongs to another run then, and the
    /// task's slot with it — or failed (the worker keeps the result for the redelivery, which
    /// takes the slot again). One round trip. `None`, the default: this store does them
    /// apart.
    async fn complete_freeing_slot(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
        slot: HeldSlot<'_>,
    ) -> Option<Result<CompleteOutcome, StoreError>> {
        let _ = (id, token, result, reply_to, slot);
        None
    }

    /// [`ClaimStore::record_failure`](super::ClaimStore::record_failure) (the failed attempt
    /// counted, its claim given back), and the run's concurrency `slot` freed (as
    /// [`release_slot`](Self::release_slot) would) when the failure is recorded — not when
    /// the token is stale (the claim, and the task's slot, are another run's) or the call
    /// fails. One step: freed apart, a copy of the task that claims between the two runs in
    /// a slot freed under it. `None`, the default: this store does them apart.
    async fn record_failure_freeing_slot(
        &self,
        id: &TaskId,
        token: Token,
        slot: HeldSlot<'_>,
    ) -> Option<Result<FailureRecord, StoreError>> {
        let _ = (id, token, slot);
        None
    }

    /// Reserves deduplication `key` for task `id` for `ttl`: `None` when it is `id`'s now
    /// (or was already), else the task that holds it.
    async fn reserve_dedup(
        &self,
        key: &str,
        id: &TaskId,
        ttl: Duration,
    ) -> Result<Option<TaskId>, StoreError> {
        let _ = (key, id, ttl);
        Err(StoreError::Config(
            "this store keeps no deduplication keys: use one that does (Valkey, memory) for \
             unique_for"
                .into(),
        ))
    }

    /// Releases deduplication `key` if task `id` holds it (its outcome is stored).
    async fn release_dedup(&self, key: &str, id: &TaskId) -> Result<(), StoreError> {
        let _ = (key, id);
        Ok(())
    }

    /// Debounces an enqueue of task `id` under `key`, due `window` from now: a task of the key
    /// still waiting takes this enqueue (its quiet time starts again) and the caller sends a
    /// copy of it; otherwise `id` becomes the key's waiting task. Every enqueue sends a
    /// message, so no enqueue depends on another's publish.
    async fn debounce(
        &self,
        key: &str,
        id: &TaskId,
        window: Duration,
    ) -> Result<DebounceTurn, StoreError> {
        let _ = (key, id, window);
        Err(StoreError::Config(
            "this store keeps no deduplication keys: use one that does (Valkey, memory) for \
             debounced tasks"
                .into(),
        ))
    }

    /// The worker's question for copy `seq` of debounced task `id` of `key` when it is due.
    /// The latest copy, its key quiet, marks the task let run (the key's next enqueue starts
    /// a new task).
    async fn take_debounced(
        &self,
        key: &str,
        id: &TaskId,
        seq: u64,
    ) -> Result<Debounced, StoreError> {
        let _ = (key, id, seq);
        Ok(Debounced::Run)
    }

    /// Sets the limits of `target` (a task name, or a task name, a newline and a key's value)
    /// over the declared ones; `None` removes what was set. Returns whether one was set before.
    async fn set_limit_override(
        &self,
        target: &str,
        limits: Option<LimitOverride>,
    ) -> Result<bool, StoreError> {
        let _ = (target, limits);
        Err(StoreError::Config(
            "this store keeps no limits: use one that does (Valkey, memory)".into(),
        ))
    }

    /// Every override set, by target.
    async fn limit_overrides(&self) -> Result<Vec<(String, LimitOverride)>, StoreError> {
        Ok(Vec::new())
    }

    /// Notes limiters a worker used lately (off the hot path, batched), so operators can list
    /// them; a limiter not noted for a day is forgotten.
    async fn note_limiters(&self, seen: &[LimiterSeen]) -> Result<(), StoreError> {
        let _ = seen;
        Ok(())
    }

    /// The limiters noted in the last day, with their use now.
    async fn limiters(&self) -> Result<Vec<LimiterUsage>, StoreError> {
        Ok(Vec::new())
    }
}

/// How long a limiter nobody used stays listed.
pub const LIMITER_LISTED_FOR: Duration = Duration::from_secs(24 * 3600);

/// The rate-limit decision, on any clock (seconds), over a limiter's state. Shared by the memory
/// store; the Valkey store runs the same steps in one script.
#[cfg(feature = "memory")]
#[derive(Debug, Default)]
pub(crate) struct RateState {
    /// Granted starts, newest first, at most `limit`.
    started: std::collections::VecDeque<f64>,
    /// Turns handed out (granted starts and reservations), newest first, at most `limit`.
    planned: std::collections::VecDeque<f64>,
    /// Reserved turns by task.
    reserved: std::collections::HashMap<TaskId, f64>,
    /// The period of the latest decision (for the usage read).
    period: f64,
}

/// [`TURN_GRACE`] in seconds, as the memory store's limiters count time.
#[cfg(feature = "memory")]
const TURN_GRACE_S: f64 = TURN_GRACE.as_secs_f64();

/// [`TURN_LATE`] in seconds.
#[cfg(feature = "memory")]
const TURN_LATE_S: f64 = TURN_LATE.as_secs_f64();

#[cfg(feature = "memory")]
impl RateState {
    pub(crate) fn admit(&mut self, id: &TaskId, rate: Rate, now: f64) -> RateDecision {
        let n = rate.limit() as usize;
        let period = rate.period().as_secs_f64();
        let keep = (period * 10.0).max(60.0);
        self.period = period;
        self.reserved.retain(|_, at| *at > now - keep);
        // Room for a start now, or when there will be.
        let free_at = match self.started.get(n - 1) {
            Some(oldest) if *oldest > now - period => oldest + period,
            _ => now,
        };
        let wait = |at: f64| RateDecision::Wait(Duration::from_secs_f64((at - now).max(0.0)));
        if let Some(&turn) = self.reserved.get(id) {
            if turn > now + TURN_GRACE_S {
                return wait(turn);
            }
            if free_at > now {
                // Starts that came late filled the window: a turn when it has room.
                self.reserved.insert(id.clone(), free_at);
                return wait(free_at);
            }
            self.reserved.remove(id);
            return self.start(n, now);
        }
        let mut turn = now.max(free_at);
        if let Some(newest) = self.planned.front() {
            turn = turn.max(*newest);
        }
        if let Some(nth) = self.planned.get(n - 1) {
            turn = turn.max(nth + period);
        }
        self.planned.push_front(turn);
        self.planned.truncate(n);
        if turn <= now + TURN_GRACE_S && free_at <= now {
            return self.start(n, now);
        }
        self.reserved.insert(id.clone(), turn);
        wait(turn)
    }

    /// Starts in the last period, turns reserved.
    pub(crate) fn usage(&self, now: f64) -> (u64, u64) {
        let used = self
            .started
            .iter()
            .filter(|at| **at > now - self.period)
            .count();
        (used as u64, self.reserved.len() as u64)
    }

    fn start(&mut self, n: usize, now: f64) -> RateDecision {
        self.started.push_front(now);
        self.started.truncate(n);
        RateDecision::Run
    }
}

/// A concurrency limiter's state, on any clock (seconds), for the memory store; the Valkey
/// store runs the same steps in one script.
#[cfg(feature = "memory")]
#[derive(Debug, Default)]
pub(crate) struct SlotState {
    /// Slots held: task → lease end.
    held: std::collections::HashMap<TaskId, f64>,
    /// Tasks waiting: task → when it was told to come back.
    waiting: std::collections::HashMap<TaskId, f64>,
    /// How long a run holds a slot, on average (seconds).
    average_run: Option<f64>,
}

#[cfg(feature = "memory")]
impl SlotState {
    pub(crate) fn acquire(
        &mut self,
        id: &TaskId,
        limit: u32,
        lease: f64,
        now: f64,
    ) -> SlotDecision {
        self.held.retain(|_, until| *until > now);
        self.waiting.retain(|_, back| *back > now - 3600.0);
        if let Some(until) = self.held.get_mut(id) {
            *until = now + lease;
            return SlotDecision::AlreadyHeld;
        }
        let free = (limit as usize).saturating_sub(self.held.len());
        let mine = self.waiting.get(id).copied();
        if let Some(back) = mine {
            if back > now + TURN_GRACE_S {
                return SlotDecision::Wait(Duration::from_secs_f64(back - now));
            }
        }
        // The waiting tasks before this one (all of them, for one not waiting yet): those due
        // back by now go first to a free slot; every one counts toward its turn.
        let before = |back: f64| mine.is_none_or(|m| back < m);
        let (mut due, mut ahead, mut oldest_due) = (0, 0, f64::INFINITY);
        for (other, back) in &self.waiting {
            if other != id && before(*back) {
                ahead += 1;
                if *back <= now + TURN_GRACE_S && *back > now - TURN_LATE_S {
                    due += 1;
                    oldest_due = oldest_due.min(*back);
                }
            }
        }
        if due < free {
            self.waiting.remove(id);
            self.held.insert(id.clone(), now + lease);
            return SlotDecision::Held;
        }
        // A slot whose worker died frees itself when its lease runs out: nobody waits past
        // the first lease end (and a moment), so a dead run's slot is taken again soon after.
        // A live holder's lease keeps moving ahead with its heartbeats, so this adds a
        // receive per waiter and lease at most.
        let first_end = self
            .held
            .values()
            .map(|until| until - now)
            .fold(f64::INFINITY, f64::min);
        let mut wait = slot_wait(ahead, limit, self.average_run).min((first_end + 0.05).max(0.25));
        if free > 0 {
            // A slot is free but kept for tasks due back now: if they are not back in time,
            // it is this one's turn.
            wait = wait.min((oldest_due + TURN_LATE_S - now + 0.05).max(0.25));
        }
        let back = now + wait;
        self.waiting.insert(id.clone(), back);
        SlotDecision::Wait(Duration::from_secs_f64(back - now))
    }

    /// Slots held now, tasks waiting.
    pub(crate) fn usage(&self, now: f64) -> (u64, u64) {
        let held = self.held.values().filter(|until| **until > now).count();
        (held as u64, self.waiting.len() as u64)
    }

    /// Extends a run's slot. A slot missing while no run was ever counted was lost with the
    /// state (a store restarted without its data): taken again, the runs still going count
    /// against the limit again; otherwise it was released or ran out, and stays free.
    pub(crate) fn renew(&mut self, id: &TaskId, lease: f64, now: f64) {
        match self.held.get_mut(id) {
            Some(until) => *until = now + lease,
            None if self.average_run.is_none() => {
                self.held.insert(id.clone(), now + lease);
            }
            None => {}
        }
    }

    pub(crate) fn release(&mut self, id: &TaskId, ran: f64) {
        if self.held.remove(id).is_none() {
            return;
        }
        // A slot freed by a copy that never ran (`ran` zero) says nothing of how long runs
        // take; it still marks the limiter as used (see `renew`), at the default estimate.
        self.average_run = Some(match self.average_run {
            Some(a) if ran > 0.0 => a * 0.8 + ran * 0.2,
            Some(a) => a,
            None if ran > 0.0 => ran,
            None => DEFAULT_RUN_S,
        });
    }
}

/// How long a run holds a slot before a limiter has timed one (seconds): the Valkey store's
/// scripts assume the same (`1000000` µs).
#[cfg(feature = "memory")]
const DEFAULT_RUN_S: f64 = 1.0;

/// How long a task with `ahead` due waiters before it waits for a slot: its turn comes after
/// `ahead / limit` rounds of the average run, and at least a second (every hand-back costs a
/// receive).
#[cfg(feature = "memory")]
fn slot_wait(ahead: usize, limit: u32, average_run: Option<f64>) -> f64 {
    let run = average_run.unwrap_or(DEFAULT_RUN_S).clamp(0.05, 600.0);
    let rounds = (ahead / limit.max(1) as usize + 1) as f64;
    (rounds * run).clamp(1.0, 600.0)
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use super::*;

    /// Every start the limiter grants, for `tasks` arriving at once and each asking again at
    /// its turn, on a clock that jumps from one answer to the next.
    fn run_all(rate: Rate, tasks: usize) -> (Vec<f64>, usize) {
        let mut state = RateState::default();
        let mut asks = 0;
        let mut queue: Vec<(f64, TaskId)> = (0..tasks).map(|_| (0.0, TaskId::random())).collect();
        let mut starts = Vec::new();
        while let Some(i) = (0..queue.len()).min_by(|a, b| queue[*a].0.total_cmp(&queue[*b].0)) {
            let (at, id) = queue.swap_remove(i);
            asks += 1;
            match state.admit(&id, rate, at) {
                RateDecision::Run => starts.push(at),
                RateDecision::Wait(d) => queue.push((at + d.as_secs_f64(), id)),
            }
        }
        (starts, asks)
    }

    #[test]
    fn no_window_holds_more_starts_than_the_limit_and_each_task_asks_twice_at_most() {
        let rate = Rate::new(50, Duration::from_secs(1));
        let (starts, asks) = run_all(rate, 500);
        assert_eq!(starts.len(), 500);
        for (i, s) in starts.iter().enumerate() {
            let in_window = starts[i..].iter().take_while(|t| **t < s + 1.0).count();
            assert!(in_window <= 50, "{in_window} starts in the second from {s}");
        }
        // The first 50 at once, then the rest by turns: 10 periods for 500.
        let last = starts.iter().cloned().fold(0.0, f64::max);
        assert!((8.9..=9.1).contains(&last), "{last}");
        assert!(asks <= 1000, "{asks} asks for 500 tasks");
    }

    #[test]
    fn a_late_start_never_overfills_a_window() {
        let rate = Rate::new(2, Duration::from_secs(1));
        let mut state = RateState::default();
        let ids: Vec<TaskId> = (0..4).map(|_| TaskId::random()).collect();
        assert_eq!(state.admit(&ids[0], rate, 0.0), RateDecision::Run);
        assert_eq!(state.admit(&ids[1], rate, 0.0), RateDecision::Run);
        // Turns at 1.0 and 1.0 (the third and fourth of the window after).
        let turn = |d: RateDecision| match d {
            RateDecision::Wait(d) => d.as_secs_f64(),
            RateDecision::Run => 0.0,
        };
        assert!((turn(state.admit(&ids[2], rate, 0.0)) - 1.0).abs() < 1e-9);
        assert!((turn(state.admit(&ids[3], rate, 0.0)) - 1.0).abs() < 1e-9);
        // The third comes at its turn; the fourth comes back before it: early, it waits.
        assert_eq!(state.admit(&ids[2], rate, 1.0), RateDecision::Run);
        assert!(turn(state.admit(&ids[3], rate, 0.5)) > 0.4);
        assert_eq!(state.admit(&ids[3], rate, 1.0), RateDecision::Run);
        // A new one now waits for the next window.
        assert!((turn(state.admit(&TaskId::random(), rate, 1.0)) - 1.0).abs() < 1e-9);
    }
}
