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
}

impl TaskError {
    /// An error worth retrying (a flaky dependency, a timeout upstream).
    pub fn retryable(message: impl fmt::Display) -> Self {
        TaskError {
            kind: ErrorKind::TaskError,
            message: message.to_string(),
            retryable: true,
        }
    }

    /// An error no retry can fix: the task fails at once and its message is dead-lettered.
    pub fn fatal(message: impl fmt::Display) -> Self {
        TaskError {
            kind: ErrorKind::TaskError,
            message: message.to_string(),
            retryable: false,
        }
    }

    /// The arguments did not fit the parameters (never retried).
    pub fn invalid_arguments(err: ArgumentError) -> Self {
        TaskError {
            kind: ErrorKind::InvalidArguments,
            message: err.to_string(),
            retryable: false,
        }
    }

    pub(crate) fn with_kind(kind: ErrorKind, message: impl fmt::Display, retryable: bool) -> Self {
        TaskError {
            kind,
            message: message.to_string(),
            retryable,
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
