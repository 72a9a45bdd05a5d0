//! The load a run drives through a client: warm-up, the bulk, round trips (steady load in
//! `steady`), and the report of one run.

use super::steady::{singles, steady, Steady, SINGLES_IN_FLIGHT};
use super::*;
use ferriq_examples::cpu::{cpu_by_thread, threads_per_task};

pub(super) struct Figures {
    pub(super) enqueue_per_s: f64,
    pub(super) e2e_per_s: f64,
    pub(super) lat_ms: Vec<f64>,
    /// What each metered process spent per sequential round trip.
    pub(super) round_trip_cost: Vec<Cost>,
    /// CPU µs per task this process spent over the bulk run (for `--broker memory`, the
    /// whole engine: client, broker, worker and store).
    pub(super) bench_cpu_us: f64,
    /// Tasks per second of single enqueues, [`SINGLES_IN_FLIGHT`] at a time, each awaiting
    /// its result (`--steady` only: the maximum its load is a share of).
    pub(super) singles_per_s: Option<f64>,
    /// Steady load (`--steady SECS`).
    pub(super) steady: Option<Steady>,
    /// What the worker process's threads spent per task over the bulk run, by thread name:
    /// CPU µs and context switches (empty when the worker runs in this process).
    pub(super) worker_threads: Vec<(String, f64, f64)>,
}

/// Readiness and warm-up (not recorded): one task, then 200.
pub(super) async fn warm_up(client: &Client) {
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
pub(super) async fn bulk(client: &Client, n: u64) -> (Duration, Duration) {
    bulk_of(client, n, noop::call).await
}

/// [`bulk`] with calls made by `call` (a task returning its argument).
pub(super) async fn bulk_of(
    client: &Client,
    n: u64,
    call: fn(u64) -> ferriq::Call<u64>,
) -> (Duration, Duration) {
    let wait = Duration::from_secs(120);
    let start = Instant::now();
    let mut handles = Vec::with_capacity(n as usize);
    let ids: Vec<u64> = (0..n).collect();
    for chunk in ids.chunks(1000) {
        handles.extend(
            client
                .enqueue_batch(chunk.iter().map(|i| call(*i)))
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

/// What one process spent per task over a phase: its name, CPU µs and context switches.
pub(super) type Cost = (&'static str, f64, f64);

/// Runs `phase` of `tasks` tasks, and what each process of `meter` spent per task on it.
pub(super) async fn metered<T>(
    meter: &Meter,
    tasks: usize,
    phase: impl std::future::Future<Output = T>,
) -> (T, Vec<Cost>) {
    let (cpu, switches) = (meter.read(), meter.read_switches());
    let out = phase.await;
    let tasks = tasks.max(1) as u64;
    let cpu = meter.per_task_us(&cpu, tasks);
    let switches = meter.switches_per_task(&switches, tasks);
    let names = meter.names().into_iter();
    let cost = names
        .zip(cpu.into_iter().zip(switches))
        .map(|(name, (cpu, switches))| (name, cpu, switches))
        .collect();
    (out, cost)
}

/// The name of the bench process while the raw baselines run: then it is raw lapin's
/// publisher and consumer together (the worker has exited). Other names stay.
pub(super) fn raw_client_name(name: &'static str) -> &'static str {
    match name {
        "producer" | "bench process" => "raw client",
        other => other,
    }
}

/// `cost` of a raw baseline, the bench process named as its raw client.
pub(super) fn as_raw_client(cost: Vec<Cost>) -> Vec<Cost> {
    cost.into_iter()
        .map(|(name, us, switches)| (raw_client_name(name), us, switches))
        .collect()
}

/// `name N µs, S switches; …` (processes not found are left out).
pub(super) fn fmt_cost(cost: &[Cost]) -> String {
    cost.iter()
        .filter(|(_, us, _)| us.is_finite())
        .map(|(name, us, switches)| format!("{name} {us:.0} µs, {switches:.1} switches"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `lat_n` sequential round trips (enqueue one, await its result), in ms, sorted.
pub(super) async fn round_trips(client: &Client, lat_n: usize) -> Vec<f64> {
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

/// Warm-up, the bulk, round trips and (with `--steady`) steady load; `meter` names the
/// processes whose CPU the steady load is charged to.
pub(super) async fn drive(client: &Client, n: u64, lat_n: usize, meter: &Meter) -> Figures {
    warm_up(client).await;
    let cpu_before = cpu_seconds(std::process::id()).unwrap_or(f64::NAN);
    let worker = meter.pid("worker");
    let threads_before = worker.and_then(cpu_by_thread);
    let (enqueued, e2e) = bulk(client, n).await;
    let cpu_after = cpu_seconds(std::process::id()).unwrap_or(f64::NAN);
    let worker_threads = match (threads_before, worker.and_then(cpu_by_thread)) {
        (Some(before), Some(after)) => threads_per_task(&before, &after, n),
        _ => Vec::new(),
    };
    let (lat_ms, round_trip_cost) = metered(meter, lat_n, round_trips(client, lat_n)).await;
    let steady_secs: u64 = arg("--steady", "0").parse().unwrap_or(0);
    let (singles_per_s, steady) = if steady_secs > 0 {
        let singles_per_s = singles(client, n, SINGLES_IN_FLIGHT).await;
        let rate = arg("--rate", "0")
            .parse::<f64>()
            .ok()
            .filter(|r| *r > 0.0)
            .unwrap_or(singles_per_s * 0.7);
        (
            Some(singles_per_s),
            Some(steady(client, rate, steady_secs, meter).await),
        )
    } else {
        (None, None)
    };
    Figures {
        singles_per_s,
        steady,
        enqueue_per_s: n as f64 / enqueued.as_secs_f64(),
        e2e_per_s: n as f64 / e2e.as_secs_f64(),
        lat_ms,
        round_trip_cost,
        bench_cpu_us: (cpu_after - cpu_before) * 1e6 / n as f64,
        worker_threads,
    }
}

/// `name N µs, …` (processes not found are left out).
pub(super) fn fmt_cpu(cpu_us: &[(&str, f64)]) -> String {
    cpu_us
        .iter()
        .filter(|(_, us)| us.is_finite())
        .map(|(name, us)| format!("{name} {us:.0} µs"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn fmt_runs(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn report(figures: &Figures, raw: f64, rss: f64, what: &str, n: u64, lat_n: usize) {
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
    println!(
        "| per sequential round trip: CPU, context switches | {} |",
        fmt_cost(&figures.round_trip_cost)
    );
    if !figures.worker_threads.is_empty() {
        let threads: Vec<String> = figures
            .worker_threads
            .iter()
            .map(|(name, cpu, switches)| format!("{name} {cpu:.1} µs ({switches:.2})"))
            .collect();
        println!(
            "| worker CPU per task by thread over the bulk run (context switches) | {} |",
            threads.join(", ")
        );
    }
    println!("| worker peak RSS | {rss:.1} MiB |");
    if let Some(singles) = figures.singles_per_s {
        println!(
            "| single enqueues, {SINGLES_IN_FLIGHT} at a time, each awaiting its result | {singles:.0} tasks/s |"
        );
    }
    if let Some(steady) = &figures.steady {
        let lat = &steady.lat_ms;
        let q = |x| percentile(lat, x);
        println!(
            "| steady load: {:.0} tasks/s offered, enqueued at {:.0}/s, {} tasks: latency p50 / p99 / p99.9 / max | {:.2} / {:.2} / {:.2} / {:.2} ms |",
            steady.rate,
            steady.enqueued_per_s,
            lat.len(),
            q(50.0),
            q(99.0),
            q(99.9),
            q(100.0)
        );
        if let Some(r) = &steady.stall {
            println!(
                "| steady load: worker stopped {} ms at {:.0} s: a second's p99 before (median) / peak after / back within 2× that after | {:.2} ms / {:.0} ms / {} |",
                r.for_ms,
                r.at_s,
                r.before_p99_ms,
                r.peak_ms,
                r.recovered_after_s
                    .map_or("not within the run".to_owned(), |s| format!("{s:.1} s"))
            );
        }
        println!(
            "| steady load: CPU per task; the machine's CPU busy | {}; {:.0} % |",
            fmt_cpu(&steady.cpu_us),
            steady.busy * 100.0
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
