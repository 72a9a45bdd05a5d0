//! Workers add their counts to the store's history (what the dashboard's charts read): per
//! minute and task, successes, failures and run times; none when turned off.

use std::time::Duration;

use ferriq::store::{MinuteStats, OpsStore};
use ferriq::testing::TestEnv;
use ferriq::{Registry, TaskError};

#[ferriq::task(name = "hist.ok")]
async fn ok(n: u32) -> u32 {
    n
}

#[ferriq::task(name = "hist.fails", max_attempts = 1)]
async fn fails(n: u32) -> Result<u32, TaskError> {
    Err(TaskError::fatal(format!("no {n}")))
}

/// Runs 5 `hist.ok` and 2 `hist.fails` on a worker built by `tune`, stops it; the history,
/// and the environment (its store holds the finished-task index).
async fn run(
    tune: impl FnOnce(ferriq::WorkerBuilder) -> ferriq::WorkerBuilder,
) -> (Vec<MinuteStats>, TestEnv) {
    let env = TestEnv::new();
    let worker = env.spawn_worker(tune(
        env.worker().registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[ok::NAME, fails::NAME])
                .unwrap(),
        ),
    ));
    let mut handles = Vec::new();
    for n in 0..5 {
        handles.push(env.client.enqueue(ok::call(n)).await.unwrap());
    }
    let failing = [
        env.client.enqueue(fails::call(1)).await.unwrap(),
        env.client.enqueue(fails::call(2)).await.unwrap(),
    ];
    for h in &handles {
        h.wait(Duration::from_secs(10)).await.unwrap();
    }
    for h in &failing {
        assert!(h.wait(Duration::from_secs(10)).await.is_err());
    }
    // Stopping adds what the last round has not.
    worker.stop().await;
    let minute = env.clock.now_unix_ms() / 60_000;
    (
        env.store.history(minute - 5, minute + 1).await.unwrap(),
        env,
    )
}

fn total(history: &[MinuteStats], task: &str) -> MinuteStats {
    let mut sum = MinuteStats::new(0, task);
    for m in history.iter().filter(|m| m.task == task) {
        sum.add(m);
    }
    sum
}

#[tokio::test]
async fn a_worker_adds_its_results_and_run_times_per_task_and_minute() {
    let (history, env) = run(|b| b).await;
    let ok = total(&history, ok::NAME);
    assert_eq!((ok.succeeded, ok.failed, ok.runs()), (5, 0, 5));
    // A run that returns at once falls in the lowest buckets (5 ms, 10 ms, ...): on a loaded
    // machine its measured time is stretched past the first one's 5 ms now and then.
    let p95 = ok.quantile(0.95);
    assert!(
        matches!(p95, Some(q) if q <= 0.1),
        "fast runs fall in the lowest buckets: p95 {p95:?}"
    );
    let fails = total(&history, fails::NAME);
    assert_eq!((fails.succeeded, fails.failed, fails.runs()), (0, 2, 2));

    // The finished-task index: by name and outcome, newest first, limited.
    let now = env.clock.now_unix_ms();
    let found = env
        .store
        .finished(ok::NAME, None, now - 60_000, now, 10)
        .await
        .unwrap();
    assert_eq!(found.len(), 5);
    assert!(
        found.windows(2).all(|w| w[0].at_ms >= w[1].at_ms),
        "newest first"
    );
    assert_eq!(
        env.store
            .finished(ok::NAME, Some(true), 0, now, 10)
            .await
            .unwrap()
            .len(),
        0
    );
    let failed = env
        .store
        .finished(fails::NAME, Some(true), 0, now, 10)
        .await
        .unwrap();
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|f| f.failed && f.task == fails::NAME));
    assert_eq!(
        env.store
            .finished(ok::NAME, None, 0, now, 3)
            .await
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn turned_off_it_adds_nothing() {
    let (history, env) = run(|b| b.history(false)).await;
    assert!(history.is_empty(), "{history:?}");
    let found = env
        .store
        .finished(ok::NAME, None, 0, u64::MAX, 10)
        .await
        .unwrap();
    assert!(found.is_empty());
}

/// A worker holds finished tasks for the index only until a few thousand wait: they reach the
/// store well before the next ten-second round, so a busy worker's memory stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_tasks_go_to_the_index_once_a_few_thousand_wait() {
    let env = TestEnv::new();
    let worker = env.spawn_worker(
        env.worker().registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[ok::NAME])
                .unwrap(),
        ),
    );
    let started = tokio::time::Instant::now();
    let mut handles = Vec::new();
    for n in 0..2_100 {
        handles.push(env.client.enqueue(ok::call(n)).await.unwrap());
    }
    for h in &handles {
        h.wait(Duration::from_secs(10)).await.unwrap();
    }
    let deadline = started + Duration::from_secs(8);
    loop {
        let found = env
            .store
            .finished(ok::NAME, None, 0, u64::MAX, 5_000)
            .await
            .unwrap();
        if found.len() >= 2_000 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} indexed within 8 s of the first enqueue (rounds are every 10 s)",
            found.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop().await;
}
