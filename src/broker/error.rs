//! What went wrong talking to a broker.

use thiserror::Error;

use super::RejectedMessage;

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
