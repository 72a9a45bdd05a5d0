//! The world's worker processes: started with the settings of the scenario and connected
//! through the proxies, signalled, killed, reaped, and asked whether they are ready.

use std::process::Stdio;
use std::time::Duration;

use super::{now_ms, Backend, WorkerProc, World};
use crate::redis::free_port;

impl World {
    /// The URL worker `n` (from 1) reaches the broker with (through its proxy; on a cluster,
    /// every node's, starting with node `(n - 1) % 3`).
    fn worker_broker_url(&self, n: u32) -> String {
        if !self.node_proxies.is_empty() {
            let mut urls: Vec<String> = self
                .node_proxies
                .iter()
                .map(|p| format!("amqp://guest:guest@127.0.0.1:{}/%2f", p.port))
                .collect();
            let first = (n as usize - 1) % urls.len();
            urls.rotate_left(first);
            return urls.join(";");
        }
        match (&self.backend, &self.sqs) {
            (Backend::Sqs, Some(q)) => {
                let path = q.url.split_once("://").map_or("", |(_, r)| r);
                let path = path.split_once('/').map_or("", |(_, p)| p);
                format!(
                    "sqs+http://127.0.0.1:{}/{path}?region=us-east-1",
                    self.broker_proxy.port
                )
            }
            (Backend::Streams, _) => format!("redis://127.0.0.1:{}", self.broker_proxy.port),
            _ => format!(
                "amqp://guest:guest@127.0.0.1:{}/%2f",
                self.broker_proxy.port
            ),
        }
    }

    /// Starts a worker process; its index.
    pub fn spawn_worker(&mut self) -> usize {
        self.spawned += 1;
        let n = self.spawned;
        let probe_port = free_port();
        let s = &self.settings;
        let mut cmd = tokio::process::Command::new(std::env::current_exe().expect("this binary"));
        cmd.arg("worker")
            .env("FERRIQ_BROKER_URL", self.worker_broker_url(n))
            .env(
                "FERRIQ_STORE_URL",
                format!("redis://127.0.0.1:{}", self.redis_proxy.port),
            )
            .env("FERRIQ_QUEUES", &self.lane)
            .env("FERRIQ_AMQP_EXCHANGE", &self.exchange)
            .env("FERRIQ_RESULT_PREFIX", &self.prefix)
            .env("FERRIQ_WORKER_ID", format!("{}-w{n}", self.prefix))
            .env("FERRIQ_LEASE_SECS", s.lease_secs.to_string())
            .env("FERRIQ_CONCURRENCY", s.concurrency.to_string())
            .env("FERRIQ_GRACE_SECS", s.grace_secs.to_string())
            .env("FERRIQ_SCHEDULER", if s.scheduler { "1" } else { "0" })
            .env("FERRIQ_PROBE_ADDR", format!("127.0.0.1:{probe_port}"))
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("FAULT_EVENTS", self.events_dir.join(format!("w{n}.log")))
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.events_dir.join(format!("w{n}.stderr")))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .kill_on_drop(true);
        if let Some(max) = s.max_payload {
            cmd.env("FERRIQ_MAX_PAYLOAD_BYTES", max.to_string());
        }
        cmd.envs(s.env.iter().map(|(k, v)| (*k, v.as_str())));
        let child = cmd.spawn().expect("a worker process starts");
        let pid = child.id().unwrap_or(0);
        self.workers.push(WorkerProc {
            pid,
            child,
            probe_port,
        });
        self.workers.len() - 1
    }

    /// Sends `sig` (`KILL`, `STOP`, `CONT`, `TERM`) to worker `i`.
    pub fn signal(&self, i: usize, sig: &str) {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.workers[i].pid.to_string()])
            .status();
    }

    /// SIGKILL worker `i` and reap it.
    pub async fn kill(&mut self, i: usize) {
        self.signal(i, "KILL");
        let _ = self.workers[i].child.wait().await;
        self.deaths.insert(self.workers[i].pid, now_ms());
    }

    /// Whether worker `i` still runs; reaps it (and records its death) if not.
    pub fn alive(&mut self, i: usize) -> bool {
        match self.workers[i].child.try_wait() {
            Ok(None) => true,
            _ => {
                self.deaths
                    .entry(self.workers[i].pid)
                    .or_insert_with(now_ms);
                false
            }
        }
    }

    /// Waits for worker `i` to exit on its own, up to `limit`; whether it did.
    pub async fn exited_within(&mut self, i: usize, limit: Duration) -> bool {
        let done = tokio::time::timeout(limit, self.workers[i].child.wait())
            .await
            .is_ok();
        if done {
            self.deaths.insert(self.workers[i].pid, now_ms());
        }
        done
    }

    /// Indexes of the live workers.
    pub fn live(&mut self) -> Vec<usize> {
        (0..self.workers.len()).filter(|i| self.alive(*i)).collect()
    }

    /// Whether worker `i`'s /readyz answers 200 (within a second).
    pub async fn ready(&self, i: usize) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let port = self.workers[i].probe_port;
        let probe = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()?;
            s.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).await.ok()?;
            Some(out.starts_with("HTTP/1.1 200"))
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(3), probe).await,
            Ok(Some(true))
        )
    }
}
