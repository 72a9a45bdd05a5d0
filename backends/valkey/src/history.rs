//! History on Valkey: one hash per minute (`{prefix}:history:{minute}`), a field per task and
//! count (`task␟ok`, `task␟fail`, `task␟<bucket>`), incremented by workers and expiring
//! [`HISTORY_KEPT`] after its last write. Only counts above zero are written, so a minute
//! holds at most 2 + 13 fields per task name that ran in it: a day of one task name is at
//! most 1,500 × 15 small fields.

use std::collections::HashMap;

use ferriq::store::{MinuteStats, StoreError, HISTORY_KEPT};
use fred::prelude::HashesInterface;
use fred::types::scripts::Script;

use crate::error::store_error;
use crate::ops::ms;
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
            let mut args = vec![ms(HISTORY_KEPT)];
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
}
