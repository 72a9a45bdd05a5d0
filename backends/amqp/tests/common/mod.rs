//! Helpers for tests against the real RabbitMQ and Redis: unique names, topology cleanup, a
//! TCP proxy the test can cut.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferriq_amqp::{AmqpBroker, AmqpBrokerBuilder};
use ferriq_valkey::ValkeyStore;
use lapin::options::{BasicGetOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub use ferriq_testkit::services::{amqp_url, redis_url};

pub fn unique(kind: &str) -> String {
    format!(
        "fqt.{kind}.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// Short delay tiers keep retry tests fast.
pub const TIERS: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// The broker's default delay tiers.
pub const DEFAULT_TIERS: [u64; 8] = [1, 5, 30, 120, 600, 3600, 6 * 3600, 24 * 3600];

/// A unique exchange and lane; every queue it implies is deleted when dropped.
pub struct Topology {
    pub exchange: String,
    pub queue: String,
    pub tiers: Vec<Duration>,
}

impl Topology {
    /// With short delay tiers, for fast retries.
    pub fn new() -> Self {
        Self::with_tiers(TIERS.to_vec())
    }

    /// With the broker's default delay tiers.
    pub fn with_default_tiers() -> Self {
        Self::with_tiers(DEFAULT_TIERS.map(Duration::from_secs).to_vec())
    }

    fn with_tiers(tiers: Vec<Duration>) -> Self {
        let queue = unique("q");
        Topology {
            exchange: format!("{queue}.x"),
            queue,
            tiers,
        }
    }

    pub fn builder(&self, url: &str) -> AmqpBrokerBuilder {
        AmqpBroker::builder(url)
            .exchange(self.exchange.as_str())
            .queues([self.queue.as_str()])
            .delay_tiers(self.tiers.iter().copied())
    }

    pub async fn broker(&self) -> AmqpBroker {
        self.builder(&amqp_url())
            .connect()
            .await
            .expect("connect to the test RabbitMQ")
    }

    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead_letter", self.queue)
    }

    fn all_queues(&self) -> Vec<String> {
        let mut names = vec![self.queue.clone(), self.dead_letter_queue()];
        for tier in &self.tiers {
            let ms = tier.as_millis();
            let label = match ms {
                ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
                ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
                ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
                ms => format!("{ms}ms"),
            };
            names.push(format!("{}.delay.{label}", self.queue));
        }
        names
    }

    /// Takes one message from the dead-letter queue, if any.
    pub async fn take_dead_letter(&self) -> Option<lapin::message::BasicGetMessage> {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        let got = ch
            .basic_get(
                self.dead_letter_queue().as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap();
        let _ = conn.close(200, "".into()).await;
        got
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let (queues, exchange) = (self.all_queues(), self.exchange.clone());
        // A fresh runtime on a thread of its own: Drop may run inside or outside one.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(conn) =
                    Connection::connect(&amqp_url(), ConnectionProperties::default()).await
                else {
                    return;
                };
                for q in queues {
                    if let Ok(ch) = conn.create_channel().await {
                        let _ = ch
                            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                }
                if let Ok(ch) = conn.create_channel().await {
                    let _ = ch
                        .exchange_delete(exchange.as_str().into(), Default::default())
                        .await;
                }
                let _ = conn.close(200, "".into()).await;
            });
        })
        .join();
    }
}

pub async fn store(prefix: &str) -> ValkeyStore {
    ValkeyStore::builder(redis_url())
        .prefix(prefix)
        .result_ttl(Some(Duration::from_secs(600)))
        .claim_ttl(Duration::from_secs(600))
        .connect()
        .await
        .expect("connect to the test Redis")
}

/// The proxy's open connections: each forwarding task and its stall switch.
type Connections = Arc<Mutex<Vec<(JoinHandle<()>, Arc<tokio::sync::Notify>)>>>;

/// A TCP proxy to RabbitMQ whose connections the test can cut (closed at once, as a crash
/// or reset would) or stall (kept open but silent, as a partition would).
pub struct Proxy {
    pub port: u16,
    conns: Connections,
    accept: JoinHandle<()>,
    /// Set: new connections are accepted and never answered (a blackholed node).
    black: Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Connections = Arc::default();
        let target = target.to_owned();
        let black = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let accept = {
            let conns = conns.clone();
            let black = black.clone();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if black.load(std::sync::atomic::Ordering::SeqCst) {
                        // Open and silent, until the proxy is dropped.
                        let held = tokio::spawn(async move {
                            let _inbound = inbound;
                            std::future::pending::<()>().await;
                        });
                        conns.lock().unwrap().push((held, Arc::default()));
                        continue;
                    }
                    let target = target.clone();
                    let stall = Arc::new(tokio::sync::Notify::new());
                    let stalled = stall.clone();
                    let task = tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = stalled.notified() => {
                                // Silent but open: only heartbeats can tell.
                                std::future::pending::<()>().await;
                            }
                        }
                    });
                    conns.lock().unwrap().push((task, stall));
                }
            })
        };
        Proxy {
            port,
            conns,
            accept,
            black,
        }
    }

    /// Drops every open connection at once; new ones are still accepted.
    pub fn cut(&self) -> usize {
        let mut conns = self.conns.lock().unwrap();
        let n = conns.iter().filter(|(t, _)| !t.is_finished()).count();
        for (t, _) in conns.drain(..) {
            t.abort();
        }
        n
    }

    /// Stops forwarding on every open connection without closing it; new connections work.
    pub fn stall(&self) -> usize {
        let mut conns = self.conns.lock().unwrap();
        let live: Vec<_> = conns.drain(..).filter(|(t, _)| !t.is_finished()).collect();
        for (_, stall) in &live {
            stall.notify_one();
        }
        let n = live.len();
        // Keep them (open and silent) until the proxy is dropped.
        conns.extend(live);
        n
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// As a node killed: stops listening (new connections are refused) and drops every open
    /// connection.
    pub fn down(&self) -> usize {
        self.accept.abort();
        self.cut()
    }

    /// As a node partitioned away: every open connection goes silent, and new ones are
    /// accepted and never answered.
    pub fn blackhole(&self) -> usize {
        self.black.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stall()
    }

    /// Open connections through it now.
    pub fn live(&self) -> usize {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| !t.is_finished())
            .count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[allow(unused_imports)] // used by the interop tests only
pub use ferriq_testkit::services::python;

/// The environment the interop scripts read: the test's names on the shared servers.
pub fn interop_env(cmd: &mut tokio::process::Command, topology: &Topology, prefix: &str) {
    cmd.current_dir(std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop"))
        .env("INTEROP_AMQP_URL", amqp_url())
        .env("INTEROP_EXCHANGE", &topology.exchange)
        .env("INTEROP_QUEUE", &topology.queue)
        .env("INTEROP_REDIS_URL", redis_url())
        .env("INTEROP_PREFIX", prefix)
        .env("PYTHONDONTWRITEBYTECODE", "1");
}

/// Receives `n` deliveries (acking each) and returns their task ids in the order they arrived.
pub async fn receive_acking(broker: &ferriq_amqp::AmqpBroker, n: usize) -> Vec<String> {
    use ferriq::broker::Broker;
    let mut received = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while received.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} arrived",
            received.len()
        );
        for d in broker
            .receive(64, Duration::from_millis(200))
            .await
            .unwrap()
        {
            received.push(d.task_id.as_ref().expect("the task_id header").to_string());
            broker.ack(&d.handle).await.unwrap();
        }
    }
    received
}
