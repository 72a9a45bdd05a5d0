use std::fmt;
use std::hash::BuildHasher as _;
use std::sync::{Arc, LazyLock};

use arrayvec::ArrayString;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::words;
use super::WireError;

/// The identity of one task: chosen by the producer, shared by every copy of its message.
///
/// taskiq producers use a uuid4 without dashes (32 lowercase hex characters), which is what
/// [`TaskId::random`] makes. Ids from other producers are accepted when they are 1–200 printable
/// ASCII characters without whitespace or braces: braces would break the Valkey Cluster hash tag
/// that keeps a task's claim and result in one slot (design §5).
///
/// ```
/// use ferriq::wire::TaskId;
/// let id = TaskId::random();
/// assert_eq!(id.as_str().len(), 32);
/// assert!(TaskId::parse("order-42").is_ok());
/// assert!(TaskId::parse("a{b}").is_err());
/// ```
#[derive(Clone)]
pub struct TaskId {
    repr: Repr,
    /// The text's hash, by a hasher seeded at random once per process: computed when the id
    /// is made, so a map of ids (a worker's running runs, its pending results, the memory
    /// store's claims and results, each one touched several times per task) hashes 8 bytes
    /// rather than the id's 32 every time. Unknown outside the process, so ids cannot be
    /// chosen to collide.
    hash: u64,
}

/// Longest id kept inline: a uuid with its dashes (taskiq's ids are 32 characters).
const INLINE: usize = 36;

#[derive(Clone)]
enum Repr {
    // An id is copied into the run, the claim, the result, the waiter and the log lines of
    // every task: a uuid-sized one is kept in place, so making, reading or copying one
    // allocates nothing.
    Inline(ArrayString<INLINE>),
    // Longer ids (up to 200 characters) are shared: a copy is then a count.
    Shared(Arc<str>),
}

impl TaskId {
    /// `id`, already checked.
    fn of(id: &str) -> Self {
        static HASHER: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);
        let hash = HASHER.hash_one(id);
        let repr = match ArrayString::from(id) {
            Ok(inline) => Repr::Inline(inline),
            Err(_) => Repr::Shared(Arc::from(id)),
        };
        TaskId { repr, hash }
    }
}

// Compared and ordered as their text, however they are kept; hashed by their text's hash.
impl PartialEq for TaskId {
    fn eq(&self, other: &Self) -> bool {
        // Equal texts have equal hashes: most unequal ids differ there already.
        self.hash == other.hash && self.as_str() == other.as_str()
    }
}

impl Eq for TaskId {}

impl std::hash::Hash for TaskId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash)
    }
}

impl PartialOrd for TaskId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TaskId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

/// Longest accepted task id.
const MAX_LEN: usize = 200;

impl TaskId {
    /// A fresh random id in taskiq's format (uuid4, lowercase hex, no dashes).
    pub fn random() -> Self {
        // uuid's `fast-rng`: a thread-local CSPRNG instead of a getrandom system call per id;
        // encoded into a stack buffer rather than through `fmt`.
        let mut buf = uuid::Uuid::encode_buffer();
        TaskId::of(uuid::Uuid::new_v4().simple().encode_lower(&mut buf))
    }

    /// An id derived from `parts`: the same parts always give the same id (a uuid5 in
    /// taskiq's format). Workflow steps, chord callbacks and schedule ticks get such ids, so
    /// a step sent twice is one task (claims and the once-only result absorb the second).
    ///
    /// ```
    /// use ferriq::wire::TaskId;
    /// let a = TaskId::derived(&["schedule", "nightly", "1764547200"]);
    /// assert_eq!(a, TaskId::derived(&["schedule", "nightly", "1764547200"]));
    /// assert_ne!(a, TaskId::derived(&["schedule", "nightly", "1764633600"]));
    /// assert_eq!(a.as_str().len(), 32);
    /// ```
    pub fn derived(parts: &[&str]) -> Self {
        // A namespace of ferriq's own (a fixed uuid4): the contract for derived ids.
        const NAMESPACE: uuid::Uuid =
            uuid::Uuid::from_u128(0x7c1e_6f1b_8d0a_4b8e_9f6c_2a4d_5e3b_1c07);
        // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
        let mut name = Vec::new();
        for p in parts {
            name.extend_from_slice(p.len().to_string().as_bytes());
            name.push(b':');
            name.extend_from_slice(p.as_bytes());
        }
        let mut buf = uuid::Uuid::encode_buffer();
        TaskId::of(
            uuid::Uuid::new_v5(&NAMESPACE, &name)
                .simple()
                .encode_lower(&mut buf),
        )
    }

    /// The id of member `index` of the group whose id this is (`workflow::member_id`).
    pub(crate) fn group_member(&self, index: u32) -> TaskId {
        TaskId::derived(&["ferriq-group", self.as_str(), "member", &index.to_string()])
    }

    /// The id of the chord callback of the group whose id this is (`workflow::callback_id`).
    pub(crate) fn chord_callback(&self) -> TaskId {
        TaskId::derived(&["ferriq-group", self.as_str(), "callback"])
    }

    /// The id of step `index` of the chain whose id this is (`workflow::step_id`).
    pub(crate) fn chain_step(&self, index: u32) -> TaskId {
        TaskId::derived(&["ferriq-chain", self.as_str(), "step", &index.to_string()])
    }

    /// Checks `id` and wraps it.
    pub fn parse(id: impl AsRef<str>) -> Result<Self, WireError> {
        let id = id.as_ref();
        let reason = if id.is_empty() {
            Some("it is empty")
        } else if id.len() > MAX_LEN {
            Some("it is longer than 200 bytes")
        } else if !printable_without_braces(id.as_bytes()) {
            Some("only printable ASCII without spaces or braces is allowed")
        } else {
            None
        };
        match reason {
            None => Ok(TaskId::of(id)),
            Some(reason) => Err(WireError::InvalidTaskId {
                id: id.chars().take(64).collect(),
                reason,
            }),
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        match &self.repr {
            Repr::Inline(id) => id.as_str(),
            Repr::Shared(id) => id,
        }
    }
}

/// Whether every byte is printable ASCII (`!` to `~`) other than a brace; eight bytes at a
/// time (every id a worker receives is checked). The tests for a byte below `n` in a word say
/// exactly whether there is one.
fn printable_without_braces(bytes: &[u8]) -> bool {
    let allowed = |b: u8| b.is_ascii_graphic() && b != b'{' && b != b'}';
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let w = words::word(chunk);
        let refused = words::below(w, 0x21)
            | (w & words::HIGHS)
            | words::equal(w, 0x7f)
            | words::equal(w, b'{')
            | words::equal(w, b'}');
        if refused != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| allowed(b))
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({})", self.as_str())
    }
}

impl std::str::FromStr for TaskId {
    type Err = WireError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskId::parse(s)
    }
}

impl AsRef<str> for TaskId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Serialize for TaskId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl serde::de::Visitor<'_> for IdVisitor {
            type Value = TaskId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a task id string")
            }
            // Borrowed or not, the text is copied once: into the id.
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<TaskId, E> {
                TaskId::parse(s).map_err(E::custom)
            }
        }
        d.deserialize_str(IdVisitor)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    use super::*;

    fn hash(id: &TaskId) -> u64 {
        let mut h = DefaultHasher::new();
        id.hash(&mut h);
        h.finish()
    }

    #[test]
    fn short_and_long_ids_read_compare_and_hash_as_their_text() {
        let inline = "a".repeat(INLINE);
        let longer = "a".repeat(INLINE + 1);
        let longest = "z".repeat(MAX_LEN);
        for text in ["x", inline.as_str(), longer.as_str(), longest.as_str()] {
            let id = TaskId::parse(text).unwrap();
            assert_eq!(id.as_str(), text);
            assert_eq!(id.to_string(), text);
            assert_eq!(id.clone(), id);
            assert_eq!(hash(&id), hash(&TaskId::parse(text).unwrap()));
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(serde_json::from_str::<TaskId>(&json).unwrap(), id);
        }
        // Kept inline up to a dashed uuid's length, shared past it.
        assert!(matches!(
            TaskId::parse(&inline).unwrap().repr,
            Repr::Inline(_)
        ));
        assert!(matches!(
            TaskId::parse(&longer).unwrap().repr,
            Repr::Shared(_)
        ));
        // Ordered as text across the two forms.
        let (a, b) = (TaskId::parse(&longer).unwrap(), TaskId::parse("b").unwrap());
        assert!(a < b);
        assert_eq!(b.cmp(&a), std::cmp::Ordering::Greater);
        assert!(TaskId::parse(&inline).unwrap() < a);
        assert_ne!(TaskId::parse(&inline).unwrap(), a);
        assert!(TaskId::parse("a".repeat(MAX_LEN + 1)).is_err());
        // Made apart, equal ids hash alike (the hasher is the process's, not the map's).
        assert_eq!(
            hash(&TaskId::derived(&["a"])),
            hash(&TaskId::derived(&["a"]))
        );
        assert_ne!(TaskId::derived(&["a"]), TaskId::derived(&["b"]));
    }

    #[test]
    fn every_byte_is_checked_wherever_it_stands() {
        crate::wire::words::check_every_byte_everywhere(printable_without_braces, |byte| {
            byte.is_ascii_graphic() && byte != b'{' && byte != b'}'
        });
    }
}
