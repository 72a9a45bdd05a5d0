//! The load a run drives through a client: warm-up, the bulk, round trips, steady load,
//! and the report of one run.

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

/// What a steady-load run offered and measured.
pub(super) struct Steady {
    /// Tasks per second offered.
    pub(super) rate: f64,
    /// Tasks per second the enqueues completed at (below `rate` when the client could not
    /// keep up).
    pub(super) enqueued_per_s: f64,
    /// Every task's latency from when it was due to be sent to its result, sorted.
    pub(super) lat_ms: Vec<f64>,
    /// CPU µs per task of each metered process over the run, named.
    pub(super) cpu_us: Vec<(&'static str, f64)>,
    /// The share of the machine's CPU (all cores, all processes) busy over the run.
    pub(super) busy: f64,
    /// With `--stall-worker MS`: how the run recovered from the worker's stall.
    pub(super) stall: Option<Recovery>,
}

/// `--stall-worker MS`: the worker process is stopped (`SIGSTOP`) for MS milliseconds halfway
/// through the steady load, as a long GC pause, a CPU-throttled pod or a stalled disk would
/// stop it, and the run reports how long the backlog took to clear.
pub(super) struct Recovery {
    /// Seconds into the run the worker was stopped.
    pub(super) at_s: f64,
    /// For how long.
    pub(super) for_ms: u64,
    /// A typical second's p99 latency before the stall: the median, over each whole second
    /// of the run before it, of that second's p99 (one bad second before the stall does not
    /// move it).
    pub(super) before_p99_ms: f64,
    /// The highest latency of a task due after the stall began.
    pub(super) peak_ms: f64,
    /// Seconds from the stall's start to the first whole second of tasks (due after the
    /// stall ended) whose p99 is back within twice `before_p99_ms` (None: not within the run).
    pub(super) recovered_after_s: Option<f64>,
}

impl Recovery {
    /// Reads the recovery off the run's timings (in the order they were due).
    fn measure(at_s: f64, for_ms: u64, timings: &[Timing]) -> Recovery {
        // Each whole second's latencies, by when the tasks were due (one pass).
        let mut seconds: Vec<Vec<f64>> = Vec::new();
        for t in timings {
            let s = t.due_s as usize;
            if seconds.len() <= s {
                seconds.resize_with(s + 1, Vec::new);
            }
            seconds[s].push(t.result_ms);
        }
        let p99 = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            percentile(v, 99.0)
        };
        let mut before: Vec<f64> = seconds
            .iter_mut()
            .take(at_s as usize)
            .filter(|v| !v.is_empty())
            .map(p99)
            .collect();
        before.sort_by(|a, b| a.total_cmp(b));
        let before_p99_ms = percentile(&before, 50.0);
        let peak_ms = timings
            .iter()
            .filter(|t| t.due_s >= at_s)
            .map(|t| t.result_ms)
            .fold(0.0, f64::max);
        // The last second may be cut short by the run's end: not counted.
        let full = seconds.len().saturating_sub(1);
        let first_after = (at_s + for_ms as f64 / 1000.0).ceil() as usize;
        let recovered_after_s = (first_after..full)
            .find(|&s| !seconds[s].is_empty() && p99(&mut seconds[s]) <= 2.0 * before_p99_ms)
            .map(|s| s as f64 - at_s);
        Recovery {
            at_s,
            for_ms,
            before_p99_ms,
            peak_ms,
            recovered_after_s,
        }
    }
}

/// Single enqueues at most this many at a time: the maximum rate of single enqueues.
pub(super) const SINGLES_IN_FLIGHT: usize = 256;

/// The most tasks per second single enqueues reach: `n` tasks, `in_flight` senders each
/// enqueueing one task (its own publish and confirm) and awaiting its result, then the next.
/// Steady load enqueues one task at a time, as an app's requests do: its "70 % of the maximum"
/// is a share of this, not of the bulk rate (batches of 1000 share a publish and a confirm
/// round and cost the machine a fraction of the CPU per task).
pub(super) async fn singles(client: &Client, n: u64, in_flight: usize) -> f64 {
    let wait = Duration::from_secs(120);
    let start = Instant::now();
    futures_util::stream::iter(0..n)
        .for_each_concurrent(in_flight, |i| async move {
            let h = noop::kiq(client, i).await.expect("enqueue");
            assert_eq!(h.wait(wait).await.expect("result"), i, "wrong result");
        })
        .await;
    n as f64 / start.elapsed().as_secs_f64()
}

/// `--steady SECS`: after the burst, `SECS` of load at 70 % of the single enqueues' maximum
/// ([`singles`]), or `--rate R` tasks/s. Open loop: each task is enqueued by a runtime task of its own when
/// it is due, as the requests of a busy app would enqueue them, so a slow enqueue neither
/// lowers the rate nor holds back the next (one enqueue at a time waits for its publisher
/// confirm, which caps a single sender far below the rates measured here). Each task's latency
/// counts from when it was due to its result; the runtime's timer wakes the sender to the
/// millisecond, so a task may start up to ~1 ms after it was due, and that is counted too.
/// `--steady-csv FILE` writes every task's timing; `--stall-worker MS` stops the worker
/// process for MS ms halfway through ([`Recovery`]).
pub(super) async fn steady(client: &Client, rate: f64, secs: u64, meter: &Meter) -> Steady {
    let (cpu_before, busy) = (meter.read(), MachineBusy::start());
    let wait = Duration::from_secs(120);
    let total = (rate * secs as f64) as u64;
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let lat = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total as usize)));
    // (enqueues that completed, when the last one did)
    let enqueued = Arc::new(std::sync::Mutex::new((0u64, Duration::ZERO)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut failed = Failures::default();
    let stall_ms: u64 = arg("--stall-worker", "0").parse().unwrap_or(0);
    let stall_at_s = secs as f64 / 2.0;
    let stall = match meter.pid("worker") {
        Some(pid) if stall_ms > 0 => Some(tokio::spawn(async move {
            tokio::time::sleep_until((start + Duration::from_secs_f64(stall_at_s)).into()).await;
            signal(pid, "-STOP").await;
            tokio::time::sleep(Duration::from_millis(stall_ms)).await;
            signal(pid, "-CONT").await;
        })),
        None if stall_ms > 0 => {
            eprintln!(
                "--stall-worker: this broker's worker is not a process of its own; not stalled"
            );
            None
        }
        _ => None,
    };
    for i in 0..total {
        let due = start + period.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let (client, lat, enqueued) = (client.clone(), lat.clone(), enqueued.clone());
        tasks.spawn(async move {
            let h = match noop::kiq(&client, i).await {
                Ok(h) => h,
                Err(e) => return Err(format!("enqueue: {e}")),
            };
            let enq_ms = due.elapsed().as_secs_f64() * 1000.0;
            {
                let mut enqueued = enqueued.lock().unwrap();
                enqueued.0 += 1;
                enqueued.1 = enqueued.1.max(start.elapsed());
            }
            if let Err(e) = h.wait(wait).await {
                return Err(format!("wait: {e}"));
            }
            lat.lock().unwrap().push(Timing {
                due_s: (due - start).as_secs_f64(),
                enqueued_ms: enq_ms,
                result_ms: due.elapsed().as_secs_f64() * 1000.0,
            });
            Ok(())
        });
        // Reap finished tasks as we go.
        while let Some(done) = tasks.try_join_next() {
            failed.note(done);
        }
    }
    while let Some(done) = tasks.join_next().await {
        failed.note(done);
    }
    let stalled = match stall {
        Some(stall) => stall.await.is_ok(),
        None => false,
    };
    if failed.count > 0 {
        eprintln!(
            "steady load: {} of {total} tasks failed; first error: {}",
            failed.count, failed.first
        );
    }
    let mut timings = std::mem::take(&mut *lat.lock().unwrap());
    timings.sort_by(|a, b| a.due_s.total_cmp(&b.due_s));
    let csv = arg("--steady-csv", "");
    if !csv.is_empty() {
        if let Err(e) = write_csv(&csv, &timings) {
            eprintln!("--steady-csv {csv}: {e}");
        }
    }
    let stall = stalled.then(|| Recovery::measure(stall_at_s, stall_ms, &timings));
    let mut lat_ms: Vec<f64> = timings.iter().map(|t| t.result_ms).collect();
    lat_ms.sort_by(|a, b| a.total_cmp(b));
    let (count, enqueued_in) = *enqueued.lock().unwrap();
    let cpu_us = meter.per_task_us(&cpu_before, lat_ms.len().max(1) as u64);
    Steady {
        cpu_us: meter.names().into_iter().zip(cpu_us).collect(),
        busy: busy.share(),
        stall,
        rate,
        enqueued_per_s: if count == 0 {
            0.0
        } else {
            count as f64 / enqueued_in.as_secs_f64()
        },
        lat_ms,
    }
}

/// Sends a signal to a process with `kill` (a stalled worker must resume even if this fails
/// halfway: the `CONT` is sent whatever the `STOP` did).
async fn signal(pid: u32, which: &str) {
    let sent = tokio::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .await;
    if !matches!(sent, Ok(s) if s.success()) {
        eprintln!("--stall-worker: kill {which} {pid} failed: {sent:?}");
    }
}

/// When one task of a steady-load run was due and how long it took.
struct Timing {
    /// Seconds into the run it was due.
    due_s: f64,
    /// Milliseconds from due to its enqueue returning (publisher confirm included).
    enqueued_ms: f64,
    /// Milliseconds from due to its result at the caller.
    result_ms: f64,
}

/// `--steady-csv FILE`: one line per task, in the order they were due, to see when a tail
/// happened and whether the enqueue or the rest of the way held it.
fn write_csv(path: &str, timings: &[Timing]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "due_s,enqueued_ms,result_ms")?;
    for t in timings {
        writeln!(
            out,
            "{:.4},{:.3},{:.3}",
            t.due_s, t.enqueued_ms, t.result_ms
        )?;
    }
    out.flush()
}

/// Tasks of a steady-load run that got no result, and the first reason.
#[derive(Default)]
struct Failures {
    count: u64,
    first: String,
}

impl Failures {
    fn note(&mut self, done: Result<Result<(), String>, tokio::task::JoinError>) {
        let why = match done {
            Ok(Ok(())) => return,
            Ok(Err(why)) => why,
            Err(e) => e.to_string(),
        };
        if self.count == 0 {
            self.first = why;
        }
        self.count += 1;
    }
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
