//! Running one claimed task: timeout, cancellation, panics, retries with backoff.

use std::future::pending;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::running::{Outcome, Running, StopReason};
use super::settle::{self, Settle};
use super::Inner;
use super::{claim, slots, workflow, write};
use crate::broker::{DeadLetter, DeadLetterReason, Delivery};
use crate::middleware::{AfterError, Run};
use crate::store::{FailureRecord, Token};
use crate::task::{
    AppState, Invocation, RunCancel, TaskContext, TaskError, TaskOptions, TaskRegistration,
};
use crate::wire::{ErrorKind, TaskId, TaskMessage, TaskResult};

/// How a run ended.
enum RunEnd {
    Value(serde_json::Value),
    Error(TaskError),
    TimedOut(Duration),
    Stopped(StopReason),
}

/// Runs a claimed task under its timeout and cancellation, then settles the outcome.
pub(super) async fn run(
    w: &Inner,
    d: &Delivery,
    msg: &mut TaskMessage,
    task: &'static TaskRegistration,
    token: Token,
    failures: u32,
    takeovers: u32,
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
    // The run's own span, entered only by the task: middleware may still give it a
    // distributed trace's parent.
    let run_span = tracing::info_span!(
        "ferriq.run",
        otel.name = format!("execute/{}", task.name),
        task_name = task.name,
        task_id = msg.task_id.as_str(),
        attempt,
    );
    let hooks = Run {
        task_id: &msg.task_id,
        task_name: task.name,
        attempt,
        max_attempts,
        labels: &msg.labels,
        worker_id: &w.config.worker_id,
        state: &w.state,
        span: &run_span,
    };

    if takeovers >= w.config.max_takeovers {
        // Earlier runs ended without finishing (their worker crashed or stalled past its
        // lease): a crash loop ends here instead of taking down another worker.
        let error = TaskError::retryable(format!(
            "{takeovers} earlier runs ended without finishing (their worker crashed or stalled, \
             or lost the message: on RabbitMQ, a run longer than consumer_timeout)"
        ));
        return Box::pin(fail_for_good(
            w, d, msg, &hooks, token, error, attempt, 0.0, true,
        ))
        .await;
    }

    // The task sees a child of the run's token: it may cancel its own, which must not
    // look like the worker stopping it.
    let cancel = CancellationToken::new();
    // One reading of the clock for the run's start and its time in the queue.
    let now = w.config.clock.now_unix();
    let stopped_at_once = w.running.insert(Running {
        task_id: msg.task_id.clone(),
        task_name: task.name,
        attempt,
        lane: d.queue.clone(),
        started_at_ms: crate::clock::unix_ms(now),
        token,
        handle: d.handle.clone(),
        cancel: cancel.clone(),
        reason: OnceLock::new(),
        renewed_at: tokio::time::Instant::now(),
    });
    if let Some(why) = stopped_at_once {
        // The worker is past its grace period: hand the task straight back.
        return Box::pin(stopped(w, d, &msg.task_id, token, why)).await;
    }
    w.counters.started(task.name);
    let since = match (msg.labels.enqueued_at(), msg.labels.due_at()) {
        (Some(sent), Some(due)) => Some(sent.max(due)),
        (sent, due) => sent.or(due),
    };
    if let Some(since) = since {
        w.counters.waited(now - since, task.name);
    }
    let mut extensions = AppState::default();
    if !w.middleware.is_empty() {
        w.middleware.before_run(&hooks, &mut extensions).await;
    }
    let ctx = TaskContext::new(
        msg.task_id.clone(),
        // The registered name: the message's, found in the registry by it.
        std::borrow::Cow::Borrowed(task.name),
        attempt,
        max_attempts,
        d.receive_count,
        msg.labels.clone(),
        msg.labels.deadline_at(),
        RunCancel::child_of(cancel.clone()),
    )
    .with_run(Arc::clone(&w.store), token)
    .with_extensions(extensions);
    let invocation = Invocation::new(
        ctx,
        std::mem::take(&mut msg.args),
        std::mem::take(&mut msg.kwargs),
        Arc::clone(&w.state),
    );
    let started = Instant::now();
    let mut end = {
        // Polled here rather than spawned (one task per delivery, not two); a panic is
        // caught and the worker keeps running.
        let body =
            AssertUnwindSafe((task.run)(invocation).instrument(run_span.clone())).catch_unwind();
        tokio::pin!(body);
        let end = tokio::select! {
            // A run that finished wins over a stop that came at the same moment.
            biased;
            ran = &mut body => match ran {
                Ok(Ok(value)) => RunEnd::Value(value),
                Ok(Err(e)) => RunEnd::Error(e),
                Err(panic) => RunEnd::Error(TaskError::retryable(format!(
                    "the task panicked: {}", panic_message(panic)
                ))),
            },
            // Why: read from the run's entry below.
            _ = cancel.cancelled() => RunEnd::Stopped(StopReason::Shutdown),
            _ = sleep_or_never(timeout) => RunEnd::TimedOut(timeout.unwrap_or_default()),
        };
        // The run is over when `body` is dropped at the end of this block: before the
        // message or claim is given back, so no second run can overlap it. Work the task
        // handed its token to hears the stop too.
        cancel.cancel();
        end
    };
    let stopped_for = w.running.remove(d.handle.key());
    // An error returned because the worker stopped the run is the stop, not a failure.
    if let (Some(why), RunEnd::Error(_) | RunEnd::TimedOut(_) | RunEnd::Stopped(_)) =
        (stopped_for, &end)
    {
        end = RunEnd::Stopped(why);
    }
    let elapsed = started.elapsed();
    w.counters.ran_for(elapsed.as_micros() as u64, task.name);
    let secs = elapsed.as_secs_f64();

    let error = match end {
        RunEnd::Value(value) => {
            let mut result = opts
                .get_store_result()
                .then(|| TaskResult::success(value, secs, msg.labels.clone()));
            let (outcome, written) = write::finish_returning(
                w,
                d,
                msg,
                token,
                &mut result,
                Settle::Ack,
                Outcome::Succeeded,
            )
            .await;
            if outcome == Outcome::Succeeded {
                w.counters.finished_after(task.name, attempt);
                if let (true, Some(result)) = (written, &result) {
                    w.middleware.after_result(&hooks, result).await;
                }
            }
            return outcome;
        }
        RunEnd::Stopped(StopReason::LeaseLimit) => TaskError::with_kind(
            ErrorKind::Timeout,
            format!(
                "the run outlived the longest time the broker can hold its message \
                 (SQS: 12 hours after it was received); stopped after {elapsed:?}"
            ),
            false,
        ),
        RunEnd::Stopped(StopReason::Revoked) => {
            return Box::pin(workflow::revoked(w, d, msg)).await
        }
        RunEnd::Stopped(why) => return Box::pin(stopped(w, d, &msg.task_id, token, why)).await,
        RunEnd::Error(e) => e,
        RunEnd::TimedOut(limit) => TaskError::with_kind(
            ErrorKind::Timeout,
            format!("the run exceeded its {limit:?} timeout"),
            true,
        ),
    };

    if error.is_retryable() && retry_allowed && attempt < max_attempts {
        // What will happen: no release is shorter than `min_defer`.
        let delay = error
            .retry_delay()
            .unwrap_or_else(|| backoff(w, opts, attempt))
            .max(w.config.min_defer);
        tracing::info!(error = %error, attempt, max_attempts, retry_in = ?delay, "run failed; will retry");
        w.middleware
            .on_error(&hooks, &error, AfterError::Retry(delay))
            .await;
        // The failure recorded, and the run's concurrency slot (if any) freed with it.
        return match slots::record_failure(w, &msg.task_id, token).await {
            Ok(FailureRecord::Recorded { .. }) => {
                settle::release(w, d, delay, Outcome::Retried).await
            }
            Ok(_) => settle::release(w, d, w.config.min_defer, Outcome::ClaimLost).await,
            Err(e) => {
                // The attempt goes uncounted (its lease runs out: the takeover counts it).
                tracing::warn!(error = %e, "could not record the failure; releasing anyway");
                settle::release(w, d, delay, Outcome::Retried).await
            }
        };
    }
    // Only the task's own fatal errors may go unparked: decided before a retryable error
    // that may not be retried (`retry_on_error = false`) reads as fatal.
    let park =
        opts.get_park_fatal() || error.is_retryable() || error.kind() != ErrorKind::TaskError;
    let error = if error.is_retryable() && !retry_allowed {
        TaskError::with_kind(error.kind(), error.message(), false)
    } else {
        error
    };
    Box::pin(fail_for_good(
        w, d, msg, &hooks, token, error, attempt, secs, park,
    ))
    .await
}

/// Stores the error result and parks the message (non-retryable, or attempts exhausted),
/// or acks it when not to `park` (a task's own fatal error, with `park_fatal = false`).
#[allow(clippy::too_many_arguments)]
async fn fail_for_good(
    w: &Inner,
    d: &Delivery,
    msg: &TaskMessage,
    hooks: &Run<'_>,
    token: Token,
    error: TaskError,
    attempts: u32,
    secs: f64,
    park: bool,
) -> Outcome {
    let (kind, reason) = if error.is_retryable() {
        let kind = match error.kind() {
            ErrorKind::Timeout => ErrorKind::Timeout,
            _ => ErrorKind::RetriesExhausted,
        };
        (kind, DeadLetterReason::RetriesExhausted)
    } else {
        (error.kind(), DeadLetterReason::NonRetryable)
    };
    tracing::warn!(error = %error, attempts, "run failed for good");
    w.middleware
        .on_error(hooks, &error, AfterError::GiveUp)
        .await;
    let result = TaskResult::failure(
        kind,
        error.message(),
        error.is_retryable(),
        attempts,
        secs,
        msg.labels.clone(),
    );
    let settle = if park {
        Settle::DeadLetter(DeadLetter::new(
            reason,
            error.message(),
            Some(msg.task_name.to_string()),
            attempts,
        ))
    } else {
        Settle::Ack
    };
    let mut result = Some(result);
    let (outcome, written) =
        write::finish_returning(w, d, msg, token, &mut result, settle, Outcome::Failed).await;
    if outcome == Outcome::Failed {
        w.counters.finished_after(hooks.task_name, attempts);
        if let (true, Some(result)) = (written, &result) {
            w.middleware.after_result(hooks, result).await;
        }
    }
    outcome
}

/// A run stopped from outside (design §6 heartbeat and shutdown rows).
async fn stopped(w: &Inner, d: &Delivery, id: &TaskId, token: Token, why: StopReason) -> Outcome {
    match why {
        StopReason::DeliveryLost => {
            // The message is someone else's now: write nothing, free the claim for them,
            // counted with the takeovers so runs that are always cut off (a run longer
            // than RabbitMQ's consumer_timeout) end instead of looping.
            if let Err(e) = w.store.release_interrupted(id, token).await {
                tracing::warn!(error = %e, "could not release the claim; it expires with its lease");
            }
            Outcome::DeliveryLost
        }
        StopReason::ClaimLost => {
            settle::release(w, d, w.config.min_defer, Outcome::ClaimLost).await
        }
        // The revoke stored the task's result: the message is done with.
        StopReason::Revoked => settle::ack(w, d, Outcome::Revoked).await,
        // Handled by the run as a failure (it needs the message and attempt).
        StopReason::LeaseLimit => {
            settle::release(w, d, w.config.min_defer, Outcome::ClaimLost).await
        }
        StopReason::StoreUnreachable => {
            let outcome = settle::release(w, d, w.config.min_defer, Outcome::ClaimLost).await;
            // The claim is still ours: hand it back once the store answers, so the next
            // run is not counted as a takeover of a crashed one.
            claim::give_back_later(w, id.clone(), token);
            outcome
        }
        StopReason::Shutdown => {
            // Claim first, so the worker that takes the message next runs it at once
            // instead of deferring to this worker's lease.
            let released =
                tokio::time::timeout(Duration::from_secs(2), claim::give_back(w, id, token));
            if released.await.is_err() {
                tracing::warn!("claim release timed out; the next worker waits for its lease");
            }
            settle::release_now(w, d, Outcome::ShutdownReleased).await
        }
    }
}

/// Exponential backoff from the task's initial delay, capped, with jitter in [50 %, 100 %].
fn backoff(w: &Inner, opts: &TaskOptions, attempt: u32) -> Duration {
    let exp = attempt.saturating_sub(1).min(30) as i32;
    let base = opts.get_backoff_initial().as_secs_f64() * 2f64.powi(exp);
    let capped = base.min(opts.get_backoff_max().as_secs_f64());
    let factor: f64 = w
        .rng
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .random_range(0.5..=1.0);
    Duration::from_secs_f64(capped * factor)
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
