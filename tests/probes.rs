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
    assert!(
        metrics.contains("ferriq_deliveries_total{outcome=\"succeeded\"} 3"),
        "{metrics}"
    );
    assert!(metrics.contains("ferriq_runs_started_total 3"), "{metrics}");
    assert!(metrics.contains("ferriq_run_seconds_count 3"), "{metrics}");
    assert!(
        metrics.contains("ferriq_run_seconds_bucket{le=\"+Inf\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ferriq_queue_messages{state=\"delayed\"} 2"),
        "{metrics}"
    );
    running.stop().await;
    drop(probes);
}
