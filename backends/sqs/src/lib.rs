#![warn(missing_docs)]
//! # ferriq-sqs
//!
//! ferriq's Amazon SQS broker (design §7), on `aws-sdk-sqs` with one lean HTTP/TLS stack
//! (rustls with ring). A message is never deleted before its outcome is stored; it is handed
//! back by changing its visibility.
//!
//! - **Receiving**: a few long pollers (`WaitTimeSeconds` up to 20) ask SQS only for as many
//!   messages as the worker has free run slots, so nothing waits in a local buffer burning
//!   its visibility and receive count. Each receive asks for the worker's lease as the initial
//!   visibility; `ApproximateReceiveCount` is the delivery's receive count.
//! - **Sending**: `SendMessageBatch` in chunks of at most 10 entries and 1 MiB; a message over
//!   the queue's `MaximumMessageSize` is refused before anything is sent, entries SQS fails on
//!   its side are sent again, and the refused ones are reported per message
//!   ([`BrokerError::PartlyRejected`](ferriq::broker::BrokerError::PartlyRejected)) while the
//!   rest of the batch goes. Delays up to 15 minutes use `DelaySeconds`; longer ones arrive
//!   early and the worker releases them until they are due.
//! - **Settling**: ack is `DeleteMessage`, gathered into `DeleteMessageBatch` calls under load
//!   (a lone delete goes at once). A release changes the visibility — or, once a message has
//!   been received [`resend_after_receives`](SqsBrokerBuilder::resend_after_receives) times (3)
//!   or the wait outlasts its visibility budget, sends a fresh copy and deletes the original,
//!   so deferred and long-delayed tasks never reach the queue's `maxReceiveCount`. The copy
//!   carries its earlier receives, so the worker's own receive limits still count them. A dead
//!   letter is a copy sent to the dead-letter queue with `ferriq_reason`, `ferriq_detail`,
//!   `ferriq_task_name`, `ferriq_attempts`, `ferriq_source_queue` and `task_id` attributes,
//!   then the original deleted.
//! - **Heartbeats**: `ChangeMessageVisibilityBatch` for every held delivery, one attempt each
//!   with a short timeout (an outage never drains the retry budget of the other calls). SQS
//!   keeps a message invisible at most **12 hours after a receive**: a heartbeat never asks
//!   past that, and a run still going 2 minutes
//!   ([`budget_margin`](SqsBrokerBuilder::budget_margin)) before it is failed with a `Timeout`
//!   that is not retried (a retry would meet the same limit) while its message is still held,
//!   and the message is parked. Split work that long into shorter tasks.
//! - **Lost handles**: `ReceiptHandleIsInvalid`, `MessageNotInflight` and
//!   `InvalidParameterValue` about the receipt handle mean the delivery is lost (its run is
//!   cancelled, nothing is written). A delete or a visibility change that succeeds proves
//!   nothing — SQS accepts stale handles for both — so the claim in the store stays the
//!   authority.
//! - **FIFO queues**: `MessageGroupId` from the `group_id` label (taskiq-aio-sqs's) or the task
//!   name, `MessageDeduplicationId` the task id. FIFO queues take no per-message delay and
//!   releases always change the visibility. So on a FIFO queue a delayed, deferred or
//!   backing-off task holds its group (by default every task of its name) until it runs, and
//!   a wait longer than 12 hours costs one receive per 12 hours against `maxReceiveCount`:
//!   give tasks their own `group_id` label when order within a name does not matter, and use a
//!   standard queue for long delays. Deliveries from a FIFO queue carry their group as
//!   [`Delivery::ordering_key`](ferriq::broker::Delivery::ordering_key): the worker runs a
//!   group's messages one at a time, in order, even when SQS hands over several in one receive.
//!
//! ## Connecting
//!
//! ```no_run
//! # async fn demo() -> Result<(), ferriq_sqs::SqsError> {
//! let broker = ferriq_sqs::SqsBroker::builder("sqs://jobs?region=eu-west-1")?
//!     .dead_letter_queue("jobs-dlq") // else the queue's RedrivePolicy target
//!     .connect()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! URLs: `sqs://QUEUE?region=R&endpoint=E&dlq=D`, `sqs+https://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE`,
//! `sqs+http://HOST:PORT/ACCOUNT/QUEUE` (an emulator). Credentials never go in the URL: static
//! keys from [`SqsBrokerBuilder::credentials`] or `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/
//! `AWS_SESSION_TOKEN`, or — with the `aws-config` feature — the standard chain (profiles,
//! IMDS, ECS/EKS Pod Identity, web identity). The region comes from the URL, the builder or
//! `AWS_REGION`; an endpoint from the URL, the builder, `AWS_ENDPOINT_URL_SQS` or
//! `AWS_ENDPOINT_URL`.
//!
//! ## Operating notes
//! - Every lane a worker consumes needs a dead-letter queue: ferriq parks poison there rather
//!   than delete it, and a worker's broker refuses to connect without one. A broker that only
//!   sends (`SqsBrokerBuilder::send_only`; a client connected from a URL) needs none, and
//!   refuses to receive (a worker built with it fails at `build`). Give the source queue a
//!   RedrivePolicy with `maxReceiveCount` of at least 50: it is a backstop for crash loops,
//!   ferriq counts attempts in its claim store.
//! - The queue's `VisibilityTimeout` matters little: each receive asks for the worker's lease,
//!   and heartbeats extend it every third of that.
//! - A message's retention (`MessageRetentionPeriod`, default 4 days) counts from its send. A
//!   long delay or release holds a message for at most three receives (about 36 hours) and
//!   then sends a fresh copy, so tasks delayed longer than the retention still run; keep the
//!   retention at 2 days or more (with less, every long wait goes through fresh copies, one per
//!   15 minutes).

mod broker;
mod client;
mod config;
mod dead_letters;
mod error;
mod from_url;
mod queue;
mod receive;
mod send;
mod settle;
mod shared;

pub use broker::SqsBroker;
pub use config::SqsBrokerBuilder;
pub use error::SqsError;

impl SqsBrokerBuilder {
    /// Checks the settings, finds the queues (and their dead-letter queues: required unless
    /// [`send_only`](Self::send_only)) and connects.
    /// Receiving starts with the first `receive`, so a client that only sends never takes
    /// messages.
    pub async fn connect(self) -> Result<SqsBroker, SqsError> {
        SqsBroker::connect(self).await
    }
}
