//! The command against processes that die: a redrive killed with SIGKILL midway and run
//! again (every dead letter runs exactly once more, none lost), and `ferriq workers` listing
//! three worker processes with their runs, one of which is killed and disappears.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::Setup;
use ferriq::wire::TaskId;
use ferriq::{TaskContext, TaskError};

static HEALED: AtomicBool = AtomicBool::new(false);
/// Successful runs per task, counted where they happen.
static RUNS: Mutex<Option<HashMap<TaskId, u32>>> = Mutex::new(None);

#[ferriq::task(name = "cli.redriven")]
async fn redriven(ctx: TaskContext, n: u32) -> Result<u32, TaskError> {
    if !HEALED.load(Ordering::SeqCst) {
        return Err(TaskError::fatal(format!("{n}: not yet")));
    }
    *RUNS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(ctx.task_id().clone())
        .or_default() += 1;
    Ok(n)
}

#[ferriq::task(name = "cli.sleepy")]
async fn sleepy(ctx: TaskContext) -> Result<(), TaskError> {
    // Held until its worker goes: the test only looks at it running.
    ctx.cancelled().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_killed_midway_and_run_again_runs_every_dead_letter_exactly_once_more() {
    const N: u32 = 1000;
    let setup = Setup::new();
    let worker = setup
        .worker(&[redriven::NAME], |c| c.concurrency = 64)
        .await;
    let client = setup.client().await;
    let handles = client
        .enqueue_batch((0..N).map(redriven::call))
        .await
        .unwrap();
    common::settle_all(&handles, Duration::from_secs(120)).await;
    setup
        .wait_parked(u64::from(N), Duration::from_secs(120))
        .await;
    HEALED.store(true, Ordering::SeqCst);

    // The first redrive is killed once it has sent a few hundred back.
    let mut child = setup
        .command(&["dlq", "redrive", "--all", "--yes"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let killed_at = tokio::task::spawn_blocking(move || {
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            // Progress lines: "redriven 300".
            if let Some(n) = line
                .strip_prefix("redriven ")
                .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok())
            {
                if n >= 300 {
                    child.kill().unwrap(); // SIGKILL
                    let status = child.wait().unwrap();
                    assert!(!status.success(), "killed, not finished");
                    return n;
                }
            }
        }
        let _ = child.wait();
        panic!("the redrive ended before it was killed");
    })
    .await
    .unwrap();
    assert!(killed_at < u64::from(N));

    // Run again, to the end.
    let out = setup
        .run(&["--json", "dlq", "redrive", "--all", "--yes"], None)
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let second = report["redriven"].as_u64().unwrap();
    assert!(
        second >= u64::from(N) - killed_at,
        "the rest was redriven: {report}"
    );

    // Every one ran again and wrote its new result.
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(
            h.wait(Duration::from_secs(120)).await.unwrap(),
            i as u32,
            "task {i}"
        );
    }
    // The copies sent twice (killed between the send and the removal) are absorbed: wait for
    // the lane to drain, then count.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let q = &setup.json(&["queues"]).await[0];
        if q["ready"] == 0 && q["running"] == 0 && q["dead_lettered"] == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lane never drained: {q}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    worker.stop().await;
    let runs = RUNS.lock().unwrap().take().unwrap_or_default();
    assert_eq!(runs.len(), N as usize, "every task ran again");
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "ran more than once more: {twice:?}");
    // And the store says so.
    let store = common::store(&setup).await;
    let mut succeeded = 0;
    for h in &handles {
        if let ferriq::store::ResultStatus::Ready(r) = store.get(h.task_id()).await.unwrap() {
            succeeded += u32::from(!r.is_err);
        }
    }
    assert_eq!(succeeded, N);
}

/// A worker process for the workers test.
#[tokio::test]
#[ignore = "started as a child process by the tests of this file"]
async fn child_worker_process() {
    let worker = ferriq::WorkerBuilder::from_env()
        .await
        .unwrap()
        .registry(
            ferriq::Registry::from_inventory()
                .unwrap()
                .only(&[sleepy::NAME])
                .unwrap(),
        )
        .build()
        .unwrap();
    worker.run(ferriq::Shutdown::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_list_three_processes_and_their_runs_and_a_killed_one_disappears() {
    const LEASE_SECS: u64 = 3;
    let setup = Setup::new();
    let mut children: Vec<tokio::process::Child> = (0..3)
        .map(|i| {
            tokio::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "child_worker_process",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .envs(setup.vars())
                .env("FERRIQ_WORKER_ID", format!("cli-test-worker-{i}"))
                .env("FERRIQ_CONCURRENCY", "2")
                .env("FERRIQ_LEASE_SECS", LEASE_SECS.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let client = setup.client().await;
    client
        .enqueue_batch((0..6).map(|_| sleepy::call()))
        .await
        .unwrap();

    // Three workers, two runs each (each holds as many as its concurrency).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let workers = loop {
        let w = setup.json(&["workers"]).await;
        let all = w.as_array().unwrap().clone();
        let runs: usize = all
            .iter()
            .map(|w| w["runs"].as_array().unwrap().len())
            .sum();
        if all.len() == 3 && runs == 6 {
            break all;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers: {}",
            serde_json::to_string_pretty(&w).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut pids: Vec<u64> = workers.iter().map(|w| w["pid"].as_u64().unwrap()).collect();
    pids.sort();
    let mut expected: Vec<u64> = children
        .iter()
        .map(|c| u64::from(c.id().unwrap()))
        .collect();
    expected.sort();
    assert_eq!(pids, expected, "the three processes");
    for w in &workers {
        assert_eq!(w["concurrency"], 2);
        assert_eq!(w["lanes"][0], setup.lane.as_str());
        for key in ["id", "host", "version", "started_at_ms", "seen_at_ms"] {
            assert!(w.get(key).is_some(), "{key} in {w}");
        }
        for r in w["runs"].as_array().unwrap() {
            assert_eq!(r["task_name"], sleepy::NAME);
            assert_eq!(r["attempt"], 1);
            assert_eq!(r["lane"], setup.lane.as_str());
            assert!(r["task_id"].is_string() && r["started_at_ms"].is_u64());
        }
    }
    // The table for people names them too.
    let (table, _) = {
        let out = setup.run(&["workers"], None).await;
        (String::from_utf8_lossy(&out.stdout).into_owned(), ())
    };
    assert!(table.contains("cli-test-worker-0") && table.contains("RUNNING FOR"));

    // SIGKILL one: it is gone from the list within its heartbeat TTL (its lease).
    let victim = children.remove(0);
    let victim_pid = u64::from(victim.id().unwrap());
    let mut victim = victim;
    victim.start_kill().unwrap();
    let _ = victim.wait().await;
    let killed = tokio::time::Instant::now();
    loop {
        // Timed from when the command was started, not when it answered: a slow `ferriq`
        // process on a loaded machine must not count against the worker's record.
        let asked = killed.elapsed();
        let w = setup.json(&["workers"]).await;
        let all = w.as_array().unwrap();
        if all.iter().all(|w| w["pid"].as_u64() != Some(victim_pid)) {
            assert_eq!(all.len(), 2);
            break;
        }
        assert!(
            asked <= Duration::from_secs(LEASE_SECS) + Duration::from_millis(500),
            "still listed by a command started {asked:?} after the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for mut c in children {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
}
