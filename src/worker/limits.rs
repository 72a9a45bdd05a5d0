//! Flow control at the worker: a task over its rate limit waits for its turn — not run, not
//! failed, no attempt spent — handed back to the broker until shortly before it, then held here
//! for the last few milliseconds. The limits that apply to a message (declared, or set at run
//! time); concurrency slots are `slots`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::running::Outcome;
use super::{settle, Inner};
use crate::broker::{Delivery, HOLD_WINDOW};
use crate::store::{
    ClaimAsk, ClaimOutcome, Gated, LimitGate, LimitOverride, LimiterKind, LimiterSeen,
    RateDecision, StoreError,
};
use crate::task::{Limiter, Rate, TaskRegistration};
use crate::wire::{names, TaskMessage};

/// The limits operators set at run time, as this worker last read them, and the limiters it
/// used since it last noted them in the store.
#[derive(Default)]
pub(crate) struct LiveLimits {
    overrides: RwLock<Arc<HashMap<String, LimitOverride>>>,
    seen: Mutex<Seen>,
}

/// The limiters used since they were last noted in the store, by name, with the limit last
/// applied. Every limited task notes its limiter: one already noted with the same limit costs
/// a lookup, not a copy of its name.
#[derive(Default)]
struct Seen {
    rates: HashMap<String, Rate>,
    slots: HashMap<String, u32>,
}

impl LiveLimits {
    fn overrides(&self) -> Arc<HashMap<String, LimitOverride>> {
        Arc::clone(&self.overrides.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note_rate(&self, limiter: &str, rate: Rate) {
        note(&mut self.seen().rates, limiter, rate);
    }

    fn note_slots(&self, limiter: &str, limit: u32) {
        note(&mut self.seen().slots, limiter, limit);
    }

    /// The limiters noted since the last call, emptied.
    fn take_seen(&self) -> Vec<LimiterSeen> {
        let mut seen = self.seen();
        let rates = seen.rates.drain().map(|(limiter, rate)| LimiterSeen {
            kind: LimiterKind::Rate,
            limiter,
            limit: rate.to_string(),
        });
        let mut out: Vec<LimiterSeen> = rates.collect();
        out.extend(seen.slots.drain().map(|(limiter, limit)| LimiterSeen {
            kind: LimiterKind::Concurrency,
            limiter,
            limit: limit.to_string(),
        }));
        out
    }
}

fn note<T: PartialEq>(map: &mut HashMap<String, T>, limiter: &str, limit: T) {
    match map.get_mut(limiter) {
        Some(noted) if *noted == limit => {}
        Some(noted) => *noted = limit,
        None => {
            map.insert(limiter.to_owned(), limit);
        }
    }
}

/// The override for `limiter` (a key's own first, then its task's), picked by `field`.
fn overridden<T>(
    overrides: &HashMap<String, LimitOverride>,
    limiter: &str,
    task: &str,
    field: impl Fn(&LimitOverride) -> Option<T>,
) -> Option<T> {
    overrides
        .get(limiter)
        .and_then(&field)
        .or_else(|| overrides.get(task).and_then(&field))
}

/// How often a held task asks again before it is handed back anyway (a turn pushed back by
/// late starts while it was held).
pub(super) const MAX_HOLDS: u32 = 3;

/// A turn closer than this is waited for here; a later one is waited for in the broker. A task
/// held here takes one of the worker's slots, and a key's backlog held that way would keep the
/// worker from receiving other keys' tasks queued behind it: handed back, it moves out of
/// their way (RabbitMQ: to the end of the lane, held by the worker that receives it again if
/// its turn is then under a second away; SQS: hidden until its turn, rounded up to a second).
const HOLD_FOR_TURN: Duration = Duration::from_millis(50);

/// The limiter counts a start when it grants it; the task's body starts a claim's round trip
/// later, and on a loaded machine those delays differ from one start to the next. Windows are
/// kept this much longer than the limit's period (5 %, at most 50 ms), so the bodies' own start
/// times stay within the limit too.
fn guarded(rate: Rate) -> Rate {
    let guard = (rate.period() / 20).min(Duration::from_millis(50));
    Rate::new(rate.limit(), rate.period() + guard)
}

/// Reads the limits set at run time and notes the limiters used lately (every
/// [`crate::store::OVERRIDES_REFRESH`]). A failed read keeps the limits read before.
pub(super) async fn refresh(w: &Inner) {
    match w.store.limit_overrides().await {
        Ok(read) => {
            let read: HashMap<_, _> = read.into_iter().collect();
            let mut current = w
                .limits
                .overrides
                .write()
                .unwrap_or_else(|p| p.into_inner());
            if **current != read {
                tracing::info!(overrides = read.len(), "limits set at run time changed");
                *current = Arc::new(read);
            }
        }
        Err(e) => tracing::debug!(error = %e, "could not read the limits set at run time"),
    }
    let seen = w.limits.take_seen();
    if !seen.is_empty() {
        if let Err(e) = w.store.note_limiters(&seen).await {
            tracing::debug!(error = %e, "could not note the limiters used");
        }
    }
}

/// Whether a rate or a concurrency limit may apply to the message's run: its task declares
/// one, the message carries one, or an operator set one for the task. No limiter is built:
/// every delivery asks this, and only a yes reads the limiters ([`rate_limiter`],
/// [`concurrency_limiter`]), which may still find none (a label that does not parse).
pub(super) fn may_be_limited(
    w: &Inner,
    task: &'static TaskRegistration,
    msg: &TaskMessage,
) -> bool {
    let options = task.options();
    if options.get_rate().is_some() || options.get_concurrency().is_some() {
        return true;
    }
    if msg.labels.get(names::RATE).is_some() || msg.labels.get(names::CONCURRENCY).is_some() {
        return true;
    }
    // A key's own override applies only to a limit declared for it (above); a task's own
    // applies to a task that declares none.
    let overrides = w.limits.overrides.read().unwrap_or_else(|p| p.into_inner());
    !overrides.is_empty()
        && overrides
            .get(task.name)
            .is_some_and(|set| set.rate.is_some() || set.concurrency.is_some())
}

/// The rate limiter a message's run counts against: as the message's labels or its task
/// declare it, unless an operator set another limit for it (or for a task that declares
/// none).
pub(super) fn rate_limiter(
    w: &Inner,
    task: &'static TaskRegistration,
    msg: &TaskMessage,
) -> Option<(Limiter, Rate)> {
    let options = task.options();
    let overrides = w.limits.overrides();
    let declared =
        crate::task::rate_limiter(task.name, options.get_rate(), options.get_rate_key(), msg);
    let (limiter, rate) = match declared {
        Some((limiter, rate)) if overrides.is_empty() => (limiter, rate),
        Some((limiter, rate)) => {
            let set = overridden(&overrides, &limiter, &msg.task_name, |o| o.rate);
            (limiter, set.unwrap_or(rate))
        }
        None => {
            let rate = overrides.get(task.name)?.rate?;
            (Cow::Borrowed(task.name), rate)
        }
    };
    w.limits.note_rate(&limiter, rate);
    Some((limiter, rate))
}

/// The concurrency limiter a message's run takes a slot of, and its number of slots: as
/// declared, unless an operator set another limit.
pub(super) fn concurrency_limiter(
    w: &Inner,
    task: &'static TaskRegistration,
    msg: &TaskMessage,
) -> Option<(Limiter, u32)> {
    let options = task.options();
    let overrides = w.limits.overrides();
    let declared = crate::task::concurrency_limiter(
        task.name,
        options.get_concurrency(),
        options.get_concurrency_key(),
        msg,
    );
    let (limiter, limit) = match declared {
        Some((limiter, limit)) if overrides.is_empty() => (limiter, limit),
        Some((limiter, limit)) => {
            let set = overridden(&overrides, &limiter, &msg.task_name, |o| o.concurrency);
            (limiter, set.unwrap_or(limit))
        }
        None => {
            let limit = overrides.get(task.name)?.concurrency?;
            (Cow::Borrowed(task.name), limit)
        }
    };
    w.limits.note_slots(&limiter, limit);
    Some((limiter, limit))
}

/// What one ask of a rate limiter said: the task may start (with what the ask returned), or
/// its turn is this far away.
enum Turn<T> {
    Now(T),
    In(Duration),
}

/// Asks `decide` until the task's turn comes (`Ok`: what its last answer carried), holding
/// the task here for a turn under [`HOLD_FOR_TURN`] away, at most [`MAX_HOLDS`] times;
/// otherwise what became of the delivery (`Err`: handed back until its turn, or released).
async fn in_turn<T, Decide, Decided>(
    w: &Inner,
    d: &Delivery,
    mut decide: Decide,
) -> Result<T, Outcome>
where
    Decide: FnMut() -> Decided,
    Decided: std::future::Future<Output = Result<Turn<T>, StoreError>>,
{
    for _ in 0..MAX_HOLDS {
        match decide().await {
            Ok(Turn::Now(asked)) => return Ok(asked),
            Ok(Turn::In(wait)) if wait < HOLD_FOR_TURN => tokio::time::sleep(wait).await,
            Ok(Turn::In(wait)) => return Err(hand_back_until_turn(w, d, wait).await),
            Err(e) => return Err(limiter_unreachable(w, d, &e).await),
        }
    }
    Err(settle::release(w, d, w.config.min_defer, Outcome::RateLimited).await)
}

/// `None` when the task may start now (its start counted against `limiter`); otherwise
/// what became of the delivery: handed back until its turn.
pub(super) async fn wait_for_turn(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    limiter: &str,
    rate: Rate,
) -> Option<Outcome> {
    let rate = guarded(rate);
    let decide = || async move {
        Ok(
            match w.store.admit_rate(limiter, &msg.task_id, rate).await? {
                RateDecision::Run => Turn::Now(()),
                RateDecision::Wait(wait) => Turn::In(wait),
            },
        )
    };
    in_turn(w, d, decide).await.err()
}

/// The task's claim once its turn under `limiter` came (its start counted), or what became of
/// the delivery (`Err`: handed back until its turn, or released). The rate decision and the
/// claim go out together where the store can answer both at once.
pub(super) async fn claim_in_turn(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    limiter: &str,
    rate: Rate,
) -> Result<ClaimOutcome, Outcome> {
    let gate = LimitGate::Rate {
        limiter,
        rate: guarded(rate),
    };
    let decide = || async move {
        let Some(answer) = w
            .store
            .claim_past_limit(gate, &msg.task_id, ask(w, msg))
            .await
        else {
            // A store that answers them apart: asked below.
            return Ok(Turn::Now(None));
        };
        Ok(match answer? {
            Gated::Claimed(claim) | Gated::ClaimedInHeldSlot(claim) => Turn::Now(Some(claim)),
            Gated::Wait(wait) => Turn::In(wait),
        })
    };
    if let Some(claim) = in_turn(w, d, decide).await? {
        return Ok(claim);
    }
    // The turn, then the claim.
    if let Some(outcome) = wait_for_turn(w, d, msg, limiter, rate).await {
        return Err(outcome);
    }
    claim(w, d, msg).await
}

/// A turn `wait` away, too far to hold the task for here: handed back until then.
async fn hand_back_until_turn(w: &Inner, d: &Delivery, wait: Duration) -> Outcome {
    tracing::debug!(turn_in = ?wait, "over its rate limit: handed back until its turn");
    // Under a second: exactly (a broker that cannot wait that little comes back later, never
    // sooner); else whole seconds, so it comes back early rather than late, then is held.
    let back_in = if wait < HOLD_WINDOW {
        wait
    } else {
        Duration::from_secs(wait.as_secs())
    };
    settle::release_after(w, d, back_in, Outcome::RateLimited).await
}

pub(super) async fn limiter_unreachable(w: &Inner, d: &Delivery, e: &StoreError) -> Outcome {
    tracing::warn!(error = %e, "the store's limiter is unreachable: releasing the message");
    settle::release(w, d, w.config.store_retry_after, Outcome::Released).await
}

/// The claim this worker asks for `msg`.
pub(super) fn ask<'a>(w: &'a Inner, msg: &TaskMessage) -> ClaimAsk<'a> {
    ClaimAsk {
        worker: &w.config.worker_id,
        lease: w.config.lease,
        deadline_at: msg.labels.deadline_at(),
    }
}

/// The claim alone (its limit passed), or the delivery released when the store is
/// unreachable.
pub(super) async fn claim(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
) -> Result<ClaimOutcome, Outcome> {
    let ask = ask(w, msg);
    match w
        .store
        .claim(&msg.task_id, ask.worker, ask.lease, ask.deadline_at)
        .await
    {
        Ok(claim) => Ok(claim),
        Err(e) => Err(super::claim::unreachable(w, d, &e).await),
    }
}
