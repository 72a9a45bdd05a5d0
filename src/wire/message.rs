use serde::Serialize;
use serde_json::{Map, Value};

use super::typed_labels::{LabelTypes, TypedLabels};
use super::{Labels, TaskId, WireError};

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
#[derive(Debug, Clone, PartialEq)]
pub struct TaskMessage {
    /// The task's identity, shared by every copy of the message.
    pub task_id: TaskId,
    /// The registered name of the task to run.
    pub task_name: String,
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
    pub fn new(task_name: impl Into<String>) -> Self {
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
        let value: Value =
            serde_json::from_slice(body).map_err(|e| WireError::NotJson(e.to_string()))?;
        let Value::Object(mut obj) = value else {
            return Err(WireError::NotJson(
                "the top-level value is not an object".into(),
            ));
        };
        let task_id = match obj.remove("task_id") {
            Some(Value::String(s)) => TaskId::parse(s)?,
            other => return Err(invalid("task_id", "must be a string", other)),
        };
        let task_name = match obj.remove("task_name") {
            Some(Value::String(s)) if !s.is_empty() => s,
            other => return Err(invalid("task_name", "must be a non-empty string", other)),
        };
        let labels = match obj.remove("labels") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            other => return Err(invalid("labels", "must be an object", other)),
        };
        let types = match obj.remove("labels_types") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            other => return Err(invalid("labels_types", "must be an object or null", other)),
        };
        let args = match obj.remove("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a,
            other => return Err(invalid("args", "must be an array", other)),
        };
        let kwargs = match obj.remove("kwargs") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            other => return Err(invalid("kwargs", "must be an object", other)),
        };
        Ok(TaskMessage {
            task_id,
            task_name,
            labels: Labels::from_wire(labels, types.as_ref()),
            args,
            kwargs,
        })
    }

    /// Writes the message as compact taskiq JSON, labels typed the taskiq way.
    pub fn to_json(&self) -> Result<Vec<u8>, WireError> {
        serde_json::to_vec(&WireOut {
            task_id: self.task_id.as_str(),
            task_name: &self.task_name,
            labels: TypedLabels(&self.labels),
            labels_types: LabelTypes(&self.labels),
            args: &self.args,
            kwargs: &self.kwargs,
        })
        .map_err(|e| WireError::Serialize(e.to_string()))
    }

    /// The task id of a body that may not be a valid message, when one can be read; used to
    /// answer the waiting caller of a malformed message.
    pub fn peek_task_id(body: &[u8]) -> Option<TaskId> {
        let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        obj.get("task_id")?
            .as_str()
            .and_then(|s| TaskId::parse(s).ok())
    }

    /// The task name of a body that may not be a valid message, when one can be read.
    pub fn peek_task_name(body: &[u8]) -> Option<String> {
        let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        obj.get("task_name")?.as_str().map(str::to_owned)
    }
}

fn invalid(field: &'static str, what: &str, got: Option<Value>) -> WireError {
    let got = match got {
        None => "it is missing".to_owned(),
        Some(v) => format!("got {}", json_kind(&v)),
    };
    WireError::InvalidField {
        field,
        reason: format!("{what}; {got}"),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
