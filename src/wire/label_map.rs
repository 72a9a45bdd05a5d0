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

/// Labels sorted by name, each name once.
#[derive(Clone, PartialEq, Default)]
pub(super) struct LabelMap(SmallVec<[(Name, LabelValue); INLINE]>);

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
        debug_assert!(self.0.is_empty());
        let map = &mut self.0;
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
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_ref().cmp(name))
    }

    pub(super) fn get(&self, name: &str) -> Option<&LabelValue> {
        self.find(name).ok().map(|at| &self.0[at].1)
    }

    pub(super) fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Sets `name`, replacing any earlier value.
    pub(super) fn insert(&mut self, name: Name, value: LabelValue) {
        match self.find(&name) {
            Ok(at) => self.0[at].1 = value,
            Err(at) => self.0.insert(at, (name, value)),
        }
    }

    pub(super) fn remove(&mut self, name: &str) -> Option<LabelValue> {
        self.find(name).ok().map(|at| self.0.remove(at).1)
    }

    /// In name order.
    pub(super) fn iter(&self) -> impl ExactSizeIterator<Item = (&Name, &LabelValue)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
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
