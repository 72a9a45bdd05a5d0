//! Receive: the worker's loop. It takes a free concurrency slot (and every other one free at
//! that moment), asks the broker for that many deliveries, and hands them to
//! [`super::dispatch`] with their slots — until a drain is asked for. A broker that fails is
//! asked again after a backoff (100 ms doubling to 10 s).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use super::{dispatch, Inner, Shutdown};

/// Receives until `shutdown` asks for a drain; each delivery's processing is spawned on
/// `tracker`.
pub(super) async fn until_drain(inner: &Arc<Inner>, shutdown: &Shutdown, tracker: &TaskTracker) {
    let slots = Arc::new(Semaphore::new(inner.config.concurrency));
    let mut backoff = Duration::from_millis(100);
    // Kept from batch to batch: a receive allocates no vector of the worker's own.
    let mut batch = dispatch::Batch::with_capacity(inner.config.concurrency);
    loop {
        let first = tokio::select! {
            biased;
            _ = shutdown.draining() => None,
            permit = Arc::clone(&slots).acquire_owned() => permit.ok(),
        };
        let Some(first) = first else {
            return;
        };
        batch.permits.push(first);
        while let Ok(p) = Arc::clone(&slots).try_acquire_owned() {
            batch.permits.push(p);
        }
        let received = tokio::select! {
            biased;
            _ = shutdown.draining() => return,
            r = inner.broker.receive(batch.permits.len(), inner.config.receive_wait) => r,
        };
        match received {
            Ok(deliveries) => {
                backoff = Duration::from_millis(100);
                if deliveries.len() > batch.permits.len() {
                    // Handled anyway rather than held unheartbeated.
                    tracing::warn!("broker returned more deliveries than requested");
                }
                dispatch::dispatch(inner, tracker, deliveries, &mut batch);
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "receive failed");
                tokio::select! {
                    _ = shutdown.draining() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
        // Slots the broker had nothing for are free again.
        batch.permits.clear();
    }
}
