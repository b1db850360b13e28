//! Readers of tools from elsewhere: each turns what a ToolSource's upstream offers (an MCP
//! `tools/list` answer, an OpenAPI document) into a [`toolgrid_core::source::SourceSnapshot`],
//! pure functions over the bytes read; the IO (fetching them) is the caller's.

pub mod mcp;
pub mod openapi;

use toolgrid_core::interface::{ArgumentNames, CommandInterface};
use toolgrid_core::source::{ImportedTool, LeftOut, LeftOutReason};

/// `tool` if its command compiles as toolgrid calls it (argument names, every schema a
/// valid JSON Schema), else why it is left out: what a source offers must be callable.
fn callable(tool: ImportedTool) -> Result<ImportedTool, LeftOut> {
    match CommandInterface::compile_with(&tool.command, "command", ArgumentNames::Imported) {
        Ok(_) => Ok(tool),
        Err(error) => Err(LeftOut {
            name: tool.name,
            reason: LeftOutReason::UnsupportedSchema,
            message: format!("{}: {}", error.field, error.message),
        }),
    }
}
