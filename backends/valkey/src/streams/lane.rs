//! A lane's keys: its stream, and the keys beside it, which share its hash slot so that one
//! lane's scripts run on one node of a cluster, and which name the stream so that two lanes
//! never share them.

use std::sync::Arc;

/// One lane: its stream and the keys beside it.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) stream: Arc<str>,
    pub(crate) leases: String,
    pub(crate) delayed: String,
    pub(crate) dead: String,
    /// Dead letters an operator holds (id → until, unix ms).
    pub(crate) dead_held: String,
    /// The channel where what falls due soon is announced (see `wake`).
    pub(crate) due: String,
}

impl Lane {
    /// The lane of `stream`; `Err` (what is wrong) for a name whose keys could not share its
    /// slot: braces that hold no hash tag.
    pub(crate) fn new(stream: &str) -> Result<Self, String> {
        let base = key_base(stream)?;
        Ok(Lane {
            stream: Arc::from(stream),
            leases: format!("{base}:ferriq:leases"),
            delayed: format!("{base}:ferriq:delayed"),
            dead: format!("{base}:ferriq:dead"),
            dead_held: format!("{base}:ferriq:dead_held"),
            due: format!("{base}:ferriq:due"),
        })
    }
}

/// A command on `key`, routed to the node that owns its slot (named explicitly: fred's routing
/// of custom commands by argument position is not relied on).
pub(crate) fn on_key(name: &'static str, key: &str, blocking: bool) -> fred::types::CustomCommand {
    let slot = fred::util::redis_keyslot(key.as_bytes());
    fred::types::CustomCommand::new_static(name, fred::types::ClusterHash::Custom(slot), blocking)
}

/// What the lane's other keys start with: the stream's name itself when it holds a hash tag
/// (`{app}:high`: Redis hashes the tag, so `{app}:high:ferriq:…` shares its slot, and
/// `{app}:low`'s keys stay apart), else the name in braces (`{taskiq}:ferriq:…`, hashed as
/// `taskiq` is). A name with braces but no tag (`a{}b`, `x}y`) is refused: Redis hashes it
/// whole, and no key beside it could both share its slot and name it.
fn key_base(stream: &str) -> Result<String, String> {
    if let Some(open) = stream.find('{') {
        if let Some(len) = stream[open + 1..].find('}') {
            if len > 0 {
                return Ok(stream.to_owned());
            }
        }
    }
    if stream.contains(['{', '}']) {
        return Err(format!(
            "the queue name {stream:?} has braces but no hash tag: name it without braces, or \
             with a tag ({{app}}:jobs)"
        ));
    }
    Ok(format!("{{{stream}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lanes_keys_share_its_slot_and_name_it() {
        let slot = |k: &str| fred::util::redis_keyslot(k.as_bytes());
        let lane = Lane::new("taskiq").unwrap();
        assert_eq!(lane.leases, "{taskiq}:ferriq:leases");
        assert_eq!(slot(&lane.leases), slot("taskiq"));
        // Two lanes with one tag: one slot, their own keys.
        let (high, low) = (
            Lane::new("{app}:high").unwrap(),
            Lane::new("{app}:low").unwrap(),
        );
        assert_eq!(high.delayed, "{app}:high:ferriq:delayed");
        assert_ne!(high.delayed, low.delayed);
        assert_eq!(slot(&high.dead), slot("{app}:high"));
        assert_eq!(slot(&low.dead_held), slot("{app}:high"));
        // Braces without a tag.
        assert!(Lane::new("a{}b").is_err());
        assert!(Lane::new("x}y").is_err());
    }
}
