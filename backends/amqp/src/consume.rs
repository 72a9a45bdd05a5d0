//! The lanes' consumers, polled by the worker's `receive` itself: a delivery goes from lapin's
//! consumer to the worker without a forwarding task and a channel in between (each was one
//! more wake-up, and a thread switch, per burst of deliveries).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use lapin::Consumer;
use tokio_util::sync::CancellationToken;

use crate::acks::AckBook;

/// What the lanes report to: the session side that starts consumers and reconnects when one
/// fails (implemented by the session's shared state; named here so this file does not reach
/// up into the session).
pub(crate) trait LaneHost {
    /// The consumers started since the last call.
    fn take_started_consumers(&self) -> Vec<LaneConsumer>;
    /// Whether consuming is on (off after a drain: a consumer ending then is no failure).
    fn consuming(&self) -> bool;
    /// Notes why a consumer failed (the session is then replaced).
    fn consumer_failed(&self, error: &lapin::Error);
}

/// A delivery as a lane's consumer gave it, tagged with its session.
pub(crate) struct Incoming {
    pub(crate) generation: u64,
    pub(crate) queue: Arc<str>,
    pub(crate) delivery: lapin::message::Delivery,
    /// The book of the consumer channel it came on (acks go straight to that channel).
    pub(crate) acks: Arc<AckBook>,
}

/// One lane's consumer on one session, handed from the session that started it to `receive`.
pub(crate) struct LaneConsumer {
    pub(crate) generation: u64,
    pub(crate) queue: Arc<str>,
    /// Its channel's acks; every delivery is noted there as the consumer yields it.
    pub(crate) acks: Arc<AckBook>,
    pub(crate) consumer: Consumer,
    /// The session's token: a consumer that fails ends its session (the supervisor reconnects).
    pub(crate) dead: CancellationToken,
}

/// The consumers `receive` polls: those of the live session, taken round robin so a busy lane
/// does not starve the others.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Vec<LaneConsumer>,
    next: usize,
}

impl Lanes {
    /// Takes the consumers started since the last call and drops those of a dead session
    /// (their deliveries are the broker's again).
    pub(crate) fn adopt(&mut self, shared: &impl LaneHost) {
        self.lanes.append(&mut shared.take_started_consumers());
        self.lanes.retain(|l| !l.dead.is_cancelled());
    }

    /// Drops every consumer (their channels are closed or closing).
    pub(crate) fn clear(&mut self) {
        self.lanes.clear();
    }

    /// The next delivery of any lane. Never ready while there is no lane: the caller also
    /// waits for new consumers, and for its deadline.
    pub(crate) async fn next(&mut self, shared: &impl LaneHost) -> Incoming {
        std::future::poll_fn(|cx| self.poll_next(cx, shared)).await
    }

    /// A delivery the consumers already hold, without waiting.
    pub(crate) fn try_next(&mut self, shared: &impl LaneHost) -> Option<Incoming> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.poll_next(&mut cx, shared) {
            Poll::Ready(incoming) => Some(incoming),
            Poll::Pending => None,
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>, shared: &impl LaneHost) -> Poll<Incoming> {
        let mut pending = 0;
        while pending < self.lanes.len() {
            let i = (self.next + pending) % self.lanes.len();
            let lane = &mut self.lanes[i];
            match Pin::new(&mut lane.consumer).poll_next(cx) {
                Poll::Ready(Some(Ok(delivery))) => {
                    self.next = i + 1;
                    // Before anyone can ack: a `multiple` ack must never cover a delivery the
                    // book does not know is unsettled (even one `receive` then drops).
                    lane.acks.delivered(delivery.delivery_tag);
                    return Poll::Ready(Incoming {
                        generation: lane.generation,
                        queue: Arc::clone(&lane.queue),
                        delivery,
                        acks: Arc::clone(&lane.acks),
                    });
                }
                Poll::Ready(end) => {
                    ended(shared, lane, end.and_then(Result::err));
                    // The lane now at `i` (if any) has not been polled yet.
                    self.lanes.swap_remove(i);
                }
                Poll::Pending => pending += 1,
            }
        }
        Poll::Pending
    }
}

/// A consumer that ended: on purpose after a drain, or with its session; otherwise the broker
/// cancelled it (its queue deleted) or its channel failed, and the session is replaced.
fn ended(shared: &impl LaneHost, lane: &LaneConsumer, error: Option<lapin::Error>) {
    if !shared.consuming() || lane.dead.is_cancelled() {
        return;
    }
    let queue = &*lane.queue;
    match error {
        Some(e) => {
            tracing::warn!(error = %e, queue, "consumer failed; reconnecting");
            shared.consumer_failed(&e);
        }
        None => tracing::warn!(queue, "consumer cancelled by the broker; reconnecting"),
    }
    lane.dead.cancel();
}
