use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::running::StopReason;
use super::{dispatch, limits, slots, Inner};
use crate::broker::LeaseStatus;
use crate::store::ClaimLease;

/// The two heartbeat loops of a worker: one batched broker lease extension and one batched
/// claim heartbeat per period, over every running delivery (not a timer per task).
pub(crate) struct Heartbeats {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Heartbeats {
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            // A beat in progress finishes first (its calls are bounded); never wait forever.
            let abort = t.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_secs(10), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

pub(crate) fn spawn(inner: Arc<Inner>) -> Heartbeats {
    let stop = CancellationToken::new();
    let broker_loop = {
        let (inner, stop) = (Arc::clone(&inner), stop.clone());
        tokio::spawn(async move { every_period(&inner, &stop, broker_beat).await })
    };
    let claim_loop = {
        let (inner, stop) = (Arc::clone(&inner), stop.clone());
        tokio::spawn(async move { every_period(&inner, &stop, claim_beat).await })
    };
    let report_loop = {
        let (inner, stop) = (Arc::clone(&inner), stop.clone());
        tokio::spawn(async move { every_period(&inner, &stop, report).await })
    };
    let limits_loop = {
        let (inner, stop) = (Arc::clone(&inner), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::store::OVERRIDES_REFRESH);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => limits::refresh(&inner).await,
                }
            }
        })
    };
    let mut tasks = vec![broker_loop, claim_loop, report_loop, limits_loop];
    if inner.config.history {
        let (inner, stop) = (Arc::clone(&inner), stop.clone());
        tasks.push(tokio::spawn(super::history::run(inner, stop)));
    }
    Heartbeats { stop, tasks }
}

/// The worker's report for operators (`ferriq workers`): who it is and what it runs; it
/// expires a lease after the last one, so a killed worker disappears by itself.
async fn report(inner: Arc<Inner>) {
    let info = inner.report();
    if let Err(e) = inner.store.report_worker(&info, inner.config.lease).await {
        tracing::debug!(error = %e, "worker report not stored");
    }
}

async fn every_period<F, Fut>(inner: &Arc<Inner>, stop: &CancellationToken, beat: F)
where
    F: Fn(Arc<Inner>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(inner.config.heartbeat_interval());
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => beat(Arc::clone(inner)).await,
        }
    }
}

async fn broker_beat(inner: Arc<Inner>) {
    let mut handles = inner.running.handles();
    let runs = handles.len();
    // Deliveries waiting behind their message group's run keep their leases too.
    handles.extend(inner.ordered.waiting_handles());
    if handles.is_empty() {
        return;
    }
    match inner.broker.extend(&handles, inner.config.lease).await {
        Ok(statuses) => {
            let waiting = statuses.get(runs..).unwrap_or_default();
            for (handle, status) in handles[runs..].iter().zip(waiting) {
                if *status == LeaseStatus::Kept {
                    continue;
                }
                // Not ours any more, or not for much longer: it goes back (a lost one is
                // the broker's already), and what waits behind it must not run before it.
                tracing::warn!(delivery = ?handle, "a delivery waiting for its message group's run cannot be held: handing it back with the ones behind it");
                let mut from = inner.ordered.take_from(handle.key());
                if *status == LeaseStatus::Lost && !from.is_empty() {
                    from.remove(0);
                }
                dispatch::hand_back(&inner, from).await;
            }
            for (handle, status) in handles[..runs].iter().zip(statuses) {
                match status {
                    LeaseStatus::Lost => {
                        tracing::warn!(delivery = ?handle, "broker lease lost: cancelling the run");
                        inner.running.stop(handle.key(), StopReason::DeliveryLost);
                    }
                    LeaseStatus::LimitReached => {
                        tracing::warn!(delivery = ?handle, "the broker cannot hold this message longer: failing the run");
                        inner.running.stop(handle.key(), StopReason::LeaseLimit);
                    }
                    _ => {}
                }
            }
        }
        // The lease may still be running; the next beat tries again.
        Err(e) => tracing::warn!(error = %e, "broker heartbeat failed"),
    }
}

async fn claim_beat(inner: Arc<Inner>) {
    inner.pending.sweep();
    // Concurrency slots live as long as their runs do: renewed with the claims.
    let slots = slots::held_slots(&inner);
    if !slots.is_empty() {
        if let Err(e) = inner.store.renew_slots(&slots, inner.config.lease).await {
            tracing::warn!(error = %e, "could not renew concurrency slots");
        }
    }
    let entries = inner.running.claims();
    if entries.is_empty() {
        return;
    }
    let claims: Vec<_> = entries
        .iter()
        .map(|(_, id, token)| (id.clone(), *token))
        .collect();
    let sent = Instant::now();
    match inner.store.heartbeat(&claims, inner.config.lease).await {
        Ok(leases) => {
            let mut renewed = Vec::with_capacity(entries.len());
            for ((key, id, _), lease) in entries.iter().zip(leases) {
                match lease {
                    ClaimLease::Kept => renewed.push(*key),
                    ClaimLease::Revoked => {
                        tracing::info!(task_id = %id, "task revoked while running: cancelling the run");
                        inner.running.stop(*key, StopReason::Revoked);
                    }
                    _ => {
                        tracing::warn!(task_id = %id, "claim lost to another worker: cancelling the run");
                        inner.running.stop(*key, StopReason::ClaimLost);
                    }
                }
            }
            inner.running.renewed(&renewed, sent);
        }
        Err(e) => {
            // This worker may be the only one cut off from the store: a claim whose lease
            // would run out before the next beat can be taken by another worker, so the run
            // stops here first.
            tracing::warn!(error = %e, "claim heartbeat failed");
            let interval = inner.config.heartbeat_interval();
            let horizon = Instant::now() + interval + interval / 2;
            let Some(expiring) = horizon.checked_sub(inner.config.lease) else {
                return;
            };
            for key in inner.running.unrenewed_since(expiring) {
                tracing::warn!("claim lease may have run out while the store was unreachable: cancelling the run");
                inner.running.stop(key, StopReason::StoreUnreachable);
            }
        }
    }
}
