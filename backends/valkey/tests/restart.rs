//! A private redis-server killed with SIGKILL and restarted: calls fail fast with a typed
//! error, recover by themselves, and tokens keep growing.

mod common;

use std::time::Duration;

use ferriq::store::{ClaimOutcome, ClaimStore, CompleteOutcome, ResultStore, StoreError};
use ferriq::wire::{TaskId, TaskResult};
use tokio::time::Instant;

#[tokio::test]
async fn a_killed_and_restarted_server_fails_fast_then_recovers_with_larger_tokens() {
    let mut redis = common::PrivateRedis::start().await;
    let timeout = Duration::from_millis(500);
    let store = common::store_at(&redis.url(), "restart", |b| {
        b.command_timeout(timeout)
            .connect_timeout(Duration::from_millis(300))
    })
    .await;
    let lease = Duration::from_secs(30);
    let before = TaskId::random();
    let token_before = match store.claim(&before, "w", lease, None).await.unwrap() {
        ClaimOutcome::Run { token, .. } => token,
        other => panic!("{other:?}"),
    };

    redis.kill();
    let start = Instant::now();
    let err = store
        .claim(&TaskId::random(), "w", lease, None)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    // Within its timeout, and room for a loaded machine's scheduling; a hang is far longer.
    assert!(
        took <= timeout + Duration::from_secs(1),
        "failed after {took:?}"
    );
    let err = store.get(&before).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");

    redis.restart().await;
    // The store reconnects by itself (and reloads its scripts: the new server has none).
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = TaskId::random();
    let token_after = loop {
        match store.claim(&after, "w", lease, None).await {
            Ok(ClaimOutcome::Run { token, .. }) => break token,
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                assert!(Instant::now() < deadline, "did not recover: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(
        token_after > token_before,
        "{token_after} must exceed {token_before}"
    );
    // The data was lost with the server: the old task claims again, with a larger token too.
    match store.claim(&before, "w", lease, None).await.unwrap() {
        ClaimOutcome::Run { token, .. } => assert!(token > token_before),
        other => panic!("{other:?}"),
    }
    let result = TaskResult::success(serde_json::json!(1), 0.0, Default::default());
    assert_eq!(
        store
            .complete(&after, token_after, Some(&result), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
}

#[tokio::test]
async fn connecting_to_a_server_that_is_down_fails_with_a_clear_error() {
    let redis = common::PrivateRedis::start().await;
    let url = redis.url();
    drop(redis);
    let err = ferriq_valkey::ValkeyStore::builder(url.clone())
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot connect"), "{err}");
}

#[tokio::test]
async fn urls_are_checked_and_passwords_never_shown() {
    let err = ferriq_valkey::ValkeyStore::builder("http://user:s3cret@localhost:6379")
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unsupported scheme") && !err.contains("s3cret"),
        "{err}"
    );
    #[cfg(not(feature = "tls"))]
    {
        let err = ferriq_valkey::ValkeyStore::builder("rediss://:s3cret@localhost:6380")
            .connect()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("tls") && !err.contains("s3cret"), "{err}");
    }
    let err = ferriq_valkey::ValkeyStore::builder("redis://localhost")
        .prefix("a{b}")
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("braces"), "{err}");
    let err = ferriq_valkey::ValkeyStore::builder("redis://localhost")
        .result_ttl(Some(Duration::from_secs(3600)))
        .claim_ttl(Duration::from_secs(600))
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("claim_ttl"), "{err}");
    // Connected stores do not print the password either.
    let store = common::store().await;
    assert!(!format!("{store:?}").contains("s3cret"));
}

/// Every WARN or ERROR line logged in this test process, from every thread.
fn warnings() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<std::sync::Mutex<Vec<u8>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        struct Sink;
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                warnings().lock().unwrap().extend_from_slice(buf);
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
        tracing::subscriber::set_global_default(subscriber).unwrap();
        std::sync::Mutex::new(Vec::new())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_from_before_a_restart_is_woken_by_the_notification_after_it() {
    let log = warnings();
    let mut redis = common::PrivateRedis::start().await;
    // Re-reads so rare that only the notification can wake the waiter in time.
    let waiter = common::store_at(&redis.url(), "wake", |b| {
        b.recheck_interval(Duration::from_secs(120))
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(300))
    })
    .await;
    let id = TaskId::random();
    let channel = format!("wake:done:{id}");
    let waiting = tokio::spawn({
        let (waiter, id) = (waiter.clone(), id.clone());
        async move {
            let status = waiter.wait(&id, Duration::from_secs(60)).await;
            (status, Instant::now())
        }
    });
    let raw = common::raw_client(&redis.url()).await;
    let mut n = 0;
    for _ in 0..250 {
        n = common::subscribers(&raw, &channel).await;
        if n == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(n, 1, "the waiter listens on its task's channel");

    redis.kill();
    redis.restart().await;
    // The waiter's connection comes back and subscribes again by itself.
    let raw = common::raw_client(&redis.url()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::subscribers(&raw, &channel).await != 1 {
        assert!(
            Instant::now() < deadline,
            "not subscribed again after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let writer = common::store_at(&redis.url(), "wake", |b| b).await;
    let token = common::run_claim(&writer, &id).await.unwrap();
    let completed = Instant::now();
    assert_eq!(
        writer
            .complete(&id, token, Some(&common::ok(serde_json::json!(5))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    let (status, woke) = waiting.await.unwrap();
    assert!(
        matches!(status, Ok(ferriq::store::ResultStatus::Ready(_))),
        "{status:?}"
    );
    let took = woke.saturating_duration_since(completed);
    assert!(
        took < Duration::from_secs(2),
        "woken {took:?} after the completion"
    );
    let log = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        !log.contains("resubscribing after a reconnect failed"),
        "resubscribing failed:\n{log}"
    );
}
