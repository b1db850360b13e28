//! A call that is one exchange with an upstream instead of a wasm run (an imported tool's
//! MCP `tools/call` or OpenAPI request): the same [`HttpHost`] a guest's requests go
//! through (committed before they leave, keyed, recorded, replayed, re-sent only per the
//! effect), the same deadline, secrets and redaction, and the same [`RunOutcome`], so the
//! worker reports it like any run.

use crate::http::{HttpFailure, HttpHost};
use crate::limits::{CallMemory, Tripwires};
use crate::recorder::{AbortKind, HostLog};
use crate::runtime::{CallHost, Failure, RunOutcome, RunRequest, call_host, deadline_failure};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolgrid_core::error::ErrorKind;

/// What an exchange produced.
#[derive(Debug)]
pub enum Exchanged {
    /// The tool's result, as JSON text.
    Value(Bytes),
    /// The upstream reported the tool's error (MCP `isError`, a non-2xx answer): the call
    /// ends as a tool error with this text.
    ToolError(String),
    /// The exchange could not be made or understood.
    Failed(Failure),
    /// The host refused or failed the request, or the run must stop.
    Http(HttpFailure),
}

/// Runs `exchange` as the call `request` describes (its replay, sink, egress, secrets and
/// limits); the argv, stdin and workspace of `request` are the exchange's to read.
pub async fn run_exchange<F, Fut>(mut request: RunRequest, exchange: F) -> RunOutcome
where
    F: FnOnce(Arc<HttpHost>) -> Fut,
    Fut: Future<Output = Exchanged>,
{
    let started = Instant::now();
    let trips = Arc::new(Tripwires::default());
    let log = HostLog::new(std::mem::take(&mut request.replay));
    for entry in std::mem::take(&mut request.prelude) {
        log.record(entry);
    }
    let memory = CallMemory::new(request.limits.memory_bytes, trips.clone());
    let timeout = Duration::from_millis(request.limits.timeout_ms.max(1));
    let hard = Duration::from_millis(request.limits.max_timeout_ms).max(timeout);
    let CallHost { http, secrets, .. } = call_host(&mut request, &log, &memory, hard);
    let failure = |kind, message: String| {
        (
            -1,
            Bytes::new(),
            String::new(),
            Some(Failure { kind, message }),
        )
    };
    let outcome = tokio::time::timeout(timeout, exchange(http.clone())).await;
    let (mut exit_code, mut stdout, stderr, mut failure) = match log.aborted() {
        Some((AbortKind::Diverged, reason)) => failure(ErrorKind::ReplayDivergence, reason),
        Some((AbortKind::OutcomeUnknown, reason)) => failure(ErrorKind::OutcomeUnknown, reason),
        Some((AbortKind::Fenced | AbortKind::Unacknowledged, reason)) => {
            failure(ErrorKind::Cancelled, reason)
        }
        None => match outcome {
            Err(_elapsed) => {
                let f = deadline_failure(
                    timeout.as_millis() as u64,
                    0,
                    request.repeatable,
                    http.issued(),
                );
                failure(f.kind, f.message)
            }
            Ok(Exchanged::Value(_)) if log.unreplayed() > 0 => failure(
                ErrorKind::ReplayDivergence,
                format!(
                    "the call ended with {} recorded host calls never made again",
                    log.unreplayed()
                ),
            ),
            Ok(Exchanged::Value(bytes)) => (0, bytes, String::new(), None),
            Ok(Exchanged::ToolError(text)) => (1, Bytes::new(), text, None),
            Ok(Exchanged::Failed(f)) => failure(f.kind, f.message),
            Ok(Exchanged::Http(error)) => {
                let (kind, message) = http_failure(error);
                failure(kind, message)
            }
        },
    };
    let fenced = matches!(
        log.aborted(),
        Some((AbortKind::Fenced | AbortKind::Unacknowledged, _))
    );
    let output_limit = request.limits.effective_output_bytes();
    stdout = Bytes::from(secrets.scrub_output(&stdout).into_owned());
    if stdout.len() as u64 > output_limit && failure.is_none() {
        exit_code = -1;
        failure = Some(Failure {
            kind: ErrorKind::OutputLimit,
            message: format!(
                "the upstream's result is {} bytes, more than the call's output limit of \
                 {output_limit} bytes",
                stdout.len()
            ),
        });
        stdout = Bytes::new();
    }
    let stderr_tail = Bytes::from(secrets.scrub_output(stderr.as_bytes()).into_owned());
    if let Some(failure) = &mut failure {
        failure.message = secrets.scrub_output_text(&failure.message).into_owned();
    }
    RunOutcome {
        exit_code,
        stdout,
        stderr_tail,
        failure,
        log,
        elapsed: started.elapsed(),
        fenced,
    }
}

/// The kind a failed exchange ends the call with.
fn http_failure(error: HttpFailure) -> (ErrorKind, String) {
    match error {
        HttpFailure::Denied(message) => (ErrorKind::EgressDenied, message),
        HttpFailure::UnknownSecret(message) => (ErrorKind::UnknownSecret, message),
        HttpFailure::Invalid(message) => (ErrorKind::InvalidArgument, message),
        HttpFailure::Failed(message) => (
            ErrorKind::Unavailable,
            format!("the upstream was not reached: {message}"),
        ),
        HttpFailure::Unresolved(message) => (
            ErrorKind::Unavailable,
            format!("the upstream's host does not resolve: {message}"),
        ),
        HttpFailure::Limit(kind, message) => (kind, message),
        HttpFailure::Abort => (
            ErrorKind::Internal,
            "the exchange stopped without a reason".into(),
        ),
    }
}
