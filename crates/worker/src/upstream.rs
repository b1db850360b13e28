//! The runner of an imported tool's call (a ToolSource's MCP tool or OpenAPI operation):
//! instead of a wasm instance, one HTTP exchange made through the call's [`HttpHost`], so
//! it gets what every outgoing request of a wasm tool gets: the request is committed to
//! the oplog before it leaves, carries the call's stable `Idempotency-Key`, passes the
//! egress rules, its response is recorded and, on a replay after a failover, answered from
//! the oplog instead of sent again; a request whose start was committed but whose answer
//! never was is sent again only when the tool's effect allows it (`read`, `idempotent`),
//! else the call fails as outcome-unknown.
//!
//! An MCP tool is called with one stateless 2026-07-28 `tools/call` (its idempotency key
//! also in `_meta` as `toolgrid/idempotencyKey`); its answer's `isError` is the tool's
//! error. An OpenAPI operation's request is built from the call's arguments; a non-2xx
//! answer is the tool's error.

use bytes::Bytes;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use toolgrid_core::error::ErrorKind;
use toolgrid_core::source::{HttpOperation, McpEra, UpstreamCall, UpstreamTarget, cut_text};
use toolgrid_sandbox::exchange::Exchanged;
use toolgrid_sandbox::http::{HttpFailure, HttpHost, OutgoingRequest, idempotency_key};
use toolgrid_sandbox::runtime::Failure;
use toolgrid_upstream::http::{RequestError, build_request};
use toolgrid_upstream::mcp::{
    LEGACY_VERSION, MODERN_VERSION, ToolOutcomeError, answer_in_stream, outcome_of, result_of,
    stateless_call_body,
};

/// The `_meta` key an MCP upstream finds the call's idempotency key under.
pub const MCP_IDEMPOTENCY_META: &str = "toolgrid/idempotencyKey";
/// Longest error text kept from an upstream's answer.
const MAX_ERROR_TEXT: usize = 4096;

/// Why an imported tool's call did not produce a value.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamRunError {
    /// The upstream tool reported an error (MCP `isError`, a non-2xx answer): its text.
    #[error("{0}")]
    ToolFailed(String),
    /// The arguments do not make a request (a missing required argument, say).
    #[error(transparent)]
    Arguments(#[from] RequestError),
    /// The answer is not what the protocol says.
    #[error("the upstream's answer is not understood: {0}")]
    Garbage(String),
    /// The exchange itself failed, was refused, or the run must stop (see the host log).
    #[error("{0:?}")]
    Http(HttpFailure),
}

/// Makes the call `upstream` describes with `arguments` through `host`: what the worker
/// runs instead of a wasm instance for an imported tool.
pub async fn exchange(
    host: Arc<HttpHost>,
    call_id: String,
    upstream: UpstreamCall,
    arguments: Map<String, Value>,
) -> Exchanged {
    let outcome = match &upstream.target {
        UpstreamTarget::Mcp { tool } => {
            let (url, arguments) = (&upstream.endpoint, Value::Object(arguments));
            if upstream.era == Some(McpEra::Legacy) {
                call_mcp_session(&host, &call_id, url, tool, arguments).await
            } else {
                call_mcp(&host, &call_id, url, tool, arguments).await
            }
        }
        UpstreamTarget::Http(operation) => {
            call_http(&host, operation, &upstream.endpoint, &arguments).await
        }
    };
    match outcome {
        Ok(value) => Exchanged::Value(Bytes::from(value.to_string())),
        Err(UpstreamRunError::ToolFailed(text)) => Exchanged::ToolError(text),
        Err(UpstreamRunError::Arguments(error)) => Exchanged::Failed(Failure {
            kind: ErrorKind::InvalidArgument,
            message: error.to_string(),
        }),
        Err(UpstreamRunError::Garbage(message)) => Exchanged::Failed(Failure {
            kind: ErrorKind::InvalidResult,
            message: format!("the upstream's answer is not understood: {message}"),
        }),
        Err(UpstreamRunError::Http(failure)) => Exchanged::Http(failure),
    }
}

/// Calls the MCP tool `tool` of a server that holds sessions (2025-11-25 and before):
/// `initialize`, `notifications/initialized`, then `tools/call` in the session, each an
/// exchange of the call's host (so a replay answers the whole conversation from the oplog).
pub async fn call_mcp_session(
    host: &HttpHost,
    call_id: &str,
    url: &str,
    tool: &str,
    arguments: Value,
) -> Result<Value, UpstreamRunError> {
    let post = |body: Value, session: Option<&str>, version: &str| {
        let mut headers = vec![
            ("content-type".to_string(), "application/json".to_string()),
            (
                "accept".to_string(),
                "application/json, text/event-stream".to_string(),
            ),
            ("mcp-protocol-version".to_string(), version.to_string()),
        ];
        if let Some(session) = session {
            headers.push(("mcp-session-id".into(), session.to_string()));
        }
        OutgoingRequest {
            method: "POST".into(),
            url: url.to_string(),
            headers,
            body: Bytes::from(body.to_string()),
        }
    };
    let initialize = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "toolgrid", "version": env!("CARGO_PKG_VERSION")},
        },
    });
    // The handshake has no effect of its own: in flight on a lost worker, it is sent again.
    let response = host
        .send_handshake(post(initialize, None, LEGACY_VERSION))
        .await
        .map_err(UpstreamRunError::Http)?;
    let session = response
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("mcp-session-id"))
        .map(|(_, value)| value.clone());
    let initialized = result_of("initialize", answer_of(&response, 1)?, response.status)
        .map_err(|e| UpstreamRunError::Garbage(e.to_string()))?;
    let version = initialized
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or(LEGACY_VERSION)
        .to_string();
    let notified = host
        .send_handshake(post(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            session.as_deref(),
            &version,
        ))
        .await
        .map_err(UpstreamRunError::Http)?;
    if !(200..300).contains(&notified.status) {
        return Err(UpstreamRunError::Garbage(format!(
            "notifications/initialized answered HTTP {}",
            notified.status
        )));
    }
    let seq = host.next_seq();
    let call = json!({
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {MCP_IDEMPOTENCY_META: idempotency_key(call_id, seq)},
        },
    });
    let response = host
        .send_numbered(seq, post(call, session.as_deref(), &version))
        .await
        .map_err(UpstreamRunError::Http)?;
    tool_outcome(answer_of(&response, 2)?, response.status)
}

/// The JSON-RPC answer with `id` in a response (an event stream, or one JSON document).
fn answer_of(
    response: &toolgrid_sandbox::http::Response,
    id: u64,
) -> Result<Value, UpstreamRunError> {
    answer_in_stream(&response.body, id)
        .or_else(|| serde_json::from_slice(&response.body).ok())
        .ok_or_else(|| {
            UpstreamRunError::Garbage(format!(
                "HTTP {}: {}",
                response.status,
                cut_text(&String::from_utf8_lossy(&response.body), 256)
            ))
        })
}

/// A `tools/call` answer as the call's value, or the tool's error.
fn tool_outcome(answer: Value, status: u16) -> Result<Value, UpstreamRunError> {
    let result = result_of("tools/call", answer, status)
        .map_err(|e| UpstreamRunError::Garbage(e.to_string()))?;
    outcome_of(&result).map_err(|error| match error {
        ToolOutcomeError::Failed(text) => UpstreamRunError::ToolFailed(text),
        incomplete @ ToolOutcomeError::Incomplete(_) => {
            UpstreamRunError::Garbage(incomplete.to_string())
        }
    })
}

/// Calls the MCP tool `tool` at `url` with `arguments`.
pub async fn call_mcp(
    host: &HttpHost,
    call_id: &str,
    url: &str,
    tool: &str,
    arguments: Value,
) -> Result<Value, UpstreamRunError> {
    let seq = host.next_seq();
    let meta = Map::from_iter([(
        MCP_IDEMPOTENCY_META.to_string(),
        json!(idempotency_key(call_id, seq)),
    )]);
    let body = stateless_call_body(tool, arguments, meta);
    let request = OutgoingRequest {
        method: "POST".into(),
        url: url.to_string(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            (
                "accept".into(),
                "application/json, text/event-stream".into(),
            ),
            ("mcp-protocol-version".into(), MODERN_VERSION.into()),
            ("mcp-method".into(), "tools/call".into()),
            ("mcp-name".into(), tool.to_string()),
        ],
        body: Bytes::from(body.to_string()),
    };
    let response = host
        .send_numbered(seq, request)
        .await
        .map_err(UpstreamRunError::Http)?;
    tool_outcome(answer_of(&response, 1)?, response.status)
}

/// Calls the OpenAPI `operation` under `base_url` with `args`: the answer's JSON body (its
/// text as a string when it is not JSON, `null` when empty) on 2xx, else the tool's error.
pub async fn call_http(
    host: &HttpHost,
    operation: &HttpOperation,
    base_url: &str,
    args: &Map<String, Value>,
) -> Result<Value, UpstreamRunError> {
    let built = build_request(operation, base_url, args)?;
    let mut headers = built.headers;
    headers.push(("accept".into(), "application/json".into()));
    let body = match built.body {
        Some((content_type, body)) => {
            headers.push(("content-type".into(), content_type));
            Bytes::from(body)
        }
        None => Bytes::new(),
    };
    let response = host
        .send(OutgoingRequest {
            method: built.method.as_str().into(),
            url: built.url.to_string(),
            headers,
            body,
        })
        .await
        .map_err(UpstreamRunError::Http)?;
    let text = String::from_utf8_lossy(&response.body);
    if !(200..300).contains(&response.status) {
        return Err(UpstreamRunError::ToolFailed(format!(
            "HTTP {}: {}",
            response.status,
            cut_text(text.trim(), MAX_ERROR_TEXT)
        )));
    }
    if response.body.is_empty() {
        return Ok(Value::Null);
    }
    Ok(serde_json::from_slice(&response.body).unwrap_or_else(|_| Value::String(text.into_owned())))
}
