//! The dashboard at scale, on RabbitMQ (a lane of its own) and a Valkey server of its own:
//! 1,000,000 finished tasks in the search index, a day of history, and `--dead` (100,000)
//! real dead letters parked by a worker. The dashboard runs as a child process serving HTTP;
//! every time is a whole request as a browser makes it (connect, answer read).
//!
//! ```text
//! cargo run --release -p ferriq-examples --example dashboard_scale
//! ```
//!
//! It prints p50/p95 of the overview, its charts, the dead letters page under each filter and
//! the task search; then redrives every dead letter from the dashboard, SIGKILLs the dashboard
//! a third of the way, starts another, which lists the job as interrupted, and redrives again.
//! Its last line checks the promise: every task ran exactly once after it was healed, and
//! ends with its result; nothing is left parked or indexed.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferriq::store::{FinishedTask, MinuteStats, OpsStore};
use ferriq::wire::TaskId;
use ferriq::{Client, Registry, Shutdown, State, TaskError, Worker};
use ferriq_amqp::AmqpBroker;
use ferriq_examples::{amqp_url, arg, cpu_model, delete_amqp_topology};
use ferriq_valkey::ValkeyStore;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

mod http;
use http::{csrf, ferriq_dashboard_enc, http, jobs, timed};

/// Runs of each task after it was healed, by its argument.
struct Runs {
    healed: AtomicBool,
    after_heal: Vec<AtomicU32>,
}

#[ferriq::task(name = "scale.charge", max_attempts = 1)]
async fn charge(runs: State<Arc<Runs>>, n: u32) -> Result<u32, TaskError> {
    if !runs.healed.load(Ordering::SeqCst) {
        let why = if n.is_multiple_of(10) {
            "HTTP 503 from upstream"
        } else {
            "card declined"
        };
        return Err(TaskError::fatal(format!("{why} (customer {n})")));
    }
    runs.after_heal[n as usize].fetch_add(1, Ordering::SeqCst);
    Ok(n)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn broker(tag: &str) -> AmqpBroker {
    AmqpBroker::builder(amqp_url())
        .exchange(format!("fqscale.{tag}.x"))
        .queues([lane(tag)])
        .connect()
        .await
        .expect("RabbitMQ")
}

fn lane(tag: &str) -> String {
    format!("fqscale.{tag}")
}

async fn store(redis: &str) -> ValkeyStore {
    ValkeyStore::builder(redis)
        .prefix("fqscale")
        .connect()
        .await
        .expect("Valkey")
}

/// The child: serves the dashboard, actions allowed, on loopback.
async fn serve(tag: &str, redis: &str, addr: &str) {
    let client = Client::new(Arc::new(broker(tag).await), Arc::new(store(redis).await));
    let router = ferriq_dashboard::Dashboard::builder(client)
        .allow_actions(true)
        .build()
        .router();
    let listener = tokio::net::TcpListener::bind(addr).await.expect("listen");
    eprintln!("serving on {addr}");
    axum::serve(listener, router).await.expect("serve");
}

/// Starts a dashboard child and waits until it serves.
async fn start_dashboard(tag: &str, redis: &str, addr: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["--serve", addr, "--tag", tag, "--redis", redis])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the dashboard starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("serving on") {
                return;
            }
        }
        panic!("the dashboard exited before serving");
    })
    .await
    .expect("serving within 30 s");
    // Its later lines are not read: let them go nowhere rather than fill a pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[tokio::main]
async fn main() {
    let tag = arg("--tag", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    if ferriq_examples::flag("--serve") {
        return serve(&tag, &arg("--redis", ""), &arg("--serve", "")).await;
    }
    let dead: u32 = arg("--dead", "100000").parse().expect("--dead N");
    let finished: u64 = arg("--finished", "1000000").parse().expect("--finished N");
    let samples: usize = arg("--samples", "20").parse().expect("--samples N");

    // A Valkey of its own: 1,000,000 finished tasks and 100,000 dead letters stay out of the
    // shared server, and go when it stops.
    let port = free_port();
    let mut valkey = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server (install Redis or Valkey)");
    let redis = format!("redis://127.0.0.1:{port}");
    let store = loop {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_secs(1),
            ValkeyStore::builder(redis.as_str())
                .prefix("fqscale")
                .connect(),
        )
        .await
        {
            break Arc::new(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let broker = Arc::new(broker(&tag).await);
    let client = Client::new(broker.clone(), store.clone());
    println!("cpu={} dead={dead} finished={finished}", cpu_model());

    // The retention window's finished tasks and a day of history, written as workers write them.
    let t = Instant::now();
    let now_ms = client.clock().now_unix_ms();
    let names = ["scale.charge", "scale.mail", "scale.render", "scale.sync"];
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..finished {
        let at = now_ms - (i * 86_400_000 / finished.max(1));
        batch.push(FinishedTask::new(
            TaskId::random(),
            names[(i % 4) as usize],
            i.is_multiple_of(17),
            at,
        ));
        if batch.len() == 10_000 {
            store.add_finished(&batch).await.expect("finished index");
            batch.clear();
        }
    }
    store.add_finished(&batch).await.expect("finished index");
    let minute = now_ms / 60_000;
    let history: Vec<MinuteStats> = (0..1440)
        .flat_map(|m| names.iter().map(move |n| (m, n)))
        .map(|(m, n)| {
            let mut s = MinuteStats::new(minute - m, *n);
            s.succeeded = 700;
            s.failed = 40;
            for (i, b) in s.durations.iter_mut().enumerate() {
                *b = 50 + i as u64;
            }
            s
        })
        .collect();
    for chunk in history.chunks(400) {
        store.add_history(chunk).await.expect("history");
    }
    println!(
        "filled: {finished} finished tasks, a day of history for 4 tasks in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // Real dead letters: a worker parks every call while the task fails.
    let runs = Arc::new(Runs {
        healed: AtomicBool::new(false),
        after_heal: (0..dead).map(|_| AtomicU32::new(0)).collect(),
    });
    let shutdown = Shutdown::new();
    let worker = Worker::builder()
        .broker(broker.clone())
        .store(store.clone())
        .registry(
            Registry::from_inventory()
                .expect("registry")
                .only(&[charge::NAME])
                .expect("task"),
        )
        .state(runs.clone())
        .concurrency(64)
        .build()
        .expect("worker");
    let worker = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { worker.run(shutdown).await })
    };
    let t = Instant::now();
    for chunk in (0..dead).collect::<Vec<_>>().chunks(1000) {
        client
            .enqueue_batch(chunk.iter().map(|n| charge::call(*n)))
            .await
            .expect("enqueue");
    }
    let ops = client.ops();
    let lane = lane(&tag);
    let parked = loop {
        let q = ops.queues().await.expect("queues");
        let n = q
            .iter()
            .find(|q| q.name == lane)
            .and_then(|q| q.dead_lettered)
            .unwrap_or(0);
        if n >= u64::from(dead) {
            break n;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1200),
            "{n} of {dead} parked"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "parked: {parked} dead letters in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // Pages, as a browser asks for them.
    let addr = format!("127.0.0.1:{}", free_port());
    let mut dashboard = start_dashboard(&tag, &redis, &addr).await;
    let l = ferriq_dashboard_enc(&lane);
    let deep = dead * 3 / 5;
    let pages = [
        ("overview", "/".to_owned(), lane.clone()),
        ("overview_json", "/api/overview".to_owned(), lane.clone()),
        (
            "chart_runs_6h",
            "/charts/runs.svg?hours=6".to_owned(),
            "<svg".to_owned(),
        ),
        (
            "chart_durations_6h",
            "/charts/durations.svg?hours=6".to_owned(),
            "<svg".to_owned(),
        ),
        ("dead_all", format!("/dead?lane={l}"), "1–50 of ".to_owned()),
        (
            "dead_deep_offset",
            format!("/dead?lane={l}&offset={deep}"),
            format!("{}–", deep + 1),
        ),
        (
            "dead_reason",
            format!("/dead?lane={l}&reason=non_retryable"),
            "non_retryable</td>".to_owned(),
        ),
        (
            "dead_task",
            format!("/dead?lane={l}&task=scale.charge"),
            "scale.charge</td>".to_owned(),
        ),
        (
            "dead_text",
            format!("/dead?lane={l}&text=upstream"),
            "HTTP 503".to_owned(),
        ),
        (
            "dead_text_rare",
            format!("/dead?lane={l}&text=customer+{}%29", dead - 7),
            "1–1 of 1".to_owned(),
        ),
        (
            "dead_older",
            format!("/dead?lane={l}&older_than_min=1"),
            "<tbody id=\"dead\">".to_owned(),
        ),
        (
            "tasks_search_24h",
            "/tasks?name=scale.mail&outcome=failed&hours=24".to_owned(),
            "/tasks?id=".to_owned(),
        ),
        (
            "tasks_search_1h",
            "/tasks?name=scale.render&outcome=&hours=1".to_owned(),
            "/tasks?id=".to_owned(),
        ),
    ];
    let mut worst_dead: f64 = 0.0;
    let mut worst_overview: f64 = 0.0;
    for (name, path, shows) in &pages {
        let (p50, p95) = timed(&addr, path, shows, samples).await;
        println!("{name}: p50_ms={p50:.1} p95_ms={p95:.1}");
        if name.starts_with("dead") || name.starts_with("tasks") {
            worst_dead = worst_dead.max(p95);
        } else if *name == "overview" {
            worst_overview = p95;
        }
    }

    // Redrive everything from the dashboard, killed a third of the way.
    runs.healed.store(true, Ordering::SeqCst);
    let (_, page) = http(&addr, "GET", &format!("/dead?lane={l}"), None).await;
    let form = format!("csrf={}&lane={l}&scope=filter", csrf(&page));
    let (status, _) = http(&addr, "POST", "/dead/redrive", Some(&form)).await;
    assert!(status.contains("303"), "redrive refused: {status}");
    let t = Instant::now();
    let third = u64::from(dead / 3);
    let done_before_kill = loop {
        let done = jobs(&addr)
            .await
            .first()
            .and_then(|j| j["done"].as_u64())
            .unwrap_or(0);
        if done >= third {
            break done;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1200),
            "redrive stalled at {done}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let first_rate = done_before_kill as f64 / t.elapsed().as_secs_f64();
    let _ = dashboard.start_kill();
    let _ = dashboard.wait().await;
    println!("killed the dashboard after {done_before_kill} redriven ({first_rate:.0}/s)");
    let mut dashboard = start_dashboard(&tag, &redis, &addr).await;
    // The new one lists the job as interrupted once its record is older than it allows.
    let t = Instant::now();
    let interrupted = loop {
        let listed = jobs(&addr).await;
        if let Some(j) = listed.iter().find(|j| {
            j["outcome"]
                .as_str()
                .is_some_and(|o| o.starts_with("interrupted"))
        }) {
            break j.clone();
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "not shown interrupted: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!("restarted dashboard lists: {}", interrupted["outcome"]);
    let (_, page) = http(&addr, "GET", &format!("/dead?lane={l}"), None).await;
    let form = format!("csrf={}&lane={l}&scope=filter", csrf(&page));
    let (status, _) = http(&addr, "POST", "/dead/redrive", Some(&form)).await;
    assert!(status.contains("303"), "redrive refused: {status}");
    let t = Instant::now();
    let outcome = loop {
        let listed = jobs(&addr).await;
        let finished = listed.iter().find(|j| {
            j["finished"] == true
                && !j["outcome"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("interrupted")
        });
        if let Some(j) = finished {
            break j["outcome"].as_str().unwrap_or("").to_owned();
        }
        assert!(
            t.elapsed() < Duration::from_secs(1800),
            "second redrive did not end"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "second redrive: {outcome} in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // Every task ran once after it was healed, and has its result.
    let t = Instant::now();
    let all_ran = |runs: &Runs| {
        runs.after_heal
            .iter()
            .all(|r| r.load(Ordering::SeqCst) >= 1)
    };
    while !all_ran(&runs) && t.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Late duplicates, if any, would show within a lease: wait one out before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let never = runs
        .after_heal
        .iter()
        .filter(|r| r.load(Ordering::SeqCst) == 0)
        .count();
    let twice = runs
        .after_heal
        .iter()
        .filter(|r| r.load(Ordering::SeqCst) > 1)
        .count();
    let left = ops
        .queues()
        .await
        .expect("queues")
        .iter()
        .find(|q| q.name == lane)
        .and_then(|q| q.dead_lettered)
        .unwrap_or(0);
    let indexed = ops
        .dead_index(&lane, &ferriq::dead_letters::DeadFilter::all(), 0, 1)
        .await
        .expect("index")
        .map_or(0, |p| p.indexed);
    let _ = dashboard.start_kill();
    shutdown.drain();
    let _ = worker.await;
    delete_amqp_topology(&format!("fqscale.{tag}.x"), &lane).await;
    let _ = valkey.start_kill();
    println!(
        "dead={dead} worst_list_p95_ms={worst_dead:.1} overview_p95_ms={worst_overview:.1} redriven_before_kill={done_before_kill} never_ran={never} ran_twice={twice} left_parked={left} left_indexed={indexed}"
    );
    if never + twice > 0 || left > 0 || indexed > 0 {
        std::process::exit(1);
    }
}
