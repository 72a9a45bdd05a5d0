//! Rate limits on the memory backends with paused time: no sliding window holds more starts
//! than the limit, across several workers; a task over the limit spends no attempt; one key's
//! backlog does not hold another key's task back.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Harness;
use ferriq::{State, TaskContext};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(600);

/// Start instants, and the attempt each start was.
#[derive(Default)]
struct Starts(Mutex<Vec<(Instant, u32, String)>>);

impl Starts {
    /// The most starts in any window of `window` (sliding, from each start).
    fn most_in(&self, window: Duration) -> usize {
        let mut at: Vec<Instant> = self.0.lock().unwrap().iter().map(|s| s.0).collect();
        at.sort();
        (0..at.len())
            .map(|i| at[i..].iter().take_while(|t| **t < at[i] + window).count())
            .max()
            .unwrap_or(0)
    }
}

#[ferriq::task(name = "limits.call_api", rate = "10/s")]
async fn call_api(starts: State<Arc<Starts>>, ctx: TaskContext, n: u32) -> u32 {
    starts
        .0
        .lock()
        .unwrap()
        .push((Instant::now(), ctx.attempt(), String::new()));
    n
}

#[ferriq::task(name = "limits.per_tenant", rate = "5/s", rate_key = "tenant")]
async fn per_tenant(starts: State<Arc<Starts>>, tenant: String, n: u32) -> u32 {
    starts.0.lock().unwrap().push((Instant::now(), 1, tenant));
    n
}

#[tokio::test(start_paused = true)]
async fn no_second_holds_more_starts_than_the_limit_across_three_workers() {
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let workers: Vec<_> = (0..3)
        .map(|_| h.start(h.worker(&[call_api::NAME]).state(Arc::clone(&starts))))
        .collect();
    let begin = Instant::now();
    let handles = h
        .client
        .enqueue_batch((0..100).map(call_api::call))
        .await
        .unwrap();
    for (i, handle) in handles.iter().enumerate() {
        assert_eq!(handle.wait(LONG).await.unwrap(), i as u32);
    }
    let took = begin.elapsed();
    assert!(
        starts.most_in(Duration::from_secs(1)) <= 10,
        "over the limit"
    );
    // The first 10 at once, then 10 a second: about 9 s for 100, not much more.
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(12),
        "{took:?}"
    );
    // Waiting for a turn is not an attempt.
    assert!(starts.0.lock().unwrap().iter().all(|s| s.1 == 1));
    // Each task was received about twice (its turn given, then run); a few three times.
    let received = h.broker.stats().received;
    assert!(received <= 250, "{received} receives for 100 tasks");
    for w in workers {
        w.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn one_tenants_backlog_does_not_hold_another_tenants_task_back() {
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let w = h.start(h.worker(&[per_tenant::NAME]).state(Arc::clone(&starts)));
    let backlog = h
        .client
        .enqueue_batch((0..200).map(|n| per_tenant::call("acme".into(), n)))
        .await
        .unwrap();
    let sent = Instant::now();
    let other = per_tenant::kiq(&h.client, "globex".into(), 7)
        .await
        .unwrap();
    assert_eq!(other.wait(LONG).await.unwrap(), 7);
    let waited = sent.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "behind the backlog for {waited:?}"
    );
    for handle in &backlog {
        handle.wait(LONG).await.unwrap();
    }
    let acme = Starts(Mutex::new(
        starts
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.2 == "acme")
            .cloned()
            .collect(),
    ));
    assert!(acme.most_in(Duration::from_secs(1)) <= 5);
    w.stop().await;
}
