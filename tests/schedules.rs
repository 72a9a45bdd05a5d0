//! Schedules on the memory backends with paused time: each tick runs once with several
//! schedulers (and clocks 5 s apart), a dead leader is replaced within its lease, missed ticks
//! follow their policy, run-time schedules are added, listed and removed, and `no_overlap`
//! keeps runs apart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferriq::schedule::{MissedTicks, ScheduleSpec, Scheduler};
use ferriq::testing::{RunningWorker, TestEnv};
use ferriq::wire::TaskId;
use ferriq::{Registry, Shutdown, State, TaskContext};

/// Runs per task id, and when (tokio's paused clock, seconds since the test began); the ticks
/// run (their `ferriq_tick` label) with when they ran (unix seconds, the env's clock); and the
/// slow task's runs, (start, end) on tokio's clock.
#[derive(Default)]
struct Runs(
    Mutex<HashMap<TaskId, Vec<f64>>>,
    Mutex<Vec<(i64, f64)>>,
    Mutex<Vec<(f64, Option<f64>)>>,
);

impl Runs {
    fn total(&self) -> usize {
        self.0.lock().unwrap().values().map(Vec::len).sum()
    }
    fn distinct(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn most(&self) -> usize {
        self.0
            .lock()
            .unwrap()
            .values()
            .map(Vec::len)
            .max()
            .unwrap_or(0)
    }
}

#[ferriq::task(
    name = "sched.every_second",
    every = 1,
    missed = "catch_up",
    catch_up_max = 50
)]
async fn every_second(
    runs: State<Arc<Runs>>,
    start: State<tokio::time::Instant>,
    clock: State<ferriq::clock::Clock>,
    ctx: TaskContext,
) {
    let at = start.elapsed().as_secs_f64();
    runs.0
        .lock()
        .unwrap()
        .entry(ctx.task_id().clone())
        .or_default()
        .push(at);
    if let Some(tick) = ctx.labels().get("ferriq_tick").and_then(|t| t.as_i64()) {
        runs.1.lock().unwrap().push((tick, clock.now_unix()));
    }
}

#[ferriq::task(name = "sched.report")]
async fn report(
    runs: State<Arc<Runs>>,
    start: State<tokio::time::Instant>,
    ctx: TaskContext,
    customer: String,
) {
    let _ = customer;
    let at = start.elapsed().as_secs_f64();
    runs.0
        .lock()
        .unwrap()
        .entry(ctx.task_id().clone())
        .or_default()
        .push(at);
}

#[ferriq::task(name = "sched.slow")]
async fn slow(runs: State<Arc<Runs>>, start: State<tokio::time::Instant>) {
    let at = start.elapsed().as_secs_f64();
    let n = {
        let mut spans = runs.2.lock().unwrap();
        spans.push((at, None));
        spans.len() - 1
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    runs.2.lock().unwrap()[n].1 = Some(start.elapsed().as_secs_f64());
}

fn worker(env: &TestEnv, runs: &Arc<Runs>, start: tokio::time::Instant) -> RunningWorker {
    env.spawn_worker(
        env.worker()
            .registry(
                Registry::from_inventory()
                    .unwrap()
                    .only(&[every_second::NAME, report::NAME, slow::NAME])
                    .unwrap(),
            )
            .state(Arc::clone(runs))
            .state(start)
            .state(env.clock),
    )
}

fn scheduler(env: &TestEnv, id: &str) -> ferriq::schedule::SchedulerBuilder {
    Scheduler::builder(Arc::new(env.broker.clone()), Arc::new(env.store.clone()))
        .clock(env.clock)
        .id(id)
}

/// A scheduler of the run-time schedules only (none declared on this binary's tasks).
fn run_time_scheduler(env: &TestEnv, id: &str) -> Scheduler {
    scheduler(env, id)
        .declared_schedules(false)
        .build()
        .unwrap()
}

/// Adds `spec` and runs a scheduler of the run-time schedules.
async fn schedule_alone(
    env: &TestEnv,
    spec: ScheduleSpec,
) -> (Shutdown, tokio::task::JoinHandle<()>) {
    env.client.schedules().add(spec).await.unwrap();
    spawn(run_time_scheduler(env, "s"))
}

fn spawn(s: Scheduler) -> (Shutdown, tokio::task::JoinHandle<()>) {
    let shutdown = Shutdown::new();
    let join = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { s.run(shutdown).await }
    });
    (shutdown, join)
}

#[tokio::test(start_paused = true)]
async fn two_schedulers_with_clocks_five_seconds_apart_make_one_run_per_tick() {
    let env = TestEnv::new();
    let runs = Arc::new(Runs::default());
    let start = tokio::time::Instant::now();
    let w = worker(&env, &runs, start);
    // No leader election: both send every tick, one of them 5 s ahead.
    let a = spawn(scheduler(&env, "a").leader_election(false).build().unwrap());
    let b = spawn(
        scheduler(&env, "b")
            .clock(env.clock.offset(5.0))
            .leader_election(false)
            .build()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    for (s, j) in [a, b] {
        s.drain();
        j.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    w.stop().await;
    assert!(runs.distinct() >= 29, "ticks run: {}", runs.distinct());
    assert_eq!(runs.most(), 1, "a tick ran more than once");
    assert_eq!(runs.total(), runs.distinct());
    // Ticks sent by the scheduler 5 s ahead wait until due: every tick runs at its second
    // (on the workers' clock), never early.
    // (The first tick, due the moment the schedulers started, was already a fraction past.)
    let ran = runs.1.lock().unwrap().clone();
    let first = ran.iter().map(|(t, _)| *t).min().unwrap();
    for (tick, ran) in ran.iter().filter(|(t, _)| *t > first) {
        let late = ran - *tick as f64;
        assert!(
            (0.0..0.1).contains(&late),
            "tick {tick} ran {late:.3} s after it was due"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_leader_is_replaced_within_its_lease_and_missed_ticks_are_caught_up() {
    let env = TestEnv::new();
    let runs = Arc::new(Runs::default());
    let start = tokio::time::Instant::now();
    let w = worker(&env, &runs, start);
    let (a_stop, a) = spawn(scheduler(&env, "a").build().unwrap());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = spawn(scheduler(&env, "b").build().unwrap());
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(
        env.client.schedules().leader().await.unwrap().as_deref(),
        Some("a")
    );
    // The leader dies without a word (its task is cut off).
    a.abort();
    let _ = a.await;
    drop(a_stop);
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert_eq!(
        env.client.schedules().leader().await.unwrap().as_deref(),
        Some("b"),
        "taken over within the 5 s lease"
    );
    tokio::time::sleep(Duration::from_millis(14_500)).await;
    b.0.drain();
    b.1.await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    w.stop().await;
    // Every second from the first tick on ran once: the ticks the dead leader did not send
    // were caught up (the schedule's policy).
    let mut ticks: Vec<i64> = runs.1.lock().unwrap().iter().map(|(t, _)| *t).collect();
    ticks.sort();
    assert_eq!(runs.most(), 1);
    let expected = (ticks[ticks.len() - 1] - ticks[0] + 1) as usize;
    assert_eq!(ticks.len(), expected, "missed ticks: {ticks:?}");
    assert!(ticks.len() >= 30, "{}", ticks.len());
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_follow_their_policy() {
    for (missed, expect_missed) in [
        (MissedTicks::Skip, 0),
        (MissedTicks::Latest, 1),
        (MissedTicks::CatchUp { max: 5 }, 5),
        (MissedTicks::CatchUp { max: 100 }, 17),
    ] {
        let env = TestEnv::new();
        let runs = Arc::new(Runs::default());
        let start = tokio::time::Instant::now();
        let w = worker(&env, &runs, start);
        let spec = ScheduleSpec::every("r", report::NAME, 1)
            .with_args(vec![serde_json::json!("acme")])
            .with_missed(missed);
        env.client.schedules().add(spec).await.unwrap();
        let s = || run_time_scheduler(&env, "s");
        let (stop, join) = spawn(s());
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        stop.drain();
        join.await.unwrap();
        // Every scheduler down for 20 ticks (what was sent ahead runs first), then one starts
        // again.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let before = runs.distinct();
        tokio::time::sleep(Duration::from_secs(16)).await;
        let (stop, join) = spawn(s());
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.drain();
        join.await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        w.stop().await;
        // What ran on the restart: the missed ticks the policy keeps, plus the due ones (the
        // tick due at the restart and those sent ahead).
        let after = runs.distinct() - before;
        assert!(
            (expect_missed..=expect_missed + 4).contains(&after),
            "{missed:?}: {after} ran after the outage"
        );
        assert_eq!(runs.most(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn run_time_schedules_are_added_listed_removed_and_survive_restarts() {
    let env = TestEnv::new();
    let runs = Arc::new(Runs::default());
    let start = tokio::time::Instant::now();
    let w = worker(&env, &runs, start);
    let schedules = env.client.schedules();
    schedules
        .add(
            ScheduleSpec::cron("acme-weekly", report::NAME, "*/2 * * * * *")
                .in_timezone("Europe/Berlin")
                .with_args(vec![serde_json::json!("acme")]),
        )
        .await
        .unwrap();
    assert!(schedules
        .add(ScheduleSpec::cron("bad", report::NAME, "61 * * * * *"))
        .await
        .is_err());
    let listed = schedules.list().await.unwrap();
    let acme = listed.iter().find(|s| s.spec.id == "acme-weekly").unwrap();
    assert!(!acme.declared && acme.next_run.is_some());
    assert!(listed
        .iter()
        .any(|s| s.spec.id == every_second::NAME && s.declared));

    let (stop, join) = spawn(run_time_scheduler(&env, "s1"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Every scheduler restarts: the schedule is in the store.
    stop.drain();
    join.await.unwrap();
    let (stop, join) = spawn(run_time_scheduler(&env, "s2"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before_removal = runs.distinct();
    assert!((9..=12).contains(&before_removal), "{before_removal}");
    let listed = schedules.list().await.unwrap();
    let acme = listed.iter().find(|s| s.spec.id == "acme-weekly").unwrap();
    assert!(acme.last_tick.is_some() && acme.last_status.is_some());

    assert!(schedules.remove("acme-weekly").await.unwrap());
    // Ticks already sent ahead (their due time not yet come) still run; nothing new is sent.
    let sent = env.broker.stats().published;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(env.broker.stats().published, sent, "sent after the removal");
    assert!(runs.distinct() <= before_removal + 2);
    assert!(!schedules.remove("acme-weekly").await.unwrap());
    stop.drain();
    join.await.unwrap();
    w.stop().await;
    assert_eq!(runs.most(), 1);
}

#[tokio::test(start_paused = true)]
async fn no_overlap_skips_every_tick_while_the_sent_one_runs() {
    let env = TestEnv::new();
    let runs = Arc::new(Runs::default());
    let w = worker(&env, &runs, tokio::time::Instant::now());
    // Every 2 s, each run 5 s: the ticks in between are skipped — also the one after a
    // skipped tick, which was never claimed (that one was sent while the run went on).
    let spec = ScheduleSpec::every("slow", slow::NAME, 2).without_overlap();
    let (stop, join) = schedule_alone(&env, spec).await;
    let schedules = env.client.schedules();
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    // Mid-run (the second run started at about 6 s): the listing shows the sent tick's run,
    // not the skipped tick's (never claimed, so it would read as pending).
    let listed = schedules.list().await.unwrap();
    let info = listed.iter().find(|s| s.spec.id == "slow").unwrap();
    assert!(
        matches!(
            info.last_status,
            Some(ferriq::client::TaskStatus::Started { .. })
        ),
        "{:?}",
        info.last_status
    );
    tokio::time::sleep(Duration::from_millis(22_500)).await;
    stop.drain();
    join.await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    w.stop().await;
    let spans = runs.2.lock().unwrap().clone();
    // Runs at about 0, 6, 12, 18, 24 s: a new one starts within a tick of the last ending.
    assert!((4..=6).contains(&spans.len()), "{spans:?}");
    for pair in spans.windows(2) {
        let (end, next) = (pair[0].1.expect("finished"), pair[1].0);
        assert!(next >= end, "overlap: {spans:?}");
        assert!(next - end <= 2.5, "waited more than a tick: {spans:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn no_overlap_holds_the_next_tick_while_the_sent_one_waits_in_the_queue() {
    let env = TestEnv::new();
    let spec = ScheduleSpec::every("slow", slow::NAME, 2).without_overlap();
    let (stop, join) = schedule_alone(&env, spec).await;
    // No worker: the first tick waits unclaimed; sending more would queue runs that free
    // slots start together once workers come.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(env.broker.stats().published, 1);
    stop.drain();
    join.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn no_overlap_stops_waiting_for_a_dead_run_at_its_ticks_deadline() {
    use ferriq::store::{ClaimStore, ScheduleStore};
    let env = TestEnv::new();
    let spec = ScheduleSpec::every("hourly", slow::NAME, 3_600).without_overlap();
    let (stop, join) = schedule_alone(&env, spec.clone()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3_700);
    while env.broker.stats().published == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no first tick");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Its run starts and its worker dies: the lease lapses, and (say) the broker parks the
    // message after too many deliveries, so no one ever takes it over.
    let tick = env.store.last_sent_tick("hourly").await.unwrap().unwrap();
    env.store
        .claim(&spec.tick_id(tick), "dead", Duration::from_secs(30), None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(23 * 3_600)).await;
    assert_eq!(
        env.broker.stats().published,
        1,
        "sent while the run may live"
    );
    tokio::time::sleep(Duration::from_secs(2 * 3_600)).await;
    assert_eq!(
        env.broker.stats().published,
        2,
        "still held after the deadline"
    );
    stop.drain();
    join.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_paused_schedule_sends_nothing_and_resumes_without_catching_up() {
    let env = TestEnv::new();
    let runs = Arc::new(Runs::default());
    let start = tokio::time::Instant::now();
    let w = worker(&env, &runs, start);
    let schedules = env.client.schedules();
    schedules
        .add(
            ScheduleSpec::every("acme-often", report::NAME, 1)
                .with_args(vec![serde_json::json!("acme")]),
        )
        .await
        .unwrap();
    let (stop, join) = spawn(run_time_scheduler(&env, "s1"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    schedules.pause("acme-often").await.unwrap();
    // Ticks sent ahead before the pause (up to 2 s) still run.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let paused_at = runs.distinct();
    let listed = schedules.list().await.unwrap();
    assert!(listed.iter().any(|s| s.spec.id == "acme-often" && s.paused));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(runs.distinct(), paused_at, "ran while paused");

    schedules.resume("acme-often").await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let resumed = runs.distinct() - paused_at;
    // The next ticks only (those within the 2 s sent ahead passed while paused): the 20 s
    // paused are not caught up.
    assert!((3..=6).contains(&resumed), "{resumed}");
    assert!(!schedules.list().await.unwrap().iter().any(|s| s.paused));
    stop.drain();
    join.await.unwrap();
    w.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_scheduler_records_its_declared_schedules_for_listings_elsewhere() {
    let env = TestEnv::new();
    let (stop, join) = spawn(scheduler(&env, "s1").build().unwrap());
    let recorded = async {
        loop {
            let declared = ferriq::store::ScheduleStore::declared(&env.store)
                .await
                .unwrap();
            if declared.iter().any(|s| s.id == every_second::NAME) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), recorded)
        .await
        .expect("recorded within a round");
    stop.drain();
    join.await.unwrap();
}
