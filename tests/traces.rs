//! Traces across processes: one call's spans, from the gateway's admission through the
//! scheduler to the worker, its sandbox and its outgoing request, form one trace with the
//! right parents, exported over OTLP/gRPC to a real receiver (a gRPC server built from the
//! `opentelemetry-proto` definitions, tests/otlp/receiver.py); the request reaching the
//! witness carries the trace context of its host-call span.

use crate::common::witness::Witness;
use crate::common::{ChildGuard, Platform, fixtures, require};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, serde::Deserialize)]
struct Span {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    service: Option<String>,
    attributes: HashMap<String, serde_json::Value>,
}

/// Starts the receiver writing to `spans`; `None` (after `require`) when python3 lacks
/// grpcio or opentelemetry-proto.
fn receiver(spans: &Path) -> Option<(ChildGuard, u16)> {
    let mut child = Command::new("python3")
        .arg(fixtures::repo().join("tests/otlp/receiver.py"))
        .arg(spans)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs");
    let stdout = child.stdout.take().expect("stdout");
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the receiver's first line");
    if let Some(missing) = line.strip_prefix("MISSING ") {
        require(
            &format!("the OTLP receiver needs grpcio and opentelemetry-proto: {missing}"),
            false,
        );
        return None;
    }
    let port = line
        .trim()
        .strip_prefix("LISTENING ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the receiver said {line:?}"));
    Some((guard, port))
}

fn read_spans(path: &Path) -> Vec<Span> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a span line"))
        .collect()
}

fn named<'a>(spans: &'a [Span], trace: &str, name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.trace_id == trace && s.name == name)
        .collect()
}

fn one<'a>(spans: &'a [Span], trace: &str, name: &str) -> &'a Span {
    let found = named(spans, trace, name);
    assert_eq!(
        found.len(),
        1,
        "one {name} span in trace {trace}: {spans:#?}"
    );
    found[0]
}

fn attribute(span: &Span, key: &str) -> String {
    match span.attributes.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => panic!("span {} has no {key}: {span:?}", span.name),
    }
}

#[tokio::test]
async fn one_calls_spans_form_one_trace_across_gateway_scheduler_worker_and_its_request() {
    let root = tempfile::tempdir().unwrap();
    let spans_file = root.path().join("spans.jsonl");
    let Some((_receiver, port)) = receiver(&spans_file) else {
        return;
    };
    let witness = Witness::start().await;
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tool.yaml"),
        format!(
            "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\n\
             spec: {{replicas: 1, slotsPerWorker: 4}}\n---\n{}",
            fixtures::slow_manifest(witness.addr.port())
        ),
    )
    .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let platform = Platform::start_with_env(
        root.path(),
        &dir,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            // The log level filters log lines, not spans: quiet logs still trace.
            ("RUST_LOG", "warn"),
        ],
    );
    platform.ready("tools", "slow").await;

    // The caller's own trace: the call's root span is a child of the caller's span.
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let response = platform
        .http_client()
        .post(format!(
            "http://{}/v1/namespaces/default/tools/slow/run:call",
            platform.http
        ))
        .header("traceparent", format!("00-{trace}-{caller_span}-01"))
        .json(&serde_json::json!({
            "args": {"base": witness.base(), "run": "traced", "steps": 1, "sleep-ms": 0}
        }))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(body["state"], "succeeded", "{body}");
    let call_id = body["id"].as_str().expect("a call id").to_string();

    // Every process exports in batches (OTEL_BSP_SCHEDULE_DELAY=100 ms): wait for the
    // worker's request span, the last to end before the result.
    let deadline = Instant::now() + Duration::from_secs(30);
    let wanted = [
        "call",
        "middleware",
        "store_commit",
        "dispatch",
        "run",
        "sandbox",
        "http_request",
        "complete",
    ];
    let spans = loop {
        let spans = read_spans(&spans_file);
        if wanted
            .iter()
            .all(|name| !named(&spans, trace, name).is_empty())
        {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "not every span arrived in trace {trace} (want {wanted:?}): {spans:#?}\nlog:\n{}",
            platform.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let call = one(&spans, trace, "call");
    assert_eq!(
        call.parent_span_id, caller_span,
        "the call's span is the caller's child"
    );
    assert_eq!(attribute(call, "call"), call_id);
    assert_eq!(attribute(call, "tool"), "slow");
    assert_eq!(call.service.as_deref(), Some("toolgrid"));
    for name in ["middleware", "store_commit", "dispatch", "complete"] {
        let span = one(&spans, trace, name);
        assert_eq!(
            span.parent_span_id, call.span_id,
            "{name} is the call span's child"
        );
        assert_eq!(span.service.as_deref(), Some("toolgrid"), "{name}");
    }
    let dispatch = one(&spans, trace, "dispatch");
    assert_eq!(attribute(dispatch, "call"), call_id);
    let run = one(&spans, trace, "run");
    assert_eq!(
        run.parent_span_id, dispatch.span_id,
        "the worker's run is the dispatch's child"
    );
    assert_eq!(run.service.as_deref(), Some("toolgrid-worker"));
    assert_eq!(attribute(run, "call"), call_id);
    assert_eq!(attribute(run, "worker"), attribute(dispatch, "worker"));
    let sandbox = one(&spans, trace, "sandbox");
    assert_eq!(sandbox.parent_span_id, run.span_id);
    let request = one(&spans, trace, "http_request");
    assert_eq!(
        request.parent_span_id, sandbox.span_id,
        "a host call is the sandbox's child"
    );
    assert_eq!(attribute(request, "method"), "GET");

    // The witness saw the request with the host call's span as its parent.
    let seen = witness.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let traceparent = seen[0]
        .headers
        .iter()
        .find(|(name, _)| name == "traceparent")
        .map(|(_, value)| value.clone())
        .expect("the request carries a traceparent");
    assert_eq!(
        traceparent,
        format!("00-{trace}-{}-01", request.span_id),
        "the request's trace context is its host call's span"
    );
}
