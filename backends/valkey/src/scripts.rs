//! One Lua script per operation, so each is atomic on the server (design §5).
//!
//! A claim is one string value, `state token lease_until started failures starts takeovers
//! holder`: state `r` running, `x` released, `d` done, `v` revoked; `lease_until` and
//! `started` (when the current run was granted) in server µs;
//! `failures` counts failed attempts, `starts` the runs granted, `takeovers` the runs whose
//! holder's lease ran out before it finished (crashed or stalled workers). One string (GET/SET
//! with PX) costs the server less than a hash plus PEXPIRE on every claim. Numbers are written
//! with `%d` (a C `long`): Lua 5.1's `tostring` keeps only 14 digits, which would corrupt µs
//! timestamps and tokens, and `%.0f` costs the server several times more.
//!
//! A running claim's TTL is `claim_ttl + lease`, renewed by every heartbeat, so a live claim
//! never expires under its holder; `complete` rewrites the record with its state byte flipped
//! and a TTL of `claim_ttl`, without parsing it. A first claim (no record, no result) writes
//! the record with `SET NX` without reading anything but the result's existence: the hot path
//! is two commands per claim and three per completion. `%d` needs a 64-bit C `long`, which
//! `check_server` verifies at connect.

use fred::prelude::{Client, LuaInterface, Pool};
use fred::types::scripts::Script;
use fred::types::Value;

/// Helpers shared by every script: a caught error's text (`err_text`, for the `err …` answers of
/// scripts that decide many tasks at once), the server clock, and the claim record.
pub(crate) const PRELUDE: &str = r#"
-- A caught error's text: a string, or (on servers whose `redis.call` raises a table) its `err`.
local function err_text(e)
  if type(e) == 'table' then return tostring(e.err) end
  return tostring(e)
end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function load(key)
  local raw = redis.call('GET', key)
  if raw then
    local s, t, l, b, f, n, k, h =
      string.match(raw, '^(%a) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ?(.*)$')
    if s then
      return {state = s, token = tonumber(t), lease = tonumber(l), started = tonumber(b),
              failures = tonumber(f), starts = tonumber(n), takeovers = tonumber(k), holder = h}
    end
    -- Records written before `started` was kept.
    s, t, l, f, n, k, h = string.match(raw, '^(%a) (%d+) (%d+) (%d+) (%d+) (%d+) ?(.*)$')
    if s then
      return {state = s, token = tonumber(t), lease = tonumber(l), started = 0,
              failures = tonumber(f), starts = tonumber(n), takeovers = tonumber(k), holder = h}
    end
  end
  return {state = nil, token = 0, lease = 0, started = 0, failures = 0, starts = 0,
          takeovers = 0, holder = ''}
end
local function save(key, r, ...)
  local raw = string.format('%s %d %d %d %d %d %d %s',
    r.state, r.token, r.lease, r.started, r.failures, r.starts, r.takeovers, r.holder)
  return redis.call('SET', key, raw, ...)
end
"#;

/// Claims one task or many at once (the store batches concurrent calls into one round trip).
/// KEYS: claim and result of each task, in pairs. ARGV: claim ttl ms, then per task: worker,
/// lease ms, deadline (unix s, or ''). Returns per task one string, its words apart by spaces:
/// `run token failures starts takeovers took_over(1/0)` | `expired token` | `defer µs_left` |
/// `done` | `revoked` | `err message` (that task only; the others are answered).
const CLAIM: &str = r#"
local now = now_us()
local out = {}
for i = 1, #KEYS / 2 do
  local a = 2 + (i - 1) * 3
  local ok, res = pcall(claim, KEYS[2 * i - 1], KEYS[2 * i], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[1], now)
  if ok then out[i] = res else out[i] = 'err ' .. err_text(res) end
end
return out
"#;

/// One claim's steps (the claim scripts' and the limited claims' of `gate`): `ck`, `rk` its
/// claim and result keys; the lease and the claim's time to live in ms; the deadline in unix
/// seconds or ''; `now` in server µs. Returns the claim's answer as `CLAIM` lists them.
pub(crate) const CLAIM_STEPS: &str = r#"
-- Every first claim of one script run answers the same text (its token is the run's clock):
-- made once. An answer is one string, not a table: the server turns each table it returns into
-- a reply element by element, several times the cost of one string.
local first_now, first_run
local function claim(ck, rk, worker, lease_ms, deadline, ttl, now)
  local lease = now + tonumber(lease_ms) * 1000
  local px = string.format('%d', tonumber(ttl) + tonumber(lease_ms))
  -- A task's first claim, the common case: no result and no record. Two commands (the
  -- record written only if absent) instead of reading the record, then the result, then
  -- writing the record.
  -- An expired task never runs: its claim counts no start.
  local expired = deadline ~= '' and now > tonumber(deadline) * 1000000
  if redis.call('EXISTS', rk) == 0 then
    local raw = string.format('r %d %d %d 0 %d 0 %s', now, lease, now, expired and 0 or 1, worker)
    if redis.call('SET', ck, raw, 'NX', 'PX', px) then
      if expired then return string.format('expired %d', now) end
      if first_now ~= now then first_now, first_run = now, string.format('run %d 0 0 0 0', now) end
      return first_run
    end
  end
  local r = load(ck)
  if r.state == 'd' then return 'done' end
  if r.state == 'v' then return 'revoked' end
  local took_over = 0
  if r.state == 'r' then
    if r.lease > now then return string.format('defer %d', r.lease - now) end
    -- The holder's lease ran out before it finished: a crashed or stalled run.
    r.takeovers = r.takeovers + 1
    took_over = 1
  end
  -- A result without a claim record (written by taskiq, or outliving its claim): done.
  if not r.state and redis.call('EXISTS', rk) == 1 then return 'done' end
  r.token = math.max(r.token + 1, now)
  r.state = 'r'
  r.lease = lease
  r.started = now
  r.holder = worker
  local starts = r.starts
  if not expired then r.starts = starts + 1 end
  save(ck, r, 'PX', px)
  if expired then return string.format('expired %d', r.token) end
  return string.format('run %d %d %d %d %d', r.token, r.failures, starts, r.takeovers, took_over)
end
"#;

/// KEYS: claims. ARGV: lease ms, claim ttl ms, then one token per key. Returns 1 (kept), 0
/// (lost) or 2 (revoked) per key. The record's TTL restarts at claim ttl + lease: a live claim never expires
/// under its holder, and outlives its completion by at least the claim ttl.
const HEARTBEAT: &str = r#"
local lease_until = now_us() + tonumber(ARGV[1]) * 1000
local ttl = string.format('%d', tonumber(ARGV[2]) + tonumber(ARGV[1]))
local out = {}
for i, key in ipairs(KEYS) do
  local r = load(key)
  if r.state == 'r' and r.token == tonumber(ARGV[i + 2]) then
    r.lease = lease_until
    save(key, r, 'PX', ttl)
    out[i] = 1
  elseif r.state == 'v' then
    out[i] = 2
  else
    out[i] = 0
  end
end
return out
"#;

/// KEYS: claim. ARGV: token, claim ttl ms, interrupted ('1': the run was cut off from outside
/// and counts as a takeover). Returns 1 when released, 0 when the token was stale.
const RELEASE: &str = r#"
local r = load(KEYS[1])
if r.state ~= 'r' or r.token ~= tonumber(ARGV[1]) then return 0 end
r.state = 'x'
if ARGV[3] == '1' then r.takeovers = r.takeovers + 1 end
save(KEYS[1], r, 'PX', ARGV[2])
return 1
"#;

/// `record_failure(claim key, token, claim ttl ms)`: the failure count, or -1 when the token
/// was stale.
pub(crate) const RECORD_FAILURE_STEPS: &str = r#"
local function record_failure(ck, tok, claim_ttl)
  local r = load(ck)
  if r.state ~= 'r' or r.token ~= tonumber(tok) then return -1 end
  r.state = 'x'
  r.failures = r.failures + 1
  save(ck, r, 'PX', claim_ttl)
  return r.failures
end
"#;

/// KEYS: claim. ARGV: token, claim ttl ms. Returns `record_failure`'s answer.
const RECORD_FAILURE: &str = "return record_failure(KEYS[1], ARGV[1], ARGV[2])\n";

/// The fenced write, for one task or many at once. KEYS: claim and result of each task, in
/// pairs. ARGV: result ttl ms ('0' = none), claim ttl ms, then per task: token, store
/// ('1'/'0'), result JSON, channel, task id. Returns per task 'stored' | 'already' | 'stale' |
/// 'revoked' | 'err <message>' (that task only). Completions are announced once per channel
/// per batch, a line per task (each `PUBLISH` costs the server a write to every subscriber, so
/// one per task was an eighth of the batch's cost): the task id, then a tab and the result JSON
/// when this call stored it (the waiter then has it without reading it back).
pub(crate) const COMPLETE_STEPS: &str = r#"
local channels, announced = {}, {}
local function complete(ck, rk, tok, store, json, channel, id, result_ttl, claim_ttl)
  local raw = redis.call('GET', ck)
  if not raw then return 'stale' end
  -- The record starts 'state token ': compare the token as text instead of parsing it all.
  local n = #tok
  if string.sub(raw, 3, 2 + n) ~= tok or string.byte(raw, 3 + n) ~= 32 then return 'stale' end
  local state = string.sub(raw, 1, 1)
  -- Revoked: only the run that held the claim then is told so (its slot is freed with the
  -- answer); an older run's write is stale, like any other.
  if state == 'v' then return 'revoked' end
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
  -- The record as it was, its state byte now 'd', kept claim_ttl from now: one command
  -- (flipping the byte in place kept the TTL, which then had to be checked and restored when
  -- the run finished after its lease ran out).
  redis.call('SET', ck, 'd' .. string.sub(raw, 2), 'PX', claim_ttl)
  -- A result this call stored travels with its announcement (up to 8 KiB): the waiter need
  -- not read it back. One someone else stored ('already') is read by the waiter as usual.
  -- Pieces of the message, joined once at the end (no string built per task).
  local pieces = announced[channel]
  if pieces then
    pieces[#pieces + 1] = '\n'
  else
    pieces = {}
    announced[channel] = pieces
    channels[#channels + 1] = channel
  end
  pieces[#pieces + 1] = id
  if outcome == 'stored' and store == '1' and #json <= 8192 then
    pieces[#pieces + 1] = '\t'
    pieces[#pieces + 1] = json
  end
  return outcome
end
"#;

/// The loop of `COMPLETE` (after `COMPLETE_STEPS`; `ANNOUNCE` and `return out` follow).
const COMPLETE: &str = r#"
local out = {}
for i = 1, #KEYS / 2 do
  local a = 3 + (i - 1) * 5
  local ok, res = pcall(complete, KEYS[2 * i - 1], KEYS[2 * i], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[1], ARGV[2])
  if ok then out[i] = res else out[i] = 'err ' .. err_text(res) end
end
"#;

/// The completions `COMPLETE_STEPS` gathered, announced (one `PUBLISH` per channel). The
/// results are written either way; a lost announcement only delays waiters to a re-read.
pub(crate) const ANNOUNCE: &str = r#"
for _, channel in ipairs(channels) do
  pcall(redis.call, 'PUBLISH', channel, table.concat(announced[channel]))
end
"#;

/// KEYS: claim, result. ARGV: result JSON, result ttl ms ('0' = none), claim ttl ms, channel,
/// task id. Returns 1 when revoked, 0 when the task had already finished.
const REVOKE: &str = r#"
local r = load(KEYS[1])
if r.state == 'd' or r.state == 'v' or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[2], ARGV[1])
end
-- The token stays the holder's: a revoked record rejects every heartbeat, release and write
-- by its state, and tells the run that held it, and no older one, that it was revoked.
r.state = 'v'
save(KEYS[1], r, 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"#;

/// A result written outside any run (a workflow's outcome). KEYS: claim, result. ARGV: result
/// JSON, result ttl ms ('0' = none), claim ttl ms, channel, task id. Returns 1 when written, 0
/// when a result was there. The claim is marked done (a message of the task is a duplicate).
const STORE_ONCE: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[2], ARGV[1])
end
local r = load(KEYS[1])
if r.state ~= 'v' then
  r.token = math.max(r.token + 1, now_us())
  r.state = 'd'
end
save(KEYS[1], r, 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"#;

/// Creates a group. KEYS: group hash, member bitmap. ARGV: record JSON, size, ttl ms. Returns
/// 1 when created, 0 when it existed.
const CREATE_GROUP: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'size', ARGV[2], 'done', 0, 'failed', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
-- The bitmap at its full size now: counting never grows it.
redis.call('SETBIT', KEYS[2], math.max(tonumber(ARGV[2]) - 1, 0), 0)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"#;

/// Counts a member once. KEYS: group hash, member bitmap. ARGV: index, failed ('1'/'0').
/// Returns {done, failed, size, settled} or {-1} when the group is unknown.
const COUNT_MEMBER: &str = r#"
local size = tonumber(redis.call('HGET', KEYS[1], 'size'))
if not size then return {-1} end
local i = tonumber(ARGV[1])
if i < 0 or i >= size then return {-2} end
if redis.call('SETBIT', KEYS[2], i, 1) == 0 then
  redis.call('HINCRBY', KEYS[1], 'done', 1)
  if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[1], 'failed', 1) end
end
local v = redis.call('HMGET', KEYS[1], 'done', 'failed', 'settled')
return {tonumber(v[1]), tonumber(v[2]), size, v[3] and 1 or 0}
"#;

/// Refuses a server whose Lua formats `%d` through a 32-bit C `long` (32-bit builds, some
/// Windows ports): tokens and µs timestamps need 64 bits.
pub(crate) async fn check_server(client: &Client) -> Result<(), String> {
    let v: Value = client
        .eval(
            "return string.format('%d', 2^52 + 1)",
            Vec::<String>::new(),
            Vec::<String>::new(),
        )
        .await
        .map_err(|e| format!("{:?}: {}", e.kind(), e.details()))?;
    match v.as_string().as_deref() {
        Some("4503599627370497") => Ok(()),
        other => Err(format!(
            "this server's Lua formats 64-bit integers as {other:?}: ferriq needs a 64-bit Valkey/Redis build"
        )),
    }
}

/// A trivial script, for the benchmark's raw EVALSHA baseline.
pub(crate) const TRIVIAL: &str = "return 1";

/// KEYS: claim, result, marker. ARGV: claim ttl ms. Returns 'reset' | 'already' | 'running'.
const RESET: &str = r#"
if redis.call('EXISTS', KEYS[3]) == 1 then return 'already' end
local now = now_us()
local r = load(KEYS[1])
if r.state == 'r' and r.lease > now then return 'running' end
redis.call('DEL', KEYS[2])
r.token = math.max(r.token + 1, now)
r.state = 'x'
r.failures = 0
r.takeovers = 0
save(KEYS[1], r, 'PX', ARGV[1])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
return 'reset'
"#;

/// The loaded scripts.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) heartbeat: Script,
    pub(crate) release: Script,
    pub(crate) record_failure: Script,
    pub(crate) complete: Script,
    pub(crate) revoke: Script,
    pub(crate) store_once: Script,
    pub(crate) create_group: Script,
    pub(crate) count_member: Script,
    pub(crate) reset: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        let script = |body: &str| Script::from_lua(format!("{PRELUDE}{body}"));
        Scripts {
            claim: script(&format!("{CLAIM_STEPS}{CLAIM}")),
            heartbeat: script(HEARTBEAT),
            release: script(RELEASE),
            record_failure: script(&format!("{RECORD_FAILURE_STEPS}{RECORD_FAILURE}")),
            complete: script(&format!("{COMPLETE_STEPS}{COMPLETE}{ANNOUNCE}return out\n")),
            revoke: script(REVOKE),
            store_once: script(STORE_ONCE),
            create_group: script(CREATE_GROUP),
            count_member: script(COUNT_MEMBER),
            reset: script(RESET),
        }
    }

    fn all(&self) -> [&Script; 10] {
        [
            &self.claim,
            &self.heartbeat,
            &self.release,
            &self.record_failure,
            &self.complete,
            &self.revoke,
            &self.store_once,
            &self.create_group,
            &self.count_member,
            &self.reset,
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
pub(crate) async fn call<K, A>(
    pool: &Pool,
    script: &Script,
    args: impl Fn() -> (K, A),
) -> Result<Value, fred::error::Error>
where
    K: Into<fred::types::MultipleKeys> + Send,
    A: TryInto<fred::types::MultipleValues> + Send,
    A::Error: Into<fred::error::Error> + Send,
{
    let client = pool.next();
    let (keys, argv) = args();
    // fred's command futures are kilobytes large: boxed here, every future that awaits a
    // script (a claim, a complete, a batch's task) stays small, and cheap to move and box.
    match Box::pin(client.evalsha(script.sha1().clone(), keys, argv)).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            Box::pin(script.load(client)).await?;
            let (keys, argv) = args();
            Box::pin(client.evalsha(script.sha1().clone(), keys, argv)).await
        }
        result => result,
    }
}
