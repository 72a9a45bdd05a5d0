//! Test tools for apps and for ferriq's own tests: a ready-made in-memory environment, a store
//! that fails on demand, a store that counts result writes, and an oracle that counts starts
//! per task.

#[cfg(feature = "conformance")]
pub mod conformance;
mod counting_store;
mod faulty_store;
mod forward;

pub use counting_store::CountingStore;
pub use faulty_store::{FaultyStore, StoreOp};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::memory::{MemoryBroker, MemoryStore};
use crate::wire::TaskId;
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
