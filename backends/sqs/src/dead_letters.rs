//! Dead-letter queues for operators: a lane's dead-letter queue received with a visibility of
//! [`HOLD`], so what is looked at is hidden from everyone else while the operation runs; it is
//! returned by making it visible again, redriven by a send to the lane followed by a delete,
//! or dropped by a delete. A session that dies leaves what it held hidden for at most
//! [`HOLD`]. SQS keeps no order on a standard queue: listings come in the order received.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName,
};
use ferriq::broker::{BrokerError, DeadLetterReason, DeliveryHandle};
use ferriq::dead_letters::{DeadLetterQueue, DeadMessage};

use crate::broker::SqsBroker;
use crate::error::broker_error;
use crate::queue::Queue;
use crate::send::Entry;

/// How long a taken dead letter stays hidden: long enough for an operation's batch, short
/// enough that a session killed midway leaves little hidden for long.
pub(crate) const HOLD: Duration = Duration::from_secs(30);

/// Attributes a dead letter carries that its redriven copy must not.
const PARKING_ATTRIBUTES: [&str; 8] = [
    "ferriq_reason",
    "ferriq_detail",
    "ferriq_task_name",
    "ferriq_attempts",
    "ferriq_source_queue",
    "ferriq_receive_count",
    crate::receive::NOT_BEFORE_ATTRIBUTE,
    crate::receive::EARLIER_RECEIVES_ATTRIBUTE,
];

/// A dead letter held by its visibility.
struct HeldDead {
    broker: u64,
    dead_queue: Arc<Queue>,
    receipt: String,
    attributes: HashMap<String, MessageAttributeValue>,
    group_id: Option<String>,
}

impl SqsBroker {
    /// The dead-letter queue of lane `lane`.
    fn dead_queue(&self, lane: &str) -> Result<Arc<Queue>, BrokerError> {
        let queue = self
            .shared
            .lanes
            .iter()
            .find(|q| &*q.name == lane)
            .ok_or_else(|| {
                BrokerError::Config(format!(
                    "{lane} is not one of this broker's queues ({}): connect with it as a lane",
                    self.queue_names().join(", ")
                ))
            })?;
        queue.dead_letter.clone().ok_or_else(|| {
            BrokerError::Config(format!(
                "queue {lane} has no dead-letter queue (set `dlq=` in the URL or a RedrivePolicy)"
            ))
        })
    }

    fn held_dead<'a>(&self, held: &'a DeadMessage) -> Result<&'a HeldDead, BrokerError> {
        match held.handle.downcast_ref::<HeldDead>() {
            Some(h) if h.broker == self.shared.id => Ok(h),
            _ => Err(BrokerError::ForeignHandle),
        }
    }

    async fn delete_dead(&self, held: &HeldDead) -> Result<(), BrokerError> {
        self.shared
            .clients
            .call
            .delete_message()
            .queue_url(&held.dead_queue.url)
            .receipt_handle(&held.receipt)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| broker_error(&e))
    }
}

fn to_dead_message(
    broker: u64,
    lane: &str,
    dead_queue: &Arc<Queue>,
    m: aws_sdk_sqs::types::Message,
) -> Option<DeadMessage> {
    let receipt = m.receipt_handle?;
    let system = m.attributes.unwrap_or_default();
    let attributes = m.message_attributes.unwrap_or_default();
    let text = |name: &str| {
        attributes
            .get(name)
            .and_then(|v| v.string_value())
            .map(str::to_owned)
    };
    let reason = text("ferriq_reason").or_else(|| {
        // Moved by SQS itself (the lane's maxReceiveCount): a backstop.
        Some(DeadLetterReason::RedriveLimit.as_str().to_owned())
    });
    let attempts = text("ferriq_attempts")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // For ferriq's copies the send is the parking; for a message SQS moved, SQS keeps the
    // original send time.
    let dead_at_ms = system
        .get(&MessageSystemAttributeName::SentTimestamp)
        .and_then(|t| t.parse().ok());
    let group_id = system
        .get(&MessageSystemAttributeName::MessageGroupId)
        .cloned();
    let source = text("ferriq_source_queue").unwrap_or_else(|| lane.to_owned());
    let held = HeldDead {
        broker,
        dead_queue: Arc::clone(dead_queue),
        receipt,
        group_id,
        attributes: attributes.clone(),
    };
    Some(DeadMessage::new(
        m.message_id.unwrap_or_default(),
        source,
        reason,
        text("ferriq_detail").unwrap_or_default(),
        text("ferriq_task_name"),
        attempts,
        dead_at_ms,
        m.body.unwrap_or_default().into_bytes(),
        DeliveryHandle::new(held),
    ))
}

#[async_trait]
impl DeadLetterQueue for SqsBroker {
    async fn take_dead(&self, lane: &str, max: usize) -> Result<Vec<DeadMessage>, BrokerError> {
        let dead_queue = self.dead_queue(lane)?;
        let mut out = Vec::new();
        while out.len() < max {
            // A second of long polling: short polls sample some of SQS's servers and may
            // answer empty while messages remain.
            let got = self
                .shared
                .clients
                .call
                .receive_message()
                .queue_url(&dead_queue.url)
                .max_number_of_messages((max - out.len()).min(10) as i32)
                .wait_time_seconds(1)
                .visibility_timeout(HOLD.as_secs() as i32)
                .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
                .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| broker_error(&e))?;
            let messages = got.messages.unwrap_or_default();
            if messages.is_empty() {
                break;
            }
            out.extend(
                messages
                    .into_iter()
                    .filter_map(|m| to_dead_message(self.shared.id, lane, &dead_queue, m)),
            );
        }
        Ok(out)
    }

    async fn return_dead(&self, held: Vec<DeadMessage>) -> Result<(), BrokerError> {
        let mut by_queue: HashMap<String, Vec<&HeldDead>> = HashMap::new();
        for m in &held {
            let h = self.held_dead(m)?;
            by_queue
                .entry(h.dead_queue.url.clone())
                .or_default()
                .push(h);
        }
        for (url, all) in by_queue {
            for chunk in all.chunks(10) {
                let mut call = self
                    .shared
                    .clients
                    .call
                    .change_message_visibility_batch()
                    .queue_url(&url);
                for (i, h) in chunk.iter().enumerate() {
                    call = call.entries(
                        ChangeMessageVisibilityBatchRequestEntry::builder()
                            .id(i.to_string())
                            .receipt_handle(&h.receipt)
                            .visibility_timeout(0)
                            .build()
                            .expect("id and handle are set"),
                    );
                }
                // One that fails stays hidden until its hold ends: late, never lost.
                call.send().await.map_err(|e| broker_error(&e))?;
            }
        }
        Ok(())
    }

    async fn redrive_dead(&self, held: &DeadMessage, body: Vec<u8>) -> Result<(), BrokerError> {
        let dead = self.held_dead(held)?;
        let lane = self.dead_lane(&held.lane).await?;
        let body = String::from_utf8(body).map_err(|_| {
            BrokerError::Rejected("an SQS message body must be UTF-8 text".to_owned())
        })?;
        let attributes = dead
            .attributes
            .iter()
            .filter(|(k, _)| !PARKING_ATTRIBUTES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let copy = Entry {
            task_id: held
                .task_id
                .clone()
                .unwrap_or_else(ferriq::wire::TaskId::random),
            body,
            attributes,
            delay_secs: 0,
            group_id: lane
                .fifo
                .then(|| dead.group_id.clone().unwrap_or_else(|| "ferriq".to_owned())),
            // A FIFO lane drops a second copy of the same dead letter sent within 5 minutes.
            dedup_id: lane.fifo.then(|| held.id.clone()),
        };
        // Sent (SQS answers once it is stored) before the dead letter is deleted: a session
        // that dies in between leaves both, a duplicate the claims absorb.
        let refused = self.shared.send_entries(&lane, vec![copy]).await?;
        if let Some(r) = refused.into_iter().next() {
            return Err(BrokerError::Rejected(format!(
                "queue {} refused the redriven copy: {}",
                lane.name, r.reason
            )));
        }
        self.delete_dead(dead).await
    }

    async fn drop_dead(&self, held: &DeadMessage) -> Result<(), BrokerError> {
        self.delete_dead(self.held_dead(held)?).await
    }

    async fn dead_count(&self, lane: &str) -> Result<u64, BrokerError> {
        let dead_queue = self.dead_queue(lane)?;
        let out = self
            .shared
            .clients
            .call
            .get_queue_attributes()
            .queue_url(&dead_queue.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| broker_error(&e))?;
        let attributes = out.attributes().cloned().unwrap_or_default();
        // Hidden ones are held by an operator's session: still parked.
        Ok([
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        ]
        .iter()
        .filter_map(|name| attributes.get(name)?.parse::<u64>().ok())
        .sum())
    }
}

impl SqsBroker {
    /// The lane a dead letter goes back to.
    async fn dead_lane(&self, name: &str) -> Result<Arc<Queue>, BrokerError> {
        match self.shared.lanes.iter().find(|q| &*q.name == name) {
            Some(q) => Ok(Arc::clone(q)),
            None => self.shared.queue_for(Some(name)).await,
        }
    }
}
