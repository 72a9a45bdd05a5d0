//! Flow control on Valkey: the `FlowStore` contract over the rate and concurrency limiters
//! (`limits`), deduplication keys, debounced enqueues (`debounce`) and the limits set at run
//! time (`limits_live`).

use std::sync::LazyLock;

use async_trait::async_trait;
use ferriq::store::{
    ClaimAsk, CompleteOutcome, DebounceTurn, Debounced, FailureRecord, FlowStore, Gated, HeldSlot,
    LimitGate, LimitOverride, LimiterSeen, LimiterUsage, RateDecision, SlotDecision, StoreError,
    Token,
};
use ferriq::task::Rate;
use ferriq::wire::{TaskId, TaskResult};
use fred::types::scripts::Script;

use crate::error::store_error;
use crate::gate::{CompleteFreeingCall, GatedCall};
use crate::scripts;
use crate::ValkeyStore;

/// KEYS: the dedup key. ARGV: task id, ttl ms. Returns '' when the key is the task's now (or
/// was), else the id of the task holding it. (Made once: a `Script` hashes its text, and a
/// deduplicated task asks at every enqueue and frees at its run's end.)
static RESERVE_DEDUP: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
return ''
"#,
    )
});

/// KEYS: the dedup key. ARGV: task id. Deletes it when the task holds it.
static RELEASE_DEDUP: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"#,
    )
});

impl ValkeyStore {
    /// A deduplication key's key (its digest: a key may hold any character).
    fn dedup_key(&self, key: &str) -> String {
        format!(
            "{}:dedup:{}",
            self.prefix(),
            TaskId::derived(&["ferriq-dedup-key", key])
        )
    }
}

#[async_trait]
impl FlowStore for ValkeyStore {
    async fn admit_rate(
        &self,
        limiter: &str,
        id: &TaskId,
        rate: Rate,
    ) -> Result<RateDecision, StoreError> {
        self.admit(limiter, id, rate).await
    }

    async fn acquire_slot(
        &self,
        limiter: &str,
        id: &TaskId,
        limit: u32,
        lease: std::time::Duration,
    ) -> Result<SlotDecision, StoreError> {
        self.acquire(limiter, id, limit, lease).await
    }

    async fn claim_past_limit(
        &self,
        gate: LimitGate<'_>,
        id: &TaskId,
        claim: ClaimAsk<'_>,
    ) -> Option<Result<Gated, StoreError>> {
        let batchers = self.flow_batchers()?;
        let claim = self
            .core()
            .claim_call(id, claim.worker, claim.lease, claim.deadline_at);
        Some(match gate {
            LimitGate::Rate { limiter, rate } => {
                let keys = self.limiter_keys(limiter);
                let call = GatedCall {
                    renew: keys.renew_due(),
                    limiter: keys,
                    limit: rate.limit(),
                    span: rate.period(),
                    claim,
                };
                batchers.admit_claims.call(call).await
            }
            LimitGate::Slot {
                limiter,
                limit,
                lease,
            } => {
                let keys = self.slot_keys(limiter);
                let call = GatedCall {
                    renew: keys.renew_due(),
                    limiter: keys,
                    limit,
                    span: lease,
                    claim,
                };
                batchers.acquire_claims.call(call).await
            }
            // A gate this store does not know: asked apart.
            _ => return None,
        })
    }

    async fn complete_freeing_slot(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
        slot: HeldSlot<'_>,
    ) -> Option<Result<CompleteOutcome, StoreError>> {
        let batchers = self.flow_batchers()?;
        let complete = match self.complete_call(id, token, result, reply_to) {
            Ok(call) => call,
            Err(e) => return Some(Err(e)),
        };
        let keys = self.slot_keys(slot.limiter);
        let call = CompleteFreeingCall {
            complete,
            note: keys.note_due(),
            slot: keys,
            held: slot.held,
        };
        Some(batchers.complete_freeings.call(call).await)
    }

    async fn record_failure_freeing_slot(
        &self,
        id: &TaskId,
        token: Token,
        slot: HeldSlot<'_>,
    ) -> Option<Result<FailureRecord, StoreError>> {
        // On a single server only (the claim's and the limiter's keys in one script), as the
        // batched fused calls.
        self.flow_batchers()?;
        let keys = self.slot_keys(slot.limiter);
        let note = keys.note_due();
        Some(
            self.core()
                .record_failure_freeing(id, token, &keys, slot.held, note)
                .await,
        )
    }

    async fn renew_slots(
        &self,
        slots: &[(String, TaskId)],
        lease: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.renew(slots, lease).await
    }

    async fn release_slot(
        &self,
        limiter: &str,
        id: &TaskId,
        held: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.release(limiter, id, held).await
    }

    async fn reserve_dedup(
        &self,
        key: &str,
        id: &TaskId,
        ttl: std::time::Duration,
    ) -> Result<Option<TaskId>, StoreError> {
        let keys = vec![self.dedup_key(key)];
        let argv = vec![id.to_string(), ttl.as_millis().max(1).to_string()];
        let answer = scripts::call(&self.core().pool, &RESERVE_DEDUP, || {
            (keys.clone(), argv.clone())
        })
        .await
        .map_err(store_error)?;
        match answer.as_str().as_deref() {
            None | Some("") => Ok(None),
            Some(holder) => TaskId::parse(holder)
                .map(Some)
                .map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!("deduplication key holder: {e}"),
                }),
        }
    }

    async fn debounce(
        &self,
        key: &str,
        id: &TaskId,
        window: std::time::Duration,
    ) -> Result<DebounceTurn, StoreError> {
        self.debounce_enqueue(key, id, window).await
    }

    async fn take_debounced(
        &self,
        key: &str,
        id: &TaskId,
        seq: u64,
    ) -> Result<Debounced, StoreError> {
        self.debounce_take(key, id, seq).await
    }

    async fn set_limit_override(
        &self,
        target: &str,
        limits: Option<LimitOverride>,
    ) -> Result<bool, StoreError> {
        self.set_override(target, limits).await
    }

    async fn limit_overrides(&self) -> Result<Vec<(String, LimitOverride)>, StoreError> {
        self.overrides().await
    }

    async fn note_limiters(&self, seen: &[LimiterSeen]) -> Result<(), StoreError> {
        self.note(seen).await
    }

    async fn limiters(&self) -> Result<Vec<LimiterUsage>, StoreError> {
        self.usage().await
    }

    async fn release_dedup(&self, key: &str, id: &TaskId) -> Result<(), StoreError> {
        let keys = vec![self.dedup_key(key)];
        let argv = vec![id.to_string()];
        scripts::call(&self.core().pool, &RELEASE_DEDUP, || {
            (keys.clone(), argv.clone())
        })
        .await
        .map_err(store_error)?;
        Ok(())
    }
}
