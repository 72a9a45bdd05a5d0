//! A worker process killed with SIGKILL mid-run: its unacked deliveries go back to the queue
//! and another worker completes them. Zero lost.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::Topology;
use ferriq::testing::RunningWorker;
use ferriq::{Client, Registry, Shutdown, Worker};
use ferriq_amqp::AmqpBroker;

#[ferriq::task(name = "amqp.sigkill.slow")]
async fn slow(n: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(30)).await;
    n + 1
}

fn names() -> Option<(String, String, String)> {
    Some((
        std::env::var("FERRIQ_CHILD_EXCHANGE").ok()?,
        std::env::var("FERRIQ_CHILD_QUEUE").ok()?,
        std::env::var("FERRIQ_CHILD_PREFIX").ok()?,
    ))
}

/// The worker process the parent test kills: runs until SIGKILL.
#[tokio::test]
#[ignore = "started as a child process by a_worker_killed_with_sigkill_loses_nothing"]
async fn child_worker_process() {
    let (exchange, queue, prefix) = names().expect("started by the parent test");
    let broker = AmqpBroker::builder(common::amqp_url())
        .exchange(exchange)
        .queues([queue])
        .delay_tiers(common::TIERS)
        .prefetch(8)
        .connect()
        .await
        .unwrap();
    let worker = Worker::builder()
        .broker(Arc::new(broker))
        .store(Arc::new(common::store(&prefix).await))
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[slow::NAME])
                .unwrap(),
        )
        .concurrency(8)
        .build()
        .unwrap();
    worker.run(Shutdown::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_loses_nothing() {
    const TASKS: u64 = 300;
    let topology = Topology::new();
    let prefix = topology.queue.replace('.', "_");
    let store = Arc::new(common::store(&prefix).await);
    // Declares the topology before the child starts consuming.
    let client = Client::new(Arc::new(topology.broker().await), store.clone());
    let handles = client
        .enqueue_batch((0..TASKS).map(slow::call))
        .await
        .unwrap();

    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_worker_process",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("FERRIQ_CHILD_EXCHANGE", &topology.exchange)
        .env("FERRIQ_CHILD_QUEUE", &topology.queue)
        .env("FERRIQ_CHILD_PREFIX", &prefix)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Let the child finish some and hold others in flight.
    handles[40]
        .wait(Duration::from_secs(60))
        .await
        .expect("the child worker runs tasks");
    child.start_kill().unwrap(); // SIGKILL
    let status = child.wait().await.unwrap();
    assert!(!status.success(), "killed, not exited");
    let done_by_child = {
        let mut n = 0;
        for h in &handles {
            n += usize::from(h.try_result().await.unwrap().is_some());
        }
        n
    };
    assert!(done_by_child < TASKS as usize, "the kill came mid-run");

    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(topology.broker().await))
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[slow::NAME])
                    .unwrap(),
            )
            .concurrency(8)
            .build()
            .unwrap(),
    );
    for (n, h) in handles.iter().enumerate() {
        let v = h
            .wait(Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("task {n} lost: {e}"));
        assert_eq!(v, n as u64 + 1);
    }
    println!(
        "done by the killed child: {done_by_child}, by the second worker: {}",
        TASKS as usize - done_by_child
    );
    worker.stop().await;
}
