//! The store traits on Valkey: claims through the claim batcher and scripts, results
//! written and awaited (announcements on the reply channel, re-reads as the safety net).

use std::time::Duration;

use async_trait::async_trait;
use ferriq::broker::Health;
use ferriq::store::{
    ClaimLease, ClaimOutcome, ClaimState, ClaimStore, CompleteOutcome, FailureRecord,
    ProgressStore, ResultStatus, ResultStore, StoreError, Token,
};
use ferriq::wire::{TaskId, TaskResult};
use fred::bytes_utils::Str;
use fred::prelude::ClientLike;
use tokio::time::Instant;

use crate::claims::CompleteCall;

use super::ValkeyStore;

#[async_trait]
impl ClaimStore for ValkeyStore {
    async fn claim(
        &self,
        id: &TaskId,
        worker: &str,
        lease: Duration,
        deadline_at: Option<f64>,
    ) -> Result<ClaimOutcome, StoreError> {
        let call = self.inner.core.claim_call(id, worker, lease, deadline_at);
        match &self.inner.claims {
            Some(batcher) => batcher.call(call).await,
            None => single(self.inner.core.claim_many(vec![call]).await),
        }
    }

    async fn heartbeat(
        &self,
        claims: &[(TaskId, Token)],
        lease: Duration,
    ) -> Result<Vec<ClaimLease>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let core = &self.inner.core;
        if !self.inner.clustered {
            return core.heartbeat(claims, lease).await;
        }
        // In a cluster a script's keys must share a slot: one call per slot, all at once (a
        // worker's claims spread over every slot). Any failed slot fails the call, as off
        // cluster: the worker then treats the store as unreachable for this beat.
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, (id, _)) in claims.iter().enumerate() {
            let slot = fred::util::redis_keyslot(core.keys.claim(id).as_bytes());
            by_slot.entry(slot).or_default().push(i);
        }
        let calls = by_slot.values().map(|indexes| async move {
            let group: Vec<_> = indexes.iter().map(|i| claims[*i].clone()).collect();
            core.heartbeat(&group, lease)
                .await
                .map(|kept| (indexes, kept))
        });
        let mut kept = vec![ClaimLease::Lost; claims.len()];
        for answer in futures_util::future::join_all(calls).await {
            let (indexes, group_kept) = answer?;
            for (i, k) in indexes.iter().zip(group_kept) {
                kept[*i] = k;
            }
        }
        Ok(kept)
    }

    async fn release(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.core.release(id, token, false).await
    }

    async fn release_interrupted(&self, id: &TaskId, token: Token) -> Result<bool, StoreError> {
        self.inner.core.release(id, token, true).await
    }

    async fn record_failure(&self, id: &TaskId, token: Token) -> Result<FailureRecord, StoreError> {
        self.inner.core.record_failure(id, token).await
    }

    async fn health(&self) -> Health {
        let client = self.inner.core.pool.next();
        let limit = self.inner.core.settings.command_timeout;
        match tokio::time::timeout(limit, client.ping::<fred::types::Value>(None)).await {
            Ok(Ok(_)) => Health::Healthy,
            Ok(Err(e)) => Health::Unhealthy(format!("Valkey/Redis: {}", e.details())),
            Err(_) => {
                Health::Unhealthy(format!("Valkey/Redis did not answer PING within {limit:?}"))
            }
        }
    }

    async fn close(&self) {
        ValkeyStore::close(self).await
    }
}

/// The one answer of a one-call batch.
fn single<T>(answers: Result<Vec<Result<T, StoreError>>, StoreError>) -> Result<T, StoreError> {
    answers?
        .pop()
        .unwrap_or_else(|| Err(StoreError::Unavailable("valkey answered no result".into())))
}

impl ValkeyStore {
    /// A completion's call: the result as JSON, announced on `reply_to` or the task's own
    /// channel.
    pub(crate) fn complete_call(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteCall, StoreError> {
        let result =
            result
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!("result cannot be written as JSON: {e}"),
                })?;
        let channel = reply_to
            .map(str::to_owned)
            .unwrap_or_else(|| self.inner.core.keys.done_channel(id));
        let (result, channel) = (result.map(Str::from), Str::from(channel));
        Ok(CompleteCall {
            id: id.clone(),
            token,
            result,
            channel,
        })
    }
}

#[async_trait]
impl ResultStore for ValkeyStore {
    async fn complete(
        &self,
        id: &TaskId,
        token: Token,
        result: Option<&TaskResult>,
        reply_to: Option<&str>,
    ) -> Result<CompleteOutcome, StoreError> {
        let call = self.complete_call(id, token, result, reply_to)?;
        match &self.inner.completes {
            Some(batcher) => batcher.call(call).await,
            None => single(self.inner.core.complete_many(vec![call]).await),
        }
    }

    async fn get(&self, id: &TaskId) -> Result<ResultStatus, StoreError> {
        let key = self.inner.core.keys.result(id);
        let stored = match &self.inner.reads {
            Some(reads) => reads.call(key).await?,
            None => self.inner.core.read(key).await?,
        };
        match stored {
            None => Ok(ResultStatus::Pending),
            Some(raw) => serde_json::from_str(&raw)
                .map(ResultStatus::Ready)
                .map_err(|e| StoreError::Corrupt {
                    task_id: id.to_string(),
                    reason: format!(
                        "not a taskiq JSON result ({e}); a Python writer must use JSONSerializer"
                    ),
                }),
        }
    }

    async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<ResultStatus, StoreError> {
        let guard = self.inner.waiters.register(id.as_str());
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        // Completions announced on this process's reply channel wake the waiter at once. A
        // task enqueued without a reply_to (by a Python producer) is announced on its own
        // channel: a wait still unanswered after the first re-read subscribes there too, so
        // only waits longer than that pay a subscription. A task another ferriq process
        // enqueued is announced on that process's channel: re-reads find it (the safety net).
        let mut recheck = Duration::from_millis(100).min(self.inner.core.settings.recheck_interval);
        // A task this process enqueued carries its reply channel: a worker announces it there,
        // never on the task's channel (a Python worker announces nowhere), so no subscription.
        let mut on_task_channel = self.inner.waiters.is_announced_here(id.as_str());
        // The first wait for such a task, not yet announced, sleeps without reading first: its
        // completion is announced to this process. One announced before the wait was kept for
        // it, or read (when `early` forgot it). (A Python worker announces nowhere: its
        // result is found by the re-read.)
        // A short wait (a poll) reads at once: it may end before any re-read.
        let expects_announcement = self.inner.waiters.first_wait_here(id.as_str());
        let mut read_first = !expects_announcement || timeout <= recheck;
        loop {
            // Listen before reading, so a completion in between is not missed.
            let notified = guard.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The completion announced here carried the stored result: no read needed.
            if let Some(json) = guard.announced_result() {
                if let Ok(result) = serde_json::from_str(&json) {
                    return Ok(ResultStatus::Ready(result));
                }
            }
            let announced = guard.was_announced();
            let read = read_first || announced;
            read_first = true;
            let status = if read {
                self.get(id).await
            } else {
                Ok(ResultStatus::Pending)
            };
            match status {
                Ok(ResultStatus::Ready(r)) => return Ok(ResultStatus::Ready(r)),
                // Announced and no result: finished without one (`store_result = false`, or it
                // expired at once). When its claim agrees, the rest of the wait cannot change
                // that: `Pending` now, as the memory store answers. (A claim that does not agree
                // — lost with a failed-over primary — leaves the wait to run on.)
                Ok(_) if announced => {
                    if let Some(status) = self.finished_without_result(id).await {
                        return Ok(status);
                    }
                }
                Ok(_) => {}
                // A blip of the store is not the end of a long wait: keep trying.
                Err(StoreError::Unavailable(e)) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "result read failed while waiting; retrying");
                }
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(ResultStatus::Pending);
            }
            // While completions reach this process, the one this wait expects will too: the
            // re-read is only the safety net (see `announcements_flowing`).
            let next_read = if expects_announcement && self.inner.waiters.announcements_flowing() {
                self.inner.core.settings.recheck_interval.max(recheck)
            } else {
                recheck
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline.min(now + next_read)) => {
                    recheck = (recheck * 2).min(self.inner.core.settings.recheck_interval);
                    // Not for a wait about to end anyway: no subscription churn for short polls.
                    if !on_task_channel && Instant::now() + recheck < deadline {
                        on_task_channel = true;
                        let channel = self.inner.core.keys.done_channel(id);
                        // Bounded by the next re-read (which is before the deadline): a stalled
                        // subscriber connection must not hold the wait, and the loop reads right
                        // after, so a completion meanwhile is not missed.
                        let _ = tokio::time::timeout(recheck, guard.listen_on_task_channel(channel)).await;
                    }
                }
            }
        }
    }

    async fn revoke(&self, id: &TaskId, result: &TaskResult) -> Result<bool, StoreError> {
        let revoked = self.inner.core.revoke(id, result).await?;
        if revoked {
            self.inner.waiters.wake(id.as_str());
        }
        Ok(revoked)
    }

    fn reply_channel(&self) -> Option<String> {
        Some(self.inner.reply_channel.clone())
    }

    fn reply_channel_for(&self, id: &TaskId) -> Option<String> {
        self.inner.waiters.announced_here(id.as_str());
        Some(self.inner.reply_channel.clone())
    }

    fn reads_results_here(&self, reply_to: &str) -> bool {
        self.inner.core.keys.owns_reply_channel(reply_to)
    }
}

impl ValkeyStore {
    /// After a completion was announced and no result was read: what the wait answers now,
    /// when the task's claim says it will not run again (done or revoked) — the result read
    /// once more (one stored in between is not reported missing), else `Pending`, for good.
    /// `None` (wait on) when the claim does not say so, or cannot be read.
    async fn finished_without_result(&self, id: &TaskId) -> Option<ResultStatus> {
        match self.claim_info(id).await {
            Ok(Some(c)) if matches!(c.state, ClaimState::Done | ClaimState::Revoked) => {
                self.get(id).await.ok()
            }
            _ => None,
        }
    }
}
