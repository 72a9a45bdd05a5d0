//! The pages, rendered whole on the server (they work without script); `app.js` then keeps
//! the overview and workers tables live and shows bulk jobs' progress. One file per page
//! that needs more than a screen: `tasks.rs`, `dead.rs`.

mod dead;
mod tasks;

pub(crate) use dead::{dead_letters, DeadQuery};
pub(crate) use tasks::{status_text, task};

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State as Shared};
use axum::response::Html;
use serde_json::Value;

use crate::html::{csrf_field, cut, error_box, esc, page, table, time_ms};
use crate::{api, State};

/// Rows per page of a list.
const PAGE: usize = 50;

/// A number cell, `-` when unknown.
fn num(v: &Value) -> String {
    v.as_u64().map_or("-".to_owned(), |n| n.to_string())
}

/// Overview: the lanes, then the last hours from the store's history.
pub(crate) async fn overview(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<crate::charts::ChartQuery>,
) -> Html<String> {
    let body = match api::overview_rows(&state).await {
        Ok(rows) => {
            let cells: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    let lane = r["lane"].as_str().unwrap_or("");
                    vec![
                        format!(
                            "<a href=\"{}/dead?lane={}\">{}</a>",
                            esc(&state.base),
                            esc(&enc(lane)),
                            esc(lane)
                        ),
                        num(&r["ready"]),
                        num(&r["in_flight"]),
                        num(&r["delayed"]),
                        num(&r["dead"]),
                        num(&r["consumers"]),
                        num(&r["running"]),
                    ]
                })
                .collect();
            table(
                "lanes",
                &[
                    "lane",
                    "ready",
                    "in flight",
                    "delayed",
                    "dead",
                    "consumers",
                    "running",
                ],
                &cells,
                "no lanes",
            )
        }
        Err(e) => error_box(&e.to_string()),
    };
    let history = history_section(&state, &q).await;
    page(
        &state,
        "Overview",
        "/",
        &format!(
            "<p class=\"live\" data-live=\"overview\">live: updated every 2 s</p>{body}{history}"
        ),
    )
}

/// The last hours: runs and run times as charts, and per task the sums.
async fn history_section(state: &State, q: &crate::charts::ChartQuery) -> String {
    let hours = crate::charts::hours(q.hours);
    let base = esc(&state.base);
    let task = q.task.as_deref().filter(|t| !t.is_empty());
    let task_q = task.map_or(String::new(), |t| format!("&task={}", enc(t)));
    let mut out = format!("<h2>Last {hours} h</h2><p class=\"choices\">");
    for h in [1, 6, 24] {
        let current = if h == hours {
            " aria-current=\"true\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<a href=\"{base}/?hours={h}{}\"{current}>{h} h</a> ",
            esc(&task_q)
        );
    }
    if let Some(t) = task {
        let _ = write!(
            out,
            "· run times of <strong>{}</strong> (<a href=\"{base}/?hours={hours}\">every task</a>)",
            esc(t)
        );
    }
    out.push_str("</p>");
    let _ = write!(
        out,
        "<div class=\"charts\" data-live=\"charts\">\
         <figure><img src=\"{base}/charts/runs.svg?hours={hours}\" alt=\"Runs per interval: succeeded and failed\"><figcaption>runs: succeeded, failed</figcaption></figure>\
         <figure><img src=\"{base}/charts/durations.svg?hours={hours}{}\" alt=\"Run time p50 and p95\"><figcaption>run time: p50, p95</figcaption></figure></div>",
        esc(&task_q)
    );
    match crate::charts::per_task(state, hours).await {
        Ok(tasks) => {
            let rows: Vec<Vec<String>> = tasks
                .iter()
                .map(|t| {
                    vec![
                        format!(
                            "<a href=\"{base}/?hours={hours}&task={}\">{}</a>",
                            esc(&enc(&t.task)),
                            esc(&t.task)
                        ),
                        t.runs().to_string(),
                        t.succeeded.to_string(),
                        t.failed.to_string(),
                        seconds(t.quantile(0.5)),
                        seconds(t.quantile(0.95)),
                    ]
                })
                .collect();
            out.push_str(&table(
                "history",
                &["task", "runs", "succeeded", "failed", "p50 ≤", "p95 ≤"],
                &rows,
                "nothing ran in this window (or workers run with FERRIQ_HISTORY=0)",
            ));
        }
        Err(e) => out.push_str(&error_box(&format!("history unavailable: {e}"))),
    }
    out
}

/// A run-time bucket bound as text.
pub(crate) fn seconds(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v.is_infinite() => "> 300 s".into(),
        Some(v) if v < 1.0 => format!("{} ms", (v * 1000.0).round()),
        Some(v) => format!("{v} s"),
    }
}

/// Workers: who runs what.
pub(crate) async fn workers(Shared(state): Shared<Arc<State>>) -> Html<String> {
    let body = match api::worker_rows(&state).await {
        Ok(rows) => {
            let cells: Vec<Vec<String>> = rows.iter().map(worker_cells).collect();
            let mut runs: Vec<Vec<String>> = Vec::new();
            for w in &rows {
                for r in w["runs"].as_array().into_iter().flatten() {
                    let id = r["task_id"].as_str().unwrap_or("");
                    runs.push(vec![
                        esc(w["id"].as_str().unwrap_or("")),
                        esc(r["task"].as_str().unwrap_or("")),
                        format!(
                            "<a href=\"{}/tasks?id={}\">{}</a>",
                            esc(&state.base),
                            esc(&enc(id)),
                            esc(&cut(id, 12))
                        ),
                        esc(r["lane"].as_str().unwrap_or("")),
                        r["attempt"].to_string(),
                        format!("{} s", r["age_s"]),
                    ]);
                }
            }
            // Longest running first: what an on-call engineer looks for.
            runs.sort_by_key(|r| {
                std::cmp::Reverse(r[5].trim_end_matches(" s").parse::<u64>().unwrap_or(0))
            });
            format!(
                "{}<h2>Runs in flight</h2>{}",
                table(
                    "workers",
                    &[
                        "worker",
                        "host",
                        "version",
                        "lanes",
                        "runs",
                        "oldest run",
                        "last heartbeat",
                    ],
                    &cells,
                    "no worker has reported within its lease",
                ),
                table(
                    "runs",
                    &["worker", "task", "id", "lane", "attempt", "running for"],
                    &runs,
                    "nothing runs now",
                )
            )
        }
        Err(e) => error_box(&e.to_string()),
    };
    page(
        &state,
        "Workers",
        "/workers",
        &format!("<p class=\"live\" data-live=\"workers\">live: updated every 2 s</p>{body}"),
    )
}

/// A worker's row (the script renders the same from `/api/workers`).
fn worker_cells(w: &Value) -> Vec<String> {
    let runs = w["runs"].as_array().map_or(0, Vec::len);
    let oldest = w["runs"]
        .as_array()
        .and_then(|r| r.iter().filter_map(|r| r["age_s"].as_u64()).max())
        .map_or("-".to_owned(), |s| format!("{s} s"));
    let lanes: Vec<&str> = w["lanes"]
        .as_array()
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    vec![
        esc(w["id"].as_str().unwrap_or("")),
        esc(&format!(
            "{} (pid {})",
            w["host"].as_str().unwrap_or(""),
            w["pid"]
        )),
        esc(w["version"].as_str().unwrap_or("")),
        esc(&lanes.join(", ")),
        format!("{runs} / {}", w["concurrency"]),
        oldest,
        format!("{:.1} s ago", w["seen_s"].as_f64().unwrap_or(0.0)),
    ]
}

/// Percent-encodes a query value.
pub(crate) fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Schedules: next and last tick, pause, resume, remove, run now.
pub(crate) async fn schedules(Shared(state): Shared<Arc<State>>) -> Html<String> {
    let listed = match state.client.schedules().list().await {
        Ok(l) => l,
        Err(e) => {
            return page(
                &state,
                "Schedules",
                "/schedules",
                &error_box(&e.to_string()),
            )
        }
    };
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|s| {
            let timing = serde_json::to_value(&s.spec.timing)
                .map(|v| v.to_string())
                .unwrap_or_default();
            let mut cells = vec![
                esc(&s.spec.id),
                esc(&s.spec.task),
                format!("<code>{}</code>", esc(&timing)),
                s.next_run
                    .map_or("-".into(), |t| esc(&time_ms((t.max(0) as u64).saturating_mul(1000)))),
                s.last_tick
                    .map_or("-".into(), |t| esc(&time_ms((t.max(0) as u64).saturating_mul(1000)))),
                s.last_status
                    .as_ref()
                    .map_or("-".into(), |st| esc(&status_text(st))),
                if s.paused { "paused" } else { "active" }.into(),
            ];
            if state.actions {
                let button = |action: &str, label: &str, confirm: Option<&str>| {
                    format!(
                        "<button name=\"action\" value=\"{action}\"{}>{label}</button>",
                        confirm.map_or(String::new(), |c| format!(" data-confirm=\"{}\"", esc(c)))
                    )
                };
                let toggle = if s.paused {
                    button("resume", "Resume", None)
                } else {
                    button("pause", "Pause", None)
                };
                cells.push(format!(
                    "<form method=\"post\" action=\"{}/schedules/action\" class=\"inline\">{}\
                     <input type=\"hidden\" name=\"id\" value=\"{}\">{toggle}{}{}</form>",
                    esc(&state.base),
                    csrf_field(&state),
                    esc(&s.spec.id),
                    button("run", "Run now", None),
                    button(
                        "remove",
                        "Remove",
                        Some("Remove this schedule? A declared one comes back when its workers restart.")
                    ),
                ));
            }
            cells
        })
        .collect();
    let mut headers = vec![
        "schedule",
        "task",
        "timing",
        "next tick",
        "last tick",
        "last run",
        "state",
    ];
    if state.actions {
        headers.push("");
    }
    let body = table("schedules", &headers, &rows, "no schedules");
    page(&state, "Schedules", "/schedules", &body)
}

/// Limits: every limiter in use, with its limit and usage.
pub(crate) async fn limits(Shared(state): Shared<Arc<State>>) -> Html<String> {
    let listed = match state.client.limits().list().await {
        Ok(l) => l,
        Err(e) => return page(&state, "Limits", "/limits", &error_box(&e.to_string())),
    };
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|l| {
            vec![
                esc(&l.task),
                esc(l.key.as_deref().unwrap_or("-")),
                esc(&format!("{:?}", l.kind).to_lowercase()),
                esc(&l.limit),
                if l.overridden {
                    "set at run time"
                } else {
                    "declared"
                }
                .into(),
                l.used.to_string(),
                l.waiting.to_string(),
            ]
        })
        .collect();
    let body = table(
        "limits",
        &["task", "key", "kind", "limit", "from", "in use", "waiting"],
        &rows,
        "no limiter used recently",
    );
    page(
        &state,
        "Limits",
        "/limits",
        &format!("<p>Change a limit with <code>ferriq limits set</code>.</p>{body}"),
    )
}

/// The login form (only when a token is required).
pub(crate) async fn login(Shared(state): Shared<Arc<State>>) -> Html<String> {
    let body = format!(
        "<form method=\"post\" action=\"{}/login\" class=\"login\">{}<label>Token \
         <input name=\"token\" type=\"password\" autocomplete=\"current-password\" autofocus></label>\
         <button>Open</button></form>",
        esc(&state.base),
        csrf_field(&state)
    );
    page(&state, "Log in", "", &body)
}
