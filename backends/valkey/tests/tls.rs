//! TLS for real: a throwaway CA and certificates made with `openssl`, a private redis-server
//! with a TLS port (and one asking for client certificates), and a store, worker and client
//! connecting over `rediss://` end to end. Each refusal names what to fix and prints no key.
//! Needs the `tls` feature (`scripts/test.sh` runs it).
#![cfg(feature = "tls")]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ferriq::Client;
use ferriq_valkey::ValkeyStore;

/// A CA, server certificates (good, expired, for another host) and a client certificate.
struct Pki {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("fq-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=ferriq test CA",
        ]);
        openssl(&dir, &ca);
        // Another CA, which signed nothing the server shows.
        let mut other = vec!["req", "-x509"];
        other.extend(ec);
        other.extend([
            "-keyout",
            "other.key",
            "-out",
            "other.pem",
            "-days",
            "2",
            "-subj",
            "/CN=other CA",
        ]);
        openssl(&dir, &other);
        let pki = Pki { dir };
        pki.sign("server", "DNS:localhost,IP:127.0.0.1", "2");
        pki.sign("expired", "DNS:localhost,IP:127.0.0.1", "-1");
        pki.sign("elsewhere", "DNS:db.example.com", "2");
        pki.sign("client", "DNS:ferriq-worker", "2");
        pki
    }

    /// A key and a certificate for `san`, signed by the CA, valid for `days` (-1: expired).
    fn sign(&self, name: &str, san: &str, days: &str) {
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        std::fs::write(self.dir.join(&ext), format!("subjectAltName={san}\n")).unwrap();
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                days,
                "-extfile",
                &ext,
            ],
        );
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A redis-server of the test's own on a TLS port only, showing certificate `cert`; with
/// `clients`, it asks for a client certificate signed by the CA.
struct TlsRedis {
    port: u16,
    child: Child,
}

impl TlsRedis {
    async fn start(pki: &Pki, cert: &str, clients: bool) -> Self {
        let port = common::free_port();
        let (pem, key) = (
            pki.path(&format!("{cert}.pem")),
            pki.path(&format!("{cert}.key")),
        );
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args(["--tls-cert-file", pem.to_str().unwrap()])
            .args(["--tls-key-file", key.to_str().unwrap()])
            .args(["--tls-ca-cert-file", pki.path("ca.pem").to_str().unwrap()])
            .args(["--tls-auth-clients", if clients { "yes" } else { "no" }])
            .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        let mut server = TlsRedis { port, child };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "redis-server exited"
            );
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    fn url(&self, host: &str) -> String {
        format!("rediss://{host}:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The error a store connecting with `tune` gets, as text.
async fn refusal(
    url: &str,
    tune: impl FnOnce(ferriq_valkey::ValkeyStoreBuilder) -> ferriq_valkey::ValkeyStoreBuilder,
) -> String {
    let builder = ValkeyStore::builder(url)
        .prefix(common::prefix())
        .connect_timeout(Duration::from_secs(2));
    match tune(builder).connect().await {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => e.to_string(),
    }
}

#[ferriq::task(name = "valkey.tls.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_and_its_result_comes_back_over_tls_with_a_private_ca() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, "server", false).await;
    let ca = pki.path("ca.pem");
    for host in ["localhost", "127.0.0.1"] {
        let store = Arc::new(
            common::store_at(&redis.url(host), &common::prefix(), |b| b.tls_ca_file(&ca)).await,
        );
        let broker = Arc::new(ferriq::memory::MemoryBroker::new());
        let worker = common::spawn_worker_with(broker.clone(), store.clone(), &[add::NAME], ());
        let client = Client::new(broker, store);
        let handle = add::kiq(&client, 2, 3).await.unwrap();
        assert_eq!(handle.wait(Duration::from_secs(30)).await.unwrap(), 5);
        worker.stop().await;
    }
}

/// The Streams broker over `rediss://` too: a task sent through it runs and its result comes
/// back, broker and store both on the TLS server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_broker_runs_tasks_over_tls_with_a_private_ca() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, "server", false).await;
    let ca = pki.path("ca.pem");
    let url = redis.url("localhost");
    let store = Arc::new(common::store_at(&url, &common::prefix(), |b| b.tls_ca_file(&ca)).await);
    let broker = Arc::new(
        ferriq_valkey::StreamBroker::builder(url.as_str())
            .queues([format!("{}.tls", common::prefix())])
            .tls_ca_file(&ca)
            // The private server runs without appendonly.
            .allow_volatile(true)
            .connect()
            .await
            .expect("the Streams broker connects over TLS"),
    );
    let worker = common::spawn_worker_with(broker.clone(), store.clone(), &[add::NAME], ());
    let client = Client::new(broker, store);
    let handle = add::kiq(&client, 20, 22).await.unwrap();
    assert_eq!(handle.wait(Duration::from_secs(30)).await.unwrap(), 42);
    worker.stop().await;
    // Without the CA, the server's certificate is not trusted: refused.
    let refused = ferriq_valkey::StreamBroker::builder(url.as_str())
        .queues(["tls.refused"])
        .allow_volatile(true)
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(
        refused.is_err(),
        "connected without trusting the server's CA"
    );
}

#[tokio::test]
async fn a_server_asking_for_client_certificates_takes_ours_and_refuses_none() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, "server", true).await;
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let store = common::store_at(&redis.url("localhost"), &common::prefix(), |b| {
        b.tls_ca_file(&ca).tls_client_cert(&cert, &key)
    })
    .await;
    use ferriq::store::ResultStore;
    let id = ferriq::wire::TaskId::random();
    assert!(matches!(
        store.get(&id).await.unwrap(),
        ferriq::store::ResultStatus::Pending
    ));
    let refused = refusal(&redis.url("localhost"), |b| b.tls_ca_file(&ca)).await;
    assert!(refused.contains("FERRIQ_STORE_TLS_CERT"), "{refused}");
    // A key that is not the certificate's: named, not printed.
    let wrong = refusal(&redis.url("localhost"), |b| {
        b.tls_ca_file(&ca)
            .tls_client_cert(&cert, pki.path("server.key"))
    })
    .await;
    assert!(wrong.contains("FERRIQ_STORE_TLS_KEY"), "{wrong}");
    let key_text = std::fs::read_to_string(pki.path("server.key")).unwrap();
    let body = key_text.lines().nth(1).unwrap();
    assert!(!wrong.contains(body), "the key was printed: {wrong}");
}

#[tokio::test]
async fn each_refusal_names_what_to_fix() {
    let pki = Pki::new();
    let good = TlsRedis::start(&pki, "server", false).await;
    let expired = TlsRedis::start(&pki, "expired", false).await;
    let elsewhere = TlsRedis::start(&pki, "elsewhere", false).await;
    let ca = pki.path("ca.pem");
    // No CA given: the system's roots do not know ours.
    let untrusted = refusal(&good.url("localhost"), |b| b).await;
    assert!(untrusted.contains("FERRIQ_STORE_TLS_CA"), "{untrusted}");
    let other_ca = refusal(&good.url("localhost"), |b| {
        b.tls_ca_file(pki.path("other.pem"))
    })
    .await;
    assert!(other_ca.contains("FERRIQ_STORE_TLS_CA"), "{other_ca}");
    let mismatch = refusal(&elsewhere.url("localhost"), |b| b.tls_ca_file(&ca)).await;
    assert!(mismatch.contains("host name"), "{mismatch}");
    let old = refusal(&expired.url("localhost"), |b| b.tls_ca_file(&ca)).await;
    assert!(old.contains("expired"), "{old}");
    // A plain port spoken to in TLS.
    let plain = common::PrivateRedis::start().await;
    let url = format!("rediss://:hunter2@127.0.0.1:{}", plain.port);
    let not_tls = refusal(&url, |b| b.tls_ca_file(&ca)).await;
    assert!(not_tls.contains("does not speak TLS"), "{not_tls}");
    assert!(!not_tls.contains("hunter2"), "{not_tls}");
    // Files that are not what they should be, and TLS files with a plain URL.
    let missing = refusal(&good.url("localhost"), |b| {
        b.tls_ca_file("/nonexistent/ca.pem")
    })
    .await;
    assert!(
        missing.contains("FERRIQ_STORE_TLS_CA") && missing.contains("/nonexistent/ca.pem"),
        "{missing}"
    );
    let plain_url = refusal(&format!("redis://127.0.0.1:{}", plain.port), |b| {
        b.tls_ca_file(&ca)
    })
    .await;
    assert!(plain_url.contains("rediss://"), "{plain_url}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valkey_cluster_over_tls_runs_tasks_with_a_private_ca() {
    let pki = Pki::new();
    let cluster = common::cluster::PrivateCluster::start_tls(
        3,
        &pki.path("server.pem"),
        &pki.path("server.key"),
        &pki.path("ca.pem"),
    )
    .await;
    let ca = pki.path("ca.pem");
    assert!(cluster.url().starts_with("rediss-cluster://"));
    let store =
        Arc::new(common::store_at(&cluster.url(), &common::prefix(), |b| b.tls_ca_file(&ca)).await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let worker = common::spawn_worker_with(broker.clone(), store.clone(), &[add::NAME], ());
    let client = Client::new(broker, store);
    let handles = client
        .enqueue_batch((0..30).map(|i| add::call(i, 1)))
        .await
        .unwrap();
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(30)).await.unwrap(), i as i64 + 1);
    }
    worker.stop().await;
    // Without our CA, each node's certificate is refused.
    let refused = refusal(&cluster.url(), |b| b).await;
    assert!(refused.contains("FERRIQ_STORE_TLS_CA"), "{refused}");
}
