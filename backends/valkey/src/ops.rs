//! Workers' reports and redrive resets on Valkey.
//!
//! A worker's report is a key of its own with a TTL, indexed by a sorted set scored by when it
//! expires (server time), so listing needs no SCAN; both under one hash tag.

use std::time::Duration;

use async_trait::async_trait;
use ferriq::dead_letters::DeadFilter;
use ferriq::store::{
    DeadEntry, DeadPage, FinishedTask, MinuteStats, OpsStore, RedriveReset, StoreError, WorkerInfo,
};
use ferriq::wire::TaskId;
use fred::prelude::KeysInterface;
use fred::types::scripts::Script;
use fred::types::Value;

use crate::argv::millis_text;
use crate::error::store_error;
use crate::scripts;
use crate::ValkeyStore;

/// KEYS: report, index. ARGV: id, JSON, ttl ms.
const REPORT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return 1
"#;

/// KEYS: index. ARGV: key prefix of reports. Returns the live reports.
const LIST: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('GET', ARGV[1] .. id)
  if v then out[#out + 1] = v end
end
return out
"#;

/// KEYS: the jobs hash. ARGV: ttl ms, id, JSON.
const RECORD_JOB: &str = r#"
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"#;

impl ValkeyStore {
    fn workers_key(&self, name: &str) -> String {
        format!("{}:{{workers}}:{name}", self.prefix())
    }
}

#[async_trait]
impl OpsStore for ValkeyStore {
    async fn report_worker(&self, info: &WorkerInfo, ttl: Duration) -> Result<(), StoreError> {
        let json = serde_json::to_string(info).map_err(|e| StoreError::Corrupt {
            task_id: info.id.clone(),
            reason: e.to_string(),
        })?;
        let keys = vec![
            self.workers_key(&format!("w:{}", info.id)),
            self.workers_key("index"),
        ];
        let args = vec![info.id.clone(), json, millis_text(ttl)];
        scripts::call(&self.core().pool, &Script::from_lua(REPORT), || {
            (keys.clone(), args.clone())
        })
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn forget_worker(&self, id: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .core()
            .pool
            .del(self.workers_key(&format!("w:{id}")))
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerInfo>, StoreError> {
        let keys = vec![self.workers_key("index")];
        let args = vec![self.workers_key("w:")];
        let v = scripts::call(&self.core().pool, &Script::from_lua(LIST), || {
            (keys.clone(), args.clone())
        })
        .await
        .map_err(store_error)?;
        let mut all = Vec::new();
        for raw in v.into_array() {
            let Some(json) = raw.as_string() else {
                continue;
            };
            match serde_json::from_str::<WorkerInfo>(&json) {
                Ok(w) => all.push(w),
                Err(e) => tracing::warn!(error = %e, "unreadable worker report skipped"),
            }
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    async fn reset_for_redrive(
        &self,
        id: &TaskId,
        dead_letter_id: &str,
    ) -> Result<RedriveReset, StoreError> {
        let core = self.core();
        let claim = core.keys.claim(id);
        // Tagged like the claim: one slot for the script.
        let marker = format!(
            "{}:redrive:{{{}:{}}}:{dead_letter_id}",
            self.prefix(),
            self.prefix(),
            id
        );
        let keys = vec![claim, core.keys.result(id), marker];
        let args = vec![millis_text(core.settings.claim_ttl)];
        let v: Value = scripts::call(&core.pool, &core.scripts.reset, || {
            (keys.clone(), args.clone())
        })
        .await
        .map_err(store_error)?;
        let outcome = match v.as_string().as_deref() {
            Some("reset") => RedriveReset::Reset,
            Some("already") => RedriveReset::AlreadyReset,
            Some("running") => RedriveReset::Running,
            other => {
                return Err(StoreError::Unavailable(format!(
                    "unexpected reset reply from valkey: {other:?}"
                )))
            }
        };
        if outcome == RedriveReset::Reset {
            // Another slot in a cluster: best effort (progress is advice).
            let _: Result<i64, _> = core.pool.del(core.keys.progress(id)).await;
        }
        Ok(outcome)
    }

    async fn add_history(&self, stats: &[MinuteStats]) -> Result<(), StoreError> {
        self.add_history_minutes(stats).await
    }

    async fn history(&self, from: u64, to: u64) -> Result<Vec<MinuteStats>, StoreError> {
        self.read_history(from, to).await
    }

    async fn record_job(&self, id: &str, json: &str, ttl: Duration) -> Result<(), StoreError> {
        // One hash of every job: it expires `ttl` after the last record of any.
        let keys = vec![format!("{}:ops-jobs", self.prefix())];
        let args = vec![millis_text(ttl), id.to_owned(), json.to_owned()];
        scripts::call(&self.core().pool, &Script::from_lua(RECORD_JOB), || {
            (keys.clone(), args.clone())
        })
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn jobs(&self) -> Result<Vec<String>, StoreError> {
        use fred::prelude::HashesInterface;
        let all: std::collections::HashMap<String, String> = self
            .core()
            .pool
            .hgetall(format!("{}:ops-jobs", self.prefix()))
            .await
            .map_err(store_error)?;
        Ok(all.into_values().collect())
    }

    async fn add_finished(&self, finished: &[FinishedTask]) -> Result<(), StoreError> {
        self.add_finished_tasks(finished).await
    }

    async fn finished(
        &self,
        task: &str,
        failed: Option<bool>,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<FinishedTask>, StoreError> {
        self.read_finished(task, failed, from_ms, to_ms, limit)
            .await
    }

    async fn index_dead(&self, entries: &[DeadEntry]) -> Result<(), StoreError> {
        self.add_dead_entries(entries).await
    }

    async fn unindex_dead(&self, lane: &str, keys: &[String]) -> Result<(), StoreError> {
        self.remove_dead_entries(lane, keys).await
    }

    async fn clear_dead_index(&self, lane: &str) -> Result<(), StoreError> {
        self.clear_dead_entries(lane).await
    }

    async fn dead_index(
        &self,
        lane: &str,
        filter: &DeadFilter,
        now_ms: u64,
        offset: usize,
        limit: usize,
    ) -> Result<Option<DeadPage>, StoreError> {
        Ok(Some(
            self.read_dead_index(lane, filter, now_ms, offset, limit)
                .await?,
        ))
    }
}
