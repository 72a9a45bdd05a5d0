//! Sending: `SendMessageBatch` in chunks of at most 10 entries and the batch byte limit, sizes
//! checked before anything is sent, failed entries sent again alone, refusals reported per
//! message.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use ferriq::broker::{BrokerError, OutgoingMessage, RejectedMessage};
use ferriq::wire::TaskId;
use futures_util::future::join_all;

use crate::error::{broker_error, is_retryable_entry};
use crate::queue::Queue;
use crate::receive::NOT_BEFORE_ATTRIBUTE;
use crate::shared::Shared;

/// SQS's longest `DelaySeconds`.
pub(crate) const MAX_DELAY_SECS: u64 = 900;

/// One message ready for SQS.
#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) task_id: TaskId,
    pub(crate) body: String,
    pub(crate) attributes: Vec<(String, MessageAttributeValue)>,
    pub(crate) delay_secs: u64,
    pub(crate) group_id: Option<String>,
    pub(crate) dedup_id: Option<String>,
}

impl Entry {
    /// What SQS counts against its size limit: the body, and each attribute's name, type and
    /// value.
    pub(crate) fn size(&self) -> usize {
        self.body.len()
            + self
                .attributes
                .iter()
                .map(|(k, v)| k.len() + v.data_type().len() + v.string_value().map_or(0, str::len))
                .sum::<usize>()
    }
}

/// A string message attribute.
pub(crate) fn text(value: impl Into<String>) -> MessageAttributeValue {
    attribute("String", value)
}

/// A number message attribute.
pub(crate) fn number(value: impl ToString) -> MessageAttributeValue {
    attribute("Number", value.to_string())
}

fn attribute(kind: &str, value: impl Into<String>) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type(kind)
        .string_value(value)
        .build()
        .expect("the data type is set")
}

/// The entry of an outgoing message for `queue`.
pub(crate) fn entry(queue: &Queue, msg: OutgoingMessage, now_ms: u64) -> Result<Entry, String> {
    let body = String::from_utf8(msg.body)
        .map_err(|_| "SQS message bodies are text: this body is not UTF-8".to_owned())?;
    let mut attributes = vec![("task_id".to_owned(), text(msg.task_id.as_str()))];
    if !msg.task_name.is_empty() {
        attributes.push(("task_name".to_owned(), text(msg.task_name.as_str())));
    }
    let delay = msg.delay.unwrap_or_default();
    // Whole seconds, rounded down: the worker holds a message that comes a fraction early.
    let mut delay_secs = delay.as_secs().min(MAX_DELAY_SECS);
    if queue.fifo {
        // FIFO queues take no per-message delay: the worker releases it until due.
        delay_secs = 0;
    } else if delay.as_secs() > MAX_DELAY_SECS {
        attributes.push((
            NOT_BEFORE_ATTRIBUTE.to_owned(),
            number(now_ms + delay.as_millis() as u64),
        ));
    }
    let group_id = queue.fifo.then(|| {
        // taskiq-aio-sqs's label, else the task name.
        msg.labels
            .get("group_id")
            .map(|v| v.header_value().into_owned())
            .unwrap_or_else(|| msg.task_name.to_string())
    });
    Ok(Entry {
        dedup_id: queue.fifo.then(|| msg.task_id.to_string()),
        task_id: msg.task_id,
        body,
        attributes,
        delay_secs,
        group_id,
    })
}

impl Shared {
    /// Sends `entries` to `queue`: every entry that can go goes; the refused are returned.
    pub(crate) async fn send_entries(
        &self,
        queue: &Arc<Queue>,
        entries: Vec<Entry>,
    ) -> Result<Vec<RejectedMessage>, BrokerError> {
        let mut rejected = Vec::new();
        let mut chunks: Vec<Vec<Entry>> = Vec::new();
        let (mut chunk, mut bytes) = (Vec::new(), 0);
        for e in entries {
            let size = e.size();
            if size > queue.max_message_bytes {
                rejected.push(RejectedMessage::new(
                    e.task_id,
                    format!(
                        "the message is {size} bytes, over queue {}'s limit of {} bytes \
                         (MaximumMessageSize); store large payloads elsewhere and send a reference",
                        queue.name, queue.max_message_bytes
                    ),
                ));
                continue;
            }
            if chunk.len() == 10 || bytes + size > self.settings.max_batch_bytes {
                chunks.push(std::mem::take(&mut chunk));
                bytes = 0;
            }
            bytes += size;
            chunk.push(e);
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        // A few chunks at a time: SQS takes them in parallel, a huge fan-out must not open
        // hundreds of connections.
        for group in chunks.chunks(8) {
            let sends = group.iter().map(|c| self.send_chunk(queue, c));
            for outcome in join_all(sends).await {
                rejected.extend(outcome?);
            }
        }
        Ok(rejected)
    }

    async fn send_refs(
        &self,
        queue: &Queue,
        entries: &[&Entry],
    ) -> Result<Vec<RejectedMessage>, BrokerError> {
        let owned: Vec<Entry> = entries.iter().map(|e| (*e).clone()).collect();
        self.send_chunk(queue, &owned).await
    }

    /// One `SendMessageBatch`, with the entries SQS failed on its side sent again (up to 3
    /// times); the entries it refused are returned.
    async fn send_chunk(
        &self,
        queue: &Queue,
        chunk: &[Entry],
    ) -> Result<Vec<RejectedMessage>, BrokerError> {
        let mut pending: Vec<usize> = (0..chunk.len()).collect();
        let mut rejected = Vec::new();
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=3 {
            let mut call = self.clients.call.send_message_batch().queue_url(&queue.url);
            for i in &pending {
                let e = &chunk[*i];
                let mut b = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(e.body.as_str());
                if e.delay_secs > 0 {
                    b = b.delay_seconds(e.delay_secs as i32);
                }
                for (k, v) in &e.attributes {
                    b = b.message_attributes(k, v.clone());
                }
                if let Some(g) = &e.group_id {
                    b = b.message_group_id(g);
                }
                if let Some(d) = &e.dedup_id {
                    b = b.message_deduplication_id(d);
                }
                call = call.entries(b.build().expect("id and body are set"));
            }
            let out = match call.send().await {
                Ok(out) => out,
                // Over the batch byte limit (older queues take less than we assume): halves.
                Err(e)
                    if crate::error::code_of(&e) == Some("BatchRequestTooLong")
                        && pending.len() > 1 =>
                {
                    let entries: Vec<&Entry> = pending.iter().map(|i| &chunk[*i]).collect();
                    let (a, b) = entries.split_at(entries.len() / 2);
                    let mut refused = Box::pin(self.send_refs(queue, a)).await?;
                    refused.extend(Box::pin(self.send_refs(queue, b)).await?);
                    rejected.extend(refused);
                    return Ok(rejected);
                }
                Err(e) => return Err(broker_error(&e)),
            };
            let mut again = Vec::new();
            for f in out.failed() {
                let Some(i) = f.id().parse::<usize>().ok().filter(|i| *i < chunk.len()) else {
                    continue;
                };
                if is_retryable_entry(f.sender_fault(), f.code()) && attempt < 3 {
                    again.push(i);
                } else {
                    rejected.push(RejectedMessage::new(
                        chunk[i].task_id.clone(),
                        format!("{}: {}", f.code(), f.message().unwrap_or("refused")),
                    ));
                }
            }
            if again.is_empty() {
                break;
            }
            pending = again;
            tokio::time::sleep(pause).await;
            pause *= 4;
        }
        Ok(rejected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(fifo: bool) -> Queue {
        Queue {
            name: "q".into(),
            url: "http://q".into(),
            fifo,
            max_message_bytes: 262_144,
            retention: Duration::from_secs(4 * 86_400),
            dead_letter: None,
        }
    }

    fn message(delay: Duration) -> OutgoingMessage {
        let mut msg = ferriq::wire::TaskMessage::new("t");
        msg.labels
            .insert("due_at", 1_000_000.0 + delay.as_secs_f64());
        OutgoingMessage::from_message_at(&msg, 1_000_000.0).unwrap()
    }

    #[test]
    fn delays_go_as_delay_seconds_and_longer_ones_carry_their_due_time() {
        let e = entry(&queue(false), message(Duration::from_millis(7_600)), 5).unwrap();
        assert_eq!(e.delay_secs, 7, "rounded down: the worker holds the rest");
        assert!(e.attributes.iter().all(|(k, _)| k != NOT_BEFORE_ATTRIBUTE));

        let e = entry(&queue(false), message(Duration::from_secs(3600)), 5).unwrap();
        assert_eq!(e.delay_secs, MAX_DELAY_SECS);
        let (_, not_before) = e
            .attributes
            .iter()
            .find(|(k, _)| k == NOT_BEFORE_ATTRIBUTE)
            .unwrap();
        assert_eq!(not_before.string_value(), Some("3600005"));

        let e = entry(&queue(true), message(Duration::from_secs(60)), 5).unwrap();
        assert_eq!(e.delay_secs, 0, "FIFO queues take no per-message delay");
        assert_eq!(e.group_id.as_deref(), Some("t"));
        assert!(e.dedup_id.is_some());
    }
}
