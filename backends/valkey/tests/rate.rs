//! Rate limits kept in Valkey, shared by three workers on real time: no sliding second holds
//! more starts than the limit, and nothing is lost or run twice. On a single server each
//! decision goes to the store with its claim (one script run): this fails when that script
//! does not keep the limit. (Alone in its binary: the measure is the task bodies' own start
//! times, which other tests' load would spread.)

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferriq::{Client, State, TaskContext};

#[derive(Default)]
struct Starts(Mutex<Vec<(Instant, u32)>>);

#[ferriq::task(name = "valkey.limits.call", rate = "50/s")]
async fn call(starts: State<Arc<Starts>>, ctx: TaskContext, n: u32) -> u32 {
    starts
        .0
        .lock()
        .unwrap()
        .push((Instant::now(), ctx.attempt()));
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_one_limit_with_no_second_over_it() {
    let store = Arc::new(common::store().await);
    let broker = Arc::new(ferriq::memory::MemoryBroker::new());
    let starts = Arc::new(Starts::default());
    let workers: Vec<_> = (0..3)
        .map(|_| {
            common::spawn_worker_with(
                broker.clone(),
                store.clone(),
                &[call::NAME],
                Arc::clone(&starts),
            )
        })
        .collect();
    let client = Client::new(broker.clone(), store.clone());
    let begin = Instant::now();
    let handles = client
        .enqueue_batch((0..200).map(call::call))
        .await
        .unwrap();
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(h.wait(Duration::from_secs(60)).await.unwrap(), i as u32);
    }
    let took = begin.elapsed();
    let mut at: Vec<(Instant, u32)> = starts.0.lock().unwrap().clone();
    at.sort();
    assert_eq!(at.len(), 200, "each ran once");
    assert!(
        at.iter().all(|s| s.1 == 1),
        "waiting for a turn spent no attempt"
    );
    let most = (0..at.len())
        .map(|i| {
            at[i..]
                .iter()
                .take_while(|t| t.0 < at[i].0 + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    assert!(most <= 50, "{most} starts in one second");
    // 50 at once, then 50 a second: about 3 s for 200.
    assert!(took < Duration::from_secs(8), "{took:?}");
    for w in workers {
        w.stop().await;
    }
}
