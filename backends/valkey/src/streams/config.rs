//! Settings and connecting: the builder, the streams and groups made at connect, and the
//! durability check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferriq::SecretUrl;
use fred::prelude::{Client, ClientLike};
use fred::types::{ClusterHash, CustomCommand, Value};

use super::lane::Lane;
use super::read::{self, Reads};
use super::scripts::StreamScripts;
use super::shared::{acker, Shared};
use super::StreamBroker;
use crate::{ValkeyError, ValkeyStoreBuilder};

/// Settings for a [`StreamBroker`], built from a `redis://` URL (every form the store accepts:
/// cluster, sentinel, TLS).
///
/// ```
/// use std::time::Duration;
/// let builder = ferriq_valkey::StreamBroker::builder("redis://:s3cret@127.0.0.1:6379/0")
///     .queues(["emails", "reports"])
///     .group("taskiq")
///     .allow_volatile(true);
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// ```
#[derive(Debug, Clone)]
pub struct StreamBrokerBuilder {
    pub(crate) connection: ValkeyStoreBuilder,
    pub(crate) queues: Vec<String>,
    pub(crate) group: String,
    pub(crate) allow_volatile: bool,
}

impl StreamBrokerBuilder {
    /// The lanes: streams consumed, the first the default (`taskiq`, taskiq-redis's default
    /// `queue_name`).
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// The consumer group (`taskiq`, taskiq-redis's default `consumer_group_name`).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// Connects to a server that keeps its data in memory only (`appendonly no`): a restart
    /// of that server loses every queued task. Refused unless this is set (`FERRIQ_BROKER_VOLATILE=1`).
    pub fn allow_volatile(mut self, allow: bool) -> Self {
        self.allow_volatile = allow;
        self
    }

    /// How long a command may take before it fails (default 2 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.connection = self.connection.command_timeout(timeout);
        self
    }

    /// A PEM file of CAs to trust for `rediss://` instead of the system's.
    pub fn tls_ca_file(mut self, pem: impl Into<std::path::PathBuf>) -> Self {
        self.connection = self.connection.tls_ca_file(pem);
        self
    }

    /// A client certificate and its key, for servers that ask for one (mTLS).
    pub fn tls_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.connection = self.connection.tls_client_cert(cert, key);
        self
    }

    /// Connects, creates each lane's stream and consumer group if missing (the group from the
    /// stream's start, so nothing sent before the first worker is skipped), and checks that
    /// the server keeps its data.
    pub async fn connect(self) -> Result<StreamBroker, ValkeyError> {
        StreamBroker::connect(self).await
    }
}

impl StreamBroker {
    /// A builder from a `redis://` URL (see [`StreamBrokerBuilder`]).
    pub fn builder(url: impl Into<SecretUrl>) -> StreamBrokerBuilder {
        StreamBrokerBuilder {
            connection: ValkeyStoreBuilder::new(url),
            queues: vec!["taskiq".to_owned()],
            group: "taskiq".to_owned(),
            allow_volatile: false,
        }
    }

    pub(crate) async fn connect(settings: StreamBrokerBuilder) -> Result<Self, ValkeyError> {
        let conn = &settings.connection;
        let url = conn.url.redacted();
        let failed = |e: fred::error::Error| ValkeyError::Connect {
            url: url.clone(),
            reason: conn
                .url
                .explain(format_args!("{:?}: {}", e.kind(), e.details())),
        };
        if settings.queues.is_empty() || settings.queues.iter().any(String::is_empty) {
            return Err(ValkeyError::Setting(
                "a Streams broker needs at least one queue, each named".into(),
            ));
        }
        let lanes = settings
            .queues
            .iter()
            .map(|q| Lane::new(q).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ValkeyError::Setting)?;
        let builder = conn.fred_builder()?;
        let pool = builder.build_pool(2).map_err(failed)?;
        let reader = builder.build().map_err(failed)?;
        let wakes = builder.build_subscriber_client().map_err(failed)?;
        let limit = conn.connect_timeout.saturating_mul(2) + Duration::from_secs(1);
        let scripts = StreamScripts::new();
        // Each step's error names the step: a server that refuses one (an ACL without
        // `XGROUP`, a cluster without the lane's slot) says which.
        let step = |what: &'static str| {
            move |e: fred::error::Error| {
                fred::error::Error::new(e.kind().clone(), format!("{what}: {}", e.details()))
            }
        };
        let setup = async {
            pool.init().await.map_err(step("connecting"))?;
            read::connect_reader(&reader)
                .await
                .map_err(step("connecting the reader"))?;
            for script in scripts.all() {
                script
                    .load(pool.next())
                    .await
                    .map_err(step("loading a script"))?;
            }
            for queue in &settings.queues {
                create_group(pool.next(), queue, &settings.group)
                    .await
                    .map_err(step("making the lane's stream and group (XGROUP CREATE)"))?;
            }
            Ok::<_, fred::error::Error>(())
        };
        match tokio::time::timeout(limit, setup).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(failed(e)),
            Err(_) => {
                return Err(failed(fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    "no answer",
                )))
            }
        }
        // On a cluster, each node that serves a lane (nodes may be set up apart), named in
        // the error.
        let clustered = conn.url.scheme().contains("cluster");
        let mut checked: Vec<u16> = Vec::new();
        for lane in &lanes {
            let slot = fred::util::redis_keyslot(lane.stream.as_bytes());
            if checked.contains(&slot) {
                continue;
            }
            checked.push(slot);
            let at = if clustered {
                format!("{url} (the node serving the lane {:?})", lane.stream)
            } else {
                url.clone()
            };
            check_durable(pool.next(), &at, settings.allow_volatile, slot).await?;
        }
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let consumer = format!("ferriq-{}", uuid::Uuid::new_v4().simple());
        let ackers = lanes
            .iter()
            .map(|lane| acker(&pool, &scripts.ack, lane, &settings.group, &consumer))
            .collect();
        let shared = Shared {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            pool,
            ackers,
            reader,
            scripts,
            lanes,
            others: Default::default(),
            group: settings.group.clone(),
            consumer,
            clustered,
            lease_ms: AtomicU64::new(30_000),
            url,
        };
        // Consumers that dead workers left behind, holding nothing: gone.
        for lane in &shared.lanes {
            if let Err(e) = shared.prune(lane, false).await {
                tracing::debug!(lane = %lane.stream, error = %e.details(), "could not prune the group's idle consumers");
            }
        }
        Ok(StreamBroker {
            shared: Arc::new(shared),
            reads: Arc::new(Reads::default()),
            wakes: Arc::new(super::wake::Wakes::new(wakes)),
        })
    }
}

/// `XGROUP CREATE <stream> <group> 0 MKSTREAM`, unless the group exists.
pub(crate) async fn create_group(
    client: &Client,
    stream: &str,
    group: &str,
) -> Result<(), fred::error::Error> {
    let command = super::lane::on_key("XGROUP", stream, false);
    let args: Vec<Value> = vec![
        "CREATE".into(),
        stream.into(),
        group.into(),
        "0".into(),
        "MKSTREAM".into(),
    ];
    match client.custom::<Value, _>(command, args).await {
        Err(e) if e.details().contains("BUSYGROUP") => Ok(()),
        other => other.map(drop),
    }
}

/// Refuses (unless allowed) a server that can lose queued tasks: one that keeps its data in
/// memory only (a restart loses everything), or one that evicts any key when full. A server
/// that does not say (a managed one refusing `CONFIG`) is taken at its word, with a warning.
/// On a cluster, the node serving `slot` is asked.
pub(crate) async fn check_durable(
    client: &Client,
    url: &str,
    allow: bool,
    slot: u16,
) -> Result<(), ValkeyError> {
    let appendonly = config_get(client, "appendonly", slot).await;
    let appendonly = appendonly
        .as_deref()
        .and_then(|found| setting(found, "appendonly"))
        .map(|value| value.eq_ignore_ascii_case("yes"));
    match appendonly {
        Some(true) => {}
        None => {
            tracing::warn!(%url, "cannot read the server's `appendonly` setting: make sure it keeps its data (appendonly yes), or a restart loses queued tasks");
        }
        Some(false) if allow => {
            tracing::warn!(%url, "the broker's server keeps its data in memory only (appendonly no): a restart loses every queued task");
        }
        Some(false) => {
            return Err(ValkeyError::NotDurable {
                url: url.to_owned(),
            })
        }
    }
    // `maxmemory*` rather than two names: Redis 6.2 takes one pattern per CONFIG GET.
    let Some(memory) = config_get(client, "maxmemory*", slot).await else {
        tracing::warn!(%url, "cannot read the server's `maxmemory-policy`: make sure it is `noeviction`, or a full server may drop queued tasks");
        return Ok(());
    };
    let limited = setting(&memory, "maxmemory").is_some_and(|bytes| bytes != "0");
    let policy = setting(&memory, "maxmemory-policy").unwrap_or("noeviction");
    // volatile-* policies evict only keys with an expiry; the broker's keys have none.
    if limited && policy.starts_with("allkeys") {
        if !allow {
            return Err(ValkeyError::Evicts {
                url: url.to_owned(),
                policy: policy.to_owned(),
            });
        }
        tracing::warn!(%url, policy, "the broker's server evicts any key when full: queued tasks could be dropped");
    }
    Ok(())
}

/// `CONFIG GET pattern` as name/value pairs (on a cluster, from the node serving `slot`), or
/// `None` when the server refuses it.
async fn config_get(client: &Client, pattern: &str, slot: u16) -> Option<Vec<(String, String)>> {
    let command = CustomCommand::new_static("CONFIG", ClusterHash::Custom(slot), false);
    let reply = client
        .custom::<Value, _>(command, vec![Value::from("GET"), Value::from(pattern)])
        .await
        .ok()?;
    // RESP2 answers a flat array of names and values; RESP3 a map.
    let flat: Vec<String> = match reply {
        Value::Map(map) => map
            .inner()
            .into_iter()
            .flat_map(|(k, v)| [k.as_str().map(|s| s.to_string()), v.as_string()])
            .collect::<Option<_>>()?,
        other => other
            .into_array()
            .into_iter()
            .map(|v| v.as_string())
            .collect::<Option<_>>()?,
    };
    Some(
        flat.chunks_exact(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect(),
    )
}

/// A setting's value in a `CONFIG GET` answer.
fn setting<'a>(found: &'a [(String, String)], name: &str) -> Option<&'a str> {
    found
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}
