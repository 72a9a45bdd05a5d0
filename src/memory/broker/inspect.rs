//! What a test reads of a memory broker, and the faults it injects: parked messages,
//! counters, queue lengths, leases run out on demand.

use tokio::time::Instant;

use super::{Handle, MemoryBroker};
use crate::broker::{DeadLetter, DeliveryHandle};

/// A message parked in the dead-letter queue.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ParkedMessage {
    /// The body as it was received.
    pub body: Vec<u8>,
    /// Why it was parked.
    pub why: DeadLetter,
    /// The queue it came from.
    pub queue: String,
    /// This parking's id.
    pub id: u64,
    /// When it was parked (unix ms, on the broker's clock).
    pub dead_at_ms: u64,
    /// Held by an operator's session.
    pub(super) held: bool,
}

/// Counters of what happened to messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryBrokerStats {
    /// Messages published.
    pub published: u64,
    /// Deliveries handed out.
    pub received: u64,
    /// Messages acked.
    pub acked: u64,
    /// Releases.
    pub released: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Leases that ran out and made the message visible again.
    pub expired: u64,
}

impl MemoryBroker {
    /// Messages parked in the dead-letter queue.
    pub fn dead_letters(&self) -> Vec<ParkedMessage> {
        self.lock().dead.clone()
    }

    /// Counters.
    pub fn stats(&self) -> MemoryBrokerStats {
        self.lock().stats
    }

    /// Messages in a queue, waiting or in flight.
    pub fn len(&self, queue: &str) -> usize {
        self.lock()
            .queues
            .get(queue)
            .map_or(0, |q| q.pending.len() + q.in_flight.len())
    }

    /// Whether every queue is empty.
    pub fn is_empty(&self) -> bool {
        self.lock()
            .queues
            .values()
            .all(|q| q.pending.is_empty() && q.in_flight.is_empty())
    }

    /// Fault injection: every in-flight lease runs out now, as if the workers holding them had
    /// paused past their visibility timeout. The messages become visible again and the old
    /// handles are stale (their ack fails, their heartbeat reports them lost).
    pub fn expire_in_flight(&self) -> usize {
        let now = Instant::now();
        let mut state = self.lock();
        let mut n = 0;
        for q in state.queues.values_mut() {
            n += q.in_flight.expire_all(now);
        }
        drop(state);
        self.shared.notify.notify_waiters();
        n
    }

    /// Fault injection: the lease of one delivery runs out now.
    pub fn expire_delivery(&self, handle: &DeliveryHandle) -> bool {
        let Some(h) = handle.downcast_ref::<Handle>() else {
            return false;
        };
        let mut state = self.lock();
        let hit = state.queues.get_mut(&*h.queue).is_some_and(|q| {
            q.in_flight
                .move_lease(h.id, h.receipt, |_| true, Instant::now())
        });
        drop(state);
        self.shared.notify.notify_waiters();
        hit
    }
}
