use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Labels;

/// A task's stored outcome: a taskiq `TaskiqResult`.
///
/// ```
/// use ferriq::wire::TaskResult;
/// let raw = br#"{"is_err": false, "log": null, "return_value": 5, "execution_time": 0.0, "labels": {}, "error": null}"#;
/// let result: TaskResult = serde_json::from_slice(raw).unwrap();
/// assert_eq!(result.return_value, serde_json::json!(5));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// Whether the task failed.
    pub is_err: bool,
    /// taskiq's log field; ferriq writes null.
    #[serde(default)]
    pub log: Option<String>,
    /// The task's return value (null on error).
    #[serde(default)]
    pub return_value: Value,
    /// Seconds the run took.
    #[serde(default)]
    pub execution_time: f64,
    /// The message's labels, written as plain JSON (numbers as numbers, taskiq's way for
    /// results). Shared with the message they came from: a result costs no copy of them.
    #[serde(default, with = "plain_labels")]
    pub labels: Labels,
    /// The error, when `is_err`.
    #[serde(default)]
    pub error: Option<ExceptionRepr>,
}

/// taskiq's serialised exception.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExceptionRepr {
    /// The exception class name; for ferriq errors one of [`ErrorKind`]'s names.
    pub exc_type: String,
    /// The exception's arguments. ferriq writes `[message, {"retryable": bool, "attempts": n}]`.
    #[serde(default)]
    pub exc_message: Vec<Value>,
    /// The module of the exception class; `"ferriq"` for ferriq errors.
    #[serde(default)]
    pub exc_module: Option<String>,
    /// The exception's `__cause__`.
    #[serde(default)]
    pub exc_cause: Option<Box<ExceptionRepr>>,
    /// The exception's `__context__`.
    #[serde(default)]
    pub exc_context: Option<Box<ExceptionRepr>>,
    /// The exception's `__suppress_context__`.
    #[serde(default)]
    pub exc_suppress_context: bool,
}

/// The fixed set of error types ferriq writes into results (`exc_type`, `exc_module: "ferriq"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The task returned an error.
    TaskError,
    /// The arguments did not fit the task's parameters.
    InvalidArguments,
    /// The message body was not a valid task message.
    InvalidMessage,
    /// No worker serves the task name.
    UnknownTask,
    /// The task's `deadline_at` passed before it could start.
    DeadlineExceeded,
    /// The run exceeded its timeout on its last attempt.
    Timeout,
    /// The task was revoked.
    Cancelled,
    /// Every attempt failed with a retryable error.
    RetriesExhausted,
}

impl ErrorKind {
    /// Every kind, for parsing.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::TaskError,
        ErrorKind::InvalidArguments,
        ErrorKind::InvalidMessage,
        ErrorKind::UnknownTask,
        ErrorKind::DeadlineExceeded,
        ErrorKind::Timeout,
        ErrorKind::Cancelled,
        ErrorKind::RetriesExhausted,
    ];

    /// The name written as `exc_type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::TaskError => "TaskError",
            ErrorKind::InvalidArguments => "InvalidArguments",
            ErrorKind::InvalidMessage => "InvalidMessage",
            ErrorKind::UnknownTask => "UnknownTask",
            ErrorKind::DeadlineExceeded => "DeadlineExceeded",
            ErrorKind::Timeout => "Timeout",
            ErrorKind::Cancelled => "Cancelled",
            ErrorKind::RetriesExhausted => "RetriesExhausted",
        }
    }

    fn parse(s: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed task's error as its caller sees it, read from the stored result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("task failed with {exc_type}: {message}")]
pub struct TaskFailure {
    /// The ferriq kind, when the error was written by ferriq.
    pub kind: Option<ErrorKind>,
    /// `exc_type` as stored (a Python class name when a Python worker wrote it).
    pub exc_type: String,
    /// The error message.
    pub message: String,
    /// Whether the last attempt's error was retryable (false when unknown): `true` beside
    /// [`ErrorKind::RetriesExhausted`] means the task failed only because its attempts ran
    /// out, so running it again later (a redrive) may succeed.
    pub retryable: bool,
    /// Attempts made (0 when unknown).
    pub attempts: u32,
}

impl TaskResult {
    /// A successful result.
    pub fn success(return_value: Value, execution_time: f64, labels: Labels) -> Self {
        TaskResult {
            is_err: false,
            log: None,
            return_value,
            execution_time,
            labels,
            error: None,
        }
    }

    /// A failed result written by ferriq.
    pub fn failure(
        kind: ErrorKind,
        message: impl Into<String>,
        retryable: bool,
        attempts: u32,
        execution_time: f64,
        labels: Labels,
    ) -> Self {
        let mut details = Map::new();
        details.insert("retryable".into(), Value::Bool(retryable));
        details.insert("attempts".into(), Value::from(attempts));
        TaskResult {
            is_err: true,
            log: None,
            return_value: Value::Null,
            execution_time,
            labels,
            error: Some(ExceptionRepr {
                exc_type: kind.as_str().to_owned(),
                exc_message: vec![Value::String(message.into()), Value::Object(details)],
                exc_module: Some("ferriq".to_owned()),
                exc_cause: None,
                exc_context: None,
                exc_suppress_context: false,
            }),
        }
    }

    /// The error as a [`TaskFailure`], when the result is an error.
    pub fn failure_details(&self) -> Option<TaskFailure> {
        if !self.is_err {
            return None;
        }
        let Some(error) = &self.error else {
            return Some(TaskFailure {
                kind: None,
                exc_type: "Exception".into(),
                message: "the task failed without an error description".into(),
                retryable: false,
                attempts: 0,
            });
        };
        let ours = error.exc_module.as_deref() == Some("ferriq");
        let message = match error.exc_message.first() {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let details = error.exc_message.get(1).and_then(Value::as_object);
        let flag = |k: &str| details.and_then(|d| d.get(k));
        Some(TaskFailure {
            kind: if ours {
                ErrorKind::parse(&error.exc_type)
            } else {
                None
            },
            exc_type: error.exc_type.clone(),
            message,
            retryable: flag("retryable").and_then(Value::as_bool).unwrap_or(false),
            attempts: flag("attempts")
                .and_then(Value::as_u64)
                .map(|a| a.min(u64::from(u32::MAX)) as u32)
                .unwrap_or(0),
        })
    }
}

/// Result labels as taskiq writes them: a JSON object of plain values.
mod plain_labels {
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::{Map, Value};

    use crate::wire::{LabelValue, Labels};

    pub(super) fn serialize<S: Serializer>(labels: &Labels, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(labels.len()))?;
        for (name, value) in labels.iter() {
            map.serialize_entry(name, &Plain(value))?;
        }
        map.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Labels, D::Error> {
        // A null (some writers) reads as no labels, like a missing field.
        let map = Option::<Map<String, Value>>::deserialize(d)?.unwrap_or_default();
        Ok(Labels::from_plain(map))
    }

    /// One value as plain JSON, written without building a `Value` first.
    struct Plain<'a>(&'a LabelValue);

    impl Serialize for Plain<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self.0 {
                LabelValue::Str(v) => s.serialize_str(v),
                LabelValue::Int(v) => s.serialize_i64(*v),
                LabelValue::Bool(v) => s.serialize_bool(*v),
                LabelValue::Any(v) => v.serialize(s),
                // Non-finite floats and bytes have no plain JSON form of their own.
                other => other.to_json().serialize(s),
            }
        }
    }
}
