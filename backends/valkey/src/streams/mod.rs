//! A broker on Valkey/Redis Streams, compatible with taskiq-redis's `RedisStreamBroker`:
//! messages are entries of the lane's stream (`XADD <queue> * data <taskiq JSON>`), read by
//! the consumer group `taskiq`, so Python producers and workers share the queues.
//!
//! Unlike taskiq-redis, a delivery is reclaimed by **lease**, not by idle time: a worker that
//! heartbeats keeps its entry however long the run takes; a dead worker's entries are taken
//! over by the next receive of any worker once their lease runs out; there is no lock to leak.
//! Acked entries are deleted (`XACK` + `XDEL`), so a stream holds only what is queued or
//! running. Delays wait in a sorted set until due; dead letters go to a stream of their own.
//! Keys of one lane share its hash tag (`{<queue>}:ferriq:…` beside the stream `<queue>`), so
//! every script runs on one node of a cluster.

mod read;
mod scripts;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferriq::broker::{
    Broker, BrokerError, ConsumerSettings, DeadLetter, Delivery, DeliveryHandle, Health,
    LeaseStatus, OutgoingMessage, QueueDepth,
};
use ferriq::SecretUrl;
use fred::prelude::{Client, ClientLike, LuaInterface, Pool};
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::{ValkeyError, ValkeyStoreBuilder};
use read::Reads;
use scripts::StreamScripts;

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
    connection: ValkeyStoreBuilder,
    queues: Vec<String>,
    group: String,
    allow_volatile: bool,
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

/// One lane: its stream and the keys tagged with it.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) stream: String,
    leases: String,
    delayed: String,
    dead: String,
}

impl Lane {
    fn new(stream: &str) -> Self {
        let tag = hash_tag(stream);
        Lane {
            stream: stream.to_owned(),
            leases: format!("{tag}:ferriq:leases"),
            delayed: format!("{tag}:ferriq:delayed"),
            dead: format!("{tag}:ferriq:dead"),
        }
    }
}

/// The hash tag that puts a key in `stream`'s slot: the stream's own tag when it has one
/// (`{x}` in its name), else the whole name in braces.
fn hash_tag(stream: &str) -> String {
    if let Some(open) = stream.find('{') {
        if let Some(len) = stream[open + 1..].find('}') {
            if len > 0 {
                return stream[open..=open + 1 + len].to_owned();
            }
        }
    }
    format!("{{{stream}}}")
}

/// An entry as read: its id, its `data` field, and how many times it was delivered.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) data: Vec<u8>,
    pub(crate) count: u32,
}

/// What a delivery's handle holds: the entry, and the delivery count that fences it (a copy
/// taken over by another receive has a higher count).
struct Held {
    broker: u64,
    lane: Arc<Lane>,
    id: String,
    count: u32,
}

pub(crate) struct Shared {
    id: u64,
    pool: Pool,
    reader: Client,
    scripts: StreamScripts,
    pub(crate) lanes: Vec<Arc<Lane>>,
    /// Streams only sent to (a `queue_name` label naming no lane), with their group made.
    others: tokio::sync::Mutex<std::collections::HashMap<String, Arc<Lane>>>,
    pub(crate) group: String,
    pub(crate) consumer: String,
    pub(crate) clustered: bool,
    lease_ms: AtomicU64,
    url: String,
}

/// A broker on Valkey/Redis Streams (see the module docs). Cheap to clone.
///
/// ```no_run
/// # async fn demo() -> Result<(), ferriq_valkey::ValkeyError> {
/// let broker = ferriq_valkey::StreamBroker::builder("redis://127.0.0.1:6379")
///     .queues(["taskiq"])
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StreamBroker {
    shared: Arc<Shared>,
    reads: Arc<Reads>,
}

impl std::fmt::Debug for StreamBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamBroker")
            .field("url", &self.shared.url)
            .field("lanes", &self.lanes())
            .field("group", &self.shared.group)
            .finish_non_exhaustive()
    }
}

/// Who a script error or a lost connection hurts: the caller retries or the message comes
/// back by itself.
fn unavailable(e: fred::error::Error) -> BrokerError {
    BrokerError::Unavailable(format!("{:?}: {}", e.kind(), e.details()))
}

impl Shared {
    /// Calls `script` on one lane's keys, loading it again after `NOSCRIPT`.
    async fn call(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, fred::error::Error> {
        let client = self.pool.next();
        match client
            .evalsha::<Value, _, _, _>(script.sha1().clone(), keys.clone(), args.clone())
            .await
        {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                script.load(client).await?;
                client
                    .evalsha(script.sha1().clone(), keys, args)
                    .await
            }
            other => other,
        }
    }

    fn lease(&self) -> i64 {
        self.lease_ms.load(Ordering::Relaxed) as i64
    }

    /// Gives entries just read their lease.
    async fn give_leases(&self, lane: &Lane, entries: &[Entry]) -> Result<(), fred::error::Error> {
        let mut args: Vec<Value> = vec![self.lease().into()];
        args.extend(entries.iter().map(|e| Value::from(e.id.as_str())));
        self.call(
            &self.scripts.lease,
            vec![lane.stream.clone(), lane.leases.clone()],
            args,
        )
        .await
        .map(drop)
    }

    /// Entries of `lane` whose lease ran out (and due delayed messages, added first).
    async fn reclaim(&self, lane: &Arc<Lane>, max: usize) -> Result<Vec<Entry>, fred::error::Error> {
        let lease = self.lease();
        let reply = self
            .call(
                &self.scripts.reclaim,
                vec![lane.stream.clone(), lane.leases.clone(), lane.delayed.clone()],
                vec![
                    self.group.as_str().into(),
                    self.consumer.as_str().into(),
                    lease.into(),
                    (max as i64).into(),
                    // Pending with no lease at all: a reader that died between its read and
                    // its lease. Two leases: no live reader takes that long.
                    (2 * lease).into(),
                ],
            )
            .await?;
        Ok(reply
            .into_array()
            .into_iter()
            .filter_map(|e| {
                let mut p = e.into_array().into_iter();
                let id = p.next()?.as_string()?;
                let data = p.next()?.as_bytes().map(<[u8]>::to_vec).unwrap_or_default();
                let count = p.next()?.as_i64().unwrap_or(1).clamp(1, i64::from(u32::MAX)) as u32;
                Some(Entry { id, data, count })
            })
            .collect())
    }

    /// The lane a message goes to: a lane, or another stream by name (its group made once).
    async fn lane_for(&self, name: Option<&str>) -> Result<Arc<Lane>, BrokerError> {
        let Some(name) = name else {
            return Ok(Arc::clone(&self.lanes[0]));
        };
        if let Some(lane) = self.lanes.iter().find(|l| l.stream == name) {
            return Ok(Arc::clone(lane));
        }
        let mut others = self.others.lock().await;
        if let Some(lane) = others.get(name) {
            return Ok(Arc::clone(lane));
        }
        let lane = Arc::new(Lane::new(name));
        create_group(self.pool.next(), &lane.stream, &self.group)
            .await
            .map_err(unavailable)?;
        others.insert(name.to_owned(), Arc::clone(&lane));
        Ok(lane)
    }

    fn held<'a>(&self, handle: &'a DeliveryHandle) -> Result<&'a Held, BrokerError> {
        match handle.downcast_ref::<Held>() {
            Some(h) if h.broker == self.id => Ok(h),
            _ => Err(BrokerError::ForeignHandle),
        }
    }

    fn delivery(&self, lane: &Arc<Lane>, entry: Entry) -> Delivery {
        let task_id = ferriq::wire::TaskMessage::peek_task_id(&entry.data).map(|id| id.to_string());
        Delivery::new(
            entry.data,
            task_id,
            entry.count,
            lane.stream.as_str(),
            DeliveryHandle::new(Held {
                broker: self.id,
                lane: Arc::clone(lane),
                id: entry.id,
                count: entry.count,
            }),
        )
    }

    /// A held entry settled by `script` with `extra` arguments; `DeliveryLost` when it is not
    /// held any more.
    async fn settle(&self, script: &Script, held: &Held, keys: Vec<String>, extra: Vec<Value>) -> Result<(), BrokerError> {
        let mut args: Vec<Value> = vec![
            self.group.as_str().into(),
            self.consumer.as_str().into(),
            held.id.as_str().into(),
            i64::from(held.count).into(),
        ];
        args.extend(extra);
        let reply = self.call(script, keys, args).await.map_err(unavailable)?;
        match reply.as_i64() {
            Some(1) => Ok(()),
            _ => Err(BrokerError::DeliveryLost),
        }
    }
}

/// `XGROUP CREATE <stream> <group> 0 MKSTREAM`, unless the group exists.
async fn create_group(client: &Client, stream: &str, group: &str) -> Result<(), fred::error::Error> {
    let command = CustomCommand::new_static("XGROUP", ClusterHash::Offset(1), false);
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

    async fn connect(settings: StreamBrokerBuilder) -> Result<Self, ValkeyError> {
        let conn = &settings.connection;
        let url = conn.url.redacted();
        let failed = |e: fred::error::Error| ValkeyError::Connect {
            url: url.clone(),
            reason: conn.url.explain(format_args!("{:?}: {}", e.kind(), e.details())),
        };
        if settings.queues.is_empty() || settings.queues.iter().any(String::is_empty) {
            return Err(ValkeyError::Setting(
                "a Streams broker needs at least one queue, each named".into(),
            ));
        }
        let builder = conn.fred_builder()?;
        let pool = builder.build_pool(2).map_err(failed)?;
        let reader = builder.build().map_err(failed)?;
        let limit = conn.connect_timeout.saturating_mul(2) + Duration::from_secs(1);
        let scripts = StreamScripts::new();
        let setup = async {
            pool.init().await?;
            read::connect_reader(&reader).await?;
            for script in scripts.all() {
                script.load(pool.next()).await?;
            }
            for queue in &settings.queues {
                create_group(pool.next(), queue, &settings.group).await?;
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
        check_durable(pool.next(), &url, settings.allow_volatile).await?;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let clustered = conn.url.scheme().contains("cluster");
        let shared = Shared {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            pool,
            reader,
            scripts,
            lanes: settings.queues.iter().map(|q| Arc::new(Lane::new(q))).collect(),
            others: Default::default(),
            group: settings.group.clone(),
            consumer: format!("ferriq-{}", uuid::Uuid::new_v4().simple()),
            clustered,
            lease_ms: AtomicU64::new(30_000),
            url,
        };
        Ok(StreamBroker {
            shared: Arc::new(shared),
            reads: Arc::new(Reads::default()),
        })
    }
}

/// Refuses (unless allowed) a server that keeps its data in memory only: a restart would
/// lose every queued task. A server that does not say (a managed one refusing `CONFIG`) is
/// taken at its word, with a warning.
async fn check_durable(client: &Client, url: &str, allow: bool) -> Result<(), ValkeyError> {
    let command = CustomCommand::new_static("CONFIG", ClusterHash::Random, false);
    let reply = client
        .custom::<Value, _>(command, vec![Value::from("GET"), Value::from("appendonly")])
        .await;
    let appendonly = match reply {
        Ok(v) => v
            .into_array()
            .get(1)
            .and_then(Value::as_string)
            .map(|s| s.eq_ignore_ascii_case("yes")),
        Err(_) => None,
    };
    match appendonly {
        Some(true) => Ok(()),
        None => {
            tracing::warn!(%url, "cannot read the server's `appendonly` setting: make sure it keeps its data (appendonly yes), or a restart loses queued tasks");
            Ok(())
        }
        Some(false) if allow => {
            tracing::warn!(%url, "the broker's server keeps its data in memory only (appendonly no): a restart loses every queued task");
            Ok(())
        }
        Some(false) => Err(ValkeyError::NotDurable { url: url.to_owned() }),
    }
}

#[async_trait]
impl Broker for StreamBroker {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        let mut by_lane: Vec<(Arc<Lane>, Vec<Value>)> = Vec::new();
        for msg in batch {
            let lane = self.shared.lane_for(msg.queue.as_deref()).await?;
            let delay = msg.delay.map_or(0, |d| d.as_millis() as i64);
            let args = [
                Value::from(delay),
                Value::from(uuid::Uuid::new_v4().simple().to_string()),
                Value::Bytes(msg.body.into()),
            ];
            match by_lane.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &lane)) {
                Some((_, all)) => all.extend(args),
                None => by_lane.push((lane, args.to_vec())),
            }
        }
        for (lane, args) in by_lane {
            self.shared
                .call(
                    &self.shared.scripts.publish,
                    vec![lane.stream.clone(), lane.delayed.clone()],
                    args,
                )
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        let shared = &self.shared;
        let max = max.max(1);
        let mut out = Vec::new();
        for lane in &shared.lanes {
            if out.len() >= max {
                break;
            }
            let taken = shared
                .reclaim(lane, max - out.len())
                .await
                .map_err(unavailable)?;
            out.extend(taken.into_iter().map(|e| shared.delivery(lane, e)));
        }
        if !out.is_empty() {
            return Ok(out);
        }
        let read = self
            .reads
            .read(shared, max, wait)
            .await
            .map_err(unavailable)?;
        Ok(read
            .into_iter()
            .map(|(lane, e)| shared.delivery(&lane, e))
            .collect())
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let held = self.shared.held(delivery)?;
        let keys = vec![held.lane.stream.clone(), held.lane.leases.clone()];
        self.shared
            .settle(&self.shared.scripts.ack, held, keys, Vec::new())
            .await
    }

    async fn release(&self, delivery: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        let held = self.shared.held(delivery)?;
        let keys = vec![held.lane.stream.clone(), held.lane.leases.clone()];
        let after = Value::from(after.as_millis().min(i64::MAX as u128) as i64);
        self.shared
            .settle(&self.shared.scripts.release, held, keys, vec![after])
            .await
    }

    async fn extend(
        &self,
        deliveries: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        let mut statuses = vec![LeaseStatus::Lost; deliveries.len()];
        // One script per lane: every key of a call in one slot.
        let mut by_lane: Vec<(Arc<Lane>, Vec<usize>)> = Vec::new();
        for (i, handle) in deliveries.iter().enumerate() {
            let Ok(held) = self.shared.held(handle) else {
                continue;
            };
            match by_lane.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &held.lane)) {
                Some((_, at)) => at.push(i),
                None => by_lane.push((Arc::clone(&held.lane), vec![i])),
            }
        }
        for (lane, at) in by_lane {
            let mut args: Vec<Value> = vec![
                self.shared.group.as_str().into(),
                self.shared.consumer.as_str().into(),
                (lease.as_millis() as i64).into(),
            ];
            for &i in &at {
                let held = self.shared.held(&deliveries[i])?;
                args.push(held.id.as_str().into());
                args.push(i64::from(held.count).into());
            }
            let reply = self
                .shared
                .call(
                    &self.shared.scripts.extend,
                    vec![lane.stream.clone(), lane.leases.clone()],
                    args,
                )
                .await
                .map_err(unavailable)?;
            for (&i, kept) in at.iter().zip(reply.into_array()) {
                if kept.as_i64() == Some(1) {
                    statuses[i] = LeaseStatus::Kept;
                }
            }
        }
        Ok(statuses)
    }

    async fn dead_letter(&self, delivery: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        let held = self.shared.held(&delivery.handle)?;
        let keys = vec![
            held.lane.stream.clone(),
            held.lane.leases.clone(),
            held.lane.dead.clone(),
        ];
        let extra = vec![
            Value::from(delivery.body.as_slice()),
            Value::from(why.reason.as_str()),
            Value::from(why.detail.as_str()),
            Value::from(why.task_name.clone().unwrap_or_default()),
            Value::from(i64::from(why.attempts)),
        ];
        self.shared
            .settle(&self.shared.scripts.park, held, keys, extra)
            .await
    }

    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        let mut total = QueueDepth::new(0, 0, 0);
        for (_, d) in self.queue_depths().await? {
            total = QueueDepth::new(
                total.ready + d.ready,
                total.in_flight + d.in_flight,
                total.delayed + d.delayed,
            );
        }
        Ok(total)
    }

    async fn health(&self) -> Health {
        match self.shared.pool.next().ping::<Value>(None).await {
            Ok(_) => Health::Healthy,
            Err(e) => Health::Unhealthy(format!("{:?}: {}", e.kind(), e.details())),
        }
    }

    async fn queue_depths(&self) -> Result<Vec<(String, QueueDepth)>, BrokerError> {
        let client = self.shared.pool.next();
        let mut out = Vec::new();
        for lane in &self.shared.lanes {
            let len: i64 = client
                .custom(
                    CustomCommand::new_static("XLEN", ClusterHash::FirstKey, false),
                    vec![Value::from(lane.stream.as_str())],
                )
                .await
                .map_err(unavailable)?;
            let pending: Value = client
                .custom(
                    CustomCommand::new_static("XPENDING", ClusterHash::FirstKey, false),
                    vec![
                        Value::from(lane.stream.as_str()),
                        Value::from(self.shared.group.as_str()),
                    ],
                )
                .await
                .map_err(unavailable)?;
            let pending = pending
                .into_array()
                .first()
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let delayed: i64 = client
                .custom(
                    CustomCommand::new_static("ZCARD", ClusterHash::FirstKey, false),
                    vec![Value::from(lane.delayed.as_str())],
                )
                .await
                .map_err(unavailable)?;
            let ready = (len - pending).max(0) as u64;
            out.push((
                lane.stream.clone(),
                QueueDepth::new(ready, pending.max(0) as u64, delayed.max(0) as u64),
            ));
        }
        Ok(out)
    }

    async fn close(&self) {
        let _ = self.shared.reader.quit().await;
        let _ = self.shared.pool.quit().await;
    }

    fn lanes(&self) -> Vec<String> {
        self.shared.lanes.iter().map(|l| l.stream.clone()).collect()
    }

    fn prepare_consumer(&self, consumer: &ConsumerSettings) {
        self.shared
            .lease_ms
            .store(consumer.lease.as_millis().max(1000) as u64, Ordering::Relaxed);
    }

    async fn stop_receiving(&self) {
        // A read still blocked may bring entries: they go back at once, for another worker.
        for (lane, entry) in self.reads.take_in_flight(Duration::from_secs(3)).await {
            let held = Held {
                broker: self.shared.id,
                lane: Arc::clone(&lane),
                id: entry.id,
                count: entry.count,
            };
            let keys = vec![lane.stream.clone(), lane.leases.clone()];
            let _ = self
                .shared
                .settle(&self.shared.scripts.release, &held, keys, vec![Value::from(0i64)])
                .await;
        }
    }
}
