//! Drain: what a worker does once it stops receiving. Deliveries waiting behind their message
//! group go back at once; runs get the grace period to finish; the rest are cancelled and
//! their claims and messages handed back, so another worker takes them at once. A second
//! signal (a forced stop) shortens every wait to [`FORCED_LIMIT`]. A broker or store call that
//! hangs never keeps the process from stopping: a message not handed back comes back by
//! itself.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::running::StopReason;
use super::{dispatch, Inner, Shutdown};

/// How long a worker told to stop now (a second signal) still gives each hand-back step.
const FORCED_LIMIT: Duration = Duration::from_secs(5);

/// Lets the runs on `tracker` finish within the grace period, then cancels and settles the
/// leftovers.
pub(super) async fn runs(inner: &Arc<Inner>, shutdown: &Shutdown, tracker: &TaskTracker) {
    tracker.close();
    inner.broker.drain_started();
    // What waits behind a group's run goes back now, for another worker, in order.
    let waiting = inner.ordered.drain();
    let _ = tokio::time::timeout(FORCED_LIMIT, dispatch::hand_back(inner, waiting)).await;
    tracing::info!(in_flight = inner.running.len(), grace = ?inner.config.grace, "draining");
    let forced = tokio::select! {
        _ = tracker.wait() => false,
        _ = tokio::time::sleep(inner.config.grace) => false,
        _ = shutdown.forced() => true,
    };
    if tracker.is_empty() {
        return;
    }
    let left = inner.running.len();
    if forced {
        tracing::warn!(
            left,
            "told to stop now: cancelling runs and releasing their messages"
        );
    } else {
        tracing::warn!(
            left,
            "grace period over: cancelling runs and releasing their messages"
        );
    }
    inner.running.stop_all(StopReason::Shutdown);
    // Handing back is quick (a claim release, a message release), and worth waiting for even
    // when told to stop now: a message released before its channel closes is back at once and
    // its run counts as handed back. Told to stop now during the settle: at most 5 s more.
    let settle_limit = if forced {
        FORCED_LIMIT
    } else {
        Duration::from_secs(30)
    };
    let settled = tokio::time::timeout(settle_limit, tracker.wait());
    tokio::pin!(settled);
    let finished = tokio::select! {
        done = &mut settled => done.is_ok(),
        _ = shutdown.forced(), if !forced => {
            tokio::time::timeout(FORCED_LIMIT, settled).await.is_ok_and(|done| done.is_ok())
        }
    };
    if !finished {
        tracing::error!(
            left = inner.running.len(),
            "deliveries still settling; stopping anyway (their messages come back by themselves)"
        );
    }
}

/// Once every delivery is settled: a broker that pushes deliveries (RabbitMQ) hands the ones
/// it buffered back to the queue for other workers (SQS waits for its open polls). Told to
/// stop now: at most [`FORCED_LIMIT`] for it.
pub(super) async fn stop_receiving(inner: &Inner, shutdown: &Shutdown) {
    let stopping = inner.broker.stop_receiving();
    tokio::pin!(stopping);
    tokio::select! {
        _ = &mut stopping => {}
        _ = shutdown.forced() => {
            let _ = tokio::time::timeout(FORCED_LIMIT, stopping).await;
        }
    }
}
