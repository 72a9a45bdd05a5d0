//! Deduplication keys kept in Valkey: a thousand concurrent enqueues of one call send one
//! task, and the key is free again once its outcome is stored.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferriq::{Client, State};

#[derive(Default)]
struct Starts(Mutex<Vec<(Instant, u32)>>);

#[ferriq::task(name = "valkey.limits.report", unique_for = 60)]
async fn report(starts: State<Arc<Starts>>, customer: String) -> String {
    starts.0.lock().unwrap().push((Instant::now(), 1));
    customer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_enqueues_of_one_call_send_one_task() {
    let store = Arc::new(common::store().await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let client = Client::new(broker.clone(), store.clone());
    let enqueues = (0..1000).map(|_| {
        let client = client.clone();
        tokio::spawn(async move { report::kiq(&client, "acme".into()).await.unwrap() })
    });
    let handles = futures_util::future::join_all(enqueues).await;
    let first = handles[0].as_ref().unwrap().task_id().clone();
    assert!(handles
        .iter()
        .all(|h| *h.as_ref().unwrap().task_id() == first));
    assert_eq!(broker.stats().published, 1);
    let starts = Arc::new(Starts::default());
    let worker = common::spawn_worker_with(
        broker.clone(),
        store.clone(),
        &[report::NAME],
        Arc::clone(&starts),
    );
    let handle = client.handle::<String>(first.clone());
    assert_eq!(handle.wait(Duration::from_secs(30)).await.unwrap(), "acme");
    // Its outcome stored, the key is free again.
    let again = report::kiq(&client, "acme".into()).await.unwrap();
    assert_ne!(*again.task_id(), first);
    again.wait(Duration::from_secs(30)).await.unwrap();
    assert_eq!(starts.0.lock().unwrap().len(), 2);
    worker.stop().await;
}
