//! A lane's keys: its stream, and the keys tagged with it so that one lane's scripts run on
//! one node of a cluster.

/// One lane: its stream and the keys tagged with it.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) stream: String,
    pub(crate) leases: String,
    pub(crate) delayed: String,
    pub(crate) dead: String,
    /// Dead letters an operator holds (id → until, unix ms).
    pub(crate) dead_held: String,
}

impl Lane {
    pub(crate) fn new(stream: &str) -> Self {
        let tag = hash_tag(stream);
        Lane {
            stream: stream.to_owned(),
            leases: format!("{tag}:ferriq:leases"),
            delayed: format!("{tag}:ferriq:delayed"),
            dead: format!("{tag}:ferriq:dead"),
            dead_held: format!("{tag}:ferriq:dead_held"),
        }
    }
}

/// A command on `key`, routed to the node that owns its slot (named explicitly: fred's routing
/// of custom commands by argument position is not relied on).
pub(crate) fn on_key(name: &'static str, key: &str, blocking: bool) -> fred::types::CustomCommand {
    let slot = fred::util::redis_keyslot(key.as_bytes());
    fred::types::CustomCommand::new_static(name, fred::types::ClusterHash::Custom(slot), blocking)
}

/// The hash tag that puts a key in `stream`'s slot: the stream's own tag when it has one
/// (`{x}` in its name), else the whole name in braces.
pub(crate) fn hash_tag(stream: &str) -> String {
    if let Some(open) = stream.find('{') {
        if let Some(len) = stream[open + 1..].find('}') {
            if len > 0 {
                return stream[open..=open + 1 + len].to_owned();
            }
        }
    }
    format!("{{{stream}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn a_lanes_keys_share_its_slot() {
        let lane = Lane::new("taskiq");
        assert_eq!(lane.leases, "{taskiq}:ferriq:leases");
        // A stream with a hash tag of its own keeps it.
        let tagged = Lane::new("jobs{eu}");
        assert_eq!(tagged.dead, "{eu}:ferriq:dead");
        // Empty braces are no tag.
        assert_eq!(hash_tag("a{}b"), "{a{}b}");
    }
}
