//! The state every part of an SQS broker shares: its clients, its lanes, the settings and
//! what a worker told it. Receiving (`receive.rs`), sending (`send.rs`) and settling
//! (`settle.rs`) are operations on it, each in its own file; this one imports none of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferriq::broker::{BrokerError, ConsumerSettings, Health};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::client::Clients;
use crate::config::{QueueRef, SqsBrokerBuilder};
use crate::queue::{DeadLetters, Queue};

/// What a broker's clones share.
pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) settings: SqsBrokerBuilder,
    pub(crate) clients: Clients,
    /// The consumed queues; the first is the default lane.
    pub(crate) lanes: Vec<Arc<Queue>>,
    /// Queues only sent to (a `queue_name` label naming no lane), resolved when first used.
    pub(crate) others: tokio::sync::Mutex<HashMap<String, Arc<Queue>>>,
    pub(crate) deleter: mpsc::UnboundedSender<Delete>,
    pub(crate) concurrency: AtomicUsize,
    pub(crate) lease_ms: AtomicU64,
    /// Time added to every delivery's age (fault injection for the 12-hour budget).
    pub(crate) aged_ms: AtomicU64,
    pub(crate) last_error: Mutex<String>,
    pub(crate) health: Mutex<Option<(Instant, Health)>>,
    /// Cancelled when the last broker handle is dropped.
    pub(crate) stop: tokio_util::sync::CancellationToken,
}

impl Shared {
    pub(crate) fn consumer(&self) -> ConsumerSettings {
        ConsumerSettings::new(
            self.concurrency.load(Ordering::Relaxed),
            Duration::from_millis(self.lease_ms.load(Ordering::Relaxed)),
        )
    }

    pub(crate) fn resend_after(&self) -> u32 {
        self.settings.resend_after_receives.max(1)
    }

    pub(crate) fn aged(&self) -> Duration {
        Duration::from_millis(self.aged_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn set_error(&self, why: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// The queue a message goes to: a lane, or another queue by name (looked up once).
    pub(crate) async fn queue_for(&self, name: Option<&str>) -> Result<Arc<Queue>, BrokerError> {
        let Some(name) = name else {
            return Ok(Arc::clone(&self.lanes[0]));
        };
        if let Some(lane) = self.lanes.iter().find(|l| &*l.name == name) {
            return Ok(Arc::clone(lane));
        }
        let mut others = self.others.lock().await;
        if let Some(q) = others.get(name) {
            return Ok(Arc::clone(q));
        }
        let queue = Queue::resolve(
            &self.clients.call,
            &QueueRef::Name(name.to_owned()),
            None,
            DeadLetters::Skip,
        )
        .await
        .map_err(|e| BrokerError::Config(e.to_string()))?;
        let queue = Arc::new(queue);
        others.insert(name.to_owned(), Arc::clone(&queue));
        Ok(queue)
    }
}

/// One delete waiting for its batch.
pub(crate) struct Delete {
    pub(crate) queue: Arc<Queue>,
    pub(crate) receipt: String,
    pub(crate) done: oneshot::Sender<Result<(), BrokerError>>,
}
