//! The client: enqueue tasks with typed arguments and await their typed results.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::clock::Clock;
use crate::connect::{
    connect_broker, connect_broker_with, connect_store, connect_store_with, ConnectError,
    ConnectOptions, Settings,
};

use serde_json::Value;

use crate::broker::{Broker, OutgoingMessage};
use crate::store::{Store, StoreError};
use crate::wire::{names, ErrorKind, TaskId, TaskMessage, TaskResult, WireError};

mod call;
mod dedup;
mod error;
mod handle;

pub use call::Call;
pub use error::{EnqueueError, WaitError};
pub use handle::{TaskHandle, TaskStatus};

/// The default largest message body, in bytes (`FERRIQ_MAX_PAYLOAD_BYTES`, 256 KiB: a standard
/// SQS queue's old maximum). Clients refuse to send larger bodies; workers park them unread.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// A message ready to publish, and (when middleware wants to hear how it went) the message.
pub(crate) type Prepared = (Option<TaskMessage>, OutgoingMessage);

/// Enqueues tasks and hands out [`TaskHandle`]s. Cheap to clone.
///
/// ```
/// use std::sync::Arc;
/// use ferriq::memory::{MemoryBroker, MemoryStore};
/// use ferriq::Client;
///
/// #[ferriq::task(name = "docs.client.add")]
/// async fn add(a: i64, b: i64) -> i64 { a + b }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = Arc::new(MemoryStore::new());
/// let client = Client::new(Arc::new(MemoryBroker::new()), store);
/// let handle = add::kiq(&client, 1, 2).await.unwrap();
/// assert_eq!(handle.task_id().as_str().len(), 32);
/// // A worker would now run it; handle.wait(timeout) returns 3.
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    clock: Clock,
    middleware: crate::middleware::Chain,
    max_payload: usize,
}

impl Client {
    /// A client publishing to `broker` and reading results (and workflow records) from
    /// `store`.
    pub fn new<S: Store + ?Sized>(broker: Arc<dyn Broker>, store: Arc<S>) -> Self {
        Client {
            broker,
            store: store.into_dyn(),
            clock: Clock::system(),
            middleware: Default::default(),
            max_payload: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }

    /// The same client refusing message bodies over `bytes` (default
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`], or `FERRIQ_MAX_PAYLOAD_BYTES` for a client from the
    /// environment): keep it equal to the workers' limit, above which they park a message
    /// unread.
    pub fn with_max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// The same client with `middleware` added after those already registered: its
    /// `before_send` and `after_send` hooks run around every message this client publishes,
    /// and `before_send` also on the messages a worker sends later for a call of this client
    /// (a chord's callback, a chain's later steps) when the call is enqueued (see
    /// [`crate::middleware`]).
    pub fn with_middleware(mut self, middleware: Arc<dyn crate::middleware::Middleware>) -> Self {
        self.middleware = self.middleware.with(middleware);
        self
    }

    /// The broker this client publishes to.
    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.broker
    }

    /// The store this client reads from.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The clock due times and deadlines are read from.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A client on the broker and store at these URLs, connected by whichever linked backend
    /// serves each scheme (see [`crate::connect`]); backend settings come from `FERRIQ_*`
    /// variables.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = ferriq::Client::connect("memory://", "memory://").await.unwrap();
    /// # let _ = client;
    /// # }
    /// ```
    pub async fn connect(broker_url: &str, store_url: &str) -> Result<Self, ConnectError> {
        let broker = connect_broker(broker_url).await?;
        let store = connect_store(store_url).await?;
        Ok(Client::new(broker, store))
    }

    /// A client on `FERRIQ_BROKER_URL` and `FERRIQ_STORE_URL` (or `FERRIQ_VALKEY_URL`) of the
    /// process environment, with the backends' settings from the other `FERRIQ_*` variables.
    pub async fn from_env() -> Result<Self, ConnectError> {
        let mut settings = Settings::default();
        settings.extend(std::env::vars().filter(|(k, _)| k.starts_with("FERRIQ_")));
        Self::from_settings(&settings).await
    }

    /// Closes the broker's and the store's connections and waits until nothing of them runs in
    /// the background: call it before `main` returns, and the process ends without warnings
    /// of connections cut mid-way. The connections are shared with this client's clones, its
    /// handles, and a worker given the same broker or store: they fail after it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let env = ferriq::testing::TestEnv::new();
    /// env.client.close().await;
    /// # }
    /// ```
    pub async fn close(&self) {
        tokio::join!(self.broker.close(), self.store.close());
    }

    /// A client on the `FERRIQ_BROKER_URL` and `FERRIQ_STORE_URL` (or `FERRIQ_VALKEY_URL`) of
    /// `settings`, with the backends' settings from the rest (a worker's
    /// [`WorkerConfig::settings`](crate::WorkerConfig::settings), for one).
    pub async fn from_settings(settings: &Settings) -> Result<Self, ConnectError> {
        let broker = settings
            .get("FERRIQ_BROKER_URL")
            .ok_or(ConnectError::Missing("FERRIQ_BROKER_URL"))?;
        let store = settings
            .get("FERRIQ_STORE_URL")
            .or_else(|| settings.get("FERRIQ_VALKEY_URL"))
            .ok_or(ConnectError::Missing("FERRIQ_STORE_URL"))?;
        let options = |url: &str| {
            let mut options = ConnectOptions::new(url);
            options.settings = settings.clone();
            options
        };
        let max_payload = match settings.get("FERRIQ_MAX_PAYLOAD_BYTES") {
            None => DEFAULT_MAX_PAYLOAD_BYTES,
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1024..=1 << 30).contains(n))
                .ok_or_else(|| {
                    ConnectError::Backend(format!(
                        "FERRIQ_MAX_PAYLOAD_BYTES={text:?}: expected a whole number of bytes \
                         from 1024 to {}",
                        1 << 30
                    ))
                })?,
        };
        let broker = connect_broker_with(options(broker)).await?;
        let store = connect_store_with(options(store)).await?;
        // A misspelt setting is otherwise silently ignored: a client with a mistyped result
        // prefix waits in the wrong place. Worker settings are known too (one environment
        // often configures both).
        settings.warn_unread("this client", crate::WorkerConfig::SETTINGS);
        Ok(Client::new(broker, store).with_max_payload(max_payload))
    }

    /// The same client, reading due times and deadlines from `clock` (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub(crate) fn outgoing(&self, msg: &mut TaskMessage) -> Result<OutgoingMessage, WireError> {
        let now = self.stamp(msg);
        OutgoingMessage::from_message_at(msg, now)
    }

    /// [`outgoing`](Self::outgoing), taking the message (nothing keeps it for middleware).
    fn outgoing_owned(&self, mut msg: TaskMessage) -> Result<OutgoingMessage, WireError> {
        let now = self.stamp(&mut msg);
        OutgoingMessage::from_owned_message_at(msg, now)
    }

    /// Adds the labels a message goes out with (its reply channel, when it was sent, when it
    /// is due), and says when that is.
    fn stamp(&self, msg: &mut TaskMessage) -> f64 {
        if msg.labels.get(names::REPLY_TO).is_none() {
            if let Some(channel) = self.store.reply_channel_for(&msg.task_id) {
                msg.labels.insert_named(names::REPLY_TO, channel);
            }
        }
        let now = self.clock.now_unix();
        if msg.labels.get(names::ENQUEUED_AT).is_none() {
            msg.labels
                .insert_named(names::ENQUEUED_AT, (now * 1000.0).round() / 1000.0);
        }
        if msg.labels.due_at().is_none() {
            // A hand-built message with taskiq's relative `delay`: this is its send time.
            if let Some(delay) = msg.labels.delay().filter(|d| !d.is_zero()) {
                let due = now + delay.as_secs_f64();
                msg.labels
                    .insert_named(names::DUE_AT, (due * 1000.0).ceil() / 1000.0);
            }
        }
        now
    }

    /// Runs the `before_send` hooks (which may refuse the message). Also for a message a
    /// worker publishes later for this call (a chord's callback, a chain's later steps), so
    /// the labels they add (a tenant, a trace context) are in it; `after_send` runs only for
    /// what this client publishes.
    pub(crate) async fn before_send(&self, msg: &mut TaskMessage) -> Result<(), EnqueueError> {
        if self.middleware.is_empty() {
            return Ok(());
        }
        self.middleware
            .before_send(msg)
            .await
            .map_err(|(middleware, reason)| EnqueueError::Middleware { middleware, reason })
    }

    /// The message as it goes out: middleware first (which may refuse it), then the reply
    /// channel and due time.
    pub(crate) async fn prepare(&self, mut msg: TaskMessage) -> Result<Prepared, EnqueueError> {
        if self.middleware.is_empty() {
            let out = self.outgoing_owned(msg)?;
            self.check_size(&out)?;
            return Ok((None, out));
        }
        self.before_send(&mut msg).await?;
        let out = self.outgoing(&mut msg)?;
        self.check_size(&out)?;
        // Kept for `after_send`.
        Ok((Some(msg), out))
    }

    /// Refuses a body workers would park unread.
    fn check_size(&self, out: &OutgoingMessage) -> Result<(), EnqueueError> {
        if out.body.len() <= self.max_payload {
            return Ok(());
        }
        Err(EnqueueError::TooLarge {
            task_name: out.task_name.to_string(),
            size: out.body.len(),
            limit: self.max_payload,
        })
    }

    /// Prepared messages that will not be published (a later step of the enqueue failed):
    /// `after_send` hears they were not sent, as it would of a failed publish.
    pub(crate) async fn not_sent(&self, prepared: Vec<Prepared>) {
        for msg in prepared.iter().filter_map(|p| p.0.as_ref()) {
            self.middleware.after_send(msg, false).await;
        }
    }

    /// Publishes prepared messages and tells the middleware how it went.
    pub(crate) async fn publish_prepared(&self, sent: Vec<Prepared>) -> Result<(), EnqueueError> {
        let (messages, batch): (Vec<_>, Vec<_>) = sent.into_iter().unzip();
        let outcome = self.broker.publish(batch).await;
        for msg in messages.iter().flatten() {
            self.middleware.after_send(msg, outcome.is_ok()).await;
        }
        Ok(outcome?)
    }

    /// Enqueues one call; returns once the broker holds it durably. A call with a
    /// deduplication key (`unique_for`, [`Call::with_dedup_key`]) that another task holds
    /// returns that task's handle, and sends nothing.
    pub async fn enqueue<T>(&self, call: Call<T>) -> Result<TaskHandle<T>, EnqueueError> {
        let prepared = self.prepare(call.into_message_at(&self.clock)?).await?;
        let mut handles = self.send_deduplicated(vec![prepared]).await?;
        Ok(handles.remove(0))
    }

    /// Enqueues many calls in one batch (fan-out); returns once the broker holds all of them.
    pub async fn enqueue_batch<T>(
        &self,
        calls: impl IntoIterator<Item = Call<T>>,
    ) -> Result<Vec<TaskHandle<T>>, EnqueueError> {
        let calls = calls.into_iter();
        // Sized once: a batch of a thousand grew ten times, each time moving every message.
        let mut batch = Vec::with_capacity(calls.size_hint().0);
        for call in calls {
            batch.push(self.prepare(call.into_message_at(&self.clock)?).await?);
        }
        self.send_deduplicated(batch).await
    }

    /// Enqueues a message built by hand (untyped result).
    pub async fn enqueue_message(
        &self,
        msg: TaskMessage,
    ) -> Result<TaskHandle<Value>, EnqueueError> {
        let prepared = self.prepare(msg).await?;
        let mut handles = self.send_deduplicated(vec![prepared]).await?;
        Ok(handles.remove(0))
    }

    /// A handle on an existing task by id.
    pub fn handle<T>(&self, task_id: TaskId) -> TaskHandle<T> {
        TaskHandle {
            task_id,
            store: Arc::clone(&self.store),
            sent_to: None,
            _output: PhantomData,
        }
    }

    /// A handle on a task this client sends to `queue` (`None`: the default lane).
    pub(crate) fn sent_handle<T>(&self, task_id: TaskId, queue: Option<String>) -> TaskHandle<T> {
        TaskHandle {
            sent_to: Some((Arc::clone(&self.broker), queue)),
            ..self.handle(task_id)
        }
    }

    /// Revokes a task: it never starts, a running one is cancelled at its next heartbeat, and
    /// its waiters get a `Cancelled` error. `false` when it had already finished.
    pub async fn revoke(&self, task_id: &TaskId) -> Result<bool, StoreError> {
        let result = TaskResult::failure(
            ErrorKind::Cancelled,
            "the task was revoked",
            false,
            0,
            0.0,
            crate::wire::Labels::new(),
        );
        self.store.revoke(task_id, &result).await
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}
