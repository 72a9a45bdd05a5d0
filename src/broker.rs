//! The [`Broker`] trait: where messages wait, and how a worker takes, keeps and gives them back.

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use thiserror::Error;

use crate::clock::Clock;
use crate::wire::{Labels, TaskId, TaskMessage, WireError, MAX_DELAY};

/// A delivery due within this long is held by the worker until it is due, instead of being
/// released to its broker again: brokers time a delay in whole seconds (SQS) or coarse tiers
/// (RabbitMQ). A broker may deliver a message with a shorter delay at once, with its due
/// time (`due_at`, or [`Delivery::not_before`]); the worker holds it for the rest.
///
/// ```
/// assert_eq!(ferriq::broker::HOLD_WINDOW, std::time::Duration::from_secs(1));
/// ```
pub const HOLD_WINDOW: Duration = Duration::from_secs(1);

/// A message ready to publish: the taskiq body plus what brokers need to route it. `Debug`
/// shows the body's size, never its content (user data).
#[derive(Clone)]
#[non_exhaustive]
pub struct OutgoingMessage {
    /// The task's id (also sent as a header/attribute, as taskiq-aio-pika does).
    pub task_id: TaskId,
    /// The task's name.
    pub task_name: String,
    /// The compact JSON body.
    pub body: Vec<u8>,
    /// The message's labels, which brokers that carry headers write as
    /// [`OutgoingMessage::headers`] (the body has them too). `queue`, `delay` and `priority`
    /// were read from them when the message was built: changing a label here changes only the
    /// headers.
    pub labels: Labels,
    /// The queue (lane) from the `queue_name` label; `None` is the broker's default queue.
    pub queue: Option<String>,
    /// How long the broker should keep the message from consumers: until its `due_at` label.
    /// Brokers that cannot hold it that long deliver it earlier, and the worker releases it
    /// again until it is due.
    pub delay: Option<Duration>,
    /// Priority from the `priority` label.
    pub priority: Option<u8>,
}

impl OutgoingMessage {
    /// Serialises a message and derives its routing from its labels, reading the system clock
    /// for the delay.
    pub fn from_message(message: &TaskMessage) -> Result<Self, WireError> {
        Self::from_message_at(message, Clock::system().now_unix())
    }

    /// Serialises a message and derives its routing from its labels; `now_unix` is the time
    /// its delay (until `due_at`) is counted from.
    pub fn from_message_at(message: &TaskMessage, now_unix: f64) -> Result<Self, WireError> {
        Ok(OutgoingMessage {
            task_id: message.task_id.clone(),
            task_name: message.task_name.clone(),
            body: message.to_json()?,
            labels: message.labels.clone(),
            queue: message.labels.queue_name().map(str::to_owned),
            delay: message
                .labels
                .due_at()
                .map(|due| due - now_unix)
                .filter(|left| *left > 0.0)
                .map(|left| Duration::from_secs_f64(left.min(MAX_DELAY.as_secs_f64()))),
            priority: message.labels.priority(),
        })
    }

    /// The headers taskiq-aio-pika writes: `task_id`, `task_name`, then every label as a
    /// string. Written on demand, borrowing what is already text, so a broker without headers
    /// pays nothing for them.
    ///
    /// ```
    /// use ferriq::broker::OutgoingMessage;
    /// use ferriq::wire::TaskMessage;
    /// let mut msg = TaskMessage::new("emails.send");
    /// msg.labels.insert("retry_on_error", true);
    /// let out = OutgoingMessage::from_message(&msg).unwrap();
    /// let headers: Vec<(&str, String)> = out.headers().map(|(k, v)| (k, v.into_owned())).collect();
    /// assert_eq!(headers[1], ("task_name", "emails.send".to_owned()));
    /// assert_eq!(headers[2], ("retry_on_error", "True".to_owned()));
    /// ```
    pub fn headers(&self) -> impl Iterator<Item = (&str, Cow<'_, str>)> {
        // A raw body ([`OutgoingMessage::raw`], no task name) names no task: its made-up id
        // must not reach a worker as the id of an unreadable message.
        let named = !self.task_name.is_empty();
        [
            ("task_id", Cow::Borrowed(self.task_id.as_str())),
            ("task_name", Cow::Borrowed(self.task_name.as_str())),
        ]
        .into_iter()
        .filter(move |_| named)
        .chain(self.labels.iter().map(|(k, v)| (k, v.header_value())))
    }

    /// A message with an arbitrary body, for tests of what workers do with malformed input.
    pub fn raw(body: impl Into<Vec<u8>>) -> Self {
        OutgoingMessage {
            task_id: TaskId::random(),
            task_name: String::new(),
            body: body.into(),
            labels: Labels::new(),
            queue: None,
            delay: None,
            priority: None,
        }
    }
}

/// A broker's own reference to one delivery (a receipt handle, a delivery tag on a channel…).
///
/// Each delivery gets a process-unique [`DeliveryHandle::key`]; the broker stores what it needs
/// inside and gets it back with [`DeliveryHandle::downcast_ref`].
#[derive(Clone)]
pub struct DeliveryHandle {
    key: u64,
    inner: Arc<dyn Any + Send + Sync>,
}

impl DeliveryHandle {
    /// Wraps a broker's handle.
    pub fn new<T: Any + Send + Sync>(inner: T) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DeliveryHandle {
            key: NEXT.fetch_add(1, Ordering::Relaxed),
            inner: Arc::new(inner),
        }
    }

    /// The broker's handle, if it is of type `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.inner.downcast_ref()
    }

    /// A key unique to this delivery in this process.
    pub fn key(&self) -> u64 {
        self.key
    }
}

impl fmt::Debug for DeliveryHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Receipt handles can be long and are not for logs.
        write!(f, "DeliveryHandle(#{})", self.key)
    }
}

/// One received copy of a message. `Debug` shows the body's size, never its content.
#[derive(Clone)]
#[non_exhaustive]
pub struct Delivery {
    /// The raw body, not yet parsed.
    pub body: Vec<u8>,
    /// The task id from a header or attribute, when the broker has one (used when the body is
    /// not readable).
    pub task_id: Option<String>,
    /// How many times this message has been received, this time included.
    pub receive_count: u32,
    /// The queue it came from.
    pub queue: String,
    /// The broker's handle for ack/release/extend.
    pub handle: DeliveryHandle,
    /// Unix seconds before which the message is not to be handled, when the broker delivers
    /// a released message early (its delay tiers are coarser than the release asked for):
    /// the worker releases it again until then.
    pub not_before: Option<f64>,
    /// Deliveries sharing this key run one at a time, in the order received (an SQS FIFO
    /// queue's message group): the worker starts the next only once the previous one's
    /// message left its queue, and hands the rest back when it went back instead.
    pub ordering_key: Option<Arc<str>>,
}

impl fmt::Debug for OutgoingMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutgoingMessage")
            .field("task_id", &self.task_id)
            .field("task_name", &self.task_name)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .field("queue", &self.queue)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .field("task_id", &self.task_id)
            .field("receive_count", &self.receive_count)
            .field("queue", &self.queue)
            .field("handle", &self.handle)
            .field("not_before", &self.not_before)
            // A queue URL and a group id (often a customer's): not for logs.
            .field("ordering_key", &self.ordering_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Delivery {
    /// A delivery, for broker implementations.
    pub fn new(
        body: Vec<u8>,
        task_id: Option<String>,
        receive_count: u32,
        queue: impl Into<String>,
        handle: DeliveryHandle,
    ) -> Self {
        Delivery {
            body,
            task_id,
            receive_count,
            queue: queue.into(),
            handle,
            not_before: None,
            ordering_key: None,
        }
    }

    /// The same delivery, run in order with the others of `key` (see
    /// [`Delivery::ordering_key`]).
    pub fn with_ordering_key(mut self, key: Option<Arc<str>>) -> Self {
        self.ordering_key = key;
        self
    }

    /// The same delivery, not to be handled before `unix` seconds (see
    /// [`Delivery::not_before`]).
    pub fn with_not_before(mut self, unix: Option<f64>) -> Self {
        self.not_before = unix.filter(|t| t.is_finite());
        self
    }
}

/// Whether a delivery is still held after a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseStatus {
    /// Still ours, lease extended.
    Kept,
    /// No longer ours (visibility expired and redelivered, channel closed…): never ack it.
    Lost,
    /// Still ours, but the broker cannot hold it much longer (SQS: 12 hours after the
    /// receive): settle it now. The worker fails the run with a `Timeout` that is not retried.
    LimitReached,
}

/// Why a message is parked in the dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The body is not a task message.
    InvalidMessage,
    /// The body is larger than allowed.
    TooLarge,
    /// Written by a newer ferriq wire version than this worker runs.
    UnsupportedWireVersion,
    /// No worker serves its task name.
    UnknownTask,
    /// The task failed with an error no retry can fix.
    NonRetryable,
    /// Every attempt failed.
    RetriesExhausted,
    /// Its deadline (`deadline_at`) passed before it could start: it never ran. Redriving it
    /// runs it without a deadline.
    Expired,
    /// The broker's own redrive limit (SQS `maxReceiveCount`, quorum `x-delivery-limit`, the
    /// memory broker's `max_receives`) moved it: a backstop, not the worker's decision.
    RedriveLimit,
}

impl DeadLetterReason {
    /// Every reason.
    pub const ALL: [DeadLetterReason; 8] = [
        DeadLetterReason::InvalidMessage,
        DeadLetterReason::TooLarge,
        DeadLetterReason::UnsupportedWireVersion,
        DeadLetterReason::UnknownTask,
        DeadLetterReason::NonRetryable,
        DeadLetterReason::RetriesExhausted,
        DeadLetterReason::Expired,
        DeadLetterReason::RedriveLimit,
    ];

    /// The reason named `name` ([`DeadLetterReason::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// A stable name, written as a header/attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::InvalidMessage => "invalid_message",
            DeadLetterReason::TooLarge => "too_large",
            DeadLetterReason::UnsupportedWireVersion => "unsupported_wire_version",
            DeadLetterReason::UnknownTask => "unknown_task",
            DeadLetterReason::NonRetryable => "non_retryable",
            DeadLetterReason::RetriesExhausted => "retries_exhausted",
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::RedriveLimit => "redrive_limit",
        }
    }
}

/// What a dead-lettered copy carries besides its body.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Why.
    pub reason: DeadLetterReason,
    /// A human-readable detail (the error message).
    pub detail: String,
    /// The task name, when known.
    pub task_name: Option<String>,
    /// Attempts made.
    pub attempts: u32,
}

impl DeadLetter {
    /// A dead-letter record.
    pub fn new(
        reason: DeadLetterReason,
        detail: impl Into<String>,
        task_name: Option<String>,
        attempts: u32,
    ) -> Self {
        DeadLetter {
            reason,
            detail: detail.into(),
            task_name,
            attempts,
        }
    }
}

/// Messages waiting in a queue, for autoscaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueDepth {
    /// Ready to be received.
    pub ready: u64,
    /// Received and not yet acked (when the broker knows).
    pub in_flight: u64,
    /// Delayed (not yet visible), when the broker knows.
    pub delayed: u64,
}

impl QueueDepth {
    /// A depth reading.
    pub fn new(ready: u64, in_flight: u64, delayed: u64) -> Self {
        QueueDepth {
            ready,
            in_flight,
            delayed,
        }
    }
}

/// How a worker consumes, for [`Broker::prepare_consumer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerSettings {
    /// Most deliveries the worker runs at once.
    pub concurrency: usize,
    /// How long the worker asks a delivery to stay its own between heartbeats (heartbeats
    /// run every third of it).
    pub lease: Duration,
}

impl ConsumerSettings {
    /// Settings for a worker of `concurrency` runs and `lease`.
    pub fn new(concurrency: usize, lease: Duration) -> Self {
        ConsumerSettings { concurrency, lease }
    }
}

/// A backend's health, for readiness probes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Connected and working.
    Healthy,
    /// Not usable right now; the string says why.
    Unhealthy(String),
}

impl Health {
    /// Whether it is healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// One message a broker refused in a batch it otherwise took.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectedMessage {
    /// The refused message's task.
    pub task_id: TaskId,
    /// Why (the broker's words).
    pub reason: String,
}

impl RejectedMessage {
    /// A refusal.
    pub fn new(task_id: TaskId, reason: impl Into<String>) -> Self {
        RejectedMessage {
            task_id,
            reason: reason.into(),
        }
    }
}

fn describe_rejections(rejected: &[RejectedMessage]) -> String {
    let shown: Vec<String> = rejected
        .iter()
        .take(3)
        .map(|r| format!("task {}: {}", r.task_id, r.reason))
        .collect();
    let more = rejected.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    format!("{}{tail}", shown.join("; "))
}

/// What went wrong talking to a broker.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The broker cannot be reached or the connection broke; retry later.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The broker refused a message (nack, unroutable, over its size limit…).
    #[error("broker rejected the message: {0}")]
    Rejected(String),
    /// Some messages of a batch were refused; every other one was published.
    #[error(
        "{} message(s) of the batch were refused, the others were published: {}",
        .0.len(),
        describe_rejections(.0)
    )]
    PartlyRejected(Vec<RejectedMessage>),
    /// The delivery is no longer ours (lease expired, channel closed): it was not acked.
    #[error("delivery is no longer held by this worker; its redelivered copy will be handled")]
    DeliveryLost,
    /// The broker is misconfigured (missing queue, bad URL…).
    #[error("broker configuration error: {0}")]
    Config(String),
    /// A handle from another broker was passed in.
    #[error("delivery handle does not belong to this broker")]
    ForeignHandle,
    /// What an operation names is not on the broker (a lane with no queues).
    #[error("{0}")]
    NotFound(String),
}

/// A message broker (SQS, RabbitMQ, in-memory). Object-safe: workers hold an `Arc<dyn Broker>`.
///
/// The contract (design §4, §7): `publish` returns only once the broker holds the messages
/// durably; a delivery stays invisible to others while its lease (visibility) is extended;
/// `release(after)` makes it visible again after `after`; `dead_letter` parks a copy with its
/// reason and removes the original; `ack` removes it. `receive` must be cancel-safe: a worker
/// drops a pending receive when it drains, and no message may be lost by that.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Publishes a batch durably (confirmed) or fails; a failure may leave some published.
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError>;
    /// Receives up to `max` deliveries, waiting up to `wait` for the first.
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError>;
    /// Removes a delivered message for good.
    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError>;
    /// Gives a delivery back, visible again after `after`.
    async fn release(&self, delivery: &DeliveryHandle, after: Duration) -> Result<(), BrokerError>;
    /// Extends the lease of held deliveries; reports, per delivery, whether it is still held.
    async fn extend(
        &self,
        deliveries: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError>;
    /// Parks a copy of the delivery in the dead-letter queue with its reason, then removes it.
    async fn dead_letter(&self, delivery: &Delivery, why: &DeadLetter) -> Result<(), BrokerError>;
    /// Messages waiting, for autoscaling.
    async fn depth(&self) -> Result<QueueDepth, BrokerError>;
    /// Messages waiting per lane, for operators. The default gives the whole depth under the
    /// first lane's name.
    async fn queue_depths(&self) -> Result<Vec<(String, QueueDepth)>, BrokerError> {
        let name = self.lanes().into_iter().next().unwrap_or_default();
        Ok(vec![(name, self.depth().await?)])
    }
    /// Whether the broker is usable.
    async fn health(&self) -> Health;
    /// The name of `queue` (`None`: the default lane) and how many consumers it has, when the
    /// broker knows: a client whose wait times out says so when nobody consumes the task's
    /// queue. The default does not know.
    async fn consumer_count(&self, queue: Option<&str>) -> Option<(String, u64)> {
        let _ = queue;
        None
    }
    /// The broker's dead-letter queues, for operators; `None` when it has none to offer.
    fn dead_letters(&self) -> Option<&dyn crate::dead_letters::DeadLetterQueue> {
        None
    }
    /// Deletes the queues of `lane` (on RabbitMQ: the lane, its dead-letter queue and delay
    /// tiers, which every process listing the lane declares) and returns how many messages
    /// went with them. Without `force` a lane holding messages or consumers is refused. The
    /// default refuses: the broker's queues are made outside ferriq (SQS).
    async fn delete_lane(&self, lane: &str, force: bool) -> Result<u64, BrokerError> {
        let _ = (lane, force);
        Err(BrokerError::Config(
            "this broker's queues are made outside ferriq: delete them where they were made".into(),
        ))
    }
    /// Closes the broker's connections (unsettled deliveries go back to their queues), so a
    /// process ends without warnings of connections cut mid-way. Idempotent. The default has
    /// nothing to close.
    async fn close(&self) {}
    /// Why this broker cannot feed a worker, or `None` when it can: a broker connected only
    /// to send says so here, and [`WorkerBuilder::build`](crate::worker::WorkerBuilder::build)
    /// refuses it, instead of a worker that starts and consumes nothing. The default can.
    fn cannot_consume(&self) -> Option<String> {
        None
    }
    /// The queues (lanes) this broker consumes, by name; the first is the default. The
    /// default knows none.
    fn lanes(&self) -> Vec<String> {
        Vec::new()
    }
    /// How the worker will consume, called before its first `receive`: a broker that pushes
    /// deliveries sizes its prefetch to the concurrency (unless one was set explicitly), one
    /// that leases them holds each for `lease` until the first heartbeat. The default does
    /// nothing.
    fn prepare_consumer(&self, consumer: &ConsumerSettings) {
        let _ = consumer;
    }
    /// The worker has begun to drain and will not call `receive` again: a broker that fetches
    /// ahead (long polls in the background) stops fetching, and hands back what its open
    /// fetches still bring. Deliveries already taken are settled as usual. The default does
    /// nothing.
    fn drain_started(&self) {}
    /// The worker has drained (every delivery it took is settled) and will not call `receive`
    /// again: a broker that pushes deliveries gives back the ones it buffered. The default
    /// does nothing (pull brokers hold nothing unasked).
    async fn stop_receiving(&self) {}
}

impl fmt::Debug for dyn Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn Broker")
    }
}
