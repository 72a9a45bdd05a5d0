//! The Dead letters page: a lane's dead letters, filtered, with redrive and purge.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State as Shared};
use axum::response::Html;
use std::time::Duration;

use ferriq::dead_letters::{DeadFilter, DeadMessage};
use ferriq::store::DeadEntry;
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
    /// `queue`: list from the broker's queue rather than the store's index.
    #[serde(default)]
    pub(crate) source: String,
}

impl DeadQuery {
    /// Minutes, when a positive number was given.
    fn older_than(&self) -> Option<u64> {
        self.older_than_min.trim().parse().ok().filter(|m| *m > 0)
    }

    /// Where the page starts; at most [`MAX_OFFSET`] when listing from the queue (each page
    /// reads the queue up to it).
    fn offset(&self, from_queue: bool) -> usize {
        let offset = self.offset.trim().parse::<usize>().unwrap_or(0);
        if from_queue {
            offset.min(MAX_OFFSET)
        } else {
            offset
        }
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

/// One row of the table, from the store's index or the broker's queue.
struct Row {
    /// The checkbox's field: `key` (index) or `id` (queue), and its value.
    select: (&'static str, String),
    task_name: Option<String>,
    task_id: Option<ferriq::wire::TaskId>,
    reason: Option<String>,
    attempts: u32,
    dead_at_ms: Option<u64>,
    arguments: String,
    detail: String,
}

impl Row {
    fn of_entry(e: DeadEntry) -> Row {
        Row {
            select: ("key", e.key),
            task_name: e.task_name,
            task_id: e.task_id,
            reason: e.reason,
            attempts: e.attempts,
            dead_at_ms: Some(e.dead_at_ms).filter(|t| *t > 0),
            arguments: e.arguments,
            detail: e.detail,
        }
    }

    fn of_message(m: DeadMessage) -> Row {
        Row {
            arguments: arguments(&m),
            select: ("id", m.id),
            task_name: m.task_name,
            task_id: m.task_id,
            reason: m.reason,
            attempts: m.attempts,
            dead_at_ms: m.dead_at_ms,
            detail: m.detail,
        }
    }
}

/// A page of rows, whether more follow, and how many match when known.
type Listed = (Vec<Row>, bool, Option<u64>);

/// The page from the store's index; `None` when the store keeps none.
async fn from_index(
    state: &State,
    lane: &str,
    filter: &DeadFilter,
    offset: usize,
) -> Result<Option<(Listed, u64)>, String> {
    let page = state
        .client
        .ops()
        .dead_index(lane, filter, offset, PAGE)
        .await
        .map_err(|e| e.to_string())?;
    Ok(page.map(|p| {
        let more = (offset + p.entries.len()) < p.total as usize;
        let rows = p.entries.into_iter().map(Row::of_entry).collect();
        ((rows, more, Some(p.total)), p.indexed)
    }))
}

/// The page read from the broker's queue (each dead letter looked at is put back).
async fn from_queue(
    state: &State,
    lane: &str,
    filter: &DeadFilter,
    offset: usize,
) -> Result<Listed, String> {
    let mut found = state
        .client
        .ops()
        .dead_letters_matching(lane, filter, offset, PAGE + 1)
        .await
        .map_err(|e| e.to_string())?;
    let more = found.len() > PAGE;
    found.truncate(PAGE);
    Ok((found.into_iter().map(Row::of_message).collect(), more, None))
}

/// Dead letters: filtered, with redrive and purge.
pub(crate) async fn dead_letters(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<DeadQuery>,
) -> Html<String> {
    let ops = state.client.ops();
    let queues = match ops.queues().await {
        Ok(l) => l,
        Err(e) => return page(&state, "Dead letters", "/dead", &error_box(&e.to_string())),
    };
    let lanes: Vec<String> = queues.iter().map(|q| q.name.clone()).collect();
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
    let queue_count = queues
        .iter()
        .find(|v| v.name == lane)
        .and_then(|v| v.dead_lettered);
    let mut from_the_queue = q.source == "queue";
    let mut indexed = None;
    let listed = if from_the_queue {
        from_queue(&state, &lane, &filter, q.offset(true)).await
    } else {
        match from_index(&state, &lane, &filter, q.offset(false)).await {
            Ok(Some((listed, n))) => {
                indexed = Some(n);
                Ok(listed)
            }
            Ok(None) => {
                from_the_queue = true;
                from_queue(&state, &lane, &filter, q.offset(true)).await
            }
            Err(e) => Err(e),
        }
    };
    let offset = q.offset(from_the_queue);
    let (found, more, total) = match listed {
        Ok(l) => l,
        Err(e) => {
            body.push_str(&error_box(&e));
            return page(&state, "Dead letters", "/dead", &body);
        }
    };
    body.push_str(&source_note(
        &state,
        &lane,
        &q,
        indexed,
        queue_count,
        from_the_queue,
    ));
    let now = state.client.clock().now_unix_ms();
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|m| {
            let id_cell = if state.actions {
                format!(
                    "<input type=\"checkbox\" name=\"{}\" value=\"{}\" form=\"act\" aria-label=\"select\">",
                    m.select.0,
                    esc(&m.select.1)
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
                format!("<code class=\"args\">{}</code>", esc(&cut(&m.arguments, 300))),
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
        "lane={}&reason={}&task={}&text={}&older_than_min={}{}",
        enc(&lane),
        enc(&q.reason),
        enc(&q.task),
        enc(&q.text),
        q.older_than().unwrap_or(0),
        if q.source == "queue" {
            "&source=queue"
        } else {
            ""
        }
    );
    // The index lists newest first; the queue in its own order, oldest first.
    let (back, forward) = if from_the_queue {
        ("← older", "newer →")
    } else {
        ("← newer", "older →")
    };
    body.push_str("<p class=\"pager\">");
    if offset > 0 {
        let _ = write!(
            body,
            "<a href=\"?{}&amp;offset={}\">{back}</a> ",
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
    if let Some(total) = total {
        let _ = write!(body, " of {}", thousands(total));
    }
    if more {
        let _ = write!(
            body,
            " <a href=\"?{}&amp;offset={}\">{forward}</a>",
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

/// `n` with thousands separated (`12,345`).
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Where the list comes from, and when the store's index and the queue disagree, how to
/// list from the queue or rebuild the index.
fn source_note(
    state: &State,
    lane: &str,
    q: &DeadQuery,
    indexed: Option<u64>,
    in_queue: Option<u64>,
    from_the_queue: bool,
) -> String {
    let mut out = String::from("<p class=\"source\" id=\"source\">");
    let lane_link = format!("{}/dead?lane={}", state.base, enc(lane));
    match (from_the_queue, indexed) {
        (true, _) => {
            let _ = write!(
                out,
                "Listed from the broker's queue (oldest first; each page reads the queue up to it)."
            );
            if q.source == "queue" {
                let _ = write!(
                    out,
                    " <a href=\"{}\">List from the store's index</a>",
                    esc(&lane_link)
                );
            }
        }
        (false, Some(n)) => {
            let _ = write!(
                out,
                "Listed from the store's index: {} indexed",
                thousands(n)
            );
            if let Some(m) = in_queue {
                let _ = write!(out, ", {} in the queue", thousands(m));
            }
            out.push('.');
            // A queue several lanes share counts them all (SQS), so only fewer in the queue
            // than indexed, or more on a lane of its own, is worth a word.
            if in_queue.is_some_and(|m| m != n) {
                let _ = write!(
                    out,
                    " They differ while letters are parked or taken, and when some were parked \
                     before the index existed or by the broker itself. \
                     <a href=\"{}&amp;source=queue\">List from the queue</a>",
                    esc(&lane_link)
                );
                if state.actions {
                    let _ = write!(
                        out,
                        " <form method=\"post\" class=\"inline\" action=\"{base}/dead/reindex\">{csrf}\
                         <input type=\"hidden\" name=\"lane\" value=\"{lane}\">\
                         <button name=\"scope\" value=\"lane\" id=\"reindex\">Re-index from the queue</button></form>",
                        base = esc(&state.base),
                        csrf = csrf_field(state),
                        lane = esc(lane),
                    );
                }
            }
        }
        (false, None) => {}
    }
    out.push_str("</p>");
    out
}
