//! The overview's charts, drawn on the server as SVG images from the store's history: runs per
//! interval (succeeded and failed, stacked) and run times (p50 and p95). As `<img>`, an SVG
//! runs no script; every label in it is escaped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State as Shared};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use ferriq::store::MinuteStats;
use serde::Deserialize;

use crate::html::esc;
use crate::State;

/// `?hours=&task=`.
#[derive(Debug, Deserialize)]
pub(crate) struct ChartQuery {
    #[serde(default)]
    pub(crate) hours: Option<u64>,
    #[serde(default)]
    pub(crate) task: Option<String>,
}

/// Hours shown: 1 to 24 (6 by default).
pub(crate) fn hours(q: Option<u64>) -> u64 {
    q.unwrap_or(6).clamp(1, 24)
}

/// The history of the minutes `from..=to`, read once for the page and its two charts (which
/// ask within the same seconds: one store read instead of three), kept 5 s.
async fn history(
    state: &State,
    from: u64,
    to: u64,
) -> Result<Arc<Vec<MinuteStats>>, ferriq::store::StoreError> {
    {
        let cached = state
            .history_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((f, t, at, h)) = cached.as_ref() {
            if (*f, *t) == (from, to) && at.elapsed() < std::time::Duration::from_secs(5) {
                return Ok(h.clone());
            }
        }
    }
    let read = Arc::new(state.client.store().history(from, to).await?);
    *state
        .history_cache
        .lock()
        .unwrap_or_else(|p| p.into_inner()) =
        Some((from, to, std::time::Instant::now(), read.clone()));
    Ok(read)
}

/// The history of the last `hours`, summed per interval of `step` minutes (at most 120 bars):
/// (first minute, step, per interval the stats of `task` or of every task).
pub(crate) async fn intervals(
    state: &State,
    hours: u64,
    task: Option<&str>,
) -> Result<(u64, u64, Vec<MinuteStats>), ferriq::store::StoreError> {
    let now = state.client.clock().now_unix_ms() / 60_000;
    let span = hours * 60;
    let step = span.div_ceil(120).max(1);
    let from = now + 1 - span;
    let history = history(state, from, now).await?;
    let mut bars: Vec<MinuteStats> = (0..span.div_ceil(step))
        .map(|i| MinuteStats::new(from + i * step, task.unwrap_or("")))
        .collect();
    for m in history.iter().filter(|m| task.is_none_or(|t| m.task == t)) {
        let i = ((m.minute.saturating_sub(from)) / step) as usize;
        if let Some(bar) = bars.get_mut(i) {
            bar.add(m);
        }
    }
    Ok((from, step, bars))
}

/// Per task over the last `hours`: the sums.
pub(crate) async fn per_task(
    state: &State,
    hours: u64,
) -> Result<Vec<MinuteStats>, ferriq::store::StoreError> {
    let now = state.client.clock().now_unix_ms() / 60_000;
    let history = history(state, now + 1 - hours * 60, now).await?;
    let mut by: BTreeMap<String, MinuteStats> = BTreeMap::new();
    for m in history.iter() {
        by.entry(m.task.clone())
            .or_insert_with(|| MinuteStats::new(0, m.task.as_str()))
            .add(m);
    }
    Ok(by.into_values().collect())
}

const W: f64 = 720.0;
const H: f64 = 180.0;
const LEFT: f64 = 48.0;
const BOTTOM: f64 = 20.0;

fn svg(body: &str, title: &str) -> Response {
    let doc = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" \
         font-family=\"system-ui, sans-serif\" font-size=\"11\" role=\"img\"><title>{}</title>{body}</svg>",
        esc(title)
    );
    (
        [(header::CONTENT_TYPE, "image/svg+xml; charset=utf-8")],
        doc,
    )
        .into_response()
}

fn clock(minute: u64) -> String {
    jiff::Timestamp::from_second(minute as i64 * 60)
        .map(|t| t.strftime("%H:%M").to_string())
        .unwrap_or_default()
}

// Colours as presentation attributes: the dashboard's Content-Security-Policy
// (`style-src 'self'`) would drop a `<style>` inside the image.
const AXIS: &str = "stroke=\"#8a919c\" stroke-width=\"1\"";
const LABEL: &str = "fill=\"#8a919c\"";
const OK: &str = "#3b7dd8";
const FAIL: &str = "#d0453a";
const P95: &str = "#d08a1c";

/// Axes, the top value's label and the first and last times.
fn frame(out: &mut String, top: &str, from: u64, to: u64) {
    let base = H - BOTTOM;
    let _ = write!(
        out,
        "<line {AXIS} x1=\"{LEFT}\" y1=\"4\" x2=\"{LEFT}\" y2=\"{base}\"/>\
         <line {AXIS} x1=\"{LEFT}\" y1=\"{base}\" x2=\"{W}\" y2=\"{base}\"/>\
         <text {LABEL} x=\"{x}\" y=\"12\" text-anchor=\"end\">{top}</text>\
         <text {LABEL} x=\"{x}\" y=\"{base}\" text-anchor=\"end\">0</text>\
         <text {LABEL} x=\"{LEFT}\" y=\"{t}\">{}</text>\
         <text {LABEL} x=\"{W}\" y=\"{t}\" text-anchor=\"end\">{} UTC</text>",
        esc(&clock(from)),
        esc(&clock(to)),
        x = LEFT - 4.0,
        t = H - 4.0,
        top = esc(top),
    );
}

/// A chart's query read: its hours, and [`intervals`] for them; a 502 when the store fails.
async fn load(
    state: &State,
    q: &ChartQuery,
) -> Result<(u64, u64, u64, Vec<MinuteStats>), Response> {
    let hours = hours(q.hours);
    match intervals(state, hours, q.task.as_deref()).await {
        Ok((from, step, bars)) => Ok((hours, from, step, bars)),
        Err(e) => Err((
            StatusCode::BAD_GATEWAY,
            format!("history unavailable: {e}\n"),
        )
            .into_response()),
    }
}

/// `/charts/runs.svg`: runs per interval, succeeded and failed stacked.
pub(crate) async fn runs(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<ChartQuery>,
) -> Response {
    let (hours, from, step, bars) = match load(&state, &q).await {
        Ok(b) => b,
        Err(failed) => return failed,
    };
    let top = bars
        .iter()
        .map(|b| b.succeeded + b.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut out = String::new();
    frame(
        &mut out,
        &top.to_string(),
        from,
        from + bars.len() as u64 * step,
    );
    let width = (W - LEFT) / bars.len().max(1) as f64;
    let scale = (H - BOTTOM - 8.0) / top as f64;
    for (i, b) in bars.iter().enumerate() {
        let x = LEFT + i as f64 * width;
        let ok_h = b.succeeded as f64 * scale;
        let fail_h = b.failed as f64 * scale;
        let base = H - BOTTOM;
        if b.succeeded > 0 {
            let _ = write!(
                out,
                "<rect fill=\"{OK}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{ok_h:.1}\"/>",
                base - ok_h,
                (width - 1.0).max(0.5)
            );
        }
        if b.failed > 0 {
            let _ = write!(
                out,
                "<rect fill=\"{FAIL}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{fail_h:.1}\"/>",
                base - ok_h - fail_h,
                (width - 1.0).max(0.5)
            );
        }
    }
    svg(
        &out,
        &format!("Runs per {step} min over the last {hours} h: succeeded (blue), failed (red)"),
    )
}

/// `/charts/durations.svg`: run time p50 and p95 per interval (seconds, bucket bounds).
pub(crate) async fn durations(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<ChartQuery>,
) -> Response {
    let (hours, from, step, bars) = match load(&state, &q).await {
        Ok(b) => b,
        Err(failed) => return failed,
    };
    // The largest finite bound reached; runs past the last bound are drawn at the top.
    let top = bars
        .iter()
        .filter_map(|b| b.quantile(0.95))
        .filter(|v| v.is_finite())
        .fold(0.005f64, f64::max);
    let mut out = String::new();
    frame(
        &mut out,
        &format!("{top} s"),
        from,
        from + bars.len() as u64 * step,
    );
    let width = (W - LEFT) / bars.len().max(1) as f64;
    let scale = (H - BOTTOM - 8.0) / top;
    let mut dots = String::new();
    for (q, colour) in [(0.5, OK), (0.95, P95)] {
        let mut points = String::new();
        for (i, b) in bars.iter().enumerate() {
            if let Some(v) = b.quantile(q) {
                let y = H - BOTTOM - v.min(top) * scale;
                let x = LEFT + (i as f64 + 0.5) * width;
                let _ = write!(points, "{x:.1},{y:.1} ");
                // A lone interval is a point, which a line alone would not show.
                let _ = write!(
                    dots,
                    "<circle fill=\"{colour}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"1.8\"/>"
                );
            }
        }
        if !points.is_empty() {
            let _ = write!(
                out,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                points.trim_end()
            );
        }
    }
    out.push_str(&dots);
    let what = q.task.as_deref().unwrap_or("every task");
    svg(
        &out,
        &format!(
            "Run time of {what} per {step} min over the last {hours} h: p50 (blue), p95 (orange)"
        ),
    )
}
