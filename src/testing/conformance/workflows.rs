//! The workflow scenarios, for a store: groups, chords, chains, progress and Started status; and chords racing
//! duplicated deliveries and expired leases.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::broker::{
    Broker, BrokerError, ConsumerSettings, DeadLetter, Delivery, DeliveryHandle, Health,
    LeaseStatus, OutgoingMessage, QueueDepth,
};
use crate::memory::MemoryBroker;
use crate::store::Store;
use crate::testing::{CountingStore, Oracle, RunningWorker};
use crate::wire::{ErrorKind, TaskId};
use crate::workflow::{callback_id, chord, member_id, Chain, ChordPolicy, Group, Step};
use crate::{Client, Registry, State, TaskContext, TaskError, TaskStatus, WaitError, Worker};
use crate::{WorkerBuilder, WorkerConfig};
use async_trait::async_trait;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

#[crate::task(inventory = false, name = "conformance.wf.square")]
async fn square(oracle: State<Oracle>, ctx: TaskContext, x: i64, pause_ms: u64) -> i64 {
    oracle.started(ctx.task_id());
    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    oracle.finished(ctx.task_id());
    x * x
}

#[crate::task(inventory = false, name = "conformance.wf.fail_odd")]
async fn fail_odd(x: i64) -> Result<i64, TaskError> {
    if x % 2 == 1 {
        return Err(TaskError::fatal(format!("{x} is odd")));
    }
    Ok(x)
}

/// A chord callback: the sum of the members' values, and how many members there were.
#[crate::task(inventory = false, name = "conformance.wf.total")]
async fn total(oracle: State<Oracle>, ctx: TaskContext, tag: String) -> Result<String, TaskError> {
    oracle.started(ctx.task_id());
    let values: Vec<i64> = ctx.group_values().await?;
    oracle.finished(ctx.task_id());
    Ok(format!(
        "{tag}:{}:{}",
        values.len(),
        values.iter().sum::<i64>()
    ))
}

/// A chord callback that sees failures too.
#[crate::task(inventory = false, name = "conformance.wf.tally")]
async fn tally(ctx: TaskContext) -> Result<(u32, u32), TaskError> {
    let outcomes: Vec<Result<i64, crate::wire::TaskFailure>> = ctx.group_results().await?;
    let ok = outcomes.iter().filter(|r| r.is_ok()).count() as u32;
    Ok((ok, outcomes.len() as u32 - ok))
}

#[crate::task(inventory = false, name = "conformance.wf.add")]
async fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[crate::task(inventory = false, name = "conformance.wf.fail_if_above")]
async fn fail_if_above(value: i64, limit: i64) -> Result<i64, TaskError> {
    if value > limit {
        return Err(TaskError::fatal(format!("{value} is above {limit}")));
    }
    Ok(value)
}

/// Reports progress, then waits for the test to let it finish.
#[crate::task(inventory = false, name = "conformance.wf.slow_progress")]
async fn slow_progress(gate: State<Arc<tokio::sync::Semaphore>>, ctx: TaskContext) -> u32 {
    ctx.set_progress(json!({"done": 3, "of": 10}))
        .await
        .unwrap();
    let _ = gate.acquire().await.unwrap();
    10
}

/// A chord callback that starts a group of its own (one level of nesting).
#[crate::task(inventory = false, name = "conformance.wf.fan_out_again")]
async fn fan_out_again(client: State<Client>, ctx: TaskContext) -> Result<String, TaskError> {
    let values: Vec<i64> = ctx.group_values().await?;
    let inner = client
        .enqueue_group(Group::new(values.iter().map(|v| add::call(*v, 1))))
        .await
        .map_err(|e| TaskError::retryable(e.to_string()))?;
    Ok(inner.id().to_string())
}

/// The scenarios' tasks (kept out of the inventory: see the module's docs).
fn registry() -> Registry {
    Registry::from_registrations([
        square::registration(),
        fail_odd::registration(),
        total::registration(),
        tally::registration(),
        add::registration(),
        fail_if_above::registration(),
        slow_progress::registration(),
        fan_out_again::registration(),
    ])
    .expect("the scenarios' task names are distinct")
}

/// A memory broker, `store`, a client and one worker serving every workflow task.
struct Env<S: Store> {
    broker: MemoryBroker,
    store: Arc<S>,
    client: Client,
    oracle: Oracle,
    gate: Arc<tokio::sync::Semaphore>,
    worker: Option<RunningWorker>,
}

impl<S: Store> Env<S> {
    fn new(store: Arc<S>) -> Self {
        let broker = MemoryBroker::new();
        let client = Client::new(Arc::new(broker.clone()), store.clone());
        let mut env = Env {
            broker,
            store,
            client,
            oracle: Oracle::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            worker: None,
        };
        env.worker = Some(RunningWorker::spawn(env.builder().build().unwrap()));
        env
    }

    fn builder(&self) -> WorkerBuilder {
        Worker::builder()
            .broker(Arc::new(self.broker.clone()))
            .store(self.store.clone())
            .registry(registry())
            .state(self.oracle.clone())
            .state(Arc::clone(&self.gate))
            .state(self.client.clone())
    }

    async fn stop(mut self) {
        if let Some(w) = self.worker.take() {
            w.stop().await;
        }
    }
}

/// A group of 20 tasks finishing in reverse order: its results come back in the group's order.
pub async fn group_results_come_back_in_order<S: Store>(store: Arc<S>) {
    let env = Env::new(store);
    let group = env
        .client
        .enqueue_group(Group::new(
            (0..20).map(|i| square::call(i, (20 - i) as u64)),
        ))
        .await
        .unwrap();
    assert_eq!(group.len(), 20);
    let results = group.results(WAIT).await.unwrap();
    let values: Vec<i64> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(values, (0..20).map(|i| i * i).collect::<Vec<_>>());
    assert_eq!(group.done().await.unwrap(), 20);
    let summary = group.wait_done(WAIT).await.unwrap();
    assert_eq!(
        (summary.size, summary.succeeded, summary.failed),
        (20, 20, 0)
    );
    // Failures come back in their places.
    let mixed = env
        .client
        .enqueue_group(Group::new((0..5).map(fail_odd::call)))
        .await
        .unwrap();
    let results = mixed.results(WAIT).await.unwrap();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.is_ok(), i % 2 == 0, "member {i}: {r:?}");
    }
    assert_eq!(mixed.wait_done(WAIT).await.unwrap().failed, 2);
    // An empty group is done at once.
    let empty = env
        .client
        .enqueue_group(Group::<i64>::new([]))
        .await
        .unwrap();
    assert_eq!(empty.wait_done(WAIT).await.unwrap().size, 0);
    env.stop().await;
}

/// A chord's callback runs once, after every member, and sees every member's outcome,
/// failures included when its policy says so.
pub async fn a_chord_runs_its_callback_once_with_every_outcome<S: Store>(store: Arc<S>) {
    let env = Env::new(store);
    let handle = env
        .client
        .enqueue_chord(chord(
            Group::new((1..=10).map(|i| square::call(i, 5))),
            total::call("sum".into()),
        ))
        .await
        .unwrap();
    assert_eq!(handle.wait(WAIT).await.unwrap(), "sum:10:385");
    assert_eq!(env.oracle.starts(handle.callback().task_id()), 1);

    // AllSucceeded (the default): a failed member stops the callback with an error.
    let stopped = env
        .client
        .enqueue_chord(chord(
            Group::new((0..4).map(fail_odd::call)),
            total::call("never".into()),
        ))
        .await
        .unwrap();
    match stopped.wait(WAIT).await {
        Err(WaitError::Failed(f)) => {
            assert_eq!(f.kind, Some(ErrorKind::TaskError));
            assert!(f.message.contains("2 of 4 members failed"), "{}", f.message);
            assert!(f.message.contains("member 1 failed first"), "{}", f.message);
        }
        other => panic!("expected the chord's error, got {other:?}"),
    }
    assert_eq!(env.oracle.starts(stopped.callback().task_id()), 0);

    // Always: the callback sees every outcome.
    let always = env
        .client
        .enqueue_chord(
            chord(Group::new((0..5).map(fail_odd::call)), tally::call())
                .policy(ChordPolicy::Always),
        )
        .await
        .unwrap();
    assert_eq!(always.wait(WAIT).await.unwrap(), (3, 2));

    // One level of nesting: the callback starts a group.
    let nested = env
        .client
        .enqueue_chord(chord(
            Group::new((1..=3).map(|i| square::call(i, 0))),
            fan_out_again::call(),
        ))
        .await
        .unwrap();
    let inner_id = TaskId::parse(nested.wait(WAIT).await.unwrap()).unwrap();
    let inner = env.client.handle::<crate::workflow::GroupSummary>(inner_id);
    assert_eq!(inner.wait(WAIT).await.unwrap().succeeded, 3);
    env.stop().await;
}

/// A chain passes each step's result to the next and stops at the first failure.
pub async fn a_chain_feeds_each_result_on_and_stops_at_a_failure<S: Store>(store: Arc<S>) {
    let env = Env::new(store);
    // add(1, 2) = 3 → add(3, 10) = 13 → fail_if_above(13, 100) = 13
    let chain = Chain::new(add::call(1, 2))
        .then(Step::new(add::NAME).arg(10).unwrap())
        .then(Step::new(fail_if_above::NAME).arg(100).unwrap());
    let handle = env.client.enqueue_chain::<i64>(chain).await.unwrap();
    assert_eq!(handle.wait(WAIT).await.unwrap(), 13);
    assert_eq!(handle.step(1).wait(WAIT).await.unwrap(), json!(13));

    // add(1, 2) = 3 → fail_if_above(3, 2) fails → add never runs; the chain's result is the
    // failure.
    let chain = Chain::new(add::call(1, 2))
        .then(Step::new(fail_if_above::NAME).arg(2).unwrap())
        .then(Step::new(add::NAME).arg(1).unwrap());
    let handle = env.client.enqueue_chain::<i64>(chain).await.unwrap();
    match handle.wait(WAIT).await {
        Err(WaitError::Failed(f)) => {
            assert!(
                f.message.contains("chain step 1 failed: 3 is above 2"),
                "{}",
                f.message
            )
        }
        other => panic!("expected the chain's failure, got {other:?}"),
    }
    env.stop().await;
}

/// A running task's progress and its `Started` status are visible to its client.
pub async fn progress_and_started_are_visible<S: Store>(store: Arc<S>) {
    let env = Env::new(store);
    let handle = slow_progress::kiq(&env.client).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let progress = loop {
        if let Some(p) = handle.progress().await.unwrap() {
            break p;
        }
        assert!(tokio::time::Instant::now() < deadline, "no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(progress, json!({"done": 3, "of": 10}));
    match handle.status().await.unwrap() {
        TaskStatus::Started {
            worker,
            started_at_ms,
        } => {
            assert!(!worker.is_empty());
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            let started = started_at_ms.expect("the start time is known");
            assert!(
                started <= now_ms + 1000 && now_ms - started < 60_000,
                "{started}"
            );
        }
        other => panic!("expected Started, got {other:?}"),
    }
    env.gate.add_permits(1);
    assert_eq!(handle.wait(WAIT).await.unwrap(), 10);
    assert_eq!(handle.status().await.unwrap(), TaskStatus::Succeeded);
    env.stop().await;
}

/// Publishes every message twice: each member, callback and step is delivered as two copies.
#[derive(Clone)]
struct Duplicating(MemoryBroker);

#[async_trait]
impl Broker for Duplicating {
    async fn publish(&self, batch: Vec<OutgoingMessage>) -> Result<(), BrokerError> {
        let doubled: Vec<_> = batch.into_iter().flat_map(|m| [m.clone(), m]).collect();
        self.0.publish(doubled).await
    }
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BrokerError> {
        self.0.receive(max, wait).await
    }
    async fn ack(&self, d: &DeliveryHandle) -> Result<(), BrokerError> {
        self.0.ack(d).await
    }
    async fn release(&self, d: &DeliveryHandle, after: Duration) -> Result<(), BrokerError> {
        self.0.release(d, after).await
    }
    async fn extend(
        &self,
        d: &[DeliveryHandle],
        lease: Duration,
    ) -> Result<Vec<LeaseStatus>, BrokerError> {
        self.0.extend(d, lease).await
    }
    async fn dead_letter(&self, d: &Delivery, why: &DeadLetter) -> Result<(), BrokerError> {
        self.0.dead_letter(d, why).await
    }
    async fn depth(&self) -> Result<QueueDepth, BrokerError> {
        self.0.depth().await
    }
    async fn health(&self) -> Health {
        self.0.health().await
    }
    fn prepare_consumer(&self, consumer: &ConsumerSettings) {
        self.0.prepare_consumer(consumer)
    }
}

/// `chords` chords of `members` members each, completed by 8 workers while every message is
/// delivered twice and a chaos loop expires claim leases and broker visibility at random:
/// every callback runs once and every result is written once.
pub async fn racing_chords<S: Store>(
    store: Arc<S>,
    expire_lease: super::exactly_once::ExpireLease,
    chords: u32,
    members: u32,
) {
    let memory = MemoryBroker::with_visibility(Duration::from_secs(3));
    let broker = Duplicating(memory.clone());
    let store = Arc::new(CountingStore::new(store));
    let oracle = Oracle::default();
    let client = Client::new(Arc::new(broker.clone()), store.clone());
    let mut config = WorkerConfig::default();
    config.concurrency = 16;
    config.lease = Duration::from_secs(3);
    config.min_defer = Duration::from_millis(20);
    config.max_takeovers = u32::MAX;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let workers: Vec<RunningWorker> = (0..8)
        .map(|i| {
            RunningWorker::spawn(
                Worker::builder()
                    .broker(Arc::new(broker.clone()))
                    .store(store.clone())
                    .registry(registry())
                    .state(oracle.clone())
                    .state(Arc::clone(&gate))
                    .state(client.clone())
                    .config(config.clone())
                    .jitter_seed(i)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(11);
    let mut handles = Vec::new();
    let mut ids = Vec::new();
    for c in 0..chords {
        let pauses: Vec<u64> = (0..members).map(|_| rng.random_range(10..60)).collect();
        let h = client
            .enqueue_chord(chord(
                Group::new((0..members).map(|i| square::call(i as i64, pauses[i as usize]))),
                total::call(format!("chord{c}")),
            ))
            .await
            .unwrap();
        ids.push(h.callback().task_id().clone());
        ids.extend((0..members).map(|i| member_id(h.group().id(), i)));
        handles.push(h);
    }
    let done = Arc::new(AtomicBool::new(false));
    let chaos = {
        let (memory, ids, done) = (memory.clone(), ids.clone(), done.clone());
        tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(3);
            let (mut leases, mut round) = (0usize, 0u64);
            while !done.load(Ordering::SeqCst) {
                for _ in 0..50 {
                    let id = ids[rng.random_range(0..ids.len())].clone();
                    leases += usize::from(expire_lease(id).await);
                }
                if round % 20 == 0 {
                    memory.expire_in_flight();
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            leases
        })
    };
    let expected_sum: i64 = (0..members as i64).map(|i| i * i).sum();
    for (c, h) in handles.iter().enumerate() {
        assert_eq!(
            h.wait(Duration::from_secs(300)).await.unwrap(),
            format!("chord{c}:{members}:{expected_sum}")
        );
    }
    done.store(true, Ordering::SeqCst);
    let leases = chaos.await.unwrap();
    // Stopped before counting: a waiter can hear a result announced before the worker's
    // write call has returned to the counting store.
    for w in workers {
        w.stop().await;
    }
    for h in &handles {
        let cb = callback_id(h.group().id());
        // A run whose lease the chaos expired may still finish; its write is fenced off.
        assert!(oracle.starts(&cb) >= 1, "callback {cb} ran");
        assert_eq!(store.writes(&cb), 1, "callback {cb}'s result written once");
        for i in 0..members {
            assert_eq!(store.writes(&member_id(h.group().id(), i)), 1);
        }
    }
    assert!(store.duplicate_writes().is_empty());
    println!(
        "{chords} chords x {members} members: {} results, {} duplicate starts, {leases} leases expired",
        store.total_writes(),
        oracle.duplicate_starts()
    );
}
