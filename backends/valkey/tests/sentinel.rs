//! The store through Redis Sentinel, on servers of the test's own: a primary, a replica and one
//! sentinel. The primary is killed; the sentinel promotes the replica and the store follows
//! it by itself.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferriq::store::{ClaimOutcome, ClaimStore, CompleteOutcome, ResultStatus, ResultStore, Token};
use ferriq::wire::{TaskId, TaskResult};
use serde_json::json;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(30);

/// Servers started by the test, killed (and their files removed) when dropped.
struct Servers {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Servers {
    fn start(&mut self, name: &str, args: &[&str]) -> Child {
        Command::new("redis-server")
            .args(args)
            .args(["--logfile", &format!("{name}.log")])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed")
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("sentinel test files kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Waits until the server just started answers; it must still be running (otherwise the port
/// answers for someone else).
async fn answers(servers: &mut Servers, port: u16) {
    let child = servers.children.last_mut().expect("a server was started");
    common::eventually(Duration::from_secs(10), || {
        let exited = child.try_wait().unwrap();
        assert!(exited.is_none(), "the server on {port} exited: {exited:?}");
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("timeout")
        .args(["5", "redis-cli", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn write_sentinel_conf(dir: &Path, port: u16, primary: u16) -> PathBuf {
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\n\
             sentinel monitor fqprimary 127.0.0.1 {primary} 1\n\
             sentinel down-after-milliseconds fqprimary 500\n\
             sentinel failover-timeout fqprimary 5000\n"
        ),
    )
    .unwrap();
    conf
}

async fn claim(store: &ferriq_valkey::ValkeyStore, id: &TaskId) -> Result<Token, String> {
    match store.claim(id, "w", LEASE, None).await {
        Ok(ClaimOutcome::Run { token, .. }) => Ok(token),
        other => Err(format!("{other:?}")),
    }
}

fn ok(v: serde_json::Value) -> TaskResult {
    TaskResult::success(v, 0.0, Default::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_sentinel_failover() {
    let dir = std::env::temp_dir().join(format!("fq-sentinel-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut servers = Servers {
        children: Vec::new(),
        dir: dir.clone(),
    };
    let (primary, replica, sentinel) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let plain = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    let p = servers.start(
        "primary",
        &[&["--port", &primary.to_string()], &plain[..]].concat(),
    );
    servers.children.push(p);
    answers(&mut servers, primary).await;
    let primary_at = primary.to_string();
    let r = servers.start(
        "replica",
        &[
            &["--port", &replica.to_string()],
            &plain[..],
            &["--replicaof", "127.0.0.1", &primary_at],
        ]
        .concat(),
    );
    servers.children.push(r);
    answers(&mut servers, replica).await;
    let conf = write_sentinel_conf(&dir, sentinel, primary);
    let s = servers.start("sentinel", &[conf.to_str().unwrap(), "--sentinel"]);
    servers.children.push(s);
    answers(&mut servers, sentinel).await;
    // The sentinel knows the replica before the primary goes away.
    common::eventually(Duration::from_secs(30), || {
        redis_cli(sentinel, &["sentinel", "replicas", "fqprimary"]).contains(&replica.to_string())
    })
    .await;

    let url = format!("redis-sentinel://127.0.0.1:{sentinel}?sentinelServiceName=fqprimary");
    let store = common::store_at(&url, &common::prefix(), |b| {
        b.command_timeout(Duration::from_millis(500))
    })
    .await;

    let before = TaskId::random();
    let token_before = claim(&store, &before).await.unwrap();
    assert_eq!(
        store
            .complete(&before, token_before, Some(&ok(json!("before"))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    // The replica has it before the primary dies (replication is asynchronous).
    common::eventually(Duration::from_secs(10), || {
        redis_cli(replica, &["exists", &store.result_key(&before)]).trim() == "1"
    })
    .await;

    servers.children[0].kill().unwrap(); // SIGKILL the primary
    let _ = servers.children[0].wait();

    // Calls fail fast while there is no primary, then succeed on the promoted replica.
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = TaskId::random();
    let token_after = loop {
        let started = Instant::now();
        match claim(&store, &after).await {
            Ok(token) => break token,
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "a call during the failover hung: {e}"
                );
                assert!(Instant::now() < deadline, "no failover within 60 s: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(
        redis_cli(replica, &["role"]).starts_with("master"),
        "the store claimed somewhere other than the promoted replica"
    );
    // Tokens follow server time: the promoted replica's are past the old primary's.
    assert!(token_after > token_before);
    assert_eq!(
        store
            .complete(&after, token_after, Some(&ok(json!("after"))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    for (id, value) in [(&before, "before"), (&after, "after")] {
        match store.wait(id, Duration::from_secs(5)).await.unwrap() {
            ResultStatus::Ready(r) => assert_eq!(r.return_value, json!(value)),
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(
        store.claim(&before, "late", LEASE, None).await.unwrap(),
        ClaimOutcome::Done
    ));
    store.close().await;
}
