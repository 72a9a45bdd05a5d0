use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::TaskError;
use crate::store::{ResultStatus, Store, TaskProgress, Token};
use crate::wire::{Labels, TaskFailure, TaskId};

/// What a run knows about itself: its id, attempt, labels, deadline and cancellation.
///
/// A task takes it as a parameter of type `TaskContext`. Use [`TaskContext::task_id`] as the
/// idempotency key for side effects: a run whose worker died is run again (design §1.2).
///
/// ```
/// use ferriq::TaskContext;
///
/// #[ferriq::task(name = "mail.send")]
/// async fn send(ctx: TaskContext, to: String) -> String {
///     format!("{} -> {to} (attempt {})", ctx.task_id(), ctx.attempt())
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // Tasks stay plain functions: call them directly in unit tests.
/// let ctx = TaskContext::builder("0123456789abcdef0123456789abcdef").attempt(2).build().unwrap();
/// assert!(send(ctx, "ann@example.com".into()).await.ends_with("(attempt 2)"));
/// # }
/// ```
#[derive(Clone)]
pub struct TaskContext {
    inner: Arc<ContextInner>,
}

/// A run's cancellation: the worker's token for the run, and the task's own token, a child of
/// it, made when the task first asks for it (most runs never do, and a child token costs two
/// allocations and a place in the parent's list). The task may cancel its own token: that must
/// not look like the worker stopping the run, so it never gets the worker's.
pub(crate) struct RunCancel {
    worker: CancellationToken,
    own: std::sync::OnceLock<CancellationToken>,
}

impl RunCancel {
    /// The task's token is a child of `worker`'s.
    pub(crate) fn child_of(worker: CancellationToken) -> Self {
        Self {
            worker,
            own: std::sync::OnceLock::new(),
        }
    }

    /// The task's token is `token` itself (a test's, through the builder).
    fn given(token: CancellationToken) -> Self {
        Self {
            worker: token.clone(),
            own: std::sync::OnceLock::from(token),
        }
    }

    fn token(&self) -> &CancellationToken {
        self.own.get_or_init(|| self.worker.child_token())
    }

    /// Cancelled: the worker's token, or the task's own once it has one (a child is
    /// cancelled with its parent).
    fn is_cancelled(&self) -> bool {
        match self.own.get() {
            Some(own) => own.is_cancelled(),
            None => self.worker.is_cancelled(),
        }
    }
}

struct ContextInner {
    task_id: TaskId,
    // The registered name in a worker (no copy per run), an owned one from the builder.
    task_name: Cow<'static, str>,
    attempt: u32,
    max_attempts: u32,
    receive_count: u32,
    labels: Labels,
    deadline_at: Option<f64>,
    cancel: RunCancel,
    /// The store and claim token of a run in a worker (none for direct calls).
    run: Option<(Arc<dyn Store>, Token)>,
    /// Values middleware set for this run.
    extensions: AppState,
}

impl TaskContext {
    /// A builder, for calling tasks directly in tests.
    pub fn builder(task_id: impl Into<String>) -> TaskContextBuilder {
        TaskContextBuilder {
            task_id: task_id.into(),
            task_name: String::new(),
            attempt: 1,
            max_attempts: 1,
            labels: Labels::new(),
            deadline_at: None,
            cancel: CancellationToken::new(),
            extensions: AppState::default(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        task_id: TaskId,
        task_name: Cow<'static, str>,
        attempt: u32,
        max_attempts: u32,
        receive_count: u32,
        labels: Labels,
        deadline_at: Option<f64>,
        cancel: RunCancel,
    ) -> Self {
        TaskContext {
            inner: Arc::new(ContextInner {
                task_id,
                task_name,
                attempt,
                max_attempts,
                receive_count,
                labels,
                deadline_at,
                cancel,
                run: None,
                extensions: AppState::default(),
            }),
        }
    }

    /// The same context, with the values middleware set before the run.
    pub(crate) fn with_extensions(mut self, extensions: AppState) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.extensions = extensions;
        }
        self
    }

    /// A value a middleware's `before_run` set for this run (a tenant, a request id).
    pub fn extension<T: Send + Sync + 'static>(&self) -> Option<State<T>> {
        self.inner.extensions.get::<T>()
    }

    /// The same context, for a run in a worker holding the claim under `token`.
    pub(crate) fn with_run(mut self, store: Arc<dyn Store>, token: Token) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.run = Some((store, token));
        }
        self
    }

    /// The task's id: the same for every attempt and every copy of the message.
    pub fn task_id(&self) -> &TaskId {
        &self.inner.task_id
    }
    /// The task's registered name.
    pub fn task_name(&self) -> &str {
        &self.inner.task_name
    }
    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }
    /// Total attempts allowed.
    pub fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }
    /// How many times the broker has delivered this message (informational; attempts are counted
    /// in the claim store).
    pub fn receive_count(&self) -> u32 {
        self.inner.receive_count
    }
    /// The message's labels.
    pub fn labels(&self) -> &Labels {
        &self.inner.labels
    }
    /// When the task must have started by, if the producer set a deadline.
    pub fn deadline(&self) -> Option<SystemTime> {
        let at = self.inner.deadline_at?;
        (at.is_finite() && at >= 0.0).then(|| UNIX_EPOCH + Duration::from_secs_f64(at))
    }
    /// The run's cancellation token: cancelled when the worker gives the run up (shutdown after
    /// the grace period, lost message or claim, timeout).
    /// The task may cancel it itself: that ends nothing but what listens to it.
    pub fn cancellation_token(&self) -> &CancellationToken {
        self.inner.cancel.token()
    }
    /// Whether the run has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }
    /// Completes when the run is cancelled.
    pub async fn cancelled(&self) {
        self.inner.cancel.token().cancelled().await
    }

    /// Reports progress: any JSON value, readable by
    /// [`TaskHandle::progress`](crate::TaskHandle::progress) (and by Python through
    /// taskiq-redis's `get_progress`). Written only while this run holds the task's claim; a
    /// no-op when the task is called directly.
    pub async fn set_progress(&self, meta: impl Serialize) -> Result<(), TaskError> {
        let Some((store, token)) = &self.inner.run else {
            return Ok(());
        };
        let meta = serde_json::to_value(meta)
            .map_err(|e| TaskError::fatal(format!("the progress value is not JSON: {e}")))?;
        store
            .set_progress(&self.inner.task_id, *token, &TaskProgress::started(meta))
            .await
            .map(|_| ())
            .map_err(|e| TaskError::retryable(format!("progress not stored: {e}")))
    }

    /// A chord callback's members' outcomes, in member order: each its value or its failure.
    /// An error when this task is not a chord's callback.
    pub async fn group_results<T: DeserializeOwned>(
        &self,
    ) -> Result<Vec<Result<T, TaskFailure>>, TaskError> {
        let Some(group) = self.inner.labels.group_results_of() else {
            return Err(TaskError::fatal(
                "group_results: this task is not a chord's callback",
            ));
        };
        let Some((store, _)) = &self.inner.run else {
            return Err(TaskError::fatal(
                "group_results: the task runs outside a worker",
            ));
        };
        let unavailable = |e: crate::store::StoreError| {
            TaskError::retryable(format!("the group's results cannot be read: {e}"))
        };
        let Some(state) = store.group(&group).await.map_err(unavailable)? else {
            return Err(TaskError::fatal(format!(
                "group {group} is not in the store (expired?)"
            )));
        };
        let ids: Vec<TaskId> = (0..state.record.size)
            .map(|i| group.group_member(i))
            .collect();
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1000) {
            for (id, status) in chunk
                .iter()
                .zip(store.get_many(chunk).await.map_err(unavailable)?)
            {
                let ResultStatus::Ready(r) = status else {
                    return Err(TaskError::retryable(format!(
                        "member {id} has no result yet"
                    )));
                };
                out.push(match r.failure_details() {
                    Some(f) => Err(f),
                    None => Ok(serde_json::from_value::<T>(r.return_value).map_err(|e| {
                        TaskError::fatal(format!("member {id}'s result does not decode: {e}"))
                    })?),
                });
            }
        }
        Ok(out)
    }

    /// A chord callback's members' values, in member order; an error if any member failed
    /// (which, with the default [`ChordPolicy`](crate::workflow::ChordPolicy), never reaches a
    /// callback).
    pub async fn group_values<T: DeserializeOwned>(&self) -> Result<Vec<T>, TaskError> {
        self.group_results()
            .await?
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.map_err(|f| TaskError::fatal(format!("member {i} failed: {f}"))))
            .collect()
    }
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("task_id", &self.inner.task_id)
            .field("task_name", &self.inner.task_name)
            .field("attempt", &self.inner.attempt)
            .finish_non_exhaustive()
    }
}

/// Builds a [`TaskContext`] for calling a task directly (unit tests).
#[derive(Debug)]
pub struct TaskContextBuilder {
    task_id: String,
    task_name: String,
    attempt: u32,
    max_attempts: u32,
    labels: Labels,
    deadline_at: Option<f64>,
    cancel: CancellationToken,
    extensions: AppState,
}

impl TaskContextBuilder {
    /// A value a middleware would have set ([`TaskContext::extension`]).
    pub fn extension<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.extensions.insert(value);
        self
    }
    /// The task name.
    pub fn task_name(mut self, name: impl Into<String>) -> Self {
        self.task_name = name.into();
        self
    }
    /// The attempt number (from 1).
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt.max(1);
        self.max_attempts = self.max_attempts.max(self.attempt);
        self
    }
    /// The labels.
    pub fn labels(mut self, labels: Labels) -> Self {
        self.labels = labels;
        self
    }
    /// A cancellation token the test controls.
    pub fn cancellation_token(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }
    /// Builds it; fails if the id is not a valid [`TaskId`].
    pub fn build(self) -> Result<TaskContext, crate::wire::WireError> {
        Ok(TaskContext::new(
            TaskId::parse(self.task_id)?,
            Cow::Owned(self.task_name),
            self.attempt,
            self.max_attempts,
            self.attempt,
            self.labels,
            self.deadline_at,
            RunCancel::given(self.cancel),
        )
        .with_extensions(self.extensions))
    }
}

/// Shared app state a task takes as a parameter (`State<Db>`), registered on the worker with
/// [`WorkerBuilder::state`](crate::WorkerBuilder::state). A worker refuses to start when a
/// task needs state that was not registered.
///
/// ```
/// use ferriq::State;
/// struct Config { greeting: String }
///
/// #[ferriq::task(name = "greet")]
/// async fn greet(config: State<Config>, name: String) -> String {
///     format!("{} {name}", config.greeting)
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let state = State::new(Config { greeting: "hello".into() });
/// assert_eq!(greet(state, "ann".into()).await, "hello ann");
/// # }
/// ```
pub struct State<T: ?Sized>(Arc<T>);

impl<T> State<T> {
    /// Wraps a value (for calling tasks directly).
    pub fn new(value: T) -> Self {
        State(Arc::new(value))
    }
}

impl<T: ?Sized> State<T> {
    /// The shared `Arc`.
    pub fn into_inner(self) -> Arc<T> {
        self.0
    }
}

impl<T: ?Sized> Clone for State<T> {
    fn clone(&self) -> Self {
        State(Arc::clone(&self.0))
    }
}

impl<T: ?Sized> Deref for State<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: ?Sized> fmt::Debug for State<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "State<{}>", std::any::type_name::<T>())
    }
}

/// The app state a worker hands to tasks, keyed by type.
#[derive(Default, Clone)]
pub struct AppState {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl AppState {
    /// Adds a value; a later value of the same type replaces it.
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.values.insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// Whether a value of this type id is present.
    pub fn contains(&self, type_id: TypeId) -> bool {
        self.values.contains_key(&type_id)
    }

    /// The value of type `T`.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<State<T>> {
        let any = Arc::clone(self.values.get(&TypeId::of::<T>())?);
        any.downcast::<T>().ok().map(State)
    }
}

impl fmt::Debug for AppState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AppState({} values)", self.values.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_runs_own_token_is_made_when_asked_and_hears_the_worker() {
        // Not asked for: the worker's cancel is seen all the same.
        let worker = CancellationToken::new();
        let cancel = RunCancel::child_of(worker.clone());
        assert!(!cancel.is_cancelled());
        worker.cancel();
        assert!(cancel.is_cancelled());
        cancel.token().cancelled().await;

        // The task cancels its own: the worker's is untouched.
        let worker = CancellationToken::new();
        let cancel = RunCancel::child_of(worker.clone());
        cancel.token().cancel();
        assert!(cancel.is_cancelled() && !worker.is_cancelled());

        // Asked for before the worker cancels: it hears it.
        let worker = CancellationToken::new();
        let cancel = RunCancel::child_of(worker.clone());
        let own = cancel.token().clone();
        worker.cancel();
        assert!(own.is_cancelled() && cancel.is_cancelled());

        // A test's token is the task's own.
        let given = CancellationToken::new();
        let cancel = RunCancel::given(given.clone());
        cancel.token().cancel();
        assert!(given.is_cancelled());
    }
}
