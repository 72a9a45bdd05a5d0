//! Delayed tasks on the real RabbitMQ with the default delay tiers: every task runs within a
//! second of when it is due, never before, whatever was enqueued before it.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Topology;
use ferriq::memory::MemoryStore;
use ferriq::testing::RunningWorker;
use ferriq::wire::TaskId;
use ferriq::{Client, Registry, State, TaskContext, TaskError, Worker, WorkerConfig};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Unix seconds when each task started, and how many times a worker had received it by then
/// (each trip through a delay tier or a release for what is left is one more).
#[derive(Default)]
struct Starts(Mutex<HashMap<TaskId, (f64, u32)>>);

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[ferriq::task(name = "amqp.delays.stamp")]
async fn stamp(starts: State<Arc<Starts>>, ctx: TaskContext) {
    starts
        .0
        .lock()
        .unwrap()
        .insert(ctx.task_id().clone(), (now_unix(), ctx.receive_count()));
}

/// Unix seconds when each attempt of a task started.
#[derive(Default)]
struct Attempts(Mutex<HashMap<TaskId, Vec<f64>>>);

/// Fails its first attempt; its retry waits 150–300 ms (the backoff with its jitter).
#[ferriq::task(
    name = "amqp.delays.retry_soon",
    max_attempts = 2,
    backoff_initial = 0.3,
    backoff_max = 0.3
)]
async fn retry_soon(attempts: State<Arc<Attempts>>, ctx: TaskContext) -> Result<(), TaskError> {
    let mut attempts = attempts.0.lock().unwrap();
    attempts
        .entry(ctx.task_id().clone())
        .or_default()
        .push(now_unix());
    if ctx.attempt() == 1 {
        return Err(TaskError::retryable("the first attempt fails"));
    }
    Ok(())
}

struct Setup {
    _topology: Topology,
    client: Client,
    worker: RunningWorker,
    starts: Arc<Starts>,
    attempts: Arc<Attempts>,
}

/// A worker serving both tasks; `min_defer` low enough for `retry_soon`'s backoff.
async fn setup() -> Setup {
    let topology = Topology::with_default_tiers();
    let broker = Arc::new(topology.broker().await);
    let store = Arc::new(MemoryStore::new());
    let (starts, attempts) = (Arc::new(Starts::default()), Arc::new(Attempts::default()));
    let mut config = WorkerConfig::default();
    config.min_defer = Duration::from_millis(50);
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(broker.clone())
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[stamp::NAME, retry_soon::NAME])
                    .unwrap(),
            )
            .state(Arc::clone(&starts))
            .state(Arc::clone(&attempts))
            .config(config)
            .concurrency(32)
            .build()
            .unwrap(),
    );
    Setup {
        client: Client::new(broker, store),
        _topology: topology,
        worker,
        starts,
        attempts,
    }
}

/// Enqueues `stamp` due `delay` from now; returns its id and due time.
async fn enqueue(s: &Setup, delay: Duration) -> (TaskId, f64) {
    let msg = stamp::call().with_delay(delay).into_message().unwrap();
    let due = msg.labels.due_at().unwrap_or_else(now_unix);
    let handle = s.client.enqueue_message(msg).await.unwrap();
    (handle.task_id().clone(), due)
}

/// How late each task ran after it was due (negative: early), waiting for all of them.
async fn lateness(s: &Setup, due: &[(TaskId, f64)], limit: Duration) -> Vec<f64> {
    for (id, _) in due {
        s.client
            .handle::<()>(id.clone())
            .wait(limit)
            .await
            .unwrap_or_else(|e| panic!("task {id}: {e}"));
    }
    let starts = s.starts.0.lock().unwrap();
    due.iter().map(|(id, due)| starts[id].0 - due).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_delay_enqueued_after_a_long_one_runs_on_time() {
    let s = setup().await;
    // Before the fix both waited in the 30 s tier with their own expirations, and the 6 s
    // one expired only when the 25 s one ahead of it did.
    let long = enqueue(&s, Duration::from_secs(25)).await;
    let short = enqueue(&s, Duration::from_secs(6)).await;
    let late = lateness(&s, &[short, long], Duration::from_secs(60)).await;
    for l in &late {
        assert!(
            (-0.005..1.0).contains(l),
            "ran {l:.3} s after it was due: {late:?}"
        );
    }
    s.worker.stop().await;
}

/// A delay under a second, enqueued behind a second's worth of messages in the 1 s tier:
/// waiting in that tier with its own expiration, it ran when the messages ahead of it expired
/// (0.7 s late here); the worker holds it instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_under_a_second_does_not_wait_behind_the_one_second_tier() {
    let s = setup().await;
    let mut due = Vec::new();
    for _ in 0..20 {
        due.push(enqueue(&s, Duration::from_secs(1)).await);
    }
    let short = enqueue(&s, Duration::from_millis(300)).await;
    let late = lateness(&s, &[short], Duration::from_secs(30)).await[0];
    assert!(
        (-0.005..0.35).contains(&late),
        "the 300 ms delay ran {late:.3} s after it was due"
    );
    let late = lateness(&s, &due, Duration::from_secs(30)).await;
    assert!(late.iter().all(|l| (-0.005..1.0).contains(l)), "{late:?}");
    s.worker.stop().await;
}

/// A retry under a second, released behind a second's worth of messages in the 1 s tier:
/// released into that tier with its own expiration, it ran when they expired (~1 s after
/// the failure); straight back to the lane, the worker holds it until due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_under_a_second_does_not_wait_behind_the_one_second_tier() {
    let s = setup().await;
    for _ in 0..20 {
        enqueue(&s, Duration::from_secs(1)).await;
    }
    let handle = s.client.enqueue(retry_soon::call()).await.unwrap();
    handle.wait(Duration::from_secs(30)).await.unwrap();
    let times = s.attempts.0.lock().unwrap()[handle.task_id()].clone();
    assert_eq!(times.len(), 2, "{times:?}");
    let gap = times[1] - times[0];
    // Never before the shortest backoff (150 ms), and well before the tier's second.
    assert!(
        (0.145..0.6).contains(&gap),
        "the retry started {gap:.3} s after the failure"
    );
    s.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_random_delays_enqueued_in_random_order_all_run_on_time() {
    let s = setup().await;
    let mut rng = SmallRng::seed_from_u64(2026);
    let mut delays: Vec<Duration> = (0..200)
        .map(|_| Duration::from_millis(rng.random_range(0..=60_000)))
        .collect();
    delays.shuffle(&mut rng);
    let mut due = Vec::new();
    for delay in &delays {
        due.push(enqueue(&s, *delay).await);
    }
    let late = lateness(&s, &due, Duration::from_secs(90)).await;
    let worst = late.iter().copied().fold(f64::MIN, f64::max);
    let earliest = late.iter().copied().fold(f64::MAX, f64::min);
    eprintln!("200 delays: earliest {earliest:.3} s, latest {worst:.3} s after due");
    assert!(
        earliest > -0.005,
        "a task ran {earliest:.3} s before it was due"
    );
    // The late ones with their delay and their trips, to tell a slow tier from a slow worker.
    let late_ones: Vec<String> = {
        let starts = s.starts.0.lock().unwrap();
        late.iter()
            .zip(&due)
            .zip(&delays)
            .filter(|((l, _), _)| **l >= 1.0)
            .map(|((l, (id, _)), delay)| {
                format!(
                    "{l:.3} s late: delay {delay:?}, received {} times",
                    starts[id].1
                )
            })
            .collect()
    };
    assert!(
        late_ones.is_empty(),
        "a task ran {worst:.3} s after it was due: {late_ones:?}"
    );
    s.worker.stop().await;
}
