//! [`AmqpBroker`]: ferriq's `Broker` over RabbitMQ — publishing, receiving from the lanes, and
//! settling a delivery (ack, release after a delay, dead letter, lease extension).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferriq::broker::{
    Broker, BrokerError, ConsumerSettings, DeadLetter, Delivery, DeliveryHandle, Health,
    LeaseStatus, OutgoingMessage, QueueDepth,
};
use lapin::types::AMQPValue;
use tokio::time::Instant;

use crate::consume::Lanes;
use crate::headers::{long, unix_ms_now, NOT_BEFORE_HEADER};
use crate::publish::{persistent, Publication};
use crate::session::{Session, Shared};
use crate::{AmqpBrokerBuilder, AmqpError};

/// A RabbitMQ broker for ferriq workers and clients. Cheap to clone; the connection closes when
/// the last clone is dropped (or on [`AmqpBroker::close`]).
#[derive(Clone)]
pub struct AmqpBroker {
    pub(crate) shared: Arc<Shared>,
    /// The consumers one `receive` at a time polls.
    lanes: Arc<tokio::sync::Mutex<Lanes>>,
    _owner: Arc<Owner>,
}

/// Stops the supervisor when the last broker handle goes.
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.stop.cancel();
    }
}

impl AmqpBroker {
    /// A builder for the broker at `url`.
    pub fn builder(url: impl Into<ferriq::SecretUrl>) -> AmqpBrokerBuilder {
        AmqpBrokerBuilder::new(url)
    }

    pub(crate) async fn connect(config: AmqpBrokerBuilder) -> Result<Self, AmqpError> {
        let url = config.url.redacted();
        let secret = config.url.clone();
        let shared = Arc::new(Shared::new(config));
        let first = shared.connect_any().await.map_err(|e| {
            let (url, reason) = (url.clone(), secret.explain(&e));
            if e.missing {
                AmqpError::NotDeclared { url, reason }
            } else {
                AmqpError::Connect { url, reason }
            }
        })?;
        tracing::info!(node = %shared.current_node(), "connected to RabbitMQ");
        tokio::spawn(Arc::clone(&shared).supervise(first));
        // The supervisor publishes the session; wait for it so the first call has one.
        let mut sessions = shared.session.subscribe();
        let _ = sessions.wait_for(Option::is_some).await;
        Ok(AmqpBroker {
            lanes: Arc::default(),
            _owner: Arc::new(Owner(Arc::clone(&shared))),
            shared,
        })
    }

    /// Closes the connection now. Unacked deliveries go back to their queues.
    pub async fn close(&self) {
        self.shared.stop.cancel();
        let mut sessions = self.shared.session.subscribe();
        let _ =
            tokio::time::timeout(Duration::from_secs(5), sessions.wait_for(Option::is_none)).await;
    }

    /// The configuration.
    pub fn config(&self) -> &AmqpBrokerBuilder {
        &self.shared.config
    }

    /// The live session, waiting for a reconnect up to `deadline`.
    pub(crate) async fn live_session(
        &self,
        deadline: Instant,
    ) -> Result<Arc<Session>, BrokerError> {
        let mut sessions = self.shared.session.subscribe();
        let live = tokio::time::timeout_at(deadline, async {
            let session = sessions
                .wait_for(|s| s.as_ref().is_some_and(|s| !s.dead.is_cancelled()))
                .await
                .ok()?;
            session.as_ref().map(Arc::clone)
        })
        .await;
        match live {
            Ok(Some(session)) => Ok(session),
            _ => Err(BrokerError::Unavailable(format!(
                "no RabbitMQ connection: {}",
                self.shared
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
            ))),
        }
    }
}

#[async_trait]
impl Broker for AmqpBroker {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        if batch.is_empty() {
            return Ok(());
        }
        let publications = batch
            .into_iter()
            .map(|m| self.route(m))
            .collect::<Result<Vec<_>, _>>()?;
        self.check_routable(&publications).await?;
        self.publish_all(&publications).await
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        if !self.shared.consume.swap(true, Ordering::SeqCst) {
            self.shared.start_consuming.notify_one();
        }
        let mut lanes = self.lanes.lock().await;
        let mut out = Vec::new();
        let waiting = async {
            loop {
                lanes.adopt(&*self.shared);
                tokio::select! {
                    incoming = lanes.next(&*self.shared) => return incoming,
                    // A reconnect started new consumers: poll those instead.
                    _ = self.shared.consumers_started.notified() => {}
                }
            }
        };
        let Ok(first) = tokio::time::timeout(wait, waiting).await else {
            return Ok(out);
        };
        let mut next = Some(first);
        while let Some(incoming) = next.take() {
            // Deliveries of a dead or closed channel are the broker's again; their copies come
            // anew.
            if incoming.generation == self.shared.current_generation()
                && incoming.delivery.acker.usable()
            {
                out.push(self.to_delivery(incoming));
            }
            if out.len() < max.max(1) {
                next = lanes.try_next(&*self.shared);
            }
        }
        Ok(out)
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let held = self.held(delivery)?;
        self.ack_held(held).await
    }

    async fn release(&self, delivery: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        let held = self.held(delivery)?;
        if !self.is_current(held) {
            return Err(BrokerError::DeliveryLost);
        }
        if after.is_zero() {
            if held.settled.swap(true, Ordering::SeqCst) {
                return Err(BrokerError::DeliveryLost);
            }
            return match crate::acks::settle(&held.acker, Some(true)).await {
                Ok(true) => {
                    // The nack is queued: later `multiple` acks may pass this tag.
                    held.acks.settled_elsewhere(held.delivery_tag);
                    Ok(())
                }
                Ok(false) => Err(BrokerError::DeliveryLost),
                Err(e) => Err(BrokerError::Unavailable(e)),
            };
        }
        // Copy first, original acked only once the copy is confirmed: a failure in between
        // leaves two copies (the claims absorb that), never none.
        let mut headers = Self::copy_headers(held);
        let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX / 2);
        headers.insert(
            NOT_BEFORE_HEADER.into(),
            AMQPValue::LongLongInt(unix_ms_now().saturating_add(after_ms)),
        );
        let copy = self.delayed(
            held.queue.to_string(),
            after,
            held.body.clone(),
            persistent(headers),
        );
        self.publish_copy_then_ack(held, copy, after).await
    }

    async fn extend(
        &self,
        deliveries: &[DeliveryHandle],
        _lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        // RabbitMQ holds a delivery for as long as its channel lives (up to consumer_timeout):
        // there is no lease to extend, only whether the channel is still the live one.
        deliveries
            .iter()
            .map(|d| {
                let held = self.held(d)?;
                Ok(if self.is_current(held) {
                    LeaseStatus::Kept
                } else {
                    LeaseStatus::Lost
                })
            })
            .collect()
    }

    async fn dead_letter(&self, delivery: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        let held = self.held(&delivery.handle)?;
        if !self.is_current(held) {
            return Err(BrokerError::DeliveryLost);
        }
        let mut headers = Self::copy_headers(held);
        headers.insert("x-ferriq-reason".into(), long(why.reason.as_str()));
        let detail: String = why.detail.chars().take(2000).collect();
        headers.insert("x-ferriq-detail".into(), long(&detail));
        if let Some(name) = &why.task_name {
            headers.insert("x-ferriq-task-name".into(), long(name));
        }
        headers.insert(
            "x-ferriq-attempts".into(),
            AMQPValue::LongLongInt(i64::from(why.attempts)),
        );
        headers.insert(
            crate::headers::DEAD_LETTER_ID_HEADER.into(),
            long(&uuid::Uuid::new_v4().simple().to_string()),
        );
        headers.insert(
            crate::headers::DEAD_AT_HEADER.into(),
            AMQPValue::LongLongInt(unix_ms_now()),
        );
        let copy = Publication {
            exchange: String::new(),
            routing_key: AmqpBrokerBuilder::dead_letter_queue(&held.queue),
            body: delivery.body.clone(),
            properties: persistent(headers),
        };
        self.publish_copy_then_ack(held, copy, Duration::from_secs(5))
            .await
    }

    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        let (mut ready, mut delayed) = (0, 0);
        for (_, depth) in self.queue_depths().await? {
            ready += depth.ready;
            delayed += depth.delayed;
        }
        Ok(QueueDepth::new(ready, 0, delayed))
    }

    async fn close(&self) {
        AmqpBroker::close(self).await
    }

    async fn delete_lane(&self, lane: &str, force: bool) -> Result<u64, BrokerError> {
        self.delete_lane_queues(lane, force).await
    }

    async fn consumer_count(&self, queue: Option<&str>) -> Option<(String, u64)> {
        let lane = queue.unwrap_or(&self.shared.config.queues[0]).to_owned();
        let declared = self.declare_passive(&lane).await.ok()?;
        // A queue that does not exist has no consumer either.
        Some((lane, declared.map_or(0, |(_, consumers)| consumers)))
    }

    async fn queue_depths(&self) -> Result<Vec<(String, QueueDepth)>, BrokerError> {
        let config = &self.shared.config;
        let mut out = Vec::new();
        for queue in &config.queues {
            let ready = self.ready_count(queue).await?.unwrap_or(0);
            let mut delayed = 0;
            for tier in &config.delay_tiers {
                delayed += self
                    .ready_count(&AmqpBrokerBuilder::delay_queue(queue, *tier))
                    .await?
                    .unwrap_or(0);
            }
            // A passive declare counts ready messages only: RabbitMQ does not say how many
            // are delivered and unacked.
            out.push((queue.clone(), QueueDepth::new(ready, 0, delayed)));
        }
        Ok(out)
    }

    fn dead_letters(&self) -> Option<&dyn ferriq::dead_letters::DeadLetterQueue> {
        Some(self)
    }

    fn lanes(&self) -> Vec<String> {
        self.shared.config.queues.clone()
    }

    fn prepare_consumer(&self, consumer: &ConsumerSettings) {
        let n = u16::try_from(consumer.concurrency)
            .unwrap_or(u16::MAX)
            .max(1);
        match self.shared.config.prefetch {
            None => self.shared.prefetch.store(n, Ordering::SeqCst),
            Some(set) if set != n => tracing::warn!(
                prefetch = set,
                concurrency = n,
                "the prefetch set on the broker differs from the worker's concurrency: \
                 deliveries beyond the concurrency wait unheartbeated (leave prefetch unset to \
                 derive it)"
            ),
            Some(_) => {}
        }
    }

    async fn stop_receiving(&self) {
        // Called once the worker's runs are settled: closing the consumer channels puts what
        // was buffered for it back in the queue. (Cancelling a quorum consumer earlier would
        // also hand away the deliveries of runs still finishing.)
        self.shared.consume.store(false, Ordering::SeqCst);
        self.shared.close_consumers().await;
        // Their channels are closed: what they still hold is the queue's again.
        self.lanes.lock().await.clear();
    }

    async fn health(&self) -> Health {
        let session = self.shared.session.borrow().clone();
        match session {
            Some(s) if s.connected() => Health::Healthy,
            _ => Health::Unhealthy(format!(
                "not connected to RabbitMQ: {}",
                self.shared
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
            )),
        }
    }
}

impl std::fmt::Debug for AmqpBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpBroker")
            .field("url", &self.shared.config.url)
            .field("exchange", &self.shared.config.exchange)
            .field("queues", &self.shared.config.queues)
            .finish_non_exhaustive()
    }
}
