//! The shape nearly every message has, read without serde's machinery: the six top-level
//! fields once each, names and plain strings (no escapes) borrowed as they lie, label values
//! that are plain strings and type codes that are integers. serde_json's generic reader spent
//! about twice as many instructions on those as on the task's arguments, which it still reads
//! here (`args` and `kwargs` are the task's data, of any shape).
//!
//! Anything else — an escape, another field, a field given twice, a label value of another
//! type, nesting deep enough to reach serde_json's depth limit, text that is not JSON — makes
//! [`read`] decline, and the body is read by the general reader from its start: this one
//! never accepts what that one refuses, and what it accepts reads the same (`tests.rs` holds
//! the two equal on generated bodies).

use std::borrow::Cow;

use serde_json::{Map, Number, Value};

use super::{Field, Pairs, RawMessage};

/// Reads `text` when it has the common shape; `None` leaves it to the general reader (with
/// `labels` and `types` emptied).
pub(super) fn read<'de>(
    text: &'de str,
    labels: &mut Pairs<'de>,
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
        labels: &mut Pairs<'de>,
        types: &mut Pairs<'de>,
    ) -> Option<RawMessage<'de>> {
        let mut raw = RawMessage {
            task_id: Field::Missing,
            task_name: Field::Missing,
            labels: Field::Missing,
            labels_types: Field::Missing,
            args: Field::Missing,
            kwargs: Field::Missing,
        };
        self.expect(b'{')?;
        let mut seen = 0u8;
        if self.peek()? == b'}' {
            self.at += 1;
        } else {
            loop {
                let key = self.plain_string()?;
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
                        raw.args = self.data::<Vec<Value>>(b'[')?;
                        16
                    }
                    "kwargs" => {
                        raw.kwargs = self.data::<Map<String, Value>>(b'{')?;
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

    /// A string without escapes, borrowed. JSON strings may not hold a control byte; the text
    /// is already known to be UTF-8, and `"` is ASCII, so the slice is on character bounds.
    fn plain_string(&mut self) -> Option<&'de str> {
        self.expect(b'"')?;
        let start = self.at;
        let len = self.text.as_bytes()[start..]
            .iter()
            .position(|&b| b == b'"')?;
        let s = self.text.get(start..start + len)?;
        if super::super::write::needs_escape(s.as_bytes()) {
            return None;
        }
        self.at = start + len + 1;
        Some(s)
    }

    fn null(&mut self) -> Option<()> {
        self.skip_whitespace();
        let rest = self.text.as_bytes().get(self.at..)?;
        rest.starts_with(b"null").then(|| self.at += 4)
    }

    fn string_or_null(&mut self) -> Option<Field<Cow<'de, str>>> {
        match self.peek()? {
            b'"' => Some(Field::Read(Cow::Borrowed(self.plain_string()?))),
            b'n' => self.null().map(|()| Field::Null),
            _ => None,
        }
    }

    /// `labels` or `labels_types`: an object (or null) whose values `value` reads.
    fn pairs(
        &mut self,
        into: &mut Pairs<'de>,
        value: fn(&mut Self) -> Option<Value>,
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

    /// A label's value as ferriq and taskiq write it: a plain string.
    fn label_value(&mut self) -> Option<Value> {
        if self.peek()? != b'"' {
            return None;
        }
        self.plain_string().map(|s| Value::String(s.to_owned()))
    }

    /// A label's type code: a non-negative integer without a fraction or exponent, read as
    /// serde_json reads it (as unsigned). Type codes are 0–5; a negative number is left to
    /// the general reader (serde_json reads `-0` as a float).
    fn type_code(&mut self) -> Option<Value> {
        self.skip_whitespace();
        let start = self.at;
        let bytes = self.text.as_bytes();
        let digits = bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        // No leading zero (JSON has none), and few enough digits that the value fits.
        if digits == 0 || digits > 18 || (digits > 1 && bytes[start] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = bytes.get(start + digits) {
            return None;
        }
        let code: u64 = self.text.get(start..start + digits)?.parse().ok()?;
        self.at = start + digits;
        Some(Value::Number(Number::from(code)))
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
