//! Concurrency limits kept in Valkey, shared by workers on real time: never more runs at once
//! than the slots; the runs going on take their slots again after the store lost its data.
//! (A rate shared by workers, its decision asked with the claim, is `rate.rs`, alone in its
//! binary; the store-level rules — a dead worker's slot frees itself within its lease, waiters
//! come back by then, limits set at run time are listed — are the conformance kit's flow
//! suite, `conformance.rs`.)

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferriq::{Client, State};

/// Runs in progress now, and the most at once.
#[derive(Default)]
struct Running(Mutex<(usize, usize)>);

#[ferriq::task(name = "valkey.limits.export", concurrency = 4)]
async fn export(running: State<Arc<Running>>, n: u32) -> u32 {
    {
        let mut r = running.0.lock().unwrap();
        r.0 += 1;
        r.1 = r.1.max(r.0);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    running.0.lock().unwrap().0 -= 1;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_four_slots() {
    let store = Arc::new(common::store().await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let running = Arc::new(Running::default());
    let workers: Vec<_> = (0..3)
        .map(|_| {
            common::spawn_worker_with(
                broker.clone(),
                store.clone(),
                &[export::NAME],
                Arc::clone(&running),
            )
        })
        .collect();
    let client = Client::new(broker.clone(), store.clone());
    let handles = client
        .enqueue_batch((0..24).map(export::call))
        .await
        .unwrap();
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(60)).await.unwrap(), i as u32);
    }
    assert_eq!(running.0.lock().unwrap().1, 4);
    for w in workers {
        w.stop().await;
    }
}

#[tokio::test]
async fn runs_going_on_take_their_slots_again_after_the_store_lost_its_data() {
    use ferriq::store::{FlowStore, SlotDecision};
    let mut redis = common::PrivateRedis::start().await;
    let store = common::store_at(&redis.url(), &common::prefix(), |b| b).await;
    let lease = Duration::from_secs(30);
    let (running, next) = (
        ferriq::wire::TaskId::random(),
        ferriq::wire::TaskId::random(),
    );
    assert_eq!(
        store.acquire_slot("l", &running, 1, lease).await.unwrap(),
        SlotDecision::Held
    );
    // Restarted without persistence: the limiter's state is gone, its run still going.
    redis.restart().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    // The run's next heartbeat renews its slot (once the store answers again).
    while store
        .renew_slots(&[("l".into(), running.clone())], lease)
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the store never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        matches!(
            store.acquire_slot("l", &next, 1, lease).await.unwrap(),
            SlotDecision::Wait(_)
        ),
        "a second run took the slot the first still holds"
    );
    // Released, the slot is free, and a late renewal of the finished run does not take it.
    store
        .release_slot("l", &running, Duration::from_secs(1))
        .await
        .unwrap();
    store
        .renew_slots(&[("l".into(), running.clone())], lease)
        .await
        .unwrap();
    let free_by = Instant::now() + Duration::from_secs(3);
    loop {
        match store.acquire_slot("l", &next, 1, lease).await.unwrap() {
            SlotDecision::Held => break,
            _ => assert!(Instant::now() < free_by, "the released slot stayed taken"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The keys under `prefix` whose name holds `part`, each with its time to live in ms (-1: none).
async fn ttls(raw: &fred::prelude::Client, prefix: &str, part: &str) -> Vec<(String, i64)> {
    use fred::prelude::{ClientLike, KeysInterface};
    let keys: Vec<String> = raw
        .custom(
            fred::types::CustomCommand::new_static("KEYS", None, false),
            vec![format!("{prefix}{part}*")],
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    for key in keys {
        let ms: i64 = raw.pttl(&key).await.unwrap();
        out.push((key, ms));
    }
    out
}

#[tokio::test]
async fn a_limiters_keys_carry_a_time_to_live_however_they_were_made() {
    use ferriq::store::{ClaimAsk, ClaimOutcome, FlowStore, Gated, HeldSlot, LimitGate};
    use ferriq::task::Rate;
    use ferriq::wire::TaskId;
    use fred::prelude::KeysInterface;
    let prefix = common::prefix();
    let store = common::store_at(&common::url(), &prefix, |b| b).await;
    let raw = common::raw_client(&common::url()).await;
    let (rate, lease) = (
        Rate::new(1000, Duration::from_secs(1)),
        Duration::from_secs(30),
    );
    let ask = ClaimAsk::new("w1", lease, None);
    // Every path a decision takes: apart and with the claim, a slot freed apart and with the
    // result. Run twice: first with the keys new to this process (it asks for their TTLs to be
    // renewed), then, the keys deleted, within the period in which it does not ask again: the
    // scripts must give the keys they create a TTL themselves.
    for round in 0..2 {
        let ids: Vec<TaskId> = (0..5).map(|_| TaskId::random()).collect();
        store.admit_rate("api", &ids[0], rate).await.unwrap();
        store.acquire_slot("db", &ids[1], 4, lease).await.unwrap();
        store
            .release_slot("db", &ids[1], Duration::from_millis(5))
            .await
            .unwrap();
        let gate = LimitGate::Rate {
            limiter: "api",
            rate,
        };
        let claimed = store.claim_past_limit(gate, &ids[2], ask).await.unwrap();
        assert!(
            matches!(claimed, Ok(Gated::Claimed(ClaimOutcome::Run { .. }))),
            "{claimed:?}"
        );
        let gate = LimitGate::Slot {
            limiter: "db",
            limit: 4,
            lease,
        };
        let Ok(Gated::Claimed(ClaimOutcome::Run { token, .. })) =
            store.claim_past_limit(gate, &ids[3], ask).await.unwrap()
        else {
            panic!("a free slot and a new task: claimed");
        };
        let slot = HeldSlot::new("db", Duration::from_millis(5));
        let result = common::ok(serde_json::json!(1));
        store
            .complete_freeing_slot(&ids[3], token, Some(&result), None, slot)
            .await
            .unwrap()
            .unwrap();
        // A slot still held when the keys are read (the others were freed).
        store.acquire_slot("db", &ids[4], 4, lease).await.unwrap();
        let rate_keys = ttls(&raw, &prefix, ":rate:").await;
        let slot_keys = ttls(&raw, &prefix, ":slots:").await;
        assert!(
            rate_keys.len() >= 2,
            "round {round}: started and turns, got {rate_keys:?}"
        );
        assert!(
            !slot_keys.is_empty(),
            "round {round}: held, got {slot_keys:?}"
        );
        for (key, ms) in rate_keys.iter().chain(&slot_keys) {
            assert!(*ms > 0, "round {round}: {key} has no time to live ({ms})");
        }
        let all: Vec<String> = rate_keys
            .into_iter()
            .chain(slot_keys)
            .map(|k| k.0)
            .collect();
        let _: i64 = raw.del(all).await.unwrap();
    }
    let _ = store.purge_prefix().await;
}
