//! Dead-letter queues for operators: `{lane}.dead_letter` read with `basic.get` on a channel
//! of its own, so what is looked at stays unacked — held from everyone else — until it is
//! returned (`nack` with requeue, in the order it was taken: a quorum queue hands returned
//! messages out first, so the queue's order is kept), redriven or dropped. A session that dies
//! closes that channel, and RabbitMQ returns everything it held.

use async_trait::async_trait;
use ferriq::broker::{BrokerError, DeliveryHandle};
use ferriq::dead_letters::{DeadLetterQueue, DeadMessage};
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Acker, Channel};
use tokio::time::Instant;

use crate::headers::{header_int, header_str, long, DEAD_AT_HEADER, DEAD_LETTER_ID_HEADER};
use crate::publish::{persistent, Publication};
use crate::{AmqpBroker, AmqpBrokerBuilder};

/// Headers a dead letter carries that its redriven copy must not.
const PARKING_HEADERS: [&str; 15] = [
    "x-ferriq-reason",
    "x-ferriq-detail",
    "x-ferriq-task-name",
    "x-ferriq-attempts",
    DEAD_LETTER_ID_HEADER,
    DEAD_AT_HEADER,
    crate::headers::RECEIVES_HEADER,
    crate::headers::NOT_BEFORE_HEADER,
    "x-death",
    "x-delivery-count",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
];

/// A dead letter held on the operator channel.
struct HeldDead {
    generation: u64,
    acker: Acker,
    lane: String,
    headers: FieldTable,
}

/// The first `x-death` entry's field `name`: RabbitMQ's record of a message it dead-lettered
/// itself (a quorum queue's delivery limit), when ferriq's headers are missing.
fn first_death(headers: &FieldTable, name: &str) -> Option<AMQPValue> {
    let AMQPValue::FieldArray(deaths) = headers.inner().get("x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else {
        return None;
    };
    first.inner().get(name).cloned()
}

impl AmqpBroker {
    /// The operator channel of the live session, opened on first use.
    async fn dead_channel(&self) -> Result<(u64, Channel), BrokerError> {
        let session = self
            .live_session(Instant::now() + std::time::Duration::from_secs(5))
            .await?;
        let mut slot = self.shared.dead_channel.lock().await;
        if let Some((generation, channel)) = slot.as_ref() {
            if *generation == session.generation && channel.status().connected() {
                return Ok((*generation, channel.clone()));
            }
        }
        let channel = session
            .connection
            .create_channel()
            .await
            .map_err(|e| BrokerError::Unavailable(e.to_string()))?;
        *slot = Some((session.generation, channel.clone()));
        Ok((session.generation, channel))
    }

    fn held_dead<'a>(&self, held: &'a DeadMessage) -> Result<&'a HeldDead, BrokerError> {
        held.handle
            .downcast_ref::<HeldDead>()
            .ok_or(BrokerError::ForeignHandle)
    }

    fn to_dead_message(&self, lane: &str, delivery: lapin::message::Delivery) -> DeadMessage {
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        let reason = header_str(&headers, "x-ferriq-reason").or_else(|| {
            // Parked by RabbitMQ itself (the lane's delivery limit): a backstop.
            first_death(&headers, "reason").map(|_| {
                ferriq::broker::DeadLetterReason::RedriveLimit
                    .as_str()
                    .to_owned()
            })
        });
        let dead_at_ms = header_int(&headers, DEAD_AT_HEADER)
            .map(|ms| ms.max(0) as u64)
            .or_else(|| match first_death(&headers, "time")? {
                AMQPValue::Timestamp(secs) => Some(secs.saturating_mul(1000)),
                _ => None,
            });
        let id = header_str(&headers, DEAD_LETTER_ID_HEADER).unwrap_or_else(|| {
            // Parked by someone else: an id from what does not change while it stays parked.
            let mut key = delivery.data.clone();
            key.extend_from_slice(&dead_at_ms.unwrap_or(0).to_be_bytes());
            uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, &key)
                .simple()
                .to_string()
        });
        let attempts = header_int(&headers, "x-ferriq-attempts")
            .or_else(|| match first_death(&headers, "count")? {
                AMQPValue::LongLongInt(n) => Some(n),
                _ => None,
            })
            .unwrap_or(0)
            .clamp(0, i64::from(u32::MAX)) as u32;
        let detail = header_str(&headers, "x-ferriq-detail").unwrap_or_default();
        let task_name = header_str(&headers, "x-ferriq-task-name");
        let held = HeldDead {
            generation: self.shared.current_generation(),
            acker: delivery.acker.clone(),
            lane: lane.to_owned(),
            headers,
        };
        DeadMessage::new(
            id,
            lane,
            reason,
            detail,
            task_name,
            attempts,
            dead_at_ms,
            delivery.data,
            DeliveryHandle::new(held),
        )
    }

    /// Acks or requeues a held dead letter. `Ok(false)`: its channel is gone, so RabbitMQ has
    /// put it back already.
    async fn settle_dead(
        &self,
        held: &HeldDead,
        requeue: Option<bool>,
    ) -> Result<bool, BrokerError> {
        if held.generation != self.shared.current_generation() || !held.acker.usable() {
            return Ok(false);
        }
        crate::acks::settle(&held.acker, requeue)
            .await
            .map_err(BrokerError::Unavailable)
    }
}

#[async_trait]
impl DeadLetterQueue for AmqpBroker {
    async fn take_dead(&self, lane: &str, max: usize) -> Result<Vec<DeadMessage>, BrokerError> {
        let queue = AmqpBrokerBuilder::dead_letter_queue(lane);
        let (_, channel) = self.dead_channel().await?;
        let mut out = Vec::new();
        while out.len() < max {
            let got = channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                .await
                .map_err(|e| {
                    BrokerError::Config(format!(
                        "cannot read the dead-letter queue {queue}: {e} (is {lane} one of \
                         the broker's lanes?)"
                    ))
                })?;
            match got {
                Some(m) => out.push(self.to_dead_message(lane, m.delivery)),
                None => break,
            }
        }
        Ok(out)
    }

    async fn return_dead(&self, held: Vec<DeadMessage>) -> Result<(), BrokerError> {
        // In the order taken: a quorum queue hands returned messages out first, in the order
        // it applies the returns. But RabbitMQ 3.x applies a pile of returns (more than ~32
        // unapplied at once) out of order, so they go back a few at a time, each few waited
        // for (the queue's ready count rises by as many) before the next is sent.
        let Some(first) = held.first() else {
            return Ok(());
        };
        let queue = AmqpBrokerBuilder::dead_letter_queue(&self.held_dead(first)?.lane);
        let mut ready = self.ready_count(&queue).await?.unwrap_or(0);
        // Someone else taking from the queue meanwhile keeps the count down: after one wait
        // that runs out, the rest go back without waiting (order best effort, nothing lost).
        let mut waiting = held.len() > RETURN_CHUNK;
        for chunk in held.chunks(RETURN_CHUNK) {
            let mut returned = 0;
            for m in chunk {
                if self.settle_dead(self.held_dead(m)?, Some(true)).await? {
                    returned += 1;
                }
            }
            ready += returned;
            if waiting {
                waiting = self.wait_ready(&queue, ready).await;
            }
        }
        Ok(())
    }

    async fn redrive_dead(&self, held: &DeadMessage, body: Vec<u8>) -> Result<(), BrokerError> {
        let dead = self.held_dead(held)?;
        let mut headers = FieldTable::default();
        for (k, v) in dead.headers.inner() {
            if !PARKING_HEADERS.contains(&k.as_str()) && k.as_str() != "x-last-death-reason" {
                headers.insert(k.clone(), v.clone());
            }
        }
        if let Some(id) = &held.task_id {
            // A copy another system parked may lack it; workers read it before the body.
            headers.insert("task_id".into(), long(id.as_str()));
        }
        let mut properties = persistent(headers);
        if let Some(id) = &held.task_id {
            properties = properties.with_message_id(id.as_str().into());
        }
        let copy = Publication {
            exchange: self.shared.config.exchange.clone(),
            routing_key: dead.lane.clone(),
            body: body.into(),
            properties,
        };
        // Confirmed in the lane first; only then is the dead letter removed. A session that
        // dies in between leaves both: a duplicate the claims absorb.
        self.publish_all(std::slice::from_ref(&copy)).await?;
        if self.settle_dead(dead, None).await? {
            Ok(())
        } else {
            Err(BrokerError::DeliveryLost)
        }
    }

    async fn drop_dead(&self, held: &DeadMessage) -> Result<(), BrokerError> {
        if self.settle_dead(self.held_dead(held)?, None).await? {
            Ok(())
        } else {
            Err(BrokerError::DeliveryLost)
        }
    }

    async fn dead_count(&self, lane: &str) -> Result<u64, BrokerError> {
        let queue = AmqpBrokerBuilder::dead_letter_queue(lane);
        self.ready_count(&queue).await?.ok_or_else(|| {
            BrokerError::Config(format!(
                "no dead-letter queue {queue} (is {lane} one of the broker's lanes?)"
            ))
        })
    }
}

/// How many dead letters go back before their returns are waited for (see `return_dead`).
const RETURN_CHUNK: usize = 16;

impl AmqpBroker {
    /// Waits (up to a second) until `queue` holds at least `ready` ready messages: returns
    /// sent have been applied. `false` when the deadline passed first.
    async fn wait_ready(&self, queue: &str, ready: u64) -> bool {
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        loop {
            match self.ready_count(queue).await {
                Ok(Some(n)) if n >= ready => return true,
                Ok(_) if Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                _ => {
                    tracing::debug!(queue, "returned dead letters not all seen in time");
                    return false;
                }
            }
        }
    }

    /// Ready messages in `queue` (`None`: no such queue), read on a scratch channel, because a
    /// passive declare of a missing queue closes its channel.
    pub(crate) async fn ready_count(&self, queue: &str) -> Result<Option<u64>, BrokerError> {
        Ok(self.declare_passive(queue).await?.map(|(ready, _)| ready))
    }

    /// Ready messages and consumers of `queue` (`None`: no such queue).
    pub(crate) async fn declare_passive(
        &self,
        queue: &str,
    ) -> Result<Option<(u64, u64)>, BrokerError> {
        let session = self
            .live_session(Instant::now() + std::time::Duration::from_secs(5))
            .await?;
        let channel = session
            .connection
            .create_channel()
            .await
            .map_err(|e| BrokerError::Unavailable(e.to_string()))?;
        let declared = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await;
        let _ = channel.close(200, "passive declare".into()).await;
        match declared {
            Ok(q) => Ok(Some((
                u64::from(q.message_count()),
                u64::from(q.consumer_count()),
            ))),
            // A soft error on a passive declare is RabbitMQ's "no such queue" (404).
            Err(e) if e.is_amqp_soft_error() => Ok(None),
            Err(e) => Err(BrokerError::Unavailable(e.to_string())),
        }
    }
}
