//! What a model-facing front door (MCP, the model schemas' callers) returns for an ended
//! call, per the Tool's `resultPolicy`: the result inline, its first page and a cursor, a
//! summary naming the file the whole result was written to, or the result cut at the limit.
//! The full result is always kept in the call record.
//!
//! The result's text is its compact JSON (`serde_json`'s serialization of the stored
//! value, the same every time). With `L` = `maxInlineBytes` (default
//! [`DEFAULT_MAX_INLINE_BYTES`]), a text of at most `L` bytes is always returned whole;
//! a larger one by `overflow`:
//! - `inline`: whole anyway (the caller's risk: a model's context may not take it);
//! - `page`: split into pages of at most `L` bytes, each ending on a UTF-8 character
//!   boundary ([`pages`]); the pages concatenate to exactly the text. Page 0 is returned
//!   with a [`PageInfo`] whose `next` is [`page_uri`] of page 1;
//! - `file`: a short summary naming `tool-results/<call>.json` in the agent's workspace
//!   ([`file_summary`]; the gateway writes the file, and falls back to `page` when it
//!   cannot);
//! - `truncate`: the text cut at `L` bytes (on a character boundary), then a note.
//!
//! Everything here is pure; the gateway does the IO.

use serde_json::Value;
use toolgrid_api::{Overflow, ResultPolicy};

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

/// `maxInlineBytes` of `policy` (its default when unset; at least 1).
pub fn max_inline_bytes(policy: &ResultPolicy) -> usize {
    let limit = policy.max_inline_bytes.unwrap_or(DEFAULT_MAX_INLINE_BYTES);
    usize::try_from(limit).unwrap_or(usize::MAX).max(1)
}

/// The path in the agent's workspace that the `file` policy writes call `call_id`'s
/// result to.
pub fn file_path(call_id: &str) -> String {
    format!("tool-results/{call_id}.json")
}

/// The byte ranges of the pages of `text`: each at most `limit` bytes and ending on a
/// character boundary (a character longer than `limit` gets a page of its own); at least
/// one page, empty for an empty text.
pub fn pages(text: &str, limit: usize) -> Vec<std::ops::Range<usize>> {
    let limit = limit.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + limit).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end == start {
            // One character wider than the limit.
            end = start + 1;
            while !text.is_char_boundary(end) {
                end += 1;
            }
        }
        out.push(start..end);
        start = end;
    }
    if out.is_empty() {
        out.push(0..0);
    }
    out
}

/// The longest prefix of `text` of at most `limit` bytes that ends on a character boundary.
pub fn cut(text: &str, limit: usize) -> &str {
    let mut end = limit.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The model-facing shape of `result` under `policy`. `file` assumes the gateway has
/// written the whole result to [`file_path`] (it shapes with `page` when it could not).
pub fn shape(policy: &ResultPolicy, call_id: &str, result: &Value) -> ModelResult {
    let text = result.to_string();
    let limit = max_inline_bytes(policy);
    let whole = |text: String| ModelResult {
        structured: Some(result.clone()),
        text,
        page: None,
        file: None,
        truncated: false,
    };
    if text.len() <= limit {
        return whole(text);
    }
    match policy.overflow {
        Overflow::Inline => whole(text),
        Overflow::Page => {
            let ranges = pages(&text, limit);
            let count = ranges.len() as u32;
            ModelResult {
                structured: None,
                text: text[ranges[0].clone()].to_string(),
                page: Some(PageInfo {
                    page: 0,
                    pages: count,
                    next: (count > 1).then(|| page_uri(call_id, 1)),
                }),
                file: None,
                truncated: false,
            }
        }
        Overflow::File => file_summary(call_id, result, text.len()),
        Overflow::Truncate => {
            let shown = cut(&text, limit);
            ModelResult {
                structured: None,
                text: format!(
                    "{shown}\n[truncated: the first {} of {} bytes of the result; the whole result is kept with call {call_id}]",
                    shown.len(),
                    text.len()
                ),
                page: None,
                file: None,
                truncated: true,
            }
        }
    }
}

/// Most top-level keys (or nothing else) a file summary names.
const SUMMARY_KEYS: usize = 50;

/// The summary a model gets for a result written to its workspace: the path, the size and
/// what the result holds at its top level (the object's keys, the array's length).
pub fn file_summary(call_id: &str, result: &Value, bytes: usize) -> ModelResult {
    let path = file_path(call_id);
    let mut summary = serde_json::Map::new();
    summary.insert("file".into(), Value::String(path.clone()));
    summary.insert("bytes".into(), Value::from(bytes as u64));
    match result {
        Value::Object(map) => {
            let keys: Vec<Value> = map
                .keys()
                .take(SUMMARY_KEYS)
                .map(|k| Value::String(k.clone()))
                .collect();
            summary.insert("keys".into(), Value::Array(keys));
            if map.len() > SUMMARY_KEYS {
                summary.insert("moreKeys".into(), Value::from(map.len() - SUMMARY_KEYS));
            }
        }
        Value::Array(items) => {
            summary.insert("items".into(), Value::from(items.len() as u64));
        }
        _ => {}
    }
    summary.insert(
        "note".into(),
        Value::String(format!(
            "the whole result ({bytes} bytes of JSON) was written to {path} in your workspace"
        )),
    );
    ModelResult {
        structured: None,
        text: Value::Object(summary).to_string(),
        page: None,
        file: Some(path),
        truncated: false,
    }
}

/// Page `page` of `result` paged at `policy`'s `maxInlineBytes` (any result can be read
/// in pages, whatever its policy); `None` past the last page.
pub fn page_of(
    policy: &ResultPolicy,
    call_id: &str,
    result: &Value,
    page: u32,
) -> Option<ResultPage> {
    let text = result.to_string();
    let ranges = pages(&text, max_inline_bytes(policy));
    let range = ranges.get(page as usize)?.clone();
    Some(ResultPage {
        call_id: call_id.to_string(),
        page,
        pages: ranges.len() as u32,
        text: text[range].to_string(),
    })
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
    use serde_json::json;

    fn policy(limit: u64, overflow: Overflow) -> ResultPolicy {
        ResultPolicy {
            max_inline_bytes: Some(limit),
            overflow,
        }
    }

    /// A result with multi-byte characters everywhere, about `n` bytes of JSON.
    fn big(n: usize) -> Value {
        let item = "héllo wörld → ✓ 𝄞 ";
        let items: Vec<Value> = (0..n / (item.len() + 3))
            .map(|i| Value::String(format!("{item}{i}")))
            .collect();
        json!({"items": items, "count": items.len(), "zeta": null})
    }

    #[test]
    fn a_small_result_is_whole_under_every_policy() {
        let result = json!({"a": 1});
        for overflow in [
            Overflow::Inline,
            Overflow::Page,
            Overflow::File,
            Overflow::Truncate,
        ] {
            let shaped = shape(&policy(100, overflow), "c", &result);
            assert_eq!(shaped.structured.as_ref(), Some(&result));
            assert_eq!(shaped.text, result.to_string());
            assert!(shaped.page.is_none() && shaped.file.is_none() && !shaped.truncated);
        }
        // The default limit is 32 KiB.
        let default = ResultPolicy {
            max_inline_bytes: None,
            overflow: Overflow::Truncate,
        };
        assert_eq!(max_inline_bytes(&default), 32 * 1024);
        assert!(!shape(&default, "c", &big(20_000)).truncated);
        assert!(shape(&default, "c", &big(40_000)).truncated);
    }

    #[test]
    fn inline_returns_a_large_result_whole() {
        let result = big(10_000);
        let shaped = shape(&policy(100, Overflow::Inline), "c", &result);
        assert_eq!(shaped.structured, Some(result.clone()));
        assert_eq!(shaped.text, result.to_string());
    }

    #[test]
    fn pages_split_on_character_boundaries_and_concatenate_to_the_text() {
        let result = big(10_000);
        let text = result.to_string();
        for limit in [1usize, 3, 4, 5, 7, 100, 1000, text.len() - 1] {
            let ranges = pages(&text, limit);
            let joined: String = ranges.iter().map(|r| &text[r.clone()]).collect();
            assert_eq!(joined, text, "limit {limit}");
            for r in &ranges {
                // A page is over the limit only when one character is.
                assert!(r.len() <= limit.max(4), "limit {limit}: {r:?}");
                assert!(!r.is_empty());
            }
        }
        assert_eq!(pages("", 10), vec![0..0]);
        let shaped = shape(&policy(1000, Overflow::Page), "c1", &result);
        let info = shaped.page.clone().unwrap();
        assert_eq!(info.page, 0);
        assert_eq!(info.pages as usize, pages(&text, 1000).len());
        assert_eq!(info.next.as_deref(), Some(page_uri("c1", 1).as_str()));
        assert!(shaped.structured.is_none());
        assert!(shaped.text.len() <= 1000);
        let mut joined = shaped.text.clone();
        for n in 1..info.pages {
            let page = page_of(&policy(1000, Overflow::Page), "c1", &result, n).unwrap();
            assert_eq!((page.page, page.pages), (n, info.pages));
            joined.push_str(&page.text);
        }
        assert_eq!(joined, text);
        assert!(page_of(&policy(1000, Overflow::Page), "c1", &result, info.pages).is_none());
        assert_eq!(
            page_of(&policy(1000, Overflow::Page), "c1", &result, 0)
                .unwrap()
                .text,
            shaped.text
        );
    }

    #[test]
    fn truncate_cuts_on_a_character_boundary_and_says_so() {
        let result = big(10_000);
        let text = result.to_string();
        for limit in [1usize, 2, 3, 5, 999] {
            let shaped = shape(&policy(limit as u64, Overflow::Truncate), "c", &result);
            assert!(shaped.truncated && shaped.structured.is_none());
            let (shown, note) = shaped.text.split_once("\n[truncated:").unwrap();
            assert!(shown.len() <= limit);
            assert!(text.starts_with(shown));
            assert!(note.contains(&format!("of {} bytes", text.len())), "{note}");
        }
        assert_eq!(cut("é", 1), "");
        assert_eq!(cut("aé", 2), "a");
        assert_eq!(cut("aé", 3), "aé");
    }

    #[test]
    fn file_names_the_workspace_file_and_the_result_top_level() {
        let result = big(10_000);
        let shaped = shape(&policy(100, Overflow::File), "c9", &result);
        assert_eq!(shaped.file.as_deref(), Some("tool-results/c9.json"));
        assert!(shaped.structured.is_none());
        let summary: Value = serde_json::from_str(&shaped.text).unwrap();
        assert_eq!(summary["file"], "tool-results/c9.json");
        assert_eq!(summary["bytes"], result.to_string().len());
        assert_eq!(summary["keys"], json!(["count", "items", "zeta"]));
        let list = file_summary("c", &json!([1, 2, 3]), 7);
        let summary: Value = serde_json::from_str(&list.text).unwrap();
        assert_eq!(summary["items"], 3);
        assert!(summary.get("keys").is_none());
    }

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
