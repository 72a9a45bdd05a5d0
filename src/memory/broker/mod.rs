//! The memory broker: lanes of waiting messages with visibility leases, delays and a
//! dead-letter queue per lane, in one process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

mod dead_letters;
mod in_flight;
mod inspect;
mod waiting;

use crate::broker::{
    Broker, BrokerError, Bytes, DeadLetter, Delivery, DeliveryHandle, Health, LeaseStatus,
    OutgoingMessage, QueueDepth,
};
use crate::wire::TaskId;
use in_flight::{InFlight, InFlightSet};
pub use inspect::{MemoryBrokerStats, ParkedMessage};

/// The default queue name, taskiq's.
const DEFAULT_QUEUE: &str = "taskiq";

/// An in-memory broker with SQS-like semantics: a received message is invisible for the
/// visibility timeout (extended by heartbeats), comes back if not acked, and counts its
/// receives. Clones share the queues.
///
/// ```
/// use std::time::Duration;
/// use ferriq::broker::{Broker, OutgoingMessage};
/// use ferriq::memory::MemoryBroker;
/// use ferriq::wire::TaskMessage;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let broker = MemoryBroker::new();
/// let msg = OutgoingMessage::from_message(&TaskMessage::new("add")).unwrap();
/// broker.publish(vec![msg]).await.unwrap();
/// let got = broker.receive(10, Duration::from_millis(10)).await.unwrap();
/// assert_eq!(got[0].receive_count, 1);
/// broker.ack(&got[0].handle).await.unwrap();
/// assert_eq!(broker.stats().acked, 1);
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryBroker {
    pub(super) shared: Arc<Shared>,
    queues: Arc<[Arc<str>]>,
}

pub(super) struct Shared {
    pub(super) id: u64,
    /// Wall time for dead letters' ages (follows tokio's clock).
    pub(super) clock: crate::clock::Clock,
    state: Mutex<State>,
    notify: Notify,
    visibility: Duration,
    max_receives: Option<u32>,
}

#[derive(Default)]
pub(super) struct State {
    queues: crate::FastMap<String, Queue>,
    next_id: u64,
    next_receipt: u64,
    pub(super) dead: Vec<ParkedMessage>,
    stats: MemoryBrokerStats,
}

#[derive(Default)]
struct Queue {
    /// Waiting messages by (visible at, id).
    pending: waiting::Waiting<Stored>,
    in_flight: InFlightSet<Stored>,
}

#[derive(Clone)]
struct Stored {
    id: u64,
    /// Shared with each delivery of it: a receive costs a count, not a copy.
    body: Bytes,
    task_id: Option<TaskId>,
    receive_count: u32,
}

#[derive(Debug, Clone)]
struct Handle {
    broker: u64,
    queue: Arc<str>,
    id: u64,
    receipt: u64,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBroker {
    /// A broker whose default queue is `taskiq`, with a 30 s visibility timeout.
    pub fn new() -> Self {
        Self::with_visibility(Duration::from_secs(30))
    }

    /// A broker with the given visibility timeout (how long a received, un-extended message
    /// stays invisible).
    pub fn with_visibility(visibility: Duration) -> Self {
        Self::with_settings(visibility, None)
    }

    /// A broker with the given visibility timeout and, like SQS's `maxReceiveCount`, a redrive
    /// limit: a message received `max_receives` times is moved to the dead-letter queue (reason
    /// `RedriveLimit`) instead of being delivered again. A backstop for loops the worker cannot
    /// see; `None` (the default) never redrives.
    pub fn with_settings(visibility: Duration, max_receives: Option<u32>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        MemoryBroker {
            shared: Arc::new(Shared {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                clock: crate::clock::Clock::following_tokio(),
                state: Mutex::new(State::default()),
                notify: Notify::new(),
                visibility,
                // 0 would park every message on its first receive: read it as "no limit".
                max_receives: max_receives.filter(|n| *n > 0),
            }),
            queues: Arc::from(vec![Arc::from(DEFAULT_QUEUE)]),
        }
    }

    /// A handle on the same broker that receives from `queues` (lanes) instead; messages it
    /// publishes without a `queue_name` label go to the first.
    pub fn consuming(&self, queues: &[&str]) -> Self {
        let queues: Arc<[Arc<str>]> = if queues.is_empty() {
            Arc::from(vec![Arc::from(DEFAULT_QUEUE)])
        } else {
            queues.iter().map(|q| Arc::from(*q)).collect()
        };
        MemoryBroker {
            shared: Arc::clone(&self.shared),
            queues,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves consistent data (every update is a single
        // insert/remove), so a poisoned lock is still usable.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn handle<'a>(&self, handle: &'a DeliveryHandle) -> Result<&'a Handle, BrokerError> {
        match handle.downcast_ref::<Handle>() {
            Some(h) if h.broker == self.shared.id => Ok(h),
            _ => Err(BrokerError::ForeignHandle),
        }
    }

    /// Takes the in-flight entry of a current handle, moving expired leases back first.
    fn take_current(&self, state: &mut State, h: &Handle) -> Result<InFlight<Stored>, BrokerError> {
        let now = Instant::now();
        let visibility_lost = {
            let Some(q) = state.queues.get_mut(&*h.queue) else {
                return Err(BrokerError::DeliveryLost);
            };
            match q.in_flight.get(h.id) {
                Some(f) if f.receipt == h.receipt && f.visible_at > now => {
                    return Ok(q.in_flight.remove(h.id).expect("checked above"));
                }
                Some(f) => f.visible_at <= now,
                None => false,
            }
        };
        if visibility_lost {
            Self::requeue_expired(state, &h.queue, now);
        }
        Err(BrokerError::DeliveryLost)
    }

    fn requeue_expired(state: &mut State, queue: &str, now: Instant) {
        let Some(q) = state.queues.get_mut(queue) else {
            return;
        };
        let expired = q.in_flight.take_expired(now);
        state.stats.expired += expired.len() as u64;
        for f in expired {
            q.pending.insert(f.visible_at, f.stored.id, f.stored);
        }
    }

    /// Pops up to `max` visible messages; otherwise returns when the next one becomes visible.
    fn try_receive(&self, max: usize) -> (Vec<Delivery>, Option<Instant>) {
        let now = Instant::now();
        let mut state = self.lock();
        let mut out = Vec::new();
        let mut next_visible: Option<Instant> = None;
        for queue in self.queues.iter() {
            Self::requeue_expired(&mut state, queue, now);
            let State {
                queues,
                next_receipt,
                next_id,
                stats,
                dead,
            } = &mut *state;
            let Some(q) = queues.get_mut(&**queue) else {
                continue;
            };
            if out.is_empty() {
                // Room for what this receive can take at most, so the vector is not grown on
                // the way (a worker asks for all its free slots at once).
                out.reserve(max.min(q.pending.len()));
            }
            while out.len() < max {
                let Some(mut stored) = q.pending.pop_visible(now) else {
                    break;
                };
                if self
                    .shared
                    .max_receives
                    .is_some_and(|max| stored.receive_count >= max)
                {
                    // SQS moves it on the receive after the limit: parked, never delivered.
                    let why = DeadLetter::new(
                        crate::broker::DeadLetterReason::RedriveLimit,
                        format!("received {} times", stored.receive_count),
                        None,
                        0,
                    );
                    *next_id += 1;
                    dead.push(ParkedMessage {
                        body: stored.body.into(),
                        why,
                        queue: queue.to_string(),
                        id: *next_id,
                        dead_at_ms: self.shared.clock.now_unix_ms(),
                        held: false,
                    });
                    stats.dead_lettered += 1;
                    continue;
                }
                stored.receive_count += 1;
                *next_receipt += 1;
                let handle = Handle {
                    broker: self.shared.id,
                    queue: queue.clone(),
                    id: stored.id,
                    receipt: *next_receipt,
                };
                out.push(Delivery::new(
                    stored.body.clone(),
                    stored.task_id.clone(),
                    stored.receive_count,
                    Arc::clone(queue),
                    DeliveryHandle::new(handle),
                ));
                stats.received += 1;
                q.in_flight.insert(
                    stored.id,
                    InFlight {
                        stored,
                        receipt: *next_receipt,
                        visible_at: now + self.shared.visibility,
                    },
                );
            }
            let candidates = q
                .pending
                .first_visible()
                .into_iter()
                .chain(q.in_flight.next_expiry());
            for t in candidates {
                next_visible = Some(next_visible.map_or(t, |n: Instant| n.min(t)));
            }
        }
        (out, next_visible)
    }
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        let now = Instant::now();
        let mut state = self.lock();
        for msg in batch {
            state.next_id += 1;
            let id = state.next_id;
            let queue = msg.queue.as_deref().unwrap_or(&self.queues[0]);
            let visible_at = now + msg.delay.unwrap_or_default();
            let stored = Stored {
                id,
                task_id: Some(msg.task_id).filter(|_| !msg.task_name.is_empty()),
                body: msg.body.into(),
                receive_count: 0,
            };
            // Looked up before it is named a key: no copy of the name per message.
            let q = match state.queues.get_mut(queue) {
                Some(q) => q,
                None => state.queues.entry(queue.to_owned()).or_default(),
            };
            q.pending.insert(visible_at, id, stored);
            state.stats.published += 1;
        }
        drop(state);
        self.shared.notify.notify_waiters();
        Ok(())
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        let deadline = Instant::now() + wait;
        loop {
            // Register for wake-ups before looking, so a publish in between is not missed.
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (got, next_visible) = self.try_receive(max.max(1));
            if !got.is_empty() {
                return Ok(got);
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
            let until = next_visible.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let h = self.handle(delivery)?;
        let mut state = self.lock();
        self.take_current(&mut state, h)?;
        state.stats.acked += 1;
        Ok(())
    }

    async fn release(&self, delivery: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        let h = self.handle(delivery)?;
        let mut state = self.lock();
        let f = self.take_current(&mut state, h)?;
        let visible_at = Instant::now() + after;
        if let Some(q) = state.queues.get_mut(&*h.queue) {
            q.pending.insert(visible_at, f.stored.id, f.stored);
        }
        state.stats.released += 1;
        drop(state);
        self.shared.notify.notify_waiters();
        Ok(())
    }

    async fn extend(
        &self,
        deliveries: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut out = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            let h = self.handle(d)?;
            let kept = state.queues.get_mut(&*h.queue).is_some_and(|q| {
                q.in_flight
                    .move_lease(h.id, h.receipt, |until| until > now, now + lease)
            });
            out.push(if kept {
                LeaseStatus::Kept
            } else {
                LeaseStatus::Lost
            });
        }
        Ok(out)
    }

    async fn dead_letter(&self, delivery: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        let h = self.handle(&delivery.handle)?;
        let mut state = self.lock();
        let f = self.take_current(&mut state, h)?;
        state.next_id += 1;
        let id = state.next_id;
        state.dead.push(ParkedMessage {
            body: f.stored.body.into(),
            why: why.clone(),
            queue: h.queue.to_string(),
            id,
            dead_at_ms: self.shared.clock.now_unix_ms(),
            held: false,
        });
        state.stats.dead_lettered += 1;
        Ok(())
    }

    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        let now = Instant::now();
        let state = self.lock();
        let mut depth = QueueDepth::default();
        for q in self
            .queues
            .iter()
            .filter_map(|name| state.queues.get(&**name))
        {
            for visible_at in q.pending.visible_times() {
                if visible_at <= now {
                    depth.ready += 1;
                } else {
                    depth.delayed += 1;
                }
            }
            depth.in_flight += q.in_flight.len() as u64;
        }
        Ok(depth)
    }

    async fn health(&self) -> Health {
        Health::Healthy
    }

    fn lanes(&self) -> Vec<String> {
        self.queues.iter().map(|q| q.to_string()).collect()
    }

    fn dead_letters(&self) -> Option<&dyn crate::dead_letters::DeadLetterQueue> {
        Some(self)
    }
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("queues", &self.queues)
            .field("visibility", &self.shared.visibility)
            .finish_non_exhaustive()
    }
}
