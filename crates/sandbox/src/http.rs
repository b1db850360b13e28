//! Outgoing HTTP from tools, exactly once.
//!
//! Every request is numbered within its call. Before it leaves the sandbox its start is
//! recorded and committed (with every entry buffered before it) and the control plane has
//! acknowledged it; it carries an `Idempotency-Key` derived from the call and its number;
//! its response is recorded and committed before the guest sees it. A re-run of the call
//! (replay) answers recorded requests from the oplog; a request whose start was committed
//! but whose response was not is sent again only when that is safe (an idempotent method, or
//! a `read`/`idempotent` tool), with the same key; otherwise the call ends `outcome-unknown`.
//!
//! Secret references (`${secret:NAME}`, see [`super::secrets`]) are substituted only in the
//! headers the release declares for the destination (`network.egress[].headers`), as the
//! request leaves; what the tool writes (URL, headers, body) is sent as written, never
//! substituted. The oplog records the request as written plus the declared headers, every
//! credential header as a digest (a declared one as the digest of its template), and a
//! response is redacted of every secret value of the call before it is recorded or handed
//! to the guest.

use super::egress::{Egress, Verdict};
use super::limits::CallMemory;
use super::recorder::{AbortKind, HostLog};
use super::secrets::{self, CallSecrets};
use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use toolgrid_core::call::{self, OplogEntry};
use toolgrid_core::error::ErrorKind;

/// Why an append was not committed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AppendError {
    /// The call was reassigned: stop before doing anything more.
    #[error("the call was reassigned (stale epoch): abandoning it")]
    Fenced,
    /// The stream broke before the control plane answered: the entries may or may not be
    /// durable, so nothing may act as if they were.
    #[error("the control plane did not acknowledge the append: {0}")]
    Unacknowledged(String),
}

/// Commits oplog entries and waits until they are durable.
#[async_trait::async_trait]
pub trait OplogSink: Send + Sync {
    async fn append(&self, entries: Vec<OplogEntry>) -> Result<(), AppendError>;

    /// Streams a progress report of the tool to the control plane (best effort: the
    /// report is recorded in the oplog whatever becomes of this).
    async fn progress(&self, _message: String) {}

    /// Calls a tool for the call's program (code mode): request number `seq`, already
    /// committed as a `tool-call` entry. Answers when the child call ends; asking again for
    /// the same `seq` finds the same child. A sink that reaches no gateway answers
    /// `unavailable`.
    async fn call_tool(
        &self,
        _seq: u64,
        _request: toolgrid_core::call::NestedRequest,
    ) -> toolgrid_core::call::NestedAnswer {
        toolgrid_core::call::NestedAnswer {
            call: None,
            outcome: toolgrid_core::call::NestedOutcome::error(
                ErrorKind::Unavailable,
                "this run reaches no gateway, so its program cannot call tools",
            ),
        }
    }
}

/// The header every outgoing request carries.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Which attempt of the call sent the request (informational).
pub const ATTEMPT_HEADER: &str = "toolgrid-attempt";

/// Largest response body recorded unless [`HttpHost::with_limits`] says otherwise.
const MAX_RESPONSE_BYTES: u64 = toolgrid_core::call::MAX_RESPONSE_BYTES;

/// A request as a guest makes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutgoingRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// A response as the guest sees it (live or from the oplog).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// Why a request produced no response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpFailure {
    /// The egress policy refused it (told to the guest).
    Denied(String),
    /// A header the release declares for its destination refers to a secret the call may
    /// not use, or holds a malformed reference (told to the guest, as `unknown-secret`).
    UnknownSecret(String),
    /// The request itself is malformed (told to the guest).
    Invalid(String),
    /// Connection, TLS or protocol failure (told to the guest).
    Failed(String),
    /// The host name does not resolve (told to the guest).
    Unresolved(String),
    /// The run must stop: fenced, diverged, or outcome unknown (see the log's abort).
    Abort,
    /// The request or its response passed a limit of the call (`request-limit`,
    /// `response-limit`, `memory-limit`): the call ends with that kind.
    Limit(ErrorKind, String),
}

/// Why an exchange produced no response.
enum ExchangeError {
    Failed(String),
    Limit(ErrorKind, String),
}

impl From<String> for ExchangeError {
    fn from(message: String) -> Self {
        ExchangeError::Failed(message)
    }
}

/// The idempotency key of request `seq` of a call: the same for every attempt.
pub fn idempotency_key(call_id: &str, seq: u64) -> String {
    format!("toolgrid-{call_id}-{seq}")
}

/// Methods that may be repeated with the same effect.
pub fn is_idempotent_method(method: &str) -> bool {
    matches!(
        method.to_ascii_uppercase().as_str(),
        "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS"
    )
}

/// The outgoing HTTP of one call attempt.
pub struct HttpHost {
    call_id: String,
    attempt: u32,
    /// The tool's effect is `read` or `idempotent`.
    repeatable: bool,
    egress: Egress,
    log: Arc<HostLog>,
    sink: Arc<dyn OplogSink>,
    next: AtomicU64,
    timeout: Duration,
    commit_order: tokio::sync::Mutex<()>,
    /// Largest request body sent.
    request_limit: u64,
    /// Largest response body received.
    response_limit: u64,
    /// Where a response being read is counted while it arrives.
    memory: Option<Arc<CallMemory>>,
    /// The call's secret values: substituted for references, redacted from responses.
    secrets: Arc<CallSecrets>,
}

/// A request as it leaves: its URL as written, the declared headers set (substituted).
struct Sending {
    url: String,
    headers: Vec<(String, String)>,
}

/// Whether a request may leave, decided before it does.
enum Gate {
    Go {
        sending: Sending,
        host: String,
        addrs: Vec<std::net::SocketAddr>,
    },
    /// Refused: by the egress policy (`kind` absent, told to the guest), for a declared
    /// header's secret reference the call lacks (`unknown-secret`, told to the guest), or
    /// because the declared values pass the substitution allowance (`request-limit`: the
    /// call ends).
    Refused {
        message: String,
        kind: Option<ErrorKind>,
    },
    /// The host does not resolve.
    Unresolved(String),
}

impl HttpHost {
    pub fn new(
        call_id: String,
        attempt: u32,
        repeatable: bool,
        egress: Egress,
        log: Arc<HostLog>,
        sink: Arc<dyn OplogSink>,
        timeout: Duration,
    ) -> Self {
        HttpHost {
            call_id,
            attempt,
            repeatable,
            egress,
            log,
            sink,
            next: AtomicU64::new(0),
            timeout,
            commit_order: tokio::sync::Mutex::new(()),
            request_limit: u64::MAX,
            response_limit: MAX_RESPONSE_BYTES,
            memory: None,
            secrets: Arc::new(CallSecrets::default()),
        }
    }

    /// The call's secrets: what `${secret:NAME}` references resolve to, and the values kept
    /// out of responses and the oplog.
    pub fn with_secrets(mut self, secrets: Arc<CallSecrets>) -> Self {
        self.secrets = secrets;
        self
    }

    /// Caps request and response bodies, and counts a response being read against the
    /// call's memory.
    pub fn with_limits(
        mut self,
        request_limit: u64,
        response_limit: u64,
        memory: Option<Arc<CallMemory>>,
    ) -> Self {
        self.request_limit = request_limit;
        self.response_limit = response_limit;
        self.memory = memory;
        self
    }

    /// The largest request body this host sends.
    pub fn request_limit(&self) -> u64 {
        self.request_limit
    }

    /// Why the run was stopped, if it was.
    pub fn aborted(&self) -> Option<(AbortKind, String)> {
        self.log.aborted()
    }

    /// Commits everything buffered; a refusal stops the run before any further effect.
    pub(crate) async fn commit(&self) -> Result<(), HttpFailure> {
        // One commit at a time per call, so concurrent requests' entries reach the store in
        // the order they were recorded.
        let _order = self.commit_order.lock().await;
        let entries = self.log.take_pending();
        if entries.is_empty() {
            return Ok(());
        }
        match self.sink.append(entries).await {
            Ok(()) => Ok(()),
            Err(AppendError::Fenced) => {
                self.log.abort(
                    AbortKind::Fenced,
                    "the call was reassigned (stale epoch)".into(),
                );
                Err(HttpFailure::Abort)
            }
            Err(AppendError::Unacknowledged(why)) => {
                self.log.abort(
                    AbortKind::Unacknowledged,
                    format!("the control plane did not acknowledge a commit: {why}"),
                );
                Err(HttpFailure::Abort)
            }
        }
    }

    /// Takes the next request number. A request is numbered when the guest issues it, so
    /// that a replay numbers concurrent requests the same way whatever order they finish
    /// in: a number taken is used by [`HttpHost::send_numbered`], or by nothing if the
    /// request never gets that far (its body fails or passes the request limit), in the
    /// live run and the replay alike.
    pub fn next_seq(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Requests numbered so far (this attempt's and those an earlier attempt made): when
    /// it is not 0, a request of the call may have been applied.
    pub fn issued(&self) -> u64 {
        self.next.load(Ordering::SeqCst)
    }

    /// Numbers one request and sends it (the preview 1 path: its requests are sequential).
    pub async fn send(&self, request: OutgoingRequest) -> Result<Response, HttpFailure> {
        self.send_numbered(self.next_seq(), request).await
    }

    /// Sends request number `seq` (from [`HttpHost::next_seq`]) or answers it from the
    /// oplog, by the rules above.
    pub async fn send_numbered(
        &self,
        seq: u64,
        request: OutgoingRequest,
    ) -> Result<Response, HttpFailure> {
        self.send_as(seq, request, false).await
    }

    /// Numbers one request that has no effect of its own whatever its method (a protocol
    /// handshake: an MCP session's `initialize`), sends it or answers it from the oplog: in
    /// flight when a worker was lost, it is sent again even for a `write` tool.
    pub async fn send_handshake(&self, request: OutgoingRequest) -> Result<Response, HttpFailure> {
        self.send_as(self.next_seq(), request, true).await
    }

    /// Sends request `seq` (or answers it from the oplog) in its own span, a host call's:
    /// the request carries that span's `traceparent` when the worker traces.
    async fn send_as(
        &self,
        seq: u64,
        request: OutgoingRequest,
        no_effect: bool,
    ) -> Result<Response, HttpFailure> {
        use tracing::Instrument as _;
        let span = tracing::info_span!(
            "http_request",
            seq,
            method = %request.method.to_ascii_uppercase(),
            url = %self.secrets.redact_text(&request.url),
        );
        self.send_traced(seq, request, no_effect)
            .instrument(span)
            .await
    }

    async fn send_traced(
        &self,
        seq: u64,
        request: OutgoingRequest,
        no_effect: bool,
    ) -> Result<Response, HttpFailure> {
        if self.log.aborted().is_some() {
            return Err(HttpFailure::Abort);
        }
        if request.body.len() as u64 > self.request_limit {
            return Err(HttpFailure::Limit(
                ErrorKind::RequestLimit,
                request_limit_message(request.body.len() as u64, self.request_limit),
            ));
        }
        let method = request.method.to_ascii_uppercase();
        let body_sha = hex::encode(Sha256::digest(&request.body));
        // The request as the oplog records it (and as a replay compares it): as written,
        // secret values redacted, credential headers digested.
        let url = self.secrets.redact_text(&request.url).into_owned();
        let declared = url::Url::parse(&request.url)
            .map(|written| self.egress.declared_headers(&written))
            .unwrap_or_default();
        let (headers, digested) =
            secrets::recorded_headers(&request.headers, &declared, &self.secrets);

        if let Some(recorded) = self.log.take_http(seq) {
            let was = &recorded.request;
            if was.method != method || was.url != url || was.body_sha256 != body_sha {
                let bodies = if was.method == method && was.url == url {
                    format!(
                        " (its body's sha256 was {} and is {body_sha})",
                        was.body_sha256
                    )
                } else {
                    String::new()
                };
                self.log.abort(
                    AbortKind::Diverged,
                    format!(
                        "request {seq} was {} {} in the oplog but is {method} {url} now{bodies}",
                        was.method, was.url
                    ),
                );
                return Err(HttpFailure::Abort);
            }
            let before = secrets::credential_digests(&was.headers, &was.digested);
            let now = secrets::credential_digests(&headers, &digested);
            if before != now {
                let names = |d: &[(String, String)]| {
                    d.iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                self.log.abort(
                    AbortKind::Diverged,
                    format!(
                        "request {seq} ({method} {url}) carries other credential headers than \
                         in the oplog (by digest; recorded: [{}], now: [{}])",
                        names(&before),
                        names(&now)
                    ),
                );
                return Err(HttpFailure::Abort);
            }
            match recorded.outcome {
                Some(OplogEntry::HttpResponse(response)) => {
                    return Ok(Response {
                        status: response.status,
                        headers: response.headers,
                        body: Bytes::from(response.body),
                    });
                }
                Some(OplogEntry::HttpDenied(denied)) => {
                    return Err(denied_failure(denied.kind, denied.message));
                }
                Some(OplogEntry::HttpError(error)) => {
                    return Err(match error.limit {
                        Some(kind) => HttpFailure::Limit(kind, error.message),
                        None if error.unresolved => HttpFailure::Unresolved(error.message),
                        None => HttpFailure::Failed(error.message),
                    });
                }
                _ => {}
            }
            // Its start was committed, its outcome never was: it may have been applied.
            if !(no_effect || is_idempotent_method(&method) || self.repeatable) {
                self.log.abort(
                    AbortKind::OutcomeUnknown,
                    format!(
                        "request {seq} ({method} {url}) may have been applied before the worker was lost, \
                         and repeating it is not safe (the method is not idempotent and the tool's effect \
                         is neither read nor idempotent)"
                    ),
                );
                return Err(HttpFailure::Abort);
            }
            tracing::info!(seq, %method, %url, "re-sending an in-flight request with its idempotency key");
            self.commit().await?;
            let gate = self.gate(&request).await;
            if let Some(failure) = self.refusal(seq, &gate) {
                self.commit().await?;
                return Err(failure);
            }
            return self.transmit_to(seq, &method, &request, &url, gate).await;
        }

        if let Err(e) = url::Url::parse(&request.url) {
            return Err(HttpFailure::Invalid(format!("bad URL {url:?}: {e}")));
        }
        let gate = self.gate(&request).await;
        self.log.record(OplogEntry::HttpRequest(call::HttpRequest {
            seq,
            method: method.clone(),
            url: url.clone(),
            headers,
            digested,
            body_sha256: body_sha,
            body_bytes: request.body.len() as u64,
            idempotency_key: idempotency_key(&self.call_id, seq),
            attempt: self.attempt,
        }));
        if let Some(failure) = self.refusal(seq, &gate) {
            return Err(failure);
        }
        // Commit before the effect: nothing leaves until the start is durable.
        self.commit().await?;
        self.transmit_to(seq, &method, &request, &url, gate).await
    }

    /// Decides whether a request may leave: the egress policy must admit its destination,
    /// and the references in the headers the release declares for it must all be the
    /// call's. The URL and the tool's headers are sent as written.
    async fn gate(&self, request: &OutgoingRequest) -> Gate {
        let written = match url::Url::parse(&request.url) {
            Ok(written) => written,
            Err(e) => {
                return Gate::Refused {
                    message: format!("the URL does not parse: {e}"),
                    kind: None,
                };
            }
        };
        let declared = self.egress.declared_headers(&written);
        let headers = match self.secrets.sending_headers(&request.headers, &declared) {
            Ok(headers) => headers,
            Err(error) => {
                let kind = match error {
                    secrets::ReferenceError::TooLarge(_) => ErrorKind::RequestLimit,
                    _ => ErrorKind::UnknownSecret,
                };
                return Gate::Refused {
                    message: error.to_string(),
                    kind: Some(kind),
                };
            }
        };
        let url = request.url.clone();
        match self.egress.check(&written).await {
            Verdict::Allowed { host, addrs } => Gate::Go {
                sending: Sending { url, headers },
                host,
                addrs,
            },
            Verdict::Denied(message) => Gate::Refused {
                message: self.secrets.redact_text(&message).into_owned(),
                kind: None,
            },
            Verdict::Unresolved(message) => {
                Gate::Unresolved(self.secrets.redact_text(&message).into_owned())
            }
        }
    }

    /// Records why a request cannot go (a refusal, or a name that does not resolve).
    fn refusal(&self, seq: u64, gate: &Gate) -> Option<HttpFailure> {
        match gate {
            Gate::Refused { message, kind } => {
                self.log.record(OplogEntry::HttpDenied(call::HttpDenied {
                    seq,
                    message: message.clone(),
                    kind: *kind,
                }));
                Some(denied_failure(*kind, message.clone()))
            }
            Gate::Unresolved(reason) => {
                self.log.record(OplogEntry::HttpError(call::HttpError {
                    seq,
                    message: reason.clone(),
                    unresolved: true,
                    limit: None,
                }));
                Some(HttpFailure::Unresolved(reason.clone()))
            }
            Gate::Go { .. } => None,
        }
    }

    /// Sends to the checked addresses, records the outcome, and commits it before the guest
    /// sees it.
    async fn transmit_to(
        &self,
        seq: u64,
        method: &str,
        request: &OutgoingRequest,
        url: &str,
        gate: Gate,
    ) -> Result<Response, HttpFailure> {
        let outcome = self.exchange(seq, method, request, url, gate).await;
        match &outcome {
            Ok(response) => self
                .log
                .record(OplogEntry::HttpResponse(call::HttpResponse {
                    seq,
                    status: response.status,
                    headers: response.headers.clone(),
                    body: response.body.to_vec(),
                })),
            Err(ExchangeError::Failed(message)) => {
                self.log.record(OplogEntry::HttpError(call::HttpError {
                    seq,
                    message: message.clone(),
                    unresolved: false,
                    limit: None,
                }))
            }
            Err(ExchangeError::Limit(kind, message)) => {
                self.log.record(OplogEntry::HttpError(call::HttpError {
                    seq,
                    message: message.clone(),
                    unresolved: false,
                    limit: Some(*kind),
                }))
            }
        }
        self.commit().await?;
        outcome.map_err(|error| match error {
            ExchangeError::Failed(message) => HttpFailure::Failed(message),
            ExchangeError::Limit(kind, message) => HttpFailure::Limit(kind, message),
        })
    }

    async fn exchange(
        &self,
        seq: u64,
        method: &str,
        request: &OutgoingRequest,
        url: &str,
        gate: Gate,
    ) -> Result<Response, ExchangeError> {
        let Gate::Go {
            sending,
            host,
            addrs,
        } = gate
        else {
            return Err(ExchangeError::Failed("denied".into()));
        };
        // Messages are recorded and shown to the guest: never with a substituted value.
        let failed = |e: &reqwest::Error| self.secrets.redact_text(&describe(e)).into_owned();
        // A client per destination, pinned to exactly the addresses the policy checked.
        let client = crate::clients::for_destination(&host, &addrs)
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| format!("bad method: {e}"))?;
        let mut outgoing = client
            .request(method.clone(), &sending.url)
            .timeout(self.timeout);
        // The host call's span is the receiver's parent; a tool's own traceparent stands
        // only where the worker traces nothing.
        let traceparent = toolgrid_trace::current();
        for (name, value) in &sending.headers {
            if name.eq_ignore_ascii_case(IDEMPOTENCY_KEY)
                || name.eq_ignore_ascii_case(ATTEMPT_HEADER)
                || (traceparent.is_some() && name.eq_ignore_ascii_case(toolgrid_trace::TRACEPARENT))
            {
                continue;
            }
            outgoing = outgoing.header(name, value);
        }
        if let Some(traceparent) = traceparent {
            outgoing = outgoing.header(toolgrid_trace::TRACEPARENT, traceparent);
        }
        let response = outgoing
            .header(IDEMPOTENCY_KEY, idempotency_key(&self.call_id, seq))
            .header(ATTEMPT_HEADER, self.attempt.to_string())
            .body(request.body.clone())
            .send()
            .await
            .map_err(|e| failed(&e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                let value = String::from_utf8_lossy(v.as_bytes());
                (
                    n.as_str().to_string(),
                    self.secrets.redact_text(&value).into_owned(),
                )
            })
            .collect();
        let limit = self.response_limit;
        let too_large = |size: &str| {
            ExchangeError::Limit(
                ErrorKind::ResponseLimit,
                format!(
                    "the response body of {method} {url} is {size} bytes, more than the call's \
                     response limit of {limit} bytes (limits.responseBytes)"
                ),
            )
        };
        if let Some(declared) = response.content_length()
            && declared > limit
        {
            return Err(too_large(&declared.to_string()));
        }
        // The body is counted against the call's memory while it arrives.
        let mut held = match &self.memory {
            Some(memory) => Some(
                memory
                    .reserve(0)
                    .map_err(|e| ExchangeError::Limit(ErrorKind::MemoryLimit, e.to_string()))?,
            ),
            None => None,
        };
        let mut body = Vec::new();
        let mut response = response;
        while let Some(chunk) = response.chunk().await.map_err(|e| failed(&e))? {
            let size = body.len() as u64 + chunk.len() as u64;
            if size > limit {
                return Err(too_large(&format!("more than {size}")));
            }
            if let Some(held) = &mut held {
                held.grow(chunk.len() as u64)
                    .map_err(|e| ExchangeError::Limit(ErrorKind::MemoryLimit, e.to_string()))?;
            }
            body.extend_from_slice(&chunk);
        }
        // Every secret value is replaced by its reference before anyone sees the body; the
        // redacted body is held to the same limit (a reference can be longer than its value).
        if let std::borrow::Cow::Owned(redacted) = self.secrets.redact(&body) {
            if redacted.len() as u64 > limit {
                return Err(ExchangeError::Limit(
                    ErrorKind::ResponseLimit,
                    format!(
                        "the response body of {method} {url} is {} bytes once secret values \
                         are redacted, more than the call's response limit of {limit} bytes \
                         (limits.responseBytes)",
                        redacted.len()
                    ),
                ));
            }
            if let Some(held) = &mut held {
                held.grow(redacted.len().saturating_sub(body.len()) as u64)
                    .map_err(|e| ExchangeError::Limit(ErrorKind::MemoryLimit, e.to_string()))?;
            }
            body = redacted;
        }
        Ok(Response {
            status,
            headers,
            body: Bytes::from(body),
        })
    }
}

/// A refusal as the guest is told it: by the egress policy, or for a secret reference.
fn denied_failure(kind: Option<ErrorKind>, message: String) -> HttpFailure {
    match kind {
        Some(ErrorKind::UnknownSecret) => HttpFailure::UnknownSecret(message),
        Some(ErrorKind::RequestLimit) => HttpFailure::Limit(ErrorKind::RequestLimit, message),
        _ => HttpFailure::Denied(message),
    }
}

fn describe(error: &reqwest::Error) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        message = format!("{message}: {inner}");
        source = inner.source();
    }
    message
}

/// Why a request body of `size` bytes is refused.
pub fn request_limit_message(size: u64, limit: u64) -> String {
    format!(
        "the outgoing request body is {size} bytes, more than the call's request limit of \
         {limit} bytes (limits.requestBytes)"
    )
}
