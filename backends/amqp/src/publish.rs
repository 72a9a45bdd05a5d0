//! Publishing: routing a message to its lane or delay tier, and waiting for every confirm.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use ferriq::broker::{BrokerError, Bytes, OutgoingMessage, HOLD_WINDOW};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};
use tokio::time::Instant;

use crate::headers::{long, unix_ms_now, NOT_BEFORE_HEADER};
use crate::session::Session;
use crate::{AmqpBroker, AmqpBrokerBuilder};

/// One message to publish, routed.
pub(crate) struct Publication {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    /// Shared with the delivery it copies, when it is one (a release, a dead letter).
    pub(crate) body: Bytes,
    pub(crate) properties: BasicProperties,
}

enum PublishFailure {
    /// The broker refused it: retrying will not help.
    Rejected(String),
    /// The connection or channel failed: publish again on the next session.
    Connection(String),
}

pub(crate) fn persistent(headers: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_headers(headers)
}

impl AmqpBroker {
    pub(crate) fn route(&self, msg: OutgoingMessage) -> Result<Publication, BrokerError> {
        let config = &self.shared.config;
        let lane = msg
            .queue
            .clone()
            .unwrap_or_else(|| config.queues[0].clone());
        if lane.is_empty() || lane.len() > 200 {
            return Err(BrokerError::Rejected(format!(
                "queue name of {} bytes: RabbitMQ routing keys are 1-255 bytes",
                lane.len()
            )));
        }
        let mut headers = FieldTable::default();
        for (k, v) in msg.headers() {
            // A header name must fit an AMQP short string; a label that does not is kept in
            // the body (taskiq reads labels from there) and left out of the headers.
            if let Ok(name) = ShortString::try_new(k) {
                headers.insert(name, long(&v));
            }
        }
        // A delay below the worker's hold window goes straight to the lane, not to a tier
        // with its own expiration: RabbitMQ expires a message only at the head of its queue,
        // so it would wait behind the tier's earlier messages, up to a whole tier late. The
        // worker holds it until due (the body's `due_at`, or this header).
        let delay = msg.delay.filter(|d| !d.is_zero());
        let held_by_worker = delay.filter(|d| *d < HOLD_WINDOW);
        if let Some(d) = held_by_worker {
            headers.insert(
                NOT_BEFORE_HEADER.into(),
                AMQPValue::LongLongInt(unix_ms_now().saturating_add(d.as_millis() as i64)),
            );
        }
        let mut properties = persistent(headers).with_message_id(msg.task_id.as_str().into());
        if let Some(p) = msg.priority {
            properties = properties.with_priority(p);
        }
        Ok(match delay {
            Some(delay) if held_by_worker.is_none() => {
                self.delayed(lane, delay, msg.body.into(), properties)
            }
            _ => Publication {
                exchange: if config.publish_to_lanes_directly {
                    String::new()
                } else {
                    config.exchange.clone()
                },
                routing_key: lane,
                body: msg.body.into(),
                properties,
            },
        })
    }

    /// A publication that waits in one of the lane's delay tiers, then dead-letters back to
    /// the lane: the largest tier not longer than `delay`, so a message never waits behind
    /// one due later (a tier's messages all have its TTL, so they expire in the order they
    /// arrived). It comes back to the lane before it is due when `delay` is not a tier's
    /// length; the worker then releases it again for what is left (the message carries its
    /// due time), and holds it for the last second. A delay under the worker's hold window
    /// goes straight to the lane (the caller's properties carry `x-ferriq-not-before`, and
    /// the worker holds it): in a tier with an expiration of its own it would wait for the
    /// messages ahead of it, RabbitMQ expiring a message only at the head of its queue. A
    /// delay between the hold window and the smallest tier waits in that tier with its own
    /// expiration (tiers of more than a second only).
    pub(crate) fn delayed(
        &self,
        lane: String,
        delay: Duration,
        body: Bytes,
        properties: BasicProperties,
    ) -> Publication {
        if delay < HOLD_WINDOW {
            return Publication {
                exchange: String::new(),
                routing_key: lane,
                body,
                properties,
            };
        }
        let (tier, expiration) = self.shared.config.tier_for(delay);
        let properties = match expiration {
            Some(e) => {
                let ms = e.as_millis().max(1).to_string();
                properties.with_expiration(ms.as_str().into())
            }
            None => properties,
        };
        Publication {
            exchange: String::new(),
            routing_key: AmqpBrokerBuilder::delay_queue(&lane, tier),
            body,
            properties,
        }
    }

    /// Checks that every queue `batch` is routed to exists, once per queue this process did
    /// not declare itself, and refuses the batch before anything is sent when one does not.
    /// RabbitMQ would return such a message as unroutable (the publish fails all the same),
    /// and lapin logs a returned message whole — headers and body, the task's arguments — at
    /// WARN: user data that must not reach the logs. Only a queue deleted after this check
    /// still comes back that way.
    pub(crate) async fn check_routable(&self, batch: &[Publication]) -> Result<(), BrokerError> {
        let unknown: std::collections::BTreeSet<&str> = {
            let known = self
                .shared
                .known_queues
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            batch
                .iter()
                .map(|p| p.routing_key.as_str())
                .filter(|key| !known.contains(*key))
                .collect()
        };
        for queue in unknown {
            if self.declare_passive(queue).await?.is_none() {
                return Err(BrokerError::Rejected(unroutable(queue, "404 NOT_FOUND")));
            }
            self.shared
                .known_queues
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(queue.to_owned());
        }
        Ok(())
    }

    /// Publishes and waits for every confirm, again on a new connection if this one fails,
    /// until the publish timeout.
    pub(crate) async fn publish_all(&self, batch: &[Publication]) -> Result<(), BrokerError> {
        let deadline = Instant::now()
            .checked_add(self.shared.config.publish_timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        loop {
            let session = self.live_session(deadline).await?;
            // Bounded: a blocked connection (a RabbitMQ resource alarm) never confirms.
            let attempt = tokio::time::timeout_at(deadline, publish_on(&session, batch)).await;
            match attempt {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(PublishFailure::Rejected(why))) => return Err(BrokerError::Rejected(why)),
                Ok(Err(PublishFailure::Connection(why))) => {
                    tracing::warn!(error = %why, "publish interrupted; publishing again after reconnecting");
                    session.dead.cancel();
                    if Instant::now() >= deadline {
                        return Err(BrokerError::Unavailable(why));
                    }
                }
                Err(_) => {
                    return Err(BrokerError::Unavailable(format!(
                        "no publisher confirm within {:?} (is RabbitMQ blocking publishers?)",
                        self.shared.config.publish_timeout
                    )))
                }
            }
        }
    }
}

async fn publish_on(session: &Session, batch: &[Publication]) -> Result<(), PublishFailure> {
    // While the connection is up, a failure is this channel's (the broker closed it over this
    // batch: 404, 406…): retrying will not help, and the session stays. Otherwise it is the
    // connection, and the batch goes out again after reconnecting.
    let connection_failed = |e: lapin::Error| {
        if session.connection.status().connected() && !session.dead.is_cancelled() {
            PublishFailure::Rejected(format!("RabbitMQ refused the publish: {e}"))
        } else {
            PublishFailure::Connection(e.to_string())
        }
    };
    let mut publisher = session.checkout().await.map_err(connection_failed)?;
    let channel = publisher.channel.as_ref().expect("checked out");
    // Pipelined: every message is handed to lapin's I/O thread before any is waited for, so a
    // batch is written in a few socket writes instead of one thread hand-off per message.
    let publishes = batch.iter().map(|p| {
        channel.basic_publish(
            p.exchange.as_str().into(),
            p.routing_key.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            &p.body[..],
            p.properties.clone(),
        )
    });
    let mut confirms = Vec::with_capacity(batch.len());
    for sent in join_in_order(publishes).await {
        match sent {
            Ok(c) => confirms.push(c),
            Err(e) => {
                publisher.channel = None;
                return Err(connection_failed(e));
            }
        }
    }
    let mut rejected = None;
    for confirm in confirms {
        match confirm.await {
            Ok(Confirmation::Ack(None)) | Ok(Confirmation::NotRequested) => {}
            Ok(Confirmation::Ack(Some(returned))) => {
                rejected.get_or_insert_with(|| {
                    unroutable(
                        returned.routing_key.as_str(),
                        &format!("{} {}", returned.reply_code, returned.reply_text),
                    )
                });
            }
            Ok(Confirmation::Nack(_)) => {
                rejected.get_or_insert_with(|| {
                    "the broker nacked the message (queue full or failing)".to_owned()
                });
            }
            Err(e) => {
                publisher.channel = None;
                return Err(connection_failed(e));
            }
        }
    }
    publisher.settled = true;
    match rejected {
        None => Ok(()),
        Some(why) => Err(PublishFailure::Rejected(why)),
    }
}

/// Why a message for `routing_key` cannot be routed, and what to do.
fn unroutable(routing_key: &str, answer: &str) -> String {
    format!(
        "unroutable: RabbitMQ has no queue for routing key {routing_key:?} ({answer}). A lane's \
         queue is declared when a worker or client that lists the lane (FERRIQ_QUEUES, \
         AmqpBrokerBuilder::queues) connects: start that lane's worker first, or list the lane \
         in this client's queues too"
    )
}

/// Waits for every future, having polled each once in the order given: a publish takes its
/// place in the channel (its frames, its confirm's sequence number) when first polled, so the
/// batch goes out in order. (`join_all` does not promise an order for large batches.)
async fn join_in_order<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Poll::Ready(out) = future.as_mut().poll(cx) {
                *output = Some(out);
            }
        }
        Poll::Ready(())
    })
    .await;
    // Everything is queued now: the rest may finish in any order.
    let mut rest: FuturesUnordered<_> = pending
        .into_iter()
        .enumerate()
        .filter(|(i, _)| outputs[*i].is_none())
        .map(|(i, future)| async move { (i, future.await) })
        .collect();
    while let Some((i, out)) = rest.next().await {
        outputs[i] = Some(out);
    }
    outputs.into_iter().flatten().collect()
}
