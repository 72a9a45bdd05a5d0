use thiserror::Error;

/// Why bytes could not be read as a taskiq message (or a value could not be written as one).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WireError {
    /// The body is not JSON at all, or not a JSON object.
    #[error("message body is not a JSON object: {0}")]
    NotJson(String),
    /// A required field is missing or has the wrong JSON type.
    #[error("message field `{field}` is invalid: {reason}")]
    InvalidField {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The task id is not usable as a key (see [`TaskId`](crate::wire::TaskId)).
    #[error("invalid task id {id:?}: {reason}")]
    InvalidTaskId {
        /// The id as received (truncated to 64 characters).
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The body is larger than the configured maximum; it was not parsed.
    #[error("message body is {size} bytes, over the {max}-byte limit")]
    TooLarge {
        /// Size of the body in bytes.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A value could not be serialised to JSON (for example a map with non-string keys).
    #[error("value cannot be written as JSON: {0}")]
    Serialize(String),
}
