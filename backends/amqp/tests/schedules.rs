//! A schedule on the real RabbitMQ with the default delay tiers: a worker that runs the
//! scheduler too starts every tick on its second (ticks go out up to 2 s ahead, wait in the
//! tiers, and the worker holds the rest), never before.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Topology;
use ferriq::memory::MemoryStore;
use ferriq::testing::RunningWorker;
use ferriq::{Registry, State, TaskContext, Worker};

/// Each tick run: its second (`ferriq_tick`) and when it started (unix seconds).
#[derive(Default)]
struct Ticks(Mutex<Vec<(i64, f64)>>);

#[ferriq::task(name = "amqp.schedules.every_second", every = 1)]
async fn every_second(ticks: State<Arc<Ticks>>, ctx: TaskContext) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    if let Some(tick) = ctx.labels().get("ferriq_tick").and_then(|t| t.as_i64()) {
        ticks.0.lock().unwrap().push((tick, now));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tick_starts_on_its_second() {
    let topology = Topology::with_default_tiers();
    let ticks = Arc::new(Ticks::default());
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(topology.broker().await))
            .store(Arc::new(MemoryStore::new()))
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[every_second::NAME])
                    .unwrap(),
            )
            .state(Arc::clone(&ticks))
            .scheduler(true)
            .build()
            .unwrap(),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while ticks.0.lock().unwrap().len() < 12 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ticks run: {:?}",
            ticks.0.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.stop().await;
    let mut ran = ticks.0.lock().unwrap().clone();
    ran.sort_by_key(|(tick, _)| *tick);
    // The first tick is due the moment the scheduler starts: already a fraction past.
    let late: Vec<f64> = ran[1..].iter().map(|(t, at)| at - *t as f64).collect();
    let worst = late.iter().copied().fold(f64::MIN, f64::max);
    let earliest = late.iter().copied().fold(f64::MAX, f64::min);
    eprintln!(
        "{} ticks: earliest {earliest:.3} s, latest {worst:.3} s after due",
        late.len()
    );
    assert!(
        earliest > -0.005,
        "a tick ran {earliest:.3} s before it was due"
    );
    assert!(worst < 0.5, "a tick ran {worst:.3} s after it was due");
    let seconds: Vec<i64> = ran.iter().map(|(t, _)| *t).collect();
    assert!(
        seconds.windows(2).all(|w| w[1] == w[0] + 1),
        "one run per second, none missed: {seconds:?}"
    );
}
