//! The [`SqsBroker`] and its [`Broker`] implementation.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::QueueAttributeName;
use ferriq::broker::{
    Broker, BrokerError, ConsumerSettings, DeadLetter, Delivery, DeliveryHandle, Health,
    LeaseStatus, OutgoingMessage, QueueDepth, RejectedMessage,
};
use tokio::time::Instant;

use crate::client;
use crate::config::SqsBrokerBuilder;
use crate::error::{broker_error, describe};
use crate::queue::{DeadLetters, Queue};
use crate::receive::Receiver;
use crate::settle::{spawn_deleter, unix_ms};
use crate::shared::Shared;
use crate::SqsError;

/// Why a broker connected only to send takes nothing.
const SEND_ONLY: &str = "this SQS broker was connected to send only (SqsBrokerBuilder::send_only, \
    or from a URL without a worker's concurrency): a worker's broker needs every lane to have a \
    dead-letter queue; connect it with send_only(false), or from a URL with the worker's \
    ConnectOptions::concurrency (as Worker::builder_from_env does)";

/// An SQS broker for ferriq workers and clients. Cheap to clone; its pollers stop when the
/// last clone is dropped.
///
/// ```no_run
/// # async fn demo() -> Result<(), ferriq_sqs::SqsError> {
/// let broker = ferriq_sqs::SqsBroker::builder("sqs://jobs?region=eu-west-1")?
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqsBroker {
    pub(crate) shared: Arc<Shared>,
    /// The pollers and the deliveries they buffered.
    receiver: Arc<Receiver>,
    _owner: Arc<Owner>,
}

/// Stops the pollers when the last broker handle goes.
struct Owner(tokio_util::sync::CancellationToken);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl SqsBroker {
    /// A builder from an `sqs://` URL (see [`SqsBrokerBuilder::from_url`]).
    pub fn builder(url: impl Into<ferriq::SecretUrl>) -> Result<SqsBrokerBuilder, SqsError> {
        SqsBrokerBuilder::from_url(url)
    }

    pub(crate) async fn connect(settings: SqsBrokerBuilder) -> Result<Self, SqsError> {
        settings.validate()?;
        let clients = client::build(&settings).await?;
        let mut lanes = Vec::new();
        let dead_letters = if settings.send_only {
            DeadLetters::IfNamed
        } else {
            DeadLetters::Required
        };
        for lane in &settings.lanes {
            let dead_letter = settings.dead_letter.as_ref();
            let q = Queue::resolve(&clients.call, lane, dead_letter, dead_letters).await?;
            lanes.push(Arc::new(q));
        }
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let shared = Arc::new_cyclic(|weak| Shared {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            deleter: spawn_deleter(weak.clone()),
            settings,
            clients,
            lanes,
            others: Default::default(),
            concurrency: AtomicUsize::new(32),
            lease_ms: AtomicU64::new(30_000),
            aged_ms: AtomicU64::new(0),
            last_error: Mutex::new(String::new()),
            health: Mutex::new(None),
            stop: tokio_util::sync::CancellationToken::new(),
        });
        tracing::info!(
            queues = ?shared.lanes.iter().map(|l| &*l.name).collect::<Vec<_>>(),
            "connected to SQS"
        );
        Ok(SqsBroker {
            _owner: Arc::new(Owner(shared.stop.clone())),
            receiver: Arc::new(Receiver::new()),
            shared,
        })
    }

    /// The queues consumed (the first is the default lane), by name.
    pub fn queue_names(&self) -> Vec<String> {
        self.shared
            .lanes
            .iter()
            .map(|l| l.name.to_string())
            .collect()
    }

    /// The URL of the default lane's queue.
    pub fn queue_url(&self) -> &str {
        &self.shared.lanes[0].url
    }

    /// Fault injection for tests of the 12-hour visibility budget: every delivery is treated
    /// as `by` older than it is. Emulators do not enforce the budget as AWS does.
    pub fn age_deliveries(&self, by: Duration) {
        self.shared
            .aged_ms
            .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }
}

#[async_trait]
impl Broker for SqsBroker {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        let shared = &self.shared;
        let now_ms = unix_ms();
        let mut by_queue: Vec<(Arc<Queue>, Vec<crate::send::Entry>)> = Vec::new();
        let mut rejected: Vec<RejectedMessage> = Vec::new();
        for msg in batch {
            let queue = shared.queue_for(msg.queue.as_deref()).await?;
            let task_id = msg.task_id.clone();
            match crate::send::entry(&queue, msg, now_ms) {
                Ok(e) => match by_queue.iter_mut().find(|(q, _)| q.url == queue.url) {
                    Some((_, entries)) => entries.push(e),
                    None => by_queue.push((queue, vec![e])),
                },
                Err(why) => rejected.push(RejectedMessage::new(task_id, why)),
            }
        }
        for (queue, entries) in by_queue {
            rejected.extend(shared.send_entries(&queue, entries).await?);
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(BrokerError::PartlyRejected(rejected))
        }
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        if self.shared.settings.send_only {
            // Checked before anything is taken: what a worker could not park would go round
            // until SQS's own limit, without a result.
            return Err(BrokerError::Config(SEND_ONLY.into()));
        }
        self.receiver.receive(&self.shared, max, wait).await
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let held = self.shared.held(delivery)?;
        self.shared.delete(held).await
    }

    async fn release(&self, delivery: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        self.shared.release(delivery, after).await
    }

    async fn extend(
        &self,
        deliveries: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        self.shared.extend(deliveries, lease).await
    }

    async fn dead_letter(&self, delivery: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        self.shared.dead_letter(&delivery.handle, why).await
    }

    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        let (mut ready, mut in_flight, mut delayed) = (0, 0, 0);
        for (_, depth) in self.queue_depths().await? {
            ready += depth.ready;
            in_flight += depth.in_flight;
            delayed += depth.delayed;
        }
        Ok(QueueDepth::new(ready, in_flight, delayed))
    }

    async fn queue_depths(&self) -> Result<Vec<(String, QueueDepth)>, BrokerError> {
        let mut out = Vec::new();
        for lane in &self.shared.lanes {
            let answer = self
                .shared
                .clients
                .call
                .get_queue_attributes()
                .queue_url(&lane.url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
                .send()
                .await
                .map_err(|e| broker_error(&e))?;
            let attributes = answer.attributes().cloned().unwrap_or_default();
            let get = |name: QueueAttributeName| {
                attributes
                    .get(&name)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            out.push((
                lane.name.to_string(),
                QueueDepth::new(
                    get(QueueAttributeName::ApproximateNumberOfMessages),
                    get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
                    get(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
                ),
            ));
        }
        Ok(out)
    }

    fn dead_letters(&self) -> Option<&dyn ferriq::dead_letters::DeadLetterQueue> {
        Some(self)
    }

    async fn health(&self) -> Health {
        if let Some((at, health)) = self
            .shared
            .health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            // Probes may come every second: one call per few seconds is enough.
            if at.elapsed() < Duration::from_secs(3) {
                return health;
            }
        }
        let answer = self
            .shared
            .clients
            .beat
            .get_queue_attributes()
            .queue_url(&self.shared.lanes[0].url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await;
        let health = match answer {
            Ok(_) => Health::Healthy,
            Err(e) => Health::Unhealthy(format!("SQS does not answer: {}", describe(&e))),
        };
        *self.shared.health.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), health.clone()));
        health
    }

    fn cannot_consume(&self) -> Option<String> {
        self.shared.settings.send_only.then(|| SEND_ONLY.to_owned())
    }

    fn lanes(&self) -> Vec<String> {
        self.queue_names()
    }

    fn prepare_consumer(&self, consumer: &ConsumerSettings) {
        self.shared
            .concurrency
            .store(consumer.concurrency.max(1), Ordering::Relaxed);
        self.shared.lease_ms.store(
            consumer.lease.as_millis().max(1000) as u64,
            Ordering::Relaxed,
        );
    }

    fn drain_started(&self) {
        self.receiver.stop_polling();
        // What the pollers already buffered goes back now, not after the drain.
        let (receiver, shared) = (Arc::clone(&self.receiver), Arc::clone(&self.shared));
        tokio::spawn(async move { receiver.hand_back_buffered(&shared).await });
    }

    async fn stop_receiving(&self) {
        self.receiver.stop(&self.shared).await;
    }
}

impl std::fmt::Debug for SqsBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsBroker")
            .field(
                "queues",
                &self
                    .shared
                    .lanes
                    .iter()
                    .map(|l| &l.name)
                    .collect::<Vec<_>>(),
            )
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}
