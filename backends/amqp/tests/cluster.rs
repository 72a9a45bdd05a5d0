//! A real three-node RabbitMQ cluster of the test's own (quorum queues): the lane's quorum
//! leader node is SIGKILLed while tasks run, with the workers' and client's URLs listing every
//! node. Nothing is lost (every task's result comes back) and the workers go on with another
//! node. (The fault harness counts writes from outside; here the store's fencing refuses any
//! second write.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::node::PrivateCluster;
use ferriq::Client;

#[ferriq::task(name = "amqp.cluster.work")]
async fn work(n: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(20)).await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quorum_leader_node_sigkilled_loses_nothing_and_writes_nothing_twice() {
    let cluster = PrivateCluster::start().await;
    let (exchange, lane) = (common::unique("x"), common::unique("q"));
    let connect = |first: usize| {
        // Each process lists every node, starting with a different one.
        let mut urls: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| n.plain_url("guest", "guest"))
            .collect();
        urls.rotate_left(first);
        ferriq_amqp::AmqpBroker::builder(urls.join(";").as_str())
            .exchange(exchange.as_str())
            .queues([lane.as_str()])
            .connect()
    };
    let prefix = common::unique("p").replace('.', "-");
    let store = Arc::new(common::store(&prefix).await);
    let mut running = Vec::new();
    for i in 0..3 {
        running.push(ferriq::testing::RunningWorker::spawn(
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
    let handles = client
        .enqueue_batch((0..600).map(work::call))
        .await
        .unwrap();
    // The lane's quorum leader, as the cluster reports it.
    let listed =
        cluster.nodes[0].ctl_output(&["list_queues", "-q", "--no-table-headers", "name", "leader"]);
    let leader = listed
        .lines()
        .find(|l| l.split_whitespace().next() == Some(lane.as_str()))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no leader listed for {lane}: {listed}"))
        .to_owned();
    let victim = cluster
        .nodes
        .iter()
        .find(|n| n.name() == leader)
        .expect("the leader is one of ours");
    // Mid-run: some results written, most not.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while handles[100]
        .status()
        .await
        .map(|s| format!("{s:?}"))
        .unwrap_or_default()
        .contains("Pending")
    {
        assert!(tokio::time::Instant::now() < deadline, "nothing ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = victim.pid().expect("its pid").to_string();
    assert!(std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap()
        .success());
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(
            h.wait(Duration::from_secs(120)).await.unwrap(),
            i as u64,
            "task {i}"
        );
    }
    for w in running {
        w.stop().await;
    }
}
