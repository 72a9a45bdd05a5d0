//! Bytes tested eight at a time: the ids, names and strings of every message are scanned for
//! bytes that stop a fast path (a quote, an escape, a control byte, a brace). These are the
//! classic word tests; each marks the high bit of every byte that passes it, exactly up to the
//! first such byte (a borrow can only mark bytes above it), so whether any byte passes, and
//! which comes first, are exact.

const ONES: u64 = u64::from_le_bytes([0x01; 8]);
/// The high bit of every byte.
pub(super) const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);

/// Eight bytes as a word, the first in the lowest bits.
#[inline]
pub(super) fn word(eight: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&eight[..8]);
    u64::from_le_bytes(bytes)
}

/// The bytes of `word` below `n` (`n` ≤ 128).
#[inline]
pub(super) fn below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS
}

/// The bytes of `word` equal to `byte`.
#[inline]
pub(super) fn equal(word: u64, byte: u8) -> u64 {
    below(word ^ (ONES * u64::from(byte)), 1)
}

/// The bytes of `word` that end a plain JSON string or make it need escapes: a control byte
/// (below 0x20), `"` or `\`.
#[inline]
pub(super) fn string_stops(word: u64) -> u64 {
    below(word, 0x20) | equal(word, b'"') | equal(word, b'\\')
}

/// Whether `byte` is one [`string_stops`] marks.
#[inline]
pub(super) fn is_string_stop(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// The index of the first byte marked in `marks` (not zero).
#[inline]
pub(super) fn first(marks: u64) -> usize {
    (marks.trailing_zeros() / 8) as usize
}

/// Checks a scan built on these words against `expected`, byte by byte: every byte value at
/// every position of slices of 1, 7, 8, 9, 17 and 32 bytes (whole words, and the tails read
/// one byte at a time), the other bytes plain letters.
#[cfg(test)]
pub(super) fn check_every_byte_everywhere(
    scan: impl Fn(&[u8]) -> bool,
    expected: impl Fn(u8) -> bool,
) {
    for byte in 0..=255u8 {
        for len in [1, 7, 8, 9, 17, 32] {
            for at in 0..len {
                let mut bytes = vec![b'a'; len];
                bytes[at] = byte;
                assert_eq!(
                    scan(&bytes),
                    expected(byte),
                    "byte {byte:#x} at {at} of {len}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_marked_where_it_stands_and_the_first_is_found() {
        for value in 0..=255u8 {
            for at in 0..8 {
                let mut bytes = [b'a'; 8];
                bytes[at] = value;
                let w = word(&bytes);
                assert_eq!(below(w, 0x20) != 0, value < 0x20, "{value:#x} at {at}");
                assert_eq!(equal(w, b'"') != 0, value == b'"', "{value:#x} at {at}");
                if value < 0x20 {
                    assert_eq!(first(below(w, 0x20)), at);
                }
                // A byte equal to the one looked for before another: the first is found.
                bytes[7] = b'"';
                let w = word(&bytes);
                let expect = if value == b'"' { at } else { 7 };
                assert_eq!(first(equal(w, b'"')), expect, "{value:#x} at {at}");
            }
        }
    }
}
