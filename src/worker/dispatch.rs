//! Handing received deliveries to runtime tasks.
//!
//! One task per delivery made every delivery a spawn, and on a multi-thread runtime every
//! spawn and every wake of a task another thread holds can wake a parked thread (a futex call
//! and a context switch). On a 2-core machine shared with the broker and the store that cost
//! the worker a tenth to a quarter of its CPU per task (BENCHMARKS.md). A received batch is
//! instead split into groups, at least one per runtime thread and at most 8 deliveries each,
//! each group one task that runs its deliveries concurrently: the threads still share the
//! work, and a batch costs a few spawns instead of one per message.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::TaskTracker;

use super::ordered::{Next, Waiting};
use super::running::Outcome;
use super::{settle, Inner};
use crate::broker::Delivery;

/// The most deliveries one task runs. Deliveries in one task are never run in parallel, and a
/// task body that blocks its thread (a mistake, but a common one) holds up the others of its
/// group, their result writes and acks included: a small group bounds that, and 8 already
/// saves most of the spawns of a batch.
const MAX_GROUP: usize = 8;

/// The receive loop's vectors, kept from batch to batch so that a batch allocates none: its
/// slots, and its deliveries admitted to run.
pub(super) struct Batch {
    /// The batch's concurrency slots, one per delivery asked for.
    pub(super) permits: Vec<OwnedSemaphorePermit>,
    admitted: Vec<Waiting>,
}

impl Batch {
    /// Room for `concurrency` deliveries (up to 256; a larger batch grows them once).
    pub(super) fn with_capacity(concurrency: usize) -> Self {
        let room = concurrency.min(256);
        Batch {
            permits: Vec::with_capacity(room),
            admitted: Vec::with_capacity(room),
        }
    }
}

/// Runs each delivery, holding a concurrency slot taken from `batch.permits` (none left: a
/// delivery the broker returned beyond what was asked, handled rather than left
/// unheartbeated) until it is settled. Deliveries with an ordering key run one at a time per
/// key, in the order received (`ordered.rs`): a key's first delivery runs, and the others wait
/// behind it.
pub(super) fn dispatch(
    inner: &Arc<Inner>,
    tracker: &TaskTracker,
    deliveries: Vec<Delivery>,
    batch: &mut Batch,
) {
    // Every delivery is admitted before any runs: a key's head that ran and went back before
    // the rest of its key were admitted would let them in as a new head, out of order.
    let Batch { permits, admitted } = batch;
    admitted.extend(deliveries.into_iter().filter_map(|delivery| {
        let waiting = Waiting {
            delivery,
            permit: permits.pop(),
        };
        match waiting.delivery.ordering_key.clone() {
            None => Some(waiting),
            Some(key) => inner.ordered.admit(&key, waiting),
        }
    }));
    let threads = tokio::runtime::Handle::current()
        .metrics()
        .num_workers()
        .max(1);
    let per_group = admitted.len().div_ceil(threads).clamp(1, MAX_GROUP);
    let mut waiting = admitted.drain(..).peekable();
    while let Some(first) = waiting.next() {
        let inner = Arc::clone(inner);
        if per_group == 1 || waiting.peek().is_none() {
            // A lone delivery needs no set around it.
            tracker.spawn(process_in_turn(inner, first));
            continue;
        }
        // Pushed one by one rather than collected: each delivery's future is large, and the
        // iterator adapters of a `collect` moved it twice more on its way into the set.
        let runs = FuturesUnordered::new();
        runs.push(process_in_turn(Arc::clone(&inner), first));
        for next in waiting.by_ref().take(per_group - 1) {
            runs.push(process_in_turn(Arc::clone(&inner), next));
        }
        tracker.spawn(runs.for_each(|()| async {}));
    }
}

/// Settles `current`, then, for an ordering key, whatever of its key waits behind it, in order:
/// the next only once the previous one's message left its queue for good. When it went back
/// instead (or the worker drains), what waits is handed back unrun, for the broker to return
/// after it.
///
/// This future is moved whole (every byte of its largest state) into its group's set or
/// runtime task on every delivery, so it is kept small: the delivery is lent to the stages
/// below (a future that takes it by value holds a copy of it), and this is an `async` block
/// rather than an `async fn` (which would hold its argument twice: as it came, and moved
/// into the body).
// Written out on purpose: the `async fn` form clippy prefers is the one that holds `current`
// twice.
#[allow(clippy::manual_async_fn)]
fn process_in_turn(inner: Arc<Inner>, mut current: Waiting) -> impl Future<Output = ()> {
    async move {
        let Some(key) = current.delivery.ordering_key.clone() else {
            process_caught(&inner, &current.delivery).await;
            return;
        };
        loop {
            let outcome = process_caught(&inner, &current.delivery).await;
            let Waiting { delivery, permit } = current;
            // Settled: its slot is free before the next of its key runs.
            drop((delivery, permit));
            match inner
                .ordered
                .next(&key, outcome.is_some_and(Outcome::removed))
            {
                None => return,
                Some(Next::Run(next)) => current = next,
                Some(Next::HandBack(waiting)) => {
                    hand_back(&inner, waiting).await;
                    return;
                }
            }
        }
    }
}

/// Gives deliveries that waited behind their group's run back to their queue, visible at
/// once (the head still in flight keeps them from being received before it), unclaimed.
pub(super) async fn hand_back(w: &Inner, waiting: Vec<Waiting>) {
    let releases = waiting.into_iter().map(|waiting| async move {
        settle::release_now(w, &waiting.delivery, Outcome::Released).await;
        drop(waiting.permit);
    });
    futures_util::future::join_all(releases).await;
}

/// Settles one delivery. A panic in the worker's own code (the task's body is caught in
/// `run`) ends this delivery only, and the rest of the group carries on. The delivery is
/// taken out of the running table (else the heartbeats would keep its claim and message
/// forever, with nothing running) and released now: RabbitMQ would otherwise hold an
/// unsettled message until its channel closes. Its claim, no longer heartbeated, runs out
/// with its lease, and the next run counts as a takeover.
async fn process_caught(inner: &Inner, d: &Delivery) -> Option<Outcome> {
    // Not boxed: the delivery's future is moved once into its group's set or runtime task,
    // and that copy costs less than an allocation per delivery (measured: 0.8 fewer
    // allocations per task for 0.6 % more instructions, most of them the copy).
    let settled = AssertUnwindSafe(super::delivery::process(inner, d))
        .catch_unwind()
        .await;
    match settled {
        Ok(outcome) => Some(outcome),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(non-string panic payload)".to_owned());
            inner.running.remove(d.handle.key());
            match inner
                .broker
                .release(&d.handle, inner.config.min_defer)
                .await
            {
                Ok(()) => {
                    tracing::error!(panic = %what, "settling a delivery panicked; its message was released")
                }
                // Settled before the panic, or already lost: the broker has it either way.
                Err(e) => {
                    tracing::error!(panic = %what, release = %e, "settling a delivery panicked; its message was not released")
                }
            }
            None
        }
    }
}
