//! Debounced enqueues on Valkey: one hash per key, `{prefix}:debounce:{<uuid5 of the key>}`,
//! with the key's waiting task (`cur`) and, per task, when it may run (`<id>:due`, server µs),
//! the latest message body (`<id>:body`), its state (`<id>:s`: `w` waiting, `t` let run) and
//! when it was let run (`<id>:at`). One key per script, so it works on Valkey Cluster.

use std::time::Duration;

use ferriq::store::{Debounced, StoreError};
use ferriq::wire::TaskId;
use fred::types::Value;

use crate::ValkeyStore;

/// How long a debounce hash outlives its last enqueue beyond the window, and a let-run
/// task's record is kept for its redeliveries.
const KEEP_US: u64 = 3_600_000_000;

/// KEYS: the key's hash. ARGV: task id, body, window µs, keep µs. Returns the waiting task's
/// id when there is one (it takes the body and waits a window again), else ''.
const DEBOUNCE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id, body, window, keep = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local function fmt(x) return string.format('%d', x) end
local ttl = fmt(math.floor((window + keep) / 1000))
local cur = redis.call('HGET', KEYS[1], 'cur')
if cur and redis.call('HGET', KEYS[1], cur .. ':s') == 'w' then
  redis.call('HSET', KEYS[1], cur .. ':body', body, cur .. ':due', fmt(now + window))
  redis.call('PEXPIRE', KEYS[1], ttl)
  if cur == id then return '' end
  return cur
end
-- Tasks let run long ago are forgotten.
local fields = redis.call('HKEYS', KEYS[1])
for _, f in ipairs(fields) do
  if string.sub(f, -3) == ':at' then
    local at = tonumber(redis.call('HGET', KEYS[1], f))
    if at < now - keep then
      local old = string.sub(f, 1, -4)
      redis.call('HDEL', KEYS[1], old .. ':s', old .. ':due', old .. ':body', old .. ':at')
    end
  end
end
redis.call('HSET', KEYS[1], 'cur', id, id .. ':s', 'w', id .. ':due', fmt(now + window),
  id .. ':body', body)
redis.call('PEXPIRE', KEYS[1], ttl)
return ''
"#;

/// KEYS: the key's hash. ARGV: task id, grace µs, keep µs. Returns {'wait', µs}, {'run'} (no
/// record) or {'run', body}.
const TAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = ARGV[1]
local s = redis.call('HGET', KEYS[1], id .. ':s')
if not s then return {'run'} end
if s == 'w' then
  local due = tonumber(redis.call('HGET', KEYS[1], id .. ':due'))
  if due > now + tonumber(ARGV[2]) then return {'wait', due - now} end
  redis.call('HSET', KEYS[1], id .. ':s', 't', id .. ':at', string.format('%d', now))
  if redis.call('HGET', KEYS[1], 'cur') == id then redis.call('HDEL', KEYS[1], 'cur') end
  local ttl = redis.call('PTTL', KEYS[1])
  local keep = math.floor(tonumber(ARGV[3]) / 1000)
  if ttl < keep then redis.call('PEXPIRE', KEYS[1], keep) end
end
return {'run', redis.call('HGET', KEYS[1], id .. ':body')}
"#;

/// KEYS: the key's hash. ARGV: task id. Forgets the task (its message was not sent).
const ABANDON: &str = r#"
local id = ARGV[1]
if redis.call('HGET', KEYS[1], 'cur') == id then redis.call('HDEL', KEYS[1], 'cur') end
redis.call('HDEL', KEYS[1], id .. ':s', id .. ':due', id .. ':body', id .. ':at')
return 1
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
        body: &str,
        window: Duration,
    ) -> Result<Option<TaskId>, StoreError> {
        let argv = vec![
            id.to_string(),
            body.to_owned(),
            window.as_micros().max(1).to_string(),
            KEEP_US.to_string(),
        ];
        let answer = self
            .run(DEBOUNCE, vec![self.debounce_key(key)], argv)
            .await?;
        match answer.as_str().as_deref() {
            None | Some("") => Ok(None),
            Some(waiting) => TaskId::parse(waiting)
                .map(Some)
                .map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!("debounced task: {e}"),
                }),
        }
    }

    pub(crate) async fn debounce_take(
        &self,
        key: &str,
        id: &TaskId,
    ) -> Result<Debounced, StoreError> {
        let argv = vec![id.to_string(), "2000".to_owned(), KEEP_US.to_string()];
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
            (Some("run"), body) => Ok(Debounced::Run(body.and_then(Value::as_string))),
            _ => Err(StoreError::Unavailable("unexpected debounce answer".into())),
        }
    }

    pub(crate) async fn debounce_abandon(&self, key: &str, id: &TaskId) -> Result<(), StoreError> {
        self.run(ABANDON, vec![self.debounce_key(key)], vec![id.to_string()])
            .await?;
        Ok(())
    }
}
