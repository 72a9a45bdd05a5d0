//! Operations on the memory backends: dead letters listed, redriven, purged; workers listed;
//! a task inspected; a stale worker from before a redrive fenced off.

#[path = "support/ops.rs"]
mod ops_suite;

use std::sync::Arc;
use std::time::Duration;

use ferriq::testing::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_redriven_and_purged() {
    let env = TestEnv::new();
    let healed = Arc::new(ops_suite::Healed::default());
    let worker = ops_suite::worker(
        Arc::new(env.broker.clone()),
        Arc::new(env.store.clone()),
        healed.clone(),
    );
    ops_suite::dead_letters_are_listed_redriven_and_purged(&env.client, "taskiq", healed, true)
        .await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_report_themselves_and_their_runs() {
    let env = TestEnv::new();
    let healed = Arc::new(ops_suite::Healed::default());
    let worker = ops_suite::worker(
        Arc::new(env.broker.clone()),
        Arc::new(env.store.clone()),
        healed,
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let workers = loop {
        let w = env.client.ops().workers().await.unwrap();
        if !w.is_empty() {
            break w;
        }
        assert!(tokio::time::Instant::now() < deadline, "no worker listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(workers.len(), 1);
    let w = &workers[0];
    assert_eq!(w.pid, std::process::id());
    assert_eq!(w.lanes, ["taskiq"]);
    assert_eq!(w.concurrency, 32);
    worker.stop().await;
    assert!(
        env.client.ops().workers().await.unwrap().is_empty(),
        "a stopped worker leaves"
    );
}

/// Who runs `ops.stale`, whether its runs succeed yet, and a gate that holds them.
struct Me {
    name: &'static str,
    ok: std::sync::atomic::AtomicBool,
    gate: Option<tokio::sync::Semaphore>,
    entered: tokio::sync::Notify,
}

#[ferriq::task(name = "ops.stale", max_attempts = 1)]
async fn stale(me: ferriq::State<Arc<Me>>) -> Result<String, ferriq::TaskError> {
    me.entered.notify_one();
    if let Some(gate) = &me.gate {
        let _ = gate.acquire().await;
    }
    if !me.ok.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ferriq::TaskError::fatal("not yet"));
    }
    Ok(me.name.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_worker_from_before_a_redrive_cannot_write_over_the_new_result() {
    use ferriq::broker::{Broker, OutgoingMessage};
    use ferriq::dead_letters::DeadFilter;
    let env = TestEnv::new();
    let me = |name, gate: bool, ok| {
        Arc::new(Me {
            name,
            ok: std::sync::atomic::AtomicBool::new(ok),
            gate: gate.then(|| tokio::sync::Semaphore::new(0)),
            entered: tokio::sync::Notify::new(),
        })
    };
    let (a, b) = (me("A", true, true), me("B", false, false));
    let registry = || {
        ferriq::Registry::from_inventory()
            .unwrap()
            .only(&[stale::NAME])
            .unwrap()
    };
    // A: a long lease, so it does not heartbeat during the test: it only finds out it was
    // taken over when it tries to write.
    let worker_a = env.spawn_worker(
        env.worker()
            .registry(registry())
            .state(Arc::clone(&a))
            // Busy with the held run: every other copy goes to B.
            .concurrency(1)
            .lease(Duration::from_secs(600)),
    );
    let msg = stale::call().into_message().unwrap();
    let id = msg.task_id.clone();
    env.broker
        .publish(vec![OutgoingMessage::from_message(&msg).unwrap()])
        .await
        .unwrap();
    a.entered.notified().await;
    // A pauses (its run is held); its lease runs out; a copy of the message goes to B, which
    // takes the task over and fails it for good: dead-lettered with an error result.
    assert!(env.store.expire_lease(&id));
    let worker_b = env.spawn_worker(env.worker().registry(registry()).state(Arc::clone(&b)));
    env.broker
        .publish(vec![OutgoingMessage::from_message(&msg).unwrap()])
        .await
        .unwrap();
    let handle = env.client.handle::<String>(id.clone());
    assert!(matches!(
        handle.wait(Duration::from_secs(10)).await,
        Err(ferriq::WaitError::Failed(_))
    ));
    // Redriven: B now succeeds.
    b.ok.store(true, std::sync::atomic::Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let report = env
            .client
            .ops()
            .redrive("taskiq", &DeadFilter::all().task_id(id.clone()), |_| {})
            .await
            .unwrap();
        if report.redriven == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not parked yet");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(handle.wait(Duration::from_secs(10)).await.unwrap(), "B");
    // A resumes and tries to write: fenced off.
    a.gate.as_ref().unwrap().add_permits(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while worker_a
        .worker
        .stats()
        .count(ferriq::worker::Outcome::Stale)
        == 0
    {
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
