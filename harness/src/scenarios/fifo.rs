//! SQS FIFO under SIGKILL: tasks in message groups, workers killed while they run; nothing is
//! lost, nothing written twice, and every group ran one task at a time, in the order sent.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use ferriq::wire::TaskId;
use rand::Rng;

use super::{spread, Size, DRAIN};
use crate::events::Event;
use crate::report::{judge, Row};
use crate::world::{now_ms, Backend, Settings, World};

/// Message groups the tasks are spread over.
const GROUPS: usize = 10;

/// Scenario: FIFO message groups while a random worker is SIGKILLed every second.
pub(super) async fn fifo_sigkill(backend: Backend, size: Size, root: &Path) -> Row {
    let settings = Settings {
        fifo: true,
        ..Settings::default()
    };
    let mut w = World::new(backend, root, settings).await;
    for _ in 0..3 {
        w.spawn_worker();
    }
    let places = w
        .enqueue_in_groups(size.flow / 2, GROUPS, |k| spread(k, 50, 200))
        .await;
    let mut kills = 0;
    while w.written() < w.sent.len() && kills < 15 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let live = w.live();
        let victim = live[rand::rng().random_range(0..live.len())];
        w.kill(victim).await;
        w.spawn_worker();
        kills += 1;
    }
    let fault_end = now_ms();
    let drained = w.wait_written(DRAIN).await;
    let mut j = judge(
        &w,
        "11. SQS FIFO groups, SIGKILL a random worker",
        format!("{kills} SIGKILL, {GROUPS} groups"),
        false,
        Some(fault_end),
    );
    if !drained {
        j.row.notes.push(w.sqs_counts().await);
    }
    let disorder = out_of_order(&j.events, &places, &w.deaths);
    j.row.notes.push(format!(
        "group order: {}",
        if disorder.is_empty() {
            "kept".to_owned()
        } else {
            disorder.len().to_string() + " break(s)"
        }
    ));
    j.row.check(drained, "not every task finished");
    j.row
        .check(kills > 0, "no worker was killed while tasks flowed");
    j.row.check(
        disorder.is_empty(),
        format!("group order broken: {}", disorder.join("; ")),
    );
    let row = j.row;
    w.cleanup().await;
    row
}

/// Every place where a group's runs broke order: a run that started before the run ahead of
/// it in the group ended (or its worker died), or a task started after a later one of its
/// group had started.
fn out_of_order(
    events: &[Event],
    places: &HashMap<TaskId, (usize, usize)>,
    deaths: &HashMap<u32, u64>,
) -> Vec<String> {
    let place = |e: &Event| {
        TaskId::parse(&e.task_id)
            .ok()
            .and_then(|id| places.get(&id).copied())
    };
    // When each run (task, attempt, process) ended: its `done`, else its process's death.
    let mut ended: HashMap<(&str, u32, u32), u64> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == "done") {
        ended.insert((&e.task_id, e.attempt, e.pid), e.at_ms);
    }
    let mut last: HashMap<usize, (usize, u64)> = HashMap::new();
    let mut breaks = Vec::new();
    for e in events.iter().filter(|e| e.kind == "start") {
        let Some((group, index)) = place(e) else {
            continue;
        };
        let end = ended
            .get(&(e.task_id.as_str(), e.attempt, e.pid))
            .copied()
            .or_else(|| deaths.get(&e.pid).copied())
            .unwrap_or(u64::MAX);
        if let Some((before, before_end)) = last.get(&group) {
            if index < *before {
                breaks.push(format!("g{group}: #{index} started after #{before}"));
            } else if e.at_ms < *before_end {
                breaks.push(format!("g{group}: #{index} started while #{before} ran"));
            }
        }
        last.insert(group, (index, end));
    }
    breaks
}
