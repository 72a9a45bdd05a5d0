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

#[ferriq::task(
    name = "valkey.limits.reindex",
    unique_for = 1,
    dedup = "debounce",
    dedup_key = "doc"
)]
async fn reindex(starts: State<Arc<Starts>>, doc: String, version: u32) -> u32 {
    let _ = doc;
    starts.0.lock().unwrap().push((Instant::now(), version));
    version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounced_task_runs_once_when_its_key_is_quiet_with_the_latest_arguments() {
    let store = Arc::new(common::store().await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let client = Client::new(broker.clone(), store.clone());
    let starts = Arc::new(Starts::default());
    let worker = common::spawn_worker_with(
        broker.clone(),
        store.clone(),
        &[reindex::NAME],
        Arc::clone(&starts),
    );
    let mut edits = Vec::new();
    let mut last_edit = Instant::now();
    for version in 1..=4 {
        last_edit = Instant::now();
        edits.push(reindex::kiq(&client, "a".into(), version).await.unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(edits.iter().all(|e| e.task_id() == edits[0].task_id()));
    for edit in &edits {
        assert_eq!(edit.wait(Duration::from_secs(30)).await.unwrap(), 4);
    }
    let runs = starts.0.lock().unwrap().clone();
    assert_eq!(runs.len(), 1, "{runs:?}");
    // A window of quiet after the last edit (the server's clock, so a little slack).
    let quiet = runs[0].0 - last_edit;
    assert!(quiet >= Duration::from_millis(950), "{quiet:?}");
    assert_eq!(broker.stats().published, 4, "a copy per enqueue");
    worker.stop().await;
}

#[tokio::test]
async fn copies_of_a_debounced_task_run_once_the_latest_and_a_redelivery_runs_again() {
    use ferriq::store::{DebounceTurn, Debounced, FlowStore};
    let store = common::store().await;
    let (first, second) = (
        ferriq::wire::TaskId::random(),
        ferriq::wire::TaskId::random(),
    );
    // (1 s: the four calls before the quiet must come in time on a loaded machine.)
    let window = Duration::from_secs(1);
    assert_eq!(
        store.debounce("k", &first, window).await.unwrap(),
        DebounceTurn::New
    );
    let joined = DebounceTurn::Joined {
        task: first.clone(),
        seq: 2,
    };
    assert_eq!(store.debounce("k", &second, window).await.unwrap(), joined);
    // The first copy is replaced; the latest waits for the quiet.
    assert_eq!(
        store.take_debounced("k", &first, 1).await.unwrap(),
        Debounced::Superseded
    );
    assert!(matches!(
        store.take_debounced("k", &first, 2).await.unwrap(),
        Debounced::Wait(_)
    ));
    tokio::time::sleep(window + Duration::from_millis(50)).await;
    assert_eq!(
        store.take_debounced("k", &first, 2).await.unwrap(),
        Debounced::Run
    );
    // Its worker died: the redelivery runs (the claims decide), and the key moved on.
    assert_eq!(
        store.take_debounced("k", &first, 2).await.unwrap(),
        Debounced::Run
    );
    assert_eq!(
        store.debounce("k", &second, window).await.unwrap(),
        DebounceTurn::New
    );
    // A producer that does not debounce: nothing known, run it.
    assert_eq!(
        store
            .take_debounced("other", &ferriq::wire::TaskId::random(), 1)
            .await
            .unwrap(),
        Debounced::Run
    );
}
