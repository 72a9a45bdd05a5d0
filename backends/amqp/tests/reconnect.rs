//! The worker's connection is cut mid-run by a TCP proxy: it reconnects, every task completes,
//! and no result is written twice.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Proxy, Topology};
use ferriq::broker::Broker;
use ferriq::testing::{CountingStore, RunningWorker};
use ferriq::worker::Outcome;
use ferriq::{Client, Registry, Worker};
use tokio::time::Instant;

#[ferriq::task(name = "amqp.reconnect.slow")]
async fn slow(n: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(20)).await;
    n
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Closed at once.
    Cut,
    /// Open but silent: only the AMQP heartbeat notices.
    Stall,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_replaced_and_every_task_completes_once() {
    survives(Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_noticed_by_heartbeat_and_replaced() {
    survives(Fault::Stall).await;
}

async fn survives(fault: Fault) {
    const TASKS: u64 = 1_000;
    let topology = Topology::new();
    let prefix = topology.queue.replace('.', "_");
    let store = Arc::new(CountingStore::new(Arc::new(common::store(&prefix).await)));
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let worker_broker = Arc::new(
        topology
            .builder(&proxy.url())
            .heartbeat_secs(2)
            .prefetch(8)
            .connect()
            .await
            .unwrap(),
    );
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(worker_broker.clone())
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
    let client = Client::new(Arc::new(topology.broker().await), store.clone());
    let handles = client
        .enqueue_batch((0..TASKS).map(slow::call))
        .await
        .unwrap();

    // Cut while tasks are running.
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.total_writes() < 150 {
        assert!(Instant::now() < deadline, "worker made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let faulted = match fault {
        Fault::Cut => proxy.cut(),
        Fault::Stall => proxy.stall(),
    };
    assert!(faulted >= 1, "a live connection was hit");
    let at_cut = store.total_writes();
    let hit = tokio::time::Instant::now();

    for (n, h) in handles.iter().enumerate() {
        let v: u64 = h
            .wait(Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("task {n} lost: {e}"));
        assert_eq!(v, n as u64);
    }
    assert!(worker_broker.health().await.is_healthy(), "reconnected");
    let stats = worker.worker.stats();
    worker.stop().await;
    println!(
        "{fault:?}: results at the fault: {at_cut}; all done {:?} later; lost deliveries: {}; broker errors: {}; duplicates acked: {}",
        hit.elapsed(),
        stats.count(Outcome::DeliveryLost),
        stats.count(Outcome::BrokerError),
        stats.count(Outcome::Duplicate)
    );
    assert_eq!(store.total_writes(), TASKS);
    assert!(
        store.duplicate_writes().is_empty(),
        "zero results written twice"
    );
}
