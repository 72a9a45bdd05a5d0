#![warn(missing_docs)]
//! # ferriq-amqp
//!
//! ferriq's RabbitMQ broker (design §7), on `lapin`.
//!
//! - **Topology**, declared idempotently on every (re)connect, everything durable: a topic
//!   exchange (`taskiq`), one quorum queue per lane (`taskiq`) with taskiq-aio-pika 0.6's exact
//!   arguments (dead-letter exchange `""`, routing key `{queue}.dead_letter`) so Python taskiq
//!   producers and ferriq workers share it, the dead-letter queue `{queue}.dead_letter`, and
//!   delay tiers `{queue}.delay.{tier}` whose TTL dead-letters back into the lane (at-least-once).
//!   [`AmqpBrokerBuilder::declare_topology`]`(false)` only checks it (for inspection tools).
//! - **Publishing** hands a batch to the connection at once, in order, then waits for every
//!   publisher confirm; a nack or an unroutable (returned) message is an error, never silent.
//!   Messages are persistent and carry taskiq-aio-pika's headers (`task_id`, `task_name`,
//!   labels).
//! - **Consuming**: prefetch = the worker's concurrency; `release(after)` publishes a copy to a
//!   delay tier and acks the original only after the copy's confirm; `release(0)` is a nack with
//!   requeue; `dead_letter` parks a copy with `x-ferriq-reason`, `x-ferriq-detail`,
//!   `x-ferriq-task-name` and `x-ferriq-attempts` headers, then acks.
//! - **Deliveries** are taken from lapin's consumers by the worker's `receive` itself, with no
//!   forwarding task or channel in between.
//! - **Acks** are written on the delivery's own consumer channel (not through lapin's `Acker`,
//!   whose RPC task costs two more thread hand-offs per message), and the acks asked for
//!   together are written together: the oldest unsettled deliveries of a channel that are all
//!   being acked go out as one `multiple` ack (RabbitMQ spends a Raft command per ack frame).
//!   A delivery still running or being released is never covered.
//! - **Two connections**: one publishes, one (opened by the first `receive`) consumes and acks,
//!   as RabbitMQ advises: under a memory or disk alarm it stops reading from publishing
//!   connections, and a worker's acks must still get through to drain the backlog.
//! - **Connection loss** is detected by AMQP heartbeats (default 5 s) or the socket; a supervisor
//!   reconnects with backoff and declares the topology again. Deliveries from a dead channel are
//!   never acked afterwards: their heartbeat reports them lost and the broker's redelivered
//!   copies are handled instead (the claims keep them from running twice).
//!
//! ```no_run
//! # async fn demo() -> Result<(), ferriq_amqp::AmqpError> {
//! let broker = ferriq_amqp::AmqpBroker::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .queues(["taskiq"])
//!     .prefetch(32) // = the worker's concurrency
//!     .connect()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! ## Operating notes
//! - RabbitMQ's `consumer_timeout` (default 30 min, node-wide before 3.12) closes the channel of a
//!   delivery held longer: a run longer than that loses its delivery (and is cancelled, its
//!   redelivered copy runs again — the other runs on that channel lose theirs too). Such
//!   interrupted runs count toward the worker's `max_takeovers` (5), so a task that always
//!   outlives the timeout fails instead of looping. Raise `consumer_timeout` for long tasks.
//! - The lane's `x-delivery-limit` backstop is off by default, because taskiq-aio-pika declares
//!   the queue without it and RabbitMQ refuses a declare with different arguments. Set
//!   [`AmqpBrokerBuilder::delivery_limit`] (or `FERRIQ_AMQP_DELIVERY_LIMIT`) for queues only
//!   ferriq declares, or set it for shared queues with a policy
//!   (`rabbitmqctl set_policy … '{"delivery-limit":50}'`), which does not conflict. ferriq's
//!   own attempt limit lives in the claim store either way.

mod acks;
mod broker;
mod config;
mod consume;
mod dead_letters;
mod error;
mod from_url;
mod headers;
mod held;
mod lanes;
mod publish;
mod session;
mod supervisor;
mod topology;

pub use broker::AmqpBroker;
pub use config::AmqpBrokerBuilder;
pub use error::AmqpError;
