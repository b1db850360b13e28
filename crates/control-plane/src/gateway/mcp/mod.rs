//! The MCP server at `/mcp` (Streamable HTTP), serving both eras of the protocol on one
//! endpoint: the stateless 2026-07-28 revision and the session-based 2025-06-18 and
//! 2025-11-25 ones, the era picked from each message ([`era`]).
//!
//! An agent sees its bound commands as tools ([`tools`]); a `tools/call` is admitted through
//! [`crate::gateway::Gateway::admit`] like any HTTP or gRPC call (middleware, audit, oplog),
//! its progress streamed as `notifications/progress`, its end shaped by
//! [`crate::gateway::Gateway::model_result`]. Pages of a paged result are resources
//! (`resources/read` of [`crate::gateway::results::page_uri`]).
//!
//! The transport is an axum handler ([`handler`]) rather than rmcp's
//! `StreamableHttpService`: that service runs one rmcp session per `Mcp-Session-Id` and
//! speaks one era per service, while this endpoint authenticates every request on its own
//! (a session is bound to the caller that opened it), serves stateless 2026-07-28 requests
//! beside legacy sessions on one path, and cancels a call when its SSE stream closes. The
//! error codes and protocol versions are rmcp's (`rmcp::model::ErrorCode`,
//! `ProtocolVersion`), and the unit tests parse the tool and result shapes as rmcp's model
//! types.
//!
//! Bounds: a request body is at most [`MAX_BODY_BYTES`]; a caller holds at most
//! [`MAX_STREAMS_PER_CALLER`] open SSE streams and [`sessions::MAX_SESSIONS_PER_CALLER`]
//! sessions; sessions expire after [`sessions::SESSION_IDLE`] unused.

pub mod auth;
pub mod era;
mod handler;
pub mod jsonrpc;
pub mod sessions;
pub mod tools;

use super::Gateway;
use std::sync::Arc;

/// The largest request body `/mcp` reads.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// SSE streams (tool calls and GET streams) one caller may hold open at once.
pub const MAX_STREAMS_PER_CALLER: usize = 32;
/// The header by which an operator picks the namespace whose tools it sees (also
/// `?namespace=`); agents always see their own.
pub const NAMESPACE_HEADER: &str = "toolgrid-namespace";

/// How `/mcp` presents itself.
#[derive(Clone, Debug, Default)]
pub struct McpConfig {
    /// The URL clients reach this server at (`https://tools.example.com`), for the resource
    /// metadata; by default the request's `Host` over plain HTTP.
    pub public_url: Option<String>,
    /// The OAuth authorization servers whose access tokens are accepted (the metadata's
    /// `authorization_servers`).
    pub authorization_servers: Vec<String>,
    /// Browser origins allowed besides loopback ones.
    pub allowed_origins: Vec<String>,
}

/// The `/mcp` and metadata routes over `gateway`.
pub fn routes(gateway: Arc<Gateway>, config: McpConfig) -> axum::Router {
    handler::routes(gateway, config)
}
