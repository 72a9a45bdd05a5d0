//! Test tools for apps and for ferriq's own tests: a ready-made in-memory environment, a store
//! that fails on demand, and an oracle that counts starts per task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinHandle;

use crate::broker::Health;
use crate::clock::Clock;
use crate::memory::{MemoryBroker, MemoryStore};
use crate::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, FailureRecord, ResultStatus,
    ResultStore, StoreError, Token,
};
use crate::wire::{TaskId, TaskResult};
use crate::{Client, Shutdown, Worker, WorkerBuilder};

/// An in-memory broker, store and client wired together, for app tests.
///
/// ```
/// use std::time::Duration;
/// use ferriq::testing::TestEnv;
///
/// #[ferriq::task(name = "docs.testenv.double")]
/// async fn double(x: i64) -> i64 { x * 2 }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let env = TestEnv::new();
/// let worker = env.spawn_worker(env.worker().registry(
///     ferriq::Registry::from_inventory().unwrap().only(&["docs.testenv.double"]).unwrap()));
/// let handle = double::kiq(&env.client, 21).await.unwrap();
/// assert_eq!(handle.wait(Duration::from_secs(5)).await.unwrap(), 42);
/// worker.stop().await;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TestEnv {
    /// The broker.
    pub broker: MemoryBroker,
    /// The claim and result store.
    pub store: MemoryStore,
    /// A client on both.
    pub client: Client,
    /// The wall clock of the client and workers (follows tokio's clock).
    pub clock: Clock,
}

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl TestEnv {
    /// A fresh environment. Its client and workers read wall time from a clock that follows
    /// tokio's, so delays and deadlines work under `tokio::time::pause`.
    pub fn new() -> Self {
        let broker = MemoryBroker::new();
        let store = MemoryStore::new();
        let clock = Clock::following_tokio();
        let client =
            Client::new(Arc::new(broker.clone()), Arc::new(store.clone())).with_clock(clock);
        TestEnv {
            broker,
            store,
            client,
            clock,
        }
    }

    /// A worker builder on this environment's broker, store and clock.
    pub fn worker(&self) -> WorkerBuilder {
        Worker::builder()
            .broker(Arc::new(self.broker.clone()))
            .store(Arc::new(self.store.clone()))
            .clock(self.clock)
    }

    /// Builds and starts a worker in the background.
    ///
    /// # Panics
    /// If the builder is invalid: in a test that is the failure to report.
    pub fn spawn_worker(&self, builder: WorkerBuilder) -> RunningWorker {
        RunningWorker::spawn(builder.build().expect("invalid worker configuration"))
    }
}

/// A worker running in the background.
#[derive(Debug)]
pub struct RunningWorker {
    /// The worker (for its stats).
    pub worker: Worker,
    /// Its shutdown control.
    pub shutdown: Shutdown,
    join: JoinHandle<()>,
}

impl RunningWorker {
    /// Starts `worker` on a tokio task.
    pub fn spawn(worker: Worker) -> Self {
        let shutdown = Shutdown::new();
        let join = {
            let (worker, shutdown) = (worker.clone(), shutdown.clone());
            tokio::spawn(async move { worker.run(shutdown).await })
        };
        RunningWorker {
            worker,
            shutdown,
            join,
        }
    }

    /// Drains and waits for the worker to stop.
    pub async fn stop(self) {
        self.shutdown.drain();
        let _ = self.join.await;
    }

    /// Whether the worker's run loop has returned.
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }

    /// Waits for the run loop to return (after a drain or force).
    pub async fn join(self) {
        let _ = self.join.await;
    }
}

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

/// Counts, per task id, how many runs started and finished: fault tests assert on it.
///
/// ```
/// use ferriq::testing::Oracle;
/// use ferriq::wire::TaskId;
/// let oracle = Oracle::default();
/// let id = TaskId::random();
/// oracle.started(&id);
/// oracle.started(&id);
/// assert_eq!(oracle.starts(&id), 2);
/// assert_eq!(oracle.duplicate_starts(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Oracle {
    starts: Arc<Mutex<HashMap<TaskId, u32>>>,
    finishes: Arc<Mutex<HashMap<TaskId, u32>>>,
}

impl Oracle {
    /// Records that a run of `id` started.
    pub fn started(&self, id: &TaskId) {
        *self
            .starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.clone())
            .or_default() += 1;
    }

    /// Records that a run of `id` reached its end (returned).
    pub fn finished(&self, id: &TaskId) {
        *self
            .finishes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.clone())
            .or_default() += 1;
    }

    /// Runs of `id` started.
    pub fn starts(&self, id: &TaskId) -> u32 {
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    /// Runs of `id` that returned.
    pub fn finishes(&self, id: &TaskId) -> u32 {
        self.finishes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    /// Starts beyond the first, over all tasks (at-least-once execution makes these legal; a
    /// fault test reports them).
    pub fn duplicate_starts(&self) -> u64 {
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|n| u64::from(n.saturating_sub(1)))
            .sum()
    }

    /// Distinct tasks started.
    pub fn distinct_started(&self) -> usize {
        self.starts.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

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
}

impl<S> CountingStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<S>) -> Self {
        CountingStore {
            inner,
            writes: Mutex::default(),
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
    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        self.inner.record_failure(id, token).await
    }
    async fn health(&self) -> Health {
        self.inner.health().await
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
        if outcome == CompleteOutcome::Stored {
            *self.lock().entry(id.clone()).or_default() += 1;
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
}
