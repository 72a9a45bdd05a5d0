//! The operations scenarios, for a broker that keeps dead letters: 50 tasks dead-lettered for mixed
//! reasons; listed with the right reasons; redriven by reason (each runs again and its waiter
//! gets the new result); purged by task name; the rest untouched.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::dead_letters::DeadFilter;
use crate::store::Store;
use crate::testing::RunningWorker;
use crate::wire::TaskMessage;
use crate::{Client, Registry, State, TaskContext, TaskError, WaitError, Worker, WorkerConfig};

const WAIT: Duration = Duration::from_secs(90);

/// Whether the outside world the tasks depend on is back.
#[derive(Default)]
pub struct Healed(pub AtomicBool);

#[crate::task(inventory = false, name = "conformance.ops.flaky", max_attempts = 1)]
async fn flaky(healed: State<Arc<Healed>>, ctx: TaskContext, n: u32) -> Result<u32, TaskError> {
    if !healed.0.load(Ordering::SeqCst) {
        return Err(TaskError::retryable(format!(
            "attempt {} of {n} failed",
            ctx.attempt()
        )));
    }
    Ok(n)
}

#[crate::task(inventory = false, name = "conformance.ops.fatal")]
async fn fatal(healed: State<Arc<Healed>>, n: u32) -> Result<u32, TaskError> {
    if !healed.0.load(Ordering::SeqCst) {
        return Err(TaskError::fatal(format!("{n} is malformed")));
    }
    Ok(n)
}

/// The suite's worker on `broker` and `store` (see [`worker`]), a client of the same two,
/// and the flag that heals the suite's flaky task.
pub fn worker_and_client(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
) -> (RunningWorker, Client, Arc<Healed>) {
    let healed = Arc::new(Healed::default());
    let worker = worker(broker.clone(), store.clone(), healed.clone());
    (worker, Client::new(broker, store), healed)
}

/// A worker for the suite: unknown names parked after one receive, releases quick.
pub fn worker(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    healed: Arc<Healed>,
) -> RunningWorker {
    let mut config = WorkerConfig::default();
    config.max_unroutable_receives = 1;
    config.unknown_task_release = Duration::from_millis(200);
    config.min_defer = Duration::from_millis(200);
    RunningWorker::spawn(
        Worker::builder()
            .broker(broker)
            .store(store)
            .registry(
                Registry::from_registrations([flaky::registration(), fatal::registration()])
                    .expect("distinct names"),
            )
            .state(healed)
            .config(config)
            .build()
            .unwrap(),
    )
}

async fn eventually_parked(client: &Client, lane: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let parked = client.ops().dead_letters(lane, 0, 1000).await.unwrap();
        if parked.len() >= n {
            assert_eq!(parked.len(), n, "more parked than expected");
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} parked",
            parked.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the store's dead-letter index of `lane` holds `n` entries, and returns them.
async fn eventually_indexed(client: &Client, lane: &str, n: u64) -> Vec<crate::store::DeadEntry> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let page = client
            .ops()
            .dead_index(lane, &DeadFilter::all(), 0, 1000)
            .await
            .unwrap()
            .expect("the suite's stores keep an index");
        if page.total == n {
            assert_eq!(page.entries.len() as u64, n);
            return page.entries;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} indexed",
            page.total
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A redrive sends each task back once: a task that fails again at once and is parked again
/// while the redrive goes on is left parked, not chased round (a redrive on SQS did so until
/// it was killed). `client`'s broker and store are shared with a worker of [`worker`].
pub async fn a_redrive_sends_each_task_back_once(client: &Client, lane: &str) {
    let handles = client
        .enqueue_batch((0..30).map(fatal::call))
        .await
        .unwrap();
    for h in &handles {
        assert!(matches!(h.wait(WAIT).await, Err(WaitError::Failed(_))));
    }
    eventually_parked(client, lane, 30).await;
    let report = tokio::time::timeout(WAIT, client.ops().redrive(lane, &DeadFilter::all(), |_| {}))
        .await
        .expect("the redrive ends")
        .unwrap();
    assert_eq!(report.redriven, 30, "{report:?}");
    // Each failed again and is parked again: 30 in all, each once — and indexed again (the
    // redrive takes an entry out before its task goes back, never after it is parked anew).
    eventually_parked(client, lane, 30).await;
    eventually_indexed(client, lane, 30).await;
}

/// The scenario on `client` (whose broker and store the worker shares), lane `lane`;
/// `ordered`: the broker keeps its dead letters in order (listing twice gives the same order).
pub async fn dead_letters_are_listed_redriven_and_purged(
    client: &Client,
    lane: &str,
    healed: Arc<Healed>,
    ordered: bool,
) {
    let flaky_handles = client
        .enqueue_batch((0..20).map(flaky::call))
        .await
        .unwrap();
    let fatal_handles = client
        .enqueue_batch((0..20).map(fatal::call))
        .await
        .unwrap();
    let mut unknown = Vec::new();
    for _ in 0..10 {
        unknown.push(
            client
                .enqueue_message(TaskMessage::new("ops.nobody"))
                .await
                .unwrap(),
        );
    }
    for h in &flaky_handles {
        assert!(matches!(h.wait(WAIT).await, Err(WaitError::Failed(_))));
    }
    eventually_parked(client, lane, 50).await;

    // Listed with the right reasons, and nothing taken by looking.
    let ops = client.ops();
    let parked = ops.dead_letters(lane, 0, 100).await.unwrap();
    let count = |reason: &str| {
        parked
            .iter()
            .filter(|m| m.reason.as_deref() == Some(reason))
            .count()
    };
    assert_eq!(
        (
            count("retries_exhausted"),
            count("non_retryable"),
            count("unknown_task")
        ),
        (20, 20, 10),
        "{parked:?}"
    );
    let page = ops.dead_letters(lane, 40, 100).await.unwrap();
    assert_eq!(page.len(), 10, "paged");
    let again = ops.dead_letters(lane, 0, 100).await.unwrap();
    assert_eq!(again.len(), 50, "listing took nothing away");
    let ids: Vec<_> = parked.iter().map(|m| m.id.clone()).collect();
    let ids_again: Vec<_> = again.iter().map(|m| m.id.clone()).collect();
    if ordered {
        assert_eq!(ids, ids_again, "listing kept the order");
    }
    let mut sorted = (ids.clone(), ids_again.clone());
    sorted.0.sort();
    sorted.1.sort();
    assert_eq!(sorted.0, sorted.1, "the same dead letters");
    let flaky_one = parked
        .iter()
        .find(|m| m.task_name.as_deref() == Some(flaky::NAME))
        .unwrap();
    assert_eq!(flaky_one.attempts, 1);
    assert!(flaky_one.detail.contains("failed"), "{}", flaky_one.detail);
    assert!(flaky_one.task_id.is_some());

    // The store's index holds the same 50, with what the page shows.
    let indexed = eventually_indexed(client, lane, 50).await;
    let mut keys: Vec<String> = indexed.iter().map(|e| e.key.clone()).collect();
    let mut listed: Vec<String> = parked.iter().map(|m| m.index_key()).collect();
    keys.sort();
    listed.sort();
    assert_eq!(keys, listed, "the index names the parked letters");
    let by_reason = ops
        .dead_index(lane, &DeadFilter::all().reason("non_retryable"), 0, 5)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((by_reason.total, by_reason.entries.len()), (20, 5));
    let fatal_entry = &by_reason.entries[0];
    assert_eq!(fatal_entry.task_name.as_deref(), Some(fatal::NAME));
    assert!(
        fatal_entry.arguments.starts_with('['),
        "{:?}",
        fatal_entry.arguments
    );
    assert!(fatal_entry.dead_at_ms > 0);

    // Redrive by reason: exactly those run again, with a new result their waiters get.
    healed.0.store(true, Ordering::SeqCst);
    let mut seen_progress = 0;
    let report = ops
        .redrive(lane, &DeadFilter::all().reason("retries_exhausted"), |p| {
            seen_progress = p.done
        })
        .await
        .unwrap();
    assert_eq!((report.redriven, report.running), (20, 0));
    assert_eq!(seen_progress, 20);
    for (i, h) in flaky_handles.iter().enumerate() {
        assert_eq!(h.wait(WAIT).await.unwrap(), i as u32, "redriven task {i}");
    }
    for h in &fatal_handles {
        assert!(
            matches!(h.status().await.unwrap(), crate::TaskStatus::Failed(_)),
            "not redriven: still failed"
        );
    }

    // Purge by task name.
    let report = ops
        .purge(lane, &DeadFilter::all().task_name("ops.nobody"), |_| {})
        .await
        .unwrap();
    assert_eq!((report.purged, report.kept), (10, 20));
    assert_eq!(
        report.answered, 0,
        "each had its UnknownTask result already"
    );
    let left = ops.dead_letters(lane, 0, 100).await.unwrap();
    assert_eq!(left.len(), 20);
    assert!(left
        .iter()
        .all(|m| m.reason.as_deref() == Some("non_retryable")));
    let queues = ops.queues().await.unwrap();
    let q = queues.iter().find(|q| q.name == lane).unwrap();
    assert_eq!(q.dead_lettered, Some(20));
    // Redriven and purged letters left the index.
    let indexed = eventually_indexed(client, lane, 20).await;
    assert!(indexed
        .iter()
        .all(|e| e.reason.as_deref() == Some("non_retryable")));

    // Rebuilt from the queue after the index was lost: the same 20, nothing taken away.
    client.store().clear_dead_index(lane).await.unwrap();
    eventually_indexed(client, lane, 0).await;
    assert_eq!(ops.reindex_dead(lane, |_| {}).await.unwrap(), 20);
    let rebuilt = eventually_indexed(client, lane, 20).await;
    assert!(rebuilt
        .iter()
        .all(|e| e.reason.as_deref() == Some("non_retryable") && e.task_id.is_some()));
    assert_eq!(ops.dead_letters(lane, 0, 100).await.unwrap().len(), 20);

    // A selection by index key reaches the broker's letters: two purged.
    let two: Vec<String> = rebuilt.iter().take(2).map(|e| e.key.clone()).collect();
    let report = ops
        .purge(lane, &DeadFilter::all().any_of_keys(two), |_| {})
        .await
        .unwrap();
    assert_eq!((report.purged, report.kept), (2, 18));
    eventually_indexed(client, lane, 18).await;
}

/// Who runs `ops.stale`, whether its runs succeed yet, and a gate that holds them.
pub struct Me {
    name: &'static str,
    ok: AtomicBool,
    gate: Option<tokio::sync::Semaphore>,
    entered: tokio::sync::Notify,
}

#[crate::task(inventory = false, name = "conformance.ops.stale", max_attempts = 1)]
async fn stale(me: State<Arc<Me>>) -> Result<String, TaskError> {
    me.entered.notify_one();
    if let Some(gate) = &me.gate {
        let _ = gate.acquire().await;
    }
    if !me.ok.load(Ordering::SeqCst) {
        return Err(TaskError::fatal("not yet"));
    }
    Ok(me.name.to_owned())
}

/// Worker A runs a task and pauses inside it; its lease is ended behind its back (`expire`)
/// and worker B takes the task over and fails it for good; the dead letter is redriven and B
/// succeeds; then A resumes and tries to write: fenced off, the new result stays. A and B
/// receive from brokers of their own (a broker that pushes deliveries shares its prefetch
/// among the workers that use it); the first also publishes and redrives.
pub async fn a_stale_worker_cannot_write_over_a_redriven_result<F, Fut>(
    brokers: [Arc<dyn Broker>; 2],
    store: Arc<dyn Store>,
    lane: &str,
    expire: F,
) where
    F: Fn(crate::wire::TaskId) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    use crate::broker::OutgoingMessage;
    let me = |name, gate: bool, ok| {
        Arc::new(Me {
            name,
            ok: AtomicBool::new(ok),
            gate: gate.then(|| tokio::sync::Semaphore::new(0)),
            entered: tokio::sync::Notify::new(),
        })
    };
    let (a, b) = (me("A", true, true), me("B", false, false));
    let [broker, broker_b] = brokers;
    let builder = |me: &Arc<Me>, broker: &Arc<dyn Broker>| {
        let mut config = WorkerConfig::default();
        config.min_defer = Duration::from_millis(200);
        Worker::builder()
            .broker(broker.clone())
            .store(store.clone())
            .registry(Registry::from_registrations([stale::registration()]).expect("one task"))
            .state(Arc::clone(me))
            .config(config)
    };
    // A: a long lease, so it does not heartbeat during the test: it only finds out it was
    // taken over when it tries to write. Busy with the held run: every other copy goes to B.
    let worker_a = RunningWorker::spawn(
        builder(&a, &broker)
            .concurrency(1)
            .lease(Duration::from_secs(600))
            .build()
            .unwrap(),
    );
    let client = Client::new(broker.clone(), store.clone());
    let msg = stale::call().into_message().unwrap();
    let id = msg.task_id.clone();
    broker
        .publish(vec![OutgoingMessage::from_message(&msg).unwrap()])
        .await
        .unwrap();
    a.entered.notified().await;
    // A pauses (its run is held); its lease runs out; a copy of the message goes to B, which
    // takes the task over and fails it for good: dead-lettered with an error result.
    assert!(expire(id.clone()).await, "the lease was ended");
    let worker_b = RunningWorker::spawn(builder(&b, &broker_b).build().unwrap());
    broker
        .publish(vec![OutgoingMessage::from_message(&msg).unwrap()])
        .await
        .unwrap();
    let handle = client.handle::<String>(id.clone());
    assert!(matches!(handle.wait(WAIT).await, Err(WaitError::Failed(_))));
    // Redriven: B now succeeds.
    b.ok.store(true, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = client
            .ops()
            .redrive(lane, &DeadFilter::all().task_id(id.clone()), |_| {})
            .await
            .unwrap();
        if report.redriven == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not parked yet");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(handle.wait(WAIT).await.unwrap(), "B");
    // A resumes and tries to write: fenced off.
    a.gate.as_ref().unwrap().add_permits(1);
    let deadline = tokio::time::Instant::now() + WAIT;
    while worker_a.worker.stats().count(crate::worker::Outcome::Stale) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A never tried to write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        handle.wait(Duration::from_secs(1)).await.unwrap(),
        "B",
        "still B's"
    );
    worker_a.shutdown.force();
    worker_a.join().await;
    worker_b.stop().await;
}
