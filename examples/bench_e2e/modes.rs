//! The other modes: worker memory under a backlog, and the memory engine with middlewares.

use super::*;

/// `--broker amqp --backlog N`: the worker process's resident set idle (connected, two
/// seconds after it is ready, nothing queued), then its peak while N tasks are enqueued as
/// fast as the producer can and drained.
pub(super) async fn rss_run(tag: &str, backlog: u64) -> Result<(), Box<dyn std::error::Error>> {
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
pub(super) async fn memory_round(
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
    // One process: the steady load's CPU is the whole engine's.
    let meter = Meter::new(vec![("engine", Some(std::process::id()))]);
    let figures = drive(&client, n, lat_n, &meter).await;
    shutdown.drain();
    running.await?;
    Ok(figures)
}

/// `--rounds R`: R rounds in this process, each a run without middleware then one with
/// `--middlewares N` (default 3), on fresh engines; medians and their ratio. One process and
/// interleaved rounds keep the machine's drift out of the comparison.
pub(super) async fn compare_middlewares(
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

/// `--broker amqp --history-ab R`: the same bulk runs on two workers alike but for history
/// (one with `--history 0`), alternating, R rounds each; throughput and worker CPU per task.
pub(super) async fn history_rounds(
    tag: &str,
    n: u64,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut on = AmqpWorld::start(&format!("{tag}h1")).await?;
    let mut off = AmqpWorld::start_with(&format!("{tag}h0"), &["--history", "0"]).await?;
    warm_up(&on.client).await;
    warm_up(&off.client).await;
    let meters = [
        Meter::new(vec![("worker", Some(on.pid))]),
        Meter::new(vec![("worker", Some(off.pid))]),
    ];
    let mut rate: [Vec<f64>; 2] = Default::default();
    let mut cpu: [Vec<f64>; 2] = Default::default();
    for round in 0..rounds {
        for k in 0..2 {
            let k = (k + round) % 2;
            let client = if k == 0 { &on.client } else { &off.client };
            let before = meters[k].read();
            let (_, took) = bulk_of(client, n, noop::call).await;
            cpu[k].push(meters[k].per_task_us(&before, n)[0]);
            rate[k].push(n as f64 / took.as_secs_f64());
            // Each run on the same keyspace (see `limits_rounds`).
            let _ = if k == 0 { &on.store } else { &off.store }
                .purge_prefix()
                .await;
        }
    }
    for w in [&mut on, &mut off] {
        w.stop_worker().await;
    }
    on.remove().await;
    off.remove().await;
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!("ferriq bench_e2e --history-ab {rounds}: RabbitMQ + Redis, workers in their own processes; N={n} per run, concurrency {CONCURRENCY}");
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!("| worker | end to end, median of {rounds} | worker CPU per task | runs |");
    println!("|---|---|---|---|");
    for (k, what) in ["history on (default)", "history off (FERRIQ_HISTORY=0)"]
        .iter()
        .enumerate()
    {
        println!(
            "| {what} | {:.0} tasks/s | {:.1} µs | {} |",
            median(&rate[k]),
            median(&cpu[k]),
            fmt_runs(&rate[k])
        );
    }
    println!(
        "history_on_tasks_per_s={:.0} history_off_tasks_per_s={:.0} history_ratio={:.3}",
        median(&rate[0]),
        median(&rate[1]),
        median(&rate[0]) / median(&rate[1])
    );
    Ok(())
}

/// `--broker amqp --limits R`: R rounds on RabbitMQ + Redis, each N tasks without a limit, N
/// under a rate limit they never reach (50,000/s) and N under a concurrency limit they never
/// reach (1,000 slots), in turns; medians and their ratios to the run without, each round's
/// ratio, and the CPU a task costs every process. What a limit costs when it does not bind:
/// its steps in the claim's script (and the slot's release in the result's).
pub(super) async fn limits_rounds(
    tag: &str,
    n: u64,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut world = AmqpWorld::start(tag).await?;
    warm_up(&world.client).await;
    type MakeCall = fn(u64) -> ferriq::Call<u64>;
    let kinds: [(&str, MakeCall); 3] = [
        ("no limit", noop::call),
        ("rate = \"50000/s\"", rated::call),
        ("concurrency = 1000", slotted::call),
    ];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let meter = Meter::new(vec![
        ("bench process", Some(std::process::id())),
        ("worker", Some(world.pid)),
        ("RabbitMQ", find_process("beam.smp")),
        ("Redis", find_process("redis-server")),
    ]);
    let mut cpu: Vec<Vec<Vec<f64>>> = vec![Vec::new(); kinds.len()];
    let stats_pool = redis_pool(1).await?;
    let mut stats = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        // Each round starts with another kind, so none always runs on a warmer worker.
        for k in 0..kinds.len() {
            let k = (k + round) % kinds.len();
            let before = meter.read();
            let stats_before = CommandStats::read(&stats_pool).await;
            let (_, took) = bulk_of(&world.client, n, kinds[k].1).await;
            cpu[k].push(meter.per_task_us(&before, n));
            runs[k].push(n as f64 / took.as_secs_f64());
            stats[k].push(
                CommandStats::read(&stats_pool)
                    .await
                    .per_task_since(&stats_before, n),
            );
            // Each run starts on the same keyspace: left in place, the runs' 40,000 keys
            // each grow the server's table past a power of two every few runs, and the run
            // that crosses it pays for the rehash (with three kinds and 20,000 tasks, always
            // the concurrency-limited one).
            let _ = world.store.purge_prefix().await;
        }
    }
    world.stop_worker().await;
    world.remove().await;
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let base = median(&runs[0]);
    println!("ferriq bench_e2e --limits {rounds}: RabbitMQ + Redis, worker in its own process; N={n} per run, concurrency {CONCURRENCY}");
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!("| task | end to end, median of {rounds} | of no limit | runs |");
    println!("|---|---|---|---|");
    for (k, (what, _)) in kinds.iter().enumerate() {
        let m = median(&runs[k]);
        println!(
            "| {what} | {m:.0} tasks/s | {:.3} | {} |",
            m / base,
            fmt_runs(&runs[k])
        );
    }
    let rows: Vec<(&str, &[Vec<f64>], bool)> = kinds
        .iter()
        .zip(&cpu)
        .map(|((what, _), c)| (*what, c.as_slice(), true))
        .collect();
    print_cpu_table(&meter.names(), rounds, &rows);
    let stats: Vec<_> = kinds.iter().map(|(what, _)| *what).zip(stats).collect();
    commandstats::print_table(&stats);
    // Two readings less open to the machine's drift than the ratio of medians (runs of one
    // kind differ by ±15 % on these machines): each round's runs side by side (minutes
    // apart at most), and what a task costs in CPU of every process (the broker, the store,
    // the worker, this process) — the throughput a machine that has no idle core gets.
    let paired = |k: usize| median(&ratios(&runs[k], &runs[0]));
    let totals: Vec<Vec<f64>> = cpu
        .iter()
        .map(|c| c.iter().map(|r| all_cpu(r)).collect())
        .collect();
    let by_cpu = |k: usize| median(&ratios(&totals[0], &totals[k]));
    println!("| task | per round, of the no-limit run beside it (median) | CPU of every process per task: no limit ÷ this (median of rounds) |");
    println!("|---|---|---|");
    for (k, (what, _)) in kinds.iter().enumerate().skip(1) {
        println!("| {what} | {:.3} | {:.3} |", paired(k), by_cpu(k));
    }
    println!(
        "no_limit_tasks_per_s={base:.0} rate_ratio={:.3} concurrency_ratio={:.3} rate_paired={:.3} concurrency_paired={:.3} rate_cpu_ratio={:.3} concurrency_cpu_ratio={:.3}",
        median(&runs[1]) / base,
        median(&runs[2]) / base,
        paired(1),
        paired(2),
        by_cpu(1),
        by_cpu(2)
    );
    Ok(())
}

/// Each round's `a` over its `b`.
fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a / b).collect()
}

/// The CPU of every process one round measured (a process not found counts nothing).
fn all_cpu(processes: &[f64]) -> f64 {
    processes.iter().filter(|v| !v.is_nan()).sum()
}
