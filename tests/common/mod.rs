//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::{
    Broker, BrokerError, DeadLetter, Delivery, DeliveryHandle, Health, LeaseStatus,
    OutgoingMessage, QueueDepth,
};
use ferriq::clock::Clock;
use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::testing::{FaultyStore, Oracle, RunningWorker};
use ferriq::{Client, Registry, Worker, WorkerBuilder};
use tokio::sync::{watch, Notify};

/// A memory broker, a fault-injecting store over a memory store, a client and an oracle.
pub struct Harness {
    pub broker: MemoryBroker,
    pub store: FaultyStore,
    pub client: Client,
    pub oracle: Oracle,
    pub gate: Arc<Gate>,
    pub clock: Clock,
}

impl Harness {
    pub fn new() -> Self {
        let broker = MemoryBroker::new();
        let store = FaultyStore::new(MemoryStore::new());
        // Wall time that follows tokio's (paused) clock, for due times and deadlines.
        let clock = Clock::following_tokio();
        let client =
            Client::new(Arc::new(broker.clone()), Arc::new(store.clone())).with_clock(clock);
        Harness {
            clock,
            broker,
            store,
            client,
            oracle: Oracle::default(),
            gate: Arc::new(Gate::new()),
        }
    }

    pub fn memory(&self) -> &MemoryStore {
        &self.store.inner
    }

    /// A worker on this harness serving `tasks`, with the oracle and gate as state.
    pub fn worker(&self, tasks: &[&str]) -> WorkerBuilder {
        Worker::builder()
            .broker(Arc::new(self.broker.clone()))
            .store(Arc::new(self.store.clone()))
            .registry(Registry::from_inventory().unwrap().only(tasks).unwrap())
            .state(self.oracle.clone())
            .state(Arc::clone(&self.gate))
            .jitter_seed(7)
            .clock(self.clock)
    }

    pub fn start(&self, builder: WorkerBuilder) -> RunningWorker {
        RunningWorker::spawn(builder.build().expect("worker builds"))
    }
}

/// Which calls of a [`HangingBroker`] never answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hangs {
    /// `release`: a channel stuck under flow control, an endpoint that stopped answering.
    pub release: bool,
    /// `depth`: an unreachable SQS endpoint the SDK keeps retrying.
    pub depth: bool,
}

/// A memory broker some of whose calls never answer.
#[derive(Debug, Clone)]
pub struct HangingBroker {
    pub inner: MemoryBroker,
    pub hangs: Hangs,
}

#[async_trait::async_trait]
impl Broker for HangingBroker {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        self.inner.publish(batch).await
    }
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        self.inner.receive(max, wait).await
    }
    async fn ack(&self, d: &DeliveryHandle) -> Result<(), BrokerError> {
        self.inner.ack(d).await
    }
    async fn release(&self, d: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        if self.hangs.release {
            std::future::pending::<()>().await;
        }
        self.inner.release(d, after).await
    }
    async fn extend(
        &self,
        d: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        self.inner.extend(d, lease).await
    }
    async fn dead_letter(&self, d: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        self.inner.dead_letter(d, why).await
    }
    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        if self.hangs.depth {
            std::future::pending::<()>().await;
        }
        self.inner.depth().await
    }
    async fn health(&self) -> Health {
        self.inner.health().await
    }
}

/// Lets a test hold a running task and release it.
pub struct Gate {
    pub entered: Notify,
    open: watch::Sender<bool>,
}

impl Gate {
    pub fn new() -> Self {
        Gate {
            entered: Notify::new(),
            open: watch::channel(false).0,
        }
    }

    /// Called by a task: signals entry, then waits until the gate opens.
    pub async fn pass(&self) {
        self.entered.notify_one();
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }
}

/// Bounded polling: waits until `check` holds, failing the test with `what` after `limit`.
/// Under paused time the sleeps advance the clock, so the limit is virtual time.
pub async fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check() {
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every log line at INFO or above of this test process, from every thread (tests of one
/// binary share it: look for your own task's name).
pub fn logs() -> String {
    String::from_utf8_lossy(&log_buffer().lock().unwrap()).into_owned()
}

/// Starts capturing logs (call before what should be logged).
pub fn capture_logs() {
    let _ = log_buffer();
}

fn log_buffer() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<std::sync::Mutex<Vec<u8>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        struct Sink;
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                log_buffer().lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| Sink)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        std::sync::Mutex::new(Vec::new())
    })
}
