//! Middleware: cross-cutting behaviour at the seams — error reporting, auditing, tenant
//! context, custom metrics, trace propagation — without wrapping every task by hand.
//!
//! One object-safe trait, [`Middleware`], whose hooks all default to doing nothing: implement
//! the ones you need and register the object on the client
//! ([`Client::with_middleware`](crate::Client::with_middleware)) and on the worker
//! ([`WorkerBuilder::middleware`](crate::WorkerBuilder::middleware)).
//!
//! **Workflows.** A chord's callback and a chain's later steps are sent by the worker that
//! finishes what they wait for, not by the caller: the client runs `before_send` on them when
//! the chord or chain is enqueued (in the caller's context, so a tenant or trace context it
//! adds is in them; a refusal enqueues nothing), and `after_send` only for what it publishes
//! itself.
//!
//! **Order.** Hooks that come before something (`before_send`, `before_run`) run in the order
//! the middleware was registered; hooks that come after (`after_send`, `after_result`,
//! `on_error`, `on_dead_letter`) run in the reverse order, so the first registered wraps all
//! the others.
//!
//! **Failures.** A hook never loses a message and never touches the exactly-once result write:
//! the claim, fence and result protocol is the worker's own and runs whatever a hook does.
//! - `before_send` may refuse a message: an error (or a panic) fails the enqueue with
//!   [`EnqueueError::Middleware`](crate::EnqueueError::Middleware) and nothing is published —
//!   the caller still holds everything it had.
//! - Every other hook only observes: its error or panic is logged (WARN, with the middleware's
//!   name) and the run, its outcome and its result are exactly what they would have been.
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use ferriq::middleware::{Middleware, Run};
//! use ferriq::wire::TaskResult;
//!
//! /// Counts the results written, per worker.
//! #[derive(Default)]
//! struct Audit(AtomicU64);
//!
//! #[ferriq::async_trait]
//! impl Middleware for Audit {
//!     async fn after_result(&self, run: &Run<'_>, result: &TaskResult) {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!         println!("{} {} written (error: {})", run.task_name, run.task_id, result.is_err);
//!     }
//! }
//!
//! let env = ferriq::testing::TestEnv::new();
//! let worker = env.worker().middleware(std::sync::Arc::new(Audit::default()));
//! # let _ = worker;
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use thiserror::Error;

use crate::broker::DeadLetterReason;
use crate::task::{AppState, State, TaskError};
use crate::wire::{Labels, TaskId, TaskMessage, TaskResult};

#[cfg(feature = "opentelemetry")]
mod trace_context;
#[cfg(feature = "opentelemetry")]
pub use trace_context::TraceContext;

/// Why a `before_send` hook refused a message.
#[derive(Debug, Clone, Error)]
#[error("{0}")]
pub struct MiddlewareError(pub String);

impl MiddlewareError {
    /// An error saying `why`.
    pub fn new(why: impl Into<String>) -> Self {
        MiddlewareError(why.into())
    }
}

/// A run as hooks see it: the task, the attempt, its labels, the worker, the worker's state.
#[derive(Debug)]
#[non_exhaustive]
pub struct Run<'a> {
    /// The task's id.
    pub task_id: &'a TaskId,
    /// The task's name.
    pub task_name: &'a str,
    /// This attempt (from 1).
    pub attempt: u32,
    /// The most attempts it gets.
    pub max_attempts: u32,
    /// The message's labels.
    pub labels: &'a Labels,
    /// The worker running it.
    pub worker_id: &'a str,
    /// The worker's app state.
    pub state: &'a AppState,
    /// The run's span (`ferriq.run`): not yet entered in `before_run`, so a distributed
    /// trace's parent may still be set on it.
    pub span: &'a tracing::Span,
}

impl Run<'_> {
    /// A value of the worker's app state.
    pub fn state<T: Send + Sync + 'static>(&self) -> Option<State<T>> {
        self.state.get::<T>()
    }
}

/// What happens after a run's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterError {
    /// It runs again after this long.
    Retry(Duration),
    /// It failed for good: its error result is written and the message dead-lettered.
    GiveUp,
}

/// A message that was dead-lettered.
#[derive(Debug)]
#[non_exhaustive]
pub struct DeadLettered<'a> {
    /// The task, when it could be read.
    pub task_id: Option<&'a TaskId>,
    /// Its name, when known.
    pub task_name: Option<&'a str>,
    /// The lane it came from.
    pub lane: &'a str,
    /// Why.
    pub reason: DeadLetterReason,
    /// The error's detail.
    pub detail: &'a str,
    /// Attempts made.
    pub attempts: u32,
}

/// Hooks around enqueue and run. Every hook has a default that does nothing. See the
/// [module docs](self) for the order hooks run in and what their failures do.
#[async_trait]
pub trait Middleware: Send + Sync + 'static {
    /// The name logs give this middleware.
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }

    /// Client side, before a message is published: read or change it (labels above all). An
    /// error refuses it: the enqueue fails and nothing of it is published.
    async fn before_send(&self, message: &mut TaskMessage) -> Result<(), MiddlewareError> {
        let _ = message;
        Ok(())
    }

    /// Client side, after the broker took the message (`sent`) or failed to.
    async fn after_send(&self, message: &TaskMessage, sent: bool) {
        let _ = (message, sent);
    }

    /// Worker side, before a claimed task runs: `extensions` are handed to the task
    /// ([`TaskContext::extension`](crate::TaskContext::extension)) — tenant context, a
    /// request id. An error is logged; the run goes ahead.
    async fn before_run(
        &self,
        run: &Run<'_>,
        extensions: &mut AppState,
    ) -> Result<(), MiddlewareError> {
        let _ = (run, extensions);
        Ok(())
    }

    /// Worker side, after the task's result (success or final error) was written — once per
    /// task, by the run whose write won.
    async fn after_result(&self, run: &Run<'_>, result: &TaskResult) {
        let _ = (run, result);
    }

    /// Worker side, when a run ends with an error (or a timeout or panic), with what happens
    /// next.
    async fn on_error(&self, run: &Run<'_>, error: &TaskError, next: AfterError) {
        let _ = (run, error, next);
    }

    /// Worker side, when a message was dead-lettered (a failed task, or a message no worker
    /// can run).
    async fn on_dead_letter(&self, dead: &DeadLettered<'_>) {
        let _ = dead;
    }
}

/// The registered middleware, in order.
#[derive(Clone, Default)]
pub(crate) struct Chain(Arc<[Arc<dyn Middleware>]>);

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|m| m.name()))
            .finish()
    }
}

/// Runs one observing hook: a panic is caught and, like an error, only logged.
async fn observe<F: std::future::Future<Output = ()>>(m: &dyn Middleware, hook: &str, f: F) {
    if AssertUnwindSafe(f).catch_unwind().await.is_err() {
        tracing::warn!(
            middleware = m.name(),
            hook,
            "middleware hook panicked; ignored"
        );
    }
}

impl Chain {
    pub(crate) fn with(&self, m: Arc<dyn Middleware>) -> Chain {
        let mut all: Vec<_> = self.0.iter().cloned().collect();
        all.push(m);
        Chain(all.into())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) async fn before_send(
        &self,
        message: &mut TaskMessage,
    ) -> Result<(), (String, String)> {
        for m in self.0.iter() {
            let outcome = AssertUnwindSafe(m.before_send(message))
                .catch_unwind()
                .await;
            let why = match outcome {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.0,
                Err(_) => "the hook panicked".to_owned(),
            };
            return Err((m.name().to_owned(), why));
        }
        Ok(())
    }

    pub(crate) async fn after_send(&self, message: &TaskMessage, sent: bool) {
        for m in self.0.iter().rev() {
            observe(m.as_ref(), "after_send", m.after_send(message, sent)).await;
        }
    }

    pub(crate) async fn before_run(&self, run: &Run<'_>, extensions: &mut AppState) {
        for m in self.0.iter() {
            let outcome = AssertUnwindSafe(m.before_run(run, extensions))
                .catch_unwind()
                .await;
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(middleware = m.name(), error = %e, "before_run failed; the run goes ahead")
                }
                Err(_) => tracing::warn!(
                    middleware = m.name(),
                    "before_run panicked; the run goes ahead"
                ),
            }
        }
    }

    pub(crate) async fn after_result(&self, run: &Run<'_>, result: &TaskResult) {
        for m in self.0.iter().rev() {
            observe(m.as_ref(), "after_result", m.after_result(run, result)).await;
        }
    }

    pub(crate) async fn on_error(&self, run: &Run<'_>, error: &TaskError, next: AfterError) {
        for m in self.0.iter().rev() {
            observe(m.as_ref(), "on_error", m.on_error(run, error, next)).await;
        }
    }

    pub(crate) async fn on_dead_letter(&self, dead: &DeadLettered<'_>) {
        for m in self.0.iter().rev() {
            observe(m.as_ref(), "on_dead_letter", m.on_dead_letter(dead)).await;
        }
    }
}
