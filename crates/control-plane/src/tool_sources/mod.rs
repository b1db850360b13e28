//! Reading a ToolSource's offer: the IO step of its reconcile. An MCP server is listed
//! (`toolgrid_upstream::mcp`), an OpenAPI document fetched through checked egress or taken
//! as given (from a ConfigMap or a file, read by the caller), and what was read becomes a
//! [`SourceSnapshot`] by the catalog's pure readers. Whatever the upstream does (is down,
//! is slow, answers garbage, answers too much) the reconcile gets a [`SourceFailure`] with
//! a named [`FailureReason`], for the source's `Ready=False` condition; one source failing
//! touches no other tool.

pub mod reader;

use std::collections::BTreeMap;
use std::time::Duration;
use toolgrid_catalog::sources::{mcp::read_mcp_tools, openapi};
use toolgrid_core::source::{McpEra, SourceLimits, SourceSnapshot, ToolFilter};
use toolgrid_core::spec::Effect;
use toolgrid_upstream::egress::{EgressError, EgressPolicy};
use toolgrid_upstream::http::{FetchError, fetch_document};
use toolgrid_upstream::mcp::{McpError, McpServer};

/// The largest OpenAPI document fetched.
pub const MAX_DOCUMENT_BYTES: usize = 16 << 20;
/// How long fetching a document may take.
pub const DOCUMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where an OpenAPI document comes from.
#[derive(Clone, Debug)]
pub enum Document {
    /// Fetched from this URL through the source's egress.
    Url(String),
    /// Already read (a ConfigMap key).
    Bytes(Vec<u8>),
    /// A file next to the manifests, read when the source is.
    File(std::path::PathBuf),
}

/// What is read, and how it is imported.
#[derive(Clone, Debug)]
pub enum Offer {
    Mcp(McpServer),
    OpenApi {
        document: Document,
        egress: EgressPolicy,
    },
}

/// Why a source's offer could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// The URL or its addresses are not allowed (scheme, credentials, a private address).
    UpstreamRefused,
    /// Nothing answered: DNS, connection, TLS, or an HTTP error status.
    UpstreamUnreachable,
    /// No answer in time.
    UpstreamTimeout,
    /// An answer that is not what the protocol says (not JSON-RPC, not a document).
    UpstreamGarbage,
    /// An answer beyond the size or page limits.
    UpstreamTooLarge,
    /// The document is not OpenAPI 3.0 or 3.1, or does not parse as one.
    InvalidDocument,
}

impl FailureReason {
    /// The source's `Ready=False` reason.
    pub fn reason(self) -> toolgrid_api::conditions::Reason {
        use toolgrid_api::conditions::Reason;
        match self {
            FailureReason::UpstreamRefused => Reason::UpstreamRefused,
            FailureReason::UpstreamUnreachable => Reason::UpstreamUnreachable,
            FailureReason::UpstreamTimeout => Reason::UpstreamTimeout,
            FailureReason::UpstreamGarbage => Reason::UpstreamGarbage,
            FailureReason::UpstreamTooLarge => Reason::UpstreamTooLarge,
            FailureReason::InvalidDocument => Reason::InvalidDocument,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::UpstreamRefused => "UpstreamRefused",
            FailureReason::UpstreamUnreachable => "UpstreamUnreachable",
            FailureReason::UpstreamTimeout => "UpstreamTimeout",
            FailureReason::UpstreamGarbage => "UpstreamGarbage",
            FailureReason::UpstreamTooLarge => "UpstreamTooLarge",
            FailureReason::InvalidDocument => "InvalidDocument",
        }
    }
}

/// A source that could not be read: the reason and what exactly happened (no credential
/// is ever part of it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct SourceFailure {
    pub reason: FailureReason,
    pub message: String,
}

impl SourceFailure {
    pub fn new(reason: FailureReason, message: impl std::fmt::Display) -> Self {
        SourceFailure {
            reason,
            message: message.to_string(),
        }
    }
}

impl From<McpError> for SourceFailure {
    fn from(error: McpError) -> Self {
        let reason = match &error {
            McpError::Egress(EgressError::Unresolved { .. }) => FailureReason::UpstreamUnreachable,
            McpError::Egress(_) => FailureReason::UpstreamRefused,
            McpError::Transport { .. } | McpError::Status { .. } => {
                FailureReason::UpstreamUnreachable
            }
            McpError::Timeout { .. } => FailureReason::UpstreamTimeout,
            McpError::TooLarge { .. } | McpError::TooManyPages(_) => {
                FailureReason::UpstreamTooLarge
            }
            McpError::Garbage { .. } | McpError::Rpc { .. } => FailureReason::UpstreamGarbage,
        };
        SourceFailure::new(reason, error)
    }
}

impl From<FetchError> for SourceFailure {
    fn from(error: FetchError) -> Self {
        let reason = match &error {
            FetchError::Egress(EgressError::Unresolved { .. }) => {
                FailureReason::UpstreamUnreachable
            }
            FetchError::Egress(_) => FailureReason::UpstreamRefused,
            FetchError::Transport { .. } | FetchError::Status { .. } => {
                FailureReason::UpstreamUnreachable
            }
            FetchError::Timeout { .. } => FailureReason::UpstreamTimeout,
            FetchError::TooLarge { .. } => FailureReason::UpstreamTooLarge,
        };
        SourceFailure::new(reason, error)
    }
}

/// Reads what `offer` offers as the tools of source `name`: those `filter` admits, with
/// `overrides`' effects, within `limits`.
pub async fn read_offer(
    name: &str,
    offer: &Offer,
    filter: &ToolFilter,
    overrides: &BTreeMap<String, Effect>,
    limits: &SourceLimits,
) -> Result<SourceSnapshot, SourceFailure> {
    match offer {
        Offer::Mcp(server) => {
            let listing = server.list_tools().await?;
            let mut snapshot = read_mcp_tools(&listing.tools, name, filter, overrides, limits);
            snapshot.era = Some(match listing.era {
                toolgrid_upstream::mcp::Era::Legacy => McpEra::Legacy,
                _ => McpEra::Modern,
            });
            Ok(snapshot)
        }
        Offer::OpenApi { document, egress } => {
            let bytes = match document {
                Document::Url(url) => {
                    fetch_document(url, *egress, MAX_DOCUMENT_BYTES, DOCUMENT_TIMEOUT).await?
                }
                Document::Bytes(bytes) => bytes.clone(),
                Document::File(path) => read_file(path).await?,
            };
            openapi::read_openapi(&bytes, name, filter, overrides, limits).map_err(|error| {
                let reason = match error {
                    openapi::OpenApiError::TooLarge { .. } => FailureReason::UpstreamTooLarge,
                    _ => FailureReason::InvalidDocument,
                };
                SourceFailure::new(reason, error)
            })
        }
    }
}

/// A document file, at most [`MAX_DOCUMENT_BYTES`].
async fn read_file(path: &std::path::Path) -> Result<Vec<u8>, SourceFailure> {
    use tokio::io::AsyncReadExt as _;
    let file = tokio::fs::File::open(path).await.map_err(|e| {
        SourceFailure::new(
            FailureReason::InvalidDocument,
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_DOCUMENT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| {
            SourceFailure::new(
                FailureReason::InvalidDocument,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(SourceFailure::new(
            FailureReason::UpstreamTooLarge,
            format!(
                "{} is larger than {MAX_DOCUMENT_BYTES} bytes",
                path.display()
            ),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use toolgrid_core::source::LeftOutReason;
    use toolgrid_upstream::mcp::{Era, McpLimits};

    /// A server on loopback that answers every request with `answer` after `delay`.
    async fn upstream(answer: Vec<u8>, delay: Duration) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 1 << 16];
                    let _ = stream.read(&mut buffer).await;
                    tokio::time::sleep(delay).await;
                    let _ = stream.write_all(&answer).await;
                });
            }
        });
        port
    }

    fn http(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
        let mut answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(body);
        answer
    }

    /// A 2026-07-28 answer to the first request (id 1).
    fn listing(tools: serde_json::Value) -> Vec<u8> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools, "resultType": "complete"}});
        http("200 OK", "application/json", body.to_string().as_bytes())
    }

    fn loopback() -> EgressPolicy {
        EgressPolicy {
            allow_http: true,
            allow_private: true,
        }
    }

    fn mcp(port: u16) -> Offer {
        Offer::Mcp(McpServer {
            url: format!("http://127.0.0.1:{port}/mcp"),
            headers: Vec::new(),
            egress: loopback(),
            era: Era::Modern,
            limits: McpLimits {
                timeout: Duration::from_secs(2),
                ..McpLimits::default()
            },
        })
    }

    async fn read(name: &str, offer: &Offer) -> Result<SourceSnapshot, SourceFailure> {
        read_offer(
            name,
            offer,
            &ToolFilter::default(),
            &BTreeMap::new(),
            &SourceLimits::default(),
        )
        .await
    }

    fn reason(result: Result<SourceSnapshot, SourceFailure>) -> FailureReason {
        match result {
            Ok(snapshot) => panic!("read {} tools", snapshot.tools.len()),
            Err(failure) => failure.reason,
        }
    }

    #[tokio::test]
    async fn an_upstream_that_is_down_slow_or_wrong_is_a_named_failure() {
        // Down: nothing listens.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        assert_eq!(
            reason(read("s", &mcp(closed)).await),
            FailureReason::UpstreamUnreachable
        );
        // Slow: it never answers in time.
        let slow = upstream(listing(json!([])), Duration::from_secs(30)).await;
        assert_eq!(
            reason(read("s", &mcp(slow)).await),
            FailureReason::UpstreamTimeout
        );
        // Garbage: not JSON, or JSON-RPC without a result.
        let html = upstream(
            http("200 OK", "text/html", b"<html>hi</html>"),
            Duration::ZERO,
        )
        .await;
        assert_eq!(
            reason(read("s", &mcp(html)).await),
            FailureReason::UpstreamGarbage
        );
        let no_tools = upstream(
            http(
                "200 OK",
                "application/json",
                br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            ),
            Duration::ZERO,
        )
        .await;
        assert_eq!(
            reason(read("s", &mcp(no_tools)).await),
            FailureReason::UpstreamGarbage
        );
        // An error status.
        let broken = upstream(http("502 Bad Gateway", "text/plain", b"no"), Duration::ZERO).await;
        assert_eq!(
            reason(read("s", &mcp(broken)).await),
            FailureReason::UpstreamUnreachable
        );
        // Too much: a 50 MiB description.
        let huge = upstream(
            listing(json!([{"name": "big", "description": "x".repeat(50 << 20)}])),
            Duration::ZERO,
        )
        .await;
        assert_eq!(
            reason(read("s", &mcp(huge)).await),
            FailureReason::UpstreamTooLarge
        );
        // Private addresses are refused unless the source allows them.
        let Offer::Mcp(mut server) = mcp(slow) else {
            unreachable!()
        };
        server.egress.allow_private = false;
        assert_eq!(
            reason(read("s", &Offer::Mcp(server)).await),
            FailureReason::UpstreamRefused
        );
    }

    #[tokio::test]
    async fn a_bad_tool_or_too_many_leaves_the_rest_imported() {
        let mut tools: Vec<serde_json::Value> = (0..10_000)
            .map(|i| json!({"name": format!("t{i}"), "inputSchema": {"type": "object"}}))
            .collect();
        tools.insert(
            0,
            json!({"name": "broken", "inputSchema": {"type": "object", "properties": {"x": {"type": 7}}}}),
        );
        let port = upstream(listing(json!(tools)), Duration::ZERO).await;
        let snapshot = read("many", &mcp(port)).await.expect("a snapshot");
        assert_eq!(snapshot.tools.len(), SourceLimits::default().max_tools);
        assert_eq!(snapshot.tools[0].name, "t0");
        assert_eq!(snapshot.left_out[0].name, "broken");
        assert_eq!(
            snapshot.left_out[0].reason,
            LeftOutReason::UnsupportedSchema
        );
        // The status lists at most MAX_LEFT_OUT of what was left out and counts the rest.
        assert_eq!(
            snapshot.left_out.len(),
            toolgrid_catalog::sources::MAX_LEFT_OUT
        );
        let listed = toolgrid_catalog::sources::MAX_LEFT_OUT - 1;
        assert_eq!(
            snapshot.left_out.last().unwrap().message,
            format!(
                "{} more left out, not listed",
                1 + 10_000 - SourceLimits::default().max_tools - listed
            )
        );
    }

    #[tokio::test]
    async fn an_openapi_document_is_fetched_or_its_failure_named() {
        let document = json!({
            "openapi": "3.0.3",
            "info": {"title": "t", "version": "1"},
            "paths": {"/orders/{id}": {"get": {
                "operationId": "getOrder",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "ok"}},
            }}},
        });
        let served = upstream(
            http(
                "200 OK",
                "application/json",
                document.to_string().as_bytes(),
            ),
            Duration::ZERO,
        )
        .await;
        let offer = |port: u16, egress| Offer::OpenApi {
            document: Document::Url(format!("http://127.0.0.1:{port}/openapi.json")),
            egress,
        };
        let snapshot = read("shop", &offer(served, loopback()))
            .await
            .expect("a snapshot");
        assert_eq!(snapshot.tools[0].name, "getOrder");
        // The same document given as bytes (a ConfigMap, a file).
        let given = Offer::OpenApi {
            document: Document::Bytes(document.to_string().into_bytes()),
            egress: EgressPolicy::default(),
        };
        assert_eq!(read("shop", &given).await.expect("a snapshot"), snapshot);

        let missing = upstream(http("404 Not Found", "text/plain", b"no"), Duration::ZERO).await;
        assert_eq!(
            reason(read("shop", &offer(missing, loopback())).await),
            FailureReason::UpstreamUnreachable
        );
        let swagger = upstream(
            http(
                "200 OK",
                "application/json",
                br#"{"swagger":"2.0","paths":{}}"#,
            ),
            Duration::ZERO,
        )
        .await;
        assert_eq!(
            reason(read("shop", &offer(swagger, loopback())).await),
            FailureReason::InvalidDocument
        );
        assert_eq!(
            reason(read("shop", &offer(served, EgressPolicy::default())).await),
            FailureReason::UpstreamRefused,
            "http and loopback need the source's consent"
        );
    }
}
