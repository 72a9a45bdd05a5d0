//! A check program: one chord of `--members` members (default 2000) run by 3 worker processes
//! on RabbitMQ + Valkey (a queue and a key prefix of its own). One worker is SIGKILLed mid-run,
//! and another right after the last member completes — the one that completed it, possibly
//! before it sent the callback, unless that one already runs the callback (a kill mid-callback
//! would run it again: runs are at-least-once). The last line is counted from the store, not
//! from the workers:
//!
//! ```text
//! cargo run --release --example chord_check -- --members 2000
//! members=2000 member_results=2000 callback_runs=1 callback_results=1
//! ```
//!
//! `callback_runs` is how many runs of the callback the store granted (its claim's starts),
//! `callback_results` whether its result is stored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferriq::store::{ProgressStore, ResultStatus, ResultStore, WorkflowStore};
use ferriq::workflow::{callback_id, chord, member_id, Group};
use ferriq::{Client, Registry, Shutdown, TaskContext, TaskError, Worker};
use ferriq_amqp::AmqpBroker;
use ferriq_examples::{amqp_url, arg, redis_url};
use ferriq_valkey::ValkeyStore;
use tokio::process::{Child, Command};

/// A member: waits a little, then says which worker finished it and when.
#[ferriq::task(name = "check.chunk", max_attempts = 5)]
async fn chunk(index: u32) -> (u32, String, u128) {
    tokio::time::sleep(Duration::from_millis(15)).await;
    let worker = std::env::var("FERRIQ_WORKER_ID").unwrap_or_default();
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    (index, worker, at)
}

/// The callback: checks every member is there, in order.
#[ferriq::task(name = "check.assemble")]
async fn assemble(ctx: TaskContext) -> Result<u32, TaskError> {
    let parts: Vec<(u32, String, u128)> = ctx.group_values().await?;
    for (i, (index, _, _)) in parts.iter().enumerate() {
        if *index != i as u32 {
            return Err(TaskError::fatal(format!("member {i} came back as {index}")));
        }
    }
    Ok(parts.len() as u32)
}

async fn broker(tag: &str) -> AmqpBroker {
    AmqpBroker::builder(amqp_url())
        .exchange(format!("fqcheck.{tag}.x"))
        .queues([format!("fqcheck.{tag}")])
        .connect()
        .await
        .expect("RabbitMQ")
}

async fn store(tag: &str) -> ValkeyStore {
    ValkeyStore::builder(redis_url())
        .prefix(format!("fqcheck{tag}"))
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
                .only(&[chunk::NAME, assemble::NAME])
                .unwrap(),
        )
        .worker_id(std::env::var("FERRIQ_WORKER_ID").unwrap_or_default())
        .concurrency(16)
        // Short leases: a killed worker's claims are taken over within seconds.
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    worker.run(Shutdown::new()).await;
}

fn spawn(tag: &str, n: usize) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .args(["--role", "worker", "--tag", tag])
        .env("FERRIQ_WORKER_ID", format!("check-worker-{n}"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a worker")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if arg("--role", "check") == "worker" {
        worker_process(&arg("--tag", "")).await;
        return Ok(());
    }
    let members: u32 = arg("--members", "2000").parse()?;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let store = Arc::new(store(&tag).await);
    // Declares the topology before the workers consume.
    let client = Client::new(Arc::new(broker(&tag).await), store.clone());
    let mut workers: Vec<Option<Child>> = (0..3).map(|n| Some(spawn(&tag, n))).collect();
    let started = Instant::now();
    let handle = client
        .enqueue_chord(chord(
            Group::new((0..members).map(chunk::call)),
            assemble::call(),
        ))
        .await?;
    let group = handle.group().clone();
    eprintln!("chord {} of {members} members enqueued", group.id());

    // Mid-run: the first worker goes.
    while group.done().await? < members / 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(mut w) = workers[0].take() {
        w.start_kill()?;
        let _ = w.wait().await;
        eprintln!(
            "killed worker 0 with {} of {members} members done",
            group.done().await?
        );
    }
    // Right after the last member: the worker that completed it goes, perhaps before it sent
    // the callback (then a redelivered copy of that member sends it).
    while group.done().await? < members {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let ids: Vec<_> = (0..members).map(|i| member_id(group.id(), i)).collect();
    let last_worker = store
        .get_many(&ids)
        .await?
        .into_iter()
        .filter_map(|s| match s {
            ResultStatus::Ready(r) => {
                serde_json::from_value::<(u32, String, u128)>(r.return_value).ok()
            }
            _ => None,
        })
        .max_by_key(|(_, _, at)| *at)
        .map(|(_, w, _)| w);
    let mut victim = last_worker
        .and_then(|w| w.strip_prefix("check-worker-")?.parse::<usize>().ok())
        .filter(|n| workers[*n].is_some())
        .unwrap_or(1);
    // Frozen first, then looked at: a worker already running the callback is not the crash
    // this kill is for (a kill mid-callback runs it again, by design: runs are at-least-once),
    // so another one goes instead.
    let signal = |child: &Child, sig: &str| {
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
    };
    if let Some(w) = &workers[victim] {
        signal(w, "-STOP");
        let holder = store
            .claim_info(&callback_id(group.id()))
            .await?
            .map(|c| c.holder)
            .unwrap_or_default();
        signal(w, "-CONT");
        if holder == format!("check-worker-{victim}") {
            victim = (0..3)
                .find(|n| *n != victim && workers[*n].is_some())
                .unwrap_or(victim);
        }
    }
    if let Some(mut w) = workers[victim].take() {
        w.start_kill()?;
        let _ = w.wait().await;
        eprintln!("killed worker {victim} right after the last member");
    }
    // Keep three running for the rest.
    workers[0] = Some(spawn(&tag, 3));

    let assembled = handle.wait(Duration::from_secs(300)).await?;
    eprintln!(
        "callback assembled {assembled} members, {:.1} s after the enqueue",
        started.elapsed().as_secs_f64()
    );
    let member_results = store
        .get_many(&ids)
        .await?
        .into_iter()
        .filter(|s| matches!(s, ResultStatus::Ready(_)))
        .count();
    let callback = callback_id(group.id());
    let claim = store.claim_info(&callback).await?;
    if let Some(c) = &claim {
        eprintln!(
            "callback claim: {} run(s), {} failed attempt(s), {} taken over, last holder {}",
            c.starts, c.failures, c.takeovers, c.holder
        );
    }
    let callback_runs = claim.map_or(0, |c| c.starts);
    let callback_results = usize::from(matches!(
        store.get(&callback).await?,
        ResultStatus::Ready(_)
    ));
    for w in workers.iter_mut().flatten() {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
    let _ = store.purge_prefix().await;
    ferriq_examples::delete_amqp_topology(&format!("fqcheck.{tag}.x"), &format!("fqcheck.{tag}"))
        .await;
    println!(
        "members={members} member_results={member_results} callback_runs={callback_runs} callback_results={callback_results}"
    );
    Ok(())
}
