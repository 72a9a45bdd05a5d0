//! Helpers for the CLI's tests: a unique setup on the real RabbitMQ and Redis (exchange, lane,
//! key prefix) shared by the `ferriq` binary, in-process workers and worker processes; running
//! the built binary; cleanup.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, WorkerConfig};

// The backends the URLs name.
use ferriq_amqp as _;
use ferriq_valkey as _;

pub use ferriq_testkit::services::{amqp_url, redis_url};

/// The RabbitMQ broker's default delay tiers, as queue-name suffixes (for cleanup).
const TIERS: [&str; 8] = ["1s", "5s", "30s", "2m", "10m", "1h", "6h", "24h"];

/// One test's world: its own exchange, lane and key prefix.
pub struct Setup {
    pub lane: String,
    pub exchange: String,
    pub prefix: String,
}

impl Setup {
    pub fn new() -> Self {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
        Setup {
            lane: format!("fqt.cli.{id}"),
            exchange: format!("fqt.cli.{id}.x"),
            prefix: format!("fqt-cli-{id}"),
        }
    }

    /// The `FERRIQ_*` variables a worker and the command share.
    pub fn vars(&self) -> Vec<(String, String)> {
        [
            ("FERRIQ_BROKER_URL", amqp_url()),
            ("FERRIQ_STORE_URL", redis_url()),
            ("FERRIQ_QUEUES", self.lane.clone()),
            ("FERRIQ_AMQP_EXCHANGE", self.exchange.clone()),
            ("FERRIQ_RESULT_PREFIX", self.prefix.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    pub async fn client(&self) -> Client {
        let mut settings = ferriq::connect::Settings::default();
        settings.extend(self.vars());
        Client::from_settings(&settings).await.unwrap()
    }

    /// A client that lists (and so declares) `lanes`.
    pub async fn client_with_lanes(&self, lanes: &[&str]) -> Client {
        let mut settings = ferriq::connect::Settings::default();
        settings.extend(self.vars());
        settings.insert("FERRIQ_QUEUES", lanes.join(","));
        Client::from_settings(&settings).await.unwrap()
    }

    /// A worker in this process serving `tasks`, with `config` changed by `tune`.
    pub async fn worker(
        &self,
        tasks: &[&str],
        tune: impl FnOnce(&mut WorkerConfig),
    ) -> RunningWorker {
        let mut config = WorkerConfig::from_vars(self.vars()).unwrap();
        tune(&mut config);
        let worker = ferriq::WorkerBuilder::from_config(config)
            .await
            .unwrap()
            .registry(Registry::from_inventory().unwrap().only(tasks).unwrap())
            .build()
            .unwrap();
        RunningWorker::spawn(worker)
    }

    /// The `ferriq` command with this setup's environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferriq"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.vars())
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `ferriq args` to the end (in a blocking thread), with `stdin` piped in.
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = self.command(args);
        let stdin = stdin.map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            if stdin.is_some() {
                cmd.stdin(Stdio::piped());
            }
            let mut child = cmd
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the ferriq binary starts");
            if let Some(text) = stdin {
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(text.as_bytes())
                    .unwrap();
            }
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap()
    }

    /// Runs `ferriq --json args`, expecting success, and parses its output.
    pub async fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.run(&all, None).await;
        assert!(
            out.status.success(),
            "ferriq {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ferriq {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Dead letters parked in the lane, as the command counts them.
    pub async fn dead_count(&self) -> u64 {
        let queues = self.json(&["queues"]).await;
        queues[0]["dead_lettered"].as_u64().unwrap()
    }

    /// Polls until `n` dead letters are parked (up to `limit`).
    pub async fn wait_parked(&self, n: u64, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let parked = self.dead_count().await;
            if parked >= n {
                assert_eq!(parked, n, "more parked than expected");
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{parked} of {n} parked"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let mut queues = vec![self.lane.clone(), format!("{}.dead_letter", self.lane)];
        queues.extend(TIERS.iter().map(|t| format!("{}.delay.{t}", self.lane)));
        let exchange = self.exchange.clone();
        // A fresh runtime on a thread of its own: Drop may run inside or outside one.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(conn) =
                    lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
                        .await
                else {
                    return;
                };
                for q in queues {
                    if let Ok(ch) = conn.create_channel().await {
                        let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
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

/// Waits for every handle's outcome (success or failure), up to `limit` each.
pub async fn settle_all<T: serde::de::DeserializeOwned>(
    handles: &[ferriq::TaskHandle<T>],
    limit: Duration,
) {
    for h in handles {
        let _ = h.wait(limit).await;
    }
}

/// The store shared by every worker of a setup, for direct checks.
pub async fn store(setup: &Setup) -> Arc<dyn ferriq::store::Store> {
    let mut options = ferriq::connect::ConnectOptions::new(redis_url());
    options.settings.extend(setup.vars());
    ferriq::connect::connect_store_with(options).await.unwrap()
}

/// A finished command's standard output and error, as text.
pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
