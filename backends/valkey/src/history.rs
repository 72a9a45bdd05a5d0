//! History on Valkey: one hash per minute (`{prefix}:history:{minute}`), a field per task and
//! count (`task␟ok`, `task␟fail`, `task␟<bucket>`), incremented by workers and expiring
//! [`HISTORY_KEPT`] after its last write. Only counts above zero are written, so a minute
//! holds at most 2 + 13 fields per task name that ran in it: a day of one task name is at
//! most 1,500 × 15 small fields.

use std::collections::HashMap;
use std::fmt::Write as _;

use ferriq::store::{FinishedTask, MinuteStats, StoreError, HISTORY_KEPT};
use ferriq::wire::TaskId;
use fred::bytes_utils::Str;
use fred::prelude::HashesInterface;
use fred::prelude::ListInterface;
use fred::types::scripts::Script;
use fred::types::Value;

use crate::argv::{self, millis_text};
use crate::error::store_error;
use crate::scripts;
use crate::ValkeyStore;

/// KEYS: the minute's hash. ARGV: ttl ms, then field, increment pairs.
const ADD: &str = r#"
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"#;

/// KEYS: a minute's list of one task and outcome. ARGV: ttl ms, then entries.
const PUSH: &str = r#"
redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"#;

/// Entries per script call (Lua's `unpack` takes a few thousand at most).
const PUSH_CHUNK: usize = 1000;

/// Separates a task's name from the count's name in a field.
const SEP: char = '\u{1f}';

impl ValkeyStore {
    fn history_key(&self, minute: u64) -> String {
        format!("{}:history:{minute}", self.prefix())
    }

    pub(crate) async fn add_history_minutes(
        &self,
        stats: &[MinuteStats],
    ) -> Result<(), StoreError> {
        let mut by_minute: HashMap<u64, Vec<String>> = HashMap::new();
        for s in stats {
            let args = by_minute.entry(s.minute).or_default();
            let mut push = |count: &str, n: u64| {
                if n > 0 {
                    args.push(format!("{}{SEP}{count}", s.task));
                    args.push(n.to_string());
                }
            };
            push("ok", s.succeeded);
            push("fail", s.failed);
            for (i, n) in s.durations.iter().enumerate() {
                push(&i.to_string(), *n);
            }
        }
        let script = Script::from_lua(ADD);
        for (minute, pairs) in by_minute {
            if pairs.is_empty() {
                continue;
            }
            let keys = vec![self.history_key(minute)];
            let mut args = vec![millis_text(HISTORY_KEPT)];
            args.extend(pairs);
            scripts::call(&self.core().pool, &script, || (keys.clone(), args.clone()))
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    pub(crate) async fn read_history(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<MinuteStats>, StoreError> {
        let minutes: Vec<u64> = (from..=to.min(from + HISTORY_KEPT.as_secs() / 60)).collect();
        let pool = &self.core().pool;
        let mut out = Vec::new();
        // Many at once (the client pipelines them), a bounded number in flight.
        for chunk in minutes.chunks(200) {
            let reads = chunk.iter().map(|m| {
                let key = self.history_key(*m);
                async move { pool.hgetall::<HashMap<String, u64>, _>(key).await }
            });
            let hashes = futures_util::future::join_all(reads).await;
            for (minute, hash) in chunk.iter().zip(hashes) {
                let hash = hash.map_err(store_error)?;
                let mut tasks: HashMap<&str, MinuteStats> = HashMap::new();
                for (field, n) in &hash {
                    let Some((task, count)) = field.rsplit_once(SEP) else {
                        continue;
                    };
                    let s = tasks
                        .entry(task)
                        .or_insert_with(|| MinuteStats::new(*minute, task));
                    match count {
                        "ok" => s.succeeded = *n,
                        "fail" => s.failed = *n,
                        i => {
                            if let Some(b) =
                                i.parse::<usize>().ok().and_then(|i| s.durations.get_mut(i))
                            {
                                *b = *n;
                            }
                        }
                    }
                }
                let mut tasks: Vec<MinuteStats> = tasks.into_values().collect();
                tasks.sort_by(|a, b| a.task.cmp(&b.task));
                out.extend(tasks);
            }
        }
        Ok(out)
    }

    /// The list of `task`'s finished tasks of `minute` with `failed` results (one per
    /// minute, task and outcome, so a search reads only what it asks for).
    fn finished_key(&self, minute: u64, task: &str, failed: bool) -> String {
        let outcome = if failed { "failed" } else { "ok" };
        format!("{}:finished:{minute}:{outcome}:{task}", self.prefix())
    }

    pub(crate) async fn add_finished_tasks(
        &self,
        finished: &[FinishedTask],
    ) -> Result<(), StoreError> {
        // Grouped by list before any key is written out: a worker sends thousands of finished
        // tasks at a time, most of them to a few lists, and each costs its entry's text only.
        let mut lists: HashMap<(u64, &str, bool), Vec<Value>> = HashMap::new();
        for f in finished {
            // "<ms> <id>": a u64 takes at most 20 digits, and one space.
            let mut entry = String::with_capacity(21 + f.task_id.as_str().len());
            let _ = write!(entry, "{} {}", f.at_ms, f.task_id);
            lists
                .entry((f.at_ms / 60_000, &*f.task, f.failed))
                .or_default()
                .push(Value::String(Str::from(entry)));
        }
        let script = Script::from_lua(PUSH);
        for ((minute, task, failed), entries) in lists {
            let key = self.finished_key(minute, task, failed);
            for chunk in entries.chunks(PUSH_CHUNK) {
                let args = || {
                    let mut args = Vec::with_capacity(1 + chunk.len());
                    args.push(argv::millis(HISTORY_KEPT));
                    args.extend(chunk.iter().cloned());
                    (vec![key.clone()], args)
                };
                scripts::call(&self.core().pool, &script, args)
                    .await
                    .map_err(store_error)?;
            }
        }
        Ok(())
    }

    pub(crate) async fn read_finished(
        &self,
        task: &str,
        failed: Option<bool>,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<FinishedTask>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let outcomes: &[bool] = match failed {
            Some(true) => &[true],
            Some(false) => &[false],
            None => &[false, true],
        };
        let pool = &self.core().pool;
        let last = to_ms / 60_000;
        let first = (from_ms / 60_000).max(last.saturating_sub(HISTORY_KEPT.as_secs() / 60));
        let parse = |e: &str| -> Option<(u64, TaskId)> {
            let (at, id) = e.split_once(' ')?;
            Some((at.parse().ok()?, TaskId::parse(id).ok()?))
        };
        let in_range = |e: &String| parse(e).is_some_and(|(at, _)| (from_ms..=to_ms).contains(&at));
        // A minute's newest `limit` (its list's tail: entries go in as workers add them); the
        // whole list only when the range cuts into that tail.
        let read = |key: String| async move {
            let tail: Vec<String> = pool.lrange(key.as_str(), -(limit as i64), -1).await?;
            if tail.len() == limit && !tail.iter().all(in_range) {
                return pool.lrange::<Vec<String>, _>(key.as_str(), 0, -1).await;
            }
            Ok(tail)
        };
        let mut found = Vec::new();
        // Newest minutes first, in batches that grow (1, 2, 4 … 64 minutes, read at once),
        // until `limit` are found or the range is read.
        let (mut end, mut batch) = (last, 1u64);
        loop {
            let start = end.saturating_sub(batch - 1).max(first);
            let keys: Vec<(String, bool)> = (start..=end)
                .rev()
                .flat_map(|m| outcomes.iter().map(move |f| (m, *f)))
                .map(|(m, f)| (self.finished_key(m, task, f), f))
                .collect();
            let lists =
                futures_util::future::join_all(keys.iter().map(|(k, _)| read(k.clone()))).await;
            for ((_, failed), entries) in keys.iter().zip(lists) {
                for e in entries.map_err(store_error)? {
                    if let Some((at_ms, task_id)) = parse(&e) {
                        if (from_ms..=to_ms).contains(&at_ms) {
                            found.push(FinishedTask::new(task_id, task.to_owned(), *failed, at_ms));
                        }
                    }
                }
            }
            if found.len() >= limit || start <= first {
                break;
            }
            end = start - 1;
            batch = (batch * 2).min(64);
        }
        found.sort_by_key(|f| std::cmp::Reverse(f.at_ms));
        found.truncate(limit);
        Ok(found)
    }
}
