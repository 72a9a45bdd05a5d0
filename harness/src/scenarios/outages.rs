//! Scenarios 6–10: the store killed and restarted, connections blackholed, a drain under
//! SIGTERM, a big backlog, and workflows under SIGKILL.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use ferriq::store::ResultStore;
use rand::Rng;
use tokio::time::Instant;

use super::{spread, Size, DRAIN};
use crate::events;
use crate::report::{judge, Row};
use crate::tasks;
use crate::world::{now_ms, Backend, Settings, World};

/// Scenario 6: The store SIGKILLed mid-run and restarted (without persistence, then with AOF
/// `appendfsync always`).
pub(super) async fn store_restart(backend: Backend, size: Size, root: &Path, aof: bool) -> Row {
    let settings = Settings {
        aof,
        ..Settings::default()
    };
    let mut w = World::new(backend, root, settings).await;
    for _ in 0..3 {
        w.spawn_worker();
    }
    w.enqueue_work(size.steady, |k| spread(k, 50, 250)).await;
    while w.written() < w.sent.len() / 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (down_at, up_at, unheard) = restart_store(&mut w).await;
    let drained = w.wait_written(DRAIN).await;
    let scenario = if aof {
        "6b. store SIGKILLed and restarted, AOF always"
    } else {
        "6a. store SIGKILLed and restarted, no persistence"
    };
    let mut j = judge(
        &w,
        scenario,
        "SIGKILL redis, down 3 s".into(),
        aof,
        Some(up_at),
    );
    // Runs while the store was down: none may start (a run needs its claim).
    let started_down = j
        .events
        .iter()
        .filter(|e| e.kind == "start" && e.at_ms > down_at + 200 && e.at_ms < up_at)
        .count();
    // Completed tasks that ran again after the restart.
    let mut reruns = 0;
    let mut lost_with_data = 0;
    for id in &w.sent {
        let Some(first) = j.writes.get(id.as_str()).and_then(|v| v.first()) else {
            continue;
        };
        if first.epoch == 0
            && j.events
                .iter()
                .any(|e| e.kind == "start" && e.task_id == id.as_str() && e.at_ms > first.at_ms)
        {
            reruns += 1;
        }
        if matches!(
            w.store.get(id).await,
            Ok(ferriq::store::ResultStatus::Pending)
        ) {
            lost_with_data += 1;
        }
    }
    j.row.notes.push(format!(
        "runs started while down: {started_down}; completed tasks run again: {reruns}; results lost with the data: {lost_with_data}; writes whose notice died with the server: {unheard}"
    ));
    j.row.check(drained, "not every task finished");
    j.row
        .check(started_down == 0, "runs started while the store was down");
    if aof {
        j.row.check(reruns == 0, "completed tasks ran again");
        j.row
            .check(lost_with_data == 0, "results lost despite the AOF");
    }
    let row = j.row;
    w.cleanup().await;
    row
}

/// SIGKILLs the store, restarts it 3 s later and lets the workers back to it: when it went
/// down and came back (unix ms), and how many writes' notices died with it.
pub(super) async fn restart_store(w: &mut World) -> (u64, u64, usize) {
    // Nothing reaches the new server before the oracle listens to it.
    w.redis_proxy.blackhole();
    // Every write a worker was told of is counted before the server dies with its notice.
    w.oracle.flush().await;
    let down_at = now_ms();
    w.redis.kill().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    w.redis.restart().await;
    w.oracle.attach(w.redis.port, false).await;
    let ids: Vec<String> = w.sent.iter().map(|id| id.to_string()).collect();
    let unheard = w.oracle.recover(w.redis.port, &ids, down_at).await;
    let up_at = now_ms();
    w.redis_proxy.reset();
    (down_at, up_at, unheard)
}

/// Scenario 7: Store and broker connections blackholed, then reset.
pub(super) async fn blackhole(backend: Backend, size: Size, root: &Path) -> Row {
    let mut w = World::new(backend, root, Settings::default()).await;
    for _ in 0..3 {
        w.spawn_worker();
    }
    // Probes up first.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !w.ready(0).await {
        assert!(Instant::now() < deadline, "worker not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.enqueue_work(size.steady, |k| spread(k, 100, 300)).await;
    while w.written() < w.sent.len() / 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    w.redis_proxy.blackhole();
    w.broker_proxy.blackhole();
    let mut detected = None;
    while start.elapsed() < size.blackhole {
        if detected.is_none() {
            // All three probed at once: a probe may wait out its own timeout.
            let (a, b, c) = tokio::join!(w.ready(0), w.ready(1), w.ready(2));
            if !a && !b && !c {
                detected = Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    w.redis_proxy.reset();
    w.broker_proxy.reset();
    let fault_end = now_ms();
    let drained = w.wait_written(DRAIN).await;
    let mut j = judge(
        &w,
        "7. store and broker blackholed, then reset",
        format!("blackhole {} s", size.blackhole.as_secs()),
        false,
        Some(fault_end),
    );
    j.row.notes.push(format!(
        "every worker unready after {}",
        detected.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
    ));
    j.row.check(drained, "not every task finished");
    // Heartbeats every lease/3 = 1 s on the store; RabbitMQ's every 5 s; the store's command
    // timeout bounds a PING. Two heartbeat periods of the slowest, plus the probe's own wait.
    j.row.check(
        detected.is_some_and(|d| d <= Duration::from_secs(5)),
        "the outage was not detected in time",
    );
    let row = j.row;
    w.cleanup().await;
    row
}

/// Scenario 8: SIGTERM under load: runs finish within the grace period, the rest go to another worker.
pub(super) async fn sigterm_drain(backend: Backend, root: &Path) -> Row {
    let settings = Settings {
        grace_secs: 3.0,
        concurrency: 4,
        ..Settings::default()
    };
    let mut w = World::new(backend, root, settings).await;
    let a = w.spawn_worker();
    w.spawn_worker();
    w.enqueue_work(40, |k| if k % 5 == 0 { 6000 } else { 800 })
        .await;
    let pid = w.workers[a].pid;
    let deadline = Instant::now() + Duration::from_secs(60);
    while events::read_all(&w.events_dir)
        .iter()
        .filter(|e| e.pid == pid && e.kind == "start")
        .count()
        < 4
    {
        assert!(Instant::now() < deadline, "worker A never got busy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let term_at = Instant::now();
    w.signal(a, "TERM");
    let exited = w.exited_within(a, Duration::from_secs(10)).await;
    let took = term_at.elapsed();
    let fault_end = now_ms();
    let drained = w.wait_written(DRAIN).await;
    let mut j = judge(
        &w,
        "8. SIGTERM drain under load",
        "SIGTERM".into(),
        false,
        Some(fault_end),
    );
    let cut: Vec<_> = {
        let starts: Vec<_> = j
            .events
            .iter()
            .filter(|e| e.pid == pid && e.kind == "start")
            .collect();
        starts
            .into_iter()
            .filter(|s| {
                !j.events
                    .iter()
                    .any(|e| e.kind == "done" && e.pid == pid && e.task_id == s.task_id)
            })
            .map(|s| s.task_id.clone())
            .collect()
    };
    j.row.notes.push(format!(
        "exited {:.1} s after SIGTERM (grace 3 s); {} run(s) cut at the grace and run elsewhere",
        took.as_secs_f64(),
        cut.len()
    ));
    j.row.check(
        exited && took < Duration::from_secs(6),
        "the drain outlived its grace period",
    );
    j.row.check(drained, "not every task finished");
    let row = j.row;
    w.cleanup().await;
    row
}

/// Scenario 9: A big backlog: the worker's memory stays bounded, in-flight within its limit.
pub(super) async fn backlog(backend: Backend, size: Size, root: &Path) -> Row {
    let settings = Settings {
        concurrency: 16,
        ..Settings::default()
    };
    let mut w = World::new(backend, root, settings).await;
    w.enqueue_work(size.backlog, |_| 0).await;
    let i = w.spawn_worker();
    let pid = w.workers[i].pid;
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut peak = 0.0f64;
    while w.written() < w.sent.len() && Instant::now() < deadline {
        peak = peak.max(ferriq_examples::peak_rss_mib(pid));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    peak = peak.max(ferriq_examples::peak_rss_mib(pid));
    let mut j = judge(&w, "9. backlog", "-".into(), false, None);
    let in_flight = events::max_in_flight(&j.events, &w.deaths);
    j.row.notes.push(format!(
        "worker peak RSS {peak:.1} MiB; at most {in_flight} runs at once (limit 16)"
    ));
    j.row
        .check(w.written() >= w.sent.len(), "not every task finished");
    j.row
        .check(in_flight <= 16, "more runs at once than the concurrency");
    j.row
        .check(peak < 256.0, "the worker's memory grew with the backlog");
    let row = j.row;
    w.cleanup().await;
    row
}

/// Scenario 10: A chord and a schedule while workers are SIGKILLed: every tick and the callback run
/// (and write) once.
pub(super) async fn chord_and_schedule(backend: Backend, root: &Path) -> Row {
    let settings = Settings {
        scheduler: true,
        ..Settings::default()
    };
    let mut w = World::new(backend, root, settings).await;
    for _ in 0..3 {
        w.spawn_worker();
    }
    let started = now_ms();
    let chord = w
        .client
        .enqueue_chord(ferriq::workflow::chord(
            ferriq::workflow::Group::new((0..200).map(|k| tasks::member::call(spread(k, 50, 300)))),
            tasks::callback::call(),
        ))
        .await
        .expect("the chord is sent");
    let callback_id = chord.callback().task_id().clone();
    let mut kills = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let live = w.live();
        let victim = live[rand::rng().random_range(0..live.len())];
        w.kill(victim).await;
        w.spawn_worker();
        kills += 1;
    }
    let fault_end = now_ms();
    w.sent.push(callback_id.clone());
    let drained = w.wait_written(DRAIN).await;
    // Every second from the schedule's first tick until a few seconds after the faults must
    // have its tick run (missed ones are caught up): waited for, bounded, not a fixed pause.
    let clock = TickClock::new(started);
    let required_until = (fault_end / 1000) as i64 + 3;
    let waiting_since = Instant::now();
    let deadline = waiting_since + Duration::from_secs(30);
    let mut missing = clock.missing(&events::read_all(&w.events_dir), required_until);
    while !missing.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        missing = clock.missing(&events::read_all(&w.events_dir), required_until);
    }
    let waited = waiting_since.elapsed();
    for i in w.live() {
        w.signal(i, "TERM");
    }
    for i in w.live() {
        w.exited_within(i, Duration::from_secs(10)).await;
    }
    let mut j = judge(
        &w,
        "10. chord (200 members) and a 1 s schedule under SIGKILL",
        format!("{kills} SIGKILL"),
        false,
        Some(fault_end),
    );
    let callbacks = events::count(&j.events, "callback");
    let callback_runs = callbacks.get(callback_id.as_str()).copied().unwrap_or(0);
    let ticks = events::count(&j.events, "tick");
    let tick_writes: usize = ticks
        .keys()
        .map(|id| j.writes.get(id).map_or(0, Vec::len))
        .filter(|n| *n > 0)
        .count();
    let first = clock.first(&j.events);
    j.row.notes.push(format!(
        "callback runs {callback_runs}, written {}; {} ticks run ({tick_writes} written), first {} s after the start, all run {:.1} s after the drain",
        j.writes.get(callback_id.as_str()).map_or(0, Vec::len),
        ticks.len(),
        first.map_or("never".to_owned(), |t| (t - (started / 1000) as i64).to_string()),
        waited.as_secs_f64(),
    ));
    j.row
        .check(drained, "the callback's result was not written");
    j.row.check(
        j.writes.get(callback_id.as_str()).map_or(0, Vec::len) == 1,
        "the callback's result was not written exactly once",
    );
    j.row.check(
        first.is_some_and(|t| t <= (started / 1000) as i64 + 5),
        "the schedule's first tick did not run within 5 s of the workers starting",
    );
    j.row.check(
        missing.is_empty(),
        format!("ticks were missed (seconds after the start: {missing:?})"),
    );
    let row = j.row;
    w.cleanup().await;
    row
}

/// Maps the tick schedule's task ids back to their seconds, for the run of scenario 10.
struct TickClock {
    started_s: i64,
    seconds: HashMap<String, i64>,
}

impl TickClock {
    /// Tick ids for every second from a little before `started_ms` to a few minutes after.
    fn new(started_ms: u64) -> TickClock {
        let spec = ferriq::schedule::static_schedules()
            .expect("the declared schedules are valid")
            .into_iter()
            .find(|s| s.id == tasks::tick::NAME)
            .expect("fault.tick is declared with a schedule");
        let started_s = (started_ms / 1000) as i64;
        let seconds = (started_s - 2..started_s + 300)
            .map(|t| (spec.tick_id(t).to_string(), t))
            .collect();
        TickClock { started_s, seconds }
    }

    /// The second of the earliest tick run.
    fn first(&self, events: &[events::Event]) -> Option<i64> {
        self.ran(events).into_iter().min()
    }

    fn ran(&self, events: &[events::Event]) -> HashSet<i64> {
        events
            .iter()
            .filter(|e| e.kind == "tick")
            .filter_map(|e| self.seconds.get(&e.task_id).copied())
            .collect()
    }

    /// Seconds (counted from the start) from the first tick run up to `until` (unix seconds)
    /// whose tick has not run; every second when none has.
    fn missing(&self, events: &[events::Event], until: i64) -> Vec<i64> {
        let ran = self.ran(events);
        let from = ran.iter().min().copied().unwrap_or(self.started_s);
        (from..=until)
            .filter(|t| !ran.contains(t))
            .map(|t| t - self.started_s)
            .collect()
    }
}
