//! The pages, rendered whole on the server (they work without script); `app.js` then keeps
//! the overview and workers tables live and shows bulk jobs' progress.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State as Shared};
use axum::response::Html;
use ferriq::client::TaskStatus;
use ferriq::dead_letters::{DeadFilter, DeadMessage};
use ferriq::wire::TaskId;
use serde::Deserialize;
use serde_json::Value;

use crate::html::{age, csrf_field, cut, error_box, esc, page, table, time_ms};
use crate::{api, State};

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
    let names: Vec<String> = crate::charts::per_task(state, 24)
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

fn status_text(s: &TaskStatus) -> String {
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

/// The dead letters page's filters.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct DeadQuery {
    #[serde(default)]
    pub(crate) lane: String,
    #[serde(default)]
    pub(crate) reason: String,
    #[serde(default)]
    pub(crate) task: String,
    #[serde(default)]
    pub(crate) text: String,
    /// Parked at least this many minutes ago (text: a form sends an empty field).
    #[serde(default)]
    pub(crate) older_than_min: String,
    #[serde(default)]
    pub(crate) offset: String,
}

impl DeadQuery {
    /// Minutes, when a positive number was given.
    fn older_than(&self) -> Option<u64> {
        self.older_than_min.trim().parse().ok().filter(|m| *m > 0)
    }

    /// Where the page starts, at most [`MAX_OFFSET`] (each page reads the queue up to it).
    fn offset(&self) -> usize {
        self.offset
            .trim()
            .parse::<usize>()
            .unwrap_or(0)
            .min(MAX_OFFSET)
    }

    /// The filter these fields describe.
    pub(crate) fn filter(&self) -> DeadFilter {
        let mut f = DeadFilter::all();
        if !self.reason.trim().is_empty() {
            f = f.reason(self.reason.trim());
        }
        if !self.task.trim().is_empty() {
            f = f.task_name(self.task.trim());
        }
        if !self.text.trim().is_empty() {
            f = f.detail_contains(self.text.trim());
        }
        if let Some(m) = self.older_than() {
            // Saturating: an absurd age matches nothing rather than wrapping to a small one.
            f = f.older_than(Duration::from_secs(m.saturating_mul(60)));
        }
        f
    }
}

/// A dead letter's arguments as text (its body is user data: shown escaped, cut).
fn arguments(m: &DeadMessage) -> String {
    match serde_json::from_slice::<Value>(&m.body) {
        Ok(v) if v.is_object() => {
            let args = v.get("args").cloned().unwrap_or(Value::Null);
            let kwargs = v.get("kwargs").cloned().unwrap_or(Value::Null);
            let mut s = args.to_string();
            if kwargs.as_object().is_some_and(|k| !k.is_empty()) {
                s.push(' ');
                s.push_str(&kwargs.to_string());
            }
            cut(&s, 300)
        }
        _ => format!("(unreadable body, {} bytes)", m.body.len()),
    }
}

const PAGE: usize = 50;

/// The furthest page start: listing reads a lane's dead letters up to the page shown.
const MAX_OFFSET: usize = 10_000;

/// Dead letters: filtered, with redrive and purge.
pub(crate) async fn dead_letters(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<DeadQuery>,
) -> Html<String> {
    let ops = state.client.ops();
    let lanes: Vec<String> = match ops.queues().await {
        Ok(l) => l.into_iter().map(|q| q.name).collect(),
        Err(e) => return page(&state, "Dead letters", "/dead", &error_box(&e.to_string())),
    };
    let lane = if q.lane.is_empty() {
        lanes.first().cloned().unwrap_or_default()
    } else {
        q.lane.clone()
    };
    let mut body = String::from("<form method=\"get\" class=\"filters\" id=\"filters\">");
    let _ = write!(body, "<label>Lane <select name=\"lane\">");
    for l in &lanes {
        let sel = if *l == lane { " selected" } else { "" };
        let _ = write!(body, "<option{sel}>{}</option>", esc(l));
    }
    let _ = write!(
        body,
        "</select></label>\
         <label>Reason <input name=\"reason\" value=\"{}\" list=\"reasons\" size=\"16\"></label>\
         <datalist id=\"reasons\"><option>retries_exhausted</option><option>expired</option>\
         <option>unknown_task</option><option>undecodable</option><option>too_large</option>\
         <option>takeovers_exhausted</option><option>non_retryable</option></datalist>\
         <label>Task <input name=\"task\" value=\"{}\" size=\"16\"></label>\
         <label>Error text <input name=\"text\" value=\"{}\" size=\"16\"></label>\
         <label>Older than (min) <input name=\"older_than_min\" type=\"number\" min=\"0\" value=\"{}\" size=\"5\"></label>\
         <button>Filter</button></form>",
        esc(&q.reason),
        esc(&q.task),
        esc(&q.text),
        q.older_than().map_or(String::new(), |m| m.to_string())
    );
    let filter = q.filter();
    let offset = q.offset();
    let listed = ops
        .dead_letters_matching(&lane, &filter, offset, PAGE + 1)
        .await;
    let mut found = match listed {
        Ok(found) => found,
        Err(e) => {
            body.push_str(&error_box(&e.to_string()));
            return page(&state, "Dead letters", "/dead", &body);
        }
    };
    let more = found.len() > PAGE;
    found.truncate(PAGE);
    let now = state.client.clock().now_unix_ms();
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|m| {
            let id_cell = if state.actions {
                format!(
                    "<input type=\"checkbox\" name=\"id\" value=\"{}\" form=\"act\" aria-label=\"select\">",
                    esc(&m.id)
                )
            } else {
                String::new()
            };
            let task_link = m.task_id.as_ref().map_or("-".to_owned(), |id| {
                format!(
                    "<a href=\"{}/tasks?id={}\">{}</a>",
                    esc(&state.base),
                    esc(&enc(id.as_str())),
                    esc(&cut(id.as_str(), 12))
                )
            });
            vec![
                id_cell,
                esc(m.task_name.as_deref().unwrap_or("-")),
                task_link,
                esc(m.reason.as_deref().unwrap_or("-")),
                m.attempts.to_string(),
                m.dead_at_ms.map_or("-".into(), |t| age(now, t)),
                format!("<code class=\"args\">{}</code>", esc(&arguments(m))),
                format!("<span class=\"detail\">{}</span>", esc(&cut(&m.detail, 300))),
            ]
        })
        .collect();
    body.push_str(&table(
        "dead",
        &[
            "",
            "task",
            "id",
            "reason",
            "attempts",
            "age",
            "arguments",
            "error",
        ],
        &rows,
        "no dead letter matches",
    ));
    let here = format!(
        "lane={}&reason={}&task={}&text={}&older_than_min={}",
        enc(&lane),
        enc(&q.reason),
        enc(&q.task),
        enc(&q.text),
        q.older_than().unwrap_or(0)
    );
    body.push_str("<p class=\"pager\">");
    if offset > 0 {
        let _ = write!(
            body,
            "<a href=\"?{}&amp;offset={}\">← older</a> ",
            esc(&here),
            offset.saturating_sub(PAGE)
        );
    }
    let _ = write!(
        body,
        "{}–{}",
        if found.is_empty() { 0 } else { offset + 1 },
        offset + found.len()
    );
    if more {
        let _ = write!(
            body,
            " <a href=\"?{}&amp;offset={}\">newer →</a>",
            esc(&here),
            offset + PAGE
        );
    }
    body.push_str("</p>");
    if state.actions {
        let _ = write!(
            body,
            "<form method=\"post\" id=\"act\" class=\"actions\">{csrf}\
             <input type=\"hidden\" name=\"lane\" value=\"{lane}\">\
             <input type=\"hidden\" name=\"reason\" value=\"{reason}\">\
             <input type=\"hidden\" name=\"task\" value=\"{task}\">\
             <input type=\"hidden\" name=\"text\" value=\"{text}\">\
             <input type=\"hidden\" name=\"older_than_min\" value=\"{older}\">\
             <button name=\"scope\" value=\"selected\" formaction=\"{base}/dead/redrive\" id=\"redrive-selected\">Redrive selected</button>\
             <button name=\"scope\" value=\"selected\" formaction=\"{base}/dead/purge\" data-confirm=\"Purge the selected dead letters? They are gone for good.\">Purge selected</button>\
             <button name=\"scope\" value=\"filter\" formaction=\"{base}/dead/redrive\" data-confirm=\"Redrive every dead letter this filter matches?\">Redrive all matching</button>\
             <button name=\"scope\" value=\"filter\" formaction=\"{base}/dead/purge\" data-confirm=\"Purge every dead letter this filter matches? They are gone for good.\">Purge all matching</button>\
             </form>",
            csrf = csrf_field(&state),
            lane = esc(&lane),
            reason = esc(&q.reason),
            task = esc(&q.task),
            text = esc(&q.text),
            older = q.older_than().unwrap_or(0),
            base = esc(&state.base),
        );
    }
    body.push_str("<section id=\"jobs\" data-live=\"jobs\"></section>");
    page(&state, "Dead letters", "/dead", &body)
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
