//! The Dead letters page: a lane's dead letters, filtered, with redrive and purge.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State as Shared};
use axum::response::Html;
use std::time::Duration;

use ferriq::dead_letters::{DeadFilter, DeadMessage};
use serde::Deserialize;
use serde_json::Value;

use super::{enc, PAGE};
use crate::html::{age, csrf_field, cut, error_box, esc, page, table};
use crate::State;

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
