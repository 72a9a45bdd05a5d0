//! Concurrency limits kept in Valkey, shared by three workers on real time: never more runs
//! at once than the slots, and a dead worker's slot frees itself within its lease.

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
async fn a_slot_whose_worker_died_frees_itself_within_its_lease() {
    use ferriq::store::{FlowStore, SlotDecision};
    let store = common::store().await;
    let (dead, next) = (
        ferriq::wire::TaskId::random(),
        ferriq::wire::TaskId::random(),
    );
    let lease = Duration::from_secs(1);
    assert_eq!(
        store.acquire_slot("l", &dead, 1, lease).await.unwrap(),
        SlotDecision::Held
    );
    assert!(matches!(
        store.acquire_slot("l", &next, 1, lease).await.unwrap(),
        SlotDecision::Wait(_)
    ));
    // Renewed, it holds on; no longer renewed (its worker died), it frees itself.
    store
        .renew_slots(&[("l".into(), dead.clone())], lease)
        .await
        .unwrap();
    let freed_by = Instant::now() + lease + Duration::from_millis(500);
    loop {
        match store.acquire_slot("l", &next, 1, lease).await.unwrap() {
            SlotDecision::Held => break,
            _ => assert!(Instant::now() < freed_by, "not freed within the lease"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store
        .release_slot("l", &next, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(
        store.acquire_slot("l", &dead, 1, lease).await.unwrap(),
        SlotDecision::Held
    );
}

#[tokio::test]
async fn no_waiter_is_told_to_wait_past_the_first_lease_end() {
    use ferriq::store::{FlowStore, SlotDecision};
    let store = common::store().await;
    let lease = Duration::from_secs(1);
    let holder = ferriq::wire::TaskId::random();
    assert_eq!(
        store.acquire_slot("l", &holder, 1, lease).await.unwrap(),
        SlotDecision::Held
    );
    // Four waiting behind one slot: the last one's turn comes after four average runs (1 s
    // each), but the holder's lease ends in a second: if its worker died, the slot is free
    // then, and a waiter must be back by then to take it.
    let mut last = Duration::ZERO;
    for _ in 0..4 {
        match store
            .acquire_slot("l", &ferriq::wire::TaskId::random(), 1, lease)
            .await
            .unwrap()
        {
            SlotDecision::Wait(wait) => last = wait,
            other => panic!("{other:?}"),
        }
    }
    assert!(last <= Duration::from_millis(1100), "{last:?}");
}

#[tokio::test]
async fn limits_set_at_run_time_are_kept_and_listed_with_their_use() {
    use ferriq::store::{FlowStore, LimitOverride, LimiterKind, LimiterSeen, RateDecision};
    use ferriq::task::Rate;
    let store = common::store().await;
    let set = LimitOverride::default()
        .rate(Rate::parse("3/m").unwrap())
        .concurrency(2);
    assert!(!store
        .set_limit_override("t\nacme", Some(set))
        .await
        .unwrap());
    assert!(store
        .set_limit_override("t\nacme", Some(set))
        .await
        .unwrap());
    assert_eq!(
        store.limit_overrides().await.unwrap(),
        vec![("t\nacme".to_owned(), set)]
    );
    // Two starts of three in the window, one slot of two held and one task waiting.
    let rate = Rate::parse("3/m").unwrap();
    for _ in 0..2 {
        let id = ferriq::wire::TaskId::random();
        assert_eq!(
            store.admit_rate("t\nacme", &id, rate).await.unwrap(),
            RateDecision::Run
        );
    }
    let lease = Duration::from_secs(30);
    for _ in 0..2 {
        store
            .acquire_slot("t\nacme", &ferriq::wire::TaskId::random(), 1, lease)
            .await
            .unwrap();
    }
    store
        .note_limiters(&[
            LimiterSeen {
                kind: LimiterKind::Rate,
                limiter: "t\nacme".into(),
                limit: "3/m".into(),
            },
            LimiterSeen {
                kind: LimiterKind::Concurrency,
                limiter: "t\nacme".into(),
                limit: "1".into(),
            },
        ])
        .await
        .unwrap();
    let mut listed = store.limiters().await.unwrap();
    listed.sort_by_key(|u| u.seen.kind.as_str());
    let counts: Vec<_> = listed
        .iter()
        .map(|u| (u.seen.kind, u.seen.limit.as_str(), u.used, u.waiting))
        .collect();
    assert_eq!(
        counts,
        vec![
            (LimiterKind::Concurrency, "1", 1, 1),
            (LimiterKind::Rate, "3/m", 2, 0)
        ]
    );
    assert!(store.set_limit_override("t\nacme", None).await.unwrap());
    assert!(store.limit_overrides().await.unwrap().is_empty());
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
