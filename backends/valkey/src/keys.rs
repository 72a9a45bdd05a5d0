//! The key layout (design §5, STABILITY.md).

use ferriq::wire::TaskId;

/// Keys and channels under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// `{prefix}:{task_id}`: the key taskiq-redis reads with `prefix_str=prefix`.
    pub(crate) fn result(&self, id: &TaskId) -> String {
        concat(&[&self.prefix, ":", id.as_str()])
    }

    /// `{prefix}:claim:{{prefix}:{task_id}}`: hash-tagged on the result key, so one script can
    /// touch both in Valkey Cluster.
    pub(crate) fn claim(&self, id: &TaskId) -> String {
        let prefix = self.prefix.as_str();
        concat(&[prefix, ":claim:{", prefix, ":", id.as_str(), "}"])
    }

    /// `{prefix}:{task_id}__progress`: where taskiq-redis keeps a task's progress.
    pub(crate) fn progress(&self, id: &TaskId) -> String {
        format!("{}:{}__progress", self.prefix, id)
    }

    /// A group's hash and its member bitmap: `{prefix}:group:{<id>}` and
    /// `{prefix}:group:{<id>}:members`, one cluster slot (the group id is the hash tag).
    pub(crate) fn group(&self, id: &TaskId) -> (String, String) {
        let hash = format!("{}:group:{{{}}}", self.prefix, id);
        let members = format!("{hash}:members");
        (hash, members)
    }

    /// `{prefix}:chain:{id}`: a chain's steps.
    pub(crate) fn chain(&self, id: &TaskId) -> String {
        format!("{}:chain:{}", self.prefix, id)
    }

    /// The channel a completion is announced on when the message named no `reply_to`.
    pub(crate) fn done_channel(&self, id: &TaskId) -> String {
        concat(&[&self.prefix, ":done:", id.as_str()])
    }

    /// A fresh reply channel for one process's waiters.
    pub(crate) fn reply_channel(&self) -> String {
        format!("{}:reply:{}", self.prefix, uuid::Uuid::new_v4().simple())
    }

    /// The key prefix of the store that made reply channel `channel` (`{prefix}:reply:{32 hex}`),
    /// when it has that shape.
    pub(crate) fn reply_channel_prefix(channel: &str) -> Option<&str> {
        const TAIL: usize = ":reply:".len() + 32;
        let split = channel.len().checked_sub(TAIL)?;
        let (prefix, tail) = (channel.get(..split)?, channel.get(split..)?);
        tail.starts_with(":reply:").then_some(prefix)
    }

    /// Whether `channel` was made by a store with this prefix (`true` when it is not a
    /// ferriq reply channel: nothing to tell).
    pub(crate) fn owns_reply_channel(&self, channel: &str) -> bool {
        Self::reply_channel_prefix(channel).is_none_or(|p| p == self.prefix)
    }
}

/// The parts one after the other, in one allocation: a task's keys are made for every claim and
/// completion, and `format!` grows its string a few times on the way.
fn concat(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.push_str(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_channel_names_its_prefix() {
        let keys = Keys::new("app:v2");
        let channel = keys.reply_channel();
        assert_eq!(Keys::reply_channel_prefix(&channel), Some("app:v2"));
        assert!(keys.owns_reply_channel(&channel));
        assert!(!Keys::new("app").owns_reply_channel(&channel));
        assert!(!Keys::new("app:v2:reply").owns_reply_channel(&channel));
        assert!(keys.owns_reply_channel("someone-elses-channel"));
    }

    #[test]
    fn claim_and_result_share_a_cluster_slot() {
        let keys = Keys::new("app");
        let id = TaskId::parse("0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(keys.result(&id), "app:0123456789abcdef0123456789abcdef");
        assert_eq!(
            keys.claim(&id),
            "app:claim:{app:0123456789abcdef0123456789abcdef}"
        );
        assert_eq!(
            keys.done_channel(&id),
            "app:done:0123456789abcdef0123456789abcdef"
        );
        assert_eq!(
            fred::util::redis_keyslot(keys.claim(&id).as_bytes()),
            fred::util::redis_keyslot(keys.result(&id).as_bytes())
        );
    }
}
