//! Flow control declared on a task: a rate limit shared by every worker, per task or per key.

use std::borrow::Cow;

use serde_json::Value;

pub use crate::store::Rate;
use crate::wire::{names, TaskMessage};

/// How long an enqueue's deduplication key keeps answering with its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Dedup {
    /// While the task is queued or running: released when its outcome is stored (and at the
    /// end of the window at the latest).
    #[default]
    WhileActive,
    /// For the whole window, whatever became of the task.
    Window,
    /// Debounce: the task runs once the key has been quiet for the window — each enqueue
    /// within it pushes the run back, and the latest enqueue's arguments win. Every caller
    /// gets the handle of the one task that runs.
    Debounce,
}

impl Dedup {
    /// The `ferriq_dedup_mode` label's value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dedup::WhileActive => "active",
            Dedup::Window => "window",
            Dedup::Debounce => "debounce",
        }
    }
}

/// Where a limit's key comes from: one limiter per value (per tenant, per customer, per API
/// key). `#[task(rate_key = "tenant")]` names an argument of the task (taken from the call's
/// positional or keyword arguments) or, when no parameter has that name, a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySource {
    name: &'static str,
    position: Option<usize>,
}

impl KeySource {
    /// The label `name`.
    pub const fn label(name: &'static str) -> Self {
        KeySource {
            name,
            position: None,
        }
    }

    /// The argument `name`, the `position`-th of the task's arguments.
    pub const fn argument(name: &'static str, position: usize) -> Self {
        KeySource {
            name,
            position: Some(position),
        }
    }

    /// The argument or label name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The key's value in `msg`: its keyword argument or its positional one for an argument,
    /// else the label; `None` when the message carries none.
    pub fn value_in(&self, msg: &TaskMessage) -> Option<String> {
        let value = match self.position {
            Some(position) => msg.kwargs.get(self.name).or_else(|| msg.args.get(position)),
            None => None,
        };
        match value {
            Some(v) => Some(key_text(v)),
            None => msg
                .labels
                .get(self.name)
                .map(|l| l.header_value().into_owned()),
        }
    }
}

fn key_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A limiter's name: its task's, or its task's and a key's value.
pub(crate) type Limiter = Cow<'static, str>;

/// The rate limiter a message's run counts against, and its rate: the `ferriq_rate` and
/// `ferriq_rate_key` labels when a producer set them, else the task's `rate` and `rate_key`
/// options. The limiter is the task name (the registered one, `task`: no copy per run), or the
/// task name and the key's value.
pub(crate) fn rate_limiter(
    task: &'static str,
    task_rate: Option<Rate>,
    task_key: Option<KeySource>,
    msg: &TaskMessage,
) -> Option<(Limiter, Rate)> {
    let from_label = msg
        .labels
        .get(names::RATE)
        .and_then(|l| Rate::parse(&l.header_value()).ok());
    let rate = from_label.or(task_rate)?;
    let key = match msg.labels.get(names::RATE_KEY) {
        Some(value) => Some(value.header_value().into_owned()),
        None => task_key.and_then(|k| k.value_in(msg)),
    };
    let limiter = match key {
        Some(key) => Cow::Owned(format!("{task}\n{key}")),
        None => Cow::Borrowed(task),
    };
    Some((limiter, rate))
}

/// The concurrency limiter a message's run takes a slot of, and its number of slots: the
/// `ferriq_concurrency` and `ferriq_concurrency_key` labels when set, else the task's
/// `concurrency` and `concurrency_key` options.
pub(crate) fn concurrency_limiter(
    task: &'static str,
    task_limit: Option<u32>,
    task_key: Option<KeySource>,
    msg: &TaskMessage,
) -> Option<(Limiter, u32)> {
    let from_label = msg
        .labels
        .get(names::CONCURRENCY)
        .and_then(|l| l.as_i64())
        .filter(|n| *n > 0)
        .map(|n| n.min(i64::from(u32::MAX)) as u32);
    let limit = from_label.or(task_limit)?;
    let key = match msg.labels.get(names::CONCURRENCY_KEY) {
        Some(value) => Some(value.header_value().into_owned()),
        None => task_key.and_then(|k| k.value_in(msg)),
    };
    let limiter = match key {
        Some(key) => Cow::Owned(format!("{task}\n{key}")),
        None => Cow::Borrowed(task),
    };
    Some((limiter, limit))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn rates_read_and_print_as_written() {
        for (text, limit, secs) in [
            ("50/s", 50, 1),
            ("300/m", 300, 60),
            ("1000/h", 1000, 3600),
            ("5/10s", 5, 10),
            ("10/500ms", 10, 0),
            (" 7 / 2m ", 7, 120),
        ] {
            let r = Rate::parse(text).unwrap();
            assert_eq!((r.limit(), r.period().as_secs()), (limit, secs), "{text}");
            assert_eq!(Rate::parse(&r.to_string()).unwrap(), r);
        }
        for bad in ["", "50", "0/s", "50/", "50/d", "x/s", "5/0s", "-1/s"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_key_comes_from_the_argument_then_the_label_and_labels_override() {
        let mut msg = TaskMessage::new("api.call");
        msg.args = vec![serde_json::json!("acme"), serde_json::json!(7)];
        let by_arg = KeySource::argument("tenant", 0);
        assert_eq!(by_arg.value_in(&msg).as_deref(), Some("acme"));
        msg.kwargs.insert("tenant".into(), serde_json::json!(42));
        assert_eq!(by_arg.value_in(&msg).as_deref(), Some("42"));
        msg.labels.insert("customer", "c-9");
        assert_eq!(
            KeySource::label("customer").value_in(&msg).as_deref(),
            Some("c-9")
        );
        let rate = Rate::new(5, Duration::from_secs(1));
        let (limiter, r) = rate_limiter("api.call", Some(rate), Some(by_arg), &msg).unwrap();
        assert_eq!((&*limiter, r), ("api.call\n42", rate));
        msg.labels.insert_named(names::RATE, "9/m");
        msg.labels.insert_named(names::RATE_KEY, "k");
        let (limiter, r) = rate_limiter("api.call", None, None, &msg).unwrap();
        assert_eq!((&*limiter, r.to_string().as_str()), ("api.call\nk", "9/m"));
        assert!(rate_limiter("free", None, None, &TaskMessage::new("free")).is_none());
    }
}
