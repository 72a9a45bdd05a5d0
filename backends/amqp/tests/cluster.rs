//! A real three-node RabbitMQ cluster of the test's own (quorum queues), each node behind a
//! proxy the test controls, with the workers' and client's URLs listing every node (each
//! starting with another). While tasks run, the lane's quorum leader is first partitioned away
//! from its clients (its proxy blackholed: connections open and silent), then SIGKILLed.
//! Nothing is lost — every task's result comes back — and the workers go on with other nodes.
//! (The fault harness counts writes from outside; here the store's fencing refuses any second
//! write.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::node::PrivateCluster;
use common::Proxy;
use ferriq::Client;
use tokio::time::Instant;

#[ferriq::task(name = "amqp.cluster.work")]
async fn work(n: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(100)).await;
    n
}

/// The node leading `lane`'s quorum queue, as the cluster lists it.
fn leader(cluster: &PrivateCluster, lane: &str) -> usize {
    for node in &cluster.nodes {
        let listed =
            node.ctl_output(&["list_queues", "-q", "--no-table-headers", "name", "leader"]);
        if let Some(name) = listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(lane))
            .and_then(|l| l.split_whitespace().nth(1))
        {
            if let Some(i) = cluster.nodes.iter().position(|n| n.name() == name) {
                return i;
            }
        }
    }
    panic!("no node lists a leader for {lane}")
}

/// Enqueues `n` tasks, waits until some have run, injects `fault`, and waits for every
/// result; how long after the fault the last one came.
async fn through_a_fault(client: &Client, n: u64, fault: impl FnOnce()) -> Duration {
    let handles = client.enqueue_batch((0..n).map(work::call)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while format!("{:?}", handles[n as usize / 6].status().await).contains("Pending") {
        assert!(Instant::now() < deadline, "nothing ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fault();
    let at = Instant::now();
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(
            h.wait(Duration::from_secs(180)).await.unwrap(),
            i as u64,
            "task {i}"
        );
    }
    at.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quorum_leader_partitioned_then_killed_loses_nothing() {
    let cluster = PrivateCluster::start().await;
    let mut proxies = Vec::new();
    for node in &cluster.nodes {
        proxies.push(Proxy::start(&format!("127.0.0.1:{}", node.plain_port)).await);
    }
    let (exchange, lane) = (common::unique("x"), common::unique("q"));
    let connect = |first: usize| {
        let mut urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        urls.rotate_left(first);
        ferriq_amqp::AmqpBroker::builder(urls.join(";").as_str())
            .exchange(exchange.as_str())
            .queues([lane.as_str()])
            .connect()
    };
    let store = Arc::new(common::store(&common::unique("p").replace('.', "-")).await);
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(ferriq::testing::RunningWorker::spawn(
            ferriq::Worker::builder()
                .broker(Arc::new(connect(i).await.expect("a worker connects")))
                .store(store.clone())
                .registry(
                    ferriq::Registry::from_inventory()
                        .unwrap()
                        .only(&[work::NAME])
                        .unwrap(),
                )
                .concurrency(8)
                .build()
                .unwrap(),
        ));
    }
    let client = Client::new(Arc::new(connect(1).await.unwrap()), store.clone());

    // The leader cut off from its clients (not from its peers): its connections go silent;
    // heartbeats tell both sides, and the workers on it go to the next node.
    let partitioned = leader(&cluster, &lane);
    let others = |proxies: &[Proxy]| -> usize {
        (0..3)
            .filter(|i| *i != partitioned)
            .map(|i| proxies[i].live())
            .sum()
    };
    let before = others(&proxies);
    let took = through_a_fault(&client, 600, || {
        assert!(
            proxies[partitioned].blackhole() > 0,
            "nothing was connected to the leader"
        );
    })
    .await;
    eprintln!("partitioned leader: every result {took:?} after the partition");
    // The processes that were on it reconnected to another node (heartbeats tell them).
    let waiting = Instant::now();
    while others(&proxies) <= before {
        assert!(
            waiting.elapsed() < Duration::from_secs(60),
            "nothing moved off the partitioned node"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "partitioned leader: its clients on other nodes {:?} later",
        waiting.elapsed()
    );

    // The leader (the same node, or the one elected since) SIGKILLed.
    let killed = leader(&cluster, &lane);
    let pid = cluster.nodes[killed].pid().expect("its pid").to_string();
    let took = through_a_fault(&client, 600, || {
        let status = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
        assert!(status.unwrap().success());
    })
    .await;
    eprintln!("killed leader: every result {took:?} after the kill");
    for w in workers {
        w.stop().await;
    }
    client.close().await;
}
