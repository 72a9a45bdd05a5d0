//! The shape nearly every message has, read without serde's machinery: the six top-level
//! fields once each, names and plain strings (no escapes) borrowed as they lie, label values
//! that are plain strings, type codes that are integers, and arguments that are plain strings,
//! integers, booleans or nulls. serde_json's generic reader spent about 2,500 instructions a
//! message on those; arguments of any other shape (objects, floats, nested lists) and non-empty
//! keyword arguments are still read by serde_json, from where they start.
//!
//! Anything else — an escape, another field, a field given twice, a label value of another
//! type, nesting deep enough to reach serde_json's depth limit, text that is not JSON — makes
//! [`read`] decline, and the body is read by the general reader from its start: this one
//! never accepts what that one refuses, and what it accepts reads the same (`tests.rs` holds
//! the two equal on generated bodies).

use std::borrow::Cow;

use serde_json::{Map, Number, Value};

use super::{Field, LabelPairs, Pairs, RawLabel, RawMessage};
use crate::wire::words;

/// Reads `text` when it has the common shape; `None` leaves it to the general reader (with
/// `labels` and `types` emptied).
pub(super) fn read<'de>(
    text: &'de str,
    labels: &mut LabelPairs<'de>,
    types: &mut Pairs<'de>,
) -> Option<RawMessage<'de>> {
    let read = Reader { text, at: 0 }.message(labels, types);
    if read.is_none() {
        labels.clear();
        types.clear();
    }
    read
}

struct Reader<'de> {
    text: &'de str,
    at: usize,
}

/// serde_json refuses nesting past 128 levels. `args` and `kwargs` are read here on their
/// own, a level shallower than inside the message: any with this many brackets is left to the
/// general reader, which counts the levels from the top.
const BRACKETS_READ_ALONE: usize = 100;

impl<'de> Reader<'de> {
    fn message(
        mut self,
        labels: &mut LabelPairs<'de>,
        types: &mut Pairs<'de>,
    ) -> Option<RawMessage<'de>> {
        let mut raw = RawMessage::missing();
        self.expect(b'{')?;
        let mut seen = 0u8;
        if self.peek()? == b'}' {
            self.at += 1;
        } else {
            loop {
                let key = self.field_name()?;
                self.expect(b':')?;
                let bit = match key {
                    "task_id" => {
                        raw.task_id = self.string_or_null()?;
                        1
                    }
                    "task_name" => {
                        raw.task_name = self.string_or_null()?;
                        2
                    }
                    "labels" => {
                        raw.labels = self.pairs(labels, Reader::label_value)?;
                        4
                    }
                    "labels_types" => {
                        raw.labels_types = self.pairs(types, Reader::type_code)?;
                        8
                    }
                    "args" => {
                        raw.args = match self.scalar_array() {
                            Some(items) => Field::Read(items),
                            None => self.data::<Vec<Value>>(b'[')?,
                        };
                        16
                    }
                    "kwargs" => {
                        raw.kwargs = if self.empty_object() {
                            Field::Read(Map::new())
                        } else {
                            self.data::<Map<String, Value>>(b'{')?
                        };
                        32
                    }
                    _ => return None,
                };
                if seen & bit != 0 {
                    return None;
                }
                seen |= bit;
                if !self.comma_or_end(b'}')? {
                    break;
                }
            }
        }
        self.skip_whitespace();
        (self.at == self.text.len()).then_some(raw)
    }

    fn skip_whitespace(&mut self) {
        let bytes = self.text.as_bytes();
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte that is not whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.text.as_bytes().get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// After a member: `true` at a comma (another follows), `false` at `close`.
    fn comma_or_end(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.at += 1;
                Some(true)
            }
            b if b == close => {
                self.at += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// A top-level field's name, matched against the six a message has by their bytes with the
    /// closing quote (no scan for where the string ends); any other name declines.
    fn field_name(&mut self) -> Option<&'static str> {
        const FIELDS: [&str; 6] = [
            "task_id",
            "task_name",
            "labels_types",
            "labels",
            "args",
            "kwargs",
        ];
        self.expect(b'"')?;
        let rest = self.text.as_bytes().get(self.at..)?;
        let name = FIELDS.into_iter().find(|name| {
            rest.len() > name.len() && rest[name.len()] == b'"' && rest.starts_with(name.as_bytes())
        })?;
        self.at += name.len() + 1;
        Some(name)
    }

    /// A string without escapes, borrowed. JSON strings may not hold a control byte; the text
    /// is already known to be UTF-8, and `"` is ASCII, so the slice is on character bounds.
    fn plain_string(&mut self) -> Option<&'de str> {
        self.expect(b'"')?;
        let start = self.at;
        let len = plain_len(&self.text.as_bytes()[start..])?;
        let s = self.text.get(start..start + len)?;
        self.at = start + len + 1;
        Some(s)
    }

    fn null(&mut self) -> Option<()> {
        self.skip_whitespace();
        self.literal("null", Value::Null).map(drop)
    }

    fn string_or_null(&mut self) -> Option<Field<Cow<'de, str>>> {
        match self.peek()? {
            b'"' => Some(Field::Read(Cow::Borrowed(self.plain_string()?))),
            b'n' => self.null().map(|()| Field::Null),
            _ => None,
        }
    }

    /// `labels` or `labels_types`: an object (or null) whose values `value` reads.
    fn pairs<V>(
        &mut self,
        into: &mut Pairs<'de, V>,
        value: fn(&mut Self) -> Option<V>,
    ) -> Option<Field<()>> {
        match self.peek()? {
            b'n' => return self.null().map(|()| Field::Null),
            b'{' => self.at += 1,
            _ => return None,
        }
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(Field::Read(()));
        }
        loop {
            let name = self.plain_string()?;
            self.expect(b':')?;
            let v = value(self)?;
            into.push((Cow::Borrowed(name), v));
            if !self.comma_or_end(b'}')? {
                return Some(Field::Read(()));
            }
        }
    }

    /// A label's value as ferriq and taskiq write it: a plain string, kept as the body's text.
    fn label_value(&mut self) -> Option<RawLabel<'de>> {
        if self.peek()? != b'"' {
            return None;
        }
        self.plain_string()
            .map(|s| RawLabel::Text(Cow::Borrowed(s)))
    }

    /// A label's type code: an integer, as serde_json reads it. Type codes are 0–5.
    fn type_code(&mut self) -> Option<Value> {
        self.integer().map(Value::Number)
    }

    /// An integer without a fraction or exponent, as serde_json reads it: a non-negative one
    /// as unsigned, a negative one as signed (`-0`, which it reads as a float, is declined).
    fn integer(&mut self) -> Option<Number> {
        self.skip_whitespace();
        let bytes = self.text.as_bytes();
        let negative = bytes.get(self.at) == Some(&b'-');
        let start = self.at + usize::from(negative);
        let mut magnitude: u64 = 0;
        let mut digits = 0;
        while let Some(&b) = bytes.get(start + digits) {
            if !b.is_ascii_digit() {
                break;
            }
            // Up to 18 digits: below 10^18, fits an i64 either way.
            if digits == 18 {
                return None;
            }
            magnitude = magnitude * 10 + u64::from(b - b'0');
            digits += 1;
        }
        // No leading zero (JSON has none), no fraction or exponent.
        if digits == 0 || (digits > 1 && bytes[start] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = bytes.get(start + digits) {
            return None;
        }
        if negative && magnitude == 0 {
            return None;
        }
        self.at = start + digits;
        Some(if negative {
            Number::from(-(magnitude as i64))
        } else {
            Number::from(magnitude)
        })
    }

    /// `args` when it holds only plain strings, integers, booleans and nulls (a task's
    /// arguments most often are ids, counts and names); `None` leaves it to serde_json, from
    /// where it starts.
    fn scalar_array(&mut self) -> Option<Vec<Value>> {
        let start = self.at;
        let read = self.scalars();
        if read.is_none() {
            self.at = start;
        }
        read
    }

    fn scalars(&mut self) -> Option<Vec<Value>> {
        self.expect(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            return Some(Vec::new());
        }
        // Room for a few: allocated once, where growing from empty took the slower path.
        let mut items = Vec::with_capacity(4);
        loop {
            let item = match self.peek()? {
                b'"' => Value::String(self.plain_string()?.to_owned()),
                b'-' | b'0'..=b'9' => Value::Number(self.integer()?),
                b't' => self.literal("true", Value::Bool(true))?,
                b'f' => self.literal("false", Value::Bool(false))?,
                b'n' => self.literal("null", Value::Null)?,
                _ => return None,
            };
            items.push(item);
            if !self.comma_or_end(b']')? {
                return Some(items);
            }
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Option<Value> {
        let rest = self.text.as_bytes().get(self.at..)?;
        rest.starts_with(word.as_bytes()).then(|| {
            self.at += word.len();
            value
        })
    }

    /// `{}`, consumed; anything else is left as it was.
    fn empty_object(&mut self) -> bool {
        let start = self.at;
        if self.expect(b'{').is_some() && self.expect(b'}').is_some() {
            return true;
        }
        self.at = start;
        false
    }

    /// `args` or `kwargs` (or null), read by serde_json as the general reader reads them.
    fn data<T: serde::de::DeserializeOwned>(&mut self, open: u8) -> Option<Field<T>> {
        let first = self.peek()?;
        if first == b'n' {
            return self.null().map(|()| Field::Null);
        }
        if first != open {
            return None;
        }
        let rest = self.text.get(self.at..)?;
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<T>();
        let value = values.next()?.ok()?;
        let end = values.byte_offset();
        let brackets = rest.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'[' || b == b'{')
            .count();
        if brackets >= BRACKETS_READ_ALONE {
            return None;
        }
        self.at += end;
        Some(Field::Read(value))
    }
}

/// Where the string that `bytes` starts ends (its closing `"`), when no byte before it is an
/// escape or a control byte; eight bytes at a time.
fn plain_len(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    // Whole words, reading past the string's end into the rest of the body: only the body's
    // last few bytes are looked at one by one.
    while let Some(chunk) = bytes.get(at..at + 8) {
        let w = words::word(chunk);
        let stops = words::string_stops(w);
        if stops != 0 {
            let first = at + words::first(stops);
            return (bytes[first] == b'"').then_some(first);
        }
        at += 8;
    }
    for (offset, &b) in bytes[at..].iter().enumerate() {
        match b {
            b'"' => return Some(at + offset),
            b'\\' | 0..=0x1f => return None,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::plain_len;

    #[test]
    fn a_plain_string_ends_at_its_first_quote_unless_an_escape_or_control_byte_comes_first() {
        for len in 0..20 {
            for byte in 0..=255u8 {
                let mut bytes = vec![b'a'; len];
                bytes.push(byte);
                bytes.extend_from_slice(b"xyz\"\\");
                let expect = match byte {
                    b'"' => Some(len),
                    b'\\' | 0..=0x1f => None,
                    // The first quote after it.
                    _ => Some(len + 4),
                };
                assert_eq!(plain_len(&bytes), expect, "byte {byte:#x} after {len}");
            }
            let mut open = vec![b'a'; len];
            assert_eq!(plain_len(&open), None, "no closing quote in {len}");
            open.push(b'"');
            assert_eq!(plain_len(&open), Some(len));
        }
    }
}
