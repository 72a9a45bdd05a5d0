//! A message's labels by name: a vector kept sorted, not a tree. A message carries a handful of
//! labels: up to [`INLINE`] of them are kept in place, so a message's labels are one
//! allocation (the shared block they live in) where a tree took one per label and a vector
//! one more; they are searched in as few steps and dropped without walking nodes.

use std::borrow::Cow;
use std::fmt;

use smallvec::SmallVec;

use super::LabelValue;

/// Labels kept in place before they move to an allocation of their own: ferriq's producers
/// write two to five on a message (when it was sent, where the reply goes, a task's options).
pub(super) const INLINE: usize = 6;

/// A label's name: a well-known one's static text (no copy), or a copy of the message's own.
pub(super) type Name = Cow<'static, str>;

/// Labels sorted by name, each name once, and a summary of the names present.
///
/// Most lookups are of a label a message does not carry (the run asks for its `timeout`,
/// `max_retries`, `due_at`, limits… on every delivery, and most messages set none of them).
/// `present` has the bit of every name present (see [`bit_of`]): a name whose bit is clear
/// is absent without a search. Two names may share a bit; that only costs a search.
#[derive(Clone, PartialEq, Default)]
pub(super) struct LabelMap {
    entries: SmallVec<[(Name, LabelValue); INLINE]>,
    /// The bits of the names in `entries`, and no others (equal maps have equal summaries).
    present: u64,
}

/// A name's bit in [`LabelMap::present`], from its length and its first and last bytes: a
/// few instructions, folded away for a constant name (the well-known labels).
#[inline]
fn bit_of(name: &str) -> u64 {
    let bytes = name.as_bytes();
    let (first, last) = match bytes {
        [] => (0, 0),
        [first, .., last] => (*first, *last),
        [only] => (*only, *only),
    };
    let mixed = (bytes.len() as u32)
        .wrapping_mul(31)
        .wrapping_add(u32::from(first))
        .wrapping_add(u32::from(last).wrapping_mul(7));
    1 << (mixed % 64)
}

/// As a map (`{"name": value}`), the way the tree it replaced printed.
impl fmt::Debug for LabelMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl LabelMap {
    /// Labels from `pairs`; of one name given more than once, the last value is kept (as a
    /// JSON object read twice over keeps its last).
    #[cfg(test)]
    pub(super) fn from_pairs(pairs: impl IntoIterator<Item = (Name, LabelValue)>) -> Self {
        let mut map = LabelMap::default();
        map.fill(pairs);
        map
    }

    /// Adds `pairs` to an empty map, in place (a map moved by value is a few hundred bytes:
    /// built where it will live, it is not copied there). Of one name given more than once,
    /// the last value is kept.
    pub(super) fn fill(&mut self, pairs: impl IntoIterator<Item = (Name, LabelValue)>) {
        debug_assert!(self.entries.is_empty());
        let map = &mut self.entries;
        map.extend(pairs);
        // Stable: equal names stay in the order given, and each later one hands its value to
        // the first before it is dropped.
        map.sort_by(|a, b| a.0.cmp(&b.0));
        map.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(&mut later.1, &mut kept.1);
            }
            same
        });
        self.present = map.iter().fold(0, |bits, (k, _)| bits | bit_of(k));
    }

    #[inline]
    fn find(&self, name: &str) -> Option<Result<usize, usize>> {
        if self.present & bit_of(name) == 0 {
            return None;
        }
        Some(self.entries.binary_search_by(|(k, _)| k.as_ref().cmp(name)))
    }

    #[inline]
    pub(super) fn get(&self, name: &str) -> Option<&LabelValue> {
        match self.find(name)? {
            Ok(at) => Some(&self.entries[at].1),
            Err(_) => None,
        }
    }

    pub(super) fn contains_key(&self, name: &str) -> bool {
        matches!(self.find(name), Some(Ok(_)))
    }

    /// Sets `name`, replacing any earlier value.
    pub(super) fn insert(&mut self, name: Name, value: LabelValue) {
        let at = self.find(&name).unwrap_or_else(|| {
            self.entries
                .binary_search_by(|(k, _)| k.as_ref().cmp(&name))
        });
        match at {
            Ok(at) => self.entries[at].1 = value,
            Err(at) => {
                self.present |= bit_of(&name);
                self.entries.insert(at, (name, value));
            }
        }
    }

    pub(super) fn remove(&mut self, name: &str) -> Option<LabelValue> {
        let at = self.find(name)?.ok()?;
        let (_, value) = self.entries.remove(at);
        // Another name may share the bit: the summary is made again from what is left.
        self.present = self.entries.iter().fold(0, |bits, (k, _)| bits | bit_of(k));
        Some(value)
    }

    /// In name order.
    pub(super) fn iter(&self) -> impl ExactSizeIterator<Item = (&Name, &LabelValue)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, i64)]) -> LabelMap {
        LabelMap::from_pairs(
            pairs
                .iter()
                .map(|(k, v)| (Cow::Borrowed(*k), LabelValue::Int(*v))),
        )
    }

    fn names(m: &LabelMap) -> Vec<&str> {
        m.iter().map(|(k, _)| k.as_ref()).collect()
    }

    #[test]
    fn names_are_kept_sorted_and_the_last_of_a_repeated_name_wins() {
        let m = map(&[("b", 1), ("a", 2), ("b", 3), ("c", 4), ("b", 5)]);
        assert_eq!(names(&m), ["a", "b", "c"]);
        assert_eq!(m.get("b"), Some(&LabelValue::Int(5)));
        assert_eq!(m.get("a"), Some(&LabelValue::Int(2)));
        assert_eq!(m.get("d"), None);
    }

    #[test]
    fn insert_and_remove_keep_the_order() {
        let mut m = map(&[("b", 1), ("d", 2)]);
        m.insert(Cow::Borrowed("c"), LabelValue::Int(3));
        m.insert(Cow::Borrowed("a"), LabelValue::Int(4));
        m.insert(Cow::Borrowed("d"), LabelValue::Int(5));
        assert_eq!(names(&m), ["a", "b", "c", "d"]);
        assert_eq!(m.get("d"), Some(&LabelValue::Int(5)));
        assert_eq!(m.remove("b"), Some(LabelValue::Int(1)));
        assert_eq!(m.remove("b"), None);
        assert!(!m.contains_key("b"));
        assert_eq!(names(&m), ["a", "c", "d"]);
        assert_eq!(m.len(), 3);
        // Equal maps compare equal however they were built.
        assert_eq!(m, map(&[("d", 5), ("c", 3), ("a", 4)]));
        assert_eq!(
            format!("{m:?}"),
            r#"{"a": Int(4), "c": Int(3), "d": Int(5)}"#
        );
    }

    #[test]
    fn names_that_share_a_bit_are_told_apart() {
        // A name of the same length, first and last bytes as `timeout` shares its bit.
        let twin = "tXXXXXt";
        assert_eq!(bit_of(twin), bit_of("timeout"));
        let mut m = map(&[("timeout", 1)]);
        assert_eq!(m.get(twin), None);
        assert!(!m.contains_key(twin));
        m.insert(Cow::Borrowed(twin), LabelValue::Int(2));
        assert_eq!(m.remove("timeout"), Some(LabelValue::Int(1)));
        // The bit stays for the twin, which is still found; `timeout` is not.
        assert_eq!(m.get(twin), Some(&LabelValue::Int(2)));
        assert_eq!(m.get("timeout"), None);
        assert_eq!(m.remove(twin), Some(LabelValue::Int(2)));
        assert_eq!(m, LabelMap::default());
        // A name whose bit is clear is absent however many labels there are.
        let many = map(&[("a", 1), ("bb", 2), ("ccc", 3), ("dddd", 4), ("eeeee", 5)]);
        assert_eq!(many.get("timeout"), None);
        assert_eq!(many.get("ccc"), Some(&LabelValue::Int(3)));
        assert_eq!(bit_of(""), bit_of(""));
        assert_eq!(map(&[("", 7)]).get(""), Some(&LabelValue::Int(7)));
    }

    #[test]
    fn more_labels_than_are_kept_in_place_keep_the_same_rules() {
        let names: Vec<String> = (0..3 * INLINE).rev().map(|i| format!("l{i:02}")).collect();
        let mut m = LabelMap::from_pairs(
            names
                .iter()
                .chain(&names)
                .enumerate()
                .map(|(i, k)| (Cow::Owned(k.clone()), LabelValue::Int(i as i64))),
        );
        assert_eq!(m.len(), 3 * INLINE);
        let sorted: Vec<&str> = names.iter().rev().map(String::as_str).collect();
        assert_eq!(self::names(&m), sorted);
        // The second of each name, written later, wins.
        assert_eq!(
            m.get("l00"),
            Some(&LabelValue::Int((6 * INLINE - 1) as i64))
        );
        m.insert(Cow::Borrowed("a"), LabelValue::Int(-1));
        assert_eq!(self::names(&m)[0], "a");
    }
}
