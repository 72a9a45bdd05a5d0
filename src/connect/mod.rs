//! Backends from URLs: `connect_broker("amqp://…")`, `connect_store("redis://…")`, and a worker
//! or client built wholly from the environment.
//!
//! Each backend crate registers the URL schemes it serves (the way `#[task]` registers
//! tasks), so the core names no backend: `memory://` is the core's own; `amqp://`/`amqps://`
//! come with `ferriq-amqp`, `sqs://` with `ferriq-sqs`, `redis://`, `rediss://`,
//! `redis-cluster://`, `redis-sentinel://` (and the `valkey` spellings) with `ferriq-valkey`.
//! A scheme no linked crate serves is an error that names the crate to add.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let broker = ferriq::connect::connect_broker("memory://").await.unwrap();
//! let store = ferriq::connect::connect_store("memory://").await.unwrap();
//! let client = ferriq::Client::new(broker, store);
//! # let _ = client;
//! let err = ferriq::connect::connect_broker("kafka://k:9092").await.unwrap_err();
//! assert!(err.to_string().contains("kafka"));
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

mod settings;

use crate::broker::Broker;
use crate::store::Store;
use crate::SecretUrl;
pub use settings::Settings;

/// A boxed connect future.
pub type ConnectFuture<T> = Pin<Box<dyn Future<Output = Result<T, ConnectError>> + Send>>;

/// What a backend is connected with: the URL, and the `FERRIQ_*` settings of the process (or
/// of the caller) for the options a URL does not carry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The URL.
    pub url: SecretUrl,
    /// Settings by name (`FERRIQ_QUEUES`, `FERRIQ_AMQP_EXCHANGE`, `FERRIQ_RESULT_PREFIX`…).
    pub settings: Settings,
    /// The worker's concurrency, when a worker connects: brokers that push deliveries take
    /// it as their prefetch.
    pub concurrency: Option<usize>,
}

impl ConnectOptions {
    /// Options for `url` with no settings.
    pub fn new(url: impl Into<SecretUrl>) -> Self {
        ConnectOptions {
            url: url.into(),
            settings: Settings::default(),
            concurrency: None,
        }
    }

    /// Options for `url` with every `FERRIQ_*` variable of the process environment.
    pub fn from_env(url: impl Into<SecretUrl>) -> Self {
        Self::new(url).settings(std::env::vars().filter(|(k, _)| k.starts_with("FERRIQ_")))
    }

    /// Adds settings.
    pub fn settings<K: Into<String>, V: Into<String>>(
        mut self,
        settings: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.settings.extend(settings);
        self
    }

    /// The worker's concurrency (brokers that push deliveries take it as their prefetch).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// A setting, when set and not empty.
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.settings.get(name)
    }

    /// An on/off setting: `None` when unset, else `1`/`true`/`yes`/`on` or `0`/`false`/`no`/
    /// `off` (any case), anything else an error naming the setting.
    ///
    /// ```
    /// use ferriq::connect::ConnectOptions;
    /// let options = ConnectOptions::new("memory://").settings([("FERRIQ_X", "On"), ("FERRIQ_Y", "maybe")]);
    /// assert_eq!(options.flag("FERRIQ_X").unwrap(), Some(true));
    /// assert_eq!(options.flag("FERRIQ_UNSET").unwrap(), None);
    /// assert!(options.flag("FERRIQ_Y").is_err());
    /// ```
    pub fn flag(&self, name: &str) -> Result<Option<bool>, ConnectError> {
        let Some(value) = self.setting(name) else {
            return Ok(None);
        };
        parse_flag(value).map(Some).ok_or_else(|| {
            ConnectError::Backend(format!(
                "{name}={value:?} is invalid: expected 1 or 0 (true or false)"
            ))
        })
    }

    /// `FERRIQ_RESULT_TTL_SECS`, the time results are kept: `Ok(None)` when unset,
    /// `Ok(Some(None))` for `0` (kept until deleted), an error naming the setting otherwise.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ferriq::connect::ConnectOptions;
    /// let options = ConnectOptions::new("memory://").settings([("FERRIQ_RESULT_TTL_SECS", "60")]);
    /// assert_eq!(options.result_ttl().unwrap(), Some(Some(Duration::from_secs(60))));
    /// ```
    pub fn result_ttl(&self) -> Result<Option<Option<Duration>>, ConnectError> {
        let Some(ttl) = self.setting("FERRIQ_RESULT_TTL_SECS") else {
            return Ok(None);
        };
        let secs = ttl.trim().parse::<u64>().map_err(|_| {
            ConnectError::Backend(format!(
                "FERRIQ_RESULT_TTL_SECS={ttl:?} is invalid: expected whole seconds (0: keep)"
            ))
        })?;
        Ok(Some((secs > 0).then(|| Duration::from_secs(secs))))
    }

    /// `FERRIQ_QUEUES`: the lanes, comma-separated (the first is the default lane).
    pub fn queues(&self) -> Option<Vec<String>> {
        let queues: Vec<String> = self
            .setting("FERRIQ_QUEUES")?
            .split(',')
            .map(|q| q.trim().to_owned())
            .filter(|q| !q.is_empty())
            .collect();
        (!queues.is_empty()).then_some(queues)
    }
}

/// Why a backend could not be connected from its URL.
#[derive(Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No linked crate serves the URL's scheme.
    #[error("no {kind} backend for {scheme}:// URLs is linked into this binary: {hint}")]
    UnknownScheme {
        /// `broker` or `store`.
        kind: &'static str,
        /// The scheme.
        scheme: String,
        /// What to add.
        hint: String,
    },
    /// The backend refused the URL or a setting, or could not connect; the message says
    /// which and what to check.
    #[error("{0}")]
    Backend(String),
    /// What the URL or its settings name is not there: an exchange or lane nobody declared
    /// (a broker that only checks its topology), a queue that does not exist. The message
    /// names it and the setting to check.
    #[error("{0}")]
    NotFound(String),
    /// A URL setting (`FERRIQ_BROKER_URL`, `FERRIQ_STORE_URL`) is not set.
    #[error("setting {0} is not set (the URL to connect to)")]
    Missing(&'static str),
    /// The URL is empty or has no `scheme://` in front.
    #[error("the {kind} URL {url:?} has no scheme: write it as {examples}")]
    NoScheme {
        /// `broker` or `store`.
        kind: &'static str,
        /// The URL as given, its password hidden.
        url: String,
        /// URL shapes that would do.
        examples: &'static str,
    },
}

/// The URL's scheme, or why it has none.
fn scheme_of(kind: &'static str, url: &crate::SecretUrl) -> Result<String, ConnectError> {
    let scheme = url.scheme();
    if !scheme.is_empty() {
        return Ok(scheme);
    }
    Err(ConnectError::NoScheme {
        kind,
        // Without `://` a password in it cannot be told apart: `redacted` shows none of it.
        url: if url.expose().is_empty() {
            String::new()
        } else {
            url.redacted()
        },
        examples: if kind == "broker" {
            "amqp://user:password@host:5672/vhost, sqs://QUEUE?region=…, or memory://NAME"
        } else {
            "redis://host:6379, rediss://…, redis-cluster://…, or memory://NAME"
        },
    })
}

/// A broker backend's registration: the schemes it serves and how it connects. Backend
/// crates submit one with `ferriq::inventory::submit!`.
pub struct BrokerConnector {
    /// URL schemes, lowercase, without `://`.
    pub schemes: &'static [&'static str],
    /// Connects.
    pub connect: fn(ConnectOptions) -> ConnectFuture<Arc<dyn Broker>>,
}

/// A store backend's registration (see [`BrokerConnector`]).
pub struct StoreConnector {
    /// URL schemes, lowercase, without `://`.
    pub schemes: &'static [&'static str],
    /// Connects.
    pub connect: fn(ConnectOptions) -> ConnectFuture<Arc<dyn Store>>,
}

inventory::collect!(BrokerConnector);
inventory::collect!(StoreConnector);

/// Which crate serves a scheme, for the error when it is not linked — or, for a scheme of the
/// other kind (a redis URL given as the broker), that the URLs look swapped.
fn hint(kind: &str, scheme: &str) -> String {
    let (broker_scheme, store_scheme) = (
        matches!(scheme, "amqp" | "amqps" | "sqs" | "sqs+http" | "sqs+https"),
        scheme.starts_with("redis") || scheme.starts_with("valkey"),
    );
    if kind == "store" && broker_scheme {
        return format!(
            "a {scheme}:// URL names a broker, not a store: are the broker and store URLs \
             swapped? (FERRIQ_BROKER_URL: amqp://, sqs://, redis:// or memory://; \
             FERRIQ_STORE_URL: redis:// or valkey://, or memory://)"
        );
    }
    if kind == "broker" && store_scheme {
        return format!(
            "a {scheme}:// broker is ferriq-valkey's Streams broker: add the `ferriq-valkey` \
             crate to the binary's dependencies and `use ferriq_valkey as _;` to its main.rs \
             (or, if this URL was meant for the store, the broker and store URLs are swapped)"
        );
    }
    let krate = match scheme {
        "amqp" | "amqps" => "ferriq-amqp",
        "sqs" | "sqs+http" | "sqs+https" => "ferriq-sqs",
        "redis" | "rediss" | "valkey" | "valkeys" | "redis-cluster" | "rediss-cluster"
        | "redis-sentinel" | "rediss-sentinel" | "valkey-cluster" | "valkeys-cluster"
        | "valkey-sentinel" | "valkeys-sentinel" => "ferriq-valkey",
        "memory" => {
            return "enable the `memory` feature of ferriq (on by default)".to_owned();
        }
        _ => {
            return "ferriq serves memory://, amqp(s)://, sqs:// and redis/valkey URLs; check \
                    the URL's scheme"
                .to_owned()
        }
    };
    format!(
        "add the `{krate}` crate to the binary's dependencies and `use {} as _;` to its \
         main.rs (a crate nothing names is dropped by the linker, with its registration)",
        krate.replace('-', "_")
    )
}

/// Connects the broker at `url` (settings from the process environment).
pub async fn connect_broker(url: &str) -> Result<Arc<dyn Broker>, ConnectError> {
    connect_broker_with(ConnectOptions::from_env(url)).await
}

/// Connects the broker described by `options`.
pub async fn connect_broker_with(options: ConnectOptions) -> Result<Arc<dyn Broker>, ConnectError> {
    let scheme = scheme_of("broker", &options.url)?;
    let found = inventory::iter::<BrokerConnector>
        .into_iter()
        .find(|c| c.schemes.contains(&scheme.as_str()));
    match found {
        Some(c) => (c.connect)(options).await,
        None => Err(ConnectError::UnknownScheme {
            kind: "broker",
            hint: hint("broker", &scheme),
            scheme,
        }),
    }
}

/// Connects the claim/result store at `url` (settings from the process environment).
pub async fn connect_store(url: &str) -> Result<Arc<dyn Store>, ConnectError> {
    connect_store_with(ConnectOptions::from_env(url)).await
}

/// Connects the claim/result store described by `options`.
pub async fn connect_store_with(options: ConnectOptions) -> Result<Arc<dyn Store>, ConnectError> {
    let scheme = scheme_of("store", &options.url)?;
    let found = inventory::iter::<StoreConnector>
        .into_iter()
        .find(|c| c.schemes.contains(&scheme.as_str()));
    match found {
        Some(c) => (c.connect)(options).await,
        None => Err(ConnectError::UnknownScheme {
            kind: "store",
            hint: hint("store", &scheme),
            scheme,
        }),
    }
}

#[cfg(feature = "memory")]
mod memory {
    //! `memory://` and `memory://NAME`: one in-process broker (or store) per name, so a client
    //! and a worker of the same process that connect to the same URL share it.

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    use std::time::Duration;

    use super::{BrokerConnector, ConnectFuture, ConnectOptions, Store, StoreConnector};
    use crate::broker::Broker;
    use crate::memory::{MemoryBroker, MemoryStore};

    fn name(options: &ConnectOptions) -> String {
        let url = options.url.expose();
        url.split_once("://")
            .map_or("", |(_, rest)| rest)
            .trim_end_matches('/')
            .to_owned()
    }

    fn broker(options: ConnectOptions) -> ConnectFuture<Arc<dyn Broker>> {
        static BROKERS: OnceLock<Mutex<HashMap<String, MemoryBroker>>> = OnceLock::new();
        let key = name(&options);
        let queues = options.queues();
        Box::pin(async move {
            let mut brokers = BROKERS
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let broker = brokers.entry(key).or_default().clone();
            let broker = match queues {
                Some(q) => broker.consuming(&q.iter().map(String::as_str).collect::<Vec<_>>()),
                None => broker,
            };
            Ok(Arc::new(broker) as Arc<dyn Broker>)
        })
    }

    /// Results a `memory://` store keeps, as the Valkey store's: 7 days unless
    /// `FERRIQ_RESULT_TTL_SECS` says otherwise (`0` keeps them), so a long-running process
    /// configured by its environment does not grow without bound.
    const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

    fn store(options: ConnectOptions) -> ConnectFuture<Arc<dyn Store>> {
        static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
        let key = name(&options);
        Box::pin(async move {
            let retention = options.result_ttl()?.unwrap_or(Some(DEFAULT_RETENTION));
            let mut stores = STORES
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // The first connection to a name makes its store (and sets its retention).
            let store = stores
                .entry(key)
                .or_insert_with(|| match retention {
                    Some(r) => MemoryStore::with_retention(r),
                    None => MemoryStore::new(),
                })
                .clone();
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    }

    inventory::submit!(BrokerConnector {
        schemes: &["memory"],
        connect: broker,
    });
    inventory::submit!(StoreConnector {
        schemes: &["memory"],
        connect: store,
    });
}

/// An on/off value as every `FERRIQ_*` switch reads it (empty is off).
pub(crate) fn parse_flag(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" => Some(false),
        "1" | "true" | "yes" | "on" => Some(true),
        _ => None,
    }
}

/// The message, as `Display` gives it: a `main` returning this error prints its `Debug` form,
/// and users read that first (`Error: Connect(Backend("…"))` said less, and escaped it).
impl std::fmt::Debug for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
