//! Clients of tools from elsewhere (ToolSources): an upstream MCP server in either era of
//! the protocol ([`mcp`]), an OpenAPI operation's request ([`http`]), reached only through checked egress ([`egress`]: https unless
//! allowed otherwise, public addresses unless allowed otherwise, no credentials in URLs, no
//! proxy from the environment, no redirects). The control plane lists a source with these
//! clients when it reconciles it; the worker's upstream runner calls its tools with them.
//! What a listing finds is converted to the domain's
//! [`toolgrid_core::source::SourceSnapshot`] by `toolgrid-catalog`'s readers.

pub mod egress;
pub mod http;
pub mod mcp;
