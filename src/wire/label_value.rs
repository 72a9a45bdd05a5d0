//! One label's value, typed the way taskiq types labels, and how it is read from a body and
//! written back.

use std::borrow::Cow;

use base64::Engine as _;
use serde_json::Value;

use super::float::{format_float, parse_float};

/// taskiq's `LabelType` codes, as written in `labels_types`.
mod code {
    pub const ANY: i64 = 1;
    pub const INT: i64 = 2;
    pub const STR: i64 = 3;
    pub const FLOAT: i64 = 4;
    pub const BOOL: i64 = 5;
    pub const BYTES: i64 = 6;
}

/// One label value, typed the way taskiq types labels.
///
/// taskiq writes every label as a string and records its type in `labels_types`; middlewares may
/// add untyped raw JSON values. Both read into this enum, and it is written back the taskiq way.
///
/// ```
/// use ferriq::wire::LabelValue;
/// assert_eq!(LabelValue::from(3).as_i64(), Some(3));
/// assert_eq!(LabelValue::from("2.5").as_f64(), Some(2.5));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LabelValue {
    /// A string (`labels_types` code 3).
    Str(String),
    /// An integer (code 2).
    Int(i64),
    /// A float (code 4).
    Float(f64),
    /// A boolean (code 5, written `"True"`/`"False"`).
    Bool(bool),
    /// Bytes (code 6, written as base64).
    Bytes(Vec<u8>),
    /// taskiq's "any" (code 1), or a raw JSON value of no simpler type; kept as is.
    Any(Value),
}

/// A label's value as read from a body: a string's text (borrowed from the body when it has
/// no escapes), or any other JSON value. A typed label is read from the text, not from a
/// copy of it.
#[cfg_attr(test, derive(Debug))]
pub(crate) enum RawLabel<'a> {
    /// A JSON string's text.
    Text(Cow<'a, str>),
    /// Any other JSON value.
    Json(Value),
}

impl From<Value> for RawLabel<'_> {
    fn from(value: Value) -> Self {
        match value {
            Value::String(s) => RawLabel::Text(Cow::Owned(s)),
            other => RawLabel::Json(other),
        }
    }
}

impl LabelValue {
    /// Reads a value typed by a `labels_types` code. A value that does not fit its code is kept as
    /// [`LabelValue::Any`] rather than rejected: a label never makes a message unreadable.
    pub(super) fn from_typed(raw: RawLabel<'_>, type_code: Option<i64>) -> LabelValue {
        let text = match raw {
            RawLabel::Text(text) => text,
            RawLabel::Json(value) => {
                return match type_code {
                    Some(code::ANY) => LabelValue::Any(value),
                    _ => LabelValue::from_json(value),
                }
            }
        };
        // A typed value is read from the body's text: only a string label is copied. One
        // that does not read as its type, or of type "any", is kept as the string it is.
        let typed = match type_code {
            Some(code::INT) => text.trim().parse::<i64>().ok().map(LabelValue::Int),
            Some(code::FLOAT) => parse_float(&text).map(LabelValue::Float),
            Some(code::BOOL) => parse_bool(&text).map(LabelValue::Bool),
            Some(code::BYTES) => base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .ok()
                .map(LabelValue::Bytes),
            Some(code::ANY) => None,
            _ => return LabelValue::Str(text.into_owned()),
        };
        typed.unwrap_or_else(|| LabelValue::Any(Value::String(text.into_owned())))
    }

    /// Reads an untyped raw JSON value.
    pub(super) fn from_json(raw: Value) -> LabelValue {
        match raw {
            Value::String(s) => LabelValue::Str(s),
            Value::Bool(b) => LabelValue::Bool(b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => LabelValue::Int(i),
                None => match n.as_f64() {
                    Some(f) if n.is_f64() => LabelValue::Float(f),
                    _ => LabelValue::Any(Value::Number(n)),
                },
            },
            other => LabelValue::Any(other),
        }
    }

    /// The taskiq type code of the value.
    pub(super) fn type_code(&self) -> i64 {
        match self {
            LabelValue::Str(_) => code::STR,
            LabelValue::Int(_) => code::INT,
            LabelValue::Float(_) => code::FLOAT,
            LabelValue::Bool(_) => code::BOOL,
            LabelValue::Bytes(_) => code::BYTES,
            LabelValue::Any(_) => code::ANY,
        }
    }

    /// The value and its type code, written the taskiq way.
    pub(super) fn to_typed(&self) -> (Value, i64) {
        let value = match self {
            LabelValue::Str(s) => Value::String(s.clone()),
            LabelValue::Int(i) => Value::String(i.to_string()),
            LabelValue::Float(f) => Value::String(format_float(*f)),
            LabelValue::Bool(b) => Value::String(python_bool(*b).to_owned()),
            LabelValue::Bytes(b) => {
                Value::String(base64::engine::general_purpose::STANDARD.encode(b))
            }
            LabelValue::Any(v) => v.clone(),
        };
        (value, self.type_code())
    }

    /// The value as plain JSON (numbers as numbers), for result labels and readers that do not
    /// know taskiq's typing.
    pub fn to_json(&self) -> Value {
        match self {
            LabelValue::Str(s) => Value::String(s.clone()),
            LabelValue::Int(i) => Value::from(*i),
            LabelValue::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(format_float(*f))),
            LabelValue::Bool(b) => Value::Bool(*b),
            LabelValue::Bytes(b) => {
                Value::String(base64::engine::general_purpose::STANDARD.encode(b))
            }
            LabelValue::Any(v) => v.clone(),
        }
    }

    /// The value as a string the way taskiq-aio-pika puts labels in AMQP headers.
    pub fn to_header_string(&self) -> String {
        self.header_value().into_owned()
    }

    /// [`LabelValue::to_header_string`], borrowing the value when it is text already.
    pub fn header_value(&self) -> Cow<'_, str> {
        match self {
            LabelValue::Str(s) | LabelValue::Any(Value::String(s)) => Cow::Borrowed(s),
            LabelValue::Bool(b) => Cow::Borrowed(python_bool(*b)),
            other => match other.to_typed().0 {
                Value::String(s) => Cow::Owned(s),
                json => Cow::Owned(json.to_string()),
            },
        }
    }

    /// An integer, from an integer, an integral float or a numeric string.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            LabelValue::Int(i) => Some(*i),
            LabelValue::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(*f as i64),
            LabelValue::Str(s) => s.trim().parse().ok(),
            LabelValue::Any(Value::Number(n)) => n.as_i64(),
            LabelValue::Any(Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// A float, from any number or numeric string.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            LabelValue::Int(i) => Some(*i as f64),
            LabelValue::Float(f) => Some(*f),
            LabelValue::Str(s) => s.trim().parse().ok(),
            LabelValue::Any(Value::Number(n)) => n.as_f64(),
            LabelValue::Any(Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// A boolean, from a bool or `"True"`/`"False"`/`"true"`/`"false"`/`"1"`/`"0"`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            LabelValue::Bool(b) => Some(*b),
            LabelValue::Str(s) | LabelValue::Any(Value::String(s)) => parse_bool(s),
            LabelValue::Int(i) => Some(*i != 0),
            LabelValue::Any(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// A string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            LabelValue::Str(s) | LabelValue::Any(Value::String(s)) => Some(s),
            _ => None,
        }
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim() {
        "True" | "true" | "1" => Some(true),
        "False" | "false" | "0" => Some(false),
        _ => None,
    }
}

/// A boolean as Python's `str(bool)` writes it, as taskiq's typed labels carry it.
pub(super) fn python_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

impl From<&str> for LabelValue {
    fn from(s: &str) -> Self {
        LabelValue::Str(s.to_owned())
    }
}
impl From<String> for LabelValue {
    fn from(s: String) -> Self {
        LabelValue::Str(s)
    }
}
impl From<i64> for LabelValue {
    fn from(i: i64) -> Self {
        LabelValue::Int(i)
    }
}
impl From<i32> for LabelValue {
    fn from(i: i32) -> Self {
        LabelValue::Int(i.into())
    }
}
impl From<u32> for LabelValue {
    fn from(i: u32) -> Self {
        LabelValue::Int(i.into())
    }
}
impl From<f64> for LabelValue {
    fn from(f: f64) -> Self {
        LabelValue::Float(f)
    }
}
impl From<bool> for LabelValue {
    fn from(b: bool) -> Self {
        LabelValue::Bool(b)
    }
}
impl From<Vec<u8>> for LabelValue {
    fn from(b: Vec<u8>) -> Self {
        LabelValue::Bytes(b)
    }
}

/// A `labels_types` entry: taskiq writes an int; accept a numeric string too.
pub(super) fn type_code(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}
