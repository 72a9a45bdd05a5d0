//! The [`Broker`] trait: where messages wait, and how a worker takes, keeps and gives them back.
//!
//! # Writing a broker
//!
//! A backend implements [`Broker`] (this file, first below) on its own types; workers and
//! clients hold it as an `Arc<dyn Broker>`, so nothing else of the backend leaks into the core.
//!
//! - **Required**: [`publish`](Broker::publish) (durable: return only once the broker holds
//!   the batch), [`receive`](Broker::receive) (cancel-safe), [`ack`](Broker::ack),
//!   [`release`](Broker::release) (visible again after a delay), [`extend`](Broker::extend)
//!   (heartbeats: the delivery stays invisible while its lease is extended),
//!   [`dead_letter`](Broker::dead_letter) (park a copy with its reason, then remove it),
//!   [`depth`](Broker::depth) and [`health`](Broker::health).
//! - **Optional, with defaults**: operations ([`dead_letters`](Broker::dead_letters) exposing a
//!   [`DeadLetterQueue`](dead_letters::DeadLetterQueue), [`queue_depths`](Broker::queue_depths),
//!   [`consumer_count`](Broker::consumer_count), [`delete_lane`](Broker::delete_lane)) and
//!   lifecycle ([`lanes`](Broker::lanes), [`prepare_consumer`](Broker::prepare_consumer),
//!   [`drain_started`](Broker::drain_started), [`stop_receiving`](Broker::stop_receiving),
//!   [`cannot_consume`](Broker::cannot_consume), [`close`](Broker::close)).
//!
//! The types a broker trades in live beside it: [`OutgoingMessage`] and [`RejectedMessage`]
//! (`message.rs`), [`Delivery`], [`DeliveryHandle`], [`LeaseStatus`] and [`ConsumerSettings`]
//! (`delivery.rs`), [`DeadLetter`], [`DeadLetterReason`] and the operators' dead-letter queue
//! (`dead_letters.rs`), [`QueueDepth`] and [`Health`] (`status.rs`), [`BrokerError`]
//! (`error.rs`). The memory broker (`ferriq::memory`) is the smallest complete example.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

pub mod dead_letters;
mod delivery;
mod error;
mod message;
mod status;

pub use dead_letters::{DeadLetter, DeadLetterReason};
pub use delivery::{ConsumerSettings, Delivery, DeliveryHandle, LeaseStatus, HOLD_WINDOW};
pub use error::BrokerError;
pub use message::{OutgoingMessage, RejectedMessage};
pub use status::{Health, QueueDepth};

/// The shared, cheaply cloned byte buffer a [`Delivery`] carries: the `bytes` crate's,
/// re-exported so a broker builds its deliveries with the version the core uses.
///
/// ```
/// let body = ferriq::broker::Bytes::from(b"{}".to_vec());
/// assert_eq!(&body[..], b"{}");
/// ```
pub use bytes::Bytes;

/// A message broker (SQS, RabbitMQ, in-memory). Object-safe: workers hold an `Arc<dyn Broker>`.
///
/// The contract (design §4, §7): `publish` returns only once the broker holds the messages
/// durably; a delivery stays invisible to others while its lease (visibility) is extended;
/// `release(after)` makes it visible again after `after`; `dead_letter` parks a copy with its
/// reason and removes the original; `ack` removes it. `receive` must be cancel-safe: a worker
/// drops a pending receive when it drains, and no message may be lost by that.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    // Required: the core contract.

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
    /// Whether the broker is usable.
    async fn health(&self) -> Health;

    // Optional: operations (what `client.ops()` and the dashboard show and do).

    /// Messages waiting per lane, for operators. The default gives the whole depth under the
    /// first lane's name.
    async fn queue_depths(&self) -> Result<Vec<(String, QueueDepth)>, BrokerError> {
        let name = self.lanes().into_iter().next().unwrap_or_default();
        Ok(vec![(name, self.depth().await?)])
    }
    /// The name of `queue` (`None`: the default lane) and how many consumers it has, when the
    /// broker knows: a client whose wait times out says so when nobody consumes the task's
    /// queue. The default does not know.
    async fn consumer_count(&self, queue: Option<&str>) -> Option<(String, u64)> {
        let _ = queue;
        None
    }
    /// The broker's dead-letter queues, for operators; `None` when it has none to offer.
    fn dead_letters(&self) -> Option<&dyn dead_letters::DeadLetterQueue> {
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

    // Optional: lifecycle (how a worker starts, drains and stops on this broker).

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
