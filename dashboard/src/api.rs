//! The JSON the pages poll every 2 s to stay live (the same data the pages render first).

use std::sync::Arc;

use axum::extract::State as Shared;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde_json::{json, Value};

use crate::State;

/// A failure as JSON (the page shows it in place).
fn failed(what: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(json!({ "error": what.to_string() })),
    )
        .into_response()
}

/// The lanes, as [`overview_rows`] computes them.
pub(crate) async fn overview(Shared(state): Shared<Arc<State>>) -> Response {
    match overview_rows(&state).await {
        Ok(rows) => Json(json!({ "lanes": rows })).into_response(),
        Err(e) => failed(e),
    }
}

/// Per lane: ready, in flight, delayed, dead, consumers, running.
pub(crate) async fn overview_rows(state: &State) -> Result<Vec<Value>, ferriq::ops::OpsError> {
    let lanes = state.client.ops().queues().await?;
    Ok(lanes
        .into_iter()
        .map(|q| {
            json!({
                "lane": q.name,
                "ready": q.depth.ready,
                "in_flight": q.depth.in_flight,
                "delayed": q.depth.delayed,
                "dead": q.dead_lettered,
                "consumers": q.consumers,
                "running": q.running,
            })
        })
        .collect())
}

/// The workers, as [`worker_rows`] computes them.
pub(crate) async fn workers(Shared(state): Shared<Arc<State>>) -> Response {
    match worker_rows(&state).await {
        Ok(rows) => Json(json!({ "workers": rows })).into_response(),
        Err(e) => failed(e),
    }
}

/// Per worker: id, host, pid, version, lanes, concurrency, runs with their age (s), seen (s ago).
pub(crate) async fn worker_rows(state: &State) -> Result<Vec<Value>, ferriq::store::StoreError> {
    let now = state.client.clock().now_unix_ms();
    let workers = state.client.ops().workers().await?;
    Ok(workers
        .into_iter()
        .map(|w| {
            let runs: Vec<Value> = w
                .runs
                .iter()
                .map(|r| {
                    json!({
                        "task_id": r.task_id.as_str(),
                        "task": r.task_name,
                        "lane": r.lane,
                        "attempt": r.attempt,
                        "age_s": now.saturating_sub(r.started_at_ms) / 1000,
                    })
                })
                .collect();
            json!({
                "id": w.id,
                "host": w.host,
                "pid": w.pid,
                "version": w.version,
                "lanes": w.lanes,
                "concurrency": w.concurrency,
                "runs": runs,
                "seen_s": now.saturating_sub(w.seen_at_ms) as f64 / 1000.0,
                "up_s": now.saturating_sub(w.started_at_ms) / 1000,
            })
        })
        .collect())
}

/// Per task over the last `hours` (1–24, default 6): runs, successes, failures, p50 and p95.
pub(crate) async fn history(
    Shared(state): Shared<Arc<State>>,
    axum::extract::Query(q): axum::extract::Query<crate::charts::ChartQuery>,
) -> Response {
    let hours = crate::charts::hours(q.hours);
    match crate::charts::per_task(&state, hours).await {
        Ok(tasks) => {
            let rows: Vec<Value> = tasks
                .iter()
                .map(|t| {
                    json!({
                        "task": t.task,
                        "runs": t.runs(),
                        "succeeded": t.succeeded,
                        "failed": t.failed,
                        "p50": crate::pages::seconds(t.quantile(0.5)),
                        "p95": crate::pages::seconds(t.quantile(0.95)),
                    })
                })
                .collect();
            Json(json!({ "hours": hours, "tasks": rows })).into_response()
        }
        Err(e) => failed(e),
    }
}

/// The bulk jobs and their progress (this process's, and those the store recorded).
pub(crate) async fn jobs(Shared(state): Shared<Arc<State>>) -> Response {
    Json(json!({ "jobs": state.jobs.list(&state.client).await })).into_response()
}
