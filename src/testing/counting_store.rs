//! A store wrapper that counts result writes: the oracle's "result writes" for exactly-once
//! tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::broker::Health;
use crate::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, FailureRecord, ResultStatus,
    ResultStore, StoreError, Token,
};
use crate::wire::{TaskId, TaskResult};

/// Wraps any claim/result store and counts, per task, the result writes it reports as
/// `Stored`: the oracle's "result writes" for exactly-once tests on real backends.
///
/// ```
/// use std::sync::Arc;
/// use ferriq::memory::MemoryStore;
/// use ferriq::testing::CountingStore;
/// let store = CountingStore::new(Arc::new(MemoryStore::new()));
/// assert_eq!(store.total_writes(), 0);
/// ```
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: Arc<S>,
    writes: Mutex<HashMap<TaskId, u32>>,
    fenced: AtomicU64,
}

impl<S> CountingStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<S>) -> Self {
        CountingStore {
            inner,
            writes: Mutex::default(),
            fenced: AtomicU64::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// Writes reported as `Stored` for `id`.
    pub fn writes(&self, id: &TaskId) -> u32 {
        self.lock().get(id).copied().unwrap_or(0)
    }

    /// Writes over all tasks.
    pub fn total_writes(&self) -> u64 {
        self.lock().values().map(|n| u64::from(*n)).sum()
    }

    /// Result writes refused as `Stale`: a holder whose claim was taken over tried to write
    /// (fencing at work, whatever the worker then did with its delivery).
    pub fn fenced_writes(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    /// Tasks written more than once (must stay empty).
    pub fn duplicate_writes(&self) -> Vec<TaskId> {
        self.lock()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, u32>> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl<S: ClaimStore> ClaimStore for CountingStore<S> {
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(id, worker, lease, deadline_at).await
    }
    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        self.inner.heartbeat(claims, lease).await
    }
    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.release(id, token).await
    }
    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.release_interrupted(id, token).await
    }
    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        self.inner.record_failure(id, token).await
    }
    async fn health(&self) -> Health {
        self.inner.health().await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

#[async_trait]
impl<S: ResultStore> ResultStore for CountingStore<S> {
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError> {
        let outcome = self.inner.complete(id, token, result, reply_to).await?;
        match outcome {
            CompleteOutcome::Stored => *self.lock().entry(id.clone()).or_default() += 1,
            CompleteOutcome::Stale => {
                self.fenced.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(outcome)
    }
    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError> {
        self.inner.get(id).await
    }
    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError> {
        self.inner.wait(id, timeout).await
    }
    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
        self.inner.revoke(id, result).await
    }
    fn reply_channel(&self) -> Option<String> {
        self.inner.reply_channel()
    }
    fn reply_channel_for(&self, id: &TaskId) -> Option<String> {
        self.inner.reply_channel_for(id)
    }
    fn reads_results_here(&self, reply_to: &str) -> bool {
        self.inner.reads_results_here(reply_to)
    }
}
