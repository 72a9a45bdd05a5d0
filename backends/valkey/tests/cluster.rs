//! The store against a Valkey Cluster of the test's own (three masters on free ports): tasks
//! spread over every master, each script inside one slot, heartbeats split by slot, completions
//! announced across nodes, and the worker end to end.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::ok;
use ferriq::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, ResultStatus, ResultStore, Token,
};
use ferriq::wire::{ErrorKind, TaskId, TaskResult};
use ferriq::{Client, TaskError};
use fred::prelude::ClientLike;
use serde_json::json;

const LEASE: Duration = Duration::from_secs(30);

#[ferriq::task(name = "valkey.cluster.double")]
async fn double(n: u64) -> Result<u64, TaskError> {
    Ok(n * 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_results_and_announcements_work_across_a_cluster() {
    let cluster = common::cluster::PrivateCluster::start(3).await;
    let prefix = common::prefix();
    let store = Arc::new(common::store_at(&cluster.url(), &prefix, |b| b).await);

    // Enough tasks that every master owns some (redis-cli gives the three masters the slots
    // 0-5460, 5461-10922 and 10923-16383).
    let ids: Vec<TaskId> = (0..90).map(|_| TaskId::random()).collect();
    let thirds: HashSet<u8> = ids
        .iter()
        .map(
            |id| match fred::util::redis_keyslot(store.result_key(id).as_bytes()) {
                0..=5460 => 0,
                5461..=10922 => 1,
                _ => 2,
            },
        )
        .collect();
    assert_eq!(thirds.len(), 3, "the tasks do not cover every master");

    let mut tokens = Vec::new();
    for id in &ids {
        match store.claim(id, "w", LEASE, None).await.unwrap() {
            ClaimOutcome::Run { token, .. } => tokens.push(token),
            other => panic!("{other:?}"),
        }
    }
    // A second delivery of a running task is deferred, on whichever node holds it.
    assert!(matches!(
        store.claim(&ids[1], "other", LEASE, None).await.unwrap(),
        ClaimOutcome::Defer { .. }
    ));

    // One heartbeat call for claims on every master; one stale token among them.
    let mut beats: Vec<(TaskId, Token)> = ids.iter().cloned().zip(tokens.iter().copied()).collect();
    beats[0].1 = Token(tokens[0].0 - 1);
    let kept = store.heartbeat(&beats, LEASE).await.unwrap();
    assert_eq!(kept[0], ClaimLease::Lost);
    assert!(kept[1..].iter().all(|k| *k == ClaimLease::Kept), "{kept:?}");

    // Announcements reach a subscriber on one node whichever node ran the script.
    let channel = format!("{prefix}:reply:cluster-test");
    let (listener, mut messages) =
        common::listen(&format!("redis://127.0.0.1:{}", cluster.ports[0]), &channel).await;

    let completes: Vec<_> = ids
        .iter()
        .zip(&tokens)
        .map(|(id, token)| {
            let (store, id, token, channel) = (store.clone(), id.clone(), *token, channel.clone());
            tokio::spawn(async move {
                store
                    .complete(&id, token, Some(&ok(json!(id.as_str()))), Some(&channel))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for c in completes {
        assert_eq!(c.await.unwrap(), CompleteOutcome::Stored);
    }
    let mut announced = HashSet::new();
    while announced.len() < ids.len() {
        let Ok(msg) = tokio::time::timeout(Duration::from_secs(10), messages.recv()).await else {
            let missing: Vec<u16> = ids
                .iter()
                .filter(|id| !announced.contains(id.as_str()))
                .map(|id| fred::util::redis_keyslot(store.result_key(id).as_bytes()))
                .collect();
            panic!(
                "{} of {} completions announced; slots of the missing: {missing:?}",
                announced.len(),
                ids.len()
            );
        };
        let msg = msg.unwrap();
        for id in msg.value.as_string().unwrap().split(' ') {
            assert!(announced.insert(id.to_owned()), "{id} announced twice");
        }
    }

    for id in &ids {
        assert!(matches!(
            store.claim(id, "late", LEASE, None).await.unwrap(),
            ClaimOutcome::Done
        ));
        match store.wait(id, Duration::from_secs(5)).await.unwrap() {
            ResultStatus::Ready(r) => assert_eq!(r.return_value, json!(id.as_str())),
            other => panic!("{other:?}"),
        }
    }

    // Revoke and its fencing on a cluster.
    let fresh = TaskId::random();
    let ClaimOutcome::Run { token, .. } = store.claim(&fresh, "w", LEASE, None).await.unwrap()
    else {
        panic!("fresh task not runnable")
    };
    assert!(store
        .revoke(
            &fresh,
            &TaskResult::failure(
                ErrorKind::Cancelled,
                "revoked in test",
                false,
                0,
                0.0,
                Default::default(),
            )
        )
        .await
        .unwrap());
    assert_eq!(
        store
            .heartbeat(&[(fresh.clone(), token)], LEASE)
            .await
            .unwrap(),
        [ClaimLease::Revoked]
    );
    assert!(matches!(
        store.claim(&fresh, "w", LEASE, None).await.unwrap(),
        ClaimOutcome::Revoked
    ));

    // The dead-letter index: every key of a lane under one hash tag, so each script and the
    // clear's DEL stay on one node; two lanes land where their tags put them.
    use ferriq::dead_letters::DeadFilter;
    use ferriq::store::{DeadEntry, OpsStore};
    for lane in ["cl.a", "cl.b"] {
        let entries: Vec<DeadEntry> = (0..30u64)
            .map(|i| {
                let body = format!(r#"{{"task_id":"{}","task_name":"t{}","args":[{i}],"kwargs":{{}},"labels":{{}}}}"#, TaskId::random(), i % 3);
                DeadEntry::new(lane, None, body.as_bytes())
                    .reason(if i % 2 == 0 { "retries_exhausted" } else { "expired" })
                    .detail(&format!("boom {i}"))
                    .dead_at_ms(1_000 + i)
            })
            .collect();
        store.index_dead(&entries).await.unwrap();
        let filter = DeadFilter::all()
            .task_name("t1")
            .reason("expired")
            .detail_contains("BOOM");
        let page = store
            .dead_index(lane, &filter, 10_000, 0, 50)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((page.total, page.indexed), (5, 30), "{lane}");
        store
            .unindex_dead(lane, &[entries[1].key.clone(), entries[2].key.clone()])
            .await
            .unwrap();
        let all = store
            .dead_index(lane, &DeadFilter::all(), 10_000, 0, 50)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(all.total, 28);
        store.clear_dead_index(lane).await.unwrap();
        let all = store
            .dead_index(lane, &DeadFilter::all(), 10_000, 0, 50)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((all.total, all.indexed), (0, 0));
    }
    listener.quit().await.unwrap();
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_with_claims_and_results_in_a_cluster() {
    let cluster = common::cluster::PrivateCluster::start(3).await;
    let store = Arc::new(common::store_at(&cluster.url(), &common::prefix(), |b| b).await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let worker = common::spawn_worker(broker.clone(), store.clone(), &[double::NAME]);
    let client = Client::new(broker, store.clone());
    let mut handles = Vec::new();
    for n in 0..60u64 {
        handles.push((n, double::kiq(&client, n).await.unwrap()));
    }
    for (n, handle) in handles {
        assert_eq!(handle.wait(Duration::from_secs(30)).await.unwrap(), n * 2);
    }
    worker.stop().await;
    store.close().await;
}

/// The Streams broker on the cluster: the conformance kit's broker suite, each check on a
/// stream of its own (spread over the masters by name), and a lane's keys in its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_broker_keeps_the_broker_contract_on_a_cluster() {
    let cluster = common::cluster::PrivateCluster::start(3).await;
    let url = cluster.url();
    ferriq::testing::conformance::broker_suite(|| {
        let url = url.clone();
        async move {
            let queue = format!("{}.q", common::prefix());
            Arc::new(
                ferriq_valkey::StreamBroker::builder(url)
                    .queues([queue])
                    .allow_volatile(true)
                    .connect()
                    .await
                    .expect("the Streams broker on the cluster"),
            ) as Arc<dyn ferriq::broker::Broker>
        }
    })
    .await;
}

/// The Streams broker through a cluster failover: the master serving the lane's slot is
/// SIGKILLed, its replica takes over the slot, and the broker follows (the scenario in
/// `common::failover`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_broker_follows_a_cluster_failover() {
    let mut cluster = common::cluster::PrivateCluster::start_with_replicas(3).await;
    let url = cluster.url();
    let queue = format!("{}.failover", common::prefix());
    let asked = cluster.ports[0];
    let (master, replica) = cluster.master_and_replica_of(&queue, asked);
    let replica = replica.expect("the lane's master has a replica");
    common::failover::streams_broker_follows(
        &url,
        &queue,
        // Replication is asynchronous: what the replica lacks at the kill is the server's
        // loss, not the broker's.
        || common::replicated(master),
        || cluster.kill(master),
        || common::redis_cli(replica, &["role"]).starts_with("master"),
    )
    .await;
}

/// On a cluster, the durability check asks the node that serves each lane — not any node:
/// nodes may be set up apart, and only the lane's node can lose its tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_broker_checks_the_node_serving_each_lane() {
    let cluster = common::cluster::PrivateCluster::start(3).await;
    let queue = format!("{}.durable", common::prefix());
    let (serving, _) = cluster.master_and_replica_of(&queue, cluster.ports[0]);
    // Every node keeps its data but the lane's.
    for port in cluster.ports.iter().filter(|p| **p != serving) {
        common::redis_cli(*port, &["CONFIG", "SET", "appendonly", "yes"]);
    }
    let connect = || {
        ferriq_valkey::StreamBroker::builder(cluster.url())
            .queues([queue.clone()])
            .connect()
    };
    match connect().await {
        Err(e @ ferriq_valkey::ValkeyError::NotDurable { .. }) => {
            assert!(e.to_string().contains(&queue), "{e}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a lane on a node without appendonly was taken"),
    }
    common::redis_cli(serving, &["CONFIG", "SET", "appendonly", "yes"]);
    let broker = connect()
        .await
        .expect("every node serving a lane keeps its data now");
    ferriq::broker::Broker::close(&broker).await;
}
