//! What a model-facing front door (MCP, the model schemas' callers) returns for an ended
//! call, per the Tool's `resultPolicy`: the result inline, its first page and a cursor, a
//! summary naming the file the whole result was written to, or the result cut at the limit.
//! The full result is always kept in the call record.
//!
//! CONTRACT(issue 11, helper results): the types are the contract between the result
//! policies and the front doors; `shape` is a stub that returns every result inline.

use crate::api::ResultPolicy;
use serde_json::Value;

/// Results up to this many bytes are inline when the Tool sets no `maxInlineBytes`.
pub const DEFAULT_MAX_INLINE_BYTES: u64 = 32 * 1024;

/// An ended call's result as a model receives it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelResult {
    /// The whole result, for MCP's `structuredContent`, when it is returned whole.
    pub structured: Option<Value>,
    /// The text for the model: the result's JSON, its first page, a summary naming the
    /// file, or the cut text.
    pub text: String,
    /// Set when the result is paged: this is page 0 of `pages`.
    pub page: Option<PageInfo>,
    /// Set when the result was written to the agent's workspace: its path there.
    pub file: Option<String>,
    /// The text was cut at the limit.
    pub truncated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageInfo {
    pub page: u32,
    pub pages: u32,
    /// Opaque: names the next page (MCP resource URI / `?page=N`), or none after the last.
    pub next: Option<String>,
}

/// One page of a paged result (`GET /v1/calls/{id}/result?page=N`).
#[derive(Clone, Debug, PartialEq)]
pub struct ResultPage {
    pub call_id: String,
    pub page: u32,
    pub pages: u32,
    pub text: String,
}

/// The model-facing shape of `result` under `policy`. (Stub: always inline.)
pub fn shape(_policy: &ResultPolicy, _call_id: &str, result: &Value) -> ModelResult {
    ModelResult {
        structured: Some(result.clone()),
        text: result.to_string(),
        page: None,
        file: None,
        truncated: false,
    }
}
