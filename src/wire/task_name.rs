//! A task's name as a message carries it, kept without an allocation where it can be.

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use arrayvec::ArrayString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest name read from a body that is kept inline (`module.path:function` names of
/// Python tasks are mostly shorter).
const INLINE: usize = 40;

/// The registered name of the task a message runs: read like a `&str` (it derefs to one),
/// compared, ordered and hashed as its text.
///
/// A name a `#[task]` call sends is its static text, and a name read from a body of up to 40
/// bytes is kept in place: neither allocates, where a `String` would for every message sent
/// and every one read.
///
/// ```
/// use ferriq::wire::TaskName;
/// let name = TaskName::from_static("emails.send");
/// assert_eq!(name, "emails.send");
/// assert_eq!(name, TaskName::from(String::from("emails.send")));
/// assert!(name.starts_with("emails."));
/// assert_eq!(name.to_string(), "emails.send");
/// ```
#[derive(Clone)]
pub struct TaskName(Repr);

#[derive(Clone)]
enum Repr {
    Static(&'static str),
    Inline(ArrayString<INLINE>),
    Shared(Arc<str>),
}

impl TaskName {
    /// A name from static text (a task's registered name): not copied.
    pub const fn from_static(name: &'static str) -> Self {
        TaskName(Repr::Static(name))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Static(name) => name,
            Repr::Inline(name) => name.as_str(),
            Repr::Shared(name) => name,
        }
    }
}

impl Default for TaskName {
    /// The empty name (a raw body's, which names no task).
    fn default() -> Self {
        TaskName::from_static("")
    }
}

impl From<&str> for TaskName {
    fn from(name: &str) -> Self {
        match ArrayString::from(name) {
            Ok(inline) => TaskName(Repr::Inline(inline)),
            Err(_) => TaskName(Repr::Shared(Arc::from(name))),
        }
    }
}

impl From<String> for TaskName {
    fn from(name: String) -> Self {
        TaskName::from(name.as_str())
    }
}

impl From<&String> for TaskName {
    fn from(name: &String) -> Self {
        TaskName::from(name.as_str())
    }
}

impl From<Cow<'_, str>> for TaskName {
    fn from(name: Cow<'_, str>) -> Self {
        TaskName::from(&*name)
    }
}

impl From<TaskName> for String {
    fn from(name: TaskName) -> Self {
        name.as_str().to_owned()
    }
}

impl Deref for TaskName {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for TaskName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for TaskName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for TaskName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for TaskName {}

impl PartialEq<str> for TaskName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for TaskName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for TaskName {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<TaskName> for str {
    fn eq(&self, other: &TaskName) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<TaskName> for &str {
    fn eq(&self, other: &TaskName) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<TaskName> for String {
    fn eq(&self, other: &TaskName) -> bool {
        self.as_str() == other.as_str()
    }
}

impl std::hash::Hash for TaskName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl PartialOrd for TaskName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TaskName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Display for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for TaskName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TaskName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(TaskName::from(Cow::<str>::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn every_form_reads_compares_and_hashes_as_its_text() {
        let long = "a.".repeat(INLINE);
        let names = [
            TaskName::from_static("mail.send"),
            TaskName::from("mail.send"),
            TaskName::from(long.clone()),
        ];
        assert!(matches!(names[0].0, Repr::Static(_)));
        assert!(matches!(names[1].0, Repr::Inline(_)));
        assert!(matches!(names[2].0, Repr::Shared(_)));
        assert_eq!(names[0], names[1]);
        assert_eq!(names[2], long.as_str());
        assert!(names[2] < names[0]);
        assert_ne!(names[0], names[2]);
        let mut by_name = HashMap::new();
        by_name.insert(names[0].clone(), 1);
        assert_eq!(by_name.get("mail.send"), Some(&1));
        assert_eq!(by_name.get(&names[1]), Some(&1));
        assert_eq!(format!("{:?}", names[1]), "\"mail.send\"");
        let json = serde_json::to_string(&names[2]).unwrap();
        assert_eq!(serde_json::from_str::<TaskName>(&json).unwrap(), names[2]);
        assert_eq!(String::from(names[1].clone()), "mail.send");
        let text = String::from("mail.send");
        assert!(text == names[0]);
        assert_eq!(names[0], text);
        assert!(TaskName::default().is_empty());
    }
}
