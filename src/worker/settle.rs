//! Settling a delivery: the fenced result write, then ack / release / dead-letter; and the
//! error results of messages that cannot run.

use std::time::Duration;

use tokio::time::Instant;

use super::delivery::{PendingResult, Settle};
use super::running::Outcome;
use super::Inner;
use crate::broker::{BrokerError, DeadLetter, DeadLetterReason, Delivery};
use crate::store::{ClaimOutcome, CompleteOutcome, DeadEntry, ResultStatus, StoreError, Token};
use crate::wire::{ErrorKind, TaskId, TaskMessage, TaskResult};

/// Why writing an error result for an unrunnable message did not happen now.
enum NotWritten {
    /// A valid copy of the task is running elsewhere; try again later.
    Busy(Duration),
    /// The store failed.
    Store(StoreError),
}

impl Inner {
    /// The fenced result write, then the message's settlement.
    pub(crate) async fn finish(
        &self,
        d: &Delivery,
        msg: &TaskMessage,
        token: Token,
        result: Option<TaskResult>,
        settle: Settle,
        outcome: Outcome,
    ) -> Outcome {
        self.finish_returning(d, msg, token, result, settle, outcome)
            .await
            .0
    }

    /// [`Inner::finish`], handing the result back when it was written (for the middleware's
    /// `after_result`, without a copy).
    pub(crate) async fn finish_returning(
        &self,
        d: &Delivery,
        msg: &TaskMessage,
        token: Token,
        result: Option<TaskResult>,
        settle: Settle,
        outcome: Outcome,
    ) -> (Outcome, Option<TaskResult>) {
        let reply_to = msg.labels.reply_to();
        if let Some(channel) = reply_to {
            self.check_reply_channel(msg, channel);
        }
        // Before the write that wakes the waiters: one that enqueues the same call again once
        // its wait returns sends a new task. (If the write is then fenced off or fails, the task
        // runs on with its key free: a second enqueue meanwhile sends a second task.)
        self.release_dedup(msg).await;
        match self
            .store
            .complete(&msg.task_id, token, result.as_ref(), reply_to)
            .await
        {
            Ok(written @ (CompleteOutcome::Stored | CompleteOutcome::AlreadyStored)) => {
                if let (CompleteOutcome::Stored, Some(r)) = (written, &result) {
                    self.counters.result_written(&msg.task_name, r.is_err);
                    self.note_finished(msg, r.is_err);
                }

                if !self.advance_workflow(msg, result.as_ref()).await {
                    let released = self
                        .release(d, self.advance_retry(), Outcome::Released)
                        .await;
                    return (released, None);
                }
                (self.settle_message(d, &settle, outcome).await, result)
            }
            Ok(CompleteOutcome::Revoked) => {
                tracing::info!("task revoked while it ran: its result is not stored");
                (Box::pin(self.revoked(d, msg)).await, None)
            }
            Ok(_) => {
                // Fenced off: another holder owns the task and its message now.
                tracing::warn!("result write rejected: the claim was taken over; not acking");
                (
                    self.release(d, self.config.min_defer, Outcome::Stale).await,
                    None,
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, "result store unreachable: keeping the result for the redelivery");
                self.keep_pending(
                    &msg.task_id,
                    PendingResult {
                        token,
                        result,
                        settle,
                        outcome,
                        kept_at: Instant::now(),
                    },
                );
                let released = self
                    .release(d, self.config.store_retry_after, Outcome::Released)
                    .await;
                (released, None)
            }
        }
    }

    /// Gives back the deduplication key an enqueue reserved for this task while it was queued
    /// or running (`ferriq_dedup_mode` `active`): its outcome is stored, so the next enqueue
    /// of the key sends a new task. A key kept for its whole window stays.
    async fn release_dedup(&self, msg: &TaskMessage) {
        let Some(key) = msg.labels.get(crate::wire::names::DEDUP_KEY) else {
            return;
        };
        // A key kept for its window stays; a debounced task gave its key up when it was let
        // run.
        let kept = msg
            .labels
            .get(crate::wire::names::DEDUP_MODE)
            .is_some_and(|m| m.header_value() != crate::task::Dedup::WhileActive.as_str());
        if kept {
            return;
        }
        if let Err(e) = self
            .store
            .release_dedup(&key.header_value(), &msg.task_id)
            .await
        {
            tracing::warn!(error = %e, "could not give the deduplication key back; it lasts its window");
        }
    }

    /// Warns, once per worker, of a message from a client whose store has another result prefix:
    /// that client's `status()` and fresh waits never find the results written here.
    fn check_reply_channel(&self, msg: &TaskMessage, channel: &str) {
        use std::sync::atomic::Ordering;
        if self.store.reads_results_here(channel)
            || self.warned_foreign_client.swap(true, Ordering::Relaxed)
        {
            return;
        }
        tracing::warn!(
            task_name = %msg.task_name,
            task_id = %msg.task_id,
            "this task's client waits for results under another key prefix than this worker \
             writes them (its reply channel {channel:?}): give the client and the workers the \
             same FERRIQ_RESULT_PREFIX, or the client's status() and later waits find nothing \
             (reported once)"
        );
    }

    /// A copy of a finished task: acked, unless the task failed for good, in which case the
    /// copy is parked too. A failed task's first copy may never have reached the dead-letter
    /// queue (the worker died between the result write and the dead-letter).
    pub(crate) async fn duplicate_of_finished(&self, d: &Delivery, msg: &TaskMessage) -> Outcome {
        let stored = match self.store.get(&msg.task_id).await {
            Ok(ResultStatus::Ready(r)) => Some(r),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "result store unreachable: releasing the duplicate");
                return self
                    .release(d, self.config.store_retry_after, Outcome::Released)
                    .await;
            }
        };
        // The copy of a workflow's member or step: its first copy's worker may have died
        // between storing the outcome and acting on it.
        if !self.advance_workflow(msg, stored.as_ref()).await {
            return self
                .release(d, self.advance_retry(), Outcome::Released)
                .await;
        }
        let failure = stored.as_ref().and_then(TaskResult::failure_details);
        // A task with `park_fatal = false` answered its own fatal errors with the result alone.
        let parks_fatal = self
            .registry
            .get(&msg.task_name)
            .is_none_or(|t| t.options().get_park_fatal());
        // An expired schedule tick is answered and acked, never parked (see `expired`).
        let tick = msg.labels.get(crate::wire::names::SCHEDULE).is_some();
        let park = failure.filter(|f| {
            let answered = (f.kind == Some(ErrorKind::TaskError) && !f.retryable && !parks_fatal)
                || (f.kind == Some(ErrorKind::DeadlineExceeded) && tick);
            f.kind != Some(ErrorKind::Cancelled) && !answered
        });
        match park {
            Some(f) => {
                let reason = match f.kind {
                    Some(ErrorKind::RetriesExhausted | ErrorKind::Timeout) => {
                        DeadLetterReason::RetriesExhausted
                    }
                    Some(ErrorKind::InvalidMessage) => DeadLetterReason::InvalidMessage,
                    Some(ErrorKind::UnknownTask) => DeadLetterReason::UnknownTask,
                    Some(ErrorKind::DeadlineExceeded) => DeadLetterReason::Expired,
                    _ => DeadLetterReason::NonRetryable,
                };
                let name = TaskMessage::peek_task_name(&d.body);
                let why = DeadLetter::new(reason, f.message, name, f.attempts);
                match self.park(d, &why).await {
                    Ok(()) => Outcome::Duplicate,
                    Err(e) => self.broker_failed("dead-letter", e),
                }
            }
            None => self.ack(d, Outcome::Duplicate).await,
        }
    }

    /// Writes an error result through the claim (so it is written once) and dead-letters the
    /// message. While the store is down or a valid copy runs elsewhere, the message is
    /// released to try again, up to twice the unroutable limit; then it is parked without a
    /// result rather than looped.
    pub(crate) async fn reject_with_result(
        &self,
        d: &Delivery,
        id: Option<TaskId>,
        reason: DeadLetterReason,
        kind: ErrorKind,
        detail: String,
        task_name: Option<String>,
    ) -> Outcome {
        if let Some(id) = id {
            let result =
                TaskResult::failure(kind, detail.clone(), false, 0, 0.0, Default::default());
            let retries_left =
                d.receive_count < self.config.max_unroutable_receives.saturating_mul(2);
            match self.write_unclaimed_failure(&id, &result).await {
                Ok(()) => {}
                Err(NotWritten::Busy(after)) if retries_left => {
                    return self.release(d, after, Outcome::Deferred).await;
                }
                Err(NotWritten::Store(e)) if retries_left => {
                    tracing::warn!(error = %e, "store unreachable: releasing to write the error result later");
                    return self
                        .release(d, self.config.store_retry_after, Outcome::Released)
                        .await;
                }
                Err(_) => {
                    tracing::error!("could not write the error result; dead-lettering without it")
                }
            }
        }
        let why = DeadLetter::new(reason, detail, task_name, 0);
        self.dead_letter(d, &why).await
    }

    async fn write_unclaimed_failure(
        &self,
        id: &TaskId,
        result: &TaskResult,
    ) -> Result<(), NotWritten> {
        let claim = self
            .store
            .claim(id, &self.config.worker_id, self.config.lease, None)
            .await
            .map_err(NotWritten::Store)?;
        match claim {
            ClaimOutcome::Run { token, .. } | ClaimOutcome::Expired { token } => {
                if let Err(e) = self.store.complete(id, token, Some(result), None).await {
                    // Do not leave our claim in the way of the next try.
                    self.release_claim(id, token).await;
                    return Err(NotWritten::Store(e));
                }
                Ok(())
            }
            ClaimOutcome::Defer { retry_after } => Err(NotWritten::Busy(retry_after)),
            // Already answered.
            ClaimOutcome::Done | ClaimOutcome::Revoked => Ok(()),
        }
    }

    pub(crate) async fn settle_message(
        &self,
        d: &Delivery,
        settle: &Settle,
        outcome: Outcome,
    ) -> Outcome {
        match settle {
            Settle::Ack => self.ack(d, outcome).await,
            Settle::DeadLetter(why) => match self.park(d, why).await {
                Ok(()) => outcome,
                Err(e) => self.broker_failed("dead-letter", e),
            },
        }
    }

    pub(crate) async fn ack(&self, d: &Delivery, outcome: Outcome) -> Outcome {
        match self.broker.ack(&d.handle).await {
            Ok(()) => outcome,
            Err(e) => self.broker_failed("ack", e),
        }
    }

    /// Gives the message back after `after`, never sooner than `min_defer`: every receive
    /// costs (SQS counts it toward the redrive limit), so nothing is released for 0 s except a
    /// drain's hand-back.
    pub(crate) async fn release(&self, d: &Delivery, after: Duration, outcome: Outcome) -> Outcome {
        self.release_after(d, after.max(self.config.min_defer), outcome)
            .await
    }

    /// Gives the message back visible at once (a drain's leftovers, for another worker).
    pub(crate) async fn release_now(&self, d: &Delivery, outcome: Outcome) -> Outcome {
        self.release_after(d, Duration::ZERO, outcome).await
    }

    pub(crate) async fn release_after(
        &self,
        d: &Delivery,
        after: Duration,
        outcome: Outcome,
    ) -> Outcome {
        match self.broker.release(&d.handle, after).await {
            Ok(()) => outcome,
            Err(e) => self.broker_failed("release", e),
        }
    }

    /// Dead-letters the message, then tells the middleware.
    async fn park(&self, d: &Delivery, why: &DeadLetter) -> Result<(), crate::broker::BrokerError> {
        self.broker.dead_letter(d, why).await?;
        self.index_dead(d, why).await;
        if !self.middleware.is_empty() {
            let id = d
                .task_id
                .as_deref()
                .and_then(|s| TaskId::parse(s).ok())
                .or_else(|| TaskMessage::peek_task_id(&d.body));
            let dead = crate::middleware::DeadLettered {
                task_id: id.as_ref(),
                task_name: why.task_name.as_deref(),
                lane: &d.queue,
                reason: why.reason,
                detail: &why.detail,
                attempts: why.attempts,
            };
            self.middleware.on_dead_letter(&dead).await;
        }
        Ok(())
    }

    /// Adds a parked message to the store's dead-letter index. Only what an operator's page
    /// lists depends on it: a failure is logged, and a re-index finds the letter in its queue.
    async fn index_dead(&self, d: &Delivery, why: &DeadLetter) {
        let task_id = d.task_id.as_deref().and_then(|s| TaskId::parse(s).ok());
        let mut entry = DeadEntry::new(d.queue.as_str(), task_id, &d.body)
            .reason(why.reason.as_str())
            .detail(&why.detail)
            .attempts(why.attempts)
            .dead_at_ms(self.config.clock.now_unix_ms());
        if let (None, Some(name)) = (&entry.task_name, &why.task_name) {
            entry = entry.task_name(name.as_str());
        }
        if let Err(e) = self.store.index_dead(&[entry]).await {
            tracing::warn!(error = %e, lane = %d.queue,
                "could not add the dead letter to the store's index; it is parked, and a re-index lists it");
        }
    }

    pub(crate) async fn dead_letter(&self, d: &Delivery, why: &DeadLetter) -> Outcome {
        match self.park(d, why).await {
            Ok(()) => Outcome::DeadLettered,
            Err(e) => self.broker_failed("dead-letter", e),
        }
    }

    fn broker_failed(&self, op: &str, e: BrokerError) -> Outcome {
        // Nothing is lost: an unsettled message comes back (its lease runs out, or its broker
        // puts it back).
        tracing::warn!(error = %e, op, "broker call failed; the message will be redelivered");
        Outcome::BrokerError
    }

    /// Releases a claim in the background, retrying while the store is unreachable (for up to
    /// a lease: after that the claim has run out anyway).
    pub(crate) fn release_claim_later(&self, id: TaskId, token: Token) {
        let claims = std::sync::Arc::clone(&self.store);
        let lease = self.config.lease;
        tokio::spawn(async move {
            let deadline = Instant::now() + lease;
            while Instant::now() < deadline {
                if claims.release(&id, token).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    pub(crate) async fn release_claim(&self, id: &TaskId, token: Token) {
        if let Err(e) = self.store.release(id, token).await {
            tracing::warn!(error = %e, "could not release the claim; it expires with its lease");
        }
    }
}
