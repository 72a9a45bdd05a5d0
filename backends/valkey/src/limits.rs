//! Rate limiters in Valkey: one script per decision, the same steps as the core's
//! `RateState` (see `ferriq::store::FlowStore`), timed by the server.

use async_trait::async_trait;
use ferriq::store::{FlowStore, RateDecision, StoreError};
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

    /// A limiter's keys, hash-tagged on a digest of its name (a name may hold any character).
    fn limiter_keys(&self, limiter: &str) -> Vec<String> {
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
