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
        let raw = super::parse::read(body)
            .map_err(|e| WireError::NotJson(e.to_string()))?
            .ok_or_else(|| WireError::NotJson("the top-level value is not an object".into()))?;
        let task_id = raw
            .task_id
            .required()
            .map_err(|got| invalid("task_id", "must be a string", got))?;
        let task_id = TaskId::parse(task_id)?;
        let name_error = |got| invalid("task_name", "must be a non-empty string", got);
        let task_name = match raw.task_name.required().map_err(name_error)? {
            s if s.is_empty() => return Err(name_error(Some("a string"))),
            s => s,
        };
        let labels = raw
            .labels
            .or_empty(Vec::new)
            .map_err(|got| invalid("labels", "must be an object", got))?;
        let types = raw
            .labels_types
            .or_empty(Vec::new)
            .map_err(|got| invalid("labels_types", "must be an object or null", got))?;
        let args = raw
            .args
            .or_empty(Vec::new)
            .map_err(|got| invalid("args", "must be an array", got))?;
        let kwargs = raw
            .kwargs
            .or_empty(Map::new)
            .map_err(|got| invalid("kwargs", "must be an object", got))?;
        Ok(TaskMessage {
            task_id,
            task_name,
            labels: Labels::from_wire(labels, &types),
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

fn invalid(field: &'static str, what: &str, got: Option<&'static str>) -> WireError {
    let got = match got {
        None => "it is missing".to_owned(),
        Some(kind) => format!("got {kind}"),
    };
    WireError::InvalidField {
        field,
        reason: format!("{what}; {got}"),
    }
}
