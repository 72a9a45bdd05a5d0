//! One connection and its channels, and how a session is opened and its consumers started
//! (the supervisor that replaces a dead one: `supervisor.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::consume::{LaneConsumer, LaneHost};
use crate::supervisor::{explain, watch_events};
use crate::topology::{self, SetupError};
use crate::AmqpBrokerBuilder;

/// A live session: a publishing connection with its confirm-mode channels, a consuming
/// connection opened on the first receive, and a token cancelled when either fails.
///
/// Two connections, as RabbitMQ advises: under a resource alarm it stops reading from
/// connections that publish, and a consumer's acks must still get through then.
pub(crate) struct Session {
    pub(crate) generation: u64,
    /// Publishing, topology, depth.
    pub(crate) connection: Connection,
    /// Consuming and acking (opened by the first receive).
    consumer_connection: tokio::sync::OnceCell<Connection>,
    publishers: Mutex<Vec<Channel>>,
    publisher_slots: Arc<Semaphore>,
    pub(crate) dead: CancellationToken,
    consuming: AtomicBool,
    /// The consumer channels, closed when the worker has drained.
    consumer_channels: Mutex<Vec<Channel>>,
}

/// A publisher channel checked out for one batch: acks and returns on it belong to that batch.
pub(crate) struct Publisher<'a> {
    session: &'a Session,
    pub(crate) channel: Option<Channel>,
    /// Set once every confirm of the batch arrived: only then may the channel serve another
    /// batch (a late return or ack would be paired with the next batch's publishes).
    pub(crate) settled: bool,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Publisher<'_> {
    fn drop(&mut self) {
        if let Some(ch) = self.channel.take() {
            if !self.settled {
                tokio::spawn(async move {
                    let _ = ch.close(200, "abandoned batch".into()).await;
                });
            } else if ch.status().connected() {
                self.session
                    .publishers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(ch);
            }
        }
    }
}

impl Session {
    /// Closes both connections, waiting at most `limit` for each.
    pub(crate) async fn close(&self, limit: Duration, why: &str) {
        let _ = tokio::time::timeout(limit, self.connection.close(200, why.into())).await;
        if let Some(c) = self.consumer_connection.get() {
            let _ = tokio::time::timeout(limit, c.close(200, why.into())).await;
        }
    }

    /// Whether both connections (the consuming one if opened) are up.
    pub(crate) fn connected(&self) -> bool {
        !self.dead.is_cancelled()
            && self.connection.status().connected()
            && self
                .consumer_connection
                .get()
                .is_none_or(|c| c.status().connected())
    }

    /// A confirm-mode channel for one batch: a pooled one, or a new one when none is free (the
    /// first use of a slot past the eager channels, or after the broker closed one).
    pub(crate) async fn checkout(&self) -> Result<Publisher<'_>, lapin::Error> {
        let slot = Arc::clone(&self.publisher_slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let pooled = self
            .publishers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let channel = match pooled {
            Some(ch) if ch.status().connected() => ch,
            _ => {
                let ch = self.connection.create_channel().await?;
                ch.confirm_select(ConfirmSelectOptions::default()).await?;
                ch
            }
        };
        Ok(Publisher {
            session: self,
            channel: Some(channel),
            settled: false,
            _slot: slot,
        })
    }
}

/// What the broker handle and the supervisor share.
pub(crate) struct Shared {
    pub(crate) config: AmqpBrokerBuilder,
    pub(crate) session: watch::Sender<Option<Arc<Session>>>,
    generation: AtomicU64,
    pub(crate) consume: AtomicBool,
    pub(crate) start_consuming: Notify,
    /// Consumers started and not yet taken by `receive`, which polls them itself.
    started_consumers: Mutex<Vec<LaneConsumer>>,
    /// Signalled when consumers are started (after a reconnect, a waiting `receive` takes
    /// them at once).
    pub(crate) consumers_started: Notify,
    pub(crate) last_error: Mutex<String>,
    pub(crate) stop: CancellationToken,
    /// Deliveries held unacked at once over the lanes: the configured prefetch, else the
    /// worker's concurrency (32 until a worker says).
    pub(crate) prefetch: std::sync::atomic::AtomicU16,
    /// The operators' channel for dead letters (with its session's generation): what it took
    /// stays held until settled on it.
    pub(crate) dead_channel: tokio::sync::Mutex<Option<(u64, Channel)>>,
    /// Queues known to exist (declared or checked by this process): a publish routed to any
    /// other is checked first, so a missing queue is an error before anything is sent.
    pub(crate) known_queues: Mutex<std::collections::HashSet<String>>,
    /// The nodes of the URL list (one for a plain URL), and the one connections go to now.
    nodes: Vec<ferriq::SecretUrl>,
    node: std::sync::atomic::AtomicUsize,
}

impl LaneHost for Shared {
    fn take_started_consumers(&self) -> Vec<LaneConsumer> {
        std::mem::take(
            &mut *self
                .started_consumers
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    fn consuming(&self) -> bool {
        self.consume.load(Ordering::SeqCst)
    }

    fn consumer_failed(&self, error: &lapin::Error) {
        self.set_error(error);
    }
}

impl Shared {
    pub(crate) fn new(config: AmqpBrokerBuilder) -> Self {
        Shared {
            session: watch::channel(None).0,
            generation: AtomicU64::new(0),
            consume: AtomicBool::new(false),
            start_consuming: Notify::new(),
            started_consumers: Mutex::new(Vec::new()),
            consumers_started: Notify::new(),
            last_error: Mutex::new(String::new()),
            stop: CancellationToken::new(),
            prefetch: std::sync::atomic::AtomicU16::new(config.prefetch.unwrap_or(32)),
            dead_channel: tokio::sync::Mutex::new(None),
            known_queues: Mutex::new(Self::declared_queues(&config)),
            nodes: config.url.nodes(),
            node: Default::default(),
            config,
        }
    }

    /// The queues connecting declares (or, without `declare_topology`, checks): the lanes,
    /// and their delay tiers when declared.
    fn declared_queues(config: &AmqpBrokerBuilder) -> std::collections::HashSet<String> {
        let mut known: std::collections::HashSet<String> = config.queues.iter().cloned().collect();
        if config.declare_topology {
            for lane in &config.queues {
                for tier in &config.delay_tiers {
                    known.insert(AmqpBrokerBuilder::delay_queue(lane, *tier));
                }
            }
        }
        known
    }

    /// The generation of the live session (0 when none): deliveries of any other are stale.
    pub(crate) fn current_generation(&self) -> u64 {
        self.session
            .borrow()
            .as_ref()
            .filter(|s| !s.dead.is_cancelled())
            .map_or(0, |s| s.generation)
    }

    pub(crate) fn set_error(&self, e: impl std::fmt::Display) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e.to_string();
    }

    /// Opens one connection (bounded by the connect timeout).
    async fn open_connection(&self, role: &str) -> Result<Connection, String> {
        let config = &self.config;
        let props = ConnectionProperties::default()
            .with_connection_name(format!("{} ({role})", config.connection_name).into());
        let url = config.connect_url(&self.current_node());
        let connecting = async {
            match config.tls_config()? {
                None => Connection::connect(&url, props).await,
                Some(tls) => {
                    let runtime = lapin::runtime::default_runtime().map_err(|e| e.to_string())?;
                    lapin::Connect::connect_with_config(url.as_str(), props, tls, runtime).await
                }
            }
            // lapin's errors do not contain the URL (nor the key: its parse errors say what,
            // not where).
            .map_err(|e| explain(&e.to_string(), self.current_node().scheme() == "amqps"))
        };
        tokio::time::timeout(config.connect_timeout, connecting)
            .await
            .map_err(|_| {
                let tls = if self.current_node().scheme() == "amqps" {
                    " (with amqps://, check that the port is the broker's TLS port: a plain port does not answer a TLS handshake)"
                } else {
                    ""
                };
                format!("no connection within {:?}{tls}", config.connect_timeout)
            })?
    }

    /// Moves to the next node of the list (with one node, stays): the next connection
    /// attempt starts there.
    pub(crate) fn next_node(&self) {
        if self.nodes.len() > 1 {
            self.node.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The node connections go to now.
    pub(crate) fn current_node(&self) -> ferriq::SecretUrl {
        let at = self.node.load(Ordering::SeqCst) % self.nodes.len().max(1);
        self.nodes
            .get(at)
            .cloned()
            .unwrap_or_else(|| self.config.url.clone())
    }

    /// Connects to the current node, else to each next one in turn (one round over the list):
    /// the first that answers serves the session. The error of a round that found none names
    /// each node's (without passwords).
    pub(crate) async fn connect_any(self: &Arc<Self>) -> Result<Arc<Session>, SetupError> {
        let n = self.nodes.len().max(1);
        let mut failures = Vec::new();
        for i in 0..n {
            if i > 0 {
                self.node.fetch_add(1, Ordering::SeqCst);
            }
            match self.connect_once().await {
                Ok(session) => return Ok(session),
                Err(e) if n == 1 => return Err(e),
                Err(e) => {
                    tracing::warn!(node = %self.current_node(), error = %e, "RabbitMQ node did not answer; trying the next");
                    failures.push((self.current_node().redacted(), e));
                }
            }
        }
        let missing = failures.iter().all(|(_, e)| e.missing);
        let message = failures
            .iter()
            .map(|(node, e)| format!("{node}: {e}"))
            .collect::<Vec<_>>()
            .join("; ");
        let mut error = SetupError::from(format!("no node of the list answered — {message}"));
        error.missing = missing;
        Err(error)
    }

    /// Connects, declares the topology and opens the first publisher channels (the rest open
    /// on demand).
    pub(crate) async fn connect_once(self: &Arc<Self>) -> Result<Arc<Session>, SetupError> {
        let config = &self.config;
        let connection = self.open_connection("publisher").await?;
        let events = connection.events_listener();
        let setup = async {
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| format!("opening a channel failed: {e}"))?;
            topology::declare(&channel, config).await?;
            let _ = channel.close(200, "topology declared".into()).await;
            // A few now (a connection that cannot open them fails here, not on the first
            // publish); checkout opens the rest when concurrent publishes need them.
            let eager = config
                .publisher_channels
                .min(crate::config::EAGER_PUBLISHER_CHANNELS);
            let mut publishers = Vec::with_capacity(eager);
            for _ in 0..eager {
                let opened = async {
                    let ch = connection.create_channel().await?;
                    ch.confirm_select(ConfirmSelectOptions::default()).await?;
                    Ok::<_, lapin::Error>(ch)
                };
                let ch = opened
                    .await
                    .map_err(|e| format!("opening the publisher channels failed: {e}"))?;
                publishers.push(ch);
            }
            Ok::<_, SetupError>(publishers)
        };
        let publishers = match tokio::time::timeout(config.connect_timeout, setup).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                let _ = connection.close(200, "setup failed".into()).await;
                return Err(e);
            }
            Err(_) => {
                let _ = connection.close(200, "setup timed out".into()).await;
                return Err(format!(
                    "setting up the connection (topology, publisher channels) took over {:?}",
                    config.connect_timeout
                )
                .into());
            }
        };
        let publisher_slots = crate::config::publisher_slots(
            config.publisher_channels,
            connection.configuration().channel_max(),
        );
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let session = Arc::new(Session {
            generation,
            connection,
            consumer_connection: tokio::sync::OnceCell::new(),
            publishers: Mutex::new(publishers),
            publisher_slots: Arc::new(Semaphore::new(publisher_slots)),
            dead: CancellationToken::new(),
            consuming: AtomicBool::new(false),
            consumer_channels: Mutex::new(Vec::new()),
        });
        watch_events(events, Arc::clone(&session), Arc::clone(self));
        Ok(session)
    }

    /// Starts one consumer per lane on `session`, once.
    pub(crate) async fn start_consumers(self: &Arc<Self>, session: &Arc<Session>) {
        if session.consuming.swap(true, Ordering::SeqCst) {
            return;
        }
        let lanes = self.config.queues.len() as u16;
        // Quorum queues have no global prefetch: split it over the lanes.
        let per_lane = self.prefetch.load(Ordering::SeqCst).div_ceil(lanes).max(1);
        let opened = session
            .consumer_connection
            .get_or_try_init(|| async {
                let connection = self.open_connection("consumer").await?;
                watch_events(
                    connection.events_listener(),
                    Arc::clone(session),
                    Arc::clone(self),
                );
                Ok::<_, String>(connection)
            })
            .await;
        let consumer_connection = match opened {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the consuming connection; reconnecting");
                self.set_error(&e);
                session.dead.cancel();
                return;
            }
        };
        for queue in &self.config.queues {
            let started = async {
                let channel = consumer_connection.create_channel().await?;
                channel
                    .basic_qos(per_lane, BasicQosOptions::default())
                    .await?;
                let tag = format!("ferriq-{}", uuid::Uuid::new_v4().simple());
                let consumer = channel
                    .basic_consume(
                        queue.as_str().into(),
                        tag.as_str().into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                Ok::<_, lapin::Error>((channel, tag, consumer))
            };
            match started.await {
                Ok((channel, _tag, consumer)) => {
                    if !self.consume.load(Ordering::SeqCst) {
                        // The worker drained while this consumer was starting.
                        let _ = channel.close(200, "worker drained".into()).await;
                        return;
                    }
                    session
                        .consumer_channels
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(channel.clone());
                    self.started_consumers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(LaneConsumer {
                            generation: session.generation,
                            queue: Arc::from(queue.as_str()),
                            acks: Arc::new(crate::acks::AckBook::new(Arc::new(channel))),
                            consumer,
                            dead: session.dead.clone(),
                        });
                    self.consumers_started.notify_one();
                }
                Err(e) => {
                    tracing::warn!(error = %e, queue, "cannot start consuming; reconnecting");
                    self.set_error(&e);
                    session.dead.cancel();
                    return;
                }
            }
        }
    }

    /// Closes the live session's consumer channels: RabbitMQ puts every delivery still
    /// unacked on them back in its queue (those buffered for a worker that stopped).
    pub(crate) async fn close_consumers(&self) {
        let session = self.session.borrow().clone();
        let Some(session) = session else {
            return;
        };
        let channels = std::mem::take(
            &mut *session
                .consumer_channels
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for channel in channels {
            // Bounded: a blocked connection may never answer the close.
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                channel.close(200, "worker drained".into()),
            )
            .await;
        }
        session.consuming.store(false, Ordering::SeqCst);
    }
}
