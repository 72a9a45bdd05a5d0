//! Errors of the SQS broker, and reading SQS's error codes.

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata};
use ferriq::broker::BrokerError;
use thiserror::Error;

/// Why an [`SqsBroker`](crate::SqsBroker) could not be built or connected. Each says what to
/// check.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SqsError {
    /// The URL is not one of the accepted forms.
    #[error("invalid SQS URL {url}: {reason}")]
    Url {
        /// The URL, without secrets.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting is out of range or missing.
    #[error("invalid SQS setting: {0}")]
    Setting(String),
    /// No AWS region could be found.
    #[error(
        "no AWS region: give one in the URL (?region=eu-west-1), with \
         SqsBrokerBuilder::region, or in AWS_REGION"
    )]
    NoRegion,
    /// No AWS credentials could be found.
    #[error(
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, call \
         SqsBrokerBuilder::credentials, or enable the `aws-config` feature for the standard \
         chain (profiles, IMDS, ECS/EKS, web identity)"
    )]
    NoCredentials,
    /// A queue does not exist.
    #[error("queue {queue}: it does not exist ({hint})")]
    QueueMissing {
        /// The queue's name or URL.
        queue: String,
        /// What to check.
        hint: String,
    },
    /// A queue cannot be read, or is not usable as it is.
    #[error("queue {queue}: {reason}")]
    Queue {
        /// The queue's name or URL.
        queue: String,
        /// What SQS said, and what to check.
        reason: String,
    },
    /// No dead-letter queue is known for a lane.
    #[error(
        "queue {queue} has no dead-letter queue: give one (SqsBrokerBuilder::dead_letter_queue, \
         ?dlq= in the URL, FERRIQ_SQS_DLQ) or set a RedrivePolicy on the queue; ferriq parks \
         poison there instead of deleting it"
    )]
    NoDeadLetterQueue {
        /// The lane's queue.
        queue: String,
    },
}

/// The error code of an SQS error, without the `AWS.SimpleQueueService.` prefix some
/// services (and emulators) put on it.
pub(crate) fn code_of(e: &impl ProvideErrorMetadata) -> Option<&str> {
    e.code()
        .map(|c| c.strip_prefix("AWS.SimpleQueueService.").unwrap_or(c))
}

/// Whether an error code (and message) says a receipt handle is no longer ours: the message
/// was received again elsewhere, deleted, or its visibility ran out.
pub(crate) fn is_lost_handle(code: &str, message: Option<&str>) -> bool {
    let code = code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code);
    match code {
        "ReceiptHandleIsInvalid" | "MessageNotInflight" => true,
        // Real SQS: "Value … for parameter ReceiptHandle is invalid. Reason: The receipt
        // handle has expired" / "…not available for visibility timeout change".
        "InvalidParameterValue" => message.is_some_and(|m| {
            let m = m.to_ascii_lowercase();
            m.contains("receipt handle") || m.contains("receipthandle")
        }),
        _ => false,
    }
}

/// Whether a failed batch entry may succeed when sent again (the service's fault, not ours).
pub(crate) fn is_retryable_entry(sender_fault: bool, code: &str) -> bool {
    !sender_fault
        || matches!(
            code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code),
            "ThrottlingException" | "RequestThrottled" | "ServiceUnavailable" | "InternalError"
        )
}

/// A readable description of an SDK error: the service's code and message when it answered
/// (the full context there repeats the raw HTTP response), else the source chain.
pub(crate) fn describe<E: std::error::Error + ProvideErrorMetadata>(e: &E) -> String {
    match (e.code(), e.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => DisplayErrorContext(e).to_string(),
    }
}

/// Whether an SDK error says the queue itself does not exist (as opposed to the service being
/// unreachable or refusing the call).
pub(crate) fn is_missing_queue<E: ProvideErrorMetadata>(e: &E) -> bool {
    matches!(code_of(e), Some("NonExistentQueue" | "QueueDoesNotExist"))
}

/// An SDK call failure as a broker error: a lost handle is [`BrokerError::DeliveryLost`], a
/// missing queue a configuration error, the rest "unavailable" (retried by the worker).
pub(crate) fn broker_error<E>(e: &E) -> BrokerError
where
    E: std::error::Error + ProvideErrorMetadata,
{
    match code_of(e) {
        Some(code) if is_lost_handle(code, e.message()) => BrokerError::DeliveryLost,
        _ if is_missing_queue(e) => BrokerError::Config(format!(
            "the queue does not exist (deleted?): {}",
            describe(e)
        )),
        _ => BrokerError::Unavailable(describe(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_handles_are_recognised_in_every_form_sqs_and_emulators_use() {
        assert!(is_lost_handle("ReceiptHandleIsInvalid", None));
        assert!(is_lost_handle(
            "AWS.SimpleQueueService.MessageNotInflight",
            None
        ));
        assert!(is_lost_handle(
            "InvalidParameterValue",
            Some("Value abc for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.")
        ));
        assert!(!is_lost_handle(
            "InvalidParameterValue",
            Some("Value 50000 for parameter VisibilityTimeout is invalid")
        ));
        assert!(!is_lost_handle("ThrottlingException", None));
    }
}
