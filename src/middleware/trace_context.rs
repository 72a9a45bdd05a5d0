//! W3C trace context from the caller's span to the worker's run span (feature
//! `opentelemetry`).

use std::str::FromStr;

use async_trait::async_trait;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{Middleware, MiddlewareError, Run};
use crate::task::AppState;
use crate::wire::TaskMessage;

/// The label taskiq's OpenTelemetry middleware (and ferriq) write the W3C `traceparent` to.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` label.
pub const TRACESTATE: &str = "tracestate";

/// Carries the W3C trace context (`traceparent`, `tracestate` labels, as taskiq's
/// OpenTelemetry middleware writes them) from the span that enqueues a task to the worker's
/// `ferriq.run` span, so the run continues the caller's trace — a Python taskiq producer's
/// too. Register it on the client and on the worker; the app sets up `tracing-opentelemetry`
/// and its exporter (OTLP or any other).
///
/// ```
/// use std::sync::Arc;
/// use ferriq::middleware::TraceContext;
///
/// let env = ferriq::testing::TestEnv::new();
/// let client = env.client.clone().with_middleware(Arc::new(TraceContext));
/// let worker = env.worker().middleware(Arc::new(TraceContext));
/// # let _ = (client, worker);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContext;

/// `00-{trace id}-{span id}-{flags}`.
fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// A remote span context from `traceparent` (and `tracestate`); `None` when malformed.
fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let version = parts.next()?;
    let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four fields; later versions may add some, read the first four.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = tracestate
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let sc = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        state,
    );
    sc.is_valid().then_some(sc)
}

#[async_trait]
impl Middleware for TraceContext {
    fn name(&self) -> &str {
        "TraceContext"
    }

    async fn before_send(&self, message: &mut TaskMessage) -> Result<(), MiddlewareError> {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if sc.is_valid() {
            message.labels.insert(TRACEPARENT, traceparent(sc));
            let state = sc.trace_state().header();
            if !state.is_empty() {
                message.labels.insert(TRACESTATE, state);
            }
        }
        Ok(())
    }

    async fn before_run(&self, run: &Run<'_>, _: &mut AppState) -> Result<(), MiddlewareError> {
        let Some(parent) = run.labels.get(TRACEPARENT).and_then(|v| v.as_str()) else {
            return Ok(());
        };
        let state = run.labels.get(TRACESTATE).and_then(|v| v.as_str());
        let sc = parse(parent, state)
            .ok_or_else(|| MiddlewareError::new(format!("malformed traceparent {parent:?}")))?;
        let _ = run
            .span
            .set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_round_trip_and_malformed_ones_are_refused() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse(text, Some("congo=t61rcWkgMzE")).unwrap();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(traceparent(&sc), text);
        assert_eq!(sc.trace_state().header(), "congo=t61rcWkgMzE");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad, None).is_none(), "{bad:?}");
        }
    }
}
