//! A store that fails on demand, as an unreachable Valkey would.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::broker::Health;
use crate::memory::MemoryStore;
use crate::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, FailureRecord, ResultStatus,
    ResultStore, StoreError, Token,
};
use crate::wire::{TaskId, TaskResult};

/// Which store operations fail.
#[derive(Debug, Default)]
struct Faults {
    claim: AtomicBool,
    heartbeat: AtomicBool,
    release: AtomicBool,
    record_failure: AtomicBool,
    complete: AtomicBool,
    complete_after_write: AtomicBool,
    reads: AtomicBool,
    calls_failed: AtomicU32,
}

/// A store operation that [`FaultyStore`] can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreOp {
    /// `claim`.
    Claim,
    /// `heartbeat`.
    Heartbeat,
    /// `release`.
    Release,
    /// `record_failure`.
    RecordFailure,
    /// `complete`, failing before anything is written (store unreachable).
    Complete,
    /// `complete`, failing after the write was applied (the reply was lost).
    CompleteAfterWrite,
    /// `get` and `wait`.
    Reads,
}

/// A [`MemoryStore`] whose operations fail on demand with [`StoreError::Unavailable`], as an
/// unreachable Valkey would.
#[derive(Debug, Clone)]
pub struct FaultyStore {
    /// The store behind it.
    pub inner: MemoryStore,
    faults: Arc<Faults>,
}

impl FaultyStore {
    /// Wraps a store; nothing fails until asked.
    pub fn new(inner: MemoryStore) -> Self {
        FaultyStore {
            inner,
            faults: Arc::default(),
        }
    }

    fn flag(&self, op: StoreOp) -> &AtomicBool {
        let f = &self.faults;
        match op {
            StoreOp::Claim => &f.claim,
            StoreOp::Heartbeat => &f.heartbeat,
            StoreOp::Release => &f.release,
            StoreOp::RecordFailure => &f.record_failure,
            StoreOp::Complete => &f.complete,
            StoreOp::CompleteAfterWrite => &f.complete_after_write,
            StoreOp::Reads => &f.reads,
        }
    }

    /// Makes `op` fail (`true`) or work (`false`).
    pub fn set_failing(&self, op: StoreOp, failing: bool) {
        self.flag(op).store(failing, Ordering::SeqCst);
    }

    /// Calls that failed on purpose.
    pub fn failed_calls(&self) -> u32 {
        self.faults.calls_failed.load(Ordering::SeqCst)
    }

    fn check(&self, op: StoreOp) -> Result<(), StoreError> {
        if self.flag(op).load(Ordering::SeqCst) {
            self.faults.calls_failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable(format!("injected fault on {op:?}")));
        }
        Ok(())
    }
}

#[async_trait]
impl ClaimStore for FaultyStore {
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.check(StoreOp::Claim)?;
        self.inner.claim(id, worker, lease, deadline_at).await
    }
    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        self.check(StoreOp::Heartbeat)?;
        self.inner.heartbeat(claims, lease).await
    }
    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.check(StoreOp::Release)?;
        ClaimStore::release(&self.inner, id, token).await
    }
    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.check(StoreOp::Release)?;
        self.inner.release_interrupted(id, token).await
    }
    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        self.check(StoreOp::RecordFailure)?;
        self.inner.record_failure(id, token).await
    }
    async fn health(&self) -> Health {
        match self.check(StoreOp::Claim) {
            Ok(()) => self.inner.health().await,
            Err(e) => Health::Unhealthy(e.to_string()),
        }
    }
}

#[async_trait]
impl ResultStore for FaultyStore {
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError> {
        self.check(StoreOp::Complete)?;
        let outcome = self.inner.complete(id, token, result, reply_to).await?;
        self.check(StoreOp::CompleteAfterWrite)?;
        Ok(outcome)
    }
    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError> {
        self.check(StoreOp::Reads)?;
        self.inner.get(id).await
    }
    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError> {
        self.check(StoreOp::Reads)?;
        self.inner.wait(id, timeout).await
    }
    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
        self.check(StoreOp::Complete)?;
        self.inner.revoke(id, result).await
    }
}
