//! Queues: lanes resolved to URLs with their attributes, and their dead-letter queues.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;

use crate::config::QueueRef;
use crate::error::{describe, is_missing_queue};
use crate::SqsError;

/// What to find of a queue's dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadLetters {
    /// A lane a worker consumes: it must have one.
    Required,
    /// A lane of a broker that only sends: the one it names, if any (for the dead-letter
    /// operations).
    IfNamed,
    /// Another queue, or a dead-letter queue itself.
    Skip,
}

/// A queue ferriq sends to or consumes, as SQS describes it.
#[derive(Debug)]
pub(crate) struct Queue {
    /// The name messages route by (`queue_name` label).
    pub(crate) name: Arc<str>,
    pub(crate) url: String,
    pub(crate) fifo: bool,
    /// Largest message body plus attributes the queue takes.
    pub(crate) max_message_bytes: usize,
    /// How long SQS keeps a message, counted from its send.
    pub(crate) retention: std::time::Duration,
    /// Where poison goes; `None` for queues ferriq only sends to.
    pub(crate) dead_letter: Option<Arc<Queue>>,
}

impl Queue {
    /// A queue's URL and attributes; its dead-letter queue as `dead_letters` asks (the one
    /// given, else the RedrivePolicy's target).
    pub(crate) async fn resolve(
        client: &Client,
        queue: &QueueRef,
        dead_letter: Option<&QueueRef>,
        dead_letters: DeadLetters,
    ) -> Result<Queue, SqsError> {
        let url = url_of(client, queue, None).await?;
        let attributes = attributes(client, &url, queue.name()).await?;
        let mut resolved = Queue {
            name: Arc::from(queue.name()),
            fifo: attributes
                .get(&QueueAttributeName::FifoQueue)
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            max_message_bytes: attributes
                .get(&QueueAttributeName::MaximumMessageSize)
                .and_then(|v| v.parse().ok())
                .unwrap_or(256 * 1024),
            retention: std::time::Duration::from_secs(
                attributes
                    .get(&QueueAttributeName::MessageRetentionPeriod)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(4 * 86_400),
            ),
            url,
            dead_letter: None,
        };
        if dead_letters == DeadLetters::Skip {
            return Ok(resolved);
        }
        let policy = attributes.get(&QueueAttributeName::RedrivePolicy);
        let named = dead_letter.is_some()
            || policy
                .and_then(|p| json_field(p, "deadLetterTargetArn"))
                .is_some();
        if dead_letters == DeadLetters::IfNamed && !named {
            return Ok(resolved);
        }
        if let Some(limit) = policy.and_then(|p| json_field(p, "maxReceiveCount")) {
            if limit.parse::<u32>().is_ok_and(|n| n < 50) {
                tracing::warn!(
                    queue = %resolved.name,
                    max_receive_count = %limit,
                    "the queue's maxReceiveCount is below 50: SQS may park messages that were \
                     only deferred or whose receiver crashed, without a result (ferriq counts \
                     attempts itself; keep the backstop high)"
                );
            }
        }
        let target = match dead_letter {
            Some(d) => d.clone(),
            None => {
                let arn = policy
                    .and_then(|p| json_field(p, "deadLetterTargetArn"))
                    .ok_or_else(|| SqsError::NoDeadLetterQueue {
                        queue: resolved.name.to_string(),
                    })?;
                // arn:aws:sqs:REGION:ACCOUNT:NAME
                let parts: Vec<&str> = arn.split(':').collect();
                if parts.len() != 6 {
                    return Err(SqsError::Queue {
                        queue: resolved.name.to_string(),
                        reason: format!("its RedrivePolicy names {arn:?}, not a queue ARN"),
                    });
                }
                let url =
                    url_of(client, &QueueRef::Name(parts[5].to_owned()), Some(parts[4])).await?;
                QueueRef::Url(url)
            }
        };
        let dead = Box::pin(Queue::resolve(client, &target, None, DeadLetters::Skip)).await?;
        if dead.fifo != resolved.fifo {
            return Err(SqsError::Queue {
                queue: resolved.name.to_string(),
                reason: format!(
                    "its dead-letter queue {} must be of the same type (FIFO or standard)",
                    dead.name
                ),
            });
        }
        resolved.dead_letter = Some(Arc::new(dead));
        Ok(resolved)
    }
}

async fn url_of(
    client: &Client,
    queue: &QueueRef,
    owner: Option<&str>,
) -> Result<String, SqsError> {
    match queue {
        QueueRef::Url(url) => Ok(url.clone()),
        QueueRef::Name(name) => {
            let mut call = client.get_queue_url().queue_name(name);
            if let Some(account) = owner {
                call = call.queue_owner_aws_account_id(account);
            }
            let out = call.send().await.map_err(|e| {
                queue_error(
                    name,
                    &e,
                    "check the queue name (the URL's path, FERRIQ_QUEUES, --queues), the \
                     region and the account",
                    "cannot look it up",
                    "check the endpoint, region and credentials",
                )
            })?;
            out.queue_url()
                .map(str::to_owned)
                .ok_or_else(|| SqsError::Queue {
                    queue: name.clone(),
                    reason: "SQS answered without a URL".into(),
                })
        }
    }
}

async fn attributes(
    client: &Client,
    url: &str,
    name: &str,
) -> Result<HashMap<QueueAttributeName, String>, SqsError> {
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .map_err(|e| {
            queue_error(
                name,
                &e,
                "check the URL: its account and name",
                "cannot read its attributes",
                "check the URL and credentials",
            )
        })?;
    Ok(out.attributes().cloned().unwrap_or_default())
}

/// A failed look-up of `queue` as an error that says whether the queue is missing (and what to
/// check then) or the call failed (what failed, the service's words, what to check).
fn queue_error<E: std::error::Error + ProvideErrorMetadata>(
    queue: &str,
    e: &E,
    when_missing: &str,
    failed: &str,
    when_failed: &str,
) -> SqsError {
    if is_missing_queue(e) {
        return SqsError::QueueMissing {
            queue: queue.to_owned(),
            hint: when_missing.to_owned(),
        };
    }
    SqsError::Queue {
        queue: queue.to_owned(),
        reason: format!("{failed}: {} ({when_failed})", describe(e)),
    }
}

/// A string or number field of a small JSON object, as SQS writes RedrivePolicy.
fn json_field(json: &str, field: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    match value.get(field)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redrive_policies_read_as_sqs_writes_them() {
        let p = r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:jobs-dlq","maxReceiveCount":"5"}"#;
        assert_eq!(
            super::json_field(p, "maxReceiveCount").as_deref(),
            Some("5")
        );
        let p = r#"{"deadLetterTargetArn":"arn","maxReceiveCount":10}"#;
        assert_eq!(
            super::json_field(p, "maxReceiveCount").as_deref(),
            Some("10")
        );
    }
}
