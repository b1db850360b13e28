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

/// The URI naming page `page` of call `call_id`'s result: the `next` of a [`PageInfo`], and
/// the MCP resource a client reads for that page (`GET /v1/calls/{id}/result?page=N` serves
/// the same page).
pub fn page_uri(call_id: &str, page: u32) -> String {
    format!("toolgrid://calls/{call_id}/result?page={page}")
}

/// The call and page a [`page_uri`] names; `None` for any other URI.
pub fn parse_page_uri(uri: &str) -> Option<(&str, u32)> {
    let rest = uri.strip_prefix("toolgrid://calls/")?;
    let (call_id, query) = rest.split_once("/result?page=")?;
    if call_id.is_empty() || call_id.contains('/') {
        return None;
    }
    Some((call_id, query.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_uris_round_trip_and_refuse_others() {
        let uri = page_uri("01abc", 3);
        assert_eq!(parse_page_uri(&uri), Some(("01abc", 3)));
        assert_eq!(parse_page_uri("toolgrid://calls//result?page=1"), None);
        assert_eq!(parse_page_uri("toolgrid://calls/a/b/result?page=1"), None);
        assert_eq!(parse_page_uri("toolgrid://calls/a/result?page=x"), None);
        assert_eq!(parse_page_uri("file:///etc/passwd"), None);
    }
}
