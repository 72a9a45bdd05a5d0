use thiserror::Error;

/// Why a [`ValkeyStore`](crate::ValkeyStore) could not be built or connected.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ValkeyError {
    /// The URL is not a Valkey/Redis URL this build supports.
    #[error("invalid Valkey URL {url}: {reason}")]
    Url {
        /// The URL with its password hidden.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting is out of range or settings contradict each other.
    #[error("invalid Valkey store setting: {0}")]
    Setting(String),
    /// The server did not answer or refused the connection.
    #[error("cannot connect to Valkey at {url}: {reason}; check that it runs and the URL, password and TLS settings are right")]
    Connect {
        /// The URL with its password hidden.
        url: String,
        /// The client's error.
        reason: String,
    },
    /// A broker's server keeps its data in memory only (`appendonly no`), and losing queued
    /// tasks at its restart was not accepted.
    #[error("the Redis at {url} keeps its data in memory only (appendonly no): a restart would lose every queued task. Turn on `appendonly yes` (CONFIG SET appendonly yes, and in its configuration file), or accept the risk with FERRIQ_BROKER_VOLATILE=1 (StreamBrokerBuilder::allow_volatile)")]
    NotDurable {
        /// The URL with its password hidden.
        url: String,
    },
    /// A broker's server may evict any key when it runs out of memory (`maxmemory` set with an
    /// `allkeys-*` policy), which would drop queued tasks, and that was not accepted.
    #[error("the Redis at {url} evicts any key when full (maxmemory-policy {policy}): queued tasks could be dropped. Use `maxmemory-policy noeviction` (or a volatile-* policy: streams carry no expiry), raise or unset maxmemory, or accept the risk with FERRIQ_BROKER_VOLATILE=1 (StreamBrokerBuilder::allow_volatile)")]
    Evicts {
        /// The URL with its password hidden.
        url: String,
        /// The server's `maxmemory-policy`.
        policy: String,
    },
}

/// Maps a client error to the store error the worker acts on: anything that is not a clear
/// configuration problem counts as "unavailable", so messages are released, never run unclaimed.
pub(crate) fn store_error(e: fred::error::Error) -> ferriq::store::StoreError {
    use fred::error::ErrorKind;
    match e.kind() {
        ErrorKind::Auth => ferriq::store::StoreError::Config(format!(
            "Valkey refused the credentials: {}",
            e.details()
        )),
        _ if e.details().contains("NOPERM") => {
            ferriq::store::StoreError::Config(format!("valkey: {} — {NOPERM_HINT}", e.details()))
        }
        _ => ferriq::store::StoreError::Unavailable(format!("valkey: {e}")),
    }
}

/// What to do when the server's ACL refuses a command, key or channel.
pub(crate) const NOPERM_HINT: &str = "the Valkey user lacks a permission ferriq needs: grant it the ACL rule in the README's Security section (the commands ferriq runs, and every key and channel under its prefix)";
