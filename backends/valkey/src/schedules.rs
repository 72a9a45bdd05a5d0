//! Schedules on Valkey: run-time schedules (a hash of JSON specs), the last tick handled and
//! the last sent per schedule (two hashes, only ever raised), send markers and the leader
//! lease. Every key shares one hash tag, so the scripts that touch two of them work in a
//! cluster.

use std::time::Duration;

use async_trait::async_trait;
use ferriq::schedule::ScheduleSpec;
use ferriq::store::{ScheduleStore, StoreError};
use fred::prelude::{HashesInterface, KeysInterface};
use fred::types::scripts::Script;
use fred::types::Value;

use crate::argv::millis_text;
use crate::error::store_error;
use crate::scripts;
use crate::ValkeyStore;

/// KEYS: schedules, marker. ARGV: id, limit ms. 1 when marked, 0 when the schedule is gone.
const BEGIN_SENDING: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 1
"#;

/// KEYS: ticks handled, ticks sent. ARGV: id, tick, '1' when sent. Each mark only rises.
const RECORD_TICK: &str = r#"
local last = #KEYS
if ARGV[3] ~= '1' then last = 1 end
for k = 1, last do
  local cur = redis.call('HGET', KEYS[k], ARGV[1])
  if not cur or tonumber(cur) < tonumber(ARGV[2]) then redis.call('HSET', KEYS[k], ARGV[1], ARGV[2]) end
end
return 1
"#;

/// KEYS: leader. ARGV: scheduler, lease ms. 1 when it holds the lease.
const LEAD: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"#;

fn script(body: &str) -> Script {
    Script::from_lua(body)
}

impl ValkeyStore {
    fn schedule_key(&self, name: &str) -> String {
        format!("{}:{{schedules}}:{name}", self.prefix())
    }

    /// A schedule's tick mark in hash `name`.
    async fn tick_mark(&self, name: &str, id: &str) -> Result<Option<i64>, StoreError> {
        let v: Option<String> = self
            .core()
            .pool
            .hget(self.schedule_key(name), id)
            .await
            .map_err(store_error)?;
        Ok(v.and_then(|t| t.parse().ok()))
    }

    async fn run_script(
        &self,
        body: &str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        scripts::call(&self.core().pool, &script(body), || {
            (keys.clone(), args.clone())
        })
        .await
        .map_err(store_error)
    }
}

fn corrupt(id: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        task_id: id.to_owned(),
        reason: format!("schedule record: {e}"),
    }
}

#[async_trait]
impl ScheduleStore for ValkeyStore {
    async fn put_schedule(&self, spec: &ScheduleSpec) -> Result<(), StoreError> {
        let json = serde_json::to_string(spec).map_err(|e| corrupt(&spec.id, e))?;
        let _: Value = self
            .core()
            .pool
            .hset(self.schedule_key("specs"), (spec.id.as_str(), json))
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn remove_schedule(&self, id: &str, sending_limit: Duration) -> Result<bool, StoreError> {
        let removed: i64 = self
            .core()
            .pool
            .hdel(self.schedule_key("specs"), id)
            .await
            .map_err(store_error)?;
        let marker = self.schedule_key(&format!("sending:{id}"));
        let deadline = tokio::time::Instant::now() + sending_limit;
        loop {
            let sending: i64 = self
                .core()
                .pool
                .exists(marker.as_str())
                .await
                .map_err(store_error)?;
            if sending == 0 || tokio::time::Instant::now() >= deadline {
                return Ok(removed == 1);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn schedules(&self) -> Result<Vec<ScheduleSpec>, StoreError> {
        let all: std::collections::HashMap<String, String> = self
            .core()
            .pool
            .hgetall(self.schedule_key("specs"))
            .await
            .map_err(store_error)?;
        let mut specs = all
            .iter()
            .map(|(id, json)| serde_json::from_str(json).map_err(|e| corrupt(id, e)))
            .collect::<Result<Vec<ScheduleSpec>, _>>()?;
        specs.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(specs)
    }

    async fn begin_sending(&self, id: &str, limit: Duration) -> Result<bool, StoreError> {
        let v = self
            .run_script(
                BEGIN_SENDING,
                vec![
                    self.schedule_key("specs"),
                    self.schedule_key(&format!("sending:{id}")),
                ],
                vec![id.to_owned(), millis_text(limit)],
            )
            .await?;
        Ok(v.as_i64() == Some(1))
    }

    async fn end_sending(&self, id: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .core()
            .pool
            .del(self.schedule_key(&format!("sending:{id}")))
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn last_tick(&self, id: &str) -> Result<Option<i64>, StoreError> {
        self.tick_mark("ticks", id).await
    }

    async fn last_sent_tick(&self, id: &str) -> Result<Option<i64>, StoreError> {
        self.tick_mark("sent", id).await
    }

    async fn record_tick(&self, id: &str, tick: i64, sent: bool) -> Result<(), StoreError> {
        let sent = if sent { "1" } else { "0" };
        self.run_script(
            RECORD_TICK,
            vec![self.schedule_key("ticks"), self.schedule_key("sent")],
            vec![id.to_owned(), tick.to_string(), sent.to_owned()],
        )
        .await
        .map(|_| ())
    }

    async fn lead(&self, scheduler: &str, lease: Duration) -> Result<bool, StoreError> {
        let v = self
            .run_script(
                LEAD,
                vec![self.schedule_key("leader")],
                vec![scheduler.to_owned(), millis_text(lease)],
            )
            .await?;
        Ok(v.as_i64() == Some(1))
    }

    async fn leader(&self) -> Result<Option<String>, StoreError> {
        self.core().read(self.schedule_key("leader")).await
    }

    async fn set_paused(&self, id: &str, paused: bool) -> Result<(), StoreError> {
        let key = self.schedule_key("paused");
        let pool = &self.core().pool;
        // A hash of ids (HKEYS lists them), as the other schedule records are.
        let changed: Result<i64, _> = if paused {
            pool.hset(key, (id, "1")).await
        } else {
            pool.hdel(key, id).await
        };
        changed.map(|_| ()).map_err(store_error)
    }

    async fn paused(&self) -> Result<Vec<String>, StoreError> {
        let mut ids: Vec<String> = self
            .core()
            .pool
            .hkeys(self.schedule_key("paused"))
            .await
            .map_err(store_error)?;
        ids.sort();
        Ok(ids)
    }

    async fn put_declared(&self, specs: &[ScheduleSpec]) -> Result<(), StoreError> {
        let json = serde_json::to_string(specs).map_err(|e| corrupt("declared", e))?;
        let _: Value = self
            .core()
            .pool
            .set(self.schedule_key("declared"), json, None, None, false)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn declared(&self) -> Result<Vec<ScheduleSpec>, StoreError> {
        match self.core().read(self.schedule_key("declared")).await? {
            None => Ok(Vec::new()),
            Some(json) => serde_json::from_str(&json).map_err(|e| corrupt("declared", e)),
        }
    }
}
