//! Helpers for tests against real Redis: unique prefixes on the shared server, and private
//! servers on free ports for tests that kill one.
#![allow(dead_code)]

pub mod cluster;
pub mod failover;
pub mod waiting;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferriq_valkey::ValkeyStore;

/// The shared test server (started by scripts/test.sh when absent; a test fails at once,
/// naming the command that starts it, when it does not answer).
pub fn url() -> String {
    ferriq_testkit::services::redis_url()
}

/// A prefix no other test uses.
pub fn prefix() -> String {
    format!("fqt{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A Streams broker on the shared server for `queue` (a lane name no other test uses). The
/// shared server runs without appendonly, so the broker is told to accept it (RELIABILITY.md
/// says how to run a durable one).
pub async fn stream_broker(queue: &str) -> ferriq_valkey::StreamBroker {
    ferriq_valkey::StreamBroker::builder(url())
        .queues([queue])
        .allow_volatile(true)
        .connect()
        .await
        .expect("connect the Streams broker")
}

/// A store on the shared server under a fresh prefix; keys expire within 10 minutes.
pub async fn store() -> ValkeyStore {
    store_at(&url(), &prefix(), |b| b).await
}

pub async fn store_at(
    url: &str,
    prefix: &str,
    tune: impl FnOnce(ferriq_valkey::ValkeyStoreBuilder) -> ferriq_valkey::ValkeyStoreBuilder,
) -> ValkeyStore {
    let builder = ValkeyStore::builder(url)
        .prefix(prefix)
        .result_ttl(Some(Duration::from_secs(600)))
        .claim_ttl(Duration::from_secs(600));
    tune(builder)
        .connect()
        .await
        .expect("connect to the test Redis")
}

/// A port for a server of the test's own: free now, and below the kernel's ephemeral range
/// (32768 and up), so no outgoing connection of a concurrent test can take it before the
/// server binds it (port 0 would hand out an ephemeral port).
/// Never the same port twice in one test process: concurrent tests pick theirs before binding.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = 20_000 + (uuid::Uuid::new_v4().as_u128() % 12_000) as u16;
        let mut given = GIVEN.lock().unwrap();
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
}

/// A redis-server of the test's own, on a free port, that the test may kill and restart.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        // A port found free can be taken before the server binds it: then the server exits,
        // and the next port is tried.
        for _ in 0..5 {
            let mut server = PrivateRedis {
                port: free_port(),
                child: None,
            };
            if server.try_start().await {
                return server;
            }
        }
        panic!("no private redis-server could start (5 ports tried; is redis-server installed?)")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no chance to save or close connections cleanly.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it (again) on the same port, without persistence, and waits until it answers.
    pub async fn restart(&mut self) {
        assert!(
            self.try_start().await,
            "private redis did not start again on port {}",
            self.port
        );
    }

    /// Starts it on its port; whether it is up and answering `PING` as the server we started.
    async fn try_start(&mut self) -> bool {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Ours must still be running: otherwise the port answers for someone else.
            let exited = self.child.as_mut().and_then(|c| c.try_wait().unwrap());
            if exited.is_some() {
                self.child = None;
                return false;
            }
            if redis_cli(self.port, &["ping"]).trim() == "PONG" {
                // Still ours after answering (a server that lost the port has exited by now).
                let exited = self.child.as_mut().and_then(|c| c.try_wait().unwrap());
                return exited.is_none();
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// redis-servers of the test's own, with their files in one temporary directory: killed and
/// removed when dropped (the files are kept, and their place printed, when the test failed).
pub struct ServerGroup {
    children: Vec<Child>,
    pub dir: std::path::PathBuf,
}

impl ServerGroup {
    pub fn new(kind: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("fq-{kind}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        ServerGroup {
            children: Vec::new(),
            dir,
        }
    }

    /// Starts `redis-server` with `args` (which set `port`), logging to `{name}.log` in the
    /// group's directory, and waits until it answers. It must still be running then:
    /// otherwise the port answers for someone else.
    pub async fn start(&mut self, name: &str, port: u16, args: &[&str]) {
        let mut child = Command::new("redis-server")
            .args(args)
            .args(["--logfile", &format!("{name}.log")])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = child.try_wait().unwrap();
            if exited.is_some() || tokio::time::Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join(format!("{name}.log")));
                panic!("{name} on {port} did not start ({exited:?}): {log:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.children.push(child);
    }

    /// SIGKILLs the `index`-th server started.
    pub fn kill(&mut self, index: usize) {
        let _ = self.children[index].kill();
        let _ = self.children[index].wait();
    }
}

impl Drop for ServerGroup {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("server files kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `redis-cli -p port args…`'s output, bounded to 5 s.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("timeout")
        .args(["5", "redis-cli", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Waits until a replica of the server on `port` has every write made so far, asking for up
/// to 30 s: a replica still making its first sync takes longer than one `WAIT` may block
/// (redis-cli is stopped after 5 s).
pub fn replicated(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while redis_cli(port, &["WAIT", "1", "1000"]).trim() != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "no replica of the server on port {port} caught up within 30 s"
        );
    }
}

/// A plain fred client on `url`, connected: for looking at keys and channels beside the store.
pub async fn raw_client(url: &str) -> fred::prelude::Client {
    let client = fred::prelude::Builder::from_config(fred::prelude::Config::from_url(url).unwrap())
        .build()
        .unwrap();
    fred::prelude::ClientLike::init(&client).await.unwrap();
    client
}

/// The token and failure count of a claim that says run; panics on any other answer.
pub fn expect_run(outcome: ferriq::store::ClaimOutcome) -> (ferriq::store::Token, u32) {
    match outcome {
        ferriq::store::ClaimOutcome::Run {
            token, failures, ..
        } => (token, failures),
        other => panic!("expected Run, got {other:?}"),
    }
}

/// A successful result holding `v`.
pub fn ok(v: serde_json::Value) -> ferriq::wire::TaskResult {
    ferriq::wire::TaskResult::success(v, 0.0, Default::default())
}

/// Claims `id` for worker `w` with a 30 s lease: its token if it may run, else the outcome.
pub async fn run_claim(
    store: &ValkeyStore,
    id: &ferriq::wire::TaskId,
) -> Result<ferriq::store::Token, String> {
    use ferriq::store::{ClaimOutcome, ClaimStore};
    match store.claim(id, "w", Duration::from_secs(30), None).await {
        Ok(ClaimOutcome::Run { token, .. }) => Ok(token),
        other => Err(format!("{other:?}")),
    }
}

/// A worker on `broker` with this store, serving the tasks named.
pub fn spawn_worker(
    broker: std::sync::Arc<impl ferriq::broker::Broker + 'static>,
    store: std::sync::Arc<ValkeyStore>,
    names: &[&str],
) -> ferriq::testing::RunningWorker {
    ferriq::testing::RunningWorker::spawn(worker(broker, store, names).build().unwrap())
}

/// [`spawn_worker`], with `state` for the tasks that take it.
pub fn spawn_worker_with<S: Send + Sync + 'static>(
    broker: std::sync::Arc<impl ferriq::broker::Broker + 'static>,
    store: std::sync::Arc<ValkeyStore>,
    names: &[&str],
    state: S,
) -> ferriq::testing::RunningWorker {
    ferriq::testing::RunningWorker::spawn(
        worker(broker, store, names).state(state).build().unwrap(),
    )
}

fn worker(
    broker: std::sync::Arc<impl ferriq::broker::Broker + 'static>,
    store: std::sync::Arc<ValkeyStore>,
    names: &[&str],
) -> ferriq::WorkerBuilder {
    ferriq::Worker::builder()
        .broker(broker)
        .store(store)
        .registry(
            ferriq::Registry::from_inventory()
                .unwrap()
                .only(names)
                .unwrap(),
        )
}

/// Polls `check` every 20 ms until it holds; panics after `limit`.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A subscriber on `url` listening on `channel`, with its messages. fred answers SUBSCRIBE
/// once it is written; the PING's answer comes after the server's, so the subscription holds
/// when this returns.
pub async fn listen(
    url: &str,
    channel: &str,
) -> (
    fred::clients::SubscriberClient,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    use fred::prelude::{ClientLike, EventInterface, PubsubInterface};
    let subscriber =
        fred::prelude::Builder::from_config(fred::prelude::Config::from_url(url).unwrap())
            .with_performance_config(|p| p.broadcast_channel_capacity = 1024)
            .build_subscriber_client()
            .unwrap();
    subscriber.init().await.unwrap();
    let messages = subscriber.message_rx();
    subscriber.subscribe(channel).await.unwrap();
    let _: fred::types::Value = subscriber.ping(None).await.unwrap();
    (subscriber, messages)
}

/// How many connections the server behind `raw` has subscribed to `channel`.
pub async fn subscribers(raw: &fred::prelude::Client, channel: &str) -> i64 {
    let counts: Vec<(String, i64)> = fred::prelude::PubsubInterface::pubsub_numsub(raw, channel)
        .await
        .unwrap();
    counts.first().map_or(0, |(_, n)| *n)
}

/// A server's `used_memory`, bytes.
pub fn used_memory(port: u16) -> u64 {
    redis_cli(port, &["info", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}
