//! Middleware on the memory engine: every hook point and the order they run in; labels set
//! on the client reach the run; extensions reach the task; a refused message is not
//! published; hooks that fail or panic change neither a task's outcome nor its single result.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferriq::broker::Broker;
use ferriq::middleware::{AfterError, DeadLettered, Middleware, MiddlewareError, Run};
use ferriq::task::AppState;
use ferriq::testing::TestEnv;
use ferriq::wire::{TaskMessage, TaskResult};
use ferriq::workflow::{chord, Chain, Group, Step};
use ferriq::{EnqueueError, TaskContext, TaskError, WaitError};

const WAIT: Duration = Duration::from_secs(10);

/// What the hooks saw, in order.
type Log = Arc<Mutex<Vec<String>>>;

struct Recorder {
    name: &'static str,
    log: Log,
}

impl Recorder {
    fn push(&self, what: String) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} {what}", self.name));
    }
}

#[ferriq::async_trait]
impl Middleware for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    async fn before_send(&self, message: &mut TaskMessage) -> Result<(), MiddlewareError> {
        self.push(format!("before_send {}", message.task_name));
        Ok(())
    }
    async fn after_send(&self, message: &TaskMessage, sent: bool) {
        self.push(format!("after_send {} {sent}", message.task_name));
    }
    async fn before_run(&self, run: &Run<'_>, _: &mut AppState) -> Result<(), MiddlewareError> {
        self.push(format!("before_run {} {}", run.task_name, run.attempt));
        Ok(())
    }
    async fn after_result(&self, run: &Run<'_>, result: &TaskResult) {
        self.push(format!(
            "after_result {} err={}",
            run.task_name, result.is_err
        ));
    }
    async fn on_error(&self, run: &Run<'_>, _: &TaskError, next: AfterError) {
        let next = match next {
            AfterError::Retry(_) => "retry",
            AfterError::GiveUp => "give_up",
            _ => "other",
        };
        self.push(format!("on_error {} {next}", run.task_name));
    }
    async fn on_dead_letter(&self, dead: &DeadLettered<'_>) {
        self.push(format!(
            "on_dead_letter {} {}",
            dead.task_name.unwrap_or("-"),
            dead.reason.as_str()
        ));
    }
}

#[ferriq::task(name = "mw.flaky_once", max_attempts = 3, backoff_initial = 0.01)]
async fn flaky_once(ctx: TaskContext) -> Result<u32, TaskError> {
    if ctx.attempt() == 1 {
        return Err(TaskError::retryable("first attempt fails"));
    }
    Ok(ctx.attempt())
}

#[ferriq::task(name = "mw.fatal")]
async fn fatal() -> Result<(), TaskError> {
    Err(TaskError::fatal("never works"))
}

fn lines(log: &Log, prefix: &str) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|l| l.split(' ').nth(1) == Some(prefix))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hook_runs_in_order_around_sends_and_runs() {
    let env = TestEnv::new();
    let log = Log::default();
    let recorders: Vec<Arc<dyn Middleware>> = ["A", "B", "C"]
        .into_iter()
        .map(|name| {
            Arc::new(Recorder {
                name,
                log: log.clone(),
            }) as Arc<dyn Middleware>
        })
        .collect();
    let mut client = env.client.clone();
    let mut builder = env
        .worker()
        .registry(
            ferriq::Registry::from_inventory()
                .unwrap()
                .only(&[flaky_once::NAME, fatal::NAME])
                .unwrap(),
        )
        .config({
            let mut c = ferriq::WorkerConfig::default();
            c.min_defer = Duration::from_millis(10);
            c
        });
    for m in &recorders {
        client = client.with_middleware(m.clone());
        builder = builder.middleware(m.clone());
    }
    let worker = env.spawn_worker(builder);

    let handle = client.enqueue(flaky_once::call()).await.unwrap();
    assert_eq!(handle.wait(WAIT).await.unwrap(), 2);
    let failed = client.enqueue(fatal::call()).await.unwrap();
    assert!(matches!(failed.wait(WAIT).await, Err(WaitError::Failed(_))));
    // The dead-letter hook runs after the result is written and the message parked.
    let deadline = tokio::time::Instant::now() + WAIT;
    while lines(&log, "on_dead_letter").len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.stop().await;

    let by = |hook: &str, task: &str| -> Vec<String> {
        lines(&log, hook)
            .into_iter()
            .filter(|l| l.contains(task))
            .map(|l| l.split(' ').next().unwrap().to_owned())
            .collect()
    };
    let forward = ["A", "B", "C"];
    let backward = ["C", "B", "A"];
    // Before something: registration order; after something: the reverse.
    assert_eq!(by("before_send", flaky_once::NAME), forward);
    assert_eq!(by("after_send", flaky_once::NAME), backward);
    // Two runs of the flaky task: each before_run in order.
    assert_eq!(
        by("before_run", flaky_once::NAME),
        ["A", "B", "C", "A", "B", "C"]
    );
    assert_eq!(by("on_error", flaky_once::NAME), backward);
    assert!(lines(&log, "on_error")
        .iter()
        .filter(|l| l.contains(flaky_once::NAME))
        .all(|l| l.ends_with("retry")));
    assert_eq!(by("after_result", flaky_once::NAME), backward);
    assert_eq!(by("on_error", fatal::NAME), backward);
    assert!(lines(&log, "on_error")
        .iter()
        .filter(|l| l.contains(fatal::NAME))
        .all(|l| l.ends_with("give_up")));
    assert_eq!(by("after_result", fatal::NAME), backward);
    assert!(lines(&log, "after_result")
        .iter()
        .filter(|l| l.contains(fatal::NAME))
        .all(|l| l.ends_with("err=true")));
    assert_eq!(by("on_dead_letter", fatal::NAME), backward);
    assert!(lines(&log, "on_dead_letter")
        .iter()
        .all(|l| l.ends_with("non_retryable")));
    // after_result of the flaky task came after its successful run only (once).
    assert_eq!(env.store.total_writes(), 2);
}

/// The tenant a message belongs to, set by the caller, carried as a label, and handed to the
/// task by the worker's middleware.
#[derive(Debug, PartialEq)]
struct Tenant(String);

tokio::task_local! {
    static CURRENT_TENANT: String;
}

struct TenantContext;

#[ferriq::async_trait]
impl Middleware for TenantContext {
    async fn before_send(&self, message: &mut TaskMessage) -> Result<(), MiddlewareError> {
        match CURRENT_TENANT.try_with(Clone::clone) {
            Ok(tenant) => {
                message.labels.insert("tenant", tenant);
                Ok(())
            }
            Err(_) => Err(MiddlewareError::new(
                "no tenant in scope: refusing to enqueue",
            )),
        }
    }
    async fn before_run(&self, run: &Run<'_>, ext: &mut AppState) -> Result<(), MiddlewareError> {
        let tenant = run
            .labels
            .get("tenant")
            .and_then(|v| v.as_str())
            .ok_or_else(|| MiddlewareError::new("no tenant label"))?;
        ext.insert(Tenant(tenant.to_owned()));
        Ok(())
    }
}

#[ferriq::task(name = "mw.whose")]
async fn whose(ctx: TaskContext) -> Result<String, TaskError> {
    Ok(ctx
        .extension::<Tenant>()
        .map_or_else(|| "nobody".to_owned(), |t| t.0.clone()))
}

/// A chain step after `whose`: the previous step's result comes first.
#[ferriq::task(name = "mw.whose_after")]
async fn whose_after(ctx: TaskContext, previous: String) -> Result<String, TaskError> {
    let now = ctx
        .extension::<Tenant>()
        .map_or_else(|| "nobody".to_owned(), |t| t.0.clone());
    Ok(format!("{previous}>{now}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_set_on_send_reach_the_task_and_a_refused_message_is_not_published() {
    let env = TestEnv::new();
    let client = env.client.clone().with_middleware(Arc::new(TenantContext));
    let worker = env.spawn_worker(
        env.worker()
            .registry(
                ferriq::Registry::from_inventory()
                    .unwrap()
                    .only(&[whose::NAME, whose_after::NAME])
                    .unwrap(),
            )
            .middleware(Arc::new(TenantContext)),
    );
    let handle = CURRENT_TENANT
        .scope("acme".to_owned(), client.enqueue(whose::call()))
        .await
        .unwrap();
    assert_eq!(handle.wait(WAIT).await.unwrap(), "acme");

    // What a worker sends later for the caller — a chord's callback, a chain's next steps —
    // went through the caller's middleware too.
    let chord = CURRENT_TENANT
        .scope(
            "initech".to_owned(),
            client.enqueue_chord(chord(Group::new([whose::call()]), whose::call())),
        )
        .await
        .unwrap();
    assert_eq!(chord.wait(WAIT).await.unwrap(), "initech");
    let chain = Chain::new(whose::call()).then(Step::new(whose_after::NAME));
    let chain = CURRENT_TENANT
        .scope("globex".to_owned(), client.enqueue_chain::<String>(chain))
        .await
        .unwrap();
    assert_eq!(chain.wait(WAIT).await.unwrap(), "globex>globex");
    // Refused for a stored step too: nothing is written or published. (The last step's ack
    // may land after its result: the queue is read once the worker has settled everything.)
    let before = settled(&env).await;
    let chain = Chain::new(whose::call()).then(Step::new(whose_after::NAME));
    assert!(matches!(
        client.enqueue_chain::<String>(chain).await,
        Err(EnqueueError::Middleware { .. })
    ));
    assert_eq!(before, env.broker.depth().await.unwrap());

    // Outside a tenant's scope: refused, with the middleware's reason, and nothing published.
    let before = settled(&env).await;
    match client.enqueue(whose::call()).await {
        Err(EnqueueError::Middleware { reason, .. }) => assert!(reason.contains("no tenant")),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let after = env.broker.depth().await.unwrap();
    assert_eq!(before, after, "nothing published");
    worker.stop().await;
}

/// The broker's depth once nothing is queued or held (polled, up to 10 s).
async fn settled(env: &TestEnv) -> ferriq::broker::QueueDepth {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let depth = env.broker.depth().await.unwrap();
        if depth.ready == 0 && depth.in_flight == 0 {
            return depth;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue never settled: {depth:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fails or panics in every hook it has (but `before_send`, which would refuse the message).
struct Broken {
    panic: bool,
}

impl Broken {
    fn fail(&self, hook: &str) -> Result<(), MiddlewareError> {
        if self.panic {
            panic!("{hook} panicked on purpose");
        }
        Err(MiddlewareError::new(format!("{hook} failed on purpose")))
    }
}

#[ferriq::async_trait]
impl Middleware for Broken {
    async fn after_send(&self, _: &TaskMessage, _: bool) {
        let _ = self.fail("after_send");
    }
    async fn before_run(&self, _: &Run<'_>, _: &mut AppState) -> Result<(), MiddlewareError> {
        self.fail("before_run")
    }
    async fn after_result(&self, _: &Run<'_>, _: &TaskResult) {
        let _ = self.fail("after_result");
    }
    async fn on_error(&self, _: &Run<'_>, _: &TaskError, _: AfterError) {
        let _ = self.fail("on_error");
    }
    async fn on_dead_letter(&self, _: &DeadLettered<'_>) {
        let _ = self.fail("on_dead_letter");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_panicking_hooks_leave_outcomes_and_the_single_result_write_intact() {
    for panic in [false, true] {
        let env = TestEnv::new();
        let broken: Arc<dyn Middleware> = Arc::new(Broken { panic });
        let client = env.client.clone().with_middleware(broken.clone());
        let worker = env.spawn_worker(
            env.worker()
                .registry(
                    ferriq::Registry::from_inventory()
                        .unwrap()
                        .only(&[flaky_once::NAME, fatal::NAME])
                        .unwrap(),
                )
                .config({
                    let mut c = ferriq::WorkerConfig::default();
                    c.min_defer = Duration::from_millis(10);
                    c
                })
                .middleware(broken),
        );
        let ok = client.enqueue(flaky_once::call()).await.unwrap();
        let bad = client.enqueue(fatal::call()).await.unwrap();
        assert_eq!(ok.wait(WAIT).await.unwrap(), 2, "panic={panic}");
        assert!(matches!(bad.wait(WAIT).await, Err(WaitError::Failed(_))));
        let deadline = tokio::time::Instant::now() + WAIT;
        while env.broker.dead_letters().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "parked");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        worker.stop().await;
        assert_eq!(
            env.store.total_writes(),
            2,
            "one result each (panic={panic})"
        );
        assert!(env.store.duplicate_writes().is_empty());
        assert_eq!(env.broker.dead_letters().len(), 1);
        assert_eq!(
            env.broker.depth().await.unwrap().ready,
            0,
            "nothing left behind"
        );
    }
}

struct PanicsOnSend;

#[ferriq::async_trait]
impl Middleware for PanicsOnSend {
    async fn before_send(&self, _: &mut TaskMessage) -> Result<(), MiddlewareError> {
        panic!("before_send panicked on purpose");
    }
}

#[tokio::test]
async fn a_panicking_before_send_refuses_the_message_and_publishes_nothing() {
    let env = TestEnv::new();
    let client = env.client.clone().with_middleware(Arc::new(PanicsOnSend));
    match client.enqueue(whose::call()).await {
        Err(EnqueueError::Middleware { middleware, reason }) => {
            assert!(middleware.contains("PanicsOnSend"), "{middleware}");
            assert!(reason.contains("panicked"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(env.broker.depth().await.unwrap().ready, 0);
}
