//! Groups, chains, results written outside a run, progress and claim details on Valkey.
//!
//! A group is a hash (`record`, `size`, `done`, `failed`, `settled`) and a bitmap of the
//! members counted, under one hash tag: counting a member sets its bit and, only if the bit
//! was clear, bumps the count — once per member however often it is replayed, in one script.

use async_trait::async_trait;
use ferriq::store::{
    ChainRecord, ClaimInfo, ClaimState, GroupMark, GroupRecord, GroupState, ProgressStore,
    ResultStatus, StoreError, TaskProgress, Token, WorkflowStore,
};
use ferriq::wire::{TaskId, TaskResult};
use fred::prelude::{HashesInterface, KeysInterface};
use fred::types::{Expiration, SetOptions, Value};

use crate::argv::millis_text;
use crate::error::store_error;
use crate::scripts;
use crate::store::parse_record;
use crate::ValkeyStore;

fn corrupt(id: &TaskId, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        task_id: id.to_string(),
        reason: reason.into(),
    }
}

impl ValkeyStore {
    fn ttl_ms(&self) -> String {
        millis_text(self.core().settings.claim_ttl)
    }

    fn mark_of(reply: Vec<Value>, id: &TaskId) -> Result<GroupMark, StoreError> {
        let n = |i: usize| reply.get(i).and_then(Value::as_i64).unwrap_or(0);
        match n(0) {
            -1 => Err(corrupt(id, "no such group (never created, or expired)")),
            -2 => Err(corrupt(id, "member index outside the group")),
            _ => Ok(GroupMark::new(
                n(0).max(0) as u32,
                n(1).max(0) as u32,
                n(2).max(0) as u32,
                n(3) == 1,
            )),
        }
    }
}

#[async_trait]
impl WorkflowStore for ValkeyStore {
    async fn create_group(&self, record: &GroupRecord) -> Result<bool, StoreError> {
        let core = self.core();
        let (hash, members) = core.keys.group(&record.id);
        let json = serde_json::to_string(record).map_err(|e| corrupt(&record.id, e.to_string()))?;
        let v = scripts::call(&core.pool, &core.scripts.create_group, || {
            (
                vec![hash.clone(), members.clone()],
                vec![json.clone(), record.size.to_string(), self.ttl_ms()],
            )
        })
        .await
        .map_err(store_error)?;
        Ok(v.as_i64() == Some(1))
    }

    async fn group(&self, id: &TaskId) -> Result<Option<GroupState>, StoreError> {
        let core = self.core();
        let (hash, _) = core.keys.group(id);
        let fields: std::collections::HashMap<String, String> =
            core.pool.hgetall(hash).await.map_err(store_error)?;
        let Some(raw) = fields.get("record") else {
            return Ok(None);
        };
        let record: GroupRecord =
            serde_json::from_str(raw).map_err(|e| corrupt(id, format!("group record: {e}")))?;
        let n = |k: &str| {
            fields
                .get(k)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        };
        let mark = GroupMark::new(
            n("done"),
            n("failed"),
            record.size,
            fields.contains_key("settled"),
        );
        Ok(Some(GroupState::new(record, mark)))
    }

    async fn count_member(
        &self,
        id: &TaskId,
        index: u32,
        failed: bool,
    ) -> Result<GroupMark, StoreError> {
        let core = self.core();
        let (hash, members) = core.keys.group(id);
        let v = scripts::call(&core.pool, &core.scripts.count_member, || {
            (
                vec![hash.clone(), members.clone()],
                vec![index.to_string(), if failed { "1" } else { "0" }.to_owned()],
            )
        })
        .await
        .map_err(store_error)?;
        Self::mark_of(v.into_array(), id)
    }

    async fn settle_group(&self, id: &TaskId) -> Result<bool, StoreError> {
        let core = self.core();
        let (hash, _) = core.keys.group(id);
        let first: i64 = core
            .pool
            .hsetnx(hash, "settled", 1)
            .await
            .map_err(store_error)?;
        Ok(first == 1)
    }

    async fn create_chain(&self, record: &ChainRecord) -> Result<bool, StoreError> {
        let core = self.core();
        let json = serde_json::to_string(record).map_err(|e| corrupt(&record.id, e.to_string()))?;
        let ttl = core.settings.claim_ttl.as_millis() as i64;
        let set: Option<String> = core
            .pool
            .set(
                core.keys.chain(&record.id),
                json,
                Some(Expiration::PX(ttl)),
                Some(SetOptions::NX),
                false,
            )
            .await
            .map_err(store_error)?;
        Ok(set.is_some())
    }

    async fn chain(&self, id: &TaskId) -> Result<Option<ChainRecord>, StoreError> {
        let Some(raw) = self.core().read(self.core().keys.chain(id)).await? else {
            return Ok(None);
        };
        serde_json::from_str(&raw)
            .map(Some)
            .map_err(|e| corrupt(id, format!("chain record: {e}")))
    }

    async fn store_result_once(
        &self,
        id: &TaskId,
        result: &TaskResult,
    ) -> Result<bool, StoreError> {
        let core = self.core();
        let json = serde_json::to_string(result).map_err(|e| corrupt(id, e.to_string()))?;
        let result_ttl = core
            .settings
            .result_ttl
            .map_or_else(|| "0".to_owned(), millis_text);
        let v = scripts::call(&core.pool, &core.scripts.store_once, || {
            (
                vec![core.keys.claim(id), core.keys.result(id)],
                vec![
                    json.clone(),
                    result_ttl.clone(),
                    self.ttl_ms(),
                    core.keys.done_channel(id),
                    id.to_string(),
                ],
            )
        })
        .await
        .map_err(store_error)?;
        let written = v.as_i64() == Some(1);
        if written {
            self.wake_local(id);
        }
        Ok(written)
    }

    async fn get_many(&self, ids: &[TaskId]) -> Result<Vec<ResultStatus>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        // Reads spread over the pool, a bounded number at once.
        for chunk in ids.chunks(256) {
            let reads = chunk
                .iter()
                .map(|id| ferriq::store::ResultStore::get(self, id));
            for r in futures_util::future::join_all(reads).await {
                out.push(r?);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ProgressStore for ValkeyStore {
    async fn set_progress(
        &self,
        id: &TaskId,
        token: Token,
        progress: &TaskProgress,
    ) -> Result<bool, StoreError> {
        // Read, then write: the progress key is taskiq-redis's (no hash tag), so it may live
        // in another cluster slot than the claim. A run taken over in between may write one
        // last progress value; progress is advice, results are fenced.
        let core = self.core();
        let current = match core.read(core.keys.claim(id)).await? {
            Some(raw) => parse_record(&raw).is_some_and(|r| r.state == 'r' && r.token == token.0),
            None => false,
        };
        if !current {
            return Ok(false);
        }
        let json = serde_json::to_string(progress).map_err(|e| corrupt(id, e.to_string()))?;
        let expire = core
            .settings
            .result_ttl
            .map(|t| Expiration::PX(t.as_millis() as i64));
        let _: Value = core
            .pool
            .set(core.keys.progress(id), json, expire, None, false)
            .await
            .map_err(store_error)?;
        Ok(true)
    }

    async fn progress(&self, id: &TaskId) -> Result<Option<TaskProgress>, StoreError> {
        let Some(raw) = self.core().read(self.core().keys.progress(id)).await? else {
            return Ok(None);
        };
        serde_json::from_str(&raw).map(Some).map_err(|e| {
            corrupt(
                id,
                format!("progress is not taskiq's JSON TaskProgress: {e}"),
            )
        })
    }

    async fn claim_info(&self, id: &TaskId) -> Result<Option<ClaimInfo>, StoreError> {
        let Some(raw) = self.core().read(self.core().keys.claim(id)).await? else {
            return Ok(None);
        };
        let r = parse_record(&raw)
            .ok_or_else(|| corrupt(id, format!("claim record {raw:?} is not ferriq's")))?;
        let state = match r.state {
            'r' => ClaimState::Running,
            'x' => ClaimState::Released,
            'd' => ClaimState::Done,
            'v' => ClaimState::Revoked,
            other => return Err(corrupt(id, format!("claim state {other:?}"))),
        };
        let running = state == ClaimState::Running;
        Ok(Some(
            ClaimInfo::new(state, Token(r.token), r.holder)
                .with_run(
                    (running && r.started_us > 0).then_some(r.started_us / 1000),
                    running.then_some(r.lease_us / 1000),
                )
                .with_counts(r.failures, r.starts, r.takeovers),
        ))
    }
}
