//! W3C trace context across toolgrid's processes.
//!
//! A call's spans live in several processes: the gateway admits it, the scheduler sends it
//! to a worker, the worker runs it in a sandbox whose host calls reach other servers. One
//! trace ties them together by passing a `traceparent` (the W3C trace-context header,
//! `00-<trace id>-<span id>-<flags>`) along: stored with the call, carried in the worker
//! link's assignment, sent with every outgoing request.
//!
//! Spans are `tracing` spans; the OpenTelemetry layer, when the process exports traces,
//! gives them trace and span ids. Without it [`traceparent`] is `None` and [`adopt`] does
//! nothing, so callers need not know whether traces are on.

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The header (and metadata key) that carries a trace context.
pub const TRACEPARENT: &str = "traceparent";

/// Longest traceparent taken from a peer (version 00 is 55 bytes; later versions may
/// append fields).
pub const MAX_TRACEPARENT_BYTES: usize = 256;

/// The traceparent of `span`: what a peer needs to make its spans children of it. `None`
/// when the process exports no traces (the span has no trace id).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// The traceparent of the current span (see [`traceparent`]).
pub fn current() -> Option<String> {
    traceparent(&tracing::Span::current())
}

/// Makes `span` a child of the span `traceparent` names (sent by a peer or stored with a
/// call). A malformed or oversized value, or one given after `span` was entered, leaves
/// `span` where it was: a trace context is a hint, never a reason to refuse work.
pub fn adopt(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() || traceparent.len() > MAX_TRACEPARENT_BYTES {
        return;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    use opentelemetry::trace::TraceContextExt as _;
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// A new span named `name` (at info level), child of `parent` when one is given, else of
/// the current span. For work done on behalf of a call away from the request that
/// admitted it (the scheduler's dispatch and completion).
#[macro_export]
macro_rules! child_span {
    ($parent:expr, $name:literal, $($fields:tt)*) => {{
        let span = ::tracing::info_span!($name, $($fields)*);
        if let Some(parent) = $parent {
            $crate::adopt(&span, parent);
        }
        span
    }};
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    fn with_traces<T>(f: impl FnOnce() -> T) -> T {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, f)
    }

    fn parts(traceparent: &str) -> (String, String) {
        let fields: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(fields.len(), 4, "{traceparent}");
        assert_eq!(fields[0], "00");
        (fields[1].to_string(), fields[2].to_string())
    }

    #[test]
    fn a_span_adopted_from_a_traceparent_joins_its_trace_as_its_child() {
        with_traces(|| {
            let parent = tracing::info_span!("parent");
            let sent = traceparent(&parent).expect("a traced span has a traceparent");
            let (trace, parent_id) = parts(&sent);

            let child = tracing::info_span!("child");
            adopt(&child, &sent);
            let (child_trace, child_id) = parts(&traceparent(&child).unwrap());
            assert_eq!(child_trace, trace);
            assert_ne!(child_id, parent_id);
        });
    }

    #[test]
    fn a_malformed_or_oversized_traceparent_is_ignored() {
        with_traces(|| {
            for bad in [
                String::new(),
                "junk".to_string(),
                "00-00000000000000000000000000000000-0000000000000000-01".to_string(),
                format!(
                    "00-{}-{}-01-{}",
                    "a".repeat(32),
                    "b".repeat(16),
                    "x".repeat(300)
                ),
            ] {
                let span = tracing::info_span!("span");
                let before = traceparent(&span).unwrap();
                adopt(&span, &bad);
                assert_eq!(traceparent(&span).unwrap(), before, "{bad:?}");
            }
        });
    }

    #[test]
    fn without_an_exporter_there_is_no_traceparent() {
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("span");
            assert_eq!(traceparent(&span), None);
            adopt(
                &span,
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            );
            assert_eq!(current(), None);
        });
    }
}
