//! Fencing against the real Redis: a paused holder's late write, racing completers, and one
//! bad claim record among the calls batched with it.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{expect_run as run, ok};
use ferriq::store::{
    ClaimLease, ClaimOutcome, ClaimStore, CompleteOutcome, ResultStatus, ResultStore,
};
use ferriq::wire::TaskId;
use rand::{Rng, SeedableRng};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_paused_holder_is_fenced_off_and_a_success_is_never_overwritten() {
    let store = common::store().await;
    let id = TaskId::random();
    let (old, _) = run(store
        .claim(&id, "paused", Duration::from_millis(100), None)
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(150)).await; // the holder "pauses" past its lease
    let (new, _) = run(store.claim(&id, "fresh", LEASE, None).await.unwrap());
    assert_eq!(
        store.heartbeat(&[(id.clone(), old)], LEASE).await.unwrap(),
        [ClaimLease::Lost]
    );
    assert_eq!(
        store
            .complete(&id, old, Some(&ok(json!("old"))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stale
    );
    assert_eq!(
        store
            .complete(&id, new, Some(&ok(json!("new"))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    // The same holder retrying after a lost reply: AlreadyStored, nothing written.
    assert_eq!(
        store
            .complete(&id, new, Some(&ok(json!("again"))), None)
            .await
            .unwrap(),
        CompleteOutcome::AlreadyStored
    );
    assert_eq!(
        store
            .complete(&id, old, Some(&ok(json!("old"))), None)
            .await
            .unwrap(),
        CompleteOutcome::Stale
    );
    match store.get(&id).await.unwrap() {
        ResultStatus::Ready(r) => assert_eq!(r.return_value, json!("new")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_completers_write_each_result_exactly_once() {
    const TASKS: usize = 200;
    const COMPLETERS: usize = 8;
    let store = Arc::new(common::store().await);
    let ids: Vec<TaskId> = (0..TASKS).map(|_| TaskId::random()).collect();
    // (task index) -> completers whose write was Stored; plus takeovers seen.
    let stored: Arc<Mutex<HashMap<usize, Vec<usize>>>> = Arc::default();
    let stale = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for c in 0..COMPLETERS {
        let (store, ids, stored, stale) =
            (store.clone(), ids.clone(), stored.clone(), stale.clone());
        handles.push(tokio::spawn(async move {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(c as u64);
            for (i, id) in ids.iter().enumerate() {
                loop {
                    // Short leases, and pauses that often outlast them: takeovers race writes.
                    match store
                        .claim(id, &format!("c{c}"), Duration::from_millis(15), None)
                        .await
                        .unwrap()
                    {
                        ClaimOutcome::Run { token, .. } => {
                            tokio::time::sleep(Duration::from_millis(rng.random_range(0..30)))
                                .await;
                            match store
                                .complete(id, token, Some(&ok(json!(c))), None)
                                .await
                                .unwrap()
                            {
                                CompleteOutcome::Stored => {
                                    stored.lock().unwrap().entry(i).or_default().push(c);
                                    break;
                                }
                                CompleteOutcome::AlreadyStored => {
                                    panic!("a fresh token cannot find its own write")
                                }
                                _ => {
                                    stale.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                            }
                        }
                        ClaimOutcome::Defer { retry_after } => {
                            tokio::time::sleep(retry_after).await
                        }
                        ClaimOutcome::Done => break,
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let stored = stored.lock().unwrap().clone();
    for (i, id) in ids.iter().enumerate() {
        let writers = stored.get(&i).cloned().unwrap_or_default();
        assert_eq!(writers.len(), 1, "task {i} written by {writers:?}");
        match store.get(id).await.unwrap() {
            ResultStatus::Ready(r) => assert_eq!(
                r.return_value,
                json!(writers[0]),
                "the stored value is the winner's"
            ),
            other => panic!("task {i}: {other:?}"),
        }
    }
    let stale = stale.load(std::sync::atomic::Ordering::Relaxed);
    println!("tasks={TASKS} completers={COMPLETERS} stale_writes_rejected={stale}");
    assert!(stale > 0, "takeovers really raced the writes");
}

#[tokio::test]
async fn one_bad_claim_record_does_not_fail_the_calls_batched_with_it() {
    use fred::prelude::{ClientLike, Config, LuaInterface};
    let store = Arc::new(common::store().await);
    let bad = TaskId::random();
    // Something else wrote a hash where the claim record goes: its script call errors.
    let raw =
        fred::prelude::Client::new(Config::from_url(&common::url()).unwrap(), None, None, None);
    raw.init().await.unwrap();
    let key = format!("{0}:claim:{{{0}:{bad}}}", store.prefix());
    let _: i64 = raw
        .eval(
            "return redis.call('HSET', KEYS[1], 'x', '1')",
            vec![key.clone()],
            Vec::<String>::new(),
        )
        .await
        .unwrap();
    let good: Vec<TaskId> = (0..20).map(|_| TaskId::random()).collect();
    let mut calls = vec![tokio::spawn({
        let (store, bad) = (store.clone(), bad.clone());
        async move { store.claim(&bad, "w", LEASE, None).await.map(|_| ()) }
    })];
    for id in &good {
        let (store, id) = (store.clone(), id.clone());
        calls.push(tokio::spawn(async move {
            match store.claim(&id, "w", LEASE, None).await {
                Ok(ClaimOutcome::Run { .. }) => Ok(()),
                other => panic!("{other:?}"),
            }
        }));
    }
    let mut results = Vec::new();
    for c in calls {
        results.push(c.await.unwrap());
    }
    let failed = results[0]
        .as_ref()
        .expect_err("the bad record's claim fails");
    // The server's own words reach the caller, not a Lua table's address.
    assert!(failed.to_string().contains("WRONGTYPE"), "{failed}");
    assert!(
        results[1..].iter().all(Result::is_ok),
        "the others are answered"
    );
    let _: i64 = fred::prelude::KeysInterface::del(&raw, &key).await.unwrap();
}
