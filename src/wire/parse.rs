//! Reading a message body in one pass: the top-level fields straight into their places, with no
//! `serde_json::Value` tree built first and taken apart after (that tree was most of a worker's
//! cost of reading a message: an allocation per key, a map per object). Arguments and label
//! values stay `Value`s: they are the task's data.
//!
//! What a message does not use (unknown fields, a field of the wrong type) is still read as a
//! `Value` and dropped, not skipped: skipping checks only the syntax, and a body the tree
//! reader refused (a string that is not UTF-8, a lone surrogate, a number out of range, nesting
//! past the depth limit) must stay refused wherever it hides.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use smallvec::SmallVec;

use super::label_value::RawLabel;
use super::WireError;

/// One top-level field as read: what a valid message needs, or what it was instead.
#[cfg_attr(test, derive(Debug))]
pub(super) enum Field<T> {
    Missing,
    Null,
    Read(T),
    /// Present with another JSON type (named as the error message says it: "a number"…).
    Wrong(&'static str),
}

impl<T> Field<T> {
    /// The value of a field that may be left out: missing and null read as empty. `what` is
    /// the rule the error states ("must be an object").
    pub(super) fn or_empty(self, field: &'static str, what: &str) -> Result<T, WireError>
    where
        T: Default,
    {
        match self {
            Field::Missing | Field::Null => Ok(T::default()),
            Field::Read(v) => Ok(v),
            Field::Wrong(kind) => Err(invalid(field, what, Some(kind))),
        }
    }

    /// The value of a field every message has.
    pub(super) fn required(self, field: &'static str, what: &str) -> Result<T, WireError> {
        match self {
            Field::Missing => Err(invalid(field, what, None)),
            Field::Null => Err(invalid(field, what, Some("null"))),
            Field::Read(v) => Ok(v),
            Field::Wrong(kind) => Err(invalid(field, what, Some(kind))),
        }
    }
}

/// A field that breaks its rule, saying what it held instead (`got`: its JSON type, `None`
/// when it is missing).
pub(super) fn invalid(field: &'static str, what: &str, got: Option<&'static str>) -> WireError {
    let got = match got {
        None => "it is missing".to_owned(),
        Some(kind) => format!("got {kind}"),
    };
    WireError::InvalidField {
        field,
        reason: format!("{what}; {got}"),
    }
}

/// Names and values of `labels` or `labels_types` in the order written, the names borrowed
/// from the body unless they hold escapes (a type's name is only looked up; a label's is
/// copied once, into its `Labels`).
/// Kept on the stack up to as many as [`Labels`](super::Labels) keeps in place: reading a
/// message's labels and their types allocates nothing on the way.
/// A label's value is kept as its text when it is a string (see [`RawLabel`]); a type's as the
/// JSON value it is.
pub(super) type Pairs<'de, V = Value> = SmallVec<[(Cow<'de, str>, V); super::label_map::INLINE]>;

/// The labels' entries: names and values as read.
pub(super) type LabelPairs<'de> = Pairs<'de, RawLabel<'de>>;

/// The top-level fields of a message body. `labels` and `labels_types` say what those fields
/// held; their entries are in the vectors given to [`read`].
#[cfg_attr(test, derive(Debug))]
pub(super) struct RawMessage<'de> {
    pub(super) task_id: Field<Cow<'de, str>>,
    pub(super) task_name: Field<Cow<'de, str>>,
    pub(super) labels: Field<()>,
    pub(super) labels_types: Field<()>,
    pub(super) args: Field<Vec<Value>>,
    pub(super) kwargs: Field<Map<String, Value>>,
}

impl RawMessage<'_> {
    /// A message with none of its fields read yet.
    pub(super) fn missing() -> Self {
        RawMessage {
            task_id: Field::Missing,
            task_name: Field::Missing,
            labels: Field::Missing,
            labels_types: Field::Missing,
            args: Field::Missing,
            kwargs: Field::Missing,
        }
    }
}

/// Parses `body`, its `labels` and `labels_types` entries into `labels` and `types` (read in
/// place: moving a few hundred bytes of entries through every field read cost more than the
/// allocation it saves). `Ok(None)`: valid JSON whose top-level value is not an object.
pub(super) fn read<'de>(
    body: &'de [u8],
    labels: &mut LabelPairs<'de>,
    types: &mut Pairs<'de>,
) -> Result<Option<RawMessage<'de>>, serde_json::Error> {
    // The common shape first, read without serde's machinery; anything else from the start.
    if let Ok(text) = std::str::from_utf8(body) {
        if let Some(raw) = fast::read(text, labels, types) {
            return Ok(Some(raw));
        }
    }
    read_general(body, labels, types)
}

/// [`read`] by serde_json alone, whatever the body's shape.
fn read_general<'de>(
    body: &'de [u8],
    labels: &mut LabelPairs<'de>,
    types: &mut Pairs<'de>,
) -> Result<Option<RawMessage<'de>>, serde_json::Error> {
    let top = TopLevel { labels, types };
    // UTF-8 checked once for the whole body: the slice reader checks every string on its own,
    // which was a tenth of reading a message. A body that is not UTF-8 goes to the slice
    // reader, so its error names the string that breaks it, as before.
    match std::str::from_utf8(body) {
        Ok(text) => read_from(serde_json::Deserializer::from_str(text), top),
        Err(_) => read_from(serde_json::Deserializer::from_slice(body), top),
    }
}

fn read_from<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    top: TopLevel<'_, 'de>,
) -> Result<Option<RawMessage<'de>>, serde_json::Error> {
    let raw = (&mut de).deserialize_any(top)?;
    de.end()?;
    Ok(raw)
}

struct TopLevel<'a, 'de> {
    labels: &'a mut LabelPairs<'de>,
    types: &'a mut Pairs<'de>,
}

impl<'de> Visitor<'de> for TopLevel<'_, 'de> {
    type Value = Option<RawMessage<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a task message object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut raw = RawMessage::missing();
        // A repeated key keeps its last value, as a JSON object read into a map does.
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::TaskId => raw.task_id = map.next_value_seed(Of(Kind::Str))?.into_str(),
                Key::TaskName => raw.task_name = map.next_value_seed(Of(Kind::Str))?.into_str(),
                Key::Labels => raw.labels = map.next_value_seed(PairsInto(&mut *self.labels))?,
                Key::LabelsTypes => {
                    raw.labels_types = map.next_value_seed(PairsInto(&mut *self.types))?
                }
                Key::Args => raw.args = map.next_value_seed(Of(Kind::Array))?.into_array(),
                Key::Kwargs => raw.kwargs = map.next_value_seed(Of(Kind::Object))?.into_object(),
                Key::Other => {
                    map.next_value::<Value>()?;
                }
            }
        }
        Ok(Some(raw))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Value>()?.is_some() {}
        Ok(None)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A top-level key, matched without allocating it.
enum Key {
    TaskId,
    TaskName,
    Labels,
    LabelsTypes,
    Args,
    Kwargs,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "task_id" => Key::TaskId,
                    "task_name" => Key::TaskName,
                    "labels" => Key::Labels,
                    "labels_types" => Key::LabelsTypes,
                    "args" => Key::Args,
                    "kwargs" => Key::Kwargs,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// The JSON type a field must have.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Array,
    Object,
}

/// A field's value read as its expected type, or the name of the type it has instead.
enum Read<'de> {
    Str(Cow<'de, str>),
    Array(Vec<Value>),
    Object(Map<String, Value>),
    Null,
    Wrong(&'static str),
}

impl<'de> Read<'de> {
    fn into_str(self) -> Field<Cow<'de, str>> {
        match self {
            Read::Str(s) => Field::Read(s),
            other => other.mismatch(),
        }
    }
    fn into_array(self) -> Field<Vec<Value>> {
        match self {
            Read::Array(a) => Field::Read(a),
            other => other.mismatch(),
        }
    }
    fn into_object(self) -> Field<Map<String, Value>> {
        match self {
            Read::Object(o) => Field::Read(o),
            other => other.mismatch(),
        }
    }
    fn mismatch<T>(self) -> Field<T> {
        match self {
            Read::Null => Field::Null,
            Read::Wrong(kind) => Field::Wrong(kind),
            Read::Str(_) => Field::Wrong("a string"),
            Read::Object(_) => Field::Wrong("an object"),
            Read::Array(_) => Field::Wrong("an array"),
        }
    }
}

/// Reads one field's value as `Kind`; any other value is consumed and named.
struct Of(Kind);

impl<'de> DeserializeSeed<'de> for Of {
    type Value = Read<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Read<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Of {
    type Value = Read<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Read<'de>, E> {
        Ok(match self.0 {
            // Borrowed: the id is copied once, into the `TaskId`.
            Kind::Str => Read::Str(Cow::Borrowed(s)),
            _ => Read::Wrong("a string"),
        })
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Read<'de>, E> {
        Ok(match self.0 {
            Kind::Str => Read::Str(Cow::Owned(s.to_owned())),
            _ => Read::Wrong("a string"),
        })
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Read<'de>, E> {
        Ok(match self.0 {
            Kind::Str => Read::Str(Cow::Owned(s)),
            _ => Read::Wrong("a string"),
        })
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Read<'de>, E> {
        Ok(Read::Wrong("a boolean"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Read<'de>, E> {
        Ok(Read::Wrong("a number"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Read<'de>, E> {
        Ok(Read::Wrong("a number"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Read<'de>, E> {
        Ok(Read::Wrong("a number"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Read<'de>, E> {
        Ok(Read::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Read<'de>, A::Error> {
        if let Kind::Array = self.0 {
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(v) = seq.next_element::<Value>()? {
                items.push(v);
            }
            return Ok(Read::Array(items));
        }
        while seq.next_element::<Value>()?.is_some() {}
        Ok(Read::Wrong("an array"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Read<'de>, A::Error> {
        match self.0 {
            Kind::Object => {
                let mut object = Map::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    object.insert(k, v);
                }
                Ok(Read::Object(object))
            }
            Kind::Str | Kind::Array => {
                while map.next_entry::<String, Value>()?.is_some() {}
                Ok(Read::Wrong("an object"))
            }
        }
    }
}

/// Reads `labels` or `labels_types` into the vector it holds, in the order written (emptied
/// first: of a field written twice, the last counts).
struct PairsInto<'a, 'de, V>(&'a mut Pairs<'de, V>);

impl<'de, V: From<Value>> DeserializeSeed<'de> for PairsInto<'_, 'de, V> {
    type Value = Field<()>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Field<()>, D::Error> {
        self.0.clear();
        d.deserialize_any(self)
    }
}

impl<'de, V> PairsInto<'_, 'de, V> {
    /// What a value that is not an object was, named as for any object field.
    fn not_an_object(read: Read<'de>) -> Field<()> {
        match read.into_object() {
            Field::Read(_) => Field::Wrong("an object"),
            Field::Missing => Field::Missing,
            Field::Null => Field::Null,
            Field::Wrong(kind) => Field::Wrong(kind),
        }
    }
}

impl<'de, V: From<Value>> Visitor<'de> for PairsInto<'_, 'de, V> {
    type Value = Field<()>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field<()>, A::Error> {
        while let Some((KeyCow(k), v)) = map.next_entry::<KeyCow<'de>, Value>()? {
            self.0.push((k, V::from(v)));
        }
        Ok(Field::Read(()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Field<()>, A::Error> {
        Of(Kind::Object).visit_seq(seq).map(Self::not_an_object)
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Field<()>, E> {
        Of(Kind::Object)
            .visit_borrowed_str(s)
            .map(Self::not_an_object)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Field<()>, E> {
        Of(Kind::Object).visit_str(s).map(Self::not_an_object)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Field<()>, E> {
        Of(Kind::Object).visit_bool(v).map(Self::not_an_object)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Field<()>, E> {
        Of(Kind::Object).visit_i64(v).map(Self::not_an_object)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Field<()>, E> {
        Of(Kind::Object).visit_u64(v).map(Self::not_an_object)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Field<()>, E> {
        Of(Kind::Object).visit_f64(v).map(Self::not_an_object)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Field<()>, E> {
        Ok(Field::Null)
    }
}

/// An object key, borrowed from the body when it has no escapes.
struct KeyCow<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for KeyCow<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyCowVisitor;
        impl<'de> Visitor<'de> for KeyCowVisitor {
            type Value = KeyCow<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<KeyCow<'de>, E> {
                Ok(KeyCow(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<KeyCow<'de>, E> {
                Ok(KeyCow(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<KeyCow<'de>, E> {
                Ok(KeyCow(Cow::Owned(s)))
            }
        }
        d.deserialize_str(KeyCowVisitor)
    }
}

mod fast;

#[cfg(test)]
mod tests;
