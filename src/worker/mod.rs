//! The worker runtime: receives deliveries, claims, runs, heartbeats and settles each one as
//! design §6 says, with bounded concurrency and a graceful drain.

mod builder;
mod config;
mod delivery;
mod dispatch;
mod heartbeat;
mod history;
mod limits;
mod metrics;
mod ordered;
mod probes;
mod run;
mod running;
mod settle;
mod shutdown;
mod workflow;

pub use builder::{BuildError, WorkerBuilder};
pub use config::{ConfigError, WorkerConfig};
pub use metrics::WorkerStats;
pub use probes::ProbeServer;
pub use running::Outcome;
pub use shutdown::Shutdown;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::broker::{Broker, ConsumerSettings, Health, QueueDepth};
use crate::registry::Registry;
use crate::store::Store;
use crate::task::AppState;
use delivery::PendingResult;
use metrics::Counters;
use running::{RunningTable, StopReason};

pub(crate) struct Inner {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    registry: Registry,
    state: Arc<AppState>,
    config: WorkerConfig,
    running: RunningTable,
    /// Results computed while the store was unreachable, keyed by task id, stored on the
    /// message's redelivery.
    pending: Mutex<crate::FastMap<crate::wire::TaskId, PendingResult>>,
    rng: Mutex<SmallRng>,
    counters: Counters,
    /// Tasks whose results this worker wrote since history was last added (bounded).
    finished: Mutex<Vec<crate::store::FinishedTask>>,
    scheduler: Option<crate::schedule::Scheduler>,
    /// When `run` started (unix ms).
    started_at_ms: std::sync::atomic::AtomicU64,
    middleware: crate::middleware::Chain,
    /// The probe address, bound by `build` and served by the first `run`.
    probe_listener: Mutex<Option<std::net::TcpListener>>,
    /// Deliveries waiting for the run of their message group ahead of them.
    ordered: ordered::OrderedGroups,
    /// Concurrency slots held by this worker's runs: task → limiter, and when it was taken.
    slots: Mutex<crate::FastMap<crate::wire::TaskId, (String, tokio::time::Instant)>>,
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

/// How long a worker told to stop now (a second signal) still gives each hand-back step.
const FORCED_LIMIT: Duration = Duration::from_secs(5);

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
        inner.refresh_limits().await;
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
            queues = ?inner.broker.lanes(),
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
        inner.broker.drain_started();
        // What waits behind a group's run goes back now, for another worker, in order; a
        // broker that hangs does not hold the drain (the messages come back by themselves).
        let _ = tokio::time::timeout(FORCED_LIMIT, inner.hand_back(inner.ordered.drain())).await;
        tracing::info!(in_flight = inner.running.len(), grace = ?inner.config.grace, "draining");
        let forced = tokio::select! {
            _ = tracker.wait() => false,
            _ = tokio::time::sleep(inner.config.grace) => false,
            _ = shutdown.forced() => true,
        };
        if !tracker.is_empty() {
            let left = inner.running.len();
            if forced {
                tracing::warn!(
                    left,
                    "told to stop now: cancelling runs and releasing their messages"
                );
            } else {
                tracing::warn!(
                    left,
                    "grace period over: cancelling runs and releasing their messages"
                );
            }
            inner.running.stop_all(StopReason::Shutdown);
            // Handing back is quick (a claim release, a message release), and worth waiting
            // for even when told to stop now: a message released before its channel closes is
            // back at once and its run counts as handed back. A broker or store call that hangs
            // must not keep the process from stopping: its message comes back by itself.
            // Told to stop now during the settle: at most 5 s more.
            let settle_limit = if forced {
                FORCED_LIMIT
            } else {
                Duration::from_secs(30)
            };
            let settled = tokio::time::timeout(settle_limit, tracker.wait());
            tokio::pin!(settled);
            let finished = tokio::select! {
                done = &mut settled => done.is_ok(),
                _ = shutdown.forced(), if !forced => {
                    tokio::time::timeout(FORCED_LIMIT, settled).await.is_ok_and(|done| done.is_ok())
                }
            };
            if !finished {
                tracing::error!(left = inner.running.len(), "deliveries still settling; stopping anyway (their messages come back by themselves)");
            }
        }
        heartbeats.stop().await;
        let _ = inner.store.forget_worker(&inner.config.worker_id).await;
        if let Some(s) = scheduler {
            let _ = s.await;
        }
        // Every delivery is settled: a broker that pushes deliveries (RabbitMQ) hands the ones
        // it buffered back to the queue for other workers (SQS waits for its open polls).
        // Told to stop now: at most 5 s for it.
        let stopping = inner.broker.stop_receiving();
        tokio::pin!(stopping);
        tokio::select! {
            _ = &mut stopping => {}
            _ = shutdown.forced() => {
                let _ = tokio::time::timeout(FORCED_LIMIT, stopping).await;
            }
        }
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
