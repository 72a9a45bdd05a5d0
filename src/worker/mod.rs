//! The worker runtime: receives deliveries, claims, runs, heartbeats and settles each one as
//! design §6 says, with bounded concurrency and a graceful drain.

mod config;
mod delivery;
mod dispatch;
mod heartbeat;
mod metrics;
mod probes;
mod run;
mod running;
mod settle;
mod shutdown;
mod workflow;

pub use config::{ConfigError, WorkerConfig};
pub use metrics::WorkerStats;
pub use probes::ProbeServer;
pub use running::Outcome;
pub use shutdown::Shutdown;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::broker::{Broker, ConsumerSettings, Health, QueueDepth};
use crate::connect::{connect_broker_with, connect_store_with, ConnectOptions};
use crate::registry::{Registry, RegistryError};
use crate::store::Store;
use crate::task::AppState;
use delivery::PendingResult;
use metrics::Counters;
use running::{RunningTable, StopReason};

/// Why a worker could not be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No broker was given.
    #[error("no broker: call WorkerBuilder::broker")]
    MissingBroker,
    /// No claim or result store was given.
    #[error("no claim/result store: call WorkerBuilder::store")]
    MissingStore,
    /// The registry is invalid (duplicate names, missing state).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The worker would serve no task at all.
    #[error("this worker serves no task: {0}")]
    NoTasks(String),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A backend could not be connected from its URL.
    #[error(transparent)]
    Connect(#[from] crate::connect::ConnectError),
    /// A schedule declared on a task is invalid (checked when the worker runs a scheduler).
    #[error(transparent)]
    Schedule(#[from] crate::schedule::ScheduleError),
}

/// Builds a [`Worker`].
///
/// ```
/// use std::sync::Arc;
/// use ferriq::memory::{MemoryBroker, MemoryStore};
/// use ferriq::{Registry, Worker};
///
/// #[ferriq::task(name = "docs.builder.noop")]
/// async fn noop() {}
///
/// let worker = Worker::builder()
///     .broker(Arc::new(MemoryBroker::new()))
///     .store(Arc::new(MemoryStore::new()))
///     .registry(Registry::from_inventory().unwrap().only(&["docs.builder.noop"]).unwrap())
///     .concurrency(4)
///     .build()
///     .unwrap();
/// assert_eq!(worker.config().concurrency, 4);
/// ```
#[derive(Default)]
pub struct WorkerBuilder {
    broker: Option<Arc<dyn Broker>>,
    store: Option<Arc<dyn Store>>,
    registry: Option<Registry>,
    state: AppState,
    config: WorkerConfig,
    seed: Option<u64>,
    middleware: crate::middleware::Chain,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("has_broker", &self.broker.is_some())
            .field("has_store", &self.store.is_some())
            .field("registry", &self.registry)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// A builder configured wholly from the environment: [`WorkerConfig::from_env`], then the
    /// broker at `FERRIQ_BROKER_URL` and the store at `FERRIQ_STORE_URL` (or
    /// `FERRIQ_VALKEY_URL`), connected by whichever linked backend serves each URL's scheme
    /// (see [`crate::connect`]), with the backends' own settings from `FERRIQ_*` variables
    /// and the broker's prefetch derived from the concurrency. Add state (and a registry, to
    /// serve a subset) before `build`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ferriq::worker::BuildError> {
    /// // FERRIQ_BROKER_URL=amqp://… FERRIQ_STORE_URL=redis://… FERRIQ_CONCURRENCY=16
    /// let worker = ferriq::Worker::builder_from_env().await?.build()?;
    /// worker.run_until_signal().await;
    /// # Ok(()) }
    /// ```
    pub async fn from_env() -> Result<Self, BuildError> {
        Self::from_config(WorkerConfig::from_env()?).await
    }

    /// A builder with `config`, its broker and store connected from `config.broker_url` and
    /// `config.store_url` (see [`WorkerBuilder::from_env`]).
    pub async fn from_config(config: WorkerConfig) -> Result<Self, BuildError> {
        let options = |url: &Option<crate::SecretUrl>, var: &'static str| {
            let url = url.clone().ok_or(ConfigError::Missing(var))?;
            let mut options = ConnectOptions::new(url).concurrency(config.concurrency);
            options.settings = config.settings.clone();
            Ok::<_, ConfigError>(options)
        };
        let broker = connect_broker_with(options(&config.broker_url, "FERRIQ_BROKER_URL")?).await?;
        let store = connect_store_with(options(&config.store_url, "FERRIQ_STORE_URL")?).await?;
        Ok(WorkerBuilder::default()
            .config(config)
            .broker(broker)
            .store(store))
    }

    /// The broker to receive from.
    pub fn broker(mut self, broker: Arc<dyn Broker>) -> Self {
        self.broker = Some(broker);
        self
    }

    /// The store of claims, results and workflows (Valkey, memory).
    pub fn store<S: Store + ?Sized>(mut self, store: Arc<S>) -> Self {
        self.store = Some(store.into_dyn());
        self
    }

    /// The tasks served (default: every `#[task]` in the binary).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Shared app state handed to tasks that take `State<T>`.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// Adds a middleware after those already registered (see [`crate::middleware`] for the
    /// order hooks run in and what their failures do).
    pub fn middleware(mut self, middleware: Arc<dyn crate::middleware::Middleware>) -> Self {
        self.middleware = self.middleware.with(middleware);
        self
    }

    /// The whole configuration.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// This worker's id in claims (default: host name, pid and a random suffix).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.config.worker_id = id.into();
        self
    }

    /// Most runs at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }

    /// Claim lease and broker visibility extension.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Longest wait of one receive call (default 1 s).
    pub fn receive_wait(mut self, wait: Duration) -> Self {
        self.config.receive_wait = wait;
        self
    }

    /// The drain grace period.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.config.grace = grace;
        self
    }

    /// Whether this worker also runs a scheduler (default off; `FERRIQ_SCHEDULER=1`).
    pub fn scheduler(mut self, on: bool) -> Self {
        self.config.scheduler = on;
        self
    }

    /// The wall clock due times and deadlines are read from (default: the system clock).
    pub fn clock(mut self, clock: crate::clock::Clock) -> Self {
        self.config.clock = clock;
        self
    }

    /// A fixed seed for retry jitter (reproducible tests).
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks everything and builds the worker.
    pub fn build(self) -> Result<Worker, BuildError> {
        self.config.validate()?;
        let broker = self.broker.ok_or(BuildError::MissingBroker)?;
        let store = self.store.ok_or(BuildError::MissingStore)?;
        let registry = match self.registry {
            Some(r) => r,
            None => Registry::from_inventory()?,
        };
        if registry.is_empty() {
            return Err(BuildError::NoTasks(no_tasks_reason()));
        }
        registry.check_state(&self.state)?;
        for name in registry.names() {
            let initial = registry
                .get(name)
                .map(|t| t.options().get_backoff_initial())
                .unwrap_or_default();
            if initial < self.config.min_defer {
                tracing::warn!(
                    task = name,
                    backoff_initial = ?initial,
                    min_defer = ?self.config.min_defer,
                    "backoff_initial is shorter than the worker's min_defer: retries of this \
                     task wait at least min_defer (every release costs a receive)"
                );
            }
        }
        let rng = match self.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        let counters = Counters::new(&registry);
        let scheduler = if self.config.scheduler {
            Some(
                crate::schedule::Scheduler::builder(Arc::clone(&broker), Arc::clone(&store))
                    .clock(self.config.clock)
                    .id(self.config.worker_id.clone())
                    .build()?,
            )
        } else {
            None
        };
        Ok(Worker {
            inner: Arc::new(Inner {
                broker,
                store,
                registry,
                state: Arc::new(self.state),
                config: self.config,
                running: RunningTable::default(),
                pending: Mutex::new(HashMap::new()),
                rng: Mutex::new(rng),
                counters,
                scheduler,
                started_at_ms: Default::default(),
                middleware: self.middleware,
            }),
        })
    }
}

/// Why a registry is empty, and what to do about it.
fn no_tasks_reason() -> String {
    let linked: Vec<&str> = inventory::iter::<crate::task::TaskRegistration>
        .into_iter()
        .map(|r| r.name)
        .collect();
    if linked.is_empty() {
        return "no #[ferriq::task] is linked into this binary. If the tasks live in a crate this \
                binary never names, the linker dropped that crate: add \
                `use your_tasks_crate as _;` to the worker's main.rs"
            .to_owned();
    }
    let shown: Vec<&str> = linked.iter().take(10).copied().collect();
    format!(
        "the registry given to WorkerBuilder::registry is empty, though {} task(s) are linked \
         ({}{}); check how it was narrowed",
        linked.len(),
        shown.join(", "),
        if linked.len() > shown.len() {
            ", …"
        } else {
            ""
        }
    )
}

pub(crate) struct Inner {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    registry: Registry,
    state: Arc<AppState>,
    config: WorkerConfig,
    running: RunningTable,
    /// Results computed while the store was unreachable, keyed by task id, stored on the
    /// message's redelivery.
    pending: Mutex<HashMap<crate::wire::TaskId, PendingResult>>,
    rng: Mutex<SmallRng>,
    counters: Counters,
    scheduler: Option<crate::schedule::Scheduler>,
    /// When `run` started (unix ms).
    started_at_ms: std::sync::atomic::AtomicU64,
    middleware: crate::middleware::Chain,
}

impl Inner {
    /// This worker as operators see it.
    pub(crate) fn report(&self) -> crate::store::WorkerInfo {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_default();
        crate::store::WorkerInfo::new(
            self.config.worker_id.clone(),
            host,
            std::process::id(),
            self.broker.lanes(),
            self.config.concurrency,
            self.started_at_ms
                .load(std::sync::atomic::Ordering::Relaxed),
            (self.config.clock.now_unix() * 1000.0) as u64,
            self.running.runs(),
        )
    }
}

/// A worker: runs the registered tasks from a broker, settling each delivery per design §6.
/// Cheap to clone; clones share everything.
///
/// ```no_run
/// # async fn demo(worker: ferriq::Worker) {
/// // In a worker pod: drain on SIGTERM/SIGINT, stop at once on a second signal.
/// worker.run_until_signal().await;
/// # }
/// ```
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl Worker {
    /// A builder.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::default()
    }

    /// A builder configured from the environment: see [`WorkerBuilder::from_env`].
    pub async fn builder_from_env() -> Result<WorkerBuilder, BuildError> {
        WorkerBuilder::from_env().await
    }

    /// The configuration.
    pub fn config(&self) -> &WorkerConfig {
        &self.inner.config
    }

    /// Counters of what the worker did.
    pub fn stats(&self) -> WorkerStats {
        self.inner.counters.snapshot(self.inner.running.len())
    }

    /// Whether the worker can do its work, for readiness probes: both the broker and the
    /// claim store must answer (a worker cut off from either runs nothing).
    pub async fn health(&self) -> Health {
        let (broker, store) = tokio::join!(self.inner.broker.health(), self.inner.store.health());
        match (broker, store) {
            (Health::Healthy, Health::Healthy) => Health::Healthy,
            (b, s) => {
                let reasons: Vec<String> = [("broker", b), ("store", s)]
                    .into_iter()
                    .filter_map(|(what, h)| match h {
                        Health::Unhealthy(why) => Some(format!("{what}: {why}")),
                        _ => None,
                    })
                    .collect();
                Health::Unhealthy(reasons.join("; "))
            }
        }
    }

    /// Messages waiting, the autoscaling signal.
    pub async fn depth(&self) -> Result<QueueDepth, crate::broker::BrokerError> {
        self.inner.broker.depth().await
    }

    /// Runs until SIGTERM or SIGINT, then drains (see [`Worker::run`]); a second signal
    /// cancels the leftovers at once. Serves the probes too when `probe_addr` is set.
    pub async fn run_until_signal(&self) {
        let _probes = match self.inner.config.probe_addr {
            Some(addr) => match self.serve_probes(addr).await {
                Ok(server) => {
                    tracing::info!(%addr, "serving /livez, /readyz and /metrics");
                    Some(server)
                }
                Err(e) => {
                    tracing::error!(%addr, error = %e, "cannot serve the probes");
                    None
                }
            },
            None => None,
        };
        let shutdown = Shutdown::new();
        let watcher = shutdown.clone();
        let signals = tokio::spawn(async move {
            shutdown::wait_for_signal().await;
            tracing::info!("signal received: draining; send it again to stop at once");
            watcher.drain();
            shutdown::wait_for_signal().await;
            tracing::warn!("second signal: cancelling runs and releasing their messages");
            watcher.force();
        });
        self.run(shutdown).await;
        signals.abort();
    }

    /// Receives and runs tasks until `shutdown` asks for a drain; then stops receiving, lets
    /// runs finish within the grace period (or until a forced stop), cancels the leftovers and
    /// releases their claims and messages so another worker takes them at once.
    pub async fn run(&self, shutdown: Shutdown) {
        let inner = &self.inner;
        inner.running.open();
        inner.started_at_ms.store(
            (inner.config.clock.now_unix() * 1000.0) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        // Known to operators from the start, not only from the first heartbeat.
        let _ = inner
            .store
            .report_worker(&inner.report(), inner.config.lease)
            .await;
        inner.broker.prepare_consumer(&ConsumerSettings::new(
            inner.config.concurrency,
            inner.config.lease,
        ));
        let slots = Arc::new(Semaphore::new(inner.config.concurrency));
        let tracker = TaskTracker::new();
        let heartbeats = heartbeat::spawn(Arc::clone(inner));
        let scheduler = inner.scheduler.clone().map(|s| {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { s.run(shutdown).await })
        });
        tracing::info!(
            worker = %inner.config.worker_id,
            concurrency = inner.config.concurrency,
            tasks = ?inner.registry,
            "worker started, serving {} task(s)",
            inner.registry.len()
        );
        let mut backoff = Duration::from_millis(100);
        'receive: loop {
            let first = tokio::select! {
                biased;
                _ = shutdown.draining() => None,
                permit = Arc::clone(&slots).acquire_owned() => permit.ok(),
            };
            let Some(first) = first else {
                break;
            };
            let mut permits = vec![first];
            while let Ok(p) = Arc::clone(&slots).try_acquire_owned() {
                permits.push(p);
            }
            let received = tokio::select! {
                biased;
                _ = shutdown.draining() => break 'receive,
                r = inner.broker.receive(permits.len(), inner.config.receive_wait) => r,
            };
            match received {
                Ok(deliveries) => {
                    backoff = Duration::from_millis(100);
                    if deliveries.len() > permits.len() {
                        // Handled anyway rather than held unheartbeated.
                        tracing::warn!("broker returned more deliveries than requested");
                    }
                    let with_slots = deliveries.into_iter().map(|d| (d, permits.pop())).collect();
                    dispatch::dispatch(inner, &tracker, with_slots);
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "receive failed");
                    tokio::select! {
                        _ = shutdown.draining() => break 'receive,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        tracker.close();
        tracing::info!(in_flight = inner.running.len(), grace = ?inner.config.grace, "draining");
        tokio::select! {
            _ = tracker.wait() => {}
            _ = tokio::time::sleep(inner.config.grace) => {}
            _ = shutdown.forced() => {}
        }
        if !tracker.is_empty() {
            tracing::warn!(
                left = inner.running.len(),
                "grace period over: cancelling runs and releasing their messages"
            );
            inner.running.stop_all(StopReason::Shutdown);
            // Handing back is quick (a claim release, a message release); a broker or store
            // call that hangs must not keep the process from stopping: its message comes back
            // by itself.
            let settle_limit = Duration::from_secs(30);
            tokio::select! {
                _ = tracker.wait() => {}
                _ = tokio::time::sleep(settle_limit) => {
                    tracing::error!(left = inner.running.len(), "deliveries still settling after {settle_limit:?}; stopping anyway");
                }
                _ = shutdown.forced() => {}
            }
        }
        heartbeats.stop().await;
        let _ = inner.store.forget_worker(&inner.config.worker_id).await;
        if let Some(s) = scheduler {
            let _ = s.await;
        }
        // Every delivery is settled: a broker that pushes deliveries (RabbitMQ) hands the ones
        // it buffered back to the queue for other workers.
        inner.broker.stop_receiving().await;
        tracing::info!("worker stopped");
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.inner.config)
            .field("registry", &self.inner.registry)
            .finish_non_exhaustive()
    }
}
