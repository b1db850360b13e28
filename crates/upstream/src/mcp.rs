//! A client of an upstream MCP server over streamable HTTP, in both eras of the protocol:
//! the stateless 2026-07-28 revision (every request carries its protocol version and
//! capabilities in `_meta`, with the `MCP-Protocol-Version` and `Mcp-Method` headers) and
//! the session-based revisions up to 2025-11-25 (`initialize`, `Mcp-Session-Id`).
//! [`Era::Auto`] tries 2026-07-28 first and falls back to a session when the server does
//! not take it, as the dual-era rules say. A result without `resultType` is complete.
//!
//! Answers may be JSON or an event stream; either is read up to
//! [`McpLimits::max_response_bytes`], and a listing follows at most
//! [`McpLimits::max_pages`] cursors. The configured headers (credentials from a Secret) are
//! sent with every request and never logged or put in an error.

use crate::egress::{self, EgressError, EgressPolicy};
use serde_json::{Value, json};
use std::time::Duration;
use toolgrid_core::secret::SecretValue;

/// The stateless revision.
pub const MODERN_VERSION: &str = "2026-07-28";
/// The session revision asked for in `initialize`.
pub const LEGACY_VERSION: &str = "2025-11-25";
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";

/// Which era to speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Era {
    /// 2026-07-28 first, a session when the server does not take it.
    #[default]
    Auto,
    Modern,
    Legacy,
}

/// Bounds on what a server can make the client read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McpLimits {
    pub max_response_bytes: usize,
    pub max_pages: usize,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Default for McpLimits {
    fn default() -> Self {
        McpLimits {
            max_response_bytes: 16 << 20,
            max_pages: 100,
            timeout: Duration::from_secs(30),
        }
    }
}

/// An upstream MCP server: its URL, the headers sent with every request, and what its
/// egress allows.
#[derive(Clone)]
pub struct McpServer {
    pub url: String,
    pub headers: Vec<(String, SecretValue)>,
    pub egress: EgressPolicy,
    pub era: Era,
    pub limits: McpLimits,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("url", &self.url)
            .field(
                "headers",
                &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("egress", &self.egress)
            .field("era", &self.era)
            .finish()
    }
}

/// Why a server could not be listed or called.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error(transparent)]
    Egress(#[from] EgressError),
    #[error("{method}: {message}")]
    Transport { method: String, message: String },
    #[error("{method}: no answer within the time allowed")]
    Timeout { method: String },
    #[error("{method}: the server answered HTTP {status}")]
    Status { method: String, status: u16 },
    #[error("{method}: the answer is larger than {limit} bytes")]
    TooLarge { method: String, limit: usize },
    #[error("{method}: the answer is not a JSON-RPC response: {message}")]
    Garbage { method: String, message: String },
    #[error("{method}: error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    #[error("tools/list: more than {0} pages")]
    TooManyPages(usize),
}

/// What a listing found.
#[derive(Clone, Debug, PartialEq)]
pub struct Listing {
    /// The era the server was spoken to in.
    pub era: Era,
    /// The protocol version in use.
    pub version: String,
    /// Every `tools` entry of every page, in order.
    pub tools: Vec<Value>,
}

/// One connection's state: the client, and in the legacy era the session.
struct Conversation<'a> {
    server: &'a McpServer,
    url: url::Url,
    http: reqwest::Client,
    era: Era,
    version: String,
    session: Option<String>,
    next_id: u64,
}

impl McpServer {
    /// Every tool the server lists (following `nextCursor`).
    pub async fn list_tools(&self) -> Result<Listing, McpError> {
        let mut conversation = self.open().await?;
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let result = async {
            for _ in 0..self.limits.max_pages {
                let params = match &cursor {
                    Some(cursor) => json!({"cursor": cursor}),
                    None => json!({}),
                };
                let page = conversation.request("tools/list", params, None).await?;
                if let Some(listed) = page.get("tools").and_then(Value::as_array) {
                    tools.extend(listed.iter().cloned());
                } else {
                    return Err(McpError::Garbage {
                        method: "tools/list".into(),
                        message: "the result has no `tools` array".into(),
                    });
                }
                cursor = page
                    .get("nextCursor")
                    .and_then(Value::as_str)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string);
                if cursor.is_none() {
                    return Ok(());
                }
            }
            Err(McpError::TooManyPages(self.limits.max_pages))
        }
        .await;
        conversation.close().await;
        result?;
        Ok(Listing {
            era: conversation.era,
            version: conversation.version.clone(),
            tools,
        })
    }

    /// Calls `tool` with `arguments`, `meta` as the request's `_meta` (toolgrid puts the
    /// call's idempotency key there): the `tools/call` result (`content`,
    /// `structuredContent`, `isError`).
    pub async fn call_tool(
        &self,
        tool: &str,
        arguments: Value,
        meta: serde_json::Map<String, Value>,
    ) -> Result<Value, McpError> {
        let mut conversation = self.open().await?;
        let mut params = json!({"name": tool, "arguments": arguments});
        if !meta.is_empty() {
            params["_meta"] = Value::Object(meta);
        }
        let result = conversation.request("tools/call", params, Some(tool)).await;
        conversation.close().await;
        result
    }

    /// A conversation in the era the server takes.
    async fn open(&self) -> Result<Conversation<'_>, McpError> {
        let url = egress::parse(&self.url, self.egress)?;
        let http = egress::client_for(&url, self.egress, self.limits.timeout).await?;
        let mut conversation = Conversation {
            server: self,
            url,
            http,
            era: Era::Modern,
            version: MODERN_VERSION.into(),
            session: None,
            next_id: 1,
        };
        match self.era {
            Era::Modern => Ok(conversation),
            Era::Legacy => {
                conversation.initialize().await?;
                Ok(conversation)
            }
            Era::Auto => {
                // A server of the stateless revision answers `server/discover`; one that
                // only holds sessions refuses a request outside a session.
                match conversation
                    .request("server/discover", json!({}), None)
                    .await
                {
                    Ok(_) => Ok(conversation),
                    Err(McpError::Egress(e)) => Err(e.into()),
                    Err(modern) => {
                        tracing::debug!(url = %self.url, error = %modern, "the server does not take 2026-07-28; opening a session");
                        conversation.initialize().await?;
                        Ok(conversation)
                    }
                }
            }
        }
    }
}

impl Conversation<'_> {
    /// Opens a legacy session.
    async fn initialize(&mut self) -> Result<(), McpError> {
        self.era = Era::Legacy;
        self.version = LEGACY_VERSION.into();
        let result = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": LEGACY_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "toolgrid", "version": env!("CARGO_PKG_VERSION")},
                }),
                None,
            )
            .await?;
        if let Some(version) = result.get("protocolVersion").and_then(Value::as_str) {
            self.version = version.to_string();
        }
        self.notify("notifications/initialized").await
    }

    /// Ends a legacy session (best effort).
    async fn close(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = self
                .with_headers(self.http.delete(self.url.clone()))
                .header("mcp-session-id", session)
                .send()
                .await;
        }
    }

    fn with_headers(&self, mut request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        for (name, value) in &self.server.headers {
            if let Some(value) = value.expose_str() {
                request = request.header(name.as_str(), value);
            }
        }
        request
    }

    async fn notify(&mut self, method: &str) -> Result<(), McpError> {
        let body = json!({"jsonrpc": "2.0", "method": method});
        let response = self.post(method, &body, None).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(McpError::Status {
                method: method.into(),
                status: status.as_u16(),
            });
        }
        Ok(())
    }

    async fn post(
        &self,
        method: &str,
        body: &Value,
        name: Option<&str>,
    ) -> Result<reqwest::Response, McpError> {
        let mut request = self
            .with_headers(self.http.post(self.url.clone()))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", self.version.as_str());
        if self.era == Era::Modern {
            request = request.header("mcp-method", method);
            if let Some(name) = name {
                request = request.header("mcp-name", name);
            }
        }
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session.as_str());
        }
        request
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| transport(method, &e))
    }

    /// Sends one request and reads its result.
    async fn request(
        &mut self,
        method: &str,
        mut params: Value,
        name: Option<&str>,
    ) -> Result<Value, McpError> {
        let id = self.next_id;
        self.next_id += 1;
        if self.era == Era::Modern {
            let meta = params
                .as_object_mut()
                .map(|p| p.entry("_meta").or_insert_with(|| json!({})));
            if let Some(Value::Object(meta)) = meta {
                meta.insert(META_PROTOCOL_VERSION.into(), json!(MODERN_VERSION));
                meta.insert(META_CLIENT_CAPABILITIES.into(), json!({}));
                meta.insert(
                    META_CLIENT_INFO.into(),
                    json!({"name": "toolgrid", "version": env!("CARGO_PKG_VERSION")}),
                );
            }
        }
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut response = self.post(method, &body, name).await?;
        let status = response.status();
        if method == "initialize"
            && let Some(session) = response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
        {
            self.session = Some(session.to_string());
        }
        let is_stream = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let limit = self.server.limits.max_response_bytes;
        let mut bytes = Vec::new();
        let mut answer = None;
        while let Some(chunk) = response.chunk().await.map_err(|e| transport(method, &e))? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > limit {
                return Err(McpError::TooLarge {
                    method: method.into(),
                    limit,
                });
            }
            // A stream stays open after the answer: stop at the answer.
            if is_stream && let Some(found) = answer_in_stream(&bytes, id) {
                answer = Some(found);
                break;
            }
        }
        let answer = match answer {
            Some(answer) => answer,
            None if is_stream => {
                return Err(McpError::Garbage {
                    method: method.into(),
                    message: "the event stream ended without the answer".into(),
                });
            }
            None => {
                if !status.is_success() && serde_json::from_slice::<Value>(&bytes).is_err() {
                    return Err(McpError::Status {
                        method: method.into(),
                        status: status.as_u16(),
                    });
                }
                serde_json::from_slice(&bytes).map_err(|e| McpError::Garbage {
                    method: method.into(),
                    message: e.to_string(),
                })?
            }
        };
        result_of(method, answer, status.as_u16())
    }
}

/// The JSON-RPC body of a stateless (2026-07-28) `tools/call` of `tool` with `arguments`,
/// request id 1, `meta` added to the envelope's `_meta`: one self-contained request, which
/// the worker's runner sends (and records, and replays) as one HTTP exchange.
pub fn stateless_call_body(
    tool: &str,
    arguments: Value,
    meta: serde_json::Map<String, Value>,
) -> Value {
    let mut envelope = serde_json::Map::from_iter([
        (META_PROTOCOL_VERSION.to_string(), json!(MODERN_VERSION)),
        (META_CLIENT_CAPABILITIES.to_string(), json!({})),
        (
            META_CLIENT_INFO.to_string(),
            json!({"name": "toolgrid", "version": env!("CARGO_PKG_VERSION")}),
        ),
    ]);
    envelope.extend(meta);
    json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": envelope},
    })
}

/// Why a `tools/call` result is not a value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolOutcomeError {
    /// The tool reported an error (`isError`): its text.
    #[error("{0}")]
    Failed(String),
    /// A 2026-07-28 result that is not complete (it asks for input, say), which a call
    /// made for an agent cannot answer.
    #[error("the upstream answered a result of type {0:?}, not a complete one")]
    Incomplete(String),
}

/// Longest error text kept from an upstream.
const MAX_ERROR_TEXT: usize = 4096;

/// What a `tools/call` result means for the call: the structured content if the tool gave
/// one, else `{"content": [...]}`; the tool's error text when `isError`. A result without
/// `resultType` is complete.
pub fn outcome_of(result: &Value) -> Result<Value, ToolOutcomeError> {
    if let Some(kind) = result.get("resultType").and_then(Value::as_str)
        && kind != "complete"
    {
        return Err(ToolOutcomeError::Incomplete(
            toolgrid_core::source::cut_text(kind, 64).to_string(),
        ));
    }
    let content = result
        .get("content")
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    if result.get("isError") == Some(&Value::Bool(true)) {
        let text: Vec<&str> = content
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i.get("text").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        let text = if text.is_empty() {
            "the upstream tool failed without a message".to_string()
        } else {
            text.join("\n")
        };
        return Err(ToolOutcomeError::Failed(
            toolgrid_core::source::cut_text(&text, MAX_ERROR_TEXT).to_string(),
        ));
    }
    Ok(match result.get("structuredContent") {
        Some(structured) if !structured.is_null() => structured.clone(),
        _ => json!({"content": content}),
    })
}

/// The JSON-RPC answer to `id` in the (possibly partial) event stream `bytes`, if it has
/// arrived.
pub fn answer_in_stream(bytes: &[u8], id: u64) -> Option<Value> {
    let text = String::from_utf8_lossy(bytes);
    let text = text.replace("\r\n", "\n");
    // Only complete events (ended by a blank line) count.
    let complete = match text.rfind("\n\n") {
        Some(end) => &text[..end],
        None => return None,
    };
    for event in complete.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        if let Ok(message) = serde_json::from_str::<Value>(&data.join("\n"))
            && message.get("id").and_then(Value::as_u64) == Some(id)
        {
            return Some(message);
        }
    }
    None
}

/// The `result` of a JSON-RPC answer, or its error.
pub fn result_of(method: &str, answer: Value, status: u16) -> Result<Value, McpError> {
    if let Some(error) = answer.get("error") {
        return Err(McpError::Rpc {
            method: method.into(),
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .map(|m| toolgrid_core::source::cut_text(m, 1024).to_string())
                .unwrap_or_default(),
        });
    }
    if !(200..300).contains(&status) {
        return Err(McpError::Status {
            method: method.into(),
            status,
        });
    }
    match answer.get("result") {
        Some(result @ Value::Object(_)) => Ok(result.clone()),
        _ => Err(McpError::Garbage {
            method: method.into(),
            message: "no `result` object".into(),
        }),
    }
}

/// A failed exchange: a timeout, or another transport error.
fn transport(method: &str, error: &reqwest::Error) -> McpError {
    if error.is_timeout() {
        McpError::Timeout {
            method: method.into(),
        }
    } else {
        McpError::Transport {
            method: method.into(),
            message: without_url(error),
        }
    }
}

/// A reqwest error's text without the URL (which the caller names anyway).
fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "<upstream>");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_found_in_a_stream_once_complete() {
        let partial = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"res";
        assert_eq!(answer_in_stream(partial, 3), None);
        let stream = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
                       event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n\
                       data: {\"jsonrpc\":\"2.0\",\"id\":3,\r\ndata: \"result\":{\"ok\":true}}\r\n\r\n";
        assert_eq!(
            answer_in_stream(stream, 3),
            Some(json!({"jsonrpc": "2.0", "id": 3, "result": {"ok": true}}))
        );
    }

    #[test]
    fn errors_and_missing_results_are_named() {
        assert!(matches!(
            result_of(
                "tools/call",
                json!({"id": 1, "error": {"code": -32602, "message": "no such tool"}}),
                200
            ),
            Err(McpError::Rpc { code: -32602, .. })
        ));
        assert!(matches!(
            result_of("tools/list", json!({"id": 1}), 200),
            Err(McpError::Garbage { .. })
        ));
        assert!(matches!(
            result_of("tools/list", json!({"id": 1, "result": {}}), 500),
            Err(McpError::Status { status: 500, .. })
        ));
    }

    #[test]
    fn a_call_result_is_a_value_or_the_tools_error() {
        assert_eq!(
            outcome_of(
                &json!({"content": [{"type": "text", "text": "5"}], "structuredContent": {"sum": 5}})
            ),
            Ok(json!({"sum": 5}))
        );
        assert_eq!(
            outcome_of(&json!({"content": [{"type": "text", "text": "hi"}]})),
            Ok(json!({"content": [{"type": "text", "text": "hi"}]}))
        );
        assert_eq!(
            outcome_of(
                &json!({"isError": true, "content": [{"type": "text", "text": "upstream refused"}], "resultType": "complete"})
            ),
            Err(ToolOutcomeError::Failed("upstream refused".into()))
        );
        assert_eq!(
            outcome_of(
                &json!({"isError": true, "content": [{"type": "text", "text": "x".repeat(10_000)}]})
            ),
            Err(ToolOutcomeError::Failed("x".repeat(MAX_ERROR_TEXT)))
        );
        assert_eq!(
            outcome_of(&json!({"resultType": "input_required"})),
            Err(ToolOutcomeError::Incomplete("input_required".into()))
        );
    }

    #[test]
    fn debug_shows_no_header_value() {
        let server = McpServer {
            url: "https://mcp.example.com/mcp".into(),
            headers: vec![("authorization".into(), SecretValue::new("Bearer s3cr3t"))],
            egress: EgressPolicy::default(),
            era: Era::Auto,
            limits: McpLimits::default(),
        };
        let shown = format!("{server:?}");
        assert!(
            shown.contains("authorization") && !shown.contains("s3cr3t"),
            "{shown}"
        );
    }
}
