//! Rate and concurrency limiters in Valkey: the same steps as the memory store's `RateState`
//! and `SlotState` (see `ferriq::store::FlowStore`), timed by the server. Each script takes any
//! number of decisions: concurrent deliveries' decisions go out together, in one round trip
//! (on a single server; in a cluster, where a script touches one slot, one per call). A slot
//! once taken is renewed and freed by `slots`.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ferriq::store::{RateDecision, SlotDecision, StoreError, TURN_GRACE, TURN_LATE};
use ferriq::task::Rate;
use ferriq::wire::TaskId;
use fred::types::scripts::Script;
use fred::types::{Key, Value};

use crate::argv::{flag, int, micros};
use crate::claims::Core;
use crate::error::store_error;
use crate::limiter_keys::LimiterKeys;
use crate::scripts;
use crate::ValkeyStore;

/// Early by this much (µs) still counts as a task's turn (the flow stores' `TURN_GRACE`).
pub(crate) const GRACE_US: u32 = TURN_GRACE.as_micros() as u32;

/// Per decision, KEYS: the limiter's granted starts (list, newest first), its turns handed
/// out (list, newest first) and its reserved turns (sorted set of task ids by turn); ARGV
/// (after the grace µs): task id, limit, period µs, renew ('1' to renew the keys' TTLs, see
/// `limiter_keys`). Returns per decision {'run'} or {'wait', µs}. Times are written with `%d`:
/// Lua prints large numbers in exponent form otherwise.
static ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(format!("{LIMITER_HEAD}{ADMIT_STEPS}{ADMIT_LOOP}")));

/// What every limiter script starts with: the server's time (`now`, µs), the grace (µs, the
/// first argument), `fmt` and `renew_ttls`.
pub(crate) const LIMITER_HEAD: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local grace = tonumber(ARGV[1])
local function fmt(x) return string.format('%d', x) end
-- A limiter's three keys get their time to live renewed when the worker asks (`renew` is
-- '1'): each worker asks once every few seconds per limiter, far inside the keys' TTL, so no
-- decision reads a TTL on the hot path. A key a decision creates gets its TTL where it is
-- created. Defined once per script run, not per decision.
local function renew_ttls(renew, first, second, third, ttl)
  if renew == '1' then
    redis.call('PEXPIRE', first, ttl)
    redis.call('PEXPIRE', second, ttl)
    redis.call('PEXPIRE', third, ttl)
  end
end
"#;

/// One rate decision's steps: `admit(started, turns, reserved, id, limit, period µs, renew)`.
pub(crate) const ADMIT_STEPS: &str = r#"
-- The lists are trimmed to the limit only once they outgrow it by a margin: one call fewer per
-- decision, and decisions are the hot path of every limited task. (Entries past the limit are
-- never read.) A list the push creates gets its time to live at once. The helper is defined
-- once per script run, not per decision: a closure made for every decision is garbage the
-- server collects on the hot path.
local function admit_push(list, at, n, ttl)
  local len = redis.call('LPUSH', list, at)
  if len == 1 then
    redis.call('PEXPIRE', list, ttl)
  elseif len > n + 32 then
    redis.call('LTRIM', list, 0, n - 1)
  end
end
local now_text = fmt(now)
local function admit(started, turns, reserved, id, n, period, renew)
  local keep = math.max(period * 10, 60000000)
  local ttl = math.floor((period + keep) / 1000) + 1000
  local waiting = redis.call('ZCARD', reserved) > 0
  if waiting then
    redis.call('ZREMRANGEBYSCORE', reserved, '-inf', fmt(now - keep))
    waiting = redis.call('ZCARD', reserved) > 0
  end
  local free_at = now
  local oldest = redis.call('LINDEX', started, n - 1)
  if oldest and tonumber(oldest) > now - period then free_at = tonumber(oldest) + period end
  -- Nobody waits and the window has room: its turn is now (every turn handed out is past).
  if not waiting and free_at <= now then
    admit_push(turns, now_text, n, ttl)
    admit_push(started, now_text, n, ttl)
    renew_ttls(renew, started, turns, reserved, ttl)
    return {'run'}
  end
  local turn = waiting and redis.call('ZSCORE', reserved, id)
  if turn then
    turn = tonumber(turn)
    if turn > now + grace then return {'wait', turn - now} end
    if free_at > now then
      redis.call('ZADD', reserved, fmt(free_at), id)
      renew_ttls(renew, started, turns, reserved, ttl)
      return {'wait', free_at - now}
    end
    redis.call('ZREM', reserved, id)
    admit_push(started, now_text, n, ttl)
    renew_ttls(renew, started, turns, reserved, ttl)
    return {'run'}
  end
  turn = math.max(now, free_at)
  local newest = redis.call('LINDEX', turns, 0)
  if newest then turn = math.max(turn, tonumber(newest)) end
  local nth = redis.call('LINDEX', turns, n - 1)
  if nth then turn = math.max(turn, tonumber(nth) + period) end
  admit_push(turns, fmt(turn), n, ttl)
  if turn <= now + grace and free_at <= now then
    admit_push(started, now_text, n, ttl)
    renew_ttls(renew, started, turns, reserved, ttl)
    return {'run'}
  end
  redis.call('ZADD', reserved, fmt(turn), id)
  if not waiting then redis.call('PEXPIRE', reserved, ttl) end
  renew_ttls(renew, started, turns, reserved, ttl)
  return {'wait', turn - now}
end
"#;

const ADMIT_LOOP: &str = r#"
local out = {}
for i = 0, #KEYS / 3 - 1 do
  out[#out + 1] = admit(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3],
    ARGV[4 * i + 2], tonumber(ARGV[4 * i + 3]), tonumber(ARGV[4 * i + 4]), ARGV[4 * i + 5])
end
return out
"#;

/// Per decision, KEYS: a concurrency limiter's held slots (sorted set: task id by lease end),
/// its waiting tasks (sorted set: task id by when it was told to come back) and its statistics
/// (hash: `avg`, how long a run holds a slot on average, µs); ARGV (after the grace µs):
/// task id, limit, lease µs, renew (as `ADMIT`'s). Returns per decision {'held'} (taken now),
/// {'kept'} (the task held it already) or {'wait', µs}. The same steps as the core's
/// `SlotState`.
static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::from_lua(format!("{LIMITER_HEAD}{}{ACQUIRE_LOOP}", acquire_steps())));

/// One concurrency decision's steps: `acquire(held, waiting, stats, id, limit, lease µs,
/// renew)`, with the flow stores' `TURN_LATE` written in.
pub(crate) fn acquire_steps() -> String {
    ACQUIRE_STEPS.replace("TURN_LATE_US", &TURN_LATE.as_micros().to_string())
}

const ACQUIRE_STEPS: &str = r#"
local function acquire(held, waiting, stats, id, n, lease, renew)
  local ttl = math.floor(lease / 1000) + 3600000
  -- Nobody waits and a slot is free (counting slots whose lease ran out as taken: they are
  -- swept when the slots run short): take it. (No slot held: the set may be new, and gets its
  -- time to live.)
  -- A task that holds a slot already keeps it and is told so ('kept': ZADD added no member),
  -- so a copy of it that does not run leaves it to the run that holds it. (Here a slot whose
  -- lease ran out but is not swept yet counts as kept too: it then lapses a lease later.)
  local holding = redis.call('ZCARD', held)
  if holding < n and redis.call('ZCARD', waiting) == 0 then
    local added = redis.call('ZADD', held, fmt(now + lease), id)
    if holding == 0 and renew ~= '1' then redis.call('PEXPIRE', held, ttl) end
    renew_ttls(renew, held, waiting, stats, ttl)
    if added == 0 then return {'kept'} end
    return {'held'}
  end
  redis.call('ZREMRANGEBYSCORE', held, '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', fmt(now - 3600000000))
  if redis.call('ZSCORE', held, id) then
    redis.call('ZADD', held, fmt(now + lease), id)
    renew_ttls(renew, held, waiting, stats, ttl)
    return {'kept'}
  end
  local free = n - redis.call('ZCARD', held)
  local mine = redis.call('ZSCORE', waiting, id)
  -- The waiting tasks before this one (all of them, for one not waiting yet): those due back
  -- by now go first to a free slot; every one counts toward its turn.
  -- One late by more than TURN_LATE keeps no slot for itself: it may never come back
  -- (purged, dead-lettered).
  local late_us = TURN_LATE_US
  local late = '(' .. fmt(now - late_us)
  local due, ahead
  if mine then
    mine = tonumber(mine)
    if mine > now + grace then return {'wait', mine - now} end
    due = redis.call('ZCOUNT', waiting, late, '(' .. fmt(mine))
    ahead = redis.call('ZCOUNT', waiting, '-inf', '(' .. fmt(mine))
  else
    due = redis.call('ZCOUNT', waiting, late, fmt(now + grace))
    ahead = redis.call('ZCARD', waiting)
  end
  if due < free then
    redis.call('ZREM', waiting, id)
    redis.call('ZADD', held, fmt(now + lease), id)
    if free == n and renew ~= '1' then redis.call('PEXPIRE', held, ttl) end
    renew_ttls(renew, held, waiting, stats, ttl)
    return {'held'}
  end
  local avg = tonumber(redis.call('HGET', stats, 'avg') or '1000000')
  avg = math.min(math.max(avg, 50000), 600000000)
  local wait = math.min(math.max((math.floor(ahead / n) + 1) * avg, 1000000), 600000000)
  -- A slot whose worker died frees itself when its lease runs out: nobody waits past the
  -- first lease end (and a moment), so a dead run's slot is taken again soon after. A live
  -- holder's lease keeps moving ahead with its heartbeats, so this adds a receive per waiter
  -- and lease at most.
  local first = redis.call('ZRANGE', held, 0, 0, 'WITHSCORES')
  if first[2] then wait = math.min(wait, math.max(tonumber(first[2]) - now + 50000, 250000)) end
  -- A slot is free but kept for tasks due back now: if they are not back in time, it is this
  -- one's turn.
  if free > 0 then
    local oldest = redis.call('ZRANGEBYSCORE', waiting, late, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if oldest[2] then
      wait = math.min(wait, math.max(tonumber(oldest[2]) + late_us - now + 50000, 250000))
    end
  end
  redis.call('ZADD', waiting, fmt(now + wait), id)
  redis.call('PEXPIRE', waiting, ttl)
  renew_ttls(renew, held, waiting, stats, ttl)
  return {'wait', wait}
end
"#;

const ACQUIRE_LOOP: &str = r#"
local out = {}
for i = 0, #KEYS / 3 - 1 do
  out[#out + 1] = acquire(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3],
    ARGV[4 * i + 2], tonumber(ARGV[4 * i + 3]), tonumber(ARGV[4 * i + 4]), ARGV[4 * i + 5])
end
return out
"#;

/// One rate decision: the limiter's keys, whether to renew them, the task, the rate.
pub(crate) struct AdmitCall {
    keys: Arc<LimiterKeys>,
    renew: bool,
    id: TaskId,
    rate: Rate,
}

/// One concurrency decision: the limiter's keys, whether to renew them, the task, the slots,
/// the lease.
pub(crate) struct SlotCall {
    keys: Arc<LimiterKeys>,
    renew: bool,
    id: TaskId,
    limit: u32,
    lease: Duration,
}

/// A rate decision's answer: whether its first part is `yes` (`run`), and the wait µs.
fn decision(answer: Value, yes: &str, what: &str) -> Result<(bool, Option<u64>), StoreError> {
    let parts = answer.into_array();
    match parts.first().and_then(Value::as_str) {
        Some(kind) => Ok((kind == yes, parts.get(1).and_then(Value::as_u64))),
        None => Err(StoreError::Unavailable(format!(
            "unexpected {what} limiter answer"
        ))),
    }
}

/// An `ACQUIRE` decision's answer.
fn slot_decision(answer: Value) -> Result<SlotDecision, StoreError> {
    let parts = answer.into_array();
    match parts.first().and_then(Value::as_str).as_deref() {
        Some("held") => Ok(SlotDecision::Held),
        Some("kept") => Ok(SlotDecision::AlreadyHeld),
        Some("wait") => {
            let us = parts.get(1).and_then(Value::as_u64).unwrap_or(0);
            Ok(SlotDecision::Wait(Duration::from_micros(us)))
        }
        _ => Err(StoreError::Unavailable(
            "unexpected concurrency limiter answer".into(),
        )),
    }
}

/// `ADMIT`'s and `ACQUIRE`'s keys and arguments: per decision its limiter's keys, then the task
/// id, the limit, the period or lease (µs) and whether to renew the keys.
fn decision_args<'a>(
    decisions: impl ExactSizeIterator<Item = (&'a LimiterKeys, &'a TaskId, u32, Duration, bool)>,
) -> (Vec<Key>, Vec<Value>) {
    let mut keys = Vec::with_capacity(decisions.len() * 3);
    let mut argv = Vec::with_capacity(1 + decisions.len() * 4);
    argv.push(int(GRACE_US));
    for (limiter, id, limit, span, renew) in decisions {
        keys.extend(limiter.keys.iter().cloned());
        argv.push(Value::from(id.as_str()));
        argv.push(int(limit));
        argv.push(micros(span));
        argv.push(flag(renew));
    }
    (keys, argv)
}

impl Core {
    /// Runs `script` on the keys and arguments `build` makes (again after a `NOSCRIPT`).
    pub(crate) async fn many(
        &self,
        script: &Script,
        build: impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<Vec<Value>, StoreError> {
        Ok(scripts::call(&self.pool, script, build)
            .await
            .map_err(store_error)?
            .into_array())
    }

    /// Rate decisions, in one script run.
    pub(crate) async fn admit_many(
        &self,
        calls: Vec<AdmitCall>,
    ) -> Result<Vec<Result<RateDecision, StoreError>>, StoreError> {
        let build = || {
            decision_args(calls.iter().map(|c| {
                let (limit, period) = (c.rate.limit(), c.rate.period());
                (&*c.keys, &c.id, limit, period, c.renew)
            }))
        };
        let answers = self.many(&ADMIT, build).await?;
        Ok(answers
            .into_iter()
            .map(|a| match decision(a, "run", "rate")? {
                (true, _) => Ok(RateDecision::Run),
                (_, us) => Ok(RateDecision::Wait(Duration::from_micros(us.unwrap_or(0)))),
            })
            .collect())
    }

    /// Concurrency decisions, in one script run.
    pub(crate) async fn acquire_many(
        &self,
        calls: Vec<SlotCall>,
    ) -> Result<Vec<Result<SlotDecision, StoreError>>, StoreError> {
        let build = || {
            decision_args(
                calls
                    .iter()
                    .map(|c| (&*c.keys, &c.id, c.limit, c.lease, c.renew)),
            )
        };
        let answers = self.many(&ACQUIRE, build).await?;
        Ok(answers.into_iter().map(slot_decision).collect())
    }
}

/// The one answer of a one-call batch.
pub(crate) fn single<T>(
    answers: Result<Vec<Result<T, StoreError>>, StoreError>,
) -> Result<T, StoreError> {
    answers?.pop().unwrap_or_else(|| {
        Err(StoreError::Unavailable(
            "valkey answered no decision".into(),
        ))
    })
}

impl ValkeyStore {
    /// A concurrency limiter's keys (held, waiting, stats).
    pub(crate) fn slot_keys(&self, limiter: &str) -> Arc<LimiterKeys> {
        self.flow_keys().slots(self.prefix(), limiter)
    }

    /// A rate limiter's keys (started, turns, reserved).
    pub(crate) fn limiter_keys(&self, limiter: &str) -> Arc<LimiterKeys> {
        self.flow_keys().rate(self.prefix(), limiter)
    }

    /// Runs a script given as Lua text (the rarely run ones).
    pub(crate) async fn run(
        &self,
        body: &str,
        keys: Vec<String>,
        argv: Vec<String>,
    ) -> Result<Value, StoreError> {
        let script = Script::from_lua(body);
        scripts::call(&self.core().pool, &script, || (keys.clone(), argv.clone()))
            .await
            .map_err(store_error)
    }

    pub(crate) async fn admit(
        &self,
        limiter: &str,
        id: &TaskId,
        rate: Rate,
    ) -> Result<RateDecision, StoreError> {
        let keys = self.limiter_keys(limiter);
        let call = AdmitCall {
            renew: keys.renew_due(),
            keys,
            id: id.clone(),
            rate,
        };
        match self.flow_batchers() {
            Some(b) => b.admits.call(call).await,
            None => single(self.core().admit_many(vec![call]).await),
        }
    }

    pub(crate) async fn acquire(
        &self,
        limiter: &str,
        id: &TaskId,
        limit: u32,
        lease: Duration,
    ) -> Result<SlotDecision, StoreError> {
        let keys = self.slot_keys(limiter);
        let call = SlotCall {
            renew: keys.renew_due(),
            keys,
            id: id.clone(),
            limit,
            lease,
        };
        match self.flow_batchers() {
            Some(b) => b.acquires.call(call).await,
            None => single(self.core().acquire_many(vec![call]).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_hold_the_flow_contracts_times() {
        assert_eq!(u128::from(GRACE_US), TURN_GRACE.as_micros());
        let steps = acquire_steps();
        assert!(steps.contains(&format!("local late_us = {}\n", TURN_LATE.as_micros())));
        assert!(!steps.contains("TURN_LATE_US"));
    }
}
