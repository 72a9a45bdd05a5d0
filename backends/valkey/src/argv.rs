//! Script arguments on the hot path (claims, completions, limiter decisions), as fred values
//! that cost no allocation of their own where they can: numbers go as integers (fred writes
//! their digits straight into its buffer), fixed flags as static text, and text that repeats on
//! every call (the worker's id, a result's JSON kept for a retry) as a `Str`, which a copy
//! counts rather than duplicates. A `String` argument costs two allocations: its own and
//! the shared buffer fred makes of it when it writes the command.

use std::sync::OnceLock;
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::types::Value;

/// A count or a time, as an integer argument (saturated: no limit or time of ours comes near).
pub(crate) fn int(n: impl TryInto<i64>) -> Value {
    Value::Integer(n.try_into().unwrap_or(i64::MAX))
}

/// A duration in microseconds.
pub(crate) fn micros(d: Duration) -> Value {
    int(d.as_micros())
}

/// A duration in milliseconds, at least 1 (Valkey refuses a time to live of 0).
pub(crate) fn millis(d: Duration) -> Value {
    int(d.as_millis().max(1))
}

/// [`millis`] as text, for the rarely run scripts whose arguments are all text.
pub(crate) fn millis_text(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

/// A yes/no flag as the scripts read it: `'1'` or `''`.
pub(crate) fn flag(yes: bool) -> Value {
    static_text(if yes { "1" } else { "" })
}

/// Fixed text.
pub(crate) fn static_text(text: &'static str) -> Value {
    Value::String(Str::from_static(text))
}

/// The worker id of the claims a store makes, kept as one shared `Str`: a store serves one
/// worker as a rule; any other id is copied per call, as before.
#[derive(Default)]
pub(crate) struct WorkerText(OnceLock<Str>);

impl WorkerText {
    /// `worker` as an argument.
    pub(crate) fn get(&self, worker: &str) -> Str {
        let kept = self.0.get_or_init(|| Str::from(worker));
        if &**kept == worker {
            kept.clone()
        } else {
            Str::from(worker)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_flags_are_arguments_without_text() {
        assert_eq!(int(7u32), Value::Integer(7));
        assert_eq!(int(u64::MAX), Value::Integer(i64::MAX));
        assert_eq!(micros(Duration::from_millis(3)), Value::Integer(3000));
        assert_eq!(millis(Duration::from_micros(10)), Value::Integer(1));
        assert_eq!(millis_text(Duration::from_micros(10)), "1");
        assert_eq!(millis_text(Duration::from_secs(2)), "2000");
        assert_eq!(flag(true).as_str().as_deref(), Some("1"));
        assert_eq!(flag(false).as_str().as_deref(), Some(""));
    }

    #[test]
    fn the_worker_id_is_kept_once_and_another_is_copied() {
        let text = WorkerText::default();
        let (first, again) = (text.get("w1"), text.get("w1"));
        assert_eq!(&*first, "w1");
        // The same buffer, counted, not a copy.
        assert_eq!(first.as_ptr(), again.as_ptr());
        let other = text.get("w2");
        assert_eq!(&*other, "w2");
        assert_ne!(other.as_ptr(), text.get("w2").as_ptr());
        assert_eq!(text.get("w1").as_ptr(), first.as_ptr());
    }
}
