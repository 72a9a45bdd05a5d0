//! Helpers for tests against real Redis: unique prefixes on the shared server, and private
//! servers on free ports for tests that kill one.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferriq_valkey::ValkeyStore;

/// The shared test server (started by scripts/test.sh when absent).
pub fn url() -> String {
    std::env::var("FERRIQ_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A prefix no other test uses.
pub fn prefix() -> String {
    format!("fqt{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
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

/// A redis-server of the test's own, on a free port, that the test may kill and restart.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = PrivateRedis { port, child: None };
        server.restart().await;
        server
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
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "private redis did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
