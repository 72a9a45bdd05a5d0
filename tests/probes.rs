//! The worker's HTTP probes: liveness, readiness and Prometheus metrics.

mod common;

use std::time::Duration;

use common::{HangingBroker, Hangs};

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

/// A worker serving `probes.double` on `broker` and `store`, not running, with its probes
/// served on a free port.
async fn probed_worker(
    broker: std::sync::Arc<dyn ferriq::broker::Broker>,
    store: std::sync::Arc<dyn ferriq::store::Store>,
) -> (ferriq::Worker, ferriq::worker::ProbeServer) {
    let worker = ferriq::Worker::builder()
        .broker(broker)
        .store(store)
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
    (worker, probes)
}

#[tokio::test]
async fn readiness_fails_while_the_store_is_unreachable() {
    let env = TestEnv::new();
    let store = ferriq::testing::FaultyStore::new(env.store.clone());
    let (_worker, probes) = probed_worker(
        std::sync::Arc::new(env.broker.clone()),
        std::sync::Arc::new(store.clone()),
    )
    .await;
    let addr = probes.local_addr();
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    store.set_failing(ferriq::testing::StoreOp::Claim, true);
    let answer = get(addr, "/readyz").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("store"), "{answer}");
    store.set_failing(ferriq::testing::StoreOp::Claim, false);
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
}

#[ferriq::task(name = "probes.flaky", max_attempts = 3, backoff_initial = 0.01)]
async fn flaky(ctx: ferriq::TaskContext) -> Result<u32, ferriq::TaskError> {
    if ctx.attempt() < 3 {
        return Err(ferriq::TaskError::retryable("not yet"));
    }
    Ok(ctx.attempt())
}

#[ferriq::task(name = "probes.held")]
async fn held(gate: ferriq::State<std::sync::Arc<tokio::sync::Semaphore>>) -> u32 {
    let _ = gate.acquire().await;
    1
}

/// The series added for operators: queue wait, attempts, results written, claims deferred and
/// taken over, the concurrency limit beside the runs in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_queue_wait_attempts_results_and_claims_by_task() {
    use ferriq::broker::{Broker, OutgoingMessage};
    let env = TestEnv::new();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let mut config = ferriq::WorkerConfig::default();
    config.min_defer = Duration::from_millis(10);
    let running = env.spawn_worker(
        env.worker()
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[double::NAME, flaky::NAME, held::NAME])
                    .unwrap(),
            )
            .state(gate.clone())
            .config(config)
            .concurrency(7),
    );
    let probes = running
        .worker
        .serve_probes("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let wait = Duration::from_secs(10);
    env.client
        .enqueue(double::call(1))
        .await
        .unwrap()
        .wait(wait)
        .await
        .unwrap();
    assert_eq!(
        env.client
            .enqueue(flaky::call())
            .await
            .unwrap()
            .wait(wait)
            .await
            .unwrap(),
        3
    );

    // A held run; a copy of its message is deferred (a live claim); then its lease is ended
    // and another copy takes it over.
    let msg = held::call().into_message().unwrap();
    let id = msg.task_id.clone();
    let publish = || async {
        env.broker
            .publish(vec![OutgoingMessage::from_message(&msg).unwrap()])
            .await
            .unwrap()
    };
    publish().await;
    let deadline = tokio::time::Instant::now() + wait;
    while running.worker.stats().in_flight == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    publish().await;
    while running
        .worker
        .stats()
        .count(ferriq::worker::Outcome::Deferred)
        == 0
    {
        assert!(tokio::time::Instant::now() < deadline, "never deferred");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(env.store.expire_lease(&id));
    publish().await;
    while running.worker.stats().in_flight < 2 {
        assert!(tokio::time::Instant::now() < deadline, "never taken over");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let metrics = get(probes.local_addr(), "/metrics").await;
    gate.add_permits(10);
    for line in [
        "# TYPE ferriq_queue_wait_seconds histogram",
        "ferriq_queue_wait_seconds_count{task=\"probes.double\"} 1",
        "ferriq_queue_wait_seconds_count{task=\"probes.flaky\"} 3",
        "# TYPE ferriq_task_attempts histogram",
        "ferriq_task_attempts_bucket{task=\"probes.flaky\",le=\"2\"} 0",
        "ferriq_task_attempts_bucket{task=\"probes.flaky\",le=\"3\"} 1",
        "ferriq_task_attempts_sum{task=\"probes.flaky\"} 3",
        "ferriq_task_attempts_count{task=\"probes.double\"} 1",
        "ferriq_results_written_total{task=\"probes.double\",status=\"succeeded\"} 1",
        "ferriq_results_written_total{task=\"probes.flaky\",status=\"succeeded\"} 1",
        "ferriq_results_written_total{task=\"probes.flaky\",status=\"failed\"} 0",
        "ferriq_claims_total{task=\"probes.held\",outcome=\"deferred\"} 1",
        "ferriq_claims_total{task=\"probes.held\",outcome=\"taken_over\"} 1",
        "ferriq_runs_in_flight 2",
        "ferriq_concurrency_limit 7",
    ] {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }
    // The queue wait of a task sent a moment ago is short.
    let fast = metrics
        .lines()
        .find(|l| {
            l.starts_with("ferriq_queue_wait_seconds_bucket{task=\"probes.double\",le=\"1\"}")
        })
        .unwrap();
    assert!(fast.ends_with(" 1"), "{fast}");
    running.stop().await;
    drop(probes);
}

/// `probe_addr` (`FERRIQ_PROBE_ADDR`) is served by `Worker::run` itself, not only by
/// `run_until_signal`, and stops with it.
#[tokio::test]
async fn a_configured_probe_address_is_served_while_the_worker_runs() {
    let env = TestEnv::new();
    // A free port: bound, read, released (nothing else on this machine takes it meanwhile).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let running = env.spawn_worker(
        env.worker()
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[double::NAME])
                    .unwrap(),
            )
            .probe_addr(addr),
    );
    // Bounded polling: the server starts as the run does.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
            stream
                .write_all(b"GET /livez HTTP/1.1\r\nhost: test\r\n\r\n")
                .await
                .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the configured probe address was never served"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;
    // The server's task is aborted as the run returns: its listener closes soon after.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the probes outlived the worker"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A probe address that cannot be bound stops the worker at `build`, naming the setting,
/// instead of a worker running without the probes its orchestrator checks.
#[test]
fn a_taken_probe_address_is_refused_when_the_worker_is_built() {
    let env = TestEnv::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = env
        .worker()
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[double::NAME])
                .unwrap(),
        )
        .probe_addr(addr)
        .build()
        .expect_err("the port is taken");
    assert!(
        matches!(err, ferriq::worker::BuildError::Probes { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("FERRIQ_PROBE_ADDR") && text.contains(&addr.to_string()),
        "{text}"
    );
}

#[tokio::test]
async fn metrics_answer_while_the_broker_does_not() {
    let env = TestEnv::new();
    let (_worker, probes) = probed_worker(
        std::sync::Arc::new(HangingBroker {
            inner: env.broker.clone(),
            hangs: Hangs {
                depth: true,
                ..Default::default()
            },
        }),
        std::sync::Arc::new(env.store.clone()),
    )
    .await;
    let asked = tokio::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        get(probes.local_addr(), "/metrics"),
    )
    .await
    .expect("metrics within Prometheus's default scrape timeout");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("ferriq_runs_in_flight"), "{answer}");
    assert!(!answer.contains("ferriq_queue_messages"), "{answer}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
}
