//! A check program: 3 worker processes, each running a scheduler, on RabbitMQ + Valkey (a
//! queue and a key prefix of its own), with a 1-second schedule that catches up missed ticks.
//! At half time the current leader is SIGKILLed; another takes over and catches up. The last
//! line is counted from the store, not from the schedulers:
//!
//! ```text
//! cargo run --release --example schedule_check -- --seconds 40
//! ticks=38 runs=38 results=38 duplicates=0 missed=0
//! ```
//!
//! `ticks` are the whole seconds from the first tick to two seconds before the end, `runs` the
//! runs the store granted for them (their claims' starts), `results` the ticks with a stored
//! result, `duplicates` the runs beyond one per tick, `missed` the ticks without a result.

use std::sync::Arc;
use std::time::Duration;

use ferriq::schedule::ScheduleSpec;
use ferriq::store::{ProgressStore, ResultStatus, ResultStore, ScheduleStore};
use ferriq::{Registry, Shutdown, Worker};
use ferriq_amqp::AmqpBroker;
use ferriq_examples::{amqp_url, arg, redis_url};
use ferriq_valkey::ValkeyStore;
use tokio::process::{Child, Command};

/// Every second; missed ticks are caught up (up to 1000).
#[ferriq::task(
    name = "check.schedule.tick",
    every = 1,
    missed = "catch_up",
    catch_up_max = 1000
)]
async fn tick() {}

async fn broker(tag: &str) -> AmqpBroker {
    AmqpBroker::builder(amqp_url())
        .exchange(format!("fqsched.{tag}.x"))
        .queues([format!("fqsched.{tag}")])
        .connect()
        .await
        .expect("RabbitMQ")
}

async fn store(tag: &str) -> ValkeyStore {
    ValkeyStore::builder(redis_url())
        .prefix(format!("fqsched{tag}"))
        .result_ttl(Some(Duration::from_secs(3600)))
        .claim_ttl(Duration::from_secs(3600))
        .connect()
        .await
        .expect("Redis")
}

async fn worker_process(tag: &str) {
    let worker = Worker::builder()
        .broker(Arc::new(broker(tag).await))
        .store(Arc::new(store(tag).await))
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[tick::NAME])
                .unwrap(),
        )
        .worker_id(std::env::var("FERRIQ_WORKER_ID").unwrap_or_default())
        .scheduler(true)
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    worker.run(Shutdown::new()).await;
}

fn spawn(tag: &str, n: usize) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .args(["--role", "worker", "--tag", tag])
        .env("FERRIQ_WORKER_ID", format!("sched-worker-{n}"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a worker")
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if arg("--role", "check") == "worker" {
        worker_process(&arg("--tag", "")).await;
        return Ok(());
    }
    let seconds: i64 = arg("--seconds", "40").parse()?;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let store = store(&tag).await;
    let _declare = broker(&tag).await;
    let spec = ferriq::schedule::static_schedules()?
        .into_iter()
        .find(|s| s.id == tick::NAME)
        .expect("declared on the task");
    let mut workers: Vec<Option<Child>> = (0..3).map(|n| Some(spawn(&tag, n))).collect();

    // The first tick run marks the start.
    let first = loop {
        if let Some(t) = store.last_tick(&spec.id).await? {
            break t - 2;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let end = first + seconds;
    let half = first + seconds / 2;
    while unix_now() < half {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = store.leader().await?.unwrap_or_default();
    let victim = leader
        .strip_prefix("sched-worker-")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    if let Some(mut w) = workers[victim].take() {
        w.start_kill()?;
        let _ = w.wait().await;
        eprintln!("killed the leader, {leader}, at half time");
    }
    while unix_now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Ticks up to two seconds before the end, with time for the last to run.
    let last = end - 2;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let new_leader = store.leader().await?.unwrap_or_default();
    eprintln!("leader at the end: {new_leader}");

    let counted = count(&store, &spec, first, last).await?;
    for w in workers.iter_mut().flatten() {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
    let _ = store.purge_prefix().await;
    ferriq_examples::delete_amqp_topology(&format!("fqsched.{tag}.x"), &format!("fqsched.{tag}"))
        .await;
    println!(
        "ticks={} runs={} results={} duplicates={} missed={}",
        counted.ticks,
        counted.runs,
        counted.results,
        counted.runs.saturating_sub(counted.results),
        counted.ticks - counted.results
    );
    Ok(())
}

struct Counted {
    ticks: u64,
    runs: u64,
    results: u64,
}

async fn count(
    store: &ValkeyStore,
    spec: &ScheduleSpec,
    first: i64,
    last: i64,
) -> Result<Counted, ferriq::store::StoreError> {
    let mut c = Counted {
        ticks: 0,
        runs: 0,
        results: 0,
    };
    for t in first..=last {
        let id = spec.tick_id(t);
        c.ticks += 1;
        c.runs += u64::from(store.claim_info(&id).await?.map_or(0, |i| i.starts));
        c.results += u64::from(matches!(store.get(&id).await?, ResultStatus::Ready(_)));
    }
    Ok(c)
}
