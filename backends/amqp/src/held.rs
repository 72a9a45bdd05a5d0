//! A delivery as the broker holds it until it is settled: its channel's generation, its
//! tag in the channel's ack book, its bytes and properties for a copy (a release, a dead
//! letter).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::{BrokerError, Bytes, Delivery, DeliveryHandle};
use ferriq::wire::TaskId;
use lapin::types::{AMQPValue, FieldTable};
use lapin::Acker;

use crate::acks::AckBook;
use crate::consume::Incoming;
use crate::headers::{header_int, header_text, NOT_BEFORE_HEADER, RECEIVES_HEADER};
use crate::publish::Publication;
use crate::AmqpBroker;

/// What a delivery's handle keeps: enough to ack it on its own channel, or copy it.
pub(crate) struct Held {
    generation: u64,
    pub(crate) acker: Acker,
    /// Its consumer channel's book and its tag: an ack is written to the channel directly
    /// (lapin's `Acker` goes through its internal RPC task and a spawned future first: two
    /// thread hand-offs more per message), with the acks asked for at the same time.
    pub(crate) acks: Arc<AckBook>,
    pub(crate) delivery_tag: u64,
    /// Claimed by the first settle (an ack through the channel's book, which the `Acker` does
    /// not know of, or a nack through the `Acker`): one gate for both, so they never both go
    /// out.
    pub(crate) settled: Arc<AtomicBool>,
    pub(crate) queue: Arc<str>,
    /// The delivery's own bytes (shared, not copied): a release or a dead letter sends them.
    pub(crate) body: Bytes,
    /// Its properties, kept whole (taken from the delivery, not copied): a copy carries its
    /// headers.
    properties: lapin::BasicProperties,
    receive_count: u32,
}

impl Held {
    fn headers(&self) -> Option<&FieldTable> {
        self.properties.headers().as_ref()
    }
}

impl AmqpBroker {
    pub(crate) fn held<'a>(&self, handle: &'a DeliveryHandle) -> Result<&'a Held, BrokerError> {
        handle
            .downcast_ref::<Held>()
            .ok_or(BrokerError::ForeignHandle)
    }

    /// Whether a delivery still belongs to the live channel: after a reconnect it never does,
    /// and its tag must not be acked on the new channel.
    pub(crate) fn is_current(&self, held: &Held) -> bool {
        held.generation == self.shared.current_generation()
            && !held.settled.load(Ordering::SeqCst)
            && held.acker.usable()
    }

    /// The headers of a copy: the original's, without RabbitMQ's bookkeeping, plus ours.
    pub(crate) fn copy_headers(held: &Held) -> FieldTable {
        let mut headers = FieldTable::default();
        for (k, v) in held.headers().into_iter().flat_map(|h| h.inner()) {
            if !matches!(
                k.as_str(),
                "x-death"
                    | "x-delivery-count"
                    | "x-first-death-exchange"
                    | "x-first-death-queue"
                    | "x-first-death-reason"
                    | "x-last-death-exchange"
                    | "x-last-death-queue"
                    | "x-last-death-reason"
            ) {
                headers.insert(k.clone(), v.clone());
            }
        }
        headers.insert(
            RECEIVES_HEADER.into(),
            AMQPValue::LongLongInt(i64::from(held.receive_count)),
        );
        headers
    }

    /// Publishes `copy`, then acks the original. If the copy cannot be published, the
    /// original goes back to its queue after `retry_in` (at most 5 s): a delivery left
    /// unsettled on a live channel would be held until the channel closes, and an immediate
    /// requeue would loop as fast as the broker refuses.
    pub(crate) async fn publish_copy_then_ack(
        &self,
        held: &Held,
        copy: Publication,
        retry_in: Duration,
    ) -> Result<(), BrokerError> {
        if let Err(e) = self.publish_all(std::slice::from_ref(&copy)).await {
            let (broker, acker, generation) = (self.clone(), held.acker.clone(), held.generation);
            let (settled, acks, tag) = (
                Arc::clone(&held.settled),
                Arc::clone(&held.acks),
                held.delivery_tag,
            );
            let wait = retry_in.min(Duration::from_secs(5));
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if generation == broker.shared.current_generation()
                    && acker.usable()
                    && !settled.swap(true, Ordering::SeqCst)
                    && crate::acks::requeue(&acker).await
                {
                    acks.settled_elsewhere(tag);
                }
            });
            return Err(e);
        }
        self.ack_held(held).await
    }

    pub(crate) async fn ack_held(&self, held: &Held) -> Result<(), BrokerError> {
        // Already settled, or its channel is gone: the broker redelivers it.
        if held.generation != self.shared.current_generation()
            || !held.acker.usable()
            || !held.acks.channel().status().connected()
            || held.settled.swap(true, Ordering::SeqCst)
        {
            return Err(BrokerError::DeliveryLost);
        }
        // Queued on the connection with the acks asked for alongside, within one scheduler
        // pass; an ack lost with the connection is a redelivery, answered as a duplicate.
        held.acks.ack(held.delivery_tag).await;
        Ok(())
    }

    pub(crate) fn to_delivery(&self, incoming: Incoming) -> Delivery {
        let Incoming {
            generation,
            queue,
            delivery,
            acks,
        } = incoming;
        let lapin::message::Delivery {
            delivery_tag,
            data,
            properties,
            acker,
            ..
        } = delivery;
        let no_headers = FieldTable::default();
        let headers = properties.headers().as_ref().unwrap_or(&no_headers);
        let earlier = header_int(headers, "x-delivery-count")
            .unwrap_or(0)
            .clamp(0, i64::from(u32::MAX))
            .saturating_add(
                header_int(headers, RECEIVES_HEADER)
                    .unwrap_or(0)
                    .clamp(0, i64::from(u32::MAX)),
            );
        let receive_count = earlier.saturating_add(1).min(i64::from(u32::MAX)) as u32;
        let data = Bytes::from(data);
        let task_id = header_text(headers, "task_id").and_then(|id| TaskId::parse(id).ok());
        let not_before = header_int(headers, NOT_BEFORE_HEADER).map(|ms| ms as f64 / 1000.0);
        let held = Held {
            generation,
            acker,
            acks,
            delivery_tag,
            settled: Arc::new(AtomicBool::new(false)),
            queue: Arc::clone(&queue),
            body: data.clone(),
            properties,
            receive_count,
        };
        Delivery::new(
            data,
            task_id,
            receive_count,
            queue,
            DeliveryHandle::new(held),
        )
        .with_not_before(not_before)
    }
}
