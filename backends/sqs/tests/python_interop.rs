//! A Python service sends through taskiq-aio-sqs; the ferriq worker on the same queue runs the
//! task, and Python reads the result with taskiq-redis.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{QueueOptions, Queues};
use ferriq::testing::RunningWorker;
use ferriq::{Registry, Worker};
use ferriq_valkey::ValkeyStore;

#[ferriq::task(name = "interop.sqs.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

use ferriq_testkit::services::python;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_sent_by_taskiq_aio_sqs_runs_on_a_ferriq_worker() {
    let queues = Queues::create(QueueOptions::default()).await;
    let prefix = common::unique("py");
    let store = ValkeyStore::builder(common::redis_url())
        .prefix(&prefix)
        .result_ttl(Some(Duration::from_secs(600)))
        .claim_ttl(Duration::from_secs(600))
        .connect()
        .await
        .unwrap();
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(queues.broker().await))
            .store(Arc::new(store))
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[add::NAME])
                    .unwrap(),
            )
            .build()
            .unwrap(),
    );
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python())
            .arg("sqs_producer.py")
            .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop"))
            .env("INTEROP_SQS_ENDPOINT", &queues.endpoint)
            .env("INTEROP_QUEUE", &queues.name)
            .env("INTEROP_REDIS_URL", common::redis_url())
            .env("INTEROP_PREFIX", &prefix)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output(),
    )
    .await
    .expect("the Python producer finished")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "producer failed: {stderr}");
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results["now"]["is_err"], false, "{results}");
    assert_eq!(results["now"]["value"], 5, "{results}");
    assert_eq!(results["delayed"]["value"], 6, "{results}");
    // Delayed once, by SQS (2 s), not a second time by the worker.
    let took = results["delayed"]["seconds"].as_f64().unwrap();
    assert!((2.0..4.0).contains(&took), "the delayed task took {took} s");
    worker.stop().await;
}
