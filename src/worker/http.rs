//! Outgoing HTTP from tools, exactly once.
//!
//! Every request is numbered within its call. Before it leaves the sandbox its start is
//! recorded and committed (with every entry buffered before it) and the control plane has
//! acknowledged it; it carries an `Idempotency-Key` derived from the call and its number;
//! its response is recorded and committed before the guest sees it. A re-run of the call
//! (replay) answers recorded requests from the oplog; a request whose start was committed
//! but whose response was not is sent again only when that is safe (an idempotent method, or
//! a `read`/`idempotent` tool), with the same key; otherwise the call ends `outcome-unknown`.

use super::egress::{Egress, Verdict};
use super::limits::CallMemory;
use super::link::AppendError;
use super::recorder::{AbortKind, HTTP_DENIED, HTTP_ERROR, HTTP_REQUEST, HTTP_RESPONSE, HostLog};
use crate::error::ErrorKind;
use crate::store::NewEntry;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Commits oplog entries and waits until they are durable.
#[async_trait::async_trait]
pub trait OplogSink: Send + Sync {
    async fn append(&self, entries: Vec<NewEntry>) -> Result<(), AppendError>;
}

/// The header every outgoing request carries.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Which attempt of the call sent the request (informational).
pub const ATTEMPT_HEADER: &str = "toolgrid-attempt";

/// Largest response body recorded unless [`HttpHost::with_limits`] says otherwise.
const MAX_RESPONSE_BYTES: u64 = crate::store::MAX_RESPONSE_BYTES;

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

/// Kinds a recorded `http-error` may name as its message's prefix (`<kind>: ...`): a limit
/// the response hit, which a replay reports the same way.
const LIMIT_KINDS: [ErrorKind; 2] = [ErrorKind::ResponseLimit, ErrorKind::MemoryLimit];

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
    /// Largest request body sent.
    request_limit: u64,
    /// Largest response body received.
    response_limit: u64,
    /// Where a response being read is counted while it arrives.
    memory: Option<Arc<CallMemory>>,
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
            request_limit: u64::MAX,
            response_limit: MAX_RESPONSE_BYTES,
            memory: None,
        }
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
    async fn commit(&self) -> Result<(), HttpFailure> {
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
                    AbortKind::Fenced,
                    format!("the control plane did not acknowledge a commit: {why}"),
                );
                Err(HttpFailure::Abort)
            }
        }
    }

    /// Sends one request (or answers it from the oplog), by the rules above.
    pub async fn send(&self, request: OutgoingRequest) -> Result<Response, HttpFailure> {
        if self.log.aborted().is_some() {
            return Err(HttpFailure::Abort);
        }
        if request.body.len() as u64 > self.request_limit {
            return Err(HttpFailure::Limit(
                ErrorKind::RequestLimit,
                request_limit_message(request.body.len() as u64, self.request_limit),
            ));
        }
        let seq = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let method = request.method.to_ascii_uppercase();
        let body_sha = hex::encode(Sha256::digest(&request.body));

        if let Some(recorded) = self.log.take_http(seq) {
            let same = recorded.request.get("method").and_then(Value::as_str)
                == Some(method.as_str())
                && recorded.request.get("url").and_then(Value::as_str)
                    == Some(request.url.as_str())
                && recorded.request.get("bodySha256").and_then(Value::as_str)
                    == Some(body_sha.as_str());
            if !same {
                self.log.abort(
                    AbortKind::Diverged,
                    format!(
                        "request {seq} was {} {} in the oplog but is {method} {} now",
                        recorded
                            .request
                            .get("method")
                            .and_then(Value::as_str)
                            .unwrap_or("?"),
                        recorded
                            .request
                            .get("url")
                            .and_then(Value::as_str)
                            .unwrap_or("?"),
                        request.url
                    ),
                );
                return Err(HttpFailure::Abort);
            }
            match recorded.outcome {
                Some(entry) if entry.kind == HTTP_RESPONSE => return response_of(&entry.payload),
                Some(entry) if entry.kind == HTTP_DENIED => {
                    return Err(HttpFailure::Denied(message_of(&entry.payload)));
                }
                Some(entry) if entry.kind == HTTP_ERROR => {
                    let message = message_of(&entry.payload);
                    if let Some((kind, message)) = limit_of(&message) {
                        return Err(HttpFailure::Limit(kind, message.to_string()));
                    }
                    return Err(
                        if entry.payload.get("unresolved") == Some(&Value::Bool(true)) {
                            HttpFailure::Unresolved(message)
                        } else {
                            HttpFailure::Failed(message)
                        },
                    );
                }
                _ => {}
            }
            // Its start was committed, its outcome never was: it may have been applied.
            if !(is_idempotent_method(&method) || self.repeatable) {
                self.log.abort(
                    AbortKind::OutcomeUnknown,
                    format!(
                        "request {seq} ({method} {}) may have been applied before the worker was lost, \
                         and repeating it is not safe (the method is not idempotent and the tool's effect \
                         is neither read nor idempotent)",
                        request.url
                    ),
                );
                return Err(HttpFailure::Abort);
            }
            tracing::info!(seq, %method, url = %request.url, "re-sending an in-flight request with its idempotency key");
            self.commit().await?;
            return self.transmit(seq, &method, &request).await;
        }

        let url = url::Url::parse(&request.url)
            .map_err(|e| HttpFailure::Invalid(format!("bad URL {:?}: {e}", request.url)))?;
        let verdict = self.egress.check(&url).await;
        self.log.record(
            HTTP_REQUEST,
            json!({
                "seq": seq,
                "method": method,
                "url": request.url,
                "headers": request.headers,
                "bodySha256": body_sha,
                "bodyBytes": request.body.len(),
                "idempotencyKey": idempotency_key(&self.call_id, seq),
                "attempt": self.attempt,
            }),
        );
        if let Some(failure) = self.refusal(seq, &verdict) {
            return Err(failure);
        }
        // Commit before the effect: nothing leaves until the start is durable.
        self.commit().await?;
        self.transmit_to(seq, &method, &request, verdict).await
    }

    async fn transmit(
        &self,
        seq: u64,
        method: &str,
        request: &OutgoingRequest,
    ) -> Result<Response, HttpFailure> {
        let url = url::Url::parse(&request.url).map_err(|e| HttpFailure::Invalid(e.to_string()))?;
        let verdict = self.egress.check(&url).await;
        if let Some(failure) = self.refusal(seq, &verdict) {
            self.commit().await?;
            return Err(failure);
        }
        self.transmit_to(seq, method, request, verdict).await
    }

    /// Records why a request cannot go (a policy refusal, or a name that does not resolve).
    fn refusal(&self, seq: u64, verdict: &Verdict) -> Option<HttpFailure> {
        match verdict {
            Verdict::Denied(reason) => {
                self.log
                    .record(HTTP_DENIED, json!({ "seq": seq, "message": reason }));
                Some(HttpFailure::Denied(reason.clone()))
            }
            Verdict::Unresolved(reason) => {
                self.log.record(
                    HTTP_ERROR,
                    json!({ "seq": seq, "message": reason, "unresolved": true }),
                );
                Some(HttpFailure::Unresolved(reason.clone()))
            }
            Verdict::Allowed { .. } => None,
        }
    }

    /// Sends to the checked addresses, records the outcome, and commits it before the guest
    /// sees it.
    async fn transmit_to(
        &self,
        seq: u64,
        method: &str,
        request: &OutgoingRequest,
        verdict: Verdict,
    ) -> Result<Response, HttpFailure> {
        let outcome = self.exchange(seq, method, request, verdict).await;
        match &outcome {
            Ok(response) => self.log.record(
                HTTP_RESPONSE,
                json!({
                    "seq": seq,
                    "status": response.status,
                    "headers": response.headers,
                    "bodyBase64": base64::engine::general_purpose::STANDARD.encode(&response.body),
                }),
            ),
            Err(ExchangeError::Failed(message)) => self
                .log
                .record(HTTP_ERROR, json!({ "seq": seq, "message": message })),
            Err(ExchangeError::Limit(kind, message)) => self.log.record(
                HTTP_ERROR,
                json!({ "seq": seq, "message": format!("{kind}: {message}") }),
            ),
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
        verdict: Verdict,
    ) -> Result<Response, ExchangeError> {
        let Verdict::Allowed { host, addrs } = verdict else {
            return Err(ExchangeError::Failed("denied".into()));
        };
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(self.timeout);
        if host.parse::<std::net::IpAddr>().is_err() {
            // Connect to exactly the addresses the policy checked.
            builder = builder.resolve_to_addrs(&host, &addrs);
        }
        let client = builder
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| format!("bad method: {e}"))?;
        let mut outgoing = client.request(method.clone(), &request.url);
        for (name, value) in &request.headers {
            if name.eq_ignore_ascii_case(IDEMPOTENCY_KEY)
                || name.eq_ignore_ascii_case(ATTEMPT_HEADER)
            {
                continue;
            }
            outgoing = outgoing.header(name, value);
        }
        let response = outgoing
            .header(IDEMPOTENCY_KEY, idempotency_key(&self.call_id, seq))
            .header(ATTEMPT_HEADER, self.attempt.to_string())
            .body(request.body.clone())
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let limit = self.response_limit;
        let too_large = |size: &str| {
            ExchangeError::Limit(
                ErrorKind::ResponseLimit,
                format!(
                    "the response body of {method} {} is {size} bytes, more than the call's \
                     response limit of {limit} bytes (limits.responseBytes)",
                    request.url
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
        while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e))? {
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
        Ok(Response {
            status,
            headers,
            body: Bytes::from(body),
        })
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

/// The limit a recorded `http-error` message names, if it names one.
fn limit_of(message: &str) -> Option<(ErrorKind, &str)> {
    let (kind, rest) = message.split_once(": ")?;
    let kind = LIMIT_KINDS.into_iter().find(|k| k.as_str() == kind)?;
    Some((kind, rest))
}

fn message_of(payload: &Value) -> String {
    payload
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn response_of(payload: &Value) -> Result<Response, HttpFailure> {
    let status = payload.get("status").and_then(Value::as_u64).unwrap_or(0) as u16;
    let headers = payload
        .get("headers")
        .and_then(|h| serde_json::from_value::<Vec<(String, String)>>(h.clone()).ok())
        .unwrap_or_default();
    let body = payload
        .get("bodyBase64")
        .and_then(Value::as_str)
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_default();
    Ok(Response {
        status,
        headers,
        body: Bytes::from(body),
    })
}
