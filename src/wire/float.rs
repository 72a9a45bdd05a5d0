//! Float labels as text, the way taskiq carries them.

use std::fmt;

/// A float as a label's text: the shortest string that parses back to the same value (what
/// Python's `float()` reads too), always with a dot so it reads as a float.
///
/// Values with at most three decimals and fewer than 16 significant digits (timestamps to the
/// millisecond, durations) are written from their integer milliseconds: the same text, without
/// the general shortest-digits search, which was the largest single cost of building a message.
pub(super) fn format_float(f: f64) -> String {
    FloatText(f).to_string()
}

/// A float written as [`format_float`] writes it, through `Display`: a message's float labels
/// (its enqueue time, its due time) are serialized without a `String` built for each.
pub(super) struct FloatText(pub(super) f64);

impl fmt::Display for FloatText {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let f = self.0;
        if let Some(millis) = Millis::of(f) {
            return millis.fmt(out);
        }
        if f.is_nan() {
            out.write_str("nan")
        } else if f.is_infinite() {
            out.write_str(if f > 0.0 { "inf" } else { "-inf" })
        } else {
            let s = f.to_string();
            out.write_str(&s)?;
            if s.contains(['.', 'e', 'E']) {
                Ok(())
            } else {
                out.write_str(".0")
            }
        }
    }
}

/// `f` as a decimal with at most three decimals, when it is exactly the double nearest one
/// with at most 15 significant digits. Decimals of at most 15 significant digits survive a
/// round trip through a double (DBL_DIG is 15), so two of them never share one and no shorter
/// string parses back to `f`: this decimal, trailing zeros dropped, is the shortest one.
struct Millis {
    negative: bool,
    whole: u64,
    /// The three decimals, as ASCII digits.
    frac: [u8; 3],
    /// How many of them are written (trailing zeros dropped, at least one).
    keep: usize,
}

impl Millis {
    fn of(f: f64) -> Option<Millis> {
        // Zero is left to the general path (it keeps the sign of -0.0).
        if f.is_nan() || f.abs() >= 1e12 || f == 0.0 {
            return None;
        }
        let millis = (f * 1000.0).round();
        // `millis` is an integer below 2^53, so the division is the nearest double to the
        // decimal.
        if millis / 1000.0 != f {
            return None;
        }
        let millis = millis as i64;
        let (whole, frac) = (millis.unsigned_abs() / 1000, millis.unsigned_abs() % 1000);
        let frac = [frac / 100, frac / 10 % 10, frac % 10].map(|d| b'0' + d as u8);
        let keep = frac
            .iter()
            .rposition(|&d| d != b'0')
            .map_or(1, |last| last + 1);
        Some(Millis {
            negative: millis < 0,
            whole,
            frac,
            keep,
        })
    }

    /// The text, in a buffer on the stack: a sign, at most 12 digits, a dot and at most three
    /// decimals (17 bytes at most).
    fn text(&self) -> ([u8; 20], usize) {
        let mut text = [0u8; 20];
        let mut len = 0;
        let mut put = |bytes: &[u8]| {
            text[len..len + bytes.len()].copy_from_slice(bytes);
            len += bytes.len();
        };
        if self.negative {
            put(b"-");
        }
        put(itoa::Buffer::new().format(self.whole).as_bytes());
        put(b".");
        put(&self.frac[..self.keep]);
        (text, len)
    }

    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (text, len) = self.text();
        // ASCII digits, a sign and a dot only: always valid UTF-8.
        out.write_str(std::str::from_utf8(&text[..len]).unwrap_or("0.0"))
    }

    fn write(&self, out: &mut Vec<u8>) {
        let (text, len) = self.text();
        out.extend_from_slice(&text[..len]);
    }
}

/// Appends `f` as [`format_float`] writes it. A message's enqueue time is written this way:
/// through `fmt`'s machinery (a formatter, an adapter over the buffer, a call per piece) it
/// cost more than the rest of the labels together.
pub(super) fn write_float(out: &mut Vec<u8>, f: f64) {
    match Millis::of(f) {
        Some(millis) => millis.write(out),
        None => {
            use std::io::Write as _;
            // Writing into a `Vec` cannot fail.
            let _ = write!(out, "{}", FloatText(f));
        }
    }
}

/// Reads a float label's text as `str::parse::<f64>` does (after trimming). Text of the shape
/// [`format_float`] writes for timestamps and durations (an optional `-`, 1–12 digits, and
/// optionally a dot and 1–3 digits) is read from its integer thousandths: that integer is
/// below 2^53, so it and the division are exact up to the division's one correct rounding,
/// which gives the double nearest the decimal — what the general parser returns.
pub(super) fn parse_float(text: &str) -> Option<f64> {
    read_millis(text.as_bytes()).or_else(|| text.trim().parse().ok())
}

fn read_millis(bytes: &[u8]) -> Option<f64> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    let (whole, frac) = match digits.iter().position(|&b| b == b'.') {
        Some(dot) => (&digits[..dot], &digits[dot + 1..]),
        None => (digits, &[][..]),
    };
    let has_dot = whole.len() < digits.len();
    if whole.is_empty() || whole.len() > 12 || frac.len() > 3 || (has_dot && frac.is_empty()) {
        return None;
    }
    let mut millis: u64 = 0;
    for &b in whole {
        millis = millis * 10 + u64::from(ascii_digit(b)?);
    }
    for at in 0..3 {
        let digit = match frac.get(at) {
            Some(&b) => ascii_digit(b)?,
            None => 0,
        };
        millis = millis * 10 + u64::from(digit);
    }
    // Below 10^15 < 2^53: exact as a double.
    let magnitude = millis as f64 / 1000.0;
    Some(if negative { -magnitude } else { magnitude })
}

fn ascii_digit(b: u8) -> Option<u8> {
    b.is_ascii_digit().then(|| b - b'0')
}

/// `f` written from its milliseconds (see [`Millis`]), when it is such a decimal.
#[cfg(test)]
fn from_millis(f: f64) -> Option<String> {
    Millis::of(f).map(|_| FloatText(f).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The general path alone.
    fn shortest(f: f64) -> String {
        let s = f.to_string();
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    }

    #[test]
    fn millisecond_values_are_written_as_before() {
        for f in [
            1796191157.395,
            1796191157.39,
            1796191157.3,
            1796191157.0,
            0.001,
            0.5,
            -0.5,
            -12.25,
            2.5,
            999999999999.999,
            30.0,
        ] {
            assert_eq!(from_millis(f).as_deref(), Some(shortest(f).as_str()), "{f}");
        }
        for f in [0.0, -0.0, 0.0001, 1e12, 1.0 / 3.0, f64::NAN, f64::INFINITY] {
            assert_eq!(from_millis(f), None, "{f}");
        }
        assert_eq!(format_float(-0.0), "-0.0");
        assert_eq!(format_float(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn millisecond_text_is_read_as_the_general_parser_reads_it() {
        for text in [
            "0",
            "-0",
            "0.0",
            "-0.0",
            "1",
            "1.5",
            "-1.5",
            "1796191157.395",
            "1796191157.39",
            "007.250",
            "999999999999.999",
            "-999999999999.999",
            "0.001",
            "1.000",
        ] {
            let fast = read_millis(text.as_bytes()).expect(text);
            let general = text.parse::<f64>().unwrap();
            assert_eq!(fast.to_bits(), general.to_bits(), "{text}");
        }
        // Left to the general parser: what it reads differently or not at all.
        for text in [
            "",
            "-",
            ".5",
            "1.",
            "+1.5",
            "1.2345",
            "1e3",
            "1000000000000.0",
            " 1.5",
            "1.5 ",
            "nan",
            "inf",
            "-inf",
            "1_0",
            "1.-5",
            "--1",
            "1..5",
            "١.٥",
        ] {
            assert_eq!(read_millis(text.as_bytes()), None, "{text}");
            let general = text.trim().parse::<f64>().ok();
            assert_eq!(
                parse_float(text).map(f64::to_bits),
                general.map(f64::to_bits),
                "{text}"
            );
        }
    }

    #[test]
    fn write_float_writes_what_format_float_does() {
        for f in [
            1796191157.395,
            0.0,
            -0.0,
            1.0 / 3.0,
            1e300,
            -2.5,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            5e-324,
        ] {
            let mut out = b"x".to_vec();
            write_float(&mut out, f);
            assert_eq!(&out[1..], format_float(f).as_bytes(), "{f}");
        }
    }

    proptest! {
        #[test]
        fn the_millisecond_reader_agrees_with_the_general_parser(
            millis in -999_999_999_999_999i64..999_999_999_999_999,
            decimals in 0usize..4,
        ) {
            let (sign, abs) = if millis < 0 { ("-", millis.unsigned_abs()) } else { ("", millis as u64) };
            let frac = format!("{:03}", abs % 1000);
            let text = if decimals == 0 {
                format!("{sign}{}", abs / 1000)
            } else {
                format!("{sign}{}.{}", abs / 1000, &frac[..decimals])
            };
            let general = text.parse::<f64>().unwrap();
            prop_assert_eq!(parse_float(&text).map(f64::to_bits), Some(general.to_bits()));
            let written = format_float(millis as f64 / 1000.0);
            prop_assert_eq!(
                parse_float(&written).map(f64::to_bits),
                written.parse::<f64>().ok().map(f64::to_bits)
            );
        }

        #[test]
        fn the_millisecond_path_writes_what_the_general_one_does(
            millis in -999_999_999_999_999i64..999_999_999_999_999,
            any_float in any::<f64>(),
        ) {
            let f = millis as f64 / 1000.0;
            prop_assert_eq!(format_float(f), shortest(f));
            if any_float.is_finite() {
                prop_assert_eq!(format_float(any_float), shortest(any_float));
            }
        }
    }
}
