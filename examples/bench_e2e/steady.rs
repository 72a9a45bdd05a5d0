//! Steady load (`--steady SECS`): single enqueues offered at a fixed rate (an open loop),
//! their latencies, and the recovery after the worker is stalled (`--stall-worker MS`).

use super::*;

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
