//! Building a worker: its broker, store, registry, state, middleware and settings.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use thiserror::Error;

use super::metrics::Counters;
use super::running::RunningTable;
use super::{ConfigError, Inner, Worker, WorkerConfig};
use crate::broker::Broker;
use crate::connect::{connect_broker_with, connect_store_with, ConnectOptions};
use crate::registry::{Registry, RegistryError};
use crate::store::Store;
use crate::task::AppState;

/// Why a worker could not be built.
#[derive(Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No broker was given.
    #[error("no broker: call WorkerBuilder::broker")]
    MissingBroker,
    /// The broker cannot feed a worker (it was connected only to send).
    #[error("this broker cannot feed a worker: {0}")]
    BrokerCannotConsume(String),
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
    /// The probe address cannot be bound (taken, or not an address of this host).
    #[error(
        "cannot serve the probes on {addr} (FERRIQ_PROBE_ADDR): {error}; free the port or \
         choose another"
    )]
    Probes {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why binding it failed (in the message, so not also a `source`).
        error: std::io::Error,
    },
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
    /// The broker and store this builder connected itself (from the environment or a
    /// config), which the worker closes when it stops; not one handed in (the app may share
    /// it with a client).
    connected: Connected,
}

/// Which connections a worker made itself, and so closes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Connected {
    pub(crate) broker: bool,
    pub(crate) store: bool,
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
        // Both URLs checked before connecting either: a missing one is said at once.
        let (broker, store) = (
            options(&config.broker_url, "FERRIQ_BROKER_URL")?,
            options(&config.store_url, "FERRIQ_STORE_URL")?,
        );
        let broker = connect_broker_with(broker).await?;
        let store = connect_store_with(store).await?;
        // A misspelt setting is otherwise silently ignored.
        config
            .settings
            .warn_unread("this worker", WorkerConfig::SETTINGS);
        let mut builder = WorkerBuilder::default()
            .config(config)
            .broker(broker)
            .store(store);
        builder.connected = Connected {
            broker: true,
            store: true,
        };
        Ok(builder)
    }

    /// The broker to receive from.
    pub fn broker(mut self, broker: Arc<dyn Broker>) -> Self {
        self.broker = Some(broker);
        self.connected.broker = false;
        self
    }

    /// The store of claims, results and workflows (Valkey, memory).
    pub fn store<S: Store + ?Sized>(mut self, store: Arc<S>) -> Self {
        self.store = Some(store.into_dyn());
        self.connected.store = false;
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

    /// Serves `/livez`, `/readyz` and `/metrics` at `addr` while the worker runs (default
    /// off; `FERRIQ_PROBE_ADDR`). [`build`](Self::build) binds it, and fails with
    /// [`BuildError::Probes`] when it cannot.
    pub fn probe_addr(mut self, addr: std::net::SocketAddr) -> Self {
        self.config.probe_addr = Some(addr);
        self
    }

    /// Whether this worker adds its counts to the store's history (default on;
    /// `FERRIQ_HISTORY=0` turns it off).
    pub fn history(mut self, on: bool) -> Self {
        self.config.history = on;
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
        if let Some(why) = broker.cannot_consume() {
            return Err(BuildError::BrokerCannotConsume(why));
        }
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
        // Bound now, so a taken port stops the worker before it starts rather than leaving
        // it running without the probes its orchestrator checks.
        let probe_listener = match self.config.probe_addr {
            Some(addr) => Some(
                std::net::TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|error| BuildError::Probes { addr, error })?,
            ),
            None => None,
        };
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
        let pending = super::pending::PendingResults::new(
            self.config.lease,
            self.config.store_retry_after,
            self.config.max_pending_results,
        );
        Ok(Worker {
            inner: Arc::new(Inner {
                broker,
                store,
                registry,
                state: Arc::new(self.state),
                config: self.config,
                running: RunningTable::default(),
                pending,
                rng: Mutex::new(rng),
                counters,
                finished: Default::default(),
                scheduler,
                started_at_ms: Default::default(),
                middleware: self.middleware,
                probe_listener: Mutex::new(probe_listener),
                warned_foreign_client: Default::default(),
                connected: self.connected,
                ordered: Default::default(),
                slots: Default::default(),
                limits: Default::default(),
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

/// The message, as `Display` gives it: a `main` returning this error prints its `Debug` form,
/// and users read that first (`Error: Connect(Backend("…"))` said less, and escaped it).
impl std::fmt::Debug for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
