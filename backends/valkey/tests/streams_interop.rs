//! Python taskiq and ferriq share a Redis stream: a taskiq-redis `RedisStreamBroker`
//! producer's task runs on a ferriq worker (Python reads the result with taskiq-redis), and a
//! ferriq client's task runs on a Python `RedisStreamBroker` worker. The Python side is the
//! venv scripts/test.sh sets up.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, Worker};
use ferriq_testkit::services::python;

#[ferriq::task(name = "interop.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

/// `interop.py_mul` runs in Python; this declaration gives the ferriq client its types.
#[ferriq::task(name = "interop.py_mul")]
async fn py_mul(a: i64, b: i64) -> i64 {
    a * b
}

/// Kills a whole process group when dropped (also when the test panics).
struct KillGroup(u32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .status();
    }
}

fn interop_env(cmd: &mut tokio::process::Command, queue: &str, prefix: &str) {
    cmd.current_dir(std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop"))
        .env("INTEROP_REDIS_URL", common::url())
        .env("INTEROP_QUEUE", queue)
        .env("INTEROP_PREFIX", prefix)
        .env("PYTHONDONTWRITEBYTECODE", "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taskiq_redis_producers_task_runs_on_a_ferriq_worker() {
    let prefix = common::prefix();
    let queue = format!("{prefix}.stream");
    let store = Arc::new(common::store_at(&common::url(), &prefix, |b| b).await);
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(common::stream_broker(&queue).await))
            .store(store)
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME])
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg("stream_producer.py")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    interop_env(&mut cmd, &queue, &prefix);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the Python producer finished")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "producer failed: {stderr}");
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results["by_position"]["is_err"], false, "{results}");
    assert_eq!(results["by_position"]["value"], 5, "{results}");
    assert_eq!(results["by_keyword"]["value"], 6, "{results}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ferriq_clients_task_runs_on_a_python_taskiq_redis_worker() {
    let prefix = common::prefix();
    let queue = format!("{prefix}.stream");
    let store = Arc::new(common::store_at(&common::url(), &prefix, |b| b).await);
    // The ferriq client makes the stream and its group (from the stream's start): the Python
    // worker, which would make it from its end, finds it there and reads what was sent.
    let client = Client::new(Arc::new(common::stream_broker(&queue).await), store);
    let handles = client
        .enqueue_batch([py_mul::call(6, 7), py_mul::call(-2, 8)])
        .await
        .unwrap();
    let taskiq = python().with_file_name("taskiq");
    let mut cmd = tokio::process::Command::new(taskiq);
    cmd.args([
        "worker",
        "stream_app:broker",
        "--workers",
        "1",
        "--log-level",
        "WARNING",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    // `taskiq worker` forks its worker processes: a group of their own, killed whole.
    .process_group(0);
    interop_env(&mut cmd, &queue, &prefix);
    let python_worker = cmd.spawn().unwrap();
    let _group = KillGroup(python_worker.id().expect("the worker started"));
    assert_eq!(handles[0].wait(Duration::from_secs(90)).await.unwrap(), 42);
    assert_eq!(handles[1].wait(Duration::from_secs(90)).await.unwrap(), -16);
}
