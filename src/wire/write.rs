//! A message's JSON written straight into its buffer.
//!
//! serde_json writes every field name and label name through its escaping loop (a table
//! lookup per byte, then a copy per run of plain bytes): on a message with a few labels that
//! was about a twentieth of a task's instructions on the embedded engine, for names that
//! never need escaping. Here the fixed parts are written as they are, and each string is
//! scanned once: one without a byte to escape is copied whole, any other goes through
//! serde_json's own escaping. The bytes are serde_json's for the same fields (a test holds
//! the two equal), so nothing a reader sees changes.

use serde_json::{Map, Value};

use super::float::write_float;
use super::label_value::python_bool;
use super::words;
use super::{LabelValue, Labels, WireError};

/// Writes the message `{"task_id":…,"task_name":…,"labels":{…},"labels_types":{…},
/// "args":[…],"kwargs":{…}}`, compact, the labels the taskiq way (see `typed_labels.rs`).
pub(super) fn message(
    out: &mut Vec<u8>,
    task_id: &str,
    task_name: &str,
    labels: &Labels,
    args: &[Value],
    kwargs: &Map<String, Value>,
) -> Result<(), WireError> {
    out.extend_from_slice(b"{\"task_id\":");
    string(out, task_id)?;
    out.extend_from_slice(b",\"task_name\":");
    string(out, task_name)?;
    out.extend_from_slice(b",\"labels\":");
    object(out, labels, label_value)?;
    out.extend_from_slice(b",\"labels_types\":");
    object(out, labels, |out, value| number(out, value.type_code()))?;
    out.extend_from_slice(b",\"args\":");
    serde_json::to_writer(&mut *out, args).map_err(serialize)?;
    out.extend_from_slice(b",\"kwargs\":");
    serde_json::to_writer(&mut *out, kwargs).map_err(serialize)?;
    out.push(b'}');
    Ok(())
}

/// The labels as a JSON object, each value written by `value`.
fn object(
    out: &mut Vec<u8>,
    labels: &Labels,
    value: impl Fn(&mut Vec<u8>, &LabelValue) -> Result<(), WireError>,
) -> Result<(), WireError> {
    out.push(b'{');
    for (at, (name, v)) in labels.iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        string(out, name)?;
        out.push(b':');
        value(out, v)?;
    }
    out.push(b'}');
    Ok(())
}

/// A label's value written the taskiq way: every one a string but `Any`.
fn label_value(out: &mut Vec<u8>, value: &LabelValue) -> Result<(), WireError> {
    match value {
        LabelValue::Str(s) => string(out, s),
        LabelValue::Bool(b) => string(out, python_bool(*b)),
        // Digits, a sign, a dot, an exponent, `nan` or `inf`: nothing to escape.
        LabelValue::Int(i) => {
            out.push(b'"');
            out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes());
            out.push(b'"');
            Ok(())
        }
        LabelValue::Float(f) => {
            out.push(b'"');
            write_float(out, *f);
            out.push(b'"');
            Ok(())
        }
        LabelValue::Any(v) => serde_json::to_writer(&mut *out, v).map_err(serialize),
        LabelValue::Bytes(_) => {
            serde_json::to_writer(&mut *out, &value.to_typed().0).map_err(serialize)
        }
    }
}

fn number(out: &mut Vec<u8>, n: i64) -> Result<(), WireError> {
    match u8::try_from(n) {
        Ok(digit @ 0..=9) => {
            out.push(b'0' + digit);
            Ok(())
        }
        _ => {
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            Ok(())
        }
    }
}

/// `s` as a JSON string: copied whole between its quotes when no byte needs escaping (a
/// control byte, `"` or `\`, the bytes serde_json escapes), else through serde_json.
fn string(out: &mut Vec<u8>, s: &str) -> Result<(), WireError> {
    if !needs_escape(s.as_bytes()) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        Ok(())
    } else {
        serde_json::to_writer(&mut *out, s).map_err(serialize)
    }
}

/// Whether any byte of `bytes` is one JSON escapes: a control byte (below 0x20), `"` or `\`.
/// Eight bytes at a time (a message's strings are ids, names and channel names of tens of
/// bytes): the classic tests for a zero byte and a byte below `n` in a word, which say
/// exactly whether one is there.
fn needs_escape(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let w = words::word(chunk);
        if words::string_stops(w) != 0 {
            return true;
        }
    }
    words.remainder().iter().any(|&b| words::is_string_stop(b))
}

fn serialize(e: serde_json::Error) -> WireError {
    WireError::Serialize(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_to_escape_is_found_wherever_it_stands() {
        crate::wire::words::check_every_byte_everywhere(needs_escape, |byte| {
            byte < 0x20 || byte == b'"' || byte == b'\\'
        });
        assert!(!needs_escape("ferriq_enqueued_at".as_bytes()));
        assert!(!needs_escape("télé 😀 \u{7f}".as_bytes()));
        assert!(needs_escape("télé 😀 \u{1f}".as_bytes()));
        assert!(!needs_escape(b""));
    }
}
