//! Rate limiters in Valkey: one script per decision, the same steps as the core's
//! `RateState` (see `ferriq::store::FlowStore`), timed by the server.

use async_trait::async_trait;
use ferriq::store::{
    Debounced, FlowStore, LimitOverride, LimiterSeen, LimiterUsage, RateDecision, SlotDecision,
    StoreError,
};
use ferriq::task::Rate;
use ferriq::wire::TaskId;
use fred::types::scripts::Script;
use fred::types::Value;

use crate::error::store_error;
use crate::scripts;
use crate::ValkeyStore;

/// KEYS: the limiter's granted starts (list, newest first), its turns handed out (list, newest
/// first) and its reserved turns (sorted set of task ids by turn). ARGV: task id, limit,
/// period µs, grace µs. Returns {'run'} or {'wait', µs}. Times are written with `%d`: Lua
/// prints large numbers in exponent form otherwise.
const ADMIT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id, n, period, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local keep = math.max(period * 10, 60000000)
local ttl = string.format('%d', math.floor((period + keep) / 1000) + 1000)
local function fmt(x) return string.format('%d', x) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', fmt(now - keep))
local free_at = now
local oldest = redis.call('LINDEX', KEYS[1], n - 1)
if oldest and tonumber(oldest) > now - period then free_at = tonumber(oldest) + period end
local function expire()
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
local function start()
  redis.call('LPUSH', KEYS[1], fmt(now))
  redis.call('LTRIM', KEYS[1], 0, n - 1)
  expire()
  return {'run'}
end
local turn = redis.call('ZSCORE', KEYS[3], id)
if turn then
  turn = tonumber(turn)
  if turn > now + grace then return {'wait', turn - now} end
  if free_at > now then
    redis.call('ZADD', KEYS[3], fmt(free_at), id)
    expire()
    return {'wait', free_at - now}
  end
  redis.call('ZREM', KEYS[3], id)
  return start()
end
turn = math.max(now, free_at)
local newest = redis.call('LINDEX', KEYS[2], 0)
if newest then turn = math.max(turn, tonumber(newest)) end
local nth = redis.call('LINDEX', KEYS[2], n - 1)
if nth then turn = math.max(turn, tonumber(nth) + period) end
redis.call('LPUSH', KEYS[2], fmt(turn))
redis.call('LTRIM', KEYS[2], 0, n - 1)
if turn <= now + grace and free_at <= now then return start() end
redis.call('ZADD', KEYS[3], fmt(turn), id)
expire()
return {'wait', turn - now}
"#;

/// KEYS: a concurrency limiter's held slots (sorted set: task id by lease end), when each was
/// taken (hash), its waiting tasks (sorted set: task id by when it was told to come back) and
/// its statistics (hash: `avg`, a run's average µs). ARGV: task id, limit, lease µs, grace µs.
/// Returns {'held'} or {'wait', µs}. The same steps as the core's `SlotState`.
const ACQUIRE_SLOT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id, n, lease, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function fmt(x) return string.format('%d', x) end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
  redis.call('HDEL', KEYS[2], unpack(dead))
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', fmt(now - 3600000000))
local ttl = fmt(math.floor(lease / 1000) + 3600000)
local function expire() for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end end
if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], fmt(now + lease), id)
  expire()
  return {'held'}
end
local free = n - redis.call('ZCARD', KEYS[1])
local mine = redis.call('ZSCORE', KEYS[3], id)
-- The waiting tasks before this one (all of them, for one not waiting yet): those due back by
-- now go first to a free slot; every one counts toward its turn.
local due, ahead
if mine then
  mine = tonumber(mine)
  if mine > now + grace then return {'wait', mine - now} end
  due = redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. fmt(mine))
  ahead = due
else
  due = redis.call('ZCOUNT', KEYS[3], '-inf', fmt(now + grace))
  ahead = redis.call('ZCARD', KEYS[3])
end
if due < free then
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[1], fmt(now + lease), id)
  redis.call('HSET', KEYS[2], id, fmt(now))
  expire()
  return {'held'}
end
local avg = tonumber(redis.call('HGET', KEYS[4], 'avg') or '1000000')
avg = math.min(math.max(avg, 50000), 600000000)
local wait = math.min(math.max((math.floor(ahead / n) + 1) * avg, 1000000), 600000000)
-- A slot whose worker died frees itself when its lease runs out: nobody waits past the first
-- lease end (and a moment), so a dead run's slot is taken again soon after. A live holder's
-- lease keeps moving ahead with its heartbeats, so this adds a receive per waiter and lease
-- at most.
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then wait = math.min(wait, math.max(tonumber(first[2]) - now + 50000, 250000)) end
redis.call('ZADD', KEYS[3], fmt(now + wait), id)
expire()
return {'wait', wait}
"#;

/// KEYS: held slots, when taken, statistics. ARGV: task id, lease µs. Extends the run's
/// slot. A slot missing while the limiter has no statistics either was lost with the store's
/// data (a restart): it is taken again, so the runs still going count against the limit from
/// their next heartbeat. (With statistics, it was released or ran out: left alone.)
const RENEW_SLOT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if held or redis.call('HEXISTS', KEYS[3], 'avg') == 0 then
  redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
  if not held then redis.call('HSETNX', KEYS[2], ARGV[1], string.format('%d', now)) end
end
return 1
"#;

/// KEYS: held slots, when taken, statistics. ARGV: task id. Frees the slot and folds the run's
/// time into the average.
const RELEASE_SLOT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local taken = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if taken then
  local ran = math.max(now - tonumber(taken), 0)
  local avg = redis.call('HGET', KEYS[3], 'avg')
  if avg then avg = tonumber(avg) * 0.8 + ran * 0.2 else avg = ran end
  redis.call('HSET', KEYS[3], 'avg', string.format('%d', avg))
end
return 1
"#;

/// KEYS: the dedup key. ARGV: task id, ttl ms. Returns '' when the key is the task's now (or
/// was), else the id of the task holding it.
const RESERVE_DEDUP: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
return ''
"#;

/// KEYS: the dedup key. ARGV: task id. Deletes it when the task holds it.
const RELEASE_DEDUP: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"#;

impl ValkeyStore {
    /// A deduplication key's key (its digest: a key may hold any character).
    fn dedup_key(&self, key: &str) -> String {
        format!(
            "{}:dedup:{}",
            self.prefix(),
            TaskId::derived(&["ferriq-dedup-key", key])
        )
    }

    /// A concurrency limiter's keys (held, taken, waiting, stats), hash-tagged like a rate
    /// limiter's.
    pub(crate) fn slot_keys(&self, limiter: &str) -> Vec<String> {
        let tag = TaskId::derived(&["ferriq-slots", limiter]);
        ["held", "taken", "waiting", "stats"]
            .iter()
            .map(|part| format!("{}:slots:{{{tag}}}:{part}", self.prefix()))
            .collect()
    }

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

    /// A limiter's keys, hash-tagged on a digest of its name (a name may hold any character).
    pub(crate) fn limiter_keys(&self, limiter: &str) -> Vec<String> {
        let tag = TaskId::derived(&["ferriq-rate", limiter]);
        ["started", "turns", "reserved"]
            .iter()
            .map(|part| format!("{}:rate:{{{tag}}}:{part}", self.prefix()))
            .collect()
    }
}

#[async_trait]
impl FlowStore for ValkeyStore {
    async fn admit_rate(
        &self,
        limiter: &str,
        id: &TaskId,
        rate: Rate,
    ) -> Result<RateDecision, StoreError> {
        let keys = self.limiter_keys(limiter);
        let argv = vec![
            id.to_string(),
            rate.limit().to_string(),
            rate.period().as_micros().to_string(),
            "2000".to_owned(),
        ];
        let script = Script::from_lua(ADMIT);
        let answer = scripts::call(&self.core().pool, &script, || (keys.clone(), argv.clone()))
            .await
            .map_err(store_error)?;
        let parts: Vec<Value> = match answer {
            Value::Array(parts) => parts,
            other => {
                return Err(StoreError::Unavailable(format!(
                    "unexpected rate limiter answer {other:?}"
                )))
            }
        };
        match (
            parts.first().and_then(Value::as_str).as_deref(),
            parts.get(1),
        ) {
            (Some("run"), _) => Ok(RateDecision::Run),
            (Some("wait"), Some(us)) => Ok(RateDecision::Wait(std::time::Duration::from_micros(
                us.as_u64().unwrap_or(0),
            ))),
            _ => Err(StoreError::Unavailable(
                "unexpected rate limiter answer".into(),
            )),
        }
    }

    async fn acquire_slot(
        &self,
        limiter: &str,
        id: &TaskId,
        limit: u32,
        lease: std::time::Duration,
    ) -> Result<SlotDecision, StoreError> {
        let argv = vec![
            id.to_string(),
            limit.to_string(),
            lease.as_micros().to_string(),
            "2000".to_owned(),
        ];
        let answer = self
            .run(ACQUIRE_SLOT, self.slot_keys(limiter), argv)
            .await?;
        let parts = match answer {
            Value::Array(parts) => parts,
            _ => Vec::new(),
        };
        match (
            parts.first().and_then(Value::as_str).as_deref(),
            parts.get(1),
        ) {
            (Some("held"), _) => Ok(SlotDecision::Held),
            (Some("wait"), Some(us)) => Ok(SlotDecision::Wait(std::time::Duration::from_micros(
                us.as_u64().unwrap_or(0),
            ))),
            _ => Err(StoreError::Unavailable(
                "unexpected concurrency limiter answer".into(),
            )),
        }
    }

    async fn renew_slots(
        &self,
        slots: &[(String, TaskId)],
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        let renewals = slots.iter().map(|(limiter, id)| {
            let mut keys = self.slot_keys(limiter);
            keys.remove(2); // not the waiting set
            self.run(
                RENEW_SLOT,
                keys,
                vec![id.to_string(), lease.as_micros().to_string()],
            )
        });
        for renewed in futures_util::future::join_all(renewals).await {
            renewed?;
        }
        Ok(())
    }

    async fn release_slot(&self, limiter: &str, id: &TaskId) -> Result<(), StoreError> {
        let mut keys = self.slot_keys(limiter);
        keys.remove(2); // not the waiting set
        self.run(RELEASE_SLOT, keys, vec![id.to_string()]).await?;
        Ok(())
    }

    async fn reserve_dedup(
        &self,
        key: &str,
        id: &TaskId,
        ttl: std::time::Duration,
    ) -> Result<Option<TaskId>, StoreError> {
        let keys = vec![self.dedup_key(key)];
        let argv = vec![id.to_string(), ttl.as_millis().max(1).to_string()];
        let script = Script::from_lua(RESERVE_DEDUP);
        let answer = scripts::call(&self.core().pool, &script, || (keys.clone(), argv.clone()))
            .await
            .map_err(store_error)?;
        match answer.as_str().as_deref() {
            None | Some("") => Ok(None),
            Some(holder) => TaskId::parse(holder)
                .map(Some)
                .map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!("deduplication key holder: {e}"),
                }),
        }
    }

    async fn debounce(
        &self,
        key: &str,
        id: &TaskId,
        body: &str,
        window: std::time::Duration,
    ) -> Result<Option<TaskId>, StoreError> {
        self.debounce_enqueue(key, id, body, window).await
    }

    async fn take_debounced(&self, key: &str, id: &TaskId) -> Result<Debounced, StoreError> {
        self.debounce_take(key, id).await
    }

    async fn abandon_debounce(&self, key: &str, id: &TaskId) -> Result<(), StoreError> {
        self.debounce_abandon(key, id).await
    }

    async fn set_limit_override(
        &self,
        target: &str,
        limits: Option<LimitOverride>,
    ) -> Result<bool, StoreError> {
        self.set_override(target, limits).await
    }

    async fn limit_overrides(&self) -> Result<Vec<(String, LimitOverride)>, StoreError> {
        self.overrides().await
    }

    async fn note_limiters(&self, seen: &[LimiterSeen]) -> Result<(), StoreError> {
        self.note(seen).await
    }

    async fn limiters(&self) -> Result<Vec<LimiterUsage>, StoreError> {
        self.usage().await
    }

    async fn release_dedup(&self, key: &str, id: &TaskId) -> Result<(), StoreError> {
        let keys = vec![self.dedup_key(key)];
        let argv = vec![id.to_string()];
        let script = Script::from_lua(RELEASE_DEDUP);
        scripts::call(&self.core().pool, &script, || (keys.clone(), argv.clone()))
            .await
            .map_err(store_error)?;
        Ok(())
    }
}
