//! A claim behind a limit: the limiter's decision and, when it lets the task start, the claim,
//! asked for together so a store that keeps both answers them in one round trip
//! ([`FlowStore::claim_past_limit`](super::FlowStore::claim_past_limit)); and at the run's end
//! its result written and its slot freed together
//! ([`FlowStore::complete_freeing_slot`](super::FlowStore::complete_freeing_slot)).
//!
//! A limited task asked the limiter, then the claim store: two round trips per task where an
//! unlimited one makes one, and on a worker's pod each answer is a wake-up of the runtime. A
//! limit that does not bind is the common case (a rate set for a partner API's worst hour), so
//! it should cost a few operations in the store's script, not a round trip.

use std::time::Duration;

use super::ClaimOutcome;
use super::Rate;

/// The limit a claim passes first.
///
/// ```
/// use std::time::Duration;
/// use ferriq::store::LimitGate;
/// use ferriq::task::Rate;
/// let gate = LimitGate::Rate { limiter: "partner-api", rate: Rate::parse("50/s").unwrap() };
/// assert!(matches!(gate, LimitGate::Rate { limiter: "partner-api", .. }));
/// let slots = LimitGate::Slot { limiter: "db", limit: 4, lease: Duration::from_secs(30) };
/// assert!(matches!(slots, LimitGate::Slot { limit: 4, .. }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitGate<'a> {
    /// A start counted against rate limiter `limiter`
    /// ([`FlowStore::admit_rate`](super::FlowStore::admit_rate)).
    Rate {
        /// The limiter's name (its task, or its task and key).
        limiter: &'a str,
        /// Its rate.
        rate: Rate,
    },
    /// One of `limit` slots of concurrency limiter `limiter`, held for `lease`
    /// ([`FlowStore::acquire_slot`](super::FlowStore::acquire_slot)).
    Slot {
        /// The limiter's name.
        limiter: &'a str,
        /// Its number of slots.
        limit: u32,
        /// How long the slot is held unless renewed.
        lease: Duration,
    },
}

/// The claim a worker asks for once the limit lets the task start: its worker id, the lease
/// and the task's deadline, as [`ClaimStore::claim`](super::ClaimStore::claim) takes them.
///
/// ```
/// use std::time::Duration;
/// use ferriq::store::ClaimAsk;
/// let ask = ClaimAsk::new("worker-1", Duration::from_secs(30), None);
/// assert_eq!(ask.lease, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ClaimAsk<'a> {
    /// The worker asking.
    pub worker: &'a str,
    /// The claim's lease.
    pub lease: Duration,
    /// The task's deadline (unix seconds): a late claim is `Expired`.
    pub deadline_at: Option<f64>,
}

impl<'a> ClaimAsk<'a> {
    /// The claim `worker` asks for, with `lease`, of a task due by `deadline_at` (unix
    /// seconds), if it has a deadline.
    pub fn new(worker: &'a str, lease: Duration, deadline_at: Option<f64>) -> Self {
        ClaimAsk {
            worker,
            lease,
            deadline_at,
        }
    }
}

/// What a claim behind a limit came to.
///
/// ```
/// use std::time::Duration;
/// use ferriq::store::{ClaimOutcome, Gated};
/// let over = Gated::Wait(Duration::from_millis(20));
/// assert_eq!(over.claim(), None);
/// assert_eq!(Gated::Claimed(ClaimOutcome::Done).claim(), Some(ClaimOutcome::Done));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Gated {
    /// Over the limit: nothing was claimed and no start counted; the task's turn comes after
    /// this long (as [`RateDecision::Wait`](super::RateDecision::Wait) and
    /// [`SlotDecision::Wait`](super::SlotDecision::Wait) say).
    Wait(Duration),
    /// Within the limit (the start counted, or a slot taken for the task), then the claim's
    /// answer. The store keeps a slot per task: with [`ClaimOutcome::Defer`] it is the slot
    /// of the run holding the claim, and stays that run's; with `Done` or `Revoked` nothing
    /// runs under it, and it is freed; otherwise it is this run's until it ends.
    Claimed(ClaimOutcome),
    /// Within a concurrency limit because the task held a slot already
    /// ([`SlotDecision::AlreadyHeld`](super::SlotDecision::AlreadyHeld)), then the claim's
    /// answer. This ask took no slot: with `Run` or `Expired` the slot is this run's until
    /// it ends (the run before it died); with `Defer`, `Done` or `Revoked` it is left to the
    /// run that held it.
    ClaimedInHeldSlot(ClaimOutcome),
}

impl Gated {
    /// The claim's answer, if the limit let the task that far.
    pub fn claim(self) -> Option<ClaimOutcome> {
        match self {
            Gated::Claimed(claim) | Gated::ClaimedInHeldSlot(claim) => Some(claim),
            Gated::Wait(_) => None,
        }
    }
}

/// The concurrency slot a run held, freed with its result
/// ([`FlowStore::complete_freeing_slot`](super::FlowStore::complete_freeing_slot)).
///
/// ```
/// use std::time::Duration;
/// use ferriq::store::HeldSlot;
/// let slot = HeldSlot::new("db", Duration::from_millis(120));
/// assert_eq!(slot.limiter, "db");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldSlot<'a> {
    /// The concurrency limiter.
    pub limiter: &'a str,
    /// How long the run held the slot (folded into the limiter's average run, as
    /// [`FlowStore::release_slot`](super::FlowStore::release_slot) does).
    pub held: Duration,
}

impl<'a> HeldSlot<'a> {
    /// A slot of `limiter` that a run held for `held`.
    pub fn new(limiter: &'a str, held: Duration) -> Self {
        HeldSlot { limiter, held }
    }
}
