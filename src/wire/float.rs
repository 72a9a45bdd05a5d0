//! Float labels as text, the way taskiq carries them.

/// A float as a label's text: the shortest string that parses back to the same value (what
/// Python's `float()` reads too), always with a dot so it reads as a float.
///
/// Values with at most three decimals and fewer than 16 significant digits (timestamps to the
/// millisecond, durations) are written from their integer milliseconds: the same text, without
/// the general shortest-digits search, which was the largest single cost of building a message.
pub(super) fn format_float(f: f64) -> String {
    if let Some(s) = from_millis(f) {
        return s;
    }
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        let s = f.to_string();
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    }
}

/// `f` written from its milliseconds, when it is exactly the double nearest a decimal with at
/// most three decimals and at most 15 significant digits. Decimals of at most 15 significant
/// digits survive a round trip through a double (DBL_DIG is 15), so two of them never share one
/// and no shorter string parses back to `f`: this decimal, trailing
/// zeros dropped, is the shortest one.
fn from_millis(f: f64) -> Option<String> {
    // Zero is left to the general path (it keeps the sign of -0.0).
    if f.is_nan() || f.abs() >= 1e12 || f == 0.0 {
        return None;
    }
    let millis = (f * 1000.0).round();
    // `millis` is an integer below 2^53, so the division is the nearest double to the decimal.
    if millis / 1000.0 != f {
        return None;
    }
    let millis = millis as i64;
    let (whole, frac) = (millis.unsigned_abs() / 1000, millis.unsigned_abs() % 1000);
    let mut digits = itoa::Buffer::new();
    let mut s = String::with_capacity(24);
    if millis < 0 {
        s.push('-');
    }
    s.push_str(digits.format(whole));
    s.push('.');
    // Three digits with their leading zeros, trailing zeros dropped (at least one digit).
    let frac = [frac / 100, frac / 10 % 10, frac % 10].map(|d| b'0' + d as u8);
    let keep = frac
        .iter()
        .rposition(|&d| d != b'0')
        .map_or(1, |last| last + 1);
    s.extend(frac[..keep].iter().map(|&d| char::from(d)));
    Some(s)
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

    proptest! {
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
