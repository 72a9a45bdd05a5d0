//! Worker processes on SQS, killed and paused: a SIGKILLed worker's messages come back after
//! their visibility and another worker completes them; a worker paused past its visibility
//! and lease finds its handle superseded, and neither deletes the message nor writes.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{QueueOptions, Queues};
use ferriq::testing::{CountingStore, RunningWorker};
use ferriq::{Client, Registry, Shutdown, TaskContext, Worker};
use ferriq_valkey::ValkeyStore;

#[ferriq::task(name = "sqs.proc.work")]
async fn work(n: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(50)).await;
    n + 1
}

/// Waits `secs`, then names the worker that finished it.
#[ferriq::task(name = "sqs.proc.named")]
async fn named(ctx: TaskContext, secs: u64) -> String {
    let _ = ctx;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    std::env::var("FERRIQ_CHILD_NAME").unwrap_or_else(|_| "parent".into())
}

async fn store(prefix: &str) -> ValkeyStore {
    common::store(prefix).await
}

fn worker_on(broker: ferriq_sqs::SqsBroker, store: Arc<ValkeyStore>, lease: Duration) -> Worker {
    Worker::builder()
        .broker(Arc::new(broker))
        .store(store)
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[work::NAME, named::NAME])
                .unwrap(),
        )
        .concurrency(8)
        .lease(lease)
        .build()
        .unwrap()
}

/// The worker process the parent tests kill or pause.
#[tokio::test]
#[ignore = "started as a child process by the tests of this file"]
async fn child_worker_process() {
    let var = |n: &str| std::env::var(n).expect("started by a parent test");
    let broker = ferriq_sqs::SqsBrokerBuilder::new(var("FERRIQ_CHILD_QUEUE"))
        .endpoint_url(var("FERRIQ_SQS_ENDPOINT"))
        .region("us-east-1")
        .credentials("test", "test")
        .wait_time(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let lease = Duration::from_secs(var("FERRIQ_CHILD_LEASE").parse().unwrap());
    let store = Arc::new(store(&var("FERRIQ_CHILD_PREFIX")).await);
    worker_on(broker, store, lease).run(Shutdown::new()).await;
}

fn start_child(
    queues: &Queues,
    prefix: &str,
    name: &str,
    lease_secs: u64,
) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_worker_process",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("FERRIQ_CHILD_QUEUE", &queues.name)
        .env("FERRIQ_SQS_ENDPOINT", &queues.endpoint)
        .env("FERRIQ_CHILD_PREFIX", prefix)
        .env("FERRIQ_CHILD_NAME", name)
        .env("FERRIQ_CHILD_LEASE", lease_secs.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_loses_nothing_and_writes_nothing_twice() {
    const TASKS: u64 = 200;
    let queues = Queues::create(QueueOptions::default()).await;
    let prefix = common::unique("kill");
    let raw = Arc::new(store(&prefix).await);
    let client = Client::new(Arc::new(queues.broker().await), raw.clone());
    let handles = client
        .enqueue_batch((0..TASKS).map(work::call))
        .await
        .unwrap();
    let mut child = start_child(&queues, &prefix, "child", 4);
    handles[30]
        .wait(Duration::from_secs(60))
        .await
        .expect("the child worker runs tasks");
    child.start_kill().unwrap(); // SIGKILL
    assert!(!child.wait().await.unwrap().success(), "killed, not exited");
    let mut done_by_child = std::collections::HashSet::new();
    for (i, h) in handles.iter().enumerate() {
        if h.try_result().await.unwrap().is_some() {
            done_by_child.insert(i);
        }
    }
    assert!(
        done_by_child.len() < TASKS as usize,
        "the kill came mid-run"
    );

    // The child's unsettled messages come back after their visibility (its 4 s lease).
    let counting = Arc::new(CountingStore::new(raw.clone()));
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(queues.broker().await))
            .store(counting.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[work::NAME])
                    .unwrap(),
            )
            .concurrency(16)
            .lease(Duration::from_secs(4))
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
    // Stopped before counting: a waiter can hear a result announced before the worker's
    // write call has returned to the counting store.
    worker.stop().await;
    // Nothing the child stored was written again: the second worker wrote exactly the rest.
    for (i, h) in handles.iter().enumerate() {
        let writes = counting.writes(h.task_id());
        let expected = u32::from(!done_by_child.contains(&i));
        assert_eq!(
            writes, expected,
            "task {i}: {writes} writes by the second worker"
        );
    }
    println!(
        "done by the killed child: {}, by the second worker: {}",
        done_by_child.len(),
        counting.total_writes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_whose_handle_was_superseded_neither_deletes_nor_writes() {
    let queues = Queues::create(QueueOptions {
        visibility_secs: 3,
        ..Default::default()
    })
    .await;
    let prefix = common::unique("pause");
    let store = Arc::new(store(&prefix).await);
    let client = Client::new(Arc::new(queues.broker().await), store.clone());
    let mut child = start_child(&queues, &prefix, "paused", 3);
    let pid = child.id().unwrap().to_string();
    let h = named::kiq(&client, 12).await.unwrap();
    // The child holds it (in flight, nobody else sees it).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while queues.counts().await.1 != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child never took it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
    };
    assert!(signal("-STOP").success());
    // Past its 3 s visibility and 3 s claim lease: this worker receives the message again
    // and takes the task over.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let second = RunningWorker::spawn(worker_on(
        queues.broker().await,
        store.clone(),
        Duration::from_secs(3),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while second.worker.stats().started == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no takeover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(signal("-CONT").success());
    // The resumed child's heartbeats fail (stale handle, lost claim): it cancels its run.
    // It must not have deleted the message, which the second worker still holds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        queues.counts().await.1,
        1,
        "the message is still held by the second worker"
    );
    assert_eq!(h.wait(Duration::from_secs(60)).await.unwrap(), "parent");
    assert!(
        h.try_result().await.unwrap().as_deref() == Some("parent"),
        "the result is the second worker's, written once"
    );
    child.start_kill().unwrap();
    let _ = child.wait().await;
    second.stop().await;
}
