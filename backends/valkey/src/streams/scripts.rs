//! The Streams broker's Lua scripts: one per operation, atomic on the server. Every script
//! touches one lane's keys only — its stream and the keys tagged with it — so each runs on
//! one node of a cluster.
//!
//! A delivery is an entry of the lane's stream, pending in the consumer group under this
//! broker's consumer name. Who holds it is the group's pending list (the consumer and how many
//! times it was delivered: the delivery count is the fencing token of a handle); until when is
//! the lane's lease set (entry id → unix ms). An entry whose lease ran out is taken over by the
//! next receive of any worker — a run whose worker heartbeats is never taken, however long it
//! runs, and no lock exists that a dead worker could keep.

use fred::types::scripts::Script;

/// The server's clock, in unix ms, and the owner check every settlement starts with.
const PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Whether `id` is pending under `consumer` with delivery count `count`.
local function held(stream, group, consumer, id, count)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  return p[1] ~= nil and p[1][2] == consumer and tonumber(p[1][4]) == tonumber(count)
end
local function data_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'data' then return fields[i + 1] end
  end
  return ''
end
"#;

/// KEYS: stream, delayed, and the lane's wake-up channel when a delay is due soon. ARGV: per
/// message, delay ms ('0': now), a nonce and body. Returns how many were added. Delayed
/// messages wait in the delayed set (member `<nonce>|<body>`) until the receive that finds
/// them due adds them to the stream; the soonest is announced on the channel (see `wake`).
const PUBLISH: &str = r#"
local now = nil
local soonest = nil
for i = 1, #ARGV, 3 do
  local delay = tonumber(ARGV[i])
  if delay > 0 then
    now = now or now_ms()
    redis.call('ZADD', KEYS[2], now + delay, ARGV[i + 1] .. '|' .. ARGV[i + 2])
    if not soonest or delay < soonest then soonest = delay end
  else
    redis.call('XADD', KEYS[1], '*', 'data', ARGV[i + 2])
  end
end
if KEYS[3] and soonest then redis.call('PUBLISH', KEYS[3], soonest) end
return #ARGV / 3
"#;

/// KEYS: stream, leases, delayed. ARGV: group, consumer, lease ms, max, orphan ms. Adds the
/// due delayed messages to the stream, then takes over up to `max` entries whose lease ran
/// out (released ones, or a dead worker's), and entries pending longer than `orphan ms` with
/// no lease at all (a reader that died between its read and its lease). Returns the entries
/// taken (`{id, data, delivery count}` each) and the ms until the next delayed message is due
/// or the next lease ends (-1: neither).
const RECLAIM: &str = r#"
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
for _, m in ipairs(due) do
  local at = string.find(m, '|', 1, true)
  redis.call('XADD', KEYS[1], '*', 'data', string.sub(m, at + 1))
  redis.call('ZREM', KEYS[3], m)
end
local out = {}
local max = tonumber(ARGV[4])
local function take(id)
  local e = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id)
  if e[1] == nil or e[1] == false then
    -- Deleted while pending: nothing to deliver (and off the pending list, which Redis 6.2
    -- keeps it on).
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('ZREM', KEYS[2], id)
    return
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), id)
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  local count = 1
  if p[1] then count = tonumber(p[1][4]) end
  out[#out + 1] = {id, data_of(e[1][2]), count}
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, max)) do
  take(id)
end
-- Paged: entries with a lease (released for later, or held) are skipped, not counted.
local from = '-'
for _ = 1, 10 do
  if #out >= max then break end
  local idle = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', tonumber(ARGV[5]), from, '+', 100)
  for _, p in ipairs(idle) do
    if #out >= max then break end
    if not redis.call('ZSCORE', KEYS[2], p[1]) then take(p[1]) end
  end
  if #idle < 100 then break end
  from = '(' .. idle[#idle][1]
end
-- When to look again: the next delayed message's due time, or the next lease's end.
local next_ms = -1
for _, key in ipairs({KEYS[3], KEYS[2]}) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    local wait = math.max(0, tonumber(first[2]) - now)
    if next_ms < 0 or wait < next_ms then next_ms = wait end
  end
end
return {out, next_ms}
"#;

/// KEYS: stream, leases. ARGV: group, consumer, count, lease ms. New entries read without
/// waiting (no `BLOCK` in a script) and leased in the same run: a receive under load is one
/// round trip. Returns `{id, data, 1}` per entry (a first delivery).
const READ: &str = r#"
local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', tonumber(ARGV[3]),
  'STREAMS', KEYS[1], '>')
local out = {}
if not read then return out end
local until_ms = now_ms() + tonumber(ARGV[4])
for _, e in ipairs(read[1][2]) do
  redis.call('ZADD', KEYS[2], until_ms, e[1])
  out[#out + 1] = {e[1], data_of(e[2]), 1}
end
return out
"#;

/// KEYS: stream, leases. ARGV: lease ms, then per entry its id. Gives entries just read their
/// lease. Returns the count.
const LEASE: &str = r#"
local until_ms = now_ms() + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[2], until_ms, ARGV[i])
end
return #ARGV - 1
"#;

/// KEYS: stream, leases. ARGV: group, consumer, lease ms, then per entry id and count. Renews
/// each entry still held: its lease, and its idle time (so no idle-time reclaim, taskiq's
/// included, takes a run that heartbeats). Returns 1 (kept) or 0 (lost) per entry.
const EXTEND: &str = r#"
local until_ms = now_ms() + tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if held(KEYS[1], ARGV[1], ARGV[2], id, ARGV[i + 1]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
    redis.call('ZADD', KEYS[2], until_ms, id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"#;

/// KEYS: stream, leases. ARGV: group, consumer, then id and count per entry. Acks and deletes
/// the held entries (a stream keeps no entry it no longer needs). Returns, per entry, 1, or 0
/// when it is not held any more (or named twice: acked once).
const ACK: &str = r#"
local out, done, seen = {}, {}, {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  if not seen[id] and held(KEYS[1], ARGV[1], ARGV[2], id, ARGV[i + 1]) then
    seen[id] = true
    done[#done + 1] = id
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #done > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(done))
  redis.call('XDEL', KEYS[1], unpack(done))
  redis.call('ZREM', KEYS[2], unpack(done))
end
return out
"#;

/// KEYS: stream, leases, and the lane's wake-up channel when `after` is soon. ARGV: group,
/// consumer, id, count, after ms. A held entry's lease ends in `after ms`: the first receive
/// after that takes it; the channel is told (see `wake`). Returns 1, or 0 when not held.
const RELEASE: &str = r#"
if not held(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[2], now_ms() + tonumber(ARGV[5]), ARGV[3])
if KEYS[3] then redis.call('PUBLISH', KEYS[3], ARGV[5]) end
return 1
"#;

/// KEYS: stream, leases, dead. ARGV: group, consumer, id, count, body, reason, detail, task
/// name, attempts. Parks a held entry: a copy with why in the dead-letter stream, then the
/// entry acked and deleted. Returns 1, or 0 when not held.
const PARK: &str = r#"
if not held(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('XADD', KEYS[3], '*', 'data', ARGV[5], 'reason', ARGV[6], 'detail', ARGV[7],
  'task_name', ARGV[8], 'attempts', ARGV[9], 'dead_at', now_ms(), 'from', ARGV[3])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
"#;

/// KEYS: dead, held. ARGV: max, hold ms. Takes up to `max` dead letters not held by another
/// operator, oldest first, and holds them for `hold ms` (an operator that dies lets go).
/// Returns `{id, fields…}` per letter.
const TAKE_DEAD: &str = r#"
local now = now_ms()
local max = tonumber(ARGV[1])
local out = {}
local from = '-'
while #out < max do
  local page = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', 200)
  if #page == 0 then break end
  for _, e in ipairs(page) do
    local until_ms = tonumber(redis.call('ZSCORE', KEYS[2], e[1]) or '0')
    if until_ms <= now then
      redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), e[1])
      out[#out + 1] = e
      if #out >= max then break end
    end
  end
  if #page < 200 then break end
  from = '(' .. page[#page][1]
end
return out
"#;

/// KEYS: held. ARGV: ids. Lets held dead letters go, where they were.
const RETURN_DEAD: &str = r#"
for _, id in ipairs(ARGV) do redis.call('ZREM', KEYS[1], id) end
return #ARGV
"#;

/// KEYS: dead, held. ARGV: id. Removes a dead letter for good.
const DROP_DEAD: &str = r#"
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"#;

/// KEYS: stream, dead, held. ARGV: id, body. Removes the dead letter and sends the body back
/// to the lane's stream, in one script: never both and never neither. A letter already gone
/// (another operator redrove or purged it) sends nothing; returns 0 then.
const REDRIVE_DEAD: &str = r#"
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('XDEL', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[1], '*', 'data', ARGV[2])
return 1
"#;

/// KEYS: stream. ARGV: group, idle ms, consumer ('' for none). Removes from the group the
/// consumers that hold nothing and have not read for `idle ms` (each worker connection names
/// one: without this, every restart would leave one behind for good), and `consumer` itself
/// when it holds nothing. A consumer that holds entries is never removed: its entries would
/// leave the pending list, and nothing would deliver them again. Returns how many went.
const PRUNE: &str = r#"
local removed = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  local idle = tonumber(info['idle'] or 0)
  if tonumber(info['pending']) == 0 and (info['name'] == ARGV[3] or idle > tonumber(ARGV[2])) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed = removed + 1
  end
end
return removed
"#;

/// KEYS: stream. ARGV: group, active ms. How many of the group's consumers read within
/// `active ms`.
const ACTIVE_CONSUMERS: &str = r#"
local n = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if tonumber(info['idle'] or 0) <= tonumber(ARGV[2]) then n = n + 1 end
end
return n
"#;

/// The broker's scripts, loaded at connect.
pub(crate) struct StreamScripts {
    pub(crate) publish: Script,
    pub(crate) reclaim: Script,
    pub(crate) read: Script,
    pub(crate) lease: Script,
    pub(crate) extend: Script,
    pub(crate) ack: Script,
    pub(crate) release: Script,
    pub(crate) park: Script,
    pub(crate) take_dead: Script,
    pub(crate) return_dead: Script,
    pub(crate) drop_dead: Script,
    pub(crate) redrive_dead: Script,
    pub(crate) prune: Script,
    pub(crate) active_consumers: Script,
}

impl StreamScripts {
    pub(crate) fn new() -> Self {
        let script = |body: &str| Script::from_lua(format!("{PRELUDE}{body}"));
        StreamScripts {
            publish: script(PUBLISH),
            reclaim: script(RECLAIM),
            read: script(READ),
            lease: script(LEASE),
            extend: script(EXTEND),
            ack: script(ACK),
            release: script(RELEASE),
            park: script(PARK),
            take_dead: script(TAKE_DEAD),
            return_dead: script(RETURN_DEAD),
            drop_dead: script(DROP_DEAD),
            redrive_dead: script(REDRIVE_DEAD),
            prune: script(PRUNE),
            active_consumers: script(ACTIVE_CONSUMERS),
        }
    }

    pub(crate) fn all(&self) -> [&Script; 14] {
        [
            &self.publish,
            &self.reclaim,
            &self.read,
            &self.lease,
            &self.extend,
            &self.ack,
            &self.release,
            &self.park,
            &self.take_dead,
            &self.return_dead,
            &self.drop_dead,
            &self.redrive_dead,
            &self.prune,
            &self.active_consumers,
        ]
    }
}
