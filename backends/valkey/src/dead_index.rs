//! The dead-letter index on Valkey, per lane and under one hash tag (`{prefix}:dead:{lane}`):
//!
//! - `…:all` — a sorted set of every entry's key, scored by when it was parked (ms);
//! - `…:task:<name>` and `…:reason:<reason>` — the same, per task name and per reason, so a
//!   filter on either reads only its entries;
//! - `…:entries` — a hash, key → the entry as JSON; `…:text` — key → its error text in lower
//!   case, what an error-text filter scans;
//! - `…:sets` — a hash naming the per-task and per-reason sets, so a clear finds them.
//!
//! Entries stay until redriven, purged or re-indexed: dead letters do not expire. An entry
//! costs the server about 0.8 KB with a short error text and at most about 2 KB (error text and
//! arguments are cut): 100,000 dead letters with short errors measured 82 MB.

use std::collections::HashMap;

use ferriq::dead_letters::DeadFilter;
use ferriq::store::{DeadEntry, DeadPage, StoreError};
use ferriq::wire::TaskId;
use fred::prelude::{HashesInterface, KeysInterface};
use fred::types::scripts::Script;
use fred::types::Value;
use serde_json::json;

use crate::error::store_error;
use crate::scripts;
use crate::ValkeyStore;

/// KEYS: all, entries, text, sets, then the per-task/per-reason sets. ARGV per entry: key,
/// parked ms, JSON, text, then the KEYS index of its old task set, old reason set, new task
/// set, new reason set (0: none).
const ADD: &str = r#"
for i = 1, #ARGV, 8 do
  local k = ARGV[i]
  for j = 4, 5 do
    local z = tonumber(ARGV[i + j])
    if z > 0 then redis.call('ZREM', KEYS[z], k) end
  end
  for j = 6, 7 do
    local z = tonumber(ARGV[i + j])
    if z > 0 then
      redis.call('ZADD', KEYS[z], ARGV[i + 1], k)
      redis.call('HSET', KEYS[4], KEYS[z], 1)
    end
  end
  redis.call('ZADD', KEYS[1], ARGV[i + 1], k)
  redis.call('HSET', KEYS[2], k, ARGV[i + 2])
  redis.call('HSET', KEYS[3], k, ARGV[i + 3])
end
return 1
"#;

/// KEYS: all, entries, text, then per-task/per-reason sets. ARGV per key: key, then the KEYS
/// index of its task set and reason set (0: none).
const REMOVE: &str = r#"
for i = 1, #ARGV, 3 do
  local k = ARGV[i]
  redis.call('ZREM', KEYS[1], k)
  redis.call('HDEL', KEYS[2], k)
  redis.call('HDEL', KEYS[3], k)
  for j = 1, 2 do
    local z = tonumber(ARGV[i + j])
    if z > 0 then redis.call('ZREM', KEYS[z], k) end
  end
end
return 1
"#;

/// KEYS: the set read, all. ARGV: newest score, offset, limit. Returns matches in all, entries
/// in the lane, then the page's keys (newest first).
const PAGE: &str = r#"
local total = redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[1])
local indexed = redis.call('ZCARD', KEYS[2])
local keys = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], '-inf', 'LIMIT', ARGV[2], ARGV[3])
return {total, indexed, keys}
"#;

/// KEYS: the set read, text, the reason set to check (or the set read again). ARGV: newest
/// score, first rank, count, text looked for ('' any), whether to check the reason set. Returns
/// the rank after the batch (-1 at the end) and the batch's matching keys, newest first.
const SCAN: &str = r#"
local first = tonumber(ARGV[2])
if first == 0 then
  first = redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[1], '+inf')
end
local keys = redis.call('ZREVRANGE', KEYS[1], first, first + tonumber(ARGV[3]) - 1)
local out = {}
local needle = ARGV[4]
for _, k in ipairs(keys) do
  local ok = true
  if ARGV[5] == '1' and not redis.call('ZSCORE', KEYS[3], k) then ok = false end
  if ok and needle ~= '' then
    local t = redis.call('HGET', KEYS[2], k)
    ok = t and string.find(t, needle, 1, true) ~= nil
  end
  if ok then out[#out + 1] = k end
end
local next = first + #keys
if #keys < tonumber(ARGV[3]) then next = -1 end
return {next, out}
"#;

/// KEYS: a set. Returns its size.
const CARD: &str = "return redis.call('ZCARD', KEYS[1])";

/// Keys scanned per SCAN call: a few milliseconds of server time each.
const SCAN_BATCH: usize = 2000;

/// Entries per ADD or REMOVE call.
const WRITE_BATCH: usize = 500;

/// A lane's keys.
struct LaneKeys {
    base: String,
}

impl LaneKeys {
    fn all(&self) -> String {
        format!("{}:all", self.base)
    }
    fn entries(&self) -> String {
        format!("{}:entries", self.base)
    }
    fn text(&self) -> String {
        format!("{}:text", self.base)
    }
    fn sets(&self) -> String {
        format!("{}:sets", self.base)
    }
    fn task(&self, name: &str) -> String {
        format!("{}:task:{name}", self.base)
    }
    fn reason(&self, reason: &str) -> String {
        format!("{}:reason:{reason}", self.base)
    }
}

/// An entry as stored.
fn encode(e: &DeadEntry) -> String {
    json!({
        "t": e.task_id.as_ref().map(|t| t.as_str()),
        "n": e.task_name,
        "r": e.reason,
        "d": e.detail,
        "a": e.attempts,
        "at": e.dead_at_ms,
        "g": e.arguments,
    })
    .to_string()
}

/// An entry as read back (`None`: unreadable, skipped).
fn decode(lane: &str, key: &str, raw: &str) -> Option<DeadEntry> {
    let v: serde_json::Value = serde_json::from_str(raw).ok()?;
    let text = |f: &str| v.get(f).and_then(|x| x.as_str()).map(str::to_owned);
    let task_id = text("t").and_then(|t| TaskId::parse(&t).ok());
    let mut e = DeadEntry::new(lane, task_id, b"")
        .detail(&text("d").unwrap_or_default())
        .attempts(v.get("a").and_then(|a| a.as_u64()).unwrap_or(0) as u32)
        .dead_at_ms(v.get("at").and_then(|a| a.as_u64()).unwrap_or(0));
    e.key = key.to_owned();
    e.task_name = text("n");
    e.reason = text("r");
    e.arguments = text("g").unwrap_or_default();
    Some(e)
}

/// KEYS and their indexes for a script call: the fixed keys first, each other set once.
struct KeyList {
    keys: Vec<String>,
    at: HashMap<String, usize>,
}

impl KeyList {
    fn new(fixed: Vec<String>) -> Self {
        KeyList {
            keys: fixed,
            at: HashMap::new(),
        }
    }
    /// The 1-based index of `key` (added when new), or 0 for none.
    fn index(&mut self, key: Option<String>) -> String {
        let Some(key) = key else {
            return "0".into();
        };
        if let Some(i) = self.at.get(&key) {
            return i.to_string();
        }
        self.keys.push(key.clone());
        let i = self.keys.len();
        self.at.insert(key, i);
        i.to_string()
    }
}

impl KeyList {
    /// The KEYS indexes of `entry`'s task set and reason set (0 for none, or no entry).
    fn sets_of(&mut self, lk: &LaneKeys, entry: Option<&DeadEntry>) -> [String; 2] {
        [
            self.index(
                entry
                    .and_then(|e| e.task_name.as_deref())
                    .map(|n| lk.task(n)),
            ),
            self.index(
                entry
                    .and_then(|e| e.reason.as_deref())
                    .map(|r| lk.reason(r)),
            ),
        ]
    }
}

impl ValkeyStore {
    fn dead_keys(&self, lane: &str) -> LaneKeys {
        LaneKeys {
            base: format!("{}:dead:{{{}:{lane}}}", self.prefix(), self.prefix()),
        }
    }

    /// The stored entries of `keys` (absent ones skipped).
    async fn read_entries(
        &self,
        lane: &str,
        keys: &[String],
    ) -> Result<HashMap<String, DeadEntry>, StoreError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let raw: Vec<Option<String>> = self
            .core()
            .pool
            .hmget(self.dead_keys(lane).entries(), keys.to_vec())
            .await
            .map_err(store_error)?;
        Ok(keys
            .iter()
            .zip(raw)
            .filter_map(|(k, r)| Some((k.clone(), decode(lane, k, &r?)?)))
            .collect())
    }

    pub(crate) async fn add_dead_entries(&self, entries: &[DeadEntry]) -> Result<(), StoreError> {
        let mut by_lane: HashMap<&str, Vec<&DeadEntry>> = HashMap::new();
        for e in entries {
            by_lane.entry(e.lane.as_str()).or_default().push(e);
        }
        let script = Script::from_lua(ADD);
        for (lane, entries) in by_lane {
            let lk = self.dead_keys(lane);
            for chunk in entries.chunks(WRITE_BATCH) {
                let keys: Vec<String> = chunk.iter().map(|e| e.key.clone()).collect();
                let old = self.read_entries(lane, &keys).await?;
                let mut list = KeyList::new(vec![lk.all(), lk.entries(), lk.text(), lk.sets()]);
                let mut argv = Vec::with_capacity(chunk.len() * 8);
                for e in chunk {
                    let prior = old.get(&e.key);
                    argv.push(e.key.clone());
                    argv.push(e.dead_at_ms.to_string());
                    argv.push(encode(e));
                    argv.push(e.detail.to_lowercase());
                    argv.extend(list.sets_of(&lk, prior));
                    argv.extend(list.sets_of(&lk, Some(*e)));
                }
                let keys = list.keys;
                scripts::call(&self.core().pool, &script, || (keys.clone(), argv.clone()))
                    .await
                    .map_err(store_error)?;
            }
        }
        Ok(())
    }

    pub(crate) async fn remove_dead_entries(
        &self,
        lane: &str,
        keys: &[String],
    ) -> Result<(), StoreError> {
        let lk = self.dead_keys(lane);
        let script = Script::from_lua(REMOVE);
        for chunk in keys.chunks(WRITE_BATCH) {
            let old = self.read_entries(lane, chunk).await?;
            let mut list = KeyList::new(vec![lk.all(), lk.entries(), lk.text()]);
            let mut argv = Vec::with_capacity(chunk.len() * 3);
            for k in chunk {
                let prior = old.get(k);
                argv.push(k.clone());
                argv.extend(list.sets_of(&lk, prior));
            }
            let keys = list.keys;
            scripts::call(&self.core().pool, &script, || (keys.clone(), argv.clone()))
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    pub(crate) async fn clear_dead_entries(&self, lane: &str) -> Result<(), StoreError> {
        let lk = self.dead_keys(lane);
        let pool = &self.core().pool;
        let mut doomed: Vec<String> = pool.hkeys(lk.sets()).await.map_err(store_error)?;
        doomed.extend([lk.all(), lk.entries(), lk.text(), lk.sets()]);
        // All under one hash tag, so one DEL on a cluster too.
        let _: i64 = pool.del(doomed).await.map_err(store_error)?;
        Ok(())
    }

    pub(crate) async fn read_dead_index(
        &self,
        lane: &str,
        filter: &DeadFilter,
        now_ms: u64,
        offset: usize,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        let lk = self.dead_keys(lane);
        let pool = &self.core().pool;
        let indexed = || async {
            let keys = vec![lk.all()];
            let v = scripts::call(pool, &Script::from_lua(CARD), || {
                (keys.clone(), Vec::<String>::new())
            })
            .await
            .map_err(store_error)?;
            Ok::<u64, StoreError>(v.as_u64().unwrap_or(0))
        };
        // A selection or one task: read those entries and filter them here.
        let named: Vec<String> = match (&filter.task_id, filter.keys.is_empty()) {
            (Some(id), true) => vec![id.as_str().to_owned()],
            (_, false) => filter.keys.clone(),
            (None, true) => Vec::new(),
        };
        if !named.is_empty() {
            let found = self.read_entries(lane, &named).await?;
            let mut found: Vec<DeadEntry> = found
                .into_values()
                .filter(|e| e.matches(filter, now_ms))
                .collect();
            found.sort_by(|a, b| b.dead_at_ms.cmp(&a.dead_at_ms).then(b.key.cmp(&a.key)));
            let total = found.len() as u64;
            let page = found.into_iter().skip(offset).take(limit).collect();
            return Ok(DeadPage::new(page, total, indexed().await?));
        }
        if filter.id.is_some() || !filter.ids.is_empty() {
            // The broker's ids are not kept here.
            return Ok(DeadPage::new(Vec::new(), 0, indexed().await?));
        }
        let newest = match filter.older_than {
            Some(age) => now_ms.saturating_sub(age.as_millis().min(u64::MAX as u128) as u64),
            None => u64::MAX >> 11, // beyond any ms timestamp, exact as a double
        };
        let (read, check_reason) = match (&filter.task_name, &filter.reason) {
            (Some(n), Some(_)) => (lk.task(n), true),
            (Some(n), None) => (lk.task(n), false),
            (None, Some(r)) => (lk.reason(r), false),
            (None, None) => (lk.all(), false),
        };
        let needle = filter.detail_contains.clone().unwrap_or_default();
        let page_keys: Vec<String>;
        let total: u64;
        let indexed_now: u64;
        if needle.is_empty() && !check_reason {
            let keys = vec![read.clone(), lk.all()];
            let argv = vec![newest.to_string(), offset.to_string(), limit.to_string()];
            let script = Script::from_lua(PAGE);
            let v = scripts::call(pool, &script, || (keys.clone(), argv.clone()))
                .await
                .map_err(store_error)?;
            let Value::Array(parts) = v else {
                return Err(StoreError::Unavailable(
                    "valkey: unexpected reply to the dead-letter page".into(),
                ));
            };
            total = parts.first().and_then(|v| v.as_u64()).unwrap_or(0);
            indexed_now = parts.get(1).and_then(|v| v.as_u64()).unwrap_or(0);
            page_keys = strings(parts.get(2));
        } else {
            let reason_set = match (&filter.task_name, &filter.reason) {
                (Some(_), Some(r)) => lk.reason(r),
                _ => read.clone(),
            };
            let keys = vec![read.clone(), lk.text(), reason_set];
            let script = Script::from_lua(SCAN);
            let (mut rank, mut matched) = (0i64, 0usize);
            let mut picked = Vec::new();
            loop {
                let argv = vec![
                    newest.to_string(),
                    rank.to_string(),
                    SCAN_BATCH.to_string(),
                    needle.clone(),
                    if check_reason { "1" } else { "0" }.to_owned(),
                ];
                let v = scripts::call(pool, &script, || (keys.clone(), argv.clone()))
                    .await
                    .map_err(store_error)?;
                let Value::Array(parts) = v else {
                    return Err(StoreError::Unavailable(
                        "valkey: unexpected reply to the dead-letter scan".into(),
                    ));
                };
                let next = parts.first().and_then(|v| v.as_i64()).unwrap_or(-1);
                for k in strings(parts.get(1)) {
                    if matched >= offset && picked.len() < limit {
                        picked.push(k);
                    }
                    matched += 1;
                }
                // A next rank of 0 would mean "find the start" again: the scan has ended.
                if next <= 0 {
                    break;
                }
                rank = next;
            }
            total = matched as u64;
            indexed_now = indexed().await?;
            page_keys = picked;
        }
        let mut found = self.read_entries(lane, &page_keys).await?;
        let entries = page_keys.iter().filter_map(|k| found.remove(k)).collect();
        Ok(DeadPage::new(entries, total, indexed_now))
    }
}

/// The strings of a reply's array.
fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) => items.iter().filter_map(|i| i.as_string()).collect(),
        _ => Vec::new(),
    }
}
