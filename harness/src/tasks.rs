//! The tasks the worker processes serve, and the events their bodies report to the harness's
//! collector (a file per worker process, appended one line per event: outside ferriq's own
//! counters, and surviving the process's death).

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use ferriq::{TaskContext, TaskError};

/// The events file of this process (from `FAULT_EVENTS`).
static EVENTS: Mutex<Option<std::fs::File>> = Mutex::new(None);

/// Opens this process's events file.
pub fn open_events(path: &str) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the events file opens");
    *EVENTS.lock().unwrap_or_else(|p| p.into_inner()) = Some(file);
}

fn now_ms() -> u64 {
    ferriq::clock::Clock::system().now_unix_ms()
}

/// Appends `kind id attempt pid ms` in one write (the kernel keeps it if the process dies).
pub fn report(kind: &str, ctx: &TaskContext) {
    let line = format!(
        "{kind} {} {} {} {}\n",
        ctx.task_id(),
        ctx.attempt(),
        std::process::id(),
        now_ms()
    );
    if let Some(f) = EVENTS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Works for `ms` milliseconds.
#[ferriq::task(name = "fault.work", max_attempts = 3, backoff_initial = 0.2)]
pub async fn work(ctx: TaskContext, ms: u64) -> Result<u64, TaskError> {
    report("start", &ctx);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    report("done", &ctx);
    Ok(ms)
}

/// Slots of `fault.limited`, across every worker.
pub const LIMITED_SLOTS: usize = 2;

/// Works for `ms` milliseconds, at most [`LIMITED_SLOTS`] runs at once across every worker.
#[ferriq::task(name = "fault.limited", max_attempts = 3, concurrency = 2)]
pub async fn limited(ctx: TaskContext, ms: u64) -> Result<u64, TaskError> {
    report("start", &ctx);
    // A run its worker cuts off (its claim or delivery lost, a shutdown) ends too: its body
    // is dropped, and says so, or the runs at once would count it running for ever.
    let mut cut = ReportOnDrop(Some(ctx.clone()));
    tokio::time::sleep(Duration::from_millis(ms)).await;
    cut.0 = None;
    report("done", &ctx);
    Ok(ms)
}

/// Reports `cut` when dropped (a run's body cut off before its end).
struct ReportOnDrop(Option<TaskContext>);

impl Drop for ReportOnDrop {
    fn drop(&mut self) {
        if let Some(ctx) = self.0.take() {
            report("cut", &ctx);
        }
    }
}

/// Always panics.
#[ferriq::task(name = "fault.panics", max_attempts = 3, backoff_initial = 0.2)]
pub async fn panics(ctx: TaskContext) -> Result<(), TaskError> {
    report("start", &ctx);
    panic!("fault.panics panics on purpose");
}

/// Ends the worker process (abort, no cleanup).
#[ferriq::task(name = "fault.aborts", max_attempts = 3)]
pub async fn aborts(ctx: TaskContext) -> Result<(), TaskError> {
    report("start", &ctx);
    std::process::abort();
}

/// A chord's member: works for `ms`.
#[ferriq::task(name = "fault.member")]
pub async fn member(ctx: TaskContext, ms: u64) -> Result<u64, TaskError> {
    report("start", &ctx);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    report("done", &ctx);
    Ok(ms)
}

/// A chord's callback: reports its run.
#[ferriq::task(name = "fault.callback")]
pub async fn callback(ctx: TaskContext) -> Result<usize, TaskError> {
    report("callback", &ctx);
    let values: Vec<u64> = ctx.group_values().await?;
    report("done", &ctx);
    Ok(values.len())
}

/// A schedule's tick, every second (served when a worker runs the scheduler).
#[ferriq::task(name = "fault.tick", every = 1, missed = "catch_up", catch_up_max = 30)]
pub async fn tick(ctx: TaskContext) -> Result<(), TaskError> {
    report("tick", &ctx);
    tokio::time::sleep(Duration::from_millis(200)).await;
    report("done", &ctx);
    Ok(())
}

/// Every task name the workers serve.
pub const ALL: [&str; 7] = [
    work::NAME,
    limited::NAME,
    panics::NAME,
    aborts::NAME,
    member::NAME,
    callback::NAME,
    tick::NAME,
];

/// The worker process: `FERRIQ_*` settings from the environment, events to `FAULT_EVENTS`;
/// drains on SIGTERM.
pub async fn worker_main() {
    // Logs to stderr (the harness keeps it per worker) when RUST_LOG asks for them.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .init();
    }
    open_events(&std::env::var("FAULT_EVENTS").expect("FAULT_EVENTS is set"));
    let worker = ferriq::WorkerBuilder::from_env()
        .await
        .expect("the worker connects")
        .registry(
            ferriq::Registry::from_inventory()
                .expect("tasks")
                .only(&ALL)
                .expect("tasks"),
        )
        .build()
        .expect("the worker builds");
    worker.run_until_signal().await;
}
