//! The memory store's flow control: rate and concurrency limiters, deduplication keys and the
//! limits set at run time, with the same steps as Valkey's scripts.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::MemoryStore;
use crate::store::{
    DebounceTurn, Debounced, FailureRecord, FlowStore, HeldSlot, LimitOverride, LimiterKind,
    LimiterSeen, LimiterUsage, StoreError, Token, LIMITER_LISTED_FOR,
};
use crate::wire::TaskId;

/// Limits set at run time and limiters workers noted.
#[derive(Default)]
pub(crate) struct MemLimits {
    overrides: BTreeMap<String, LimitOverride>,
    /// (kind, limiter) → (limit applied, when noted).
    seen: HashMap<(LimiterKind, String), (String, f64)>,
    /// Debounce keys: each key's latest task.
    debounced: HashMap<String, DebounceRecord>,
}

/// A debounce key's latest task: how many enqueues it took, when it may run, whether it was
/// let run, and when the record is forgotten.
struct DebounceRecord {
    task: TaskId,
    seq: u64,
    due: f64,
    let_run: bool,
    until: f64,
}

#[async_trait]
impl FlowStore for MemoryStore {
    async fn admit_rate(
        &self,
        limiter: &str,
        id: &crate::wire::TaskId,
        rate: crate::task::Rate,
    ) -> Result<crate::store::RateDecision, StoreError> {
        let now = self.inner.clock.now_unix();
        let mut state = self.lock();
        let limiter = match state.rates.get_mut(limiter) {
            Some(l) => l,
            None => state.rates.entry(limiter.to_owned()).or_default(),
        };
        Ok(limiter.admit(id, rate, now))
    }

    async fn acquire_slot(
        &self,
        limiter: &str,
        id: &crate::wire::TaskId,
        limit: u32,
        lease: Duration,
    ) -> Result<crate::store::SlotDecision, StoreError> {
        let now = self.inner.clock.now_unix();
        let mut state = self.lock();
        let slots = state.slots.entry(limiter.to_owned()).or_default();
        Ok(slots.acquire(id, limit, lease.as_secs_f64(), now))
    }

    async fn renew_slots(
        &self,
        slots: &[(String, crate::wire::TaskId)],
        lease: Duration,
    ) -> Result<(), StoreError> {
        let now = self.inner.clock.now_unix();
        let mut state = self.lock();
        for (limiter, id) in slots {
            let s = state.slots.entry(limiter.clone()).or_default();
            s.renew(id, lease.as_secs_f64(), now);
        }
        Ok(())
    }

    async fn release_slot(
        &self,
        limiter: &str,
        id: &crate::wire::TaskId,
        held: Duration,
    ) -> Result<(), StoreError> {
        if let Some(s) = self.lock().slots.get_mut(limiter) {
            s.release(id, held.as_secs_f64());
        }
        Ok(())
    }

    async fn record_failure_freeing_slot(
        &self,
        id: &TaskId,
        token: Token,
        slot: HeldSlot<'_>,
    ) -> Option<Result<FailureRecord, StoreError>> {
        let mut state = self.lock();
        let record = super::traits::record_failure_in(&mut state, id, token);
        if matches!(record, FailureRecord::Recorded { .. }) {
            if let Some(s) = state.slots.get_mut(slot.limiter) {
                s.release(id, slot.held.as_secs_f64());
            }
        }
        Some(Ok(record))
    }

    async fn reserve_dedup(
        &self,
        key: &str,
        id: &crate::wire::TaskId,
        ttl: Duration,
    ) -> Result<Option<crate::wire::TaskId>, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.dedup.get(key) {
            Some((holder, until)) if *until > now && holder != id => Ok(Some(holder.clone())),
            _ => {
                state.dedup.insert(key.to_owned(), (id.clone(), now + ttl));
                Ok(None)
            }
        }
    }

    async fn release_dedup(&self, key: &str, id: &crate::wire::TaskId) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.dedup.get(key).is_some_and(|(holder, _)| holder == id) {
            state.dedup.remove(key);
        }
        Ok(())
    }

    async fn debounce(
        &self,
        key: &str,
        id: &TaskId,
        window: Duration,
    ) -> Result<DebounceTurn, StoreError> {
        let now = self.inner.clock.now_unix();
        let limits = &mut self.lock().limits;
        let (due, until) = (
            now + window.as_secs_f64(),
            now + window.as_secs_f64() + 3600.0,
        );
        limits.debounced.retain(|_, r| r.until > now);
        if let Some(r) = limits.debounced.get_mut(key) {
            if !r.let_run {
                r.seq += 1;
                (r.due, r.until) = (due, until);
                return Ok(DebounceTurn::Joined {
                    task: r.task.clone(),
                    seq: r.seq,
                });
            }
        }
        limits.debounced.insert(
            key.to_owned(),
            DebounceRecord {
                task: id.clone(),
                seq: 1,
                due,
                let_run: false,
                until,
            },
        );
        Ok(DebounceTurn::New)
    }

    async fn take_debounced(
        &self,
        key: &str,
        id: &TaskId,
        seq: u64,
    ) -> Result<Debounced, StoreError> {
        let now = self.inner.clock.now_unix();
        let limits = &mut self.lock().limits;
        let Some(r) = limits.debounced.get_mut(key) else {
            return Ok(Debounced::Run);
        };
        if r.task != *id || r.let_run {
            return Ok(Debounced::Run);
        }
        if seq < r.seq {
            return Ok(Debounced::Superseded);
        }
        if r.due > now + 0.002 {
            return Ok(Debounced::Wait(Duration::from_secs_f64(r.due - now)));
        }
        r.let_run = true;
        Ok(Debounced::Run)
    }

    async fn set_limit_override(
        &self,
        target: &str,
        limits: Option<LimitOverride>,
    ) -> Result<bool, StoreError> {
        let overrides = &mut self.lock().limits.overrides;
        Ok(match limits {
            Some(l) => overrides.insert(target.to_owned(), l).is_some(),
            None => overrides.remove(target).is_some(),
        })
    }

    async fn limit_overrides(&self) -> Result<Vec<(String, LimitOverride)>, StoreError> {
        let state = self.lock();
        Ok(state
            .limits
            .overrides
            .iter()
            .map(|(t, l)| (t.clone(), *l))
            .collect())
    }

    async fn note_limiters(&self, seen: &[LimiterSeen]) -> Result<(), StoreError> {
        let now = self.inner.clock.now_unix();
        let noted = &mut self.lock().limits.seen;
        for s in seen {
            noted.insert((s.kind, s.limiter.clone()), (s.limit.clone(), now));
        }
        noted.retain(|_, (_, at)| *at > now - LIMITER_LISTED_FOR.as_secs_f64());
        Ok(())
    }

    async fn limiters(&self) -> Result<Vec<LimiterUsage>, StoreError> {
        let now = self.inner.clock.now_unix();
        let state = self.lock();
        let mut out = Vec::new();
        for ((kind, limiter), (limit, at)) in &state.limits.seen {
            if *at <= now - LIMITER_LISTED_FOR.as_secs_f64() {
                continue;
            }
            let (used, waiting) = match kind {
                LimiterKind::Rate => state.rates.get(limiter).map(|r| r.usage(now)),
                _ => state.slots.get(limiter).map(|s| s.usage(now)),
            }
            .unwrap_or_default();
            out.push(LimiterUsage {
                seen: LimiterSeen {
                    kind: *kind,
                    limiter: limiter.clone(),
                    limit: limit.clone(),
                },
                used,
                waiting,
                last_seen: *at,
            });
        }
        out.sort_by(|a, b| {
            (&a.seen.limiter, a.seen.kind.as_str()).cmp(&(&b.seen.limiter, b.seen.kind.as_str()))
        });
        Ok(out)
    }
}
