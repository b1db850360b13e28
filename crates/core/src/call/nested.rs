//! Calls a program makes (code mode): a guest asks for `tools.<tool>.<command>(args)`, and
//! the call is admitted through the gateway as a **child call** of the running one, as the
//! same caller, with the same bindings, middleware, rate limits and audit as any call.
//!
//! Exactly once rests on two rules:
//! - the request is committed to the parent's oplog ([`ToolCall`]) before it leaves the
//!   sandbox, and the answer is recorded ([`ToolResult`]) in the order the program was told;
//! - the child is admitted under the idempotency key [`child_key`] (the parent's id and the
//!   request's number), so a replay that sends a request again finds the same child call
//!   instead of making a second one.

use super::ErrorKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most tool calls one call's program may make; the next ends the call with
/// [`ErrorKind::ToolCallLimit`].
pub const MAX_NESTED_CALLS: u64 = 256;

/// The pseudo-tool of `tools.search(query)`: a request with this tool name asks for the
/// tools a program may call that match `args.query` (not a call; no child is admitted).
/// Tool names are DNS labels, so no tool has this name.
pub const SEARCH_TOOL: &str = "$search";

/// Most matches a search returns.
pub const MAX_SEARCH_RESULTS: usize = 50;

/// Largest request document (tool, command and arguments as JSON) a program may send.
pub const MAX_NESTED_REQUEST_BYTES: usize = 1 << 20;

/// The one of `names` that `name` spells otherwise, when `name` is not itself among them:
/// equal once case, `-` and `_` are set aside (a program's `web_fetch` or `webFetch` for
/// `web-fetch`, `maxChars` or `max_chars` for `max-chars`). `None` when none or several are.
pub fn spelled_as<'a>(name: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    fn folded(name: &str) -> impl Iterator<Item = char> + '_ {
        name.chars()
            .filter(|c| *c != '-' && *c != '_')
            .map(|c| c.to_ascii_lowercase())
    }
    let mut found = None;
    for candidate in names {
        if candidate == name {
            return None;
        }
        if folded(candidate).eq(folded(name)) {
            if found.is_some() {
                return None;
            }
            found = Some(candidate);
        }
    }
    found
}

/// The idempotency key a program's request number `seq` of call `parent` is admitted under.
pub fn child_key(parent: &str, seq: u64) -> String {
    format!("{parent}/{seq}")
}

/// A tool call a program asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NestedRequest {
    pub tool: String,
    pub command: String,
    #[serde(default)]
    pub args: Value,
}

impl NestedRequest {
    /// Reads a guest's request document: `{"tool", "command", "args"}`, names non-empty,
    /// at most 253 bytes.
    pub fn parse(document: &[u8]) -> Result<Self, String> {
        if document.len() > MAX_NESTED_REQUEST_BYTES {
            return Err(format!(
                "the request is {} bytes, more than {MAX_NESTED_REQUEST_BYTES}",
                document.len()
            ));
        }
        let request: NestedRequest = serde_json::from_slice(document)
            .map_err(|e| format!("the request is not {{tool, command, args}}: {e}"))?;
        request.checked()
    }

    /// A request as the worker link carries it (arguments as JSON text), checked by the
    /// same rules as a guest's document: a hostile worker's request is bounded the same.
    pub fn from_wire(tool: &str, command: &str, args_json: &str) -> Result<Self, String> {
        if tool.len() + command.len() + args_json.len() > MAX_NESTED_REQUEST_BYTES {
            return Err(format!(
                "the request is more than {MAX_NESTED_REQUEST_BYTES} bytes"
            ));
        }
        let args = serde_json::from_str(args_json)
            .map_err(|e| format!("the arguments are not JSON: {e}"))?;
        NestedRequest {
            tool: tool.to_string(),
            command: command.to_string(),
            args,
        }
        .checked()
    }

    /// Names non-empty and at most 253 bytes (the search's tool name aside); arguments an
    /// object (none: an empty one).
    fn checked(self) -> Result<Self, String> {
        let request = self;
        let names: &[(&str, &String)] = if request.tool == SEARCH_TOOL {
            &[("command", &request.command)]
        } else {
            &[("tool", &request.tool), ("command", &request.command)]
        };
        for &(what, name) in names {
            if name.is_empty() || name.len() > 253 {
                return Err(format!("the {what} name must have 1 to 253 bytes"));
            }
        }
        match &request.args {
            Value::Object(_) => Ok(request),
            Value::Null => Ok(NestedRequest {
                args: Value::Object(Default::default()),
                ..request
            }),
            _ => Err("args must be an object of arguments by name".into()),
        }
    }
}

/// How a program's tool call ended, as the program is told: `{"value": ...}` or
/// `{"error": {"kind", "message"}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NestedOutcome {
    /// The child call succeeded with this result.
    Value(Value),
    /// The child call was refused (unbound, denied, rate limited, invalid arguments) or
    /// ended in an error; `kind` names which.
    Error(NestedError),
}

/// Why a program's tool call failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NestedError {
    pub kind: ErrorKind,
    pub message: String,
}

impl NestedOutcome {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        NestedOutcome::Error(NestedError {
            kind,
            message: message.into(),
        })
    }

    /// The document the guest reads: `{"ok": true, "value", "call"}` or
    /// `{"ok": false, "error": {"kind", "message"}, "call"}`.
    pub fn to_document(&self, call: Option<&str>) -> Value {
        match self {
            NestedOutcome::Value(value) => {
                serde_json::json!({"ok": true, "value": value, "call": call})
            }
            NestedOutcome::Error(NestedError { kind, message }) => serde_json::json!({
                "ok": false,
                "error": {"kind": kind.as_str(), "message": message},
                "call": call,
            }),
        }
    }
}

/// How a program's tool call ended, and the child call's id when one was recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct NestedAnswer {
    pub call: Option<String>,
    pub outcome: NestedOutcome,
}

/// A program's tool call, committed before it leaves (entry `tool-call`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// The request's number within the call, from 1, in the program's issue order.
    pub seq: u64,
    pub tool: String,
    pub command: String,
    /// SHA-256 of the arguments' JSON (the child call holds them): a replay that asks
    /// for other arguments under the same number diverges.
    pub args_sha256: String,
    /// The key the child is admitted under ([`child_key`]).
    pub idempotency_key: String,
}

/// The answer to a program's tool call (entry `tool-result`), recorded in the order the
/// program was told, so a replay tells it in the same order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    pub seq: u64,
    /// The child call's id (none when admission refused it before recording one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    #[serde(flatten)]
    pub outcome: NestedOutcome,
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_name_spelled_otherwise_is_found_only_when_one_matches() {
        let names = ["web-fetch", "max-chars", "a-b", "ab", "get_weather"];
        assert_eq!(spelled_as("web_fetch", names), Some("web-fetch"));
        assert_eq!(spelled_as("maxChars", names), Some("max-chars"));
        assert_eq!(spelled_as("get-weather", names), Some("get_weather"));
        assert_eq!(spelled_as("web-fetch", names), None, "spelled as it is");
        assert_eq!(spelled_as("a_b", names), None, "a-b and ab both match");
        assert_eq!(spelled_as("nothing", names), None);
    }

    use super::*;

    #[test]
    fn a_request_is_a_tool_a_command_and_arguments_by_name() {
        let request =
            NestedRequest::parse(br#"{"tool":"fetch","command":"get","args":{"url":"x"}}"#)
                .unwrap();
        assert_eq!(request.tool, "fetch");
        assert_eq!(request.args["url"], "x");
        let bare = NestedRequest::parse(br#"{"tool":"a","command":"b"}"#).unwrap();
        assert_eq!(bare.args, serde_json::json!({}));
        for bad in [
            &br#"{"tool":"","command":"b"}"#[..],
            br#"{"tool":"a","command":"b","args":[1]}"#,
            br#"{"tool":"a","command":"b","extra":1}"#,
            br#"not json"#,
        ] {
            assert!(
                NestedRequest::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(NestedRequest::from_wire("a", "b", "{}").is_ok());
        assert!(NestedRequest::from_wire("", "b", "{}").is_err());
        assert!(NestedRequest::from_wire("a", "b", "[1]").is_err());
        let big = format!("{{\"x\": \"{}\"}}", "y".repeat(MAX_NESTED_REQUEST_BYTES));
        assert!(
            NestedRequest::from_wire("a", "b", &big)
                .unwrap_err()
                .contains("more than")
        );
        let huge = vec![b' '; MAX_NESTED_REQUEST_BYTES + 1];
        assert!(
            NestedRequest::parse(&huge)
                .unwrap_err()
                .contains("more than")
        );
    }

    #[test]
    fn a_child_key_is_the_parents_id_and_the_number() {
        assert_eq!(child_key("0190-abc", 7), "0190-abc/7");
    }

    #[test]
    fn a_result_round_trips_as_an_entry_payload() {
        let result = ToolResult {
            seq: 2,
            call: Some("c".into()),
            outcome: NestedOutcome::error(ErrorKind::PermissionDenied, "not bound"),
        };
        let text = serde_json::to_string(&result).unwrap();
        assert!(
            text.contains(r#""error":{"kind":"permission-denied""#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<ToolResult>(&text).unwrap(), result);
        let entry = crate::call::OplogEntry::ToolResult(result.clone());
        let (kind, payload) = entry.to_parts();
        assert_eq!(
            crate::call::OplogEntry::from_parts(kind.as_str(), payload).unwrap(),
            entry
        );
        let doc = result.outcome.to_document(result.call.as_deref());
        assert_eq!(doc["error"]["kind"], "permission-denied");
        assert_eq!(doc["ok"], false);
    }
}
