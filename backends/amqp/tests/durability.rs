//! 10,000 confirmed tasks survive their publisher's connection closing before any consumer
//! runs; a new worker consumes all of them, each result written once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Topology;
use ferriq::broker::Broker;
use ferriq::testing::{CountingStore, RunningWorker};
use ferriq::{Client, Registry, Worker};

#[ferriq::task(name = "amqp.durable.square")]
async fn square(n: u64) -> u64 {
    n * n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_tasks_survive_the_publishers_connection_closing() {
    const TASKS: u64 = 10_000;
    let topology = Topology::new();
    let prefix = topology.queue.replace('.', "_");
    let store = Arc::new(CountingStore::new(Arc::new(common::store(&prefix).await)));

    let publisher = Arc::new(topology.broker().await);
    let client = Client::new(publisher.clone(), store.clone());
    let mut handles = Vec::with_capacity(TASKS as usize);
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(1000) {
        handles.extend(
            client
                .enqueue_batch(chunk.iter().map(|n| square::call(*n)))
                .await
                .unwrap(),
        );
    }
    // Every publish was confirmed: the broker holds all of them, and nothing consumed yet.
    assert_eq!(publisher.depth().await.unwrap().ready, TASKS);
    publisher.close().await;
    drop(client);

    let consumer = Arc::new(
        topology
            .builder(&common::amqp_url())
            .prefetch(64)
            .connect()
            .await
            .unwrap(),
    );
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(consumer)
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[square::NAME])
                    .unwrap(),
            )
            .concurrency(64)
            .build()
            .unwrap(),
    );
    for (n, h) in handles.iter().enumerate() {
        let v: u64 = h
            .wait(Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("task {n} lost: {e}"));
        assert_eq!(v, (n as u64) * (n as u64));
    }
    worker.stop().await;
    assert_eq!(store.total_writes(), TASKS, "none lost");
    assert!(store.duplicate_writes().is_empty(), "none written twice");
}
