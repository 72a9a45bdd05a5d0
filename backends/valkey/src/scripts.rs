//! One Lua script per operation, so each is atomic on the server (DESIGN §5).
//!
//! A claim is one string value, `state token lease_until failures starts holder`: state `r`
//! running, `x` released, `d` done, `v` revoked; `lease_until` in server µs; `starts` counts the
//! runs granted. One string (GET/SET with
//! PX or KEEPTTL) costs the server less than a hash plus PEXPIRE on every claim. Numbers are
//! written with `%.0f`: Lua 5.1's `tostring` keeps only 14 digits, which would corrupt µs
//! timestamps and tokens.

use fred::prelude::{Client, LuaInterface, Pool};
use fred::types::scripts::Script;
use fred::types::Value;

/// Helpers shared by every script: the server clock and the claim codec.
const PRELUDE: &str = r#"
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function load(key)
  local raw = redis.call('GET', key)
  if not raw then return nil, 0, 0, 0, 0, '' end
  local s, t, l, f, n, h = string.match(raw, '^(%a) (%d+) (%d+) (%d+) (%d+) ?(.*)$')
  if not s then return nil, 0, 0, 0, 0, '' end
  return s, tonumber(t), tonumber(l), tonumber(f), tonumber(n), h
end
local function encode(s, t, l, f, n, h)
  return string.format('%s %.0f %.0f %.0f %.0f %s', s, t, l, f, n, h)
end
"#;

/// Claims one task or many at once (the store batches concurrent calls into one round trip).
/// KEYS: claim and result of each task, in pairs. ARGV: claim ttl ms, then per task: worker,
/// lease ms, deadline (unix s, or ''). Returns per task one of {'run', token, failures,
/// starts} | {'expired', token} | {'defer', µs left} | {'done'} | {'revoked'}.
const CLAIM: &str = r#"
local function claim(ck, rk, worker, lease_ms, deadline, ttl, now)
  local state, token, lease_until, failures, starts = load(ck)
  if state == 'd' then return {'done'} end
  if state == 'v' then return {'revoked'} end
  if state == 'r' then
    if lease_until > now then return {'defer', lease_until - now} end
    -- The holder's lease ran out before it finished: that attempt failed.
    failures = failures + 1
  end
  -- A result without a claim record (written by taskiq, or outliving its claim): done.
  if not state and redis.call('EXISTS', rk) == 1 then return {'done'} end
  token = math.max(token + 1, now)
  redis.call('SET', ck, encode('r', token, now + tonumber(lease_ms) * 1000, failures, starts + 1, worker), 'PX', ttl)
  if deadline ~= '' and now > tonumber(deadline) * 1000000 then return {'expired', token} end
  return {'run', token, failures, starts}
end
local now = now_us()
local out = {}
for i = 1, #KEYS / 2 do
  local a = 2 + (i - 1) * 3
  out[i] = claim(KEYS[2 * i - 1], KEYS[2 * i], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[1], now)
end
return out
"#;

/// KEYS: claims. ARGV: lease ms, claim ttl ms, then one token per key. Returns 1 (kept) or 0
/// (lost) per key. The record's TTL restarts: a live claim never expires under its holder.
const HEARTBEAT: &str = r#"
local lease_until = now_us() + tonumber(ARGV[1]) * 1000
local out = {}
for i, key in ipairs(KEYS) do
  local state, token, _, failures, starts, holder = load(key)
  if state == 'r' and token == tonumber(ARGV[i + 2]) then
    redis.call('SET', key, encode('r', token, lease_until, failures, starts, holder), 'PX', ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#;

/// KEYS: claim. ARGV: token, claim ttl ms. Returns 1 when released, 0 when the token was stale.
const RELEASE: &str = r#"
local state, token = load(KEYS[1])
if state ~= 'r' or token ~= tonumber(ARGV[1]) then return 0 end
-- The state is the record's first byte: overwrite it in place.
redis.call('SETRANGE', KEYS[1], 0, 'x')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// KEYS: claim. ARGV: token, claim ttl ms. Returns the failure count, or -1 when the token was
/// stale.
const RECORD_FAILURE: &str = r#"
local state, token, lease_until, failures, starts, holder = load(KEYS[1])
if state ~= 'r' or token ~= tonumber(ARGV[1]) then return -1 end
redis.call('SET', KEYS[1], encode('x', token, lease_until, failures + 1, starts, holder), 'PX', ARGV[2])
return failures + 1
"#;

/// The fenced write, for one task or many at once. KEYS: claim and result of each task, in
/// pairs. ARGV: result ttl ms ('0' = none), claim ttl ms, then per task: token, store
/// ('1'/'0'), result JSON, channel, task id. Returns per task 'stored' | 'already' | 'stale'.
const COMPLETE: &str = r#"
local function complete(ck, rk, tok, store, json, channel, id, result_ttl, claim_ttl)
  local state, token = load(ck)
  if token ~= tonumber(tok) then return 'stale' end
  if state == 'd' then return 'already' end
  if state ~= 'r' then return 'stale' end
  local outcome = 'stored'
  if store == '1' then
    local ok
    if result_ttl ~= '0' then
      ok = redis.call('SET', rk, json, 'NX', 'PX', result_ttl)
    else
      ok = redis.call('SET', rk, json, 'NX')
    end
    if not ok then outcome = 'already' end
  end
  redis.call('SETRANGE', ck, 0, 'd')
  redis.call('PEXPIRE', ck, claim_ttl)
  redis.call('PUBLISH', channel, id)
  return outcome
end
local out = {}
for i = 1, #KEYS / 2 do
  local a = 3 + (i - 1) * 5
  out[i] = complete(KEYS[2 * i - 1], KEYS[2 * i], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[1], ARGV[2])
end
return out
"#;

/// KEYS: claim, result. ARGV: result JSON, result ttl ms ('0' = none), claim ttl ms, channel,
/// task id. Returns 1 when revoked, 0 when the task had already finished.
const REVOKE: &str = r#"
local state, token, lease_until, failures, starts, holder = load(KEYS[1])
if state == 'd' or state == 'v' or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[2], ARGV[1])
end
-- A new token: a running holder's heartbeat and result write are now rejected.
redis.call('SET', KEYS[1], encode('v', math.max(token + 1, now_us()), lease_until, failures, starts, holder), 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"#;

/// A trivial script, for the benchmark's raw EVALSHA baseline.
pub(crate) const TRIVIAL: &str = "return 1";

/// The loaded scripts.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) heartbeat: Script,
    pub(crate) release: Script,
    pub(crate) record_failure: Script,
    pub(crate) complete: Script,
    pub(crate) revoke: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let script = |body: &str| Script::from_lua(format!("{PRELUDE}{body}"));
        Scripts {
            claim: script(CLAIM),
            heartbeat: script(HEARTBEAT),
            release: script(RELEASE),
            record_failure: script(RECORD_FAILURE),
            complete: script(COMPLETE),
            revoke: script(REVOKE),
        }
    }

    fn all(&self) -> [&Script; 6] {
        [
            &self.claim,
            &self.heartbeat,
            &self.release,
            &self.record_failure,
            &self.complete,
            &self.revoke,
        ]
    }

    /// Loads every script (on every primary of a cluster).
    pub(crate) async fn load(&self, client: &Client) -> Result<(), fred::error::Error> {
        for script in self.all() {
            script.load(client).await?;
        }
        Ok(())
    }
}

/// Calls a script by SHA on the next pooled connection, loading it again after `NOSCRIPT`
/// (a restarted or flushed server). The arguments are built by `args`, so the common path
/// moves them into the call instead of keeping copies for the rare retry.
pub(crate) async fn call(
    pool: &Pool,
    script: &Script,
    args: impl Fn() -> (Vec<String>, Vec<String>),
) -> Result<Value, fred::error::Error> {
    let client = pool.next();
    let (keys, argv) = args();
    match client.evalsha(script.sha1().clone(), keys, argv).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            script.load(client).await?;
            let (keys, argv) = args();
            client.evalsha(script.sha1().clone(), keys, argv).await
        }
        result => result,
    }
}
