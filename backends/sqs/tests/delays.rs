//! Delayed tasks on SQS: `DelaySeconds` rounds down to whole seconds and the worker holds
//! the rest, so each runs within a second of when it is due, never before.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{QueueOptions, Queues};
use ferriq::memory::MemoryStore;
use ferriq::testing::RunningWorker;
use ferriq::wire::TaskId;
use ferriq::{Client, Registry, State, TaskContext, Worker};

#[derive(Default)]
struct Starts(Mutex<HashMap<TaskId, f64>>);

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[ferriq::task(name = "sqs.delays.stamp")]
async fn stamp(starts: State<Arc<Starts>>, ctx: TaskContext) {
    starts
        .0
        .lock()
        .unwrap()
        .insert(ctx.task_id().clone(), now_unix());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_tasks_run_within_a_second_of_when_they_are_due() {
    let queues = Queues::create(QueueOptions::default()).await;
    let store = Arc::new(MemoryStore::new());
    let starts = Arc::new(Starts::default());
    let worker = RunningWorker::spawn(
        Worker::builder()
            .broker(Arc::new(queues.broker().await))
            .store(store.clone())
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[stamp::NAME])
                    .unwrap(),
            )
            .state(Arc::clone(&starts))
            .build()
            .unwrap(),
    );
    let client = Client::new(Arc::new(queues.broker().await), store);
    let mut due = Vec::new();
    for ms in [9_300u64, 250, 4_700, 1_900, 6_050, 0, 3_333] {
        let msg = stamp::call()
            .with_delay(Duration::from_millis(ms))
            .into_message()
            .unwrap();
        let at = msg.labels.due_at().unwrap_or_else(now_unix);
        let h = client.enqueue_message(msg).await.unwrap();
        due.push((h, at));
    }
    for (h, _) in &due {
        h.wait(Duration::from_secs(60)).await.unwrap();
    }
    let lateness: Vec<f64> = {
        let starts = starts.0.lock().unwrap();
        due.iter().map(|(h, at)| starts[h.task_id()] - at).collect()
    };
    for late in lateness {
        assert!(
            (-0.005..1.0).contains(&late),
            "ran {late:.3} s after it was due"
        );
    }
    worker.stop().await;
}
