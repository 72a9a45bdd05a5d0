//! One scenario's world: a private redis-server (the store) and the broker (the shared
//! RabbitMQ, or the SQS emulator), each behind a proxy the harness controls; worker processes
//! (this binary in worker mode) connected through the proxies; a producer and the oracle
//! connected directly, outside the faulted path.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferriq::broker::Broker;
use ferriq::wire::TaskId;
use ferriq::Client;
use ferriq_valkey::ValkeyStore;
use tokio::process::Child;
use tokio::time::Instant;

use ferriq_testkit::rabbitmq::PrivateCluster;

mod workers;

use crate::proxy::Proxy;
use crate::redis::{Oracle, PrivateRedis};

/// Which broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The shared RabbitMQ, through a proxy.
    Amqp,
    /// The fauxqs emulator, through a proxy.
    Sqs,
    /// A private three-node RabbitMQ cluster of the world's own, each node behind a proxy;
    /// every worker's URL lists every node, each starting with another.
    AmqpCluster,
    /// Valkey/Redis Streams on the world's own server (the store's, with AOF `always`),
    /// through a proxy of its own.
    Streams,
}

impl Backend {
    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Amqp => "RabbitMQ",
            Backend::Sqs => "SQS (fauxqs)",
            Backend::AmqpCluster => "RabbitMQ, 3-node cluster",
            Backend::Streams => "Redis Streams",
        }
    }
}

/// The harness queues' `maxReceiveCount`. A SIGKILL every second (scenario 1) can push a
/// message past 10 receives — polls cut off by a kill count as receives too — and SQS then
/// parks it itself, without a result (RELIABILITY.md, "Known limits").
const SQS_MAX_RECEIVE_COUNT: u32 = 50;

/// How the workers of a world run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Claim lease (and SQS visibility), seconds.
    pub lease_secs: f64,
    /// Runs per worker.
    pub concurrency: usize,
    /// Drain grace, seconds.
    pub grace_secs: f64,
    /// Workers run the scheduler.
    pub scheduler: bool,
    /// The store appends every write to disk (`appendfsync always`).
    pub aof: bool,
    /// The workers' payload limit.
    pub max_payload: Option<usize>,
    /// More `FERRIQ_*` variables for the workers.
    pub env: Vec<(&'static str, String)>,
    /// On SQS, a FIFO queue (and dead-letter queue).
    pub fifo: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_secs: 3.0,
            concurrency: 8,
            grace_secs: 5.0,
            scheduler: false,
            aof: false,
            max_payload: None,
            env: Vec::new(),
            fifo: false,
        }
    }
}

/// A worker process.
pub struct WorkerProc {
    /// Its pid.
    pub pid: u32,
    child: Child,
    /// Where it serves /readyz.
    pub probe_port: u16,
}

struct SqsQueues {
    admin: aws_sdk_sqs::Client,
    url: String,
    dlq: String,
}

/// Everything one scenario runs on.
pub struct World {
    /// The broker.
    pub backend: Backend,
    /// Lane (queue) name.
    pub lane: String,
    exchange: String,
    /// The store's key prefix.
    pub prefix: String,
    /// The store's server.
    pub redis: PrivateRedis,
    /// Between the workers and the store.
    pub redis_proxy: Proxy,
    /// Between the workers and the broker.
    pub broker_proxy: Proxy,
    /// Result writes as the server announced them.
    pub oracle: Oracle,
    /// The collector's files.
    pub events_dir: PathBuf,
    /// The producer (direct connections).
    pub client: Client,
    /// The store, read directly.
    pub store: Arc<ValkeyStore>,
    /// The broker, direct.
    pub broker: Arc<dyn Broker>,
    /// Worker processes (dead ones stay, with `alive` false).
    pub workers: Vec<WorkerProc>,
    /// When each dead worker died (pid → unix ms).
    pub deaths: HashMap<u32, u64>,
    /// Task ids the producer sent.
    pub sent: Vec<TaskId>,
    settings: Settings,
    sqs: Option<SqsQueues>,
    spawned: u32,
    /// On [`Backend::AmqpCluster`], its nodes.
    pub cluster: Option<PrivateCluster>,
    /// On [`Backend::AmqpCluster`], between the workers and each node (same order).
    pub node_proxies: Vec<Proxy>,
}

/// Unix ms now (the core's clock).
pub fn now_ms() -> u64 {
    ferriq::clock::Clock::system().now_unix_ms()
}

fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

impl World {
    /// A new world on `backend`, under `root` (a run's scratch folder).
    pub async fn new(backend: Backend, root: &std::path::Path, settings: Settings) -> World {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let name = format!("fqfault{id}");
        let dir = root.join(&name);
        let events_dir = dir.join("events");
        std::fs::create_dir_all(&events_dir).expect("scratch folder");
        // The Streams broker keeps its queues on the store's server: never without the AOF.
        let aof = settings.aof || backend == Backend::Streams;
        let redis = PrivateRedis::start(dir.join("redis"), aof).await;
        let lane = if settings.fifo && backend == Backend::Sqs {
            format!("{name}.fifo")
        } else {
            name.clone()
        };
        let oracle = Oracle::new(&name);
        oracle.attach(redis.port, true).await;
        let redis_proxy = Proxy::start(&redis.addr()).await;
        let store = Arc::new(
            ValkeyStore::builder(format!("redis://{}", redis.addr()))
                .prefix(name.as_str())
                .connect()
                .await
                .expect("the private redis"),
        );
        let mut cluster = None;
        let mut node_proxies = Vec::new();
        let (broker, broker_proxy, sqs): (Arc<dyn Broker>, Proxy, Option<SqsQueues>) = match backend
        {
            Backend::AmqpCluster => {
                let nodes = PrivateCluster::start().await;
                for node in &nodes.nodes {
                    node_proxies
                        .push(Proxy::start(&format!("127.0.0.1:{}", node.plain_port)).await);
                }
                // The producer and the oracle's side reach the nodes directly (every node
                // listed), outside the faulted path; the lane's queue is declared on the first.
                let broker = ferriq_amqp::AmqpBroker::builder(nodes.url().as_str())
                    .exchange(format!("{name}.x"))
                    .queues([name.as_str()])
                    .connect()
                    .await
                    .expect("the private RabbitMQ cluster");
                // Workers use `node_proxies`; this one stays idle.
                let idle = Proxy::start(&format!("127.0.0.1:{}", nodes.nodes[0].plain_port)).await;
                cluster = Some(nodes);
                (Arc::new(broker), idle, None)
            }
            Backend::Amqp => {
                let url = ferriq_examples::amqp_url();
                let broker = ferriq_amqp::AmqpBroker::builder(url.as_str())
                    .exchange(format!("{name}.x"))
                    .queues([name.as_str()])
                    .connect()
                    .await
                    .expect("RabbitMQ");
                (Arc::new(broker), Proxy::start(&host_port(&url)).await, None)
            }
            Backend::Streams => {
                let broker =
                    ferriq_valkey::StreamBroker::builder(format!("redis://{}", redis.addr()))
                        .queues([name.as_str()])
                        .connect()
                        .await
                        .expect("the private redis, as a broker");
                (Arc::new(broker), Proxy::start(&redis.addr()).await, None)
            }
            Backend::Sqs => {
                let endpoint = ferriq_examples::sqs::endpoint();
                let admin = ferriq_examples::sqs::client(&endpoint);
                let (url, dlq) = ferriq_examples::sqs::create_queue_pair_with(
                    &admin,
                    &lane,
                    SQS_MAX_RECEIVE_COUNT,
                )
                .await;
                let broker = ferriq_sqs::SqsBrokerBuilder::new(lane.clone())
                    .endpoint_url(endpoint.clone())
                    .region("us-east-1")
                    .credentials("test", "test")
                    .wait_time(Duration::from_secs(1))
                    .connect()
                    .await
                    .expect("the SQS emulator");
                (
                    Arc::new(broker),
                    Proxy::start(&host_port(&endpoint)).await,
                    Some(SqsQueues { admin, url, dlq }),
                )
            }
        };
        let client = Client::new(broker.clone(), store.clone());
        World {
            backend,
            lane,
            exchange: format!("{name}.x"),
            prefix: name,
            redis,
            redis_proxy,
            broker_proxy,
            oracle,
            events_dir,
            client,
            store,
            broker,
            workers: Vec::new(),
            deaths: HashMap::new(),
            sent: Vec::new(),
            settings,
            sqs,
            spawned: 0,
            cluster,
            node_proxies,
        }
    }

    /// Enqueues `n` `fault.work` tasks of `ms` each, in batches.
    pub async fn enqueue_work(&mut self, n: usize, ms: impl Fn(usize) -> u64) {
        self.enqueue(n, |k| crate::tasks::work::call(ms(k))).await;
    }

    /// Enqueues `n` calls, in batches.
    pub async fn enqueue(&mut self, n: usize, call: impl Fn(usize) -> ferriq::Call<u64>) {
        let mut i = 0;
        while i < n {
            let end = (i + 500).min(n);
            let handles = self
                .client
                .enqueue_batch((i..end).map(&call))
                .await
                .expect("the producer enqueues");
            self.sent
                .extend(handles.into_iter().map(|h| h.task_id().clone()));
            i = end;
        }
    }

    /// Enqueues `n` `fault.work` tasks of `ms` each, task `k` in message group `k % groups`
    /// (the `group_id` label), each group's in order; returns each task's group and place in it.
    pub async fn enqueue_in_groups(
        &mut self,
        n: usize,
        groups: usize,
        ms: impl Fn(usize) -> u64,
    ) -> HashMap<TaskId, (usize, usize)> {
        let mut places = HashMap::new();
        let mut i = 0;
        while i < n {
            // Ten per batch: one SendMessageBatch, sent in order.
            let end = (i + 10).min(n);
            let calls = (i..end).map(|k| {
                crate::tasks::work::call(ms(k)).with_label("group_id", format!("g{}", k % groups))
            });
            let handles = self
                .client
                .enqueue_batch(calls)
                .await
                .expect("the producer enqueues");
            for (k, h) in (i..end).zip(handles) {
                places.insert(h.task_id().clone(), (k % groups, k / groups));
                self.sent.push(h.task_id().clone());
            }
            i = end;
        }
        places
    }

    /// Ids with at least one result write seen.
    pub fn written(&self) -> usize {
        let writes = self.oracle.writes();
        self.sent
            .iter()
            .filter(|id| writes.contains_key(id.as_str()))
            .count()
    }

    /// Waits until every sent id has a result write seen, up to `limit`; whether it did.
    pub async fn wait_written(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.written() >= self.sent.len() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Where unfinished tasks' messages are, as SQS counts them (queue: visible / in flight /
    /// delayed; dead-letter queue: visible): for a row that did not drain. Empty on RabbitMQ.
    pub async fn sqs_counts(&self) -> String {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let Some(q) = &self.sqs else {
            return String::new();
        };
        let mut out = Vec::new();
        for (name, url) in [("queue", &q.url), ("dead-letter queue", &q.dlq)] {
            let attrs = q
                .admin
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(A::All)
                .send()
                .await
                .ok()
                .and_then(|o| o.attributes)
                .unwrap_or_default();
            let get = |a: A| attrs.get(&a).cloned().unwrap_or_else(|| "?".into());
            out.push(format!(
                "{name}: {} visible, {} in flight, {} delayed",
                get(A::ApproximateNumberOfMessages),
                get(A::ApproximateNumberOfMessagesNotVisible),
                get(A::ApproximateNumberOfMessagesDelayed)
            ));
        }
        out.join("; ")
    }

    /// Removes what the world made on the shared broker; stops every process.
    pub async fn cleanup(mut self) {
        for w in &mut self.workers {
            let _ = w.child.start_kill();
            let _ = w.child.wait().await;
        }
        match &self.sqs {
            Some(q) => {
                ferriq_examples::sqs::delete_queues(&q.admin, &[q.url.clone(), q.dlq.clone()]).await
            }
            // A private cluster goes with its nodes.
            None if self.cluster.is_some() => {}
            None => ferriq_examples::delete_amqp_topology(&self.exchange, &self.lane).await,
        }
        self.redis.kill().await;
    }
}
