//! What the worker does with one delivery: design §6, row by row. The run itself is in
//! `run.rs`; settling messages and error results in `settle.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use super::running::Outcome;
use super::Inner;
use crate::broker::{DeadLetter, DeadLetterReason, Delivery};
use crate::store::{ClaimOutcome, CompleteOutcome, Token};
use crate::wire::{names, ErrorKind, TaskId, TaskMessage, TaskResult, MAX_DELAY, WIRE_VERSION};

/// What to do with the message once its result is stored.
#[derive(Debug, Clone)]
pub(crate) enum Settle {
    Ack,
    DeadLetter(DeadLetter),
}

/// A result computed while the store was unreachable: written on the message's redelivery
/// with the claim token it was computed under (design §6, "Valkey unreachable at complete").
#[derive(Debug)]
pub(crate) struct PendingResult {
    pub(crate) token: Token,
    pub(crate) result: Option<TaskResult>,
    pub(crate) settle: Settle,
    pub(crate) outcome: Outcome,
    pub(crate) kept_at: Instant,
}

impl Inner {
    /// Settles one delivery, inside a span that records the task and the outcome.
    pub(crate) async fn process(self: Arc<Self>, d: Delivery) -> Outcome {
        let span = tracing::info_span!(
            "ferriq.delivery",
            queue = %d.queue,
            receive_count = d.receive_count,
            task_id = Empty,
            task_name = Empty,
            attempt = Empty,
            outcome = Empty,
        );
        let mut task = None;
        let outcome = self.settle(&d, &mut task).instrument(span.clone()).await;
        span.record("outcome", outcome.as_str());
        self.counters.record(outcome, task);
        tracing::debug!(parent: &span, outcome = outcome.as_str(), "delivery settled");
        outcome
    }

    /// Settles one delivery; `served` is set to the task's name once it is known to be one
    /// this worker serves (the metrics' task label).
    async fn settle(&self, d: &Delivery, served: &mut Option<&'static str>) -> Outcome {
        let config = &self.config;
        if d.body.len() > config.max_payload {
            // Never parse it: the limit exists to keep such bodies out of memory twice over.
            let detail = format!(
                "body is {} bytes, over the {}-byte limit (FERRIQ_MAX_PAYLOAD_BYTES); raise it \
                 on the workers and redrive it, or send large data by reference",
                d.body.len(),
                config.max_payload
            );
            let id = d.task_id.as_deref().and_then(|s| TaskId::parse(s).ok());
            tracing::warn!(
                task_id = d.task_id.as_deref().unwrap_or("unknown"),
                queue = %d.queue,
                size = d.body.len(),
                limit = config.max_payload,
                "message over FERRIQ_MAX_PAYLOAD_BYTES: parked unread as `too_large`"
            );
            return Box::pin(self.reject_with_result(
                d,
                id,
                DeadLetterReason::TooLarge,
                ErrorKind::InvalidMessage,
                detail,
                None,
            ))
            .await;
        }
        let msg = match TaskMessage::from_json(&d.body) {
            Ok(msg) => msg,
            Err(e) => {
                let id = TaskMessage::peek_task_id(&d.body)
                    .or_else(|| d.task_id.as_deref().and_then(|s| TaskId::parse(s).ok()));
                let name = TaskMessage::peek_task_name(&d.body);
                tracing::warn!(error = %e, "unreadable message");
                return Box::pin(self.reject_with_result(
                    d,
                    id,
                    DeadLetterReason::InvalidMessage,
                    ErrorKind::InvalidMessage,
                    e.to_string(),
                    name,
                ))
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
                return Box::pin(self.dead_letter(d, &why)).await;
            }
            tracing::warn!(%detail, "releasing for a newer worker");
            return self
                .release(d, config.unsupported_release, Outcome::Released)
                .await;
        }

        if let Some(outcome) = self.wait_until_due(d, &msg).await {
            return outcome;
        }
        let msg = match self.debounced(d, msg).await {
            Ok(msg) => msg,
            Err(outcome) => return outcome,
        };

        let Some(task) = self.registry.get(&msg.task_name) else {
            return Box::pin(self.unknown_task(d, &msg)).await;
        };
        *served = Some(task.name);

        if let Some(pending) = self.take_pending(&msg.task_id) {
            if let Some(outcome) = Box::pin(self.store_pending(d, &msg, pending)).await {
                return outcome;
            }
        }

        // Over its rate limit: its turn comes later (before the claim, so no attempt is spent
        // and no claim taken while it waits).
        let options = task.options();
        if let Some((limiter, rate)) = self.rate_limiter(options, &msg) {
            if let Some(outcome) = Box::pin(self.wait_for_turn(d, &msg, &limiter, rate)).await {
                return outcome;
            }
        }

        // Every slot taken: its turn comes later (before the claim too). A slot taken is held
        // while the delivery is settled, whatever the outcome.
        let slot = match self.concurrency_limiter(options, &msg) {
            None => None,
            Some((limiter, limit)) => {
                match Box::pin(self.take_slot(d, &msg, &limiter, limit)).await {
                    Ok(()) => Some((limiter, msg.task_id.clone())),
                    Err(outcome) => return outcome,
                }
            }
        };
        let Some((limiter, id)) = slot else {
            return self.claim_and_run(d, msg, task).await;
        };
        let outcome = Box::pin(self.claim_and_run(d, msg, task)).await;
        self.give_slot_back(&limiter, &id).await;
        outcome
    }

    /// Claims the task and runs it (design §6, from the claim on).
    async fn claim_and_run(
        &self,
        d: &Delivery,
        msg: TaskMessage,
        task: &'static crate::task::TaskRegistration,
    ) -> Outcome {
        let config = &self.config;
        // Rare paths are boxed (`Box::pin`) throughout: a future is as large as its largest
        // state, and this one is moved into its task on every delivery.
        let claim = self
            .store
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
            Ok(ClaimOutcome::Done) => Box::pin(self.duplicate_of_finished(d, &msg)).await,
            Ok(ClaimOutcome::Revoked) => Box::pin(self.revoked(d, &msg)).await,
            Ok(ClaimOutcome::Defer { retry_after }) => {
                self.counters.claim(task.name, false);
                self.release(d, retry_after, Outcome::Deferred).await
            }
            Ok(ClaimOutcome::Expired { token }) => Box::pin(self.expired(d, &msg, token)).await,
            Ok(ClaimOutcome::Run {
                token,
                failures,
                takeovers,
                took_over,
                ..
            }) => {
                if took_over {
                    self.counters.claim(task.name, true);
                }
                self.run(d, msg, task, token, failures, takeovers).await
            }
        }
    }

    /// Its deadline passed before it could start: it never runs. Loud and recoverable —
    /// a WARN naming it, a `DeadlineExceeded` result for its waiter, and the message parked as
    /// `expired` (the middleware's `on_dead_letter` hears it), so an outage's backlog can be
    /// listed and redriven rather than silently dropped.
    async fn expired(&self, d: &Delivery, msg: &TaskMessage, token: Token) -> Outcome {
        let deadline = msg.labels.deadline_at().unwrap_or_default();
        let late = (self.config.clock.now_unix() - deadline).max(0.0);
        let detail = format!(
            "its deadline (deadline_at {deadline:.0}) passed {late:.0} s before a worker could \
             start it: not run"
        );
        // A schedule's tick is worth running near its time only, and a later tick follows: it
        // is answered and acked, not parked (an outage would park a day of ticks).
        let tick = msg.labels.get(names::SCHEDULE).is_some();
        if tick {
            tracing::info!(task_name = %msg.task_name, task_id = %msg.task_id, "a schedule's tick expired before it could start: not run");
        } else {
            tracing::warn!(
                task_name = %msg.task_name,
                task_id = %msg.task_id,
                queue = %d.queue,
                late_secs = late.round(),
                "the task's deadline passed before it could start: not run, parked as `expired` \
                 (`ferriq dlq redrive --reason expired` runs it)"
            );
        }
        let result = TaskResult::failure(
            ErrorKind::DeadlineExceeded,
            detail.clone(),
            false,
            0,
            0.0,
            msg.labels.to_json_map(),
        );
        let settle = if tick {
            Settle::Ack
        } else {
            Settle::DeadLetter(DeadLetter::new(
                DeadLetterReason::Expired,
                detail,
                Some(msg.task_name.clone()),
                0,
            ))
        };
        self.finish(d, msg, token, Some(result), settle, Outcome::Expired)
            .await
    }

    /// A message that is not due yet is released for the whole seconds left (`None` when it
    /// is due now), and held here for the last fraction of a second: brokers time releases in
    /// whole seconds (SQS) or coarse tiers (RabbitMQ), and may hand a message back early but
    /// never late, so it runs on time to the millisecond. Nothing is claimed and no attempt is
    /// spent while it waits.
    async fn wait_until_due(&self, d: &Delivery, msg: &TaskMessage) -> Option<Outcome> {
        let due = match (msg.labels.due_at(), d.not_before) {
            (Some(a), Some(b)) => a.max(b),
            (a, b) => a.or(b)?,
        };
        let wait = self.config.clock.until(due).min(MAX_DELAY);
        if wait.is_zero() {
            return None;
        }
        if wait < crate::broker::HOLD_WINDOW {
            tokio::time::sleep(wait).await;
            return None;
        }
        tracing::debug!(due_in = ?wait, "not due yet: released until due");
        let whole_seconds = Duration::from_secs(wait.as_secs());
        // Not floored at `min_defer`: at least a second, and it must not come back late.
        Some(self.release_after(d, whole_seconds, Outcome::NotDue).await)
    }

    /// A task name this worker does not serve: another lane may; after enough receives it is
    /// parked with an `UnknownTask` result, unless some worker has run it before (then a lane
    /// that serves it exists, and the message goes back to it, up to a higher bound).
    async fn unknown_task(&self, d: &Delivery, msg: &TaskMessage) -> Outcome {
        let config = &self.config;
        if d.receive_count < config.max_unroutable_receives {
            // Loud once per message (its first receive here): a task name nobody on this queue
            // serves is a deployment mistake, and the debug line alone left it silent.
            if d.receive_count <= 1 {
                tracing::warn!(
                    task_name = %msg.task_name,
                    task_id = %msg.task_id,
                    queue = %d.queue,
                    "this worker does not serve the task: handing it back ({} receives before \
                     it is parked); every worker on a queue must serve every task sent to it",
                    config.max_unroutable_receives
                );
            } else {
                tracing::debug!("task not served here: releasing for another lane");
            }
            return self
                .release(d, config.unknown_task_release, Outcome::Released)
                .await;
        }
        let detail = format!("no worker serves task {:?}", msg.task_name);
        let last_chance = d.receive_count >= config.max_unroutable_receives.saturating_mul(4);
        match self
            .store
            .claim(&msg.task_id, &config.worker_id, config.lease, None)
            .await
        {
            Ok(ClaimOutcome::Run { token, starts, .. }) if starts > 0 && !last_chance => {
                // Served elsewhere (it ran before): hand it back.
                self.release_claim(&msg.task_id, token).await;
                self.release(d, config.unknown_task_release, Outcome::Released)
                    .await
            }
            Ok(ClaimOutcome::Run { token, .. } | ClaimOutcome::Expired { token }) => {
                tracing::warn!(
                    task_name = %msg.task_name,
                    task_id = %msg.task_id,
                    queue = %d.queue,
                    "no worker served the task: parked with an UnknownTask result"
                );
                let result = TaskResult::failure(
                    ErrorKind::UnknownTask,
                    detail.clone(),
                    false,
                    0,
                    0.0,
                    msg.labels.to_json_map(),
                );
                let why = DeadLetter::new(
                    DeadLetterReason::UnknownTask,
                    detail,
                    Some(msg.task_name.clone()),
                    0,
                );
                self.finish(
                    d,
                    msg,
                    token,
                    Some(result),
                    Settle::DeadLetter(why),
                    Outcome::DeadLettered,
                )
                .await
            }
            Ok(ClaimOutcome::Done) => self.duplicate_of_finished(d, msg).await,
            Ok(ClaimOutcome::Revoked) => self.revoked(d, msg).await,
            Ok(ClaimOutcome::Defer { retry_after }) => {
                self.release(d, retry_after, Outcome::Deferred).await
            }
            Err(e) => {
                tracing::warn!(error = %e, "claim store unreachable: releasing the message");
                self.release(d, config.store_retry_after, Outcome::Released)
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
            .store
            .complete(&msg.task_id, p.token, p.result.as_ref(), reply_to)
            .await
        {
            Ok(CompleteOutcome::Stored | CompleteOutcome::AlreadyStored) => {
                if !self.advance_workflow(msg, p.result.as_ref()).await {
                    return Some(
                        self.release(d, self.advance_retry(), Outcome::Released)
                            .await,
                    );
                }
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

    /// How long a kept result is worth keeping. It stays writable (the write is fenced by
    /// token, not by lease) until another worker takes the task over, which needs the store
    /// back: long enough to ride out an outage, bounded so a result whose redelivery went to
    /// another worker does not stay forever.
    fn pending_ttl(&self) -> Duration {
        self.config.lease * 10 + self.config.store_retry_after * 3
    }

    pub(crate) fn keep_pending(&self, id: &TaskId, result: PendingResult) {
        let mut pending = self.lock_pending();
        let ttl = self.pending_ttl();
        pending.retain(|_, p| p.kept_at.elapsed() < ttl);
        if pending.len() < self.config.max_pending_results {
            pending.insert(id.clone(), result);
        } else {
            tracing::warn!("too many results pending: this task will run again");
        }
    }

    fn take_pending(&self, id: &TaskId) -> Option<PendingResult> {
        let ttl = self.pending_ttl();
        self.lock_pending()
            .remove(id)
            .filter(|p| p.kept_at.elapsed() < ttl)
    }

    /// Drops kept results that are too old to matter (run from the heartbeat loop).
    pub(crate) fn sweep_pending(&self) {
        let ttl = self.pending_ttl();
        self.lock_pending().retain(|_, p| p.kept_at.elapsed() < ttl);
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, crate::FastMap<TaskId, PendingResult>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}
