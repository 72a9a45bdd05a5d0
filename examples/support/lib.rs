//! Helpers shared by the backend examples, benchmarks and check programs: command-line
//! options, service URLs, and process measurements.

use std::time::Duration;

pub mod cpu;
pub mod raw;
pub mod raw_amqprs;
pub mod raw_streams;
pub mod sqs;

/// The value after `--name` on the command line, or `default`.
pub fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .rposition(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_owned())
}

/// Whether `--name` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// The RabbitMQ URL: `FERRIQ_TEST_AMQP_URL`, else the local server.
pub fn amqp_url() -> String {
    std::env::var("FERRIQ_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The Redis/Valkey URL: `FERRIQ_TEST_REDIS_URL`, else the local server.
pub fn redis_url() -> String {
    std::env::var("FERRIQ_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Peak resident set of a process, from /proc (MiB); NaN when unreadable.
pub fn peak_rss_mib(pid: u32) -> f64 {
    proc_status_kib(pid, "VmHWM:").map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Current resident set of a process, from /proc (MiB); NaN when unreadable.
pub fn rss_mib(pid: u32) -> f64 {
    proc_status_kib(pid, "VmRSS:").map_or(f64::NAN, |kb| kb / 1024.0)
}

fn proc_status_kib(pid: u32, field: &str) -> Option<f64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The `p`th percentile of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The CPU model, from /proc/cpuinfo (benchmarks print it: ratios differ between cores).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Polls `check` every 20 ms until it is true or `limit` passes; whether it became true.
pub async fn poll_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes a lane's queues (with its dead-letter queue and delay tiers at the default tiers)
/// and its exchange from RabbitMQ: what an example or check made for one run.
pub async fn delete_amqp_topology(exchange: &str, queue: &str) {
    let Ok(conn) =
        lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await
    else {
        return;
    };
    let mut names = vec![queue.to_owned(), format!("{queue}.dead_letter")];
    for tier in ["1s", "5s", "30s", "2m", "10m", "1h", "6h", "24h"] {
        names.push(format!("{queue}.delay.{tier}"));
    }
    // A channel per delete (an error closes the channel it happens on), each closed after:
    // closing the connection over open channels makes lapin log an error for each.
    for name in names {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .queue_delete(name.as_str().into(), Default::default())
                .await;
            let _ = ch.close(200, "".into()).await;
        }
    }
    if let Ok(ch) = conn.create_channel().await {
        let _ = ch
            .exchange_delete(exchange.into(), Default::default())
            .await;
        let _ = ch.close(200, "".into()).await;
    }
    let _ = conn.close(200, "".into()).await;
}
