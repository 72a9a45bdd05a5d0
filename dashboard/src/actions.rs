//! What the buttons do. Every action is a POST whose form carries the page's CSRF token;
//! the guard has already checked the token, the origin and that actions are allowed.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State as Shared;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use ferriq::dead_letters::DeadFilter;
use ferriq::wire::{Labels, TaskId, TaskMessage};

use crate::pages::{enc, DeadQuery};
use crate::security::{token_ok, COOKIE};
use crate::State;

/// Why an action was refused (small, unlike a whole response).
pub(crate) struct Refusal(StatusCode, &'static str);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

/// A form's fields, repeated ones kept (`id=a&id=b`).
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(body: &[u8]) -> Form {
        Form(form_urlencoded::parse(body).into_owned().collect())
    }

    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Refused unless it carries this process's CSRF token.
    fn check(&self, state: &State) -> Result<(), Refusal> {
        if crate::security::same(self.get("csrf").as_bytes(), state.csrf.as_bytes()) {
            Ok(())
        } else {
            Err(Refusal(
                StatusCode::FORBIDDEN,
                "refused: the form is stale or not from this dashboard (reload the page)\n",
            ))
        }
    }
}

/// The login form: the token, as an HttpOnly cookie for this path (`Secure` when the request
/// came over HTTPS, as a proxy in front says).
pub(crate) async fn login(
    Shared(state): Shared<Arc<State>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let form = Form::parse(&body);
    if let Err(refused) = form.check(&state) {
        return refused.into_response();
    }
    let token = form.get("token");
    if state.token.is_none() || !token_ok(&state, token) {
        return (StatusCode::UNAUTHORIZED, "wrong token\n").into_response();
    }
    let path = if state.base.is_empty() {
        "/"
    } else {
        &state.base
    };
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let cookie = format!(
        "{COOKIE}={}; Path={path}; HttpOnly; SameSite=Strict{}",
        enc(token),
        if https { "; Secure" } else { "" }
    );
    let mut answer = Redirect::to(&format!("{}/", state.base)).into_response();
    if let Ok(v) = cookie.parse() {
        answer.headers_mut().insert(header::SET_COOKIE, v);
    }
    answer
}

/// The dead letters page's filter from a form, with `selected` ids when asked.
fn dead_filter(form: &Form) -> Result<(String, DeadFilter), Refusal> {
    let q = DeadQuery {
        lane: form.get("lane").to_owned(),
        reason: form.get("reason").to_owned(),
        task: form.get("task").to_owned(),
        text: form.get("text").to_owned(),
        older_than_min: form.get("older_than_min").to_owned(),
        offset: String::new(),
        source: String::new(),
    };
    if q.lane.is_empty() {
        return Err(Refusal(StatusCode::BAD_REQUEST, "no lane given\n"));
    }
    match form.get("scope") {
        "selected" => {
            // Rows listed from the store's index carry index keys; from the queue, ids.
            let (ids, keys) = (form.all("id"), form.all("key"));
            if ids.is_empty() && keys.is_empty() {
                return Err(Refusal(StatusCode::BAD_REQUEST, "nothing selected\n"));
            }
            Ok((q.lane.clone(), q.filter().any_of_ids(ids).any_of_keys(keys)))
        }
        "lane" => Ok((q.lane.clone(), DeadFilter::all())),
        "filter" => Ok((q.lane.clone(), q.filter())),
        _ => Err(Refusal(
            StatusCode::BAD_REQUEST,
            "scope is selected, filter or lane\n",
        )),
    }
}

/// Back to the dead letters page of `lane`, where the job's progress shows.
fn back_to_dead(state: &State, lane: &str) -> Response {
    Redirect::to(&format!("{}/dead?lane={}", state.base, enc(lane))).into_response()
}

/// What a bulk job does: redrive, purge, or rebuild the lane's index from its queue.
#[derive(Debug, Clone, Copy)]
enum Bulk {
    Redrive,
    Purge,
    Reindex,
}

/// Redrives the selected dead letters, or every one the filter matches, in the background.
pub(crate) async fn redrive(Shared(state): Shared<Arc<State>>, body: Bytes) -> Response {
    bulk(state, &body, Bulk::Redrive)
}

/// Purges the selected dead letters, or every one the filter matches, in the background.
pub(crate) async fn purge(Shared(state): Shared<Arc<State>>, body: Bytes) -> Response {
    bulk(state, &body, Bulk::Purge)
}

/// Rebuilds a lane's dead-letter index from its queue in the background (every dead letter
/// is looked at and put back as it was).
pub(crate) async fn reindex(Shared(state): Shared<Arc<State>>, body: Bytes) -> Response {
    bulk(state, &body, Bulk::Reindex)
}

/// Starts `kind` on the form's lane and filter as a recorded background job; back to the page.
fn bulk(state: Arc<State>, body: &[u8], kind: Bulk) -> Response {
    let form = Form::parse(body);
    if let Err(refused) = form.check(&state) {
        return refused.into_response();
    }
    let (lane, filter) = match dead_filter(&form) {
        Ok(f) => f,
        Err(bad) => return bad.into_response(),
    };
    let name = match kind {
        Bulk::Redrive => "redrive",
        Bulk::Purge => "purge",
        Bulk::Reindex => "re-index",
    };
    let job = state
        .jobs
        .start(name, &lane, state.client.clock().now_unix_ms());
    let recorder = {
        let (st, job) = (state.clone(), job.clone());
        tokio::spawn(async move { st.jobs.keep_recorded(&st.client, &job).await })
    };
    let (st, l) = (state.clone(), lane.clone());
    tokio::spawn(async move {
        let ops = st.client.ops();
        let progress = |p: ferriq::ops::Progress| {
            st.jobs.update(&job, |j| {
                j.seen = p.seen;
                j.done = p.done;
            })
        };
        // (done, the outcome as text)
        let ended = match kind {
            Bulk::Redrive => ops.redrive(&l, &filter, progress).await.map(|r| {
                let text = format!(
                    "{} redriven, {} kept, {} parked again meanwhile",
                    r.redriven, r.kept, r.parked_again
                );
                (r.redriven, text)
            }),
            Bulk::Purge => ops
                .purge(&l, &filter, progress)
                .await
                .map(|r| (r.purged, format!("{} purged, {} kept", r.purged, r.kept))),
            Bulk::Reindex => ops
                .reindex_dead(&l, progress)
                .await
                .map(|n| (n, format!("{n} indexed"))),
        };
        st.jobs.update(&job, |j| {
            j.finished = true;
            j.outcome = Some(match ended {
                Ok((done, text)) => {
                    j.done = done;
                    text
                }
                Err(e) => format!("stopped: {e}"),
            });
        });
        // The last record, with the outcome.
        let _ = recorder.await;
        tracing::info!(lane = %l, job = %job, kind = name, "dashboard bulk job ended");
    });
    back_to_dead(&state, &lane)
}

/// Pauses, resumes, removes or runs a schedule now.
pub(crate) async fn schedule(Shared(state): Shared<Arc<State>>, body: Bytes) -> Response {
    let form = Form::parse(&body);
    if let Err(refused) = form.check(&state) {
        return refused.into_response();
    }
    let id = form.get("id");
    if id.is_empty() {
        return (StatusCode::BAD_REQUEST, "no schedule id given\n").into_response();
    }
    let schedules = state.client.schedules();
    let done = match form.get("action") {
        "pause" => schedules.pause(id).await.map_err(failed),
        "resume" => schedules.resume(id).await.map_err(failed),
        "remove" => schedules.remove(id).await.map(|_| ()).map_err(failed),
        "run" => run_now(&state, id).await,
        _ => Err((
            StatusCode::BAD_REQUEST,
            "action is pause, resume, remove or run".to_owned(),
        )),
    };
    match done {
        Ok(()) => Redirect::to(&format!("{}/schedules", state.base)).into_response(),
        Err((status, e)) => (status, format!("{e}\n")).into_response(),
    }
}

/// A store or broker failure: 502, with what it said.
fn failed(e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::BAD_GATEWAY, e.to_string())
}

/// Sends one run of schedule `id`'s task now, outside its timing, with the schedule's
/// arguments and lane (its own task id: a tick's id is its time, and this is none).
async fn run_now(state: &State, id: &str) -> Result<(), (StatusCode, String)> {
    let listed = state.client.schedules().list().await.map_err(failed)?;
    let spec = listed
        .into_iter()
        .find(|s| s.spec.id == id)
        .ok_or_else(|| (StatusCode::NOT_FOUND, format!("no schedule {id:?}")))?
        .spec;
    let mut labels = Labels::new();
    // Not marked as the schedule's tick (no `ferriq_schedule` label): a tick is answered
    // rather than parked when late, and this run is an operator's, not the timing's.
    if let Some(q) = &spec.queue {
        labels.set_queue_name(q.as_str());
    }
    let msg = TaskMessage {
        task_id: TaskId::random(),
        task_name: spec.task.as_str().into(),
        labels,
        args: spec.args.clone(),
        kwargs: spec.kwargs.clone(),
    };
    state
        .client
        .enqueue_message(msg)
        .await
        .map(|_| ())
        .map_err(failed)
}
