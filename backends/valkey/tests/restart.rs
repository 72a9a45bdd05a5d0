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
    assert!(
        took <= timeout + Duration::from_millis(300),
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
