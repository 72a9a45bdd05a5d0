//! End-to-end benchmark: producer and worker in separate processes (`--broker amqp` and
//! `--broker sqs`; the memory broker runs both in one), a no-op task with claims and results in
//! Valkey (memory for `--broker memory`), then the raw broker with the same durability in the
//! same run.
//!
//! ```text
//! cargo run --release --example bench_e2e -- --broker amqp   [--tasks 10000] [--lat-n 1000]
//! cargo run --release --example bench_e2e -- --broker sqs    # FERRIQ_SQS_ENDPOINT, else fauxqs
//! cargo run --release --example bench_e2e -- --broker memory [--middlewares 3]
//! cargo run --release --example bench_e2e -- --broker amqp --rounds 5   # 3 baselines, medians
//! cargo run --release --example bench_e2e -- --broker amqp --steady 60   # + 60 s at 70 % load
//! cargo run --release --example bench_e2e -- --broker amqp --backlog 100000 # worker RSS
//! cargo run --release --example bench_e2e -- --broker amqp --rounds 5 --worker-threads 1
//! cargo run --release --example bench_e2e -- --broker amqp --rounds 5 --direct
//! ```
//!
//! `--direct` publishes ferriq's tasks to the lane queue through RabbitMQ's default exchange
//! (`AmqpBrokerBuilder::publish_to_lanes_directly`) instead of the topic exchange, as the raw
//! baselines do.
//! `--worker-threads N` sets the worker process's tokio runtime: 1 is a current-thread
//! runtime, more a multi-thread one with N threads; by default tokio's (a thread per core).
//! `--rounds` also prints the CPU µs per task of each process (this one, the worker,
//! RabbitMQ's `beam.smp`, `redis-server`) over each bulk run, read from /proc.
//!
//! Bulk: N tasks enqueued in batches of 1000 (publisher confirms), then every result awaited.
//! Latency: sequential round trips (enqueue one, await its result). Raw RabbitMQ: N persistent
//! messages published with confirms in batches of 1000 to a quorum queue while a consumer
//! (prefetch 64) acks each. Raw SQS: N messages sent in batches of 10 by 8 senders while 4
//! long pollers receive and batch-delete them. The last line is
//! `e2e_tasks_per_s=… raw_msgs_per_s=… ratio=… p50_ms=… p99_ms=… rss_mib=…`
//! (rss = the worker process's peak resident set).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferriq::broker::Broker;
use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::{Client, Registry, Shutdown, Worker};
use ferriq_amqp::AmqpBroker;
use ferriq_examples::cpu::{column_medians, cpu_seconds, find_process, Meter};
use ferriq_examples::raw::{
    raw_lapin, raw_lapin_pipelined, raw_lapin_round_trips, raw_memory, raw_sqs,
};
use ferriq_examples::{amqp_url, arg, flag, peak_rss_mib, percentile, redis_url};
use ferriq_sqs::SqsBroker;
use ferriq_valkey::ValkeyStore;
use futures_util::StreamExt;

#[ferriq::task(name = "bench.noop")]
async fn noop(n: u64) -> u64 {
    n
}

const CONCURRENCY: usize = 64;

async fn amqp(exchange: &str, queue: &str) -> AmqpBroker {
    AmqpBroker::builder(amqp_url())
        .exchange(exchange)
        .queues([queue])
        .prefetch(CONCURRENCY as u16)
        .publish_to_lanes_directly(flag("--direct"))
        .connect()
        .await
        .expect("RabbitMQ")
}

async fn sqs(endpoint: &str, queue: &str) -> SqsBroker {
    ferriq_sqs::SqsBrokerBuilder::new(queue)
        .endpoint_url(endpoint)
        .region("us-east-1")
        .credentials("test", "test")
        .connect()
        .await
        .expect("SQS")
}

async fn valkey(prefix: &str) -> ValkeyStore {
    ValkeyStore::builder(redis_url())
        .prefix(prefix)
        .result_ttl(Some(Duration::from_secs(600)))
        .claim_ttl(Duration::from_secs(600))
        .connect()
        .await
        .expect("Redis")
}

/// A middleware whose every hook does nothing (`--middlewares N` registers N of them on the
/// client and the worker): the cost of the hook points themselves.
struct NoOp;

#[ferriq::async_trait]
impl ferriq::middleware::Middleware for NoOp {
    async fn before_send(
        &self,
        _: &mut ferriq::wire::TaskMessage,
    ) -> Result<(), ferriq::middleware::MiddlewareError> {
        Ok(())
    }
    async fn after_send(&self, _: &ferriq::wire::TaskMessage, _: bool) {}
    async fn before_run(
        &self,
        _: &ferriq::middleware::Run<'_>,
        _: &mut ferriq::task::AppState,
    ) -> Result<(), ferriq::middleware::MiddlewareError> {
        Ok(())
    }
    async fn after_result(&self, _: &ferriq::middleware::Run<'_>, _: &ferriq::wire::TaskResult) {}
}

fn middlewares() -> usize {
    arg("--middlewares", "0").parse().expect("--middlewares N")
}

fn with_middlewares(client: Client, n: usize) -> Client {
    (0..n).fold(client, |c, _| c.with_middleware(Arc::new(NoOp)))
}

fn worker(broker: Arc<dyn Broker>, store: Arc<impl ferriq::store::Store>) -> Worker {
    worker_with(broker, store, middlewares())
}

fn worker_with(
    broker: Arc<dyn Broker>,
    store: Arc<impl ferriq::store::Store>,
    middlewares: usize,
) -> Worker {
    let builder = (0..middlewares).fold(Worker::builder(), |b, _| b.middleware(Arc::new(NoOp)));
    builder
        .broker(broker)
        .store(store)
        .registry(
            Registry::from_inventory()
                .unwrap()
                .only(&[noop::NAME])
                .unwrap(),
        )
        .concurrency(CONCURRENCY)
        .build()
        .unwrap()
}

/// The worker process of `--broker amqp|sqs`: runs until its stdin closes.
async fn worker_process(kind: String, exchange: String, queue: String, prefix: String) {
    let broker: Arc<dyn Broker> = match kind.as_str() {
        "sqs" => Arc::new(sqs(&arg("--endpoint", ""), &queue).await),
        _ => Arc::new(amqp(&exchange, &queue).await),
    };
    let w = worker(broker, Arc::new(valkey(&prefix).await));
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let (w, s) = (w.clone(), shutdown.clone());
        async move { w.run(s).await }
    });
    println!("ready");
    let mut line = String::new();
    let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await;
    shutdown.drain();
    let _ = running.await;
}

struct Figures {
    enqueue_per_s: f64,
    e2e_per_s: f64,
    lat_ms: Vec<f64>,
    /// CPU µs per task this process spent over the bulk run (for `--broker memory`, the
    /// whole engine: client, broker, worker and store).
    bench_cpu_us: f64,
    /// Steady load (`--steady SECS`): the rate offered, and every task's enqueue-to-result
    /// latency, sorted.
    steady: Option<(f64, Vec<f64>)>,
}

/// `--steady SECS`: after the burst, `SECS` of load at 70 % of the burst's end-to-end rate
/// (or `--rate R` tasks/s), one enqueue at a time as an app would, each task's latency from
/// its enqueue to its result.
async fn steady(client: &Client, rate: f64, secs: u64) -> Vec<f64> {
    let wait = Duration::from_secs(120);
    let total = (rate * secs as f64) as u64;
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let lat = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total as usize)));
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..total {
        // Paced by the clock, not by the previous send: a slow send does not lower the rate.
        let due = start + period * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let t = Instant::now();
        let h = noop::kiq(client, i).await.unwrap();
        let lat = lat.clone();
        waiters.spawn(async move {
            h.wait(wait).await.expect("a result under load");
            lat.lock().unwrap().push(t.elapsed().as_secs_f64() * 1000.0);
        });
        // Reap finished waiters as we go.
        while waiters.try_join_next().is_some() {}
    }
    while waiters.join_next().await.is_some() {}
    let mut lat = std::mem::take(&mut *lat.lock().unwrap());
    lat.sort_by(|a, b| a.total_cmp(b));
    lat
}

/// Readiness and warm-up (not recorded): one task, then 200.
async fn warm_up(client: &Client) {
    let wait = Duration::from_secs(120);
    noop::kiq(client, 0)
        .await
        .unwrap()
        .wait(wait)
        .await
        .expect("the worker answers");
    let warm = client
        .enqueue_batch((0..200).map(noop::call))
        .await
        .unwrap();
    for h in warm {
        h.wait(wait).await.unwrap();
    }
}

/// N tasks enqueued in batches of 1000, then every result awaited: (enqueue, end to end)
/// seconds.
async fn bulk(client: &Client, n: u64) -> (Duration, Duration) {
    let wait = Duration::from_secs(120);
    let start = Instant::now();
    let mut handles = Vec::with_capacity(n as usize);
    let ids: Vec<u64> = (0..n).collect();
    for chunk in ids.chunks(1000) {
        handles.extend(
            client
                .enqueue_batch(chunk.iter().map(|i| noop::call(*i)))
                .await
                .unwrap(),
        );
    }
    let enqueued = start.elapsed();
    // Await every result, many at once (as taskiq's gather in batches of 1000).
    let bad = Arc::new(AtomicU64::new(0));
    futures_util::stream::iter(handles.into_iter().enumerate())
        .for_each_concurrent(1000, |(i, h)| {
            let bad = bad.clone();
            async move {
                if h.wait(wait).await.ok() != Some(i as u64) {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
    assert_eq!(bad.load(Ordering::Relaxed), 0, "wrong or missing results");
    (enqueued, start.elapsed())
}

/// `lat_n` sequential round trips (enqueue one, await its result), in ms, sorted.
async fn round_trips(client: &Client, lat_n: usize) -> Vec<f64> {
    let mut lat_ms = Vec::with_capacity(lat_n);
    for i in 0..lat_n {
        let t = Instant::now();
        let v = noop::kiq(client, i as u64)
            .await
            .unwrap()
            .wait(Duration::from_secs(120))
            .await
            .unwrap();
        assert_eq!(v, i as u64);
        lat_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat_ms.sort_by(|a, b| a.total_cmp(b));
    lat_ms
}

async fn drive(client: &Client, n: u64, lat_n: usize) -> Figures {
    warm_up(client).await;
    let cpu_before = cpu_seconds(std::process::id()).unwrap_or(f64::NAN);
    let (enqueued, e2e) = bulk(client, n).await;
    let cpu_after = cpu_seconds(std::process::id()).unwrap_or(f64::NAN);
    let lat_ms = round_trips(client, lat_n).await;
    let e2e_per_s = n as f64 / e2e.as_secs_f64();
    let steady_secs: u64 = arg("--steady", "0").parse().unwrap_or(0);
    let steady = if steady_secs > 0 {
        let rate = arg("--rate", "0")
            .parse::<f64>()
            .ok()
            .filter(|r| *r > 0.0)
            .unwrap_or(e2e_per_s * 0.7);
        Some((rate, steady(client, rate, steady_secs).await))
    } else {
        None
    };
    Figures {
        steady,
        enqueue_per_s: n as f64 / enqueued.as_secs_f64(),
        e2e_per_s: n as f64 / e2e.as_secs_f64(),
        lat_ms,
        bench_cpu_us: (cpu_after - cpu_before) * 1e6 / n as f64,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `--worker-threads N`: the worker process's runtime threads (1: a current-thread
    // runtime); tokio's default (one per core) otherwise.
    let threads: usize = arg("--worker-threads", "0").parse()?;
    let runtime = if arg("--role", "producer") == "worker" && threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else if arg("--role", "producer") == "worker" && threads > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    if arg("--role", "producer") == "worker" {
        worker_process(
            arg("--broker", "amqp"),
            arg("--exchange", ""),
            arg("--queue", ""),
            arg("--prefix", ""),
        )
        .await;
        return Ok(());
    }
    let broker_kind = arg("--broker", "amqp");
    let n: u64 = arg("--tasks", &arg("--n", "10000")).parse()?;
    let lat_n: usize = arg("--lat-n", "1000").parse()?;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];

    let (figures, raw, rss, what) = match broker_kind.as_str() {
        "amqp" if arg("--backlog", "0") != "0" => {
            return rss_run(tag, arg("--backlog", "0").parse()?).await;
        }
        "amqp" if arg("--rounds", "0") != "0" => {
            return amqp_rounds(tag, n, lat_n, arg("--rounds", "0").parse()?).await;
        }
        "memory" if arg("--rounds", "0") != "0" => {
            return compare_middlewares(n, lat_n, arg("--rounds", "0").parse()?).await;
        }
        "memory" => {
            let figures = memory_round(n, lat_n, middlewares()).await?;
            let cpu_before = cpu_seconds(std::process::id()).unwrap_or(f64::NAN);
            let raw = raw_memory(n, CONCURRENCY).await;
            let raw_cpu = cpu_seconds(std::process::id()).unwrap_or(f64::NAN) - cpu_before;
            println!(
                "CPU per task in this process: ferriq {:.2} µs (client, broker, worker, store), raw memory broker {:.2} µs (publish, receive, ack)",
                figures.bench_cpu_us,
                raw_cpu * 1e6 / n as f64
            );
            (
                figures,
                raw,
                peak_rss_mib(std::process::id()),
                "memory broker + memory store, one process",
            )
        }
        "amqp" => {
            let mut world = AmqpWorld::start(tag).await?;
            let figures = drive(&world.client, n, lat_n).await;
            let rss = peak_rss_mib(world.pid);
            world.stop_worker().await;
            let raw = raw_lapin(&format!("fqbench.{tag}.raw"), n, CONCURRENCY as u16).await;
            let raw_rtt = raw_lapin_round_trips(&format!("fqbench.{tag}.rtt"), lat_n).await;
            println!(
                "raw RabbitMQ round trip (publish, confirm, deliver, ack; no store) p50 / p99: {:.2} / {:.2} ms",
                percentile(&raw_rtt, 50.0),
                percentile(&raw_rtt, 99.0)
            );
            world.remove().await;
            (figures, raw, rss, "RabbitMQ quorum queue (confirms, persistent) + Redis claims/results, worker in its own process")
        }
        "sqs" => {
            let endpoint = ferriq_examples::sqs::endpoint();
            let admin = ferriq_examples::sqs::client(&endpoint);
            let (queue, prefix) = (format!("fqbench-{tag}"), format!("fqbench{tag}"));
            let (url, dlq) = ferriq_examples::sqs::create_queue_pair(&admin, &queue).await;
            let store = Arc::new(valkey(&prefix).await);
            let client = Client::new(Arc::new(sqs(&endpoint, &queue).await), store.clone());
            let mut child = tokio::process::Command::new(std::env::current_exe()?)
                .args(["--role", "worker", "--broker", "sqs", "--queue", &queue])
                .args(["--prefix", &prefix, "--endpoint", &endpoint])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let pid = child.id().unwrap_or(0);
            let figures = drive(&client, n, lat_n).await;
            let rss = peak_rss_mib(pid);
            drop(child.stdin.take());
            let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
            let (raw_url, raw_dlq) =
                ferriq_examples::sqs::create_queue_pair(&admin, &format!("{queue}-raw")).await;
            let raw = raw_sqs(&admin, &raw_url, n).await;
            let _ = store.purge_prefix().await;
            ferriq_examples::sqs::delete_queues(&admin, &[url, dlq, raw_url, raw_dlq]).await;
            (figures, raw, rss, "SQS (fauxqs emulator unless FERRIQ_SQS_ENDPOINT) + Redis claims/results, worker in its own process")
        }
        other => return Err(format!("--broker must be amqp, sqs or memory, not {other}").into()),
    };

    report(&figures, raw, rss, what, n, lat_n);
    Ok(())
}

/// A unique exchange, lane and key prefix on RabbitMQ + Redis, a client on them, and a worker
/// process (`--role worker`) serving them.
struct AmqpWorld {
    exchange: String,
    queue: String,
    store: Arc<ValkeyStore>,
    client: Client,
    child: tokio::process::Child,
    pid: u32,
}

impl AmqpWorld {
    async fn start(tag: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let (exchange, queue, prefix) = (
            format!("fqbench.{tag}.x"),
            format!("fqbench.{tag}"),
            format!("fqbench{tag}"),
        );
        let store = Arc::new(valkey(&prefix).await);
        let client = Client::new(Arc::new(amqp(&exchange, &queue).await), store.clone());
        let child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["--role", "worker", "--exchange", &exchange])
            .args(["--queue", &queue, "--prefix", &prefix])
            .args(["--worker-threads", &arg("--worker-threads", "0")])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().unwrap_or(0);
        Ok(AmqpWorld {
            exchange,
            queue,
            store,
            client,
            child,
            pid,
        })
    }

    /// Closes the worker's stdin: it drains and exits (waited for up to 30 s).
    async fn stop_worker(&mut self) {
        drop(self.child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }

    /// Deletes the keys and the RabbitMQ topology the run made.
    async fn remove(self) {
        let _ = self.store.purge_prefix().await;
        ferriq_examples::delete_amqp_topology(&self.exchange, &self.queue).await;
    }
}

/// `--broker amqp --rounds R`: R rounds, each ferriq's bulk run of N tasks then raw lapin's
/// N messages on a fresh queue three ways (as written in lapin's examples; pipelined; pipelined
/// with the two `SET`s of the store floor per message), back to back; then both round-trip
/// sets. One worker process throughout (idle while raw runs). Single runs swing 10–20 % on a
/// shared 2-core machine; the median of R interleaved ratios is the figure to compare.
async fn amqp_rounds(
    tag: &str,
    n: u64,
    lat_n: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use fred::prelude::ClientLike;
    let mut world = AmqpWorld::start(tag).await?;
    warm_up(&world.client).await;
    let floor_pool = fred::clients::Pool::new(
        fred::prelude::Config::from_url(&redis_url())?,
        None,
        None,
        None,
        4,
    )?;
    floor_pool.init().await?;
    let route = if flag("--direct") {
        "published to the lane directly"
    } else {
        "published through the topic exchange"
    };
    println!("ferriq bench_e2e --rounds {rounds}: RabbitMQ quorum queue ({route}) + Redis, worker in its own process; N={n}, concurrency {CONCURRENCY}");
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!("| round | enqueue tasks/s | end to end tasks/s | raw msgs/s | ratio | raw pipelined msgs/s | ratio | raw pipelined + store floor msgs/s | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let (mut e2e, mut ratios, mut piped, mut floored) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // CPU per task of each process, per round: ferriq's run, raw lapin's, the floor's.
    let meter = Meter::new(vec![
        ("bench process", Some(std::process::id())),
        ("worker", Some(world.pid)),
        ("RabbitMQ", find_process("beam.smp")),
        ("Redis", find_process("redis-server")),
    ]);
    let (mut cpu, mut raw_cpu, mut floor_cpu) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let before = meter.read();
        let (enqueued, took) = bulk(&world.client, n).await;
        cpu.push(meter.per_task_us(&before, n));
        let prefetch = CONCURRENCY as u16;
        let before = meter.read();
        let raw = raw_lapin(&format!("fqbench.{tag}.raw{round}"), n, prefetch).await;
        raw_cpu.push(meter.per_task_us(&before, n));
        let raw_piped =
            raw_lapin_pipelined(&format!("fqbench.{tag}.piped{round}"), n, prefetch, None).await;
        let before = meter.read();
        let raw_floor = raw_lapin_pipelined(
            &format!("fqbench.{tag}.floor{round}"),
            n,
            prefetch,
            Some(&floor_pool),
        )
        .await;
        floor_cpu.push(meter.per_task_us(&before, n));
        let per_s = n as f64 / took.as_secs_f64();
        println!(
            "| {round} | {:.0} | {per_s:.0} | {raw:.0} | {:.3} | {raw_piped:.0} | {:.3} | {raw_floor:.0} | {:.3} |",
            n as f64 / enqueued.as_secs_f64(),
            per_s / raw,
            per_s / raw_piped,
            per_s / raw_floor
        );
        e2e.push(per_s);
        ratios.push(per_s / raw);
        piped.push(per_s / raw_piped);
        floored.push(per_s / raw_floor);
    }
    let _ = floor_pool.quit().await;
    let lat_ms = round_trips(&world.client, lat_n).await;
    let rss = peak_rss_mib(world.pid);
    world.stop_worker().await;
    let raw_rtt = raw_lapin_round_trips(&format!("fqbench.{tag}.rtt"), lat_n).await;
    world.remove().await;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (p, raw_p) = (|q| percentile(&lat_ms, q), |q| percentile(&raw_rtt, q));
    let cpu_totals = print_cpu_table(
        &meter.names(),
        rounds,
        &[
            ("ferriq (bench process = producer)", &cpu, true),
            ("raw lapin (bench process = client)", &raw_cpu, false),
            ("raw pipelined + store floor", &floor_cpu, false),
        ],
    );
    println!(
        "round trip p50 / p99: ferriq {:.2} / {:.2} ms, raw RabbitMQ (publish, confirm, deliver, ack) {:.2} / {:.2} ms",
        p(50.0),
        p(99.0),
        raw_p(50.0),
        raw_p(99.0)
    );
    println!(
        "median_e2e_tasks_per_s={:.0} median_ratio={:.3} min_ratio={:.3} max_ratio={:.3} median_ratio_pipelined={:.3} median_ratio_pipelined_floor={:.3} p50_ms={:.2} p99_ms={:.2} raw_rtt_p50_ms={:.2} rss_mib={rss:.1} cpu_us_per_task={:.1} raw_cpu_us_per_msg={:.1} floor_cpu_us_per_msg={:.1}",
        median(&mut e2e),
        median(&mut ratios),
        ratios[0],
        ratios[ratios.len() - 1],
        median(&mut piped),
        median(&mut floored),
        p(50.0),
        p(99.0),
        raw_p(50.0),
        cpu_totals[0],
        cpu_totals[1],
        cpu_totals[2]
    );
    Ok(())
}

/// `--broker amqp --backlog N`: the worker process's resident set idle (connected, two
/// seconds after it is ready, nothing queued), then its peak while N tasks are enqueued as
/// fast as the producer can and drained.
async fn rss_run(tag: &str, backlog: u64) -> Result<(), Box<dyn std::error::Error>> {
    use tokio::io::AsyncBufReadExt;
    let mut world = AmqpWorld::start(tag).await?;
    let (client, pid) = (world.client.clone(), world.pid);
    let stdout = world.child.stdout.take().ok_or("no worker stdout")?;
    let mut ready = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut ready)
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = ferriq_examples::rss_mib(pid);
    let started = Instant::now();
    let mut handles = Vec::with_capacity(backlog as usize);
    for chunk in (0..backlog).collect::<Vec<_>>().chunks(1000) {
        handles.extend(
            client
                .enqueue_batch(chunk.iter().map(|&i| noop::call(i)))
                .await?,
        );
    }
    let enqueued = started.elapsed();
    for h in &handles {
        h.wait(Duration::from_secs(600)).await?;
    }
    let drained = started.elapsed();
    let peak = peak_rss_mib(pid);
    world.stop_worker().await;
    world.remove().await;
    println!("ferriq bench_e2e --backlog {backlog}: RabbitMQ + Redis, worker in its own process, concurrency {CONCURRENCY}");
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!(
        "| worker RSS idle | {idle:.1} MiB |\n| worker peak RSS, {backlog} tasks enqueued in {:.1} s and drained in {:.1} s | {peak:.1} MiB |",
        enqueued.as_secs_f64(),
        drained.as_secs_f64()
    );
    println!("idle_rss_mib={idle:.1} backlog_peak_rss_mib={peak:.1}");
    Ok(())
}

/// One run on a fresh memory broker and store with `middlewares` no-op middlewares.
async fn memory_round(
    n: u64,
    lat_n: usize,
    middlewares: usize,
) -> Result<Figures, Box<dyn std::error::Error>> {
    let broker = Arc::new(MemoryBroker::new());
    let store = Arc::new(MemoryStore::new());
    let w = worker_with(broker.clone(), store.clone(), middlewares);
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let (w, s) = (w.clone(), shutdown.clone());
        async move { w.run(s).await }
    });
    let client = with_middlewares(Client::new(broker, store), middlewares);
    let figures = drive(&client, n, lat_n).await;
    shutdown.drain();
    running.await?;
    Ok(figures)
}

/// `--rounds R`: R rounds in this process, each a run without middleware then one with
/// `--middlewares N` (default 3), on fresh engines; medians and their ratio. One process and
/// interleaved rounds keep the machine's drift out of the comparison.
async fn compare_middlewares(
    n: u64,
    lat_n: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let with = arg("--middlewares", "3").parse::<usize>()?;
    let (mut none, mut some) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always runs on a warmer process.
        let order = if round % 2 == 0 { [0, with] } else { [with, 0] };
        for m in order {
            let f = memory_round(n, lat_n, m).await?;
            if m == 0 {
                none.push(f.e2e_per_s);
            } else {
                some.push(f.e2e_per_s);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut none), median(&mut some));
    println!("ferriq bench_e2e --rounds {rounds}: memory broker + memory store, N={n} per run, concurrency {CONCURRENCY}");
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!("| middleware | end to end, median of {rounds} | runs |");
    println!("|---|---|---|");
    println!("| none | {a:.0} tasks/s | {} |", fmt_runs(&none));
    println!("| {with} no-op | {b:.0} tasks/s | {} |", fmt_runs(&some));
    println!(
        "none_tasks_per_s={a:.0} with_{with}_tasks_per_s={b:.0} cost_pct={:.1}",
        (1.0 - b / a) * 100.0
    );
    Ok(())
}

/// Prints the medians of each run's CPU µs per task by process, and returns each run's total
/// (the processes it used: the worker only for ferriq, whose run is the only one using it).
fn print_cpu_table(names: &[&str], rounds: usize, runs: &[(&str, &[Vec<f64>], bool)]) -> Vec<f64> {
    println!(
        "| CPU µs per task, median of {rounds} | {} | all |",
        names.join(" | ")
    );
    println!("|---|{}---|", "---|".repeat(names.len()));
    let mut totals = Vec::new();
    for (what, rows, uses_worker) in runs {
        let medians = column_medians(rows);
        let used = |i: usize| *uses_worker || names[i] != "worker";
        let total: f64 = medians
            .iter()
            .enumerate()
            .filter(|(i, v)| used(*i) && !v.is_nan())
            .map(|(_, v)| v)
            .sum();
        let cells: Vec<String> = medians
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if used(i) {
                    format!("{v:.1}")
                } else {
                    "–".into()
                }
            })
            .collect();
        println!("| {what} | {} | {total:.1} |", cells.join(" | "));
        totals.push(total);
    }
    totals
}

fn fmt_runs(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report(figures: &Figures, raw: f64, rss: f64, what: &str, n: u64, lat_n: usize) {
    let p = |q| percentile(&figures.lat_ms, q);
    println!(
        "ferriq bench_e2e: {what}; N={n}, concurrency {CONCURRENCY}, {lat_n} sequential round trips, {} no-op middleware(s)",
        middlewares()
    );
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| enqueue (batches of 1000, confirmed) | {:.0} tasks/s |",
        figures.enqueue_per_s
    );
    println!(
        "| end to end (enqueue → every result) | {:.0} tasks/s |",
        figures.e2e_per_s
    );
    println!("| raw broker publish+consume+ack, same durability | {raw:.0} msgs/s |");
    println!(
        "| round trip p50 / p90 / p99 / max | {:.2} / {:.2} / {:.2} / {:.2} ms |",
        p(50.0),
        p(90.0),
        p(99.0),
        p(100.0)
    );
    println!("| worker peak RSS | {rss:.1} MiB |");
    if let Some((rate, lat)) = &figures.steady {
        let q = |x| percentile(lat, x);
        println!(
            "| steady load {rate:.0} tasks/s, {} tasks: latency p50 / p99 / p99.9 / max | {:.2} / {:.2} / {:.2} / {:.2} ms |",
            lat.len(),
            q(50.0),
            q(99.0),
            q(99.9),
            q(100.0)
        );
    }
    println!(
        "e2e_tasks_per_s={:.0} raw_msgs_per_s={raw:.0} ratio={:.3} p50_ms={:.2} p99_ms={:.2} rss_mib={rss:.1}",
        figures.e2e_per_s,
        figures.e2e_per_s / raw,
        p(50.0),
        p(99.0)
    );
}
