//! The Tasks page: one task by id, and finished tasks searched by name, outcome and window.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State as Shared};
use axum::response::Html;
use ferriq::client::TaskStatus;
use ferriq::dead_letters::DeadFilter;
use ferriq::store::DeadEntry;
use ferriq::wire::TaskId;
use serde::Deserialize;

use super::{enc, PAGE};
use crate::html::{cut, error_box, esc, page, table, time_ms};
use crate::State;

/// `?id=`, or a search: `?name=&outcome=&hours=`.
#[derive(Debug, Deserialize)]
pub(crate) struct TaskQuery {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    /// `any`, `succeeded`, `failed`.
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    hours: String,
}

/// Finished tasks of one name, outcome and window, newest first (the store's index).
async fn search(state: &State, q: &TaskQuery) -> String {
    let hours = crate::charts::hours(q.hours.trim().parse().ok());
    // Names that ran in the overview's default window (its read is shared, see `charts::history`).
    let names: Vec<String> = crate::charts::per_task(state, 6)
        .await
        .map(|t| t.into_iter().map(|t| t.task).collect())
        .unwrap_or_default();
    let mut out = String::from(
        "<h2>Finished tasks</h2><form method=\"get\" class=\"filters\" id=\"search\">\
         <label>Task <input name=\"name\" list=\"task-names\" size=\"24\" value=\"",
    );
    let _ = write!(
        out,
        "{}\"></label><datalist id=\"task-names\">",
        esc(&q.name)
    );
    for n in &names {
        let _ = write!(out, "<option>{}</option>", esc(n));
    }
    out.push_str("</datalist><label>Outcome <select name=\"outcome\">");
    for o in ["any", "succeeded", "failed"] {
        let sel = if q.outcome == o { " selected" } else { "" };
        let _ = write!(out, "<option{sel}>{o}</option>");
    }
    out.push_str("</select></label><label>Within <select name=\"hours\">");
    for h in [1u64, 6, 24] {
        let sel = if h == hours { " selected" } else { "" };
        let _ = write!(out, "<option value=\"{h}\"{sel}>last {h} h</option>");
    }
    out.push_str("</select></label><button>Search</button></form>");
    let name = q.name.trim();
    if name.is_empty() {
        return out;
    }
    let failed = match q.outcome.as_str() {
        "succeeded" => Some(false),
        "failed" => Some(true),
        _ => None,
    };
    let now = state.client.clock().now_unix_ms();
    let from = now.saturating_sub(hours * 3_600_000);
    match state
        .client
        .store()
        .finished(name, failed, from, now, PAGE)
        .await
    {
        Ok(found) => {
            let rows: Vec<Vec<String>> = found
                .iter()
                .map(|f| {
                    vec![
                        format!(
                            "<a href=\"{}/tasks?id={}\">{}</a>",
                            esc(&state.base),
                            esc(&enc(f.task_id.as_str())),
                            esc(f.task_id.as_str())
                        ),
                        esc(&f.task),
                        if f.failed { "failed" } else { "succeeded" }.into(),
                        esc(&time_ms(f.at_ms)),
                    ]
                })
                .collect();
            out.push_str(&table(
                "found",
                &["id", "task", "outcome", "finished"],
                &rows,
                "none in this window (workers with FERRIQ_HISTORY=0 index nothing)",
            ));
            if found.len() == PAGE {
                let _ = write!(out, "<p class=\"pager\">the newest {PAGE} shown</p>");
            }
        }
        Err(e) => out.push_str(&error_box(&format!("search unavailable: {e}"))),
    }
    out
}

pub(crate) fn status_text(s: &TaskStatus) -> String {
    match s {
        TaskStatus::Pending => "pending (queued, or waiting for a retry)".into(),
        TaskStatus::Started { worker, .. } => format!("running on {worker}"),
        TaskStatus::Succeeded => "succeeded".into(),
        TaskStatus::Failed(f) => format!("failed: {} {}", f.exc_type, f.message),
        TaskStatus::Expired(f) => format!("expired: {}", f.message),
        TaskStatus::FinishedWithoutResult => "finished (no result stored)".into(),
        _ => format!("{s:?}"),
    }
}

/// The group or chain a finished task belongs to, as its result's labels name it, with the
/// group's count or the chain's length (escaped HTML).
async fn workflow(state: &State, labels: &ferriq::wire::Labels) -> Option<String> {
    let store = state.client.store();
    if let Some((group, index)) = labels.group_member() {
        let count = match store.group(&group).await {
            Ok(Some(g)) => format!(
                ": {} of {} finished, {} failed{}",
                g.mark.done,
                g.mark.size,
                g.mark.failed,
                if g.mark.settled { ", completed" } else { "" }
            ),
            Ok(None) => ": its record has expired".into(),
            Err(e) => format!(": unavailable ({e})"),
        };
        return Some(esc(&format!(
            "member {index} of group {}{count}",
            group.as_str()
        )));
    }
    let (chain, step) = labels.chain_step()?;
    let length = match store.chain(&chain).await {
        Ok(Some(c)) => format!(" ({} steps after the first)", c.steps.len()),
        _ => String::new(),
    };
    Some(esc(&format!(
        "step {step} of chain {}{length}",
        chain.as_str()
    )))
}

/// The lane and index entry of `id` when it is parked (its arguments are kept there).
async fn parked(state: &State, id: &TaskId) -> Option<(String, DeadEntry)> {
    let ops = state.client.ops();
    let filter = DeadFilter::all().task_id(id.clone());
    for lane in ops.queues().await.ok()? {
        let page = ops.dead_index(&lane.name, &filter, 0, 1).await.ok()??;
        if let Some(e) = page.entries.into_iter().next() {
            return Some((lane.name, e));
        }
    }
    None
}

/// Tasks: one looked up by id.
pub(crate) async fn task(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<TaskQuery>,
) -> Html<String> {
    let id = q.id.trim();
    let mut body = format!(
        "<form method=\"get\" class=\"filters\" id=\"lookup\"><label>Task id <input name=\"id\" value=\"{}\" \
         size=\"40\"></label><button>Look up</button></form>",
        esc(id)
    );
    if !id.is_empty() {
        match TaskId::parse(id) {
            Err(e) => body.push_str(&error_box(&format!("not a task id: {e}"))),
            Ok(id) => match state.client.ops().task(&id).await {
                Err(e) => body.push_str(&error_box(&e.to_string())),
                Ok(info) => {
                    let mut rows = vec![
                        ("status", esc(&status_text(&info.status))),
                        ("id", esc(info.id.as_str())),
                    ];
                    if let Some(c) = &info.claim {
                        rows.push(("claim holder", esc(&c.holder)));
                        rows.push((
                            "attempts",
                            format!(
                                "{} started, {} failed, {} taken over",
                                c.starts, c.failures, c.takeovers
                            ),
                        ));
                        if let Some(t) = c.started_at_ms {
                            rows.push(("started", esc(&time_ms(t))));
                        }
                    }
                    if let Some(p) = &info.progress {
                        rows.push(("progress", format!("<code>{}</code>", esc(&p.to_string()))));
                    }
                    if let Some(r) = &info.result {
                        let what = if r.is_err { "error" } else { "result" };
                        rows.push((
                            what,
                            format!(
                                "<pre>{}</pre>",
                                esc(&serde_json::to_string_pretty(&r.return_value)
                                    .unwrap_or_default())
                            ),
                        ));
                        rows.push(("run time", format!("{:.3} s", r.execution_time)));
                        if let Some(w) = workflow(&state, &r.labels).await {
                            rows.push(("workflow", w));
                        }
                        if !r.labels.is_empty() {
                            let labels =
                                serde_json::Value::Object(r.labels.to_json_map()).to_string();
                            rows.push((
                                "labels",
                                format!("<code>{}</code>", esc(&cut(&labels, 1000))),
                            ));
                        }
                    }
                    if let Some((lane, e)) = parked(&state, &id).await {
                        rows.push((
                            "dead letter",
                            format!(
                                "parked in <a href=\"{}/dead?lane={}&amp;task={}\">{}</a>, {}",
                                esc(&state.base),
                                esc(&enc(&lane)),
                                esc(&enc(e.task_name.as_deref().unwrap_or(""))),
                                esc(&lane),
                                esc(e.reason.as_deref().unwrap_or("no reason given"))
                            ),
                        ));
                        rows.push((
                            "arguments",
                            format!("<code class=\"args\">{}</code>", esc(&e.arguments)),
                        ));
                    }
                    body.push_str("<dl class=\"task\">");
                    for (k, v) in rows {
                        let _ = write!(body, "<dt>{k}</dt><dd>{v}</dd>");
                    }
                    body.push_str("</dl>");
                }
            },
        }
    }
    body.push_str(&search(&state, &q).await);
    page(&state, "Tasks", "/tasks", &body)
}
