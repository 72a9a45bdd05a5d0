//! `ferriq queues` and `ferriq workers`.

use crate::output::outln;
use std::time::Duration;

use ferriq::Client;
use serde_json::{json, Value};

use crate::output::{age, now_ms, short, timestamp, Output};
use crate::Failure;

fn or_dash(n: Option<u64>) -> String {
    n.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

/// Each lane's depth, dead letters, consumers and runs.
pub(crate) async fn queues(client: &Client, out: &Output) -> Result<(), Failure> {
    let queues = client.ops().queues().await?;
    if out.json {
        let all: Vec<Value> = queues
            .iter()
            .map(|q| {
                json!({
                    "name": q.name,
                    "ready": q.depth.ready,
                    "in_flight": q.depth.in_flight,
                    "delayed": q.depth.delayed,
                    "dead_lettered": q.dead_lettered,
                    "consumers": q.consumers,
                    "running": q.running,
                })
            })
            .collect();
        out.json(&Value::Array(all));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.name.clone(),
                q.depth.ready.to_string(),
                q.depth.in_flight.to_string(),
                q.depth.delayed.to_string(),
                or_dash(q.dead_lettered),
                or_dash(q.consumers),
                q.running.to_string(),
            ]
        })
        .collect();
    out.table(
        &[
            "QUEUE",
            "READY",
            "IN FLIGHT",
            "DELAYED",
            "DEAD",
            "CONSUMERS",
            "RUNNING",
        ],
        &rows,
    );
    Ok(())
}

/// Live workers and their runs.
pub(crate) async fn workers(client: &Client, out: &Output) -> Result<(), Failure> {
    let workers = client.ops().workers().await?;
    if out.json {
        out.json(&serde_json::to_value(&workers).unwrap_or(Value::Null));
        return Ok(());
    }
    if workers.is_empty() {
        outln!("no live workers");
        return Ok(());
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            vec![
                w.id.clone(),
                w.host.clone(),
                w.pid.to_string(),
                w.version.clone(),
                w.lanes.join(","),
                format!("{}/{}", w.runs.len(), w.concurrency),
                timestamp(w.started_at_ms),
                age(Duration::from_millis(now.saturating_sub(w.seen_at_ms))),
            ]
        })
        .collect();
    out.table(
        &[
            "WORKER", "HOST", "PID", "VERSION", "QUEUES", "RUNS", "STARTED", "SEEN",
        ],
        &rows,
    );
    let runs: Vec<Vec<String>> = workers
        .iter()
        .flat_map(|w| {
            w.runs.iter().map(move |r| {
                vec![
                    w.id.clone(),
                    r.task_id.to_string(),
                    short(&r.task_name, 40),
                    r.attempt.to_string(),
                    r.lane.clone(),
                    age(Duration::from_millis(now.saturating_sub(r.started_at_ms))),
                ]
            })
        })
        .collect();
    if !runs.is_empty() {
        outln!();
        out.table(
            &[
                "WORKER",
                "TASK ID",
                "TASK",
                "ATTEMPT",
                "QUEUE",
                "RUNNING FOR",
            ],
            &runs,
        );
    }
    Ok(())
}

/// Deletes a lane's queues (RabbitMQ), after asking.
pub(crate) async fn delete_lane(
    client: &Client,
    cli: &crate::args::Cli,
    lane: &str,
    force: bool,
) -> Result<(), Failure> {
    let what = if force {
        format!("delete lane {lane:?} and every message in its queues?")
    } else {
        format!("delete lane {lane:?} (its queue, dead-letter queue and delay tiers)?")
    };
    crate::output::confirm(&what, cli.yes)?;
    match client.broker().delete_lane(lane, force).await {
        Ok(messages) => {
            outln!("deleted lane {lane} ({messages} message(s) with it)");
            Ok(())
        }
        Err(ferriq::broker::BrokerError::NotFound(why)) => Err(Failure::NotFound(why)),
        Err(e) => Err(Failure::Failed(e.to_string())),
    }
}
