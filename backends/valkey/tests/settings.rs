//! Settings that do not agree are said, not silently ignored: a client's misspelt variable, and
//! a worker writing results under another prefix than the client reads. (Its own binary: the
//! log capture is process-wide.)

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ferriq::connect::Settings;
use ferriq::{Client, TaskStatus};

#[ferriq::task(name = "settings.echo")]
async fn echo(word: String) -> String {
    word
}

/// Every log line of this process at WARN and above.
fn logs() -> String {
    String::from_utf8_lossy(&buffer().lock().unwrap()).into_owned()
}

fn buffer() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOG.get_or_init(|| {
        struct Sink;
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                buffer().lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(|| Sink)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        Mutex::new(Vec::new())
    })
}

#[tokio::test]
async fn a_client_names_the_setting_a_misspelt_variable_meant() {
    let _ = buffer();
    let mut settings = Settings::default();
    settings.insert("FERRIQ_BROKER_URL", "memory://settings-typo");
    settings.insert("FERRIQ_STORE_URL", common::url());
    settings.insert("FERRIQ_RESULT_PREFX", "app");
    // Worker settings in the client's environment are not mistakes: one environment often
    // configures both.
    settings.insert("FERRIQ_CONCURRENCY", "4");
    let client = Client::from_settings(&settings).await.unwrap();
    let logs = logs();
    assert!(
        logs.lines().any(|l| l.contains("WARN")
            && l.contains("FERRIQ_RESULT_PREFX is set but nothing in this client reads it")
            && l.contains("did you mean FERRIQ_RESULT_PREFIX?")),
        "no warning naming the setting:\n{logs}"
    );
    assert!(!logs.contains("FERRIQ_CONCURRENCY"), "{logs}");
    client.close().await;
}

#[tokio::test]
async fn a_worker_warns_once_of_a_client_with_another_result_prefix() {
    let _ = buffer();
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let client_store = Arc::new(common::store().await);
    let worker_store = Arc::new(common::store().await);
    let worker = common::spawn_worker(broker.clone(), worker_store, &[echo::NAME]);
    let client = Client::new(broker, client_store.clone());
    let first = echo::kiq(&client, "one".into()).await.unwrap();
    let second = echo::kiq(&client, "two".into()).await.unwrap();
    // The wait ends through the reply channel...
    assert_eq!(first.wait(Duration::from_secs(30)).await.unwrap(), "one");
    assert_eq!(second.wait(Duration::from_secs(30)).await.unwrap(), "two");
    // ...but the result is where this client does not look.
    assert_eq!(first.status().await.unwrap(), TaskStatus::Pending);
    let logs = logs();
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("under another key prefix") && l.contains("FERRIQ_RESULT_PREFIX"))
        .collect();
    assert_eq!(warnings.len(), 1, "warned once:\n{logs}");
    assert!(
        warnings[0].contains(client_store.prefix()),
        "{}",
        warnings[0]
    );
    worker.stop().await;
}
