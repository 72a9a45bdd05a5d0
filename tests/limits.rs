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
    // Each task is received at most three times: its turn given, the last second before it,
    // its run.
    let received = h.broker.stats().received;
    assert!(received <= 300, "{received} receives for 100 tasks");
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

#[ferriq::task(name = "limits.report", unique_for = 60)]
async fn report(starts: State<Arc<Starts>>, customer: String) -> String {
    starts
        .0
        .lock()
        .unwrap()
        .push((Instant::now(), 1, customer.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    customer
}

#[tokio::test(start_paused = true)]
async fn a_thousand_concurrent_enqueues_of_one_call_run_it_once() {
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let w = h.start(h.worker(&[report::NAME]).state(Arc::clone(&starts)));
    let enqueues = (0..1000).map(|_| {
        let client = h.client.clone();
        tokio::spawn(async move { report::kiq(&client, "acme".into()).await.unwrap() })
    });
    let handles = futures_util::future::join_all(enqueues).await;
    let first = handles[0].as_ref().unwrap().task_id().clone();
    assert!(handles
        .iter()
        .all(|h| *h.as_ref().unwrap().task_id() == first));
    // Another customer is another call.
    let other = report::kiq(&h.client, "globex".into()).await.unwrap();
    assert_ne!(*other.task_id(), first);
    for handle in handles {
        assert_eq!(handle.unwrap().wait(LONG).await.unwrap(), "acme");
    }
    other.wait(LONG).await.unwrap();
    assert_eq!(h.broker.stats().published, 2, "sent once per call");
    // The outcome is stored: the key is free, and the same call is a new task.
    let again = report::kiq(&h.client, "acme".into()).await.unwrap();
    assert_ne!(*again.task_id(), first);
    again.wait(LONG).await.unwrap();
    assert_eq!(starts.0.lock().unwrap().len(), 3);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_window_key_answers_until_its_window_ends() {
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let w = h.start(h.worker(&[report::NAME]).state(Arc::clone(&starts)));
    let call = || {
        report::call("acme".into()).with_dedup_key(
            "nightly-acme",
            Duration::from_secs(30),
            ferriq::task::Dedup::Window,
        )
    };
    let first = h.client.enqueue(call()).await.unwrap();
    first.wait(LONG).await.unwrap();
    // Finished, but within its window: the same answer, nothing sent.
    let second = h.client.enqueue(call()).await.unwrap();
    assert_eq!(second.task_id(), first.task_id());
    tokio::time::sleep(Duration::from_secs(31)).await;
    let third = h.client.enqueue(call()).await.unwrap();
    assert_ne!(third.task_id(), first.task_id());
    third.wait(LONG).await.unwrap();
    assert_eq!(starts.0.lock().unwrap().len(), 2);
    w.stop().await;
}

/// Runs in progress now and the most at once, per key.
#[derive(Default)]
struct Running(Mutex<std::collections::HashMap<String, (usize, usize)>>);

impl Running {
    fn enter(&self, key: &str) {
        let mut all = self.0.lock().unwrap();
        let (now, most) = all.entry(key.to_owned()).or_default();
        *now += 1;
        *most = (*most).max(*now);
    }
    fn leave(&self, key: &str) {
        self.0.lock().unwrap().get_mut(key).unwrap().0 -= 1;
    }
    fn most(&self, key: &str) -> usize {
        self.0.lock().unwrap().get(key).map_or(0, |e| e.1)
    }
}

#[ferriq::task(name = "limits.export", concurrency = 4)]
async fn export(
    running: State<Arc<Running>>,
    starts: State<Arc<Starts>>,
    ctx: TaskContext,
    n: u32,
) -> u32 {
    running.enter("all");
    starts
        .0
        .lock()
        .unwrap()
        .push((Instant::now(), ctx.attempt(), String::new()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.leave("all");
    n
}

#[ferriq::task(
    name = "limits.per_tenant_export",
    concurrency = 1,
    concurrency_key = "tenant"
)]
async fn per_tenant_export(running: State<Arc<Running>>, tenant: String) -> String {
    running.enter(&tenant);
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.leave(&tenant);
    tenant
}

#[tokio::test(start_paused = true)]
async fn no_more_than_four_run_at_once_across_three_workers() {
    let h = Harness::new();
    let running = Arc::new(Running::default());
    let starts = Arc::new(Starts::default());
    let workers: Vec<_> = (0..3)
        .map(|_| {
            h.start(
                h.worker(&[export::NAME])
                    .state(Arc::clone(&running))
                    .state(Arc::clone(&starts)),
            )
        })
        .collect();
    let begin = Instant::now();
    let handles = h
        .client
        .enqueue_batch((0..40).map(export::call))
        .await
        .unwrap();
    for (i, handle) in handles.iter().enumerate() {
        assert_eq!(handle.wait(LONG).await.unwrap(), i as u32);
    }
    assert_eq!(running.most("all"), 4);
    assert!(
        starts.0.lock().unwrap().iter().all(|s| s.1 == 1),
        "no attempt spent waiting"
    );
    // 40 runs of 1 s, 4 at a time: 10 s, and not much more.
    let took = begin.elapsed();
    assert!(took < Duration::from_secs(16), "{took:?}");
    let received = h.broker.stats().received;
    assert!(received <= 200, "{received} receives for 40 tasks");
    for w in workers {
        w.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn one_tenants_backlog_leaves_another_tenant_its_slot() {
    let h = Harness::new();
    let running = Arc::new(Running::default());
    let w = h.start(
        h.worker(&[per_tenant_export::NAME])
            .state(Arc::clone(&running)),
    );
    let backlog = h
        .client
        .enqueue_batch((0..50).map(|_| per_tenant_export::call("acme".into())))
        .await
        .unwrap();
    let sent = Instant::now();
    let other = per_tenant_export::kiq(&h.client, "globex".into())
        .await
        .unwrap();
    other.wait(LONG).await.unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    for handle in &backlog {
        handle.wait(LONG).await.unwrap();
    }
    assert_eq!(running.most("acme"), 1);
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_whose_worker_died_frees_itself_within_its_lease() {
    use ferriq::store::{FlowStore, SlotDecision};
    let h = Harness::new();
    let store = h.memory();
    let (dead, next) = (
        ferriq::wire::TaskId::random(),
        ferriq::wire::TaskId::random(),
    );
    let lease = Duration::from_secs(3);
    assert_eq!(
        store.acquire_slot("l", &dead, 1, lease).await.unwrap(),
        SlotDecision::Held
    );
    // Its worker dies: no renewal, no release.
    assert!(matches!(
        store.acquire_slot("l", &next, 1, lease).await.unwrap(),
        SlotDecision::Wait(_)
    ));
    tokio::time::sleep(lease + Duration::from_millis(10)).await;
    assert_eq!(
        store.acquire_slot("l", &next, 1, lease).await.unwrap(),
        SlotDecision::Held
    );
}

#[ferriq::task(name = "limits.tunable", concurrency = 4)]
async fn tunable(running: State<Arc<Running>>, batch: String) -> String {
    running.enter(&batch);
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.leave(&batch);
    batch
}

#[ferriq::task(name = "limits.free")]
async fn free(starts: State<Arc<Starts>>, n: u32) -> u32 {
    starts
        .0
        .lock()
        .unwrap()
        .push((Instant::now(), 1, String::new()));
    n
}

async fn run_batch(h: &Harness, batch: &str, n: usize) {
    let handles = h
        .client
        .enqueue_batch((0..n).map(|_| tunable::call(batch.into())))
        .await
        .unwrap();
    for handle in handles {
        handle.wait(LONG).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_limit_set_at_run_time_applies_within_the_refresh_and_is_listed() {
    use ferriq::store::{LimitOverride, LimiterKind, OVERRIDES_REFRESH};
    let h = Harness::new();
    let running = Arc::new(Running::default());
    let workers: Vec<_> = (0..2)
        .map(|_| h.start(h.worker(&[tunable::NAME]).state(Arc::clone(&running))))
        .collect();
    run_batch(&h, "declared", 12).await;
    assert_eq!(running.most("declared"), 4);

    let limits = h.client.limits();
    let one = LimitOverride::default().concurrency(1);
    limits.set(tunable::NAME, None, one).await.unwrap();
    tokio::time::sleep(OVERRIDES_REFRESH + Duration::from_millis(100)).await;
    run_batch(&h, "overridden", 6).await;
    assert_eq!(running.most("overridden"), 1);
    // Listed: the limiter, the limit applied (set), nothing running or waiting now.
    tokio::time::sleep(OVERRIDES_REFRESH).await;
    let listed = limits.list().await.unwrap();
    let view = listed
        .iter()
        .find(|l| l.task == tunable::NAME && l.kind == LimiterKind::Concurrency)
        .expect("the limiter is listed");
    assert_eq!(
        (
            view.limit.as_str(),
            view.overridden,
            view.used,
            view.key.clone()
        ),
        ("1", true, 0, None)
    );
    assert_eq!(limits.overrides().await.unwrap()[0].limits, one);

    assert!(limits.reset(tunable::NAME, None).await.unwrap());
    assert!(!limits.reset(tunable::NAME, None).await.unwrap());
    tokio::time::sleep(OVERRIDES_REFRESH + Duration::from_millis(100)).await;
    run_batch(&h, "reset", 12).await;
    assert_eq!(running.most("reset"), 4);
    for w in workers {
        w.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_that_declares_no_limit_takes_one_set_at_run_time() {
    use ferriq::store::LimitOverride;
    use ferriq::task::Rate;
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let rate = LimitOverride::default().rate(Rate::parse("5/s").unwrap());
    // Set before the worker starts: it applies from the first delivery.
    h.client.limits().set(free::NAME, None, rate).await.unwrap();
    let w = h.start(h.worker(&[free::NAME]).state(Arc::clone(&starts)));
    let begin = Instant::now();
    let handles = h
        .client
        .enqueue_batch((0..20).map(free::call))
        .await
        .unwrap();
    for handle in handles {
        handle.wait(LONG).await.unwrap();
    }
    assert!(starts.most_in(Duration::from_secs(1)) <= 5);
    assert!(
        begin.elapsed() >= Duration::from_secs(3),
        "{:?}",
        begin.elapsed()
    );
    // Bad input is refused, and names what to give.
    let err = h
        .client
        .limits()
        .set(free::NAME, None, LimitOverride::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("rate or a concurrency"), "{err}");
    w.stop().await;
}

#[ferriq::task(
    name = "limits.reindex",
    unique_for = 2,
    dedup = "debounce",
    dedup_key = "doc"
)]
async fn reindex(starts: State<Arc<Starts>>, doc: String, version: u32) -> u32 {
    starts
        .0
        .lock()
        .unwrap()
        .push((Instant::now(), version, doc));
    version
}

#[tokio::test(start_paused = true)]
async fn a_debounced_task_runs_once_when_its_key_is_quiet_with_the_latest_arguments() {
    let h = Harness::new();
    let starts = Arc::new(Starts::default());
    let w = h.start(h.worker(&[reindex::NAME]).state(Arc::clone(&starts)));
    let begin = Instant::now();
    let mut edits = Vec::new();
    for version in 1..=4 {
        edits.push(reindex::kiq(&h.client, "a".into(), version).await.unwrap());
        tokio::time::sleep(Duration::from_millis(900)).await;
    }
    let other = reindex::kiq(&h.client, "b".into(), 1).await.unwrap();
    // One task for document a, whichever edit a caller holds; another for b.
    assert!(edits.iter().all(|e| e.task_id() == edits[0].task_id()));
    assert_ne!(other.task_id(), edits[0].task_id());
    for edit in &edits {
        assert_eq!(
            edit.wait(LONG).await.unwrap(),
            4,
            "the latest arguments win"
        );
    }
    assert_eq!(other.wait(LONG).await.unwrap(), 1);
    let runs = starts.0.lock().unwrap().clone();
    let of_a: Vec<_> = runs.iter().filter(|r| r.2 == "a").collect();
    assert_eq!(of_a.len(), 1, "{runs:?}");
    // The last edit at 2.7 s, then 2 s of quiet.
    let ran_at = of_a[0].0 - begin;
    assert!(
        ran_at >= Duration::from_millis(4700) && ran_at < Duration::from_millis(5200),
        "{ran_at:?}"
    );
    // Every enqueue sends a copy (none depends on another's publish); the earlier ones are
    // acked unrun.
    assert_eq!(h.broker.stats().published, 5);
    // Once it ran, an edit starts a new debounce.
    let later = reindex::kiq(&h.client, "a".into(), 5).await.unwrap();
    assert_ne!(later.task_id(), edits[0].task_id());
    assert_eq!(later.wait(LONG).await.unwrap(), 5);
    w.stop().await;
}
