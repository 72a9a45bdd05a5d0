//! A process that used the store ends without warnings: closed with `Client::close`, or simply
//! dropped at the end of `main`. (fred logged "Fatal error sending QUIT command to router" on
//! about 40 % of exits when the store's drop sent its QUIT from a task racing the runtime's
//! shutdown.) Each run is a child process, as an app's `main` is.

mod common;

use std::process::Command;
use std::sync::Arc;

/// Prints every `log` record (fred logs through `log`) on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        if record.level() <= log::Level::Warn {
            eprintln!("{} {}: {}", record.level(), record.target(), record.args());
        }
    }
    fn flush(&self) {}
}

#[ferriq::task(name = "clean_exit.noop")]
async fn noop() {}

/// The child: connects a client, enqueues, reads, and ends `main` as an app does.
#[test]
fn child_app() {
    let Ok(mode) = std::env::var("FERRIQ_TEST_CLEAN_EXIT") else {
        return;
    };
    log::set_logger(&StderrLog).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = Arc::new(common::store().await);
        let client = ferriq::Client::new(Arc::new(ferriq::memory::MemoryBroker::new()), store);
        let handle = noop::kiq(&client).await.unwrap();
        handle.status().await.unwrap();
        if mode == "close" {
            client.close().await;
        }
    });
    drop(runtime);
    eprintln!("child done");
}

fn run_children(mode: &str) {
    for _ in 0..12 {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_app", "--nocapture", "--test-threads", "1"])
            .env("FERRIQ_TEST_CLEAN_EXIT", mode)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("child done"), "{stderr}");
        assert!(
            !stderr.contains("WARN") && !stderr.contains("ERROR"),
            "a warning at exit ({mode}):\n{stderr}"
        );
    }
}

#[test]
fn an_app_that_closes_its_client_exits_without_warnings() {
    run_children("close");
}

#[test]
fn an_app_that_drops_its_client_exits_without_warnings() {
    run_children("drop");
}
