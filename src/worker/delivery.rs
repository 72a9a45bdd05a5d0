//! What the worker does with one delivery: DESIGN §6, row by row.

use std::future::pending;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::field::Empty;
use tracing::Instrument;

use super::running::{Outcome, Running, StopReason};
use super::Inner;
use crate::broker::{BrokerError, DeadLetter, DeadLetterReason, Delivery};
use crate::store::{ClaimOutcome, CompleteOutcome, FailureRecord, Token};
use crate::task::{Invocation, TaskContext, TaskError, TaskOptions, TaskRegistration};
use crate::wire::{ErrorKind, TaskId, TaskMessage, TaskResult, WIRE_VERSION};

/// What to do with the message once its result is stored.
#[derive(Debug, Clone)]
pub(crate) enum Settle {
    Ack,
    DeadLetter(DeadLetter),
}

/// A result computed while the store was unreachable: written on the message's redelivery
/// with the claim token it was computed under (DESIGN §6, "Valkey unreachable at complete").
#[derive(Debug)]
pub(crate) struct PendingResult {
    token: Token,
    result: Option<TaskResult>,
    settle: Settle,
    outcome: Outcome,
}

/// How a run ended.
enum RunEnd {
    Value(serde_json::Value),
    Error(TaskError),
    TimedOut(Duration),
    Stopped(StopReason),
}

impl Inner {
    /// Settles one delivery, inside a span that records the task and the outcome.
    pub(crate) async fn process(self: Arc<Self>, d: Delivery) {
        let span = tracing::info_span!(
            "ferriq.delivery",
            queue = %d.queue,
            receive_count = d.receive_count,
            task_id = Empty,
            task_name = Empty,
            attempt = Empty,
            outcome = Empty,
        );
        let outcome = self.settle(&d).instrument(span.clone()).await;
        span.record("outcome", outcome.as_str());
        self.counters.record(outcome);
        tracing::debug!(parent: &span, outcome = outcome.as_str(), "delivery settled");
    }

    async fn settle(&self, d: &Delivery) -> Outcome {
        let config = &self.config;
        if d.body.len() > config.max_payload {
            let detail = format!(
                "body is {} bytes, over the {}-byte limit",
                d.body.len(),
                config.max_payload
            );
            let id = d.task_id.as_deref().and_then(|s| TaskId::parse(s).ok());
            return self
                .reject_unreadable(d, id, DeadLetterReason::TooLarge, detail)
                .await;
        }
        let msg = match TaskMessage::from_json(&d.body) {
            Ok(msg) => msg,
            Err(e) => {
                let id = TaskMessage::peek_task_id(&d.body)
                    .or_else(|| d.task_id.as_deref().and_then(|s| TaskId::parse(s).ok()));
                return self
                    .reject_unreadable(d, id, DeadLetterReason::InvalidMessage, e.to_string())
                    .await;
            }
        };
        let span = tracing::Span::current();
        span.record("task_id", msg.task_id.as_str());
        span.record("task_name", msg.task_name.as_str());

        let version = msg.labels.wire_version();
        if version > WIRE_VERSION {
            let detail =
                format!("wire version {version} is newer than this worker's {WIRE_VERSION}");
            if d.receive_count >= config.max_unroutable_receives {
                let why = DeadLetter::new(
                    DeadLetterReason::UnsupportedWireVersion,
                    detail,
                    Some(msg.task_name.clone()),
                    0,
                );
                return self.dead_letter(d, &why).await;
            }
            tracing::warn!(%detail, "releasing for a newer worker");
            return self
                .release(d, config.unsupported_release, Outcome::Released)
                .await;
        }

        let Some(task) = self.registry.get(&msg.task_name) else {
            if d.receive_count >= config.max_unroutable_receives {
                let detail = format!("no worker serves task {:?}", msg.task_name);
                return self
                    .reject_with_result(
                        d,
                        Some(msg.task_id.clone()),
                        DeadLetterReason::UnknownTask,
                        ErrorKind::UnknownTask,
                        detail,
                        Some(msg.task_name.clone()),
                    )
                    .await;
            }
            tracing::debug!("task not served here: releasing for another lane");
            return self
                .release(d, config.unknown_task_release, Outcome::Released)
                .await;
        };

        let pending = self.lock_pending().remove(&msg.task_id);
        if let Some(p) = pending {
            if let Some(outcome) = self.store_pending(d, &msg, p).await {
                return outcome;
            }
        }

        let claim = self
            .claims
            .claim(
                &msg.task_id,
                &config.worker_id,
                config.lease,
                msg.labels.deadline_at(),
            )
            .await;
        match claim {
            Err(e) => {
                // Release first: nothing to give back on the claim side, and the message must
                // not wait on a store that may hang.
                tracing::warn!(error = %e, "claim store unreachable: releasing the message");
                self.release(d, config.store_retry_after, Outcome::Released)
                    .await
            }
            Ok(ClaimOutcome::Done) => self.ack(d, Outcome::Duplicate).await,
            Ok(ClaimOutcome::Revoked) => self.ack(d, Outcome::Revoked).await,
            Ok(ClaimOutcome::Defer { retry_after }) => {
                let after = retry_after.max(config.min_defer);
                self.release(d, after, Outcome::Deferred).await
            }
            Ok(ClaimOutcome::Expired { token }) => {
                let result = TaskResult::failure(
                    ErrorKind::DeadlineExceeded,
                    "the task's deadline passed before it could start",
                    false,
                    0,
                    0.0,
                    msg.labels.to_json_map(),
                );
                self.finish(d, &msg, token, Some(result), Settle::Ack, Outcome::Expired)
                    .await
            }
            Ok(ClaimOutcome::Run { token, failures }) => {
                self.run(d, msg, task, token, failures).await
            }
        }
    }

    /// Runs a claimed task under its timeout and cancellation, then settles the outcome.
    async fn run(
        &self,
        d: &Delivery,
        mut msg: TaskMessage,
        task: &'static TaskRegistration,
        token: Token,
        failures: u32,
    ) -> Outcome {
        let opts = task.options();
        // A message re-sent by taskiq's retry middleware carries its earlier failures.
        let earlier = failures.max(msg.labels.retries().unwrap_or(0));
        let attempt = earlier.saturating_add(1);
        let max_attempts = msg.labels.max_retries().unwrap_or(opts.get_max_attempts());
        let retry_allowed = msg
            .labels
            .retry_on_error()
            .unwrap_or(opts.get_retry_on_error());
        let timeout = msg.labels.timeout().or(opts.get_timeout());
        tracing::Span::current().record("attempt", attempt);

        let cancel = CancellationToken::new();
        let reason = Arc::new(OnceLock::new());
        self.running.insert(Running {
            task_id: msg.task_id.clone(),
            token,
            handle: d.handle.clone(),
            cancel: cancel.clone(),
            reason: Arc::clone(&reason),
        });
        self.counters.started();
        let ctx = TaskContext::new(
            msg.task_id.clone(),
            msg.task_name.clone(),
            attempt,
            max_attempts,
            d.receive_count,
            msg.labels.clone(),
            msg.labels.deadline_at(),
            cancel.clone(),
        );
        let invocation = Invocation::new(
            ctx,
            std::mem::take(&mut msg.args),
            std::mem::take(&mut msg.kwargs),
            Arc::clone(&self.state),
        );
        let started = Instant::now();
        // A separate task, so a panic is caught as a JoinError and the worker keeps running.
        let mut join = tokio::spawn((task.run)(invocation).in_current_span());
        let end = tokio::select! {
            joined = &mut join => match joined {
                Ok(Ok(value)) => RunEnd::Value(value),
                Ok(Err(e)) => RunEnd::Error(e),
                Err(e) if e.is_panic() => RunEnd::Error(TaskError::retryable(format!(
                    "the task panicked: {}", panic_message(e.into_panic())
                ))),
                Err(_) => RunEnd::Stopped(StopReason::Shutdown),
            },
            _ = cancel.cancelled() => RunEnd::Stopped(reason.get().copied().unwrap_or(StopReason::Shutdown)),
            _ = sleep_or_never(timeout) => RunEnd::TimedOut(timeout.unwrap_or_default()),
        };
        if !join.is_finished() {
            // The run must be over before the message or claim is given back, or a second run
            // could overlap it.
            cancel.cancel();
            join.abort();
            let _ = (&mut join).await;
        }
        self.running.remove(d.handle.key());
        let elapsed = started.elapsed();
        self.counters.ran_for(elapsed.as_micros() as u64);
        let secs = elapsed.as_secs_f64();

        let error = match end {
            RunEnd::Value(value) => {
                let result = opts
                    .get_store_result()
                    .then(|| TaskResult::success(value, secs, msg.labels.to_json_map()));
                return self
                    .finish(d, &msg, token, result, Settle::Ack, Outcome::Succeeded)
                    .await;
            }
            RunEnd::Stopped(why) => return self.stopped(d, &msg.task_id, token, why).await,
            RunEnd::Error(e) => e,
            RunEnd::TimedOut(limit) => TaskError::with_kind(
                ErrorKind::Timeout,
                format!("the run exceeded its {limit:?} timeout"),
                true,
            ),
        };

        let retryable = error.is_retryable() && retry_allowed;
        if retryable && attempt < max_attempts {
            let delay = self.backoff(opts, attempt);
            tracing::info!(error = %error, attempt, max_attempts, retry_in = ?delay, "run failed; will retry");
            return match self.claims.record_failure(&msg.task_id, token).await {
                Ok(FailureRecord::Recorded { .. }) => {
                    self.release(d, delay, Outcome::Retried).await
                }
                Ok(_) => {
                    self.release(d, self.config.min_defer, Outcome::ClaimLost)
                        .await
                }
                Err(e) => {
                    // The attempt goes uncounted; the broker's own redrive limit bounds that.
                    tracing::warn!(error = %e, "could not record the failure; releasing anyway");
                    self.release(d, delay, Outcome::Retried).await
                }
            };
        }
        let (kind, reason) = if error.is_retryable() && retry_allowed {
            let kind = if error.kind() == ErrorKind::Timeout {
                ErrorKind::Timeout
            } else {
                ErrorKind::RetriesExhausted
            };
            (kind, DeadLetterReason::RetriesExhausted)
        } else {
            (error.kind(), DeadLetterReason::NonRetryable)
        };
        tracing::warn!(error = %error, attempt, max_attempts, "run failed for good");
        let result = TaskResult::failure(
            kind,
            error.message(),
            error.is_retryable(),
            attempt,
            secs,
            msg.labels.to_json_map(),
        );
        let why = DeadLetter::new(
            reason,
            error.message(),
            Some(msg.task_name.clone()),
            attempt,
        );
        self.finish(
            d,
            &msg,
            token,
            Some(result),
            Settle::DeadLetter(why),
            Outcome::Failed,
        )
        .await
    }

    /// A run stopped from outside (DESIGN §6 heartbeat and shutdown rows).
    async fn stopped(&self, d: &Delivery, id: &TaskId, token: Token, why: StopReason) -> Outcome {
        match why {
            StopReason::DeliveryLost => {
                // The message is someone else's now: write nothing, free the claim for them.
                self.release_claim(id, token).await;
                Outcome::DeliveryLost
            }
            StopReason::ClaimLost => {
                self.release(d, self.config.min_defer, Outcome::ClaimLost)
                    .await
            }
            StopReason::Shutdown => {
                let outcome = self
                    .release(d, Duration::ZERO, Outcome::ShutdownReleased)
                    .await;
                self.release_claim(id, token).await;
                outcome
            }
        }
    }

    /// The fenced result write, then the message's settlement.
    async fn finish(
        &self,
        d: &Delivery,
        msg: &TaskMessage,
        token: Token,
        result: Option<TaskResult>,
        settle: Settle,
        outcome: Outcome,
    ) -> Outcome {
        let reply_to = msg.labels.reply_to();
        match self
            .results
            .complete(&msg.task_id, token, result.as_ref(), reply_to)
            .await
        {
            Ok(CompleteOutcome::Stored | CompleteOutcome::AlreadyStored) => {
                self.settle_message(d, &settle, outcome).await
            }
            Ok(_) => {
                // Fenced off: another holder owns the task and its message now.
                tracing::warn!("result write rejected: the claim was taken over; not acking");
                self.release(d, self.config.min_defer, Outcome::Stale).await
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
                    },
                );
                self.release(d, self.config.store_retry_after, Outcome::Released)
                    .await
            }
        }
    }

    /// Stores a result kept from a run while the store was down. `None` when the write was
    /// fenced off and the delivery should go through the claim as usual.
    async fn store_pending(
        &self,
        d: &Delivery,
        msg: &TaskMessage,
        p: PendingResult,
    ) -> Option<Outcome> {
        let reply_to = msg.labels.reply_to();
        match self
            .results
            .complete(&msg.task_id, p.token, p.result.as_ref(), reply_to)
            .await
        {
            Ok(CompleteOutcome::Stored | CompleteOutcome::AlreadyStored) => {
                Some(self.settle_message(d, &p.settle, p.outcome).await)
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "result store still unreachable");
                self.keep_pending(&msg.task_id, p);
                Some(
                    self.release(d, self.config.store_retry_after, Outcome::Released)
                        .await,
                )
            }
        }
    }

    /// A body that cannot be run (malformed, too large): answer the waiter if an id can be
    /// read, then park the message.
    async fn reject_unreadable(
        &self,
        d: &Delivery,
        id: Option<TaskId>,
        reason: DeadLetterReason,
        detail: String,
    ) -> Outcome {
        tracing::warn!(%detail, reason = reason.as_str(), "unreadable message");
        let name = TaskMessage::peek_task_name(&d.body);
        self.reject_with_result(d, id, reason, ErrorKind::InvalidMessage, detail, name)
            .await
    }

    /// Writes an error result through the claim (so it is written once) and dead-letters the
    /// message. With the store down the message is released to try again, up to the
    /// unroutable limit, and then parked without a result.
    async fn reject_with_result(
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
            if let Err(e) = self.write_unclaimed_failure(&id, &result).await {
                if d.receive_count < self.config.max_unroutable_receives {
                    tracing::warn!(error = %e, "store unreachable: releasing to write the error result later");
                    return self
                        .release(d, self.config.store_retry_after, Outcome::Released)
                        .await;
                }
                tracing::error!(error = %e, "store unreachable: dead-lettering without a result");
            }
        }
        let why = DeadLetter::new(reason, detail, task_name, 0);
        self.dead_letter(d, &why).await
    }

    async fn write_unclaimed_failure(
        &self,
        id: &TaskId,
        result: &TaskResult,
    ) -> Result<(), crate::store::StoreError> {
        let claim = self
            .claims
            .claim(id, &self.config.worker_id, self.config.lease, None)
            .await?;
        if let ClaimOutcome::Run { token, .. } | ClaimOutcome::Expired { token } = claim {
            self.results.complete(id, token, Some(result), None).await?;
        }
        // Done/Revoked already have a result; a live holder of a valid copy will write one.
        Ok(())
    }

    async fn settle_message(&self, d: &Delivery, settle: &Settle, outcome: Outcome) -> Outcome {
        match settle {
            Settle::Ack => self.ack(d, outcome).await,
            Settle::DeadLetter(why) => match self.broker.dead_letter(d, why).await {
                Ok(()) => outcome,
                Err(e) => self.broker_failed("dead-letter", e),
            },
        }
    }

    async fn ack(&self, d: &Delivery, outcome: Outcome) -> Outcome {
        match self.broker.ack(&d.handle).await {
            Ok(()) => outcome,
            Err(e) => self.broker_failed("ack", e),
        }
    }

    async fn release(&self, d: &Delivery, after: Duration, outcome: Outcome) -> Outcome {
        match self.broker.release(&d.handle, after).await {
            Ok(()) => outcome,
            Err(e) => self.broker_failed("release", e),
        }
    }

    async fn dead_letter(&self, d: &Delivery, why: &DeadLetter) -> Outcome {
        match self.broker.dead_letter(d, why).await {
            Ok(()) => Outcome::DeadLettered,
            Err(e) => self.broker_failed("dead-letter", e),
        }
    }

    fn broker_failed(&self, op: &str, e: BrokerError) -> Outcome {
        // Nothing is lost: an unsettled message comes back when its lease runs out.
        tracing::warn!(error = %e, op, "broker call failed; the message will be redelivered");
        Outcome::BrokerError
    }

    async fn release_claim(&self, id: &TaskId, token: Token) {
        if let Err(e) = self.claims.release(id, token).await {
            tracing::warn!(error = %e, "could not release the claim; it expires with its lease");
        }
    }

    /// Exponential backoff from the task's initial delay, capped, with jitter in [50 %, 100 %].
    fn backoff(&self, opts: &TaskOptions, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30) as i32;
        let base = opts.get_backoff_initial().as_secs_f64() * 2f64.powi(exp);
        let capped = base.min(opts.get_backoff_max().as_secs_f64());
        let factor: f64 = self
            .rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .random_range(0.5..=1.0);
        Duration::from_secs_f64(capped * factor)
    }

    fn keep_pending(&self, id: &TaskId, result: PendingResult) {
        let mut pending = self.lock_pending();
        if pending.len() < self.config.max_pending_results {
            pending.insert(id.clone(), result);
        } else {
            tracing::warn!("too many results pending: this task will run again");
        }
    }

    fn lock_pending(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<TaskId, PendingResult>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn sleep_or_never(limit: Option<Duration>) {
    match limit {
        Some(limit) => tokio::time::sleep(limit).await,
        None => pending().await,
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}
