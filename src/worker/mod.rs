//! The worker runtime: receives deliveries, claims, runs, heartbeats and settles each one as
//! design §6 says, with bounded concurrency and a graceful drain.

// A delivery's way through the worker, one file per stage, in order:
//
// | stage | file | what it does |
// |---|---|---|
// | receive | `receive.rs` | takes free concurrency slots, asks the broker for that many deliveries |
// | dispatch | `dispatch.rs` | hands a batch to runtime tasks; one ordering key's deliveries in turn (`ordered.rs`) |
// | (one delivery) | `delivery.rs` | the stages below in order, each passing the message on or ending the delivery |
// | decode | `decode.rs` | body → task message, or why it cannot run (too large, unreadable, newer) |
// | due | `due.rs` | not due yet or debounced: handed back until its time, held for the last moment |
// | route | `route.rs` | a task this worker does not serve: back to its queue, parked in the end |
// | kept result | `pending.rs` | a result kept while the store was down, written on redelivery |
// | limits | `limits.rs` | rate turn and concurrency slot, before the claim (no attempt spent) |
// | claim | `claim.rs` | the task taken under a lease and a fencing token; every answer handled |
// | run | `run.rs` | the body under timeout and cancellation; retry or fail for good |
// | write | `write.rs` | the outcome stored once, fenced by the token; then `workflow.rs` advances |
// | settle | `settle.rs` | the broker told: ack, release after a delay, or park (dead letter) |
// | drain | `drain.rs` | stop receiving, let runs finish in the grace period, hand back the rest |
//
// Beside the stages: the heartbeats that keep leases, claims and slots alive
// (`heartbeat.rs`), the table of running deliveries (`running.rs`), metrics, history and
// probes. Each stage is a set of functions taking the worker's shared parts (`Inner`) and
// the delivery; "settle" means only telling the broker what became of a message.

mod builder;
mod claim;
mod config;
mod decode;
mod delivery;
mod dispatch;
mod drain;
mod due;
mod heartbeat;
mod history;
mod limits;
mod metrics;
mod ordered;
mod pending;
mod probes;
mod receive;
mod route;
mod run;
mod running;
mod settle;
mod shutdown;
mod slots;
mod workflow;
mod write;

pub use builder::{BuildError, WorkerBuilder};
pub use config::{ConfigError, WorkerConfig};
pub use metrics::WorkerStats;
pub use probes::ProbeServer;
pub use running::Outcome;
pub use shutdown::Shutdown;

use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use tokio_util::task::TaskTracker;

use crate::broker::{Broker, ConsumerSettings, Health, QueueDepth};
use crate::registry::Registry;
use crate::store::Store;
use crate::task::AppState;
use metrics::Counters;
use running::RunningTable;

pub(crate) struct Inner {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    registry: Registry,
    state: Arc<AppState>,
    config: WorkerConfig,
    running: RunningTable,
    /// Results computed while the store was unreachable, keyed by task id, stored on the
    /// message's redelivery.
    pending: pending::PendingResults,
    rng: Mutex<SmallRng>,
    counters: Counters,
    /// Tasks whose results this worker wrote since history was last added (bounded).
    finished: history::FinishedTasks,
    scheduler: Option<crate::schedule::Scheduler>,
    /// When `run` started (unix ms).
    started_at_ms: std::sync::atomic::AtomicU64,
    middleware: crate::middleware::Chain,
    /// The probe address, bound by `build` and served by the first `run`.
    probe_listener: Mutex<Option<std::net::TcpListener>>,
    /// Deliveries waiting for the run of their message group ahead of them.
    ordered: ordered::OrderedGroups,
    /// Concurrency slots held by this worker's runs, by task.
    slots: Mutex<crate::FastMap<crate::wire::TaskId, slots::HeldByRun>>,
    /// Limits set at run time, and the limiters used since they were last noted.
    limits: limits::LiveLimits,
    /// The connections the builder made itself: closed when `run_until_signal` ends.
    connected: builder::Connected,
    /// Set once a message from a client with another result prefix was reported (once is
    /// enough to point at the misconfiguration; every message would flood the log).
    warned_foreign_client: std::sync::atomic::AtomicBool,
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
    /// cancels the leftovers at once.
    pub async fn run_until_signal(&self) {
        let shutdown = Shutdown::new();
        let watcher = shutdown.clone();
        let signals = tokio::spawn(async move {
            shutdown::wait_for_signal().await;
            tracing::info!("signal received: draining; send it again to stop at once");
            watcher.drain();
            shutdown::wait_for_signal().await;
            tracing::info!("second signal: stopping at once");
            watcher.force();
        });
        self.run(shutdown).await;
        signals.abort();
        self.close_connected().await;
    }

    /// Closes the broker's and the store's connections, so the process ends without warnings
    /// of connections cut mid-way; for a worker run with [`Worker::run`], once it returned.
    /// They are shared with whatever else was given the same broker or store (a client),
    /// which fails after it. [`Worker::run_until_signal`] closes the connections the builder
    /// made itself ([`WorkerBuilder::from_env`]) when it ends.
    pub async fn close(&self) {
        tokio::join!(self.inner.broker.close(), self.inner.store.close());
    }

    async fn close_connected(&self) {
        let connected = self.inner.connected;
        let broker = async {
            if connected.broker {
                self.inner.broker.close().await;
            }
        };
        let store = async {
            if connected.store {
                self.inner.store.close().await;
            }
        };
        tokio::join!(broker, store);
    }

    /// Receives and runs tasks until `shutdown` asks for a drain; then stops receiving, lets
    /// runs finish within the grace period (or until a forced stop), cancels the leftovers and
    /// releases their claims and messages so another worker takes them at once. Serves the
    /// probes meanwhile when `probe_addr` (`FERRIQ_PROBE_ADDR`) is set.
    pub async fn run(&self, shutdown: Shutdown) {
        let inner = &self.inner;
        let _probes = self.configured_probes().await;
        inner.running.open();
        inner.ordered.open();
        inner.started_at_ms.store(
            (inner.config.clock.now_unix() * 1000.0) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        // Known to operators from the start, not only from the first heartbeat.
        let _ = inner
            .store
            .report_worker(&inner.report(), inner.config.lease)
            .await;
        // The limits operators set apply from the first delivery.
        limits::refresh(inner).await;
        inner.broker.prepare_consumer(&ConsumerSettings::new(
            inner.config.concurrency,
            inner.config.lease,
        ));
        let tracker = TaskTracker::new();
        let heartbeats = heartbeat::spawn(Arc::clone(inner));
        let scheduler = inner.scheduler.clone().map(|s| {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { s.run(shutdown).await })
        });
        tracing::info!(
            worker = %inner.config.worker_id,
            concurrency = inner.config.concurrency,
            queues = ?inner.broker.lanes(),
            tasks = ?inner.registry,
            "worker started, serving {} task(s)",
            inner.registry.len()
        );
        receive::until_drain(inner, &shutdown, &tracker).await;
        drain::runs(inner, &shutdown, &tracker).await;
        heartbeats.stop().await;
        let _ = inner.store.forget_worker(&inner.config.worker_id).await;
        if let Some(s) = scheduler {
            let _ = s.await;
        }
        drain::stop_receiving(inner, &shutdown).await;
        tracing::info!("worker stopped");
    }
}

impl Worker {
    /// The probe server `probe_addr` asks for, if any, on the address `build` bound. A later
    /// run binds it again; a port that cannot be bound then is logged, and that run goes on
    /// without its probes.
    async fn configured_probes(&self) -> Option<ProbeServer> {
        let addr = self.inner.config.probe_addr?;
        let bound = self
            .inner
            .probe_listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let served = match bound {
            Some(listener) => match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => self.serve_probes_on(listener),
                Err(e) => Err(e),
            },
            None => self.serve_probes(addr).await,
        };
        match served {
            Ok(server) => {
                tracing::info!(%addr, "serving /livez, /readyz and /metrics");
                Some(server)
            }
            Err(e) => {
                tracing::error!(%addr, error = %e, "cannot serve the probes");
                None
            }
        }
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
