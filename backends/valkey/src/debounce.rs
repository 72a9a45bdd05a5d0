//! Debounced enqueues on Valkey: one hash per key, `{prefix}:debounce:{<uuid5 of the key>}`,
//! holding the key's latest task (`task`), how many enqueues it took (`seq`), when it may run
//! (`due`, server µs) and whether it was let run (`s`: `w` waiting, `t` let run). One key per
//! script, so it works on Valkey Cluster.

use std::time::Duration;

use ferriq::store::{DebounceTurn, Debounced, StoreError};
use ferriq::wire::TaskId;
use fred::types::Value;

use crate::ValkeyStore;

/// How long a debounce hash outlives its last enqueue beyond the window (and a let-run one
/// its run), ms.
const KEEP_MS: u64 = 3_600_000;

/// KEYS: the key's hash. ARGV: task id, window µs, keep ms. Returns {'new'} or {'joined',
/// waiting task, seq}.
const DEBOUNCE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[2])
local due = string.format('%d', now + window)
local ttl = string.format('%d', math.floor(window / 1000) + tonumber(ARGV[3]))
local r = redis.call('HMGET', KEYS[1], 'task', 's')
if r[1] and r[2] == 'w' then
  local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  redis.call('HSET', KEYS[1], 'due', due)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {'joined', r[1], seq}
end
redis.call('HSET', KEYS[1], 'task', ARGV[1], 'seq', 1, 'due', due, 's', 'w')
redis.call('PEXPIRE', KEYS[1], ttl)
return {'new'}
"#;

/// KEYS: the key's hash. ARGV: task id, copy seq, grace µs, keep ms. Returns {'run'},
/// {'superseded'} or {'wait', µs}.
const TAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local r = redis.call('HMGET', KEYS[1], 'task', 'seq', 'due', 's')
if not r[1] or r[1] ~= ARGV[1] or r[4] ~= 'w' then return {'run'} end
if tonumber(ARGV[2]) < tonumber(r[2]) then return {'superseded'} end
local due = tonumber(r[3])
if due > now + tonumber(ARGV[3]) then return {'wait', due - now} end
redis.call('HSET', KEYS[1], 's', 't')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'run'}
"#;

impl ValkeyStore {
    fn debounce_key(&self, key: &str) -> String {
        format!(
            "{}:debounce:{{{}}}",
            self.prefix(),
            TaskId::derived(&["ferriq-debounce-key", key])
        )
    }

    pub(crate) async fn debounce_enqueue(
        &self,
        key: &str,
        id: &TaskId,
        window: Duration,
    ) -> Result<DebounceTurn, StoreError> {
        let argv = vec![
            id.to_string(),
            window.as_micros().max(1).to_string(),
            KEEP_MS.to_string(),
        ];
        let parts = self
            .run(DEBOUNCE, vec![self.debounce_key(key)], argv)
            .await?
            .into_array();
        match (
            parts.first().and_then(Value::as_str).as_deref(),
            parts.get(1),
            parts.get(2),
        ) {
            (Some("new"), _, _) => Ok(DebounceTurn::New),
            (Some("joined"), Some(task), Some(seq)) => {
                let task = task.as_str().unwrap_or_default();
                let task = TaskId::parse(&task).map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!("debounced task: {e}"),
                })?;
                Ok(DebounceTurn::Joined {
                    task,
                    seq: seq.as_u64().unwrap_or(1),
                })
            }
            _ => Err(StoreError::Unavailable("unexpected debounce answer".into())),
        }
    }

    pub(crate) async fn debounce_take(
        &self,
        key: &str,
        id: &TaskId,
        seq: u64,
    ) -> Result<Debounced, StoreError> {
        let argv = vec![
            id.to_string(),
            seq.to_string(),
            "2000".to_owned(),
            KEEP_MS.to_string(),
        ];
        let parts = self
            .run(TAKE, vec![self.debounce_key(key)], argv)
            .await?
            .into_array();
        match (
            parts.first().and_then(Value::as_str).as_deref(),
            parts.get(1),
        ) {
            (Some("wait"), Some(us)) => Ok(Debounced::Wait(Duration::from_micros(
                us.as_u64().unwrap_or(0),
            ))),
            (Some("run"), _) => Ok(Debounced::Run),
            (Some("superseded"), _) => Ok(Debounced::Superseded),
            _ => Err(StoreError::Unavailable("unexpected debounce answer".into())),
        }
    }
}
