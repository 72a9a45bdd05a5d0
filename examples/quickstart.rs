//! ferriq on the embedded default: an in-memory broker and store, a worker and a client in one
//! process. No server needed: `cargo run --example quickstart`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferriq::memory::{MemoryBroker, MemoryStore};
use ferriq::{Client, Registry, Shutdown, State, TaskContext, TaskError, WaitError, Worker};

/// A plain task: two arguments, one result.
#[ferriq::task(name = "quickstart.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

/// Shared app state handed to tasks that ask for it.
struct Inventory {
    calls: AtomicU32,
}

/// A flaky task: its first attempt fails with a retryable error, the retry (1 s later)
/// succeeds. A retry never waits less than the worker's `min_defer` (1 s by default).
#[ferriq::task(name = "quickstart.reserve", max_attempts = 3, backoff_initial = 1.0)]
async fn reserve(
    ctx: TaskContext,
    stock: State<Inventory>,
    sku: String,
    qty: u32,
) -> Result<String, TaskError> {
    stock.calls.fetch_add(1, Ordering::SeqCst);
    if ctx.attempt() == 1 {
        return Err(TaskError::retryable("warehouse API timed out"));
    }
    Ok(format!(
        "reserved {qty} x {sku} on attempt {}",
        ctx.attempt()
    ))
}

/// A task that takes longer than its timeout on every attempt.
#[ferriq::task(name = "quickstart.slow_report", timeout = 0.3, max_attempts = 2)]
async fn slow_report(pages: u32) -> u32 {
    tokio::time::sleep(Duration::from_secs(10)).await;
    pages
}

/// A task that rejects bad input for good: no retry.
#[ferriq::task(name = "quickstart.charge")]
async fn charge(cents: i64) -> Result<i64, TaskError> {
    if cents <= 0 {
        return Err(TaskError::fatal(format!("cannot charge {cents} cents")));
    }
    Ok(cents)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = Arc::new(MemoryBroker::new());
    let store = Arc::new(MemoryStore::new());
    let registry = Registry::from_inventory()?.only(&[
        add::NAME,
        reserve::NAME,
        slow_report::NAME,
        charge::NAME,
    ])?;
    let worker = Worker::builder()
        .broker(broker.clone())
        .store(store.clone())
        .registry(registry)
        .state(Inventory {
            calls: AtomicU32::new(0),
        })
        .concurrency(8)
        .grace(Duration::from_secs(2))
        .build()?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });

    let client = Client::new(broker.clone(), store.clone());
    let wait = Duration::from_secs(10);

    let sums = client
        .enqueue_batch((0..5).map(|i| add::call(i, 10)))
        .await?;
    let reservation = reserve::kiq(&client, "SKU-42".into(), 3).await?;
    let report = slow_report::kiq(&client, 12).await?;
    let bad_charge = charge::kiq(&client, -5).await?;

    for handle in &sums {
        println!("add            -> {}", handle.wait(wait).await?);
    }
    println!("reserve        -> {}", reservation.wait(wait).await?);
    match report.wait(wait).await {
        Err(WaitError::Failed(f)) => println!(
            "slow_report    -> failed: {f} (after {} attempts)",
            f.attempts
        ),
        other => return Err(format!("slow_report should time out, got {other:?}").into()),
    }
    match bad_charge.wait(wait).await {
        Err(WaitError::Failed(f)) => println!("charge(-5)     -> failed: {f}"),
        other => return Err(format!("charge(-5) should fail, got {other:?}").into()),
    }
    // The result is written before the message is parked, so drain first: once the worker has
    // stopped, every delivery is settled and the dead-letter queue is complete.
    shutdown.drain();
    running.await?;
    let parked: Vec<_> = broker
        .dead_letters()
        .iter()
        .map(|d| d.why.reason.as_str())
        .collect();
    println!("dead-lettered  -> {} message(s): {parked:?}", parked.len());
    let stats = worker.stats();
    println!(
        "worker         -> {} runs started, {} results written",
        stats.started,
        store.total_writes()
    );
    Ok(())
}
