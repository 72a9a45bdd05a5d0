//! Python taskiq and ferriq share a queue: a taskiq-aio-pika 0.6.1 producer's task runs on a
//! ferriq worker and Python reads the result with taskiq-redis; a ferriq client's task runs on
//! a Python taskiq worker. The Python side is the venv scripts/test.sh sets up.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::Topology;
use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, Worker};

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

use common::{interop_env, python};

#[tokio::test]
async fn a_taskiq_producers_task_runs_on_a_ferriq_worker() {
    let topology = Topology::new();
    let prefix = topology.queue.replace('.', "_");
    let store = Arc::new(common::store(&prefix).await);
    // The ferriq worker declares the topology first; Python declares it again with its own
    // defaults, which only works if the arguments match.
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(topology.broker().await))
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
    cmd.arg("producer.py")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    interop_env(&mut cmd, &topology, &prefix);
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
    let id = results["by_position"]["task_id"].as_str().unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "taskiq's id: {id}"
    );
    worker.stop().await;
}

#[tokio::test]
async fn a_ferriq_clients_task_runs_on_a_python_taskiq_worker() {
    let topology = Topology::new();
    let prefix = topology.queue.replace('.', "_");
    let store = Arc::new(common::store(&prefix).await);
    let broker = Arc::new(topology.broker().await);
    let taskiq = python().with_file_name("taskiq");
    let mut cmd = tokio::process::Command::new(taskiq);
    cmd.args([
        "worker",
        "interop_app:broker",
        "--workers",
        "1",
        "--log-level",
        "WARNING",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    // `taskiq worker` forks its worker processes: a group of their own, killed whole.
    .process_group(0);
    interop_env(&mut cmd, &topology, &prefix);
    let python_worker = cmd.spawn().unwrap();
    let _group = KillGroup(python_worker.id().expect("the worker started"));
    let client = Client::new(broker, store);
    let handles = client
        .enqueue_batch([py_mul::call(6, 7), py_mul::call(-2, 8)])
        .await
        .unwrap();
    let answers = async {
        let a = handles[0].wait(Duration::from_secs(90)).await;
        let b = handles[1].wait(Duration::from_secs(90)).await;
        (a, b)
    };
    let (a, b) = answers.await;
    assert_eq!(a.unwrap(), 42);
    assert_eq!(b.unwrap(), -16);
}
