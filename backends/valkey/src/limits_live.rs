//! Limits at run time on Valkey: the limits operators set, the limiters workers noted, and
//! each limiter's use now. None of it is on a delivery's path: workers read the overrides and
//! note their limiters every few seconds.

use ferriq::store::{LimitOverride, LimiterKind, LimiterSeen, LimiterUsage, StoreError};
use ferriq::task::Rate;
use fred::prelude::HashesInterface;
use fred::types::scripts::Script;
use fred::types::Value;

use crate::error::store_error;
use crate::scripts;
use crate::ValkeyStore;

/// KEYS: the noted limiters (hash: kind and limiter → limit, a newline, when noted in ms),
/// and when the old ones were last forgotten. ARGV: how long one is kept (ms), then pairs of
/// field and limit. Stamps each with the server's time; forgets the old ones once a minute.
const NOTE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. '\n' .. string.format('%d', now))
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', 60000) then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local at = tonumber(string.match(all[i + 1], '\n(%d+)$') or '0')
    if at < now - tonumber(ARGV[1]) then redis.call('HDEL', KEYS[1], all[i]) end
  end
end
return 1
"#;

/// KEYS: the noted limiters. ARGV: how long one is kept, ms. Forgets the old ones; returns
/// the server's time in ms, then fields and values.
const LISTED: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {string.format('%d', now)}
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], '\n(%d+)$') or '0')
  if at < now - tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
"#;

/// KEYS: a rate limiter's granted starts and reserved turns. ARGV: period µs. Returns
/// {starts in the last period, turns reserved}.
const RATE_USAGE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local used = 0
for _, at in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if tonumber(at) > now - tonumber(ARGV[1]) then used = used + 1 end
end
return {used, redis.call('ZCARD', KEYS[2])}
"#;

/// KEYS: a concurrency limiter's held slots and waiting tasks. Returns {held, waiting}.
const SLOT_USAGE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local held = redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')
return {held, redis.call('ZCARD', KEYS[2])}
"#;

fn field(kind: LimiterKind, limiter: &str) -> String {
    format!("{}\n{limiter}", kind.as_str())
}

impl ValkeyStore {
    fn overrides_key(&self) -> String {
        format!("{}:limits:overrides", self.prefix())
    }

    fn noted_key(&self) -> String {
        format!("{}:limits:noted", self.prefix())
    }

    pub(crate) async fn set_override(
        &self,
        target: &str,
        limits: Option<LimitOverride>,
    ) -> Result<bool, StoreError> {
        let pool = &self.core().pool;
        let key = self.overrides_key();
        let before: Option<String> = pool.hget(&key, target).await.map_err(store_error)?;
        match limits {
            Some(l) => {
                let _: i64 = pool
                    .hset(&key, (target, l.to_json()))
                    .await
                    .map_err(store_error)?;
            }
            None => {
                let _: i64 = pool.hdel(&key, target).await.map_err(store_error)?;
            }
        }
        Ok(before.is_some())
    }

    pub(crate) async fn overrides(&self) -> Result<Vec<(String, LimitOverride)>, StoreError> {
        let all: std::collections::HashMap<String, String> = self
            .core()
            .pool
            .hgetall(self.overrides_key())
            .await
            .map_err(store_error)?;
        Ok(all
            .into_iter()
            .map(|(target, json)| (target, LimitOverride::from_json(&json)))
            .collect())
    }

    pub(crate) async fn note(&self, seen: &[LimiterSeen]) -> Result<(), StoreError> {
        let keys = vec![self.noted_key(), format!("{}:swept", self.noted_key())];
        let mut argv = vec![ferriq::store::LIMITER_LISTED_FOR.as_millis().to_string()];
        argv.extend(
            seen.iter()
                .flat_map(|s| [field(s.kind, &s.limiter), s.limit.clone()]),
        );
        scripts::call(&self.core().pool, &Script::from_lua(NOTE), || {
            (keys.clone(), argv.clone())
        })
        .await
        .map_err(store_error)?;
        Ok(())
    }

    pub(crate) async fn usage(&self) -> Result<Vec<LimiterUsage>, StoreError> {
        let keys = vec![self.noted_key()];
        let argv = vec![ferriq::store::LIMITER_LISTED_FOR.as_millis().to_string()];
        let listed = scripts::call(&self.core().pool, &Script::from_lua(LISTED), || {
            (keys.clone(), argv.clone())
        })
        .await
        .map_err(store_error)?
        .into_array();
        let now_ms = listed
            .first()
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<f64>().ok())
            .unwrap_or(0.0);
        let mut out = Vec::new();
        for pair in listed.get(1..).unwrap_or_default().chunks(2) {
            let (Some(field), Some(value)) = (
                pair.first().and_then(Value::as_string),
                pair.get(1).and_then(Value::as_string),
            ) else {
                continue;
            };
            let (Some((kind, limiter)), Some((limit, at))) =
                (field.split_once('\n'), value.rsplit_once('\n'))
            else {
                continue;
            };
            let kind = match kind {
                "rate" => LimiterKind::Rate,
                "concurrency" => LimiterKind::Concurrency,
                _ => continue,
            };
            let counts = match kind {
                LimiterKind::Rate => {
                    let keys = self.limiter_keys(limiter);
                    let period = Rate::parse(limit)
                        .map(|r| r.period())
                        .unwrap_or(std::time::Duration::from_secs(1));
                    self.run(
                        RATE_USAGE,
                        vec![keys.text(0), keys.text(2)],
                        vec![period.as_micros().to_string()],
                    )
                    .await?
                }
                _ => {
                    let keys = self.slot_keys(limiter);
                    self.run(SLOT_USAGE, vec![keys.text(0), keys.text(1)], vec![])
                        .await?
                }
            }
            .into_array();
            let count = |i: usize| counts.get(i).and_then(Value::as_u64).unwrap_or(0);
            out.push(LimiterUsage::new(
                LimiterSeen {
                    kind,
                    limiter: limiter.to_owned(),
                    limit: limit.to_owned(),
                },
                count(0),
                count(1),
                at.parse::<f64>().unwrap_or(now_ms) / 1000.0,
            ));
        }
        Ok(out)
    }
}
