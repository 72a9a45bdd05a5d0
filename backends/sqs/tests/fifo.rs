//! FIFO queues on moto, which — like AWS — hands over several messages of one message group in
//! a single receive: a worker runs a group's messages one at a time, in the order they were
//! sent, whatever its concurrency, through retries and a poison message in the middle;
//! different groups still run side by side. The SIGKILL test runs on fauxqs: when every
//! in-flight message of a group becomes visible again at once (a killed worker's), moto returns
//! the group's last message first (its receive unblocks the group only when it reaches that
//! one), which AWS does not do.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{QueueOptions, Queues};
use ferriq::memory::MemoryStore;
use ferriq::store::Store;
use ferriq::testing::RunningWorker;
use ferriq::{Call, Client, Registry, Shutdown, State, TaskContext, TaskError, Worker};

/// Where runs write what they do: a file, so a worker process killed mid-group leaves its
/// record behind for the test to read.
#[derive(Clone)]
struct Log(Arc<LogFile>);

/// The file, removed with the last clone of its log.
struct LogFile(PathBuf);

impl Drop for LogFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Log {
    fn new() -> Self {
        Self::at(std::env::temp_dir().join(format!("{}.log", common::unique("fifo"))))
    }

    fn at(path: PathBuf) -> Self {
        Log(Arc::new(LogFile(path)))
    }

    fn path(&self) -> &Path {
        &self.0 .0
    }

    fn write(&self, line: String) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path())
            .unwrap();
        // One write per line: appends of a few bytes land whole.
        file.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// `(event, group, index)` in the order written.
    fn events(&self) -> Vec<(String, String, u32)> {
        std::fs::read_to_string(self.path())
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let mut words = l.split(' ');
                let mut next = || words.next().unwrap().to_owned();
                (next(), next(), next().parse().unwrap())
            })
            .collect()
    }
}

/// One message of a group: `fail_once` fails its first attempt (retried), `fatal` is poison.
#[ferriq::task(name = "fifo.step", max_attempts = 3, backoff_initial = 0.05)]
async fn step(
    log: State<Log>,
    ctx: TaskContext,
    group: String,
    index: u32,
    mode: String,
) -> Result<u32, TaskError> {
    log.write(format!("start {group} {index}"));
    // 0-20 ms, different per message: runs side by side would finish out of order.
    let mut took = Duration::from_millis(u64::from(index * 7 % 21));
    if mode == "slow" {
        took += Duration::from_secs(2);
    }
    tokio::time::sleep(took).await;
    log.write(format!("end {group} {index}"));
    match mode.as_str() {
        "fail_once" if ctx.attempt() == 1 => Err(TaskError::retryable("first attempt fails")),
        "fatal" => Err(TaskError::fatal("poison")),
        _ => Ok(index),
    }
}

fn call(group: &str, index: u32, mode: &str) -> Call<u32> {
    step::call(group.to_owned(), index, mode.to_owned()).with_label("group_id", group)
}

/// moto's queues: a FIFO queue and its FIFO dead-letter queue. Hand-backs count as receives,
/// and moto (as SQS) moves a message received `maxReceiveCount` times: set it high, as the
/// README says to.
async fn fifo_queues() -> Queues {
    Queues::create_at(
        &common::moto_endpoint(),
        QueueOptions {
            fifo: true,
            max_receive_count: 100,
            visibility_secs: 30,
            ..QueueOptions::default()
        },
    )
    .await
}

/// A worker with 16 slots on one poller (moto's receive looks at the groups in flight once per
/// call, so two concurrent polls could each take a group's message; AWS does not do that).
async fn worker_on(queues: &Queues, store: Arc<dyn Store>, log: &Log, lease: u64) -> Worker {
    worker_at(&queues.endpoint, &queues.name, store, log, lease).await
}

async fn worker_at(
    endpoint: &str,
    queue: &str,
    store: Arc<dyn Store>,
    log: &Log,
    lease: u64,
) -> Worker {
    let broker = ferriq_sqs::SqsBrokerBuilder::new(queue)
        .endpoint_url(endpoint)
        .region("us-east-1")
        .credentials("test", "test")
        .wait_time(Duration::from_secs(1))
        .pollers(1)
        .connect()
        .await
        .unwrap();
    Worker::builder()
        .broker(Arc::new(broker))
        .store(store)
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[step::NAME])
                .unwrap(),
        )
        .state(log.clone())
        .concurrency(16)
        .lease(Duration::from_secs(lease))
        .build()
        .unwrap()
}

/// Sends each group's calls in order, ten per batch (one SendMessageBatch each).
async fn send_in_order(client: &Client, calls: Vec<Call<u32>>) -> Vec<ferriq::TaskHandle<u32>> {
    let mut handles = Vec::new();
    let mut calls = calls.into_iter().peekable();
    while calls.peek().is_some() {
        let batch: Vec<_> = calls.by_ref().take(10).collect();
        handles.extend(client.enqueue_batch(batch).await.unwrap());
    }
    handles
}

/// Each group's runs: one at a time (every start after the previous run's end) and in order.
/// Returns the indices started per group, in order, and the most runs at once over all groups.
fn check_order(events: &[(String, String, u32)]) -> (Vec<(String, Vec<u32>)>, usize) {
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    let mut open: std::collections::HashMap<&str, u32> = Default::default();
    let mut most = 0;
    for (event, group, index) in events {
        match event.as_str() {
            "start" => {
                assert!(
                    !open.contains_key(group.as_str()),
                    "group {group}: {index} started while {:?} ran\n{events:?}",
                    open.get(group.as_str())
                );
                open.insert(group, *index);
                most = most.max(open.len());
                match groups.iter_mut().find(|(g, _)| g == group) {
                    Some((_, started)) => started.push(*index),
                    None => groups.push((group.clone(), vec![*index])),
                }
            }
            _ => assert_eq!(open.remove(group.as_str()), Some(*index), "{events:?}"),
        }
    }
    (groups, most)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_runs_one_at_a_time_in_order_and_groups_run_side_by_side() {
    let queues = fifo_queues().await;
    let log = Log::new();
    let store = Arc::new(MemoryStore::new());
    let worker = RunningWorker::spawn(worker_on(&queues, store.clone(), &log, 30).await);
    let client = Client::new(Arc::new(queues.broker().await), store);
    // Two groups of 40, interleaved in the sending.
    let calls = (0..40)
        .flat_map(|i| [call("a", i, "ok"), call("b", i, "ok")])
        .collect();
    let handles = send_in_order(&client, calls).await;
    for h in &handles {
        h.wait(Duration::from_secs(120)).await.unwrap();
    }
    worker.stop().await;
    let (groups, most) = check_order(&log.events());
    for (group, started) in &groups {
        assert_eq!(*started, (0..40).collect::<Vec<_>>(), "group {group}");
    }
    assert_eq!(groups.len(), 2);
    assert_eq!(most, 2, "the two groups ran side by side");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_and_a_poison_message_keep_their_group_in_order() {
    let queues = fifo_queues().await;
    let log = Log::new();
    let store = Arc::new(MemoryStore::new());
    let worker = RunningWorker::spawn(worker_on(&queues, store.clone(), &log, 30).await);
    let client = Client::new(Arc::new(queues.broker().await), store);
    let mode = |i| match i {
        3 => "fail_once",
        6 => "fatal",
        _ => "ok",
    };
    let handles = send_in_order(&client, (0..12).map(|i| call("g", i, mode(i))).collect()).await;
    for (i, h) in handles.iter().enumerate() {
        let outcome = h.wait(Duration::from_secs(120)).await;
        assert_eq!(outcome.is_ok(), i != 6, "{i}: {outcome:?}");
    }
    worker.stop().await;
    let (groups, _) = check_order(&log.events());
    // The retry ran again before anything behind it; the poison was parked and the group
    // went on.
    let expected: Vec<u32> = [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11].to_vec();
    assert_eq!(groups, vec![("g".to_owned(), expected)]);
    let dead = queues.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].message_attributes.as_ref().unwrap()["ferriq_reason"].string_value(),
        Some("non_retryable")
    );
}

/// The worker process the SIGKILL test kills mid-group.
#[tokio::test]
#[ignore = "started as a child process by the SIGKILL test"]
async fn child_worker_process() {
    let var = |n: &str| std::env::var(n).expect("started by the parent test");
    let log = Log::at(PathBuf::from(var("FERRIQ_CHILD_LOG")));
    let store = Arc::new(common::store(&var("FERRIQ_CHILD_PREFIX")).await);
    let endpoint = var("FERRIQ_CHILD_ENDPOINT");
    let worker = worker_at(&endpoint, &var("FERRIQ_CHILD_QUEUE"), store, &log, 3).await;
    std::mem::forget(log); // the parent reads it, then removes it
    worker.run(Shutdown::new()).await;
}

fn start_child(queues: &Queues, log: &Path, prefix: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_worker_process",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("FERRIQ_CHILD_ENDPOINT", &queues.endpoint)
        .env("FERRIQ_CHILD_QUEUE", &queues.name)
        .env("FERRIQ_CHILD_LOG", log)
        .env("FERRIQ_CHILD_PREFIX", prefix)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_group_loses_nothing_and_the_group_stays_in_order() {
    let queues = Queues::create(QueueOptions {
        fifo: true,
        max_receive_count: 100,
        ..QueueOptions::default()
    })
    .await;
    let log = Log::new();
    let prefix = common::unique("fifo-kill");
    let store = Arc::new(common::store(&prefix).await);
    let client = Client::new(Arc::new(queues.broker().await), store.clone());
    // Each run takes 2 s: the kill comes while one runs and the rest of its receive waits
    // behind it.
    let handles = send_in_order(&client, (0..10).map(|i| call("k", i, "slow")).collect()).await;
    let mut child = start_child(&queues, log.path(), &prefix);
    common::eventually(
        "the child ran two of the group",
        Duration::from_secs(60),
        || log.events().iter().filter(|(e, ..)| e == "start").count() >= 3,
    )
    .await;
    child.start_kill().unwrap(); // SIGKILL
    assert!(!child.wait().await.unwrap().success(), "killed, not exited");
    let before = log.events().len();
    let mut done_by_child = 0;
    for h in &handles {
        if h.try_result().await.unwrap().is_some() {
            done_by_child += 1;
        }
    }
    assert!(done_by_child < 10, "the kill came mid-group");

    // Its messages come back after their visibility (its 3 s lease), the group from the one
    // it was running.
    let counting = Arc::new(ferriq::testing::CountingStore::new(store.clone()));
    let worker = RunningWorker::spawn(worker_on(&queues, counting.clone(), &log, 3).await);
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(180)).await.unwrap(), i as u32);
    }
    worker.stop().await;
    let events = log.events();
    assert!(events.len() > before, "the second worker ran the rest");
    // A run cut off by the kill started and never ended: the group is checked in order on
    // either side of it, and every message's last run came in order.
    let (first, _) = check_order(&events[..before]);
    let (second, _) = check_order(&events[before..]);
    let started: Vec<u32> = first
        .into_iter()
        .chain(second)
        .flat_map(|(_, started)| started)
        .collect();
    assert!(
        started.windows(2).all(|w| w[0] <= w[1]),
        "started in order, a cut-off run again first: {started:?}"
    );
    let mut all = started.clone();
    all.dedup();
    assert_eq!(all, (0..10).collect::<Vec<_>>(), "{started:?}");
    // Every result written once: the second worker wrote exactly the ones the child had not.
    assert!(counting.duplicate_writes().is_empty());
    assert_eq!(counting.total_writes(), 10 - done_by_child);
}
