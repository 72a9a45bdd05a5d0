//! The store traits on the memory engine: one lock per operation, as the Valkey scripts are
//! one atomic step each.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, FailureRecord, ResultStatus,
    ResultStore, StoreError, Token,
};
use crate::wire::{TaskId, TaskResult};

use super::{Claim, MemoryStore, Phase, State};

#[async_trait]
impl ClaimStore for MemoryStore {
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = Instant::now();
        let expired = deadline_at.is_some_and(|d| self.inner.clock.now_unix() > d);
        let mut state = self.lock();
        self.sweep(&mut state);
        let state = &mut *state;
        let claim = state
            .claims
            .entry(id.clone())
            .or_insert_with(|| Claim::new(now));
        let took_over = claim.phase == Phase::Running;
        match claim.phase {
            Phase::Done => return Ok(ClaimOutcome::Done),
            Phase::Revoked => return Ok(ClaimOutcome::Revoked),
            Phase::Running if claim.lease_until > now => {
                return Ok(ClaimOutcome::Defer {
                    retry_after: claim.lease_until - now,
                })
            }
            // The holder's lease ran out before it finished: a crashed or stalled run.
            Phase::Running => claim.takeovers += 1,
            Phase::Released => {}
        }
        claim.token += 1;
        claim.phase = Phase::Running;
        claim.lease_until = now + lease;
        if &*state.last_holder != worker {
            state.last_holder = Arc::from(worker);
        }
        claim.holder = Arc::clone(&state.last_holder);
        claim.started_at = self.inner.clock.now_unix();
        let token = Token(claim.token);
        let starts = claim.starts;
        if !expired {
            // An expired task never runs: its status must not read as started.
            claim.starts += 1;
        }
        Ok(if expired {
            ClaimOutcome::Expired { token }
        } else {
            ClaimOutcome::Run {
                token,
                failures: claim.failures,
                starts,
                takeovers: claim.takeovers,
                took_over,
            }
        })
    }

    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        Ok(claims
            .iter()
            .map(|(id, token)| match state.claims.get_mut(id) {
                Some(c) if c.phase == Phase::Running && c.token == token.0 => {
                    c.lease_until = now + lease;
                    ClaimLease::Kept
                }
                Some(c) if c.phase == Phase::Revoked => ClaimLease::Revoked,
                _ => ClaimLease::Lost,
            })
            .collect())
    }

    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        Ok(self.release_claim(id, token, false))
    }

    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        Ok(self.release_claim(id, token, true))
    }

    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        Ok(record_failure_in(&mut self.lock(), id, token))
    }
}

/// Counts the failed attempt under `token` and releases its claim, under the store's lock.
pub(super) fn record_failure_in(state: &mut State, id: &TaskId, token: Token) -> FailureRecord {
    match state.claims.get_mut(id) {
        Some(c) if c.phase == Phase::Running && c.token == token.0 => {
            c.failures += 1;
            c.phase = Phase::Released;
            FailureRecord::Recorded {
                failures: c.failures,
            }
        }
        _ => FailureRecord::Stale,
    }
}

#[async_trait]
impl ResultStore for MemoryStore {
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        _reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError> {
        let mut state = self.lock();
        self.sweep(&mut state);
        let Some(claim) = state.claims.get_mut(id) else {
            return Ok(CompleteOutcome::Stale);
        };
        if claim.token != token.0 {
            return Ok(CompleteOutcome::Stale);
        }
        match claim.phase {
            Phase::Done => return Ok(CompleteOutcome::AlreadyStored),
            Phase::Running => claim.phase = Phase::Done,
            // Only the run that held the claim when it was revoked is told so (the token
            // checked above): an older run's write is stale.
            Phase::Revoked => return Ok(CompleteOutcome::Revoked),
            Phase::Released => return Ok(CompleteOutcome::Stale),
        }
        self.finished(&mut state, id);
        let stored = match result {
            Some(result) => Self::store_result(&mut state, id, result),
            None => true,
        };
        Ok(if stored {
            CompleteOutcome::Stored
        } else {
            CompleteOutcome::AlreadyStored
        })
    }

    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError> {
        Ok(self.status(id))
    }

    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError> {
        let waiter = {
            let mut state = self.lock();
            if let Some(r) = state.results.get(id) {
                return Ok(ResultStatus::Ready(r.clone()));
            }
            Arc::clone(state.waiters.entry(id.clone()).or_default())
        };
        let notified = waiter.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Checked again after subscribing: a completion in between is not missed.
        if let ResultStatus::Ready(r) = self.status(id) {
            return Ok(ResultStatus::Ready(r));
        }
        let _ = tokio::time::timeout(timeout, notified).await;
        let status = Ok(self.status(id));
        // Forget the waiter entry unless another waiter still holds it.
        let mut state = self.lock();
        if state
            .waiters
            .get(id)
            .is_some_and(|w| Arc::ptr_eq(w, &waiter) && Arc::strong_count(w) <= 2)
        {
            state.waiters.remove(id);
        }
        status
    }

    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
        let mut state = self.lock();
        self.sweep(&mut state);
        // A finished task (with or without a stored result) is not revoked.
        let finished = state
            .claims
            .get(id)
            .is_some_and(|c| matches!(c.phase, Phase::Done | Phase::Revoked));
        if finished || !Self::store_result(&mut state, id, result) {
            return Ok(false);
        }
        let claim = state
            .claims
            .entry(id.clone())
            .or_insert_with(|| Claim::new(Instant::now()));
        // The token stays the holder's: the phase rejects its heartbeats and tells its result
        // write, and no older run's, that the task was revoked.
        claim.phase = Phase::Revoked;
        self.finished(&mut state, id);
        Ok(true)
    }
}
