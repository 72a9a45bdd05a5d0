//! What comes in: a delivery, the broker's handle on it, and what a heartbeat learns.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::wire::TaskId;

/// A delivery due within this long is held by the worker until it is due, instead of being
/// released to its broker again: brokers time a delay in whole seconds (SQS) or coarse tiers
/// (RabbitMQ). A broker may deliver a message with a shorter delay at once, with its due
/// time (`due_at`, or [`Delivery::not_before`]); the worker holds it for the rest.
///
/// ```
/// assert_eq!(ferriq::broker::HOLD_WINDOW, std::time::Duration::from_secs(1));
/// ```
pub const HOLD_WINDOW: Duration = Duration::from_secs(1);

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
    /// The raw body, not yet parsed. Shared, not copied: the broker's handle may keep the
    /// same bytes to send the message again, and a clone of the delivery costs a count.
    pub body: Bytes,
    /// The task id from a header or attribute, when the broker has one that is a valid id
    /// (used when the body is not readable, or over the size limit and not read).
    pub task_id: Option<TaskId>,
    /// How many times this message has been received, this time included.
    pub receive_count: u32,
    /// The queue it came from (shared: a broker hands every delivery of a lane the same
    /// name, and the worker keeps it with the run without a copy).
    pub queue: Arc<str>,
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
        body: impl Into<Bytes>,
        task_id: Option<TaskId>,
        receive_count: u32,
        queue: impl Into<Arc<str>>,
        handle: DeliveryHandle,
    ) -> Self {
        Delivery {
            body: body.into(),
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

/// How a worker consumes, for [`Broker::prepare_consumer`](super::Broker::prepare_consumer).
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
