//! Labels written the taskiq way (`labels` with string values and the matching
//! `labels_types`), serialized straight from the message's labels.

use super::float::FloatText;
use super::label_value::python_bool;
use super::{LabelValue, Labels};

/// The labels' values written the taskiq way (every value a string but `Any`), serialized
/// straight from the labels: no map of copies is built for each message sent.
pub(crate) struct TypedLabels<'a>(pub(crate) &'a Labels);

/// The `labels_types` object matching [`TypedLabels`].
pub(crate) struct LabelTypes<'a>(pub(crate) &'a Labels);

impl serde::Serialize for TypedLabels<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0.iter() {
            match value {
                LabelValue::Str(s) => map.serialize_entry(name, s)?,
                LabelValue::Int(i) => map.serialize_entry(name, &AsString(i))?,
                LabelValue::Bool(b) => map.serialize_entry(name, python_bool(*b))?,
                LabelValue::Any(v) => map.serialize_entry(name, v)?,
                LabelValue::Float(f) => map.serialize_entry(name, &AsString(FloatText(*f)))?,
                LabelValue::Bytes(_) => map.serialize_entry(name, &value.to_typed().0)?,
            }
        }
        map.end()
    }
}

impl serde::Serialize for LabelTypes<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0.iter() {
            map.serialize_entry(name, &value.type_code())?;
        }
        map.end()
    }
}

/// Serializes a value through its `Display`, as a JSON string, without an intermediate `String`.
struct AsString<T>(T);

impl<T: std::fmt::Display> serde::Serialize for AsString<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}
