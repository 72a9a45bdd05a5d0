use std::time::Duration;

/// A task's options, set with `#[task(…)]` and overridable per message with labels.
///
/// Built with `const` methods so `#[task]` can register them statically.
///
/// ```
/// use std::time::Duration;
/// use ferriq::TaskOptions;
/// const OPTS: TaskOptions = TaskOptions::new().max_attempts(5).timeout(Duration::from_secs(30));
/// assert_eq!(OPTS.get_max_attempts(), 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TaskOptions {
    max_attempts: u32,
    timeout: Option<Duration>,
    queue: Option<&'static str>,
    backoff_initial: Duration,
    backoff_max: Duration,
    retry_on_error: bool,
    store_result: bool,
    deadline: Option<Duration>,
    park_fatal: bool,
    rate: Option<super::Rate>,
    rate_key: Option<super::KeySource>,
    unique_for: Option<(Duration, super::Dedup)>,
    dedup_key: Option<super::KeySource>,
    concurrency: Option<u32>,
    concurrency_key: Option<super::KeySource>,
}

impl Default for TaskOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskOptions {
    /// The defaults: 3 attempts, no timeout, the worker's queue, backoff from 1 s doubling up to
    /// 5 min, retry on error, store the result, no deadline (a task waits for a worker as long
    /// as it takes).
    pub const fn new() -> Self {
        TaskOptions {
            max_attempts: 3,
            timeout: None,
            queue: None,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            retry_on_error: true,
            store_result: true,
            deadline: None,
            park_fatal: true,
            rate: None,
            rate_key: None,
            unique_for: None,
            dedup_key: None,
            concurrency: None,
            concurrency_key: None,
        }
    }

    /// Total attempts, the first run included (at least 1).
    pub const fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = if n == 0 { 1 } else { n };
        self
    }

    /// A time limit for one run; an over-time run is cancelled and counts as a retryable failure.
    pub const fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// The queue (lane) the task's messages go to.
    pub const fn queue(mut self, queue: &'static str) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Delay before the first retry; doubled on each further attempt.
    pub const fn backoff_initial(mut self, delay: Duration) -> Self {
        self.backoff_initial = delay;
        self
    }

    /// Cap on the retry delay.
    pub const fn backoff_max(mut self, delay: Duration) -> Self {
        self.backoff_max = delay;
        self
    }

    /// Whether a retryable error is retried at all.
    pub const fn retry_on_error(mut self, retry: bool) -> Self {
        self.retry_on_error = retry;
        self
    }

    /// Whether the return value is stored (the claim is completed either way).
    pub const fn store_result(mut self, store: bool) -> Self {
        self.store_result = store;
        self
    }

    /// The task must start within `within` of when it is due (enqueue time plus its delay), or
    /// it expires: it never runs, its waiter gets `DeadlineExceeded`, and the message is parked
    /// with reason `expired` (listed and redriven like any dead letter). Without it a task
    /// waits for a worker as long as it takes. Calls can override it
    /// ([`Call::with_deadline`](crate::Call::with_deadline)).
    pub const fn deadline(mut self, within: Duration) -> Self {
        self.deadline = Some(within);
        self
    }

    /// Whether a fatal error of the task's own ([`TaskError::fatal`](crate::TaskError::fatal))
    /// parks its message in the dead-letter queue (the default) or only stores the error as
    /// the result and acks it: for errors that are answers, not poison (a validation error),
    /// which would otherwise crowd the dead-letter queue. Exhausted retries, malformed messages
    /// and arguments that do not bind are parked either way.
    pub const fn park_fatal(mut self, park: bool) -> Self {
        self.park_fatal = park;
        self
    }

    /// At most `rate` starts per period across every worker serving the task (one limiter per
    /// value of [`TaskOptions::rate_key`] when set). A start over it is not run, failed or
    /// counted as an attempt: the message waits for its own later turn (handed back until
    /// then, held by the worker for the last second) — see the README's flow control.
    pub const fn rate(mut self, rate: super::Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// One rate limiter per value of this argument or label (per tenant, per customer).
    pub const fn rate_key(mut self, key: super::KeySource) -> Self {
        self.rate_key = Some(key);
        self
    }

    /// At most `n` runs of the task at once across every worker (one limiter per value of
    /// [`TaskOptions::concurrency_key`] when set). A slot is held like a claim: kept alive by
    /// the run's heartbeats, freed when the run ends, and within a lease when its worker dies.
    /// A task finding every slot taken is not run and spends no attempt: it waits its turn.
    pub const fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(if n == 0 { 1 } else { n });
        self
    }

    /// One concurrency limiter per value of this argument or label.
    pub const fn concurrency_key(mut self, key: super::KeySource) -> Self {
        self.concurrency_key = Some(key);
        self
    }

    /// Deduplicate enqueues: a second enqueue of the same call (task and arguments, or the
    /// call's own [`Call::with_dedup_key`](crate::Call::with_dedup_key)) within `window`
    /// returns the first one's handle and sends nothing — while the first is queued or
    /// running ([`Dedup::WhileActive`](super::Dedup::WhileActive)) or for the whole window ([`Dedup::Window`](super::Dedup::Window)). With
    /// [`Dedup::Debounce`](super::Dedup::Debounce) the first enqueue's task runs once the key has been quiet for
    /// `window`, with the latest enqueue's arguments.
    pub const fn unique_for(mut self, window: Duration, mode: super::Dedup) -> Self {
        self.unique_for = Some((window, mode));
        self
    }

    /// The deduplication key [`TaskOptions::unique_for`] keeps: the task name and this
    /// argument's (or label's) value, instead of the task and all its arguments — one key per
    /// document, user or tenant. With [`Dedup::Debounce`](super::Dedup::Debounce) (whose
    /// latest arguments win), without one the key is the task name alone.
    pub const fn dedup_key(mut self, key: super::KeySource) -> Self {
        self.dedup_key = Some(key);
        self
    }

    /// See [`TaskOptions::dedup_key`].
    pub const fn get_dedup_key(&self) -> Option<super::KeySource> {
        self.dedup_key
    }

    /// See [`TaskOptions::max_attempts`].
    pub const fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }
    /// See [`TaskOptions::timeout`].
    pub const fn get_timeout(&self) -> Option<Duration> {
        self.timeout
    }
    /// See [`TaskOptions::queue`].
    pub const fn get_queue(&self) -> Option<&'static str> {
        self.queue
    }
    /// See [`TaskOptions::backoff_initial`].
    pub const fn get_backoff_initial(&self) -> Duration {
        self.backoff_initial
    }
    /// See [`TaskOptions::backoff_max`].
    pub const fn get_backoff_max(&self) -> Duration {
        self.backoff_max
    }
    /// See [`TaskOptions::retry_on_error`].
    pub const fn get_retry_on_error(&self) -> bool {
        self.retry_on_error
    }
    /// See [`TaskOptions::store_result`].
    pub const fn get_store_result(&self) -> bool {
        self.store_result
    }
    /// See [`TaskOptions::rate`].
    pub const fn get_rate(&self) -> Option<super::Rate> {
        self.rate
    }
    /// See [`TaskOptions::rate_key`].
    pub const fn get_rate_key(&self) -> Option<super::KeySource> {
        self.rate_key
    }
    /// See [`TaskOptions::concurrency`].
    pub const fn get_concurrency(&self) -> Option<u32> {
        self.concurrency
    }
    /// See [`TaskOptions::concurrency_key`].
    pub const fn get_concurrency_key(&self) -> Option<super::KeySource> {
        self.concurrency_key
    }
    /// See [`TaskOptions::unique_for`].
    pub const fn get_unique_for(&self) -> Option<(Duration, super::Dedup)> {
        self.unique_for
    }
    /// See [`TaskOptions::park_fatal`].
    pub const fn get_park_fatal(&self) -> bool {
        self.park_fatal
    }
    /// See [`TaskOptions::deadline`].
    pub const fn get_deadline(&self) -> Option<Duration> {
        self.deadline
    }
}
