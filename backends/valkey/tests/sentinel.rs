//! The store through Redis Sentinel, on servers of the test's own: a primary, a replica and one
//! sentinel. The primary is killed; the sentinel promotes the replica and the store follows
//! it by itself.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{ok, redis_cli, run_claim, ServerGroup};
use ferriq::store::{ClaimOutcome, ClaimStore, CompleteOutcome, ResultStatus, ResultStore};
use ferriq::wire::TaskId;
use serde_json::json;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(30);

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

/// A primary, its replica and one sentinel watching them, started and known to each other:
/// the servers and their ports (primary, replica, sentinel).
async fn sentinel_group() -> (ServerGroup, u16, u16, u16) {
    let mut servers = ServerGroup::new("sentinel");
    let (primary, replica, sentinel) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let (primary_at, replica_at) = (primary.to_string(), replica.to_string());
    let plain = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    servers
        .start(
            "primary",
            primary,
            &[&["--port", &primary_at][..], &plain].concat(),
        )
        .await;
    let replica_args = [
        &["--port", &replica_at][..],
        &plain,
        &["--replicaof", "127.0.0.1", &primary_at],
    ];
    servers
        .start("replica", replica, &replica_args.concat())
        .await;
    let conf = write_sentinel_conf(&servers.dir, sentinel, primary);
    servers
        .start(
            "sentinel",
            sentinel,
            &[conf.to_str().unwrap(), "--sentinel"],
        )
        .await;
    // The sentinel knows the replica before the primary goes away.
    common::eventually(Duration::from_secs(30), || {
        redis_cli(sentinel, &["sentinel", "replicas", "fqprimary"]).contains(&replica.to_string())
    })
    .await;
    (servers, primary, replica, sentinel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_sentinel_failover() {
    let (mut servers, _primary, replica, sentinel) = sentinel_group().await;

    let url = format!("redis-sentinel://127.0.0.1:{sentinel}?sentinelServiceName=fqprimary");
    let store = common::store_at(&url, &common::prefix(), |b| {
        b.command_timeout(Duration::from_millis(500))
    })
    .await;

    let before = TaskId::random();
    let token_before = run_claim(&store, &before).await.unwrap();
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

    servers.kill(0); // SIGKILL the primary

    // Calls fail fast while there is no primary, then succeed on the promoted replica.
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = TaskId::random();
    let token_after = loop {
        let started = Instant::now();
        match run_claim(&store, &after).await {
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

/// The Streams broker through Sentinel (the scenario in `common::failover`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_broker_follows_a_sentinel_failover() {
    let (mut servers, primary, replica, sentinel) = sentinel_group().await;
    let url = format!("redis-sentinel://127.0.0.1:{sentinel}?sentinelServiceName=fqprimary");
    common::failover::streams_broker_follows(
        &url,
        &format!("{}.failover", common::prefix()),
        // Replication is asynchronous: what the replica lacks at the kill is the server's
        // loss, not the broker's.
        || common::replicated(primary),
        || servers.kill(0),
        || redis_cli(replica, &["role"]).starts_with("master"),
    )
    .await;
}
