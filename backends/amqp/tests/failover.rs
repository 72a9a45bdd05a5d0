//! Several nodes for one broker: a URL list (`amqp://node-1;amqp://node-2`, Celery's
//! spelling). Connecting goes to the first node that answers; when the node in use dies, the
//! worker and the client reconnect to the next one and every task still gets its result.
//! Nodes are TCP proxies to the shared RabbitMQ that the test takes down.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Proxy, Topology};
use ferriq::Client;

#[ferriq::task(name = "amqp.failover.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

fn target() -> String {
    let url = common::amqp_url();
    let rest = url.split_once('@').map_or(url.as_str(), |(_, r)| r);
    rest.split('/').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_node_in_use_dies_worker_and_client_go_on_with_the_next() {
    let (first, second) = (Proxy::start(&target()).await, Proxy::start(&target()).await);
    let topology = Topology::new();
    let nodes = format!("{};{}", first.url(), second.url());
    let store = Arc::new(common::store(&common::unique("p").replace('.', "-")).await);
    let worker = ferriq::testing::RunningWorker::spawn(
        ferriq::Worker::builder()
            .broker(Arc::new(topology.builder(&nodes).connect().await.unwrap()))
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
    let client = Client::new(
        Arc::new(topology.builder(&nodes).connect().await.unwrap()),
        store,
    );
    let before = add::kiq(&client, 1, 1).await.unwrap();
    assert_eq!(before.wait(Duration::from_secs(30)).await.unwrap(), 2);
    assert!(
        first.live() > 0 && second.live() == 0,
        "the first node serves first"
    );

    // The first node dies: its connections drop and it refuses new ones.
    first.down();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut sent = Vec::new();
    while sent.len() < 10 {
        match add::kiq(&client, sent.len() as i64, 1).await {
            Ok(handle) => sent.push(handle),
            // While reconnecting an enqueue fails, saying so; the caller retries.
            Err(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the client never reconnected"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for (i, h) in sent.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(30)).await.unwrap(), i as i64 + 1);
    }
    assert!(
        second.live() >= 2,
        "worker and client went to the second node"
    );
    worker.stop().await;
    client.close().await;
}

#[tokio::test]
async fn connecting_skips_a_node_that_is_down_and_names_each_when_none_answers() {
    let (down, up) = (Proxy::start(&target()).await, Proxy::start(&target()).await);
    down.down();
    let topology = Topology::new();
    let broker = topology
        .builder(&format!("{};{}", down.url(), up.url()))
        .connect()
        .await
        .expect("the second node answers");
    drop(broker);
    up.down();
    let secret = format!(
        "{};{}",
        down.url().replace("guest:guest", "guest:hunter2"),
        up.url().replace("guest:guest", "guest:hunter2")
    );
    let refused = topology
        .builder(&secret)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(!refused.contains("hunter2"), "{refused}");
    for proxy in [&down, &up] {
        assert!(
            refused.contains(&format!("127.0.0.1:{}", proxy.port)),
            "{refused}"
        );
    }
}
