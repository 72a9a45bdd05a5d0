//! Groups on the memory engine: enqueue and completion time of groups of no-op members, for
//! growing sizes, to show the cost per member does not grow with the group.
//!
//! ```text
//! cargo run --release --example bench_group -- [--sizes 1000,10000,100000]
//! ```
//!
//! The last line is `members=… enqueue_s=… complete_s=… us_per_member=… peak_rss_mib=…` for the
//! largest size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::workflow::Group;
use ferriq::{Client, Registry, Shutdown, Worker};
use ferriq_examples::{arg, peak_rss_mib};

#[ferriq::task(name = "bench.group.noop")]
async fn noop(n: u32) -> u32 {
    n
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sizes: Vec<u32> = arg("--sizes", "1000,10000,100000")
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    println!("CPU: {}", ferriq_examples::cpu_model());
    println!("| members | enqueue s | complete s | µs per member |");
    println!("|---|---|---|---|");
    let mut last = String::new();
    for size in sizes {
        let broker = Arc::new(MemoryBroker::new());
        let store = Arc::new(MemoryStore::new());
        let worker = Worker::builder()
            .broker(broker.clone())
            .store(store.clone())
            .registry(Registry::from_inventory()?.only(&[noop::NAME])?)
            .concurrency(64)
            .build()?;
        let shutdown = Shutdown::new();
        let running = tokio::spawn({
            let (worker, shutdown) = (worker.clone(), shutdown.clone());
            async move { worker.run(shutdown).await }
        });
        let client = Client::new(broker, store);
        let start = Instant::now();
        let group = client
            .enqueue_group(Group::new((0..size).map(noop::call)))
            .await?;
        let enqueued = start.elapsed();
        let summary = group.wait_done(Duration::from_secs(600)).await?;
        let completed = start.elapsed();
        assert_eq!(summary.succeeded, size);
        shutdown.drain();
        running.await?;
        let per_member = completed.as_secs_f64() * 1e6 / f64::from(size.max(1));
        println!(
            "| {size} | {:.3} | {:.3} | {per_member:.1} |",
            enqueued.as_secs_f64(),
            completed.as_secs_f64()
        );
        last = format!(
            "members={size} enqueue_s={:.3} complete_s={:.3} us_per_member={per_member:.1} peak_rss_mib={:.1}",
            enqueued.as_secs_f64(),
            completed.as_secs_f64(),
            peak_rss_mib(std::process::id())
        );
    }
    println!("{last}");
    Ok(())
}
