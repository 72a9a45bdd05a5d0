//! TLS for real on RabbitMQ: a throwaway CA and certificates made with `openssl`, a private
//! RabbitMQ node (its own name, ports and data directory; the shared node untouched) with a TLS
//! listener that asks for client certificates, and a worker and client connecting over
//! `amqps://` end to end. Each refusal names what to fix. Needs the `tls` feature
//! (`scripts/test.sh` runs it).
#![cfg(feature = "tls")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use ferriq::Client;
use ferriq_amqp::AmqpBroker;
use ferriq_valkey::ValkeyStore;

fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A port free now (the kernel picks it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private RabbitMQ node with a TLS listener asking for client certificates, its files in a
/// directory of its own; stopped by its PID when dropped.
struct TlsNode {
    dir: PathBuf,
    tls_port: u16,
    plain_port: u16,
    pid: Option<u32>,
}

impl TlsNode {
    async fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("fq-rmq-tls-{}", uuid::Uuid::new_v4().simple()));
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
        run(&dir, "openssl", &ca);
        for (name, san) in [("server", "DNS:localhost"), ("client", "DNS:ferriq-worker")] {
            std::fs::write(
                dir.join(format!("{name}.ext")),
                format!("subjectAltName={san}\n"),
            )
            .unwrap();
            let mut req = vec!["req"];
            req.extend(ec);
            let (key, csr, pem, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            let subject = format!("/CN={name}");
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            run(&dir, "openssl", &req);
            run(
                &dir,
                "openssl",
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
                    "2",
                    "-extfile",
                    &ext,
                ],
            );
        }
        let (tls_port, plain_port, dist_port) = (free_port(), free_port(), free_port());
        let d = dir.display();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = {plain_port}\nlisteners.ssl.default = {tls_port}\n\
                 ssl_options.cacertfile = {d}/ca.pem\nssl_options.certfile = {d}/server.pem\n\
                 ssl_options.keyfile = {d}/server.key\nssl_options.verify = verify_peer\n\
                 ssl_options.fail_if_no_peer_cert = true\nloopback_users = none\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        let node = format!(
            "fqtls{}@localhost",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let env = format!(
            "HOME={d} RABBITMQ_NODENAME={node} RABBITMQ_DIST_PORT={dist_port} \
             RABBITMQ_MNESIA_BASE={d}/mnesia RABBITMQ_LOG_BASE={d}/log \
             RABBITMQ_CONFIG_FILE={d}/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE={d}/enabled_plugins \
             RABBITMQ_PID_FILE={d}/pid rabbitmq-server -detached"
        );
        // As root, the node runs as the rabbitmq user (it refuses files it cannot own).
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if root {
            run(&dir, "chown", &["-R", "rabbitmq:rabbitmq", &d.to_string()]);
            run(&dir, "su", &["rabbitmq", "-s", "/bin/sh", "-c", &env]);
        } else {
            run(&dir, "sh", &["-c", &env]);
        }
        let mut server = TlsNode {
            dir,
            tls_port,
            plain_port,
            pid: None,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_err() {
            if server.pid.is_none() {
                server.pid = std::fs::read_to_string(server.dir.join("pid"))
                    .ok()
                    .and_then(|p| p.trim().parse().ok());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the private RabbitMQ node did not start: see {}/log",
                server.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server.pid = std::fs::read_to_string(server.dir.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok());
        server
    }

    fn url(&self, host: &str) -> String {
        format!("amqps://guest:guest@{host}:{}/%2f", self.tls_port)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            // Its files go once it has stopped (bounded: a stuck node is killed).
            for _ in 0..100 {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[ferriq::task(name = "amqp.tls.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

async fn refusal(
    url: &str,
    tune: impl FnOnce(ferriq_amqp::AmqpBrokerBuilder) -> ferriq_amqp::AmqpBrokerBuilder,
) -> String {
    let builder = AmqpBroker::builder(url)
        .exchange(common::unique("x"))
        .queues([common::unique("q")])
        .connect_timeout(Duration::from_secs(3));
    match tune(builder).connect().await {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_amqps_with_a_private_ca_and_a_client_certificate_a_task_runs_and_each_refusal_says_what_to_fix(
) {
    let node = TlsNode::start().await;
    let (ca, cert, key) = (
        node.path("ca.pem"),
        node.path("client.pem"),
        node.path("client.key"),
    );
    let (exchange, lane) = (common::unique("x"), common::unique("q"));
    let connect = || {
        AmqpBroker::builder(node.url("localhost"))
            .exchange(exchange.clone())
            .queues([lane.clone()])
            .tls_ca_file(&ca)
            .tls_client_cert(&cert, &key)
            .connect()
    };
    let broker = Arc::new(
        connect()
            .await
            .expect("amqps with the CA and a client certificate"),
    );
    let store = Arc::new(
        ValkeyStore::builder(common::redis_url())
            .prefix(common::unique("p").replace('.', "-"))
            .connect()
            .await
            .unwrap(),
    );
    let worker = ferriq::testing::RunningWorker::spawn(
        ferriq::Worker::builder()
            .broker(Arc::new(connect().await.unwrap()))
            .store(store.clone())
            .registry(
                ferriq::Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME])
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let client = Client::new(broker, store);
    let handle = add::kiq(&client, 2, 3).await.unwrap();
    assert_eq!(handle.wait(Duration::from_secs(30)).await.unwrap(), 5);
    worker.stop().await;
    client.close().await;

    // No client certificate: the node refuses the handshake.
    let bare = refusal(&node.url("localhost"), |b| b.tls_ca_file(&ca)).await;
    assert!(bare.contains("FERRIQ_BROKER_TLS_CERT"), "{bare}");
    // Our CA not given: the system's roots do not know it.
    let untrusted = refusal(&node.url("localhost"), |b| b.tls_client_cert(&cert, &key)).await;
    assert!(untrusted.contains("FERRIQ_BROKER_TLS_CA"), "{untrusted}");
    // The certificate is for localhost, not 127.0.0.1.
    let mismatch = refusal(&node.url("127.0.0.1"), |b| {
        b.tls_ca_file(&ca).tls_client_cert(&cert, &key)
    })
    .await;
    assert!(mismatch.contains("host name"), "{mismatch}");
    // amqps:// to the plain port.
    let plain = format!("amqps://guest:hunter2@localhost:{}/%2f", node.plain_port);
    let not_tls = refusal(&plain, |b| b.tls_ca_file(&ca)).await;
    assert!(
        not_tls.contains("does not speak TLS") || not_tls.contains("TLS port"),
        "{not_tls}"
    );
    assert!(!not_tls.contains("hunter2"), "{not_tls}");
    // Files that are not there, and TLS files with a plain URL.
    let missing = refusal(&node.url("localhost"), |b| {
        b.tls_ca_file("/nonexistent/ca.pem")
    })
    .await;
    assert!(
        missing.contains("FERRIQ_BROKER_TLS_CA") && missing.contains("/nonexistent/ca.pem"),
        "{missing}"
    );
    let plain_url = format!("amqp://guest:guest@localhost:{}/%2f", node.plain_port);
    let wrong_scheme = refusal(&plain_url, |b| b.tls_ca_file(&ca)).await;
    assert!(wrong_scheme.contains("amqps://"), "{wrong_scheme}");
}
