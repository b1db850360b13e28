//! Readers of tools from elsewhere: each turns what a ToolSource's upstream offers (an MCP
//! `tools/list` answer, an OpenAPI document) into a [`toolgrid_core::source::SourceSnapshot`],
//! pure functions over the bytes read; the IO (fetching them) is the caller's.

pub mod mcp;
pub mod openapi;
