//! Least privilege on Valkey: a worker and a client connected as an ACL user allowed only the
//! commands ferriq needs and only the keys and channels under its prefix run a task end to
//! end; a user missing a permission gets a clear error that names it, not a hang.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferriq::Client;
use ferriq_valkey::ValkeyStore;
use fred::prelude::{ClientLike, Config};

/// The rule the README's Security section documents, for `prefix`.
fn rule(prefix: &str) -> Vec<String> {
    [
        "on",
        ">worker-secret",
        "resetkeys",
        "resetchannels",
        &format!("~{prefix}:*"),
        &format!("&{prefix}:*"),
        "-@all",
        "+@read",
        "+@write",
        "+@scripting",
        "+@pubsub",
        "+@connection",
        "+time",
        "+select",
        "-@dangerous",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn admin(url: &str) -> fred::clients::Client {
    let admin = fred::clients::Client::new(Config::from_url(url).unwrap(), None, None, None);
    admin.init().await.unwrap();
    admin
}

async fn set_user(admin: &fred::clients::Client, name: &str, rule: Vec<String>) {
    let mut args = vec!["SETUSER".to_owned(), name.to_owned()];
    args.extend(rule);
    let _: fred::types::Value = admin
        .custom(
            fred::types::CustomCommand::new_static("ACL", None, false),
            args,
        )
        .await
        .unwrap();
}

#[ferriq::task(name = "valkey.acl.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_and_a_client_run_with_only_the_documented_permissions() {
    let redis = common::PrivateRedis::start().await;
    let admin = admin(&redis.url()).await;
    let prefix = "billing";
    set_user(&admin, "ferriq", rule(prefix)).await;
    let url = format!("redis://ferriq:worker-secret@127.0.0.1:{}", redis.port);
    let store = Arc::new(common::store_at(&url, prefix, |b| b).await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let worker = common::spawn_worker_with(broker.clone(), store.clone(), &[add::NAME], ());
    let client = Client::new(broker, store.clone());
    let handles = client
        .enqueue_batch((0..20).map(|i| add::call(i, 1)))
        .await
        .unwrap();
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(30)).await.unwrap(), i as i64 + 1);
    }
    // What operators do: a task's state, the workers.
    let info = client.ops().task(handles[0].task_id()).await.unwrap();
    assert!(
        format!("{info:?}").contains("Succeeded") || format!("{info:?}").contains("Done"),
        "{info:?}"
    );
    assert!(!client.ops().workers().await.unwrap().is_empty());
    worker.stop().await;
    // The dashboard's history and finished-task index, written and read with the same rule
    // (a stopped worker adds what it has not yet).
    {
        use ferriq::store::OpsStore;
        let now = ferriq::clock::Clock::system().now_unix_ms();
        let history = store.history(now / 60_000 - 2, now / 60_000).await.unwrap();
        assert_eq!(history.iter().map(|m| m.succeeded).sum::<u64>(), 20);
        let found = store
            .finished(add::NAME, Some(false), now - 120_000, now, 50)
            .await
            .unwrap();
        assert_eq!(found.len(), 20);
        // The dead-letter index too.
        let entry =
            ferriq::store::DeadEntry::new("acl-lane", Some(ferriq::wire::TaskId::random()), b"{}")
                .reason("expired")
                .detail("acl boom")
                .dead_at_ms(now);
        store.index_dead(&[entry]).await.unwrap();
        let filter = ferriq::dead_letters::DeadFilter::all()
            .reason("expired")
            .detail_contains("BOOM");
        let page = store
            .dead_index("acl-lane", &filter, now, 0, 10)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(page.total, 1);
        store.clear_dead_index("acl-lane").await.unwrap();
    }
    // Outside its prefix, nothing: a store under another prefix is refused, saying why.
    let refused = match ValkeyStore::builder(url.as_str())
        .prefix("payroll")
        .connect()
        .await
    {
        Err(e) => e.to_string(),
        Ok(elsewhere) => {
            use ferriq::store::ResultStore;
            let id = ferriq::wire::TaskId::random();
            elsewhere.get(&id).await.unwrap_err().to_string()
        }
    };
    assert!(
        refused.contains("NOPERM") && refused.contains("ACL rule"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_user_missing_a_permission_gets_an_error_naming_it() {
    let redis = common::PrivateRedis::start().await;
    let admin = admin(&redis.url()).await;
    let prefix = "billing";
    let mut no_scripts = rule(prefix);
    no_scripts.push("-@scripting".into());
    set_user(&admin, "noscripts", no_scripts).await;
    let url = format!("redis://noscripts:worker-secret@127.0.0.1:{}", redis.port);
    let started = std::time::Instant::now();
    let refused = ValkeyStore::builder(url.as_str())
        .prefix(prefix)
        .connect()
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(started.elapsed() < Duration::from_secs(10), "it hung");
    assert!(
        refused.contains("NOPERM") && refused.contains("ACL"),
        "{refused}"
    );
    assert!(!refused.contains("worker-secret"), "{refused}");
}
