//! What stores keep for flow control: rate limiters shared by every worker.

use std::time::Duration;

use async_trait::async_trait;

use super::{
    ClaimAsk, CompleteOutcome, FailureRecord, Gated, HeldSlot, LimitGate, Rate, StoreError, Token,
};
use crate::wire::{TaskId, TaskResult};

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
