use std::fmt;

use crate::wire::{ArgumentError, ErrorKind};

/// The error a task returns. Errors converted with `?` are retryable; use
/// [`TaskError::fatal`] for errors that no retry can fix.
///
/// Like `anyhow::Error`, this type converts from any `std::error::Error` and so does not itself
/// implement that trait.
///
/// ```
/// use ferriq::TaskError;
/// fn parse(s: &str) -> Result<i64, TaskError> {
///     let n: i64 = s.parse()?; // retryable
///     if n < 0 {
///         return Err(TaskError::fatal("negative amounts are never valid"));
///     }
///     Ok(n)
/// }
/// assert!(parse("x").unwrap_err().is_retryable());
/// assert!(!parse("-1").unwrap_err().is_retryable());
/// ```
pub struct TaskError {
    kind: ErrorKind,
    message: String,
    retryable: bool,
    retry_after: Option<std::time::Duration>,
}

impl TaskError {
    /// An error worth retrying (a flaky dependency, a timeout upstream).
    pub fn retryable(message: impl fmt::Display) -> Self {
        TaskError {
            kind: ErrorKind::TaskError,
            message: message.to_string(),
            retryable: true,
            retry_after: None,
        }
    }

    /// The same error, retried after `delay` instead of the task's backoff: an upstream said
    /// when to come back (an HTTP 429 or 503 with `Retry-After`). The retry still counts an
    /// attempt, within the task's `max_attempts`; the delay is at least the worker's
    /// `min_defer` and at most [`MAX_DELAY`](crate::wire::MAX_DELAY).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ferriq::TaskError;
    /// let e = TaskError::retryable("rate limited").retry_after(Duration::from_secs(30));
    /// assert!(e.is_retryable());
    /// assert_eq!(e.retry_delay(), Some(Duration::from_secs(30)));
    /// ```
    pub fn retry_after(mut self, delay: std::time::Duration) -> Self {
        self.retryable = true;
        self.retry_after = Some(delay.min(crate::wire::MAX_DELAY));
        self
    }

    /// The delay [`TaskError::retry_after`] asked for, if any.
    pub fn retry_delay(&self) -> Option<std::time::Duration> {
        self.retry_after
    }

    /// An error no retry can fix: the task fails at once, its error is stored as the result and
    /// its message is dead-lettered (unless the task says `park_fatal = false`: then the
    /// message is acked, the error result being all there is to it).
    pub fn fatal(message: impl fmt::Display) -> Self {
        TaskError {
            kind: ErrorKind::TaskError,
            message: message.to_string(),
            retryable: false,
            retry_after: None,
        }
    }

    /// The arguments did not fit the parameters (never retried).
    pub fn invalid_arguments(err: ArgumentError) -> Self {
        TaskError {
            kind: ErrorKind::InvalidArguments,
            message: err.to_string(),
            retryable: false,
            retry_after: None,
        }
    }

    pub(crate) fn with_kind(kind: ErrorKind, message: impl fmt::Display, retryable: bool) -> Self {
        TaskError {
            kind,
            message: message.to_string(),
            retryable,
            retry_after: None,
        }
    }

    /// Whether another attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The error message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The kind written into the result.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Debug for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("retryable", &self.retryable)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for TaskError {
    fn from(err: E) -> Self {
        // Keep the whole cause chain: the result is often all an operator sees.
        let mut message = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        TaskError::retryable(message)
    }
}
