//! Schedules kept in Valkey: run-time schedules, the last tick per schedule, send markers and
//! the leader lease; and a scheduler sending a 1-second schedule through them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferriq::memory::MemoryBroker;
use ferriq::schedule::{ScheduleSpec, Scheduler};
use ferriq::store::{ResultStatus, ResultStore, ScheduleStore};
use ferriq::Shutdown;

#[ferriq::task(name = "valkey.sched.tick")]
async fn tick() {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_ticks_and_the_leader_lease_live_in_valkey() {
    let store = common::store().await;
    let spec = ScheduleSpec::every("every-second", tick::NAME, 1);
    store.put_schedule(&spec).await.unwrap();
    assert_eq!(
        store.schedules().await.unwrap(),
        std::slice::from_ref(&spec)
    );
    // Ticks only ever rise.
    store.record_tick(&spec.id, 100, true).await.unwrap();
    store.record_tick(&spec.id, 90, true).await.unwrap();
    store.record_tick(&spec.id, 110, false).await.unwrap();
    assert_eq!(store.last_tick(&spec.id).await.unwrap(), Some(110));
    assert_eq!(store.last_sent_tick(&spec.id).await.unwrap(), Some(100));
    // The lease: one holder, renewable by it, free after it runs out.
    // (1 s: the calls before it ends must come in time on a loaded machine.)
    let lease = Duration::from_secs(1);
    assert!(store.lead("a", lease).await.unwrap());
    assert!(!store.lead("b", lease).await.unwrap());
    assert!(store.lead("a", lease).await.unwrap());
    assert_eq!(store.leader().await.unwrap().as_deref(), Some("a"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(store.lead("b", lease).await.unwrap());
    // A send in progress holds a removal back until it ends (or its limit).
    assert!(store
        .begin_sending(&spec.id, Duration::from_secs(5))
        .await
        .unwrap());
    let removing = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .remove_schedule("every-second", Duration::from_secs(5))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!removing.is_finished(), "waits for the send");
    store.end_sending(&spec.id).await.unwrap();
    assert!(removing.await.unwrap().unwrap());
    assert!(store.schedules().await.unwrap().is_empty());
    assert!(!store
        .begin_sending(&spec.id, Duration::from_secs(5))
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_on_valkey_sends_each_tick_once() {
    let store = Arc::new(common::store().await);
    let broker = Arc::new(MemoryBroker::new());
    let worker = common::spawn_worker(broker.clone(), store.clone(), &[tick::NAME]);
    let spec = ScheduleSpec::every("valkey-ticks", tick::NAME, 1);
    store.put_schedule(&spec).await.unwrap();
    let schedulers: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|id| {
            let s = Scheduler::builder(broker.clone(), store.clone())
                .id(id)
                .declared_schedules(false)
                .build()
                .unwrap();
            let shutdown = Shutdown::new();
            let join = tokio::spawn({
                let shutdown = shutdown.clone();
                async move { s.run(shutdown).await }
            });
            (shutdown, join)
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    for (s, j) in schedulers {
        s.drain();
        j.await.unwrap();
    }
    let last = store.last_tick(&spec.id).await.unwrap().unwrap();
    // The ticks sent up to the last, give or take the lookahead: each with one result.
    let mut results = 0;
    for t in (last - 4)..=last {
        let id = spec.tick_id(t);
        let h = ferriq::Client::new(broker.clone(), store.clone()).handle::<()>(id.clone());
        if h.wait(Duration::from_secs(5)).await.is_ok() {
            results += 1;
        }
        assert!(matches!(
            store.get(&id).await.unwrap(),
            ResultStatus::Ready(_)
        ));
    }
    assert_eq!(results, 5);
    assert_eq!(broker.stats().published as i64, broker.stats().acked as i64);
    worker.stop().await;
}

#[tokio::test]
async fn pauses_and_declared_schedules_live_in_valkey() {
    let store = common::store().await;
    assert!(store.paused().await.unwrap().is_empty());
    store.set_paused("b", true).await.unwrap();
    store.set_paused("a", true).await.unwrap();
    store.set_paused("a", true).await.unwrap();
    assert_eq!(store.paused().await.unwrap(), ["a", "b"]);
    store.set_paused("b", false).await.unwrap();
    assert_eq!(store.paused().await.unwrap(), ["a"]);
    assert!(store.declared().await.unwrap().is_empty());
    let specs = [
        ScheduleSpec::every("one", tick::NAME, 5),
        ScheduleSpec::cron("two", tick::NAME, "0 0 * * * *"),
    ];
    store.put_declared(&specs).await.unwrap();
    assert_eq!(store.declared().await.unwrap(), specs);
    store.put_declared(&specs[..1]).await.unwrap();
    assert_eq!(store.declared().await.unwrap(), specs[..1]);
}
