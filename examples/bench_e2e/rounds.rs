//! `--broker amqp --rounds N`: ferriq and the raw baselines interleaved, with CPU per task.

use super::*;

/// A unique exchange, lane and key prefix on RabbitMQ + Redis, a client on them, and a worker
/// process (`--role worker`) serving them.
pub(super) struct AmqpWorld {
    pub(super) exchange: String,
    pub(super) queue: String,
    pub(super) store: Arc<ValkeyStore>,
    pub(super) client: Client,
    pub(super) child: tokio::process::Child,
    pub(super) pid: u32,
}

impl AmqpWorld {
    pub(super) async fn start(tag: &str) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(tag, &[]).await
    }

    /// A world whose worker process gets `worker_args` too (`--history 0`).
    pub(super) async fn start_with(
        tag: &str,
        worker_args: &[&str],
    ) -> Result<Self, Box<dyn std::error::Error>> {
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
            .args(worker_args)
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
    pub(super) async fn stop_worker(&mut self) {
        drop(self.child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }

    /// Deletes the keys and the RabbitMQ topology the run made.
    pub(super) async fn remove(self) {
        let _ = self.store.purge_prefix().await;
        ferriq_examples::delete_amqp_topology(&self.exchange, &self.queue).await;
    }
}

/// `--broker amqp --rounds R`: R rounds, each ferriq's bulk run of N tasks then raw lapin's
/// N messages on a fresh queue three ways (as written in lapin's examples; pipelined; pipelined
/// with the two `SET`s of the store floor per message), back to back, and the last of them
/// through amqprs (a client doing its I/O on the runtime's tasks); then the round-trip sets. One worker process throughout (idle while raw runs). Single runs swing 10–20 % on a
/// shared 2-core machine; the median of R interleaved ratios is the figure to compare.
pub(super) async fn amqp_rounds(
    tag: &str,
    n: u64,
    lat_n: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use fred::prelude::ClientLike;
    let mut world = AmqpWorld::start(tag).await?;
    warm_up(&world.client).await;
    let floor_pool = super::redis_pool(4).await?;
    let route = if flag("--direct") {
        "published to the lane directly"
    } else {
        "published through the topic exchange"
    };
    println!("ferriq bench_e2e --rounds {rounds}: RabbitMQ quorum queue ({route}) + Redis, worker in its own process; N={n}, concurrency {CONCURRENCY}");
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!("| round | enqueue tasks/s | end to end tasks/s | raw msgs/s | ratio | raw pipelined msgs/s | ratio | raw pipelined + store floor msgs/s | ratio | the same through amqprs msgs/s | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let (mut e2e, mut ratios, mut piped, mut floored, mut on_runtime) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // CPU per task of each process, per round: ferriq's run, raw lapin's, the floor's.
    let meter = Meter::new(vec![
        ("bench process", Some(std::process::id())),
        ("worker", Some(world.pid)),
        ("RabbitMQ", find_process("beam.smp")),
        ("Redis", find_process("redis-server")),
    ]);
    let (mut cpu, mut raw_cpu, mut floor_cpu, mut amqprs_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let before = meter.read();
        let (enqueued, took) = bulk(&world.client, n).await;
        cpu.push(meter.per_task_us(&before, n));
        // Every round on the same keyspace, as the floor's (which deletes its keys): left in
        // place, each round's keys grow the server's table, and the round that crosses a
        // power of two pays for its rehash.
        let _ = world.store.purge_prefix().await;
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
        let before = meter.read();
        let raw_on_runtime = raw_amqprs(
            &format!("fqbench.{tag}.amqprs{round}"),
            n,
            prefetch,
            Some(&floor_pool),
        )
        .await;
        amqprs_cpu.push(meter.per_task_us(&before, n));
        let per_s = n as f64 / took.as_secs_f64();
        println!(
            "| {round} | {:.0} | {per_s:.0} | {raw:.0} | {:.3} | {raw_piped:.0} | {:.3} | {raw_floor:.0} | {:.3} | {raw_on_runtime:.0} | {:.3} |",
            n as f64 / enqueued.as_secs_f64(),
            per_s / raw,
            per_s / raw_piped,
            per_s / raw_floor,
            per_s / raw_on_runtime
        );
        on_runtime.push(per_s / raw_on_runtime);
        e2e.push(per_s);
        ratios.push(per_s / raw);
        piped.push(per_s / raw_piped);
        floored.push(per_s / raw_floor);
    }
    let _ = floor_pool.quit().await;
    let (lat_ms, cost) = metered(&meter, lat_n, round_trips(&world.client, lat_n)).await;
    let rss = peak_rss_mib(world.pid);
    world.stop_worker().await;
    let rtt_queue = format!("fqbench.{tag}.rtt");
    let raw_rtt = raw_lapin_round_trips(&rtt_queue, lat_n, false).await;
    let raw_rtt_apart = raw_lapin_round_trips(&rtt_queue, lat_n, true);
    let (raw_rtt_apart, raw_cost) = metered(&meter, lat_n, raw_rtt_apart).await;
    let amqprs_queue = format!("{rtt_queue}.amqprs");
    let amqprs_rtt = raw_amqprs_round_trips(&amqprs_queue, lat_n);
    let (amqprs_rtt, amqprs_cost) = metered(&meter, lat_n, amqprs_rtt).await;
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
            (
                "raw pipelined + store floor through amqprs",
                &amqprs_cpu,
                false,
            ),
        ],
    );
    let apart = |q| percentile(&raw_rtt_apart, q);
    let amqprs_apart = |q| percentile(&amqprs_rtt, q);
    // The worker's own cost per task: what users pay on their pods.
    let worker_cpu = meter
        .names()
        .iter()
        .position(|name| *name == "worker")
        .and_then(|at| column_medians(&cpu).get(at).copied())
        .unwrap_or(f64::NAN);
    println!(
        "round trip p50 / p99: ferriq {:.2} / {:.2} ms, raw RabbitMQ (publish, confirm, deliver, ack) {:.2} / {:.2} ms, raw with the consumer on a connection of its own (as a worker is) {:.2} / {:.2} ms, the same through amqprs {:.2} / {:.2} ms",
        p(50.0),
        p(99.0),
        raw_p(50.0),
        raw_p(99.0),
        apart(50.0),
        apart(99.0),
        amqprs_apart(50.0),
        amqprs_apart(99.0)
    );
    println!(
        "per sequential round trip, CPU and context switches: ferriq {}; raw with the consumer apart {}; through amqprs {}",
        fmt_cost(&cost),
        fmt_cost(&as_raw_client(raw_cost)),
        fmt_cost(&as_raw_client(amqprs_cost))
    );
    println!(
        "median_e2e_tasks_per_s={:.0} median_ratio={:.3} min_ratio={:.3} max_ratio={:.3} median_ratio_pipelined={:.3} median_ratio_pipelined_floor={:.3} p50_ms={:.2} p99_ms={:.2} raw_rtt_p50_ms={:.2} raw_apart_rtt_p50_ms={:.2} rss_mib={rss:.1} cpu_us_per_task={:.1} worker_cpu_us_per_task={worker_cpu:.1} raw_cpu_us_per_msg={:.1} floor_cpu_us_per_msg={:.1} median_ratio_amqprs_floor={:.3} amqprs_floor_cpu_us_per_msg={:.1} amqprs_apart_rtt_p50_ms={:.2}",
        median(&mut e2e),
        median(&mut ratios),
        ratios[0],
        ratios[ratios.len() - 1],
        median(&mut piped),
        median(&mut floored),
        p(50.0),
        p(99.0),
        raw_p(50.0),
        apart(50.0),
        cpu_totals[0],
        cpu_totals[1],
        cpu_totals[2],
        median(&mut on_runtime),
        cpu_totals[3],
        amqprs_apart(50.0)
    );
    Ok(())
}

/// Prints the medians of each run's CPU µs per task by process, and returns each run's total
/// (the processes it used: the worker only for ferriq, whose run is the only one using it).
pub(super) fn print_cpu_table(
    names: &[&str],
    rounds: usize,
    runs: &[(&str, &[Vec<f64>], bool)],
) -> Vec<f64> {
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
