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
//! cargo run --release --example bench_e2e -- --broker amqp --steady 60   # + 60 s at 70 % of the single-enqueue max, open loop, beside raw RabbitMQ
//! cargo run --release --example bench_e2e -- --broker amqp --steady 20 --rate 3000  # a fixed rate
//! cargo run --release --example bench_e2e -- --broker amqp --steady 40 --rate 5000 --stall-worker 1000
//! cargo run --release --example bench_e2e -- --broker amqp --backlog 100000 # worker RSS
//! cargo run --release --example bench_e2e -- --broker amqp --rounds 5 --worker-threads 1
//! cargo run --release --example bench_e2e -- --broker amqp --rounds 5 --direct
//! ```
//!
//! `--direct` publishes ferriq's tasks to the lane queue through RabbitMQ's default exchange
//! (`AmqpBrokerBuilder::publish_to_lanes_directly`) instead of the topic exchange, as the raw
//! baselines do.
//! `--publisher-channels N` sets the producer's confirm-mode channels (default the builder's).
//! `--worker-threads N` sets the worker process's tokio runtime: 1 is a current-thread
//! runtime, more a multi-thread one with N threads; by default tokio's (a thread per core).
//! `--rounds` also prints the CPU µs per task of each process (this one, the worker,
//! RabbitMQ's `beam.smp`, `redis-server`) over each bulk run, read from /proc; `--steady`
//! prints the same per task over the steady load, and how busy the whole machine was, beside
//! the raw open loop's.
//! Every run also prints what each process spent per sequential round trip: CPU µs and
//! context switches (summed over its threads, from /proc), beside the raw round trip's.
//! A run with the worker in its own process also prints the worker's CPU µs and context
//! switches per task over the bulk run by thread name (tokio's workers, lapin's I/O thread).
//! `--steady-csv FILE` writes each steady-load task's timing (when it was due, its enqueue
//! and its result, in ms from due) to FILE.
//! `--stall-worker MS` stops the worker process (`SIGSTOP`) for MS ms halfway through the
//! steady load and reports how long the backlog took to clear.
//! `RUST_LOG=warn` (any `tracing` filter) makes both processes log to stderr.
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
use ferriq_examples::cpu::{column_medians, cpu_seconds, find_process, MachineBusy, Meter};
use ferriq_examples::raw::{
    raw_lapin, raw_lapin_pipelined, raw_lapin_round_trips, raw_lapin_steady, raw_memory, raw_sqs,
};
use ferriq_examples::raw_amqprs::{raw_amqprs, raw_amqprs_round_trips};
use ferriq_examples::{amqp_url, arg, flag, peak_rss_mib, percentile, redis_url};
use ferriq_sqs::SqsBroker;
use ferriq_valkey::ValkeyStore;
use futures_util::StreamExt;

#[cfg(not(feature = "mimalloc"))]
mod allocs;
mod commandstats;
mod load;
mod modes;
mod rounds;
mod steady;

use commandstats::CommandStats;
use load::{
    as_raw_client, bulk, bulk_of, drive, fmt_cost, fmt_cpu, fmt_runs, metered, raw_client_name,
    report, round_trips, warm_up, Figures,
};
use modes::{compare_middlewares, history_rounds, limits_rounds, memory_round, rss_run};
use rounds::{amqp_rounds, print_cpu_table, AmqpWorld};

#[ferriq::task(name = "bench.noop")]
async fn noop(n: u64) -> u64 {
    n
}

/// `bench.noop` under a rate limit it never reaches (`--limits`).
#[ferriq::task(name = "bench.rated", rate = "50000/s")]
async fn rated(n: u64) -> u64 {
    n
}

/// `bench.noop` under a concurrency limit it never reaches (`--limits`).
#[ferriq::task(name = "bench.slotted", concurrency = 1000)]
async fn slotted(n: u64) -> u64 {
    n
}

const CONCURRENCY: usize = 64;

async fn amqp(exchange: &str, queue: &str) -> AmqpBroker {
    let mut builder = AmqpBroker::builder(amqp_url())
        .exchange(exchange)
        .queues([queue])
        .prefetch(CONCURRENCY as u16)
        .publish_to_lanes_directly(flag("--direct"));
    let channels = arg("--publisher-channels", "");
    if !channels.is_empty() {
        builder = builder.publisher_channels(channels.parse().expect("--publisher-channels N"));
    }
    builder.connect().await.expect("RabbitMQ")
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

/// The Streams broker on the test Redis (which runs without `appendonly`: a benchmark's
/// queue may be lost with it).
async fn streams(queue: &str) -> ferriq_valkey::StreamBroker {
    ferriq_valkey::StreamBroker::builder(redis_url())
        .queues([queue])
        .allow_volatile(true)
        .connect()
        .await
        .expect("Redis")
}

/// A pool of `size` connections to the bench's Redis (its counters, the store floor's writes).
async fn redis_pool(size: usize) -> Result<fred::clients::Pool, Box<dyn std::error::Error>> {
    use fred::prelude::ClientLike;
    let pool = fred::clients::Pool::new(
        fred::prelude::Config::from_url(&redis_url())?,
        None,
        None,
        None,
        size,
    )?;
    pool.init().await?;
    Ok(pool)
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
                .only(&[noop::NAME, rated::NAME, slotted::NAME])
                .unwrap(),
        )
        .concurrency(CONCURRENCY)
        // `--history 0`: the worker adds nothing to the store's history.
        .history(arg("--history", "1") != "0")
        .build()
        .unwrap()
}

/// The worker process of `--broker amqp|sqs`: runs until its stdin closes.
async fn worker_process(kind: String, exchange: String, queue: String, prefix: String) {
    let broker: Arc<dyn Broker> = match kind.as_str() {
        "sqs" => Arc::new(sqs(&arg("--endpoint", ""), &queue).await),
        "redis" => Arc::new(streams(&queue).await),
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

/// `--features mimalloc`: the allocator a worker binary may choose instead of the system's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The system's, counting allocations while the memory engine runs.
#[cfg(not(feature = "mimalloc"))]
#[global_allocator]
static ALLOCATOR: allocs::Counting = allocs::Counting;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `RUST_LOG=warn` (or any filter): both processes log to stderr (the worker's stderr is
    // the bench's).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
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
        "amqp" if arg("--history-ab", "0") != "0" => {
            return history_rounds(tag, n, arg("--history-ab", "0").parse()?).await;
        }
        "amqp" if arg("--limits", "0") != "0" => {
            return limits_rounds(tag, n, arg("--limits", "0").parse()?).await;
        }
        "amqp" if arg("--rounds", "0") != "0" => {
            return amqp_rounds(tag, n, lat_n, arg("--rounds", "0").parse()?).await;
        }
        "memory" if arg("--rounds", "0") != "0" => {
            return compare_middlewares(n, lat_n, arg("--rounds", "0").parse()?).await;
        }
        "memory" => {
            #[cfg(not(feature = "mimalloc"))]
            allocs::start();
            let figures = memory_round(n, lat_n, middlewares()).await?;
            #[cfg(not(feature = "mimalloc"))]
            println!(
                "engine_allocs_per_task={:.1} (allocation calls in ferriq's run: client, broker, worker, store; ÷ {} tasks)",
                allocs::stop() as f64 / (n as usize + lat_n) as f64,
                n as usize + lat_n
            );
            if flag("--no-raw") {
                // For `scripts/engine-cost.sh`: the whole run is ferriq's.
                return Ok(());
            }
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
            let meter = Meter::new(vec![
                ("producer", Some(std::process::id())),
                ("worker", Some(world.pid)),
                ("RabbitMQ", find_process("beam.smp")),
                ("Redis", find_process("redis-server")),
            ]);
            let figures = drive(&world.client, n, lat_n, &meter).await;
            let rss = peak_rss_mib(world.pid);
            world.stop_worker().await;
            let raw = raw_lapin(&format!("fqbench.{tag}.raw"), n, CONCURRENCY as u16).await;
            let rtt_queue = format!("fqbench.{tag}.rtt");
            let raw_rtt = raw_lapin_round_trips(&rtt_queue, lat_n, false).await;
            let raw_rtt_apart = raw_lapin_round_trips(&rtt_queue, lat_n, true);
            let (raw_rtt_apart, raw_rtt_cost) = metered(&meter, lat_n, raw_rtt_apart).await;
            if let Some(steady) = &figures.steady {
                let secs = arg("--steady", "0").parse().unwrap_or(0);
                let (cpu_before, busy) = (meter.read(), MachineBusy::start());
                let raw =
                    raw_lapin_steady(&format!("fqbench.{tag}.steady"), steady.rate, secs).await;
                let cpu_us = meter.per_task_us(&cpu_before, raw.len().max(1) as u64);
                let busy = busy.share();
                let q = |x| percentile(&raw, x);
                println!(
                    "raw RabbitMQ open loop at the same rate ({:.0}/s, publish + confirm + deliver + ack; no store) latency p50 / p99 / p99.9 / max: {:.2} / {:.2} / {:.2} / {:.2} ms",
                    steady.rate,
                    q(50.0),
                    q(99.0),
                    q(99.9),
                    q(100.0)
                );
                let cpu: Vec<_> = meter
                    .names()
                    .into_iter()
                    .map(raw_client_name)
                    .zip(cpu_us)
                    .collect();
                println!(
                    "raw RabbitMQ open loop CPU per message: {}; the machine's CPU busy {:.0} %",
                    fmt_cpu(&cpu),
                    busy * 100.0
                );
            }
            println!(
                "raw RabbitMQ round trip (publish, confirm, deliver, ack; no store) p50 / p99: {:.2} / {:.2} ms; consumer on a connection of its own (as a worker is): {:.2} / {:.2} ms, per round trip {}",
                percentile(&raw_rtt, 50.0),
                percentile(&raw_rtt, 99.0),
                percentile(&raw_rtt_apart, 50.0),
                percentile(&raw_rtt_apart, 99.0),
                fmt_cost(&as_raw_client(raw_rtt_cost))
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
            let meter = Meter::new(vec![
                ("producer", Some(std::process::id())),
                ("worker", Some(pid)),
                ("Redis", find_process("redis-server")),
            ]);
            let figures = drive(&client, n, lat_n, &meter).await;
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
        "redis" => {
            let (queue, prefix) = (format!("fqbench.{tag}"), format!("fqbench{tag}"));
            let store = Arc::new(valkey(&prefix).await);
            let client = Client::new(Arc::new(streams(&queue).await), store.clone());
            let mut child = tokio::process::Command::new(std::env::current_exe()?)
                .args(["--role", "worker", "--broker", "redis", "--queue", &queue])
                .args(["--prefix", &prefix])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            let pid = child.id().unwrap_or(0);
            let meter = Meter::new(vec![
                ("producer", Some(std::process::id())),
                ("worker", Some(pid)),
                ("Redis", find_process("redis-server")),
            ]);
            let figures = drive(&client, n, lat_n, &meter).await;
            let rss = peak_rss_mib(pid);
            drop(child.stdin.take());
            let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
            let raw = ferriq_examples::raw_streams::raw_streams(
                &redis_url(),
                &format!("{queue}.raw"),
                n,
                false,
            )
            .await;
            let floor = ferriq_examples::raw_streams::raw_streams(
                &redis_url(),
                &format!("{queue}.floor"),
                n,
                true,
            )
            .await;
            println!(
                "raw streams + store floor (two keys per message, in the same pipelines): {floor:.0} msgs/s; ferriq / that: {:.3}",
                figures.e2e_per_s / floor
            );
            let _ = store.purge_prefix().await;
            (figures, raw, rss, "Redis Streams broker + Redis claims/results (one server), worker in its own process")
        }
        other => {
            return Err(format!("--broker must be amqp, sqs, redis or memory, not {other}").into())
        }
    };

    report(&figures, raw, rss, what, n, lat_n);
    Ok(())
}
