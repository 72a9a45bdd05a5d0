//! The worker's HTTP probes: liveness, readiness and Prometheus metrics.

use std::time::Duration;

use ferriq::testing::TestEnv;
use ferriq::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[ferriq::task(name = "probes.double")]
async fn double(x: i64) -> i64 {
    x * 2
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn probes_report_liveness_readiness_and_metrics() {
    let env = TestEnv::new();
    let running = env.spawn_worker(
        env.worker().registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[double::NAME])
                .unwrap(),
        ),
    );
    let probes = running
        .worker
        .serve_probes("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let handles = env
        .client
        .enqueue_batch((0..3).map(double::call))
        .await
        .unwrap();
    for h in handles {
        h.wait(Duration::from_secs(10)).await.unwrap();
    }
    // A task this worker does not serve counts under `_other`, never under its own name.
    let stranger = ferriq::wire::TaskMessage::new("probes.not_served");
    env.client.enqueue_message(stranger).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while running
        .worker
        .stats()
        .count(ferriq::worker::Outcome::Released)
        == 0
    {
        assert!(tokio::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Two more waiting, for the depth gauge, enqueued with a delay so nothing runs them yet.
    env.client
        .enqueue_batch((0..2).map(|i| double::call(i).with_delay(Duration::from_secs(3600))))
        .await
        .unwrap();
    let addr = probes.local_addr();
    assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    assert!(get(addr, "/nothing").await.starts_with("HTTP/1.1 404"));
    let metrics = get(addr, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    // Per task, bounded by the registry's names (before: no task label at all).
    for line in [
        "ferriq_deliveries_total{task=\"probes.double\",outcome=\"succeeded\"} 3",
        "ferriq_runs_started_total{task=\"probes.double\"} 3",
        "ferriq_run_seconds_count{task=\"probes.double\"} 3",
        "ferriq_run_seconds_bucket{task=\"probes.double\",le=\"+Inf\"} 3",
        "ferriq_deliveries_total{task=\"_other\",outcome=\"released\"} 1",
    ] {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }
    // The two delayed ones and the unserved one, released for another lane.
    assert!(
        metrics.contains("ferriq_queue_messages{state=\"delayed\"} 3"),
        "{metrics}"
    );
    running.stop().await;
    drop(probes);
}

#[tokio::test]
async fn readiness_fails_while_the_store_is_unreachable() {
    let env = TestEnv::new();
    let store = ferriq::testing::FaultyStore::new(env.store.clone());
    let worker = ferriq::Worker::builder()
        .broker(std::sync::Arc::new(env.broker.clone()))
        .store(std::sync::Arc::new(store.clone()))
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[double::NAME])
                .unwrap(),
        )
        .build()
        .unwrap();
    let probes = worker
        .serve_probes("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = probes.local_addr();
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    store.set_failing(ferriq::testing::StoreOp::Claim, true);
    let answer = get(addr, "/readyz").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("store"), "{answer}");
    store.set_failing(ferriq::testing::StoreOp::Claim, false);
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
}
