use serde::Serialize;
use serde_json::{Map, Value};

use super::parse::{invalid, Pairs};
use super::typed_labels::{LabelTypes, TypedLabels};
use super::{Labels, TaskId, TaskName, WireError};

/// The wire version this build writes and the newest it runs (label `ferriq_wire`).
pub const WIRE_VERSION: u32 = 1;

/// One task message: a taskiq `TaskiqMessage`.
///
/// ```
/// use ferriq::wire::TaskMessage;
/// let body = br#"{"task_id":"0123456789abcdef0123456789abcdef","task_name":"add",
///                 "labels":{},"labels_types":null,"args":[1,2],"kwargs":{}}"#;
/// let msg = TaskMessage::from_json(body).unwrap();
/// assert_eq!(msg.task_name, "add");
/// assert_eq!(TaskMessage::from_json(&msg.to_json().unwrap()).unwrap(), msg);
/// ```
#[derive(Clone, PartialEq)]
pub struct TaskMessage {
    /// The task's identity, shared by every copy of the message.
    pub task_id: TaskId,
    /// The registered name of the task to run.
    pub task_name: TaskName,
    /// Labels: options and metadata (see [`Labels`]).
    pub labels: Labels,
    /// Positional arguments.
    pub args: Vec<Value>,
    /// Keyword arguments.
    pub kwargs: Map<String, Value>,
}

#[derive(Serialize)]
struct WireOut<'a> {
    task_id: &'a str,
    task_name: &'a str,
    labels: TypedLabels<'a>,
    labels_types: LabelTypes<'a>,
    args: &'a [Value],
    kwargs: &'a Map<String, Value>,
}

impl TaskMessage {
    /// A message for `task_name` with a fresh id and no arguments or labels.
    pub fn new(task_name: impl Into<TaskName>) -> Self {
        TaskMessage {
            task_id: TaskId::random(),
            task_name: task_name.into(),
            labels: Labels::new(),
            args: Vec::new(),
            kwargs: Map::new(),
        }
    }

    /// Parses a message body. Any JSON form taskiq produces is accepted: `labels_types` may be
    /// missing or null, labels may be typed strings or raw JSON values, and missing `labels`,
    /// `args` or `kwargs` read as empty.
    pub fn from_json(body: &[u8]) -> Result<Self, WireError> {
        let (mut labels, mut types) = (Pairs::new(), Pairs::new());
        let raw = super::parse::read(body, &mut labels, &mut types)
            .map_err(|e| WireError::NotJson(e.to_string()))?
            .ok_or_else(|| WireError::NotJson("the top-level value is not an object".into()))?;
        let task_id = TaskId::parse(raw.task_id.required("task_id", "must be a string")?)?;
        let name_rule = "must be a non-empty string";
        let task_name = TaskName::from(raw.task_name.required("task_name", name_rule)?);
        if task_name.is_empty() {
            return Err(invalid("task_name", name_rule, Some("a string")));
        }
        raw.labels.or_empty("labels", "must be an object")?;
        raw.labels_types
            .or_empty("labels_types", "must be an object or null")?;
        let args = raw.args.or_empty("args", "must be an array")?;
        let kwargs = raw.kwargs.or_empty("kwargs", "must be an object")?;
        Ok(TaskMessage {
            task_id,
            task_name,
            // Drained, not moved: the entries are read where they lie.
            labels: Labels::from_wire(labels.drain(..), &types),
            args,
            kwargs,
        })
    }

    /// Writes the message as compact taskiq JSON, labels typed the taskiq way.
    pub fn to_json(&self) -> Result<Vec<u8>, WireError> {
        // Sized for a small message's fields, so writing one does not grow the buffer on the
        // way (serde_json starts at 128 bytes, below a message with an id and a few labels).
        let mut out = Vec::with_capacity(384 + self.task_name.len());
        super::write::message(
            &mut out,
            self.task_id.as_str(),
            &self.task_name,
            &self.labels,
            &self.args,
            &self.kwargs,
        )?;
        Ok(out)
    }

    /// The message as the JSON value [`to_json`](Self::to_json) writes, for records that keep
    /// a message to send later (a chain's steps, a chord's callback): built in one pass, not
    /// written and read back.
    pub(crate) fn to_json_value(&self) -> Result<serde_json::Value, WireError> {
        serde_json::to_value(self.wire_out()).map_err(|e| WireError::Serialize(e.to_string()))
    }

    fn wire_out(&self) -> WireOut<'_> {
        WireOut {
            task_id: self.task_id.as_str(),
            task_name: &self.task_name,
            labels: TypedLabels(&self.labels),
            labels_types: LabelTypes(&self.labels),
            args: &self.args,
            kwargs: &self.kwargs,
        }
    }

    /// The task id of a body that may not be a valid message, when one can be read; used to
    /// answer the waiting caller of a malformed message.
    pub fn peek_task_id(body: &[u8]) -> Option<TaskId> {
        TaskId::parse(&Peek::of(body)?.task_id.text()?).ok()
    }

    /// The task name of a body that may not be a valid message, when one can be read.
    pub fn peek_task_name(body: &[u8]) -> Option<String> {
        Peek::of(body)?
            .task_name
            .text()
            .map(std::borrow::Cow::into_owned)
    }
}

/// A body's id and name, read without building the rest: every other field is skipped
/// unread (the whole body used to be built as a JSON tree, once more per delivery on
/// brokers that carry no id beside the body).
#[derive(serde::Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    task_id: Text<'a>,
    #[serde(borrow, default)]
    task_name: Text<'a>,
}

/// A string field, or any other JSON value (an id written as a number names no task).
#[derive(serde::Deserialize, Default)]
#[serde(untagged)]
enum Text<'a> {
    Str(#[serde(borrow)] std::borrow::Cow<'a, str>),
    #[default]
    #[serde(skip)]
    Missing,
    Other(serde::de::IgnoredAny),
}

impl<'a> Text<'a> {
    fn text(self) -> Option<std::borrow::Cow<'a, str>> {
        match self {
            Text::Str(s) => Some(s),
            Text::Missing | Text::Other(_) => None,
        }
    }
}

impl<'a> Peek<'a> {
    /// The body's id and name when it is a JSON object (serde would also take an array).
    fn of(body: &'a [u8]) -> Option<Self> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
        if *first != b'{' {
            return None;
        }
        serde_json::from_slice(body).ok()
    }
}

/// Arguments and label values are user data: `Debug` shows their shape, never their values,
/// so a message logged with `{:?}` leaks nothing.
impl std::fmt::Debug for TaskMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskMessage")
            .field("task_id", &self.task_id)
            .field("task_name", &self.task_name)
            .field(
                "labels",
                &self.labels.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("args", &format_args!("<{} values>", self.args.len()))
            .field("kwargs", &self.kwargs.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::wire::LabelValue;

    #[test]
    fn a_message_is_written_as_serde_json_writes_its_fields() {
        let mut plain = TaskMessage::new("mail.send");
        plain.args = vec![json!(1), json!("two")];
        let mut odd = TaskMessage::new("t\u{e9}l\u{e9}\"\\\n\u{1}\u{7f}\u{1F600}".to_owned());
        odd.task_id = TaskId::parse(r#"a"b\c"#).unwrap();
        odd.args = vec![json!({"k": [1.5, null, "x\ty"]}), json!(-7)];
        odd.kwargs.insert("na\"me".into(), json!({"n": 1e300}));
        for (name, value) in [
            ("s", LabelValue::Str("plain".into())),
            (
                "quote\"d",
                LabelValue::Str("a\"b\\c\u{0}\u{1f} \u{2028}".into()),
            ),
            ("i", LabelValue::Int(-12345678901)),
            ("f", LabelValue::Float(1733.125)),
            ("big", LabelValue::Float(1.0e300)),
            ("nan", LabelValue::Float(f64::NAN)),
            ("inf", LabelValue::Float(f64::NEG_INFINITY)),
            ("b", LabelValue::Bool(false)),
            ("any", LabelValue::Any(json!({"x": [1, "y"]}))),
            ("bytes", LabelValue::Bytes(vec![0, 255, 34])),
            (
                crate::wire::names::ENQUEUED_AT,
                LabelValue::Float(1765000000.5),
            ),
            (
                crate::wire::names::REPLY_TO,
                LabelValue::Str("ferriq:results:abc".into()),
            ),
        ] {
            odd.labels.insert(name, value);
        }
        for msg in [TaskMessage::new("x"), plain, odd] {
            let by_serde = serde_json::to_vec(&msg.wire_out()).unwrap();
            let written = msg.to_json().unwrap();
            assert_eq!(
                String::from_utf8(written.clone()).unwrap(),
                String::from_utf8(by_serde).unwrap()
            );
            let back = TaskMessage::from_json(&written).unwrap();
            assert_eq!(back.task_id, msg.task_id);
            assert_eq!(back.task_name, msg.task_name);
            assert_eq!(back.args, msg.args);
            assert_eq!(back.kwargs, msg.kwargs);
        }
    }

    #[test]
    fn a_bodys_id_and_name_are_read_even_when_the_rest_is_not_a_message() {
        let id = TaskId::random();
        let body = format!(
            r#"{{"labels": [1, {{"x": null}}], "task_name": "mail.send", "args": 5, "task_id": "{id}"}}"#
        );
        assert!(TaskMessage::from_json(body.as_bytes()).is_err());
        assert_eq!(TaskMessage::peek_task_id(body.as_bytes()), Some(id.clone()));
        assert_eq!(
            TaskMessage::peek_task_name(body.as_bytes()).as_deref(),
            Some("mail.send")
        );
        // Escaped text is read too.
        let escaped = format!(r#"{{"task_name": "a\"b", "task_id": "{id}"}}"#);
        assert_eq!(
            TaskMessage::peek_task_name(escaped.as_bytes()).as_deref(),
            Some("a\"b")
        );
        // What names no task: an id of another type, no object, not JSON.
        for body in [
            r#"{"task_id": 12, "task_name": ["x"]}"#.to_owned(),
            format!(r#"["{id}", "mail.send"]"#),
            "{not json".to_owned(),
            String::new(),
        ] {
            assert_eq!(TaskMessage::peek_task_id(body.as_bytes()), None, "{body}");
            assert_eq!(TaskMessage::peek_task_name(body.as_bytes()), None, "{body}");
        }
    }

    #[test]
    fn the_json_value_is_what_the_json_bytes_read_back_as() {
        let mut msg = TaskMessage::new("wire.value");
        msg.args = vec![json!(1.5), json!("two"), json!({"three": [3]})];
        msg.kwargs.insert("big".into(), json!(u64::MAX));
        for (name, value) in [
            ("text", LabelValue::from("a")),
            ("int", LabelValue::from(-7)),
            ("float", LabelValue::from(0.1)),
            ("bool", LabelValue::from(true)),
            ("bytes", LabelValue::from(vec![0u8, 255])),
            ("any", LabelValue::Any(json!({"nested": [null]}))),
        ] {
            msg.labels.insert(name, value);
        }
        let read_back: Value = serde_json::from_slice(&msg.to_json().unwrap()).unwrap();
        assert_eq!(msg.to_json_value().unwrap(), read_back);
    }
}
