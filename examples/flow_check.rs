//! A check program for flow control: 3 worker processes on RabbitMQ + Valkey (a queue and a
//! key prefix of its own), one SIGKILLed while it holds concurrency slots. Every figure comes
//! from the start and end times the task bodies return as their results, read from the store —
//! not from ferriq's counters:
//!
//! ```text
//! cargo run --release -p ferriq-examples --example flow_check
//! rate_limit=50 max_starts_1s=50 concurrency_limit=4 max_running=4 slot_recovery_s=3.1 fair_wait_s=0.4 dedup_runs=1 lost=0
//! ```
//!
//! - `max_starts_1s`: the most starts of a `rate = "50/s"` task in any sliding second.
//! - `max_running`: the most runs of a `concurrency = 4` task at once, from their intervals.
//! - `slot_recovery_s`: from the SIGKILL to the first moment 4 runs overlap again (the killed
//!   worker's slots come free when their lease, 3 s here, ends).
//! - `fair_wait_s`: how long one tenant's single task waited behind another tenant's backlog of
//!   `--backlog` tasks (default 5,000) under a per-tenant rate limit.
//! - `dedup_runs`: runs of one call enqueued 1,000 times at once with `unique_for`.
//! - `lost`: tasks without a result at the end.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferriq::store::{ProgressStore, ResultStatus, WorkflowStore};
use ferriq::wire::TaskId;
use ferriq::{Client, Registry, Shutdown, Worker};
use ferriq_amqp::AmqpBroker;
use ferriq_examples::{amqp_url, arg, redis_url};
use ferriq_valkey::ValkeyStore;
use tokio::process::{Child, Command};

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A call of a rate-limited API.
#[ferriq::task(name = "flow.rated", rate = "50/s")]
async fn rated(n: u32) -> (u32, u64) {
    (n, now_us())
}

/// An export no more than 4 of which may run at once.
#[ferriq::task(name = "flow.slotted", concurrency = 4, max_attempts = 5)]
async fn slotted(n: u32) -> (u32, u64, u64) {
    let start = now_us();
    tokio::time::sleep(Duration::from_millis(200)).await;
    (n, start, now_us())
}

/// A tenant's call, limited per tenant.
#[ferriq::task(name = "flow.tenant", rate = "500/s", rate_key = "tenant")]
async fn tenant_call(tenant: String) -> (String, u64) {
    (tenant, now_us())
}

/// A report that must not run twice for one customer at once.
#[ferriq::task(name = "flow.report", unique_for = 60)]
async fn report(customer: String) -> (String, u64) {
    tokio::time::sleep(Duration::from_millis(100)).await;
    (customer, now_us())
}

const TASKS: [&str; 4] = [rated::NAME, slotted::NAME, tenant_call::NAME, report::NAME];

async fn broker(tag: &str) -> AmqpBroker {
    AmqpBroker::builder(amqp_url())
        .exchange(format!("fqflow.{tag}.x"))
        .queues([format!("fqflow.{tag}")])
        .connect()
        .await
        .expect("RabbitMQ")
}

async fn store(tag: &str) -> ValkeyStore {
    ValkeyStore::builder(redis_url())
        .prefix(format!("fqflow{tag}"))
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
        .registry(Registry::from_inventory().unwrap().only(&TASKS).unwrap())
        .worker_id(std::env::var("FERRIQ_WORKER_ID").unwrap_or_default())
        .concurrency(32)
        // Short leases: a killed worker's claims and slots come free within seconds.
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    worker.run(Shutdown::new()).await;
}

fn spawn(tag: &str, n: usize) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .args(["--role", "worker", "--tag", tag])
        .env("FERRIQ_WORKER_ID", format!("flow-worker-{n}"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a worker")
}

/// The results of `ids` still missing, and the values of those stored.
async fn results<T: serde::de::DeserializeOwned>(
    store: &ValkeyStore,
    ids: &[TaskId],
) -> Result<(usize, Vec<T>), Box<dyn std::error::Error>> {
    let mut missing = 0;
    let mut values = Vec::new();
    for status in store.get_many(ids).await? {
        match status {
            ResultStatus::Ready(r) => values.push(serde_json::from_value(r.return_value)?),
            _ => missing += 1,
        }
    }
    Ok((missing, values))
}

/// Waits until every one of `ids` has a result, up to `limit`.
async fn settled(store: &ValkeyStore, ids: &[TaskId], limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        let stored = store
            .get_many(ids)
            .await
            .map(|all| {
                all.iter()
                    .filter(|s| matches!(s, ResultStatus::Ready(_)))
                    .count()
            })
            .unwrap_or(0);
        if stored == ids.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if arg("--role", "check") == "worker" {
        worker_process(&arg("--tag", "")).await;
        return Ok(());
    }
    let backlog: u32 = arg("--backlog", "5000").parse()?;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let store = Arc::new(store(&tag).await);
    let client = Client::new(Arc::new(broker(&tag).await), store.clone());
    let mut workers: Vec<Child> = (0..3).map(|n| spawn(&tag, n)).collect();

    // Deduplication: 1,000 enqueues of one call at once.
    let enqueues = (0..1000).map(|_| {
        let client = client.clone();
        tokio::spawn(async move { report::kiq(&client, "acme".into()).await })
    });
    let mut report_ids: Vec<TaskId> = Vec::new();
    for handle in futures_util::future::join_all(enqueues).await {
        let id = handle??.task_id().clone();
        if !report_ids.contains(&id) {
            report_ids.push(id);
        }
    }
    // The three limits at once.
    let rated_ids: Vec<TaskId> = client
        .enqueue_batch((0..250).map(rated::call))
        .await?
        .iter()
        .map(|h| h.task_id().clone())
        .collect();
    let slotted_ids: Vec<TaskId> = client
        .enqueue_batch((0..150).map(slotted::call))
        .await?
        .iter()
        .map(|h| h.task_id().clone())
        .collect();
    let mut tenant_ids: Vec<TaskId> = Vec::new();
    for chunk in (0..backlog).collect::<Vec<_>>().chunks(1000) {
        let calls = chunk.iter().map(|_| tenant_call::call("acme".into()));
        tenant_ids.extend(
            client
                .enqueue_batch(calls)
                .await?
                .iter()
                .map(|h| h.task_id().clone()),
        );
    }
    let other_sent = now_us();
    let other = tenant_call::kiq(&client, "globex".into()).await?;
    tenant_ids.push(other.task_id().clone());

    // A worker goes while the slotted tasks run (each worker holds some of the 4 slots).
    tokio::time::sleep(Duration::from_secs(2)).await;
    workers[0].start_kill()?;
    let _ = workers[0].wait().await;
    let killed_at = now_us();
    eprintln!("killed worker 0");
    workers.push(spawn(&tag, 3));

    let mut all: Vec<TaskId> = Vec::new();
    all.extend(report_ids.iter().cloned());
    all.extend(rated_ids.iter().cloned());
    all.extend(slotted_ids.iter().cloned());
    all.extend(tenant_ids.iter().cloned());
    settled(&store, &all, Duration::from_secs(600)).await;

    let (lost_rated, rated): (usize, Vec<(u32, u64)>) = results(&store, &rated_ids).await?;
    let mut starts: Vec<u64> = rated.iter().map(|r| r.1).collect();
    starts.sort();
    let max_starts_1s = (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|t| **t < starts[i] + 1_000_000)
                .count()
        })
        .max()
        .unwrap_or(0);

    let (lost_slotted, slotted): (usize, Vec<(u32, u64, u64)>) =
        results(&store, &slotted_ids).await?;
    let mut edges: Vec<(u64, i64)> = slotted
        .iter()
        .flat_map(|(_, start, end)| [(*start, 1), (*end, -1)])
        .collect();
    edges.sort_by_key(|(at, delta)| (*at, *delta));
    let (mut running, mut max_running, mut recovered_at) = (0i64, 0i64, None);
    for (at, delta) in &edges {
        running += delta;
        max_running = max_running.max(running);
        if running == 4 && *at > killed_at && recovered_at.is_none() {
            recovered_at = Some(*at);
        }
    }
    let slot_recovery_s = recovered_at.map_or(f64::NAN, |at| (at - killed_at) as f64 / 1e6);

    let (lost_tenant, tenants): (usize, Vec<(String, u64)>) = results(&store, &tenant_ids).await?;
    let fair_wait_s = tenants
        .iter()
        .find(|(t, _)| t == "globex")
        .map_or(f64::NAN, |(_, at)| {
            at.saturating_sub(other_sent) as f64 / 1e6
        });

    let dedup_runs = match report_ids.as_slice() {
        [only] => store.claim_info(only).await?.map_or(0, |c| c.starts),
        more => more.len() as u32 * 1000,
    };
    let (lost_report, _): (usize, Vec<(String, u64)>) = results(&store, &report_ids).await?;

    for w in workers.iter_mut() {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
    let _ = store.purge_prefix().await;
    ferriq_examples::delete_amqp_topology(&format!("fqflow.{tag}.x"), &format!("fqflow.{tag}"))
        .await;
    println!(
        "rate_limit=50 max_starts_1s={max_starts_1s} concurrency_limit=4 max_running={max_running} \
         slot_recovery_s={slot_recovery_s:.1} fair_wait_s={fair_wait_s:.1} dedup_runs={dedup_runs} \
         lost={}",
        lost_rated + lost_slotted + lost_tenant + lost_report
    );
    Ok(())
}
