//! The MCP shapes of toolgrid's model-facing tools: a [`ModelTool`] as an MCP `Tool`, the
//! pages of `tools/list`, and an ended call as a `CallToolResult`.
//!
//! Pure. Invariants: an `outputSchema` is always an object schema (a command whose result
//! schema is not one gets it wrapped as `{"result": <schema>}`, and its structured result
//! wrapped the same way), so `structuredContent` always matches the advertised schema; a
//! failed call is `isError: true` with its error in the text and in
//! `_meta["toolgrid.dev/error"]`, never in `structuredContent` (clients validate that
//! against `outputSchema`).

use super::jsonrpc::{INVALID_PARAMS, RpcError};
use crate::gateway::results::ModelResult;
use base64::Engine as _;
use serde_json::{Value, json};
use toolgrid_catalog::model_tools::{Hints, ModelTool};

/// Tools per `tools/list` page.
pub const PAGE_SIZE: usize = 50;
/// The JSON Schema dialect every schema is written in.
pub const SCHEMA_DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";
/// Where a failed call's error travels in a `CallToolResult`.
pub const META_ERROR: &str = "toolgrid.dev/error";
/// Where a call's id travels in a `CallToolResult`.
pub const META_CALL_ID: &str = "toolgrid.dev/callId";
/// The `_meta` key of a `tools/call` request carrying the call's idempotency key.
pub const META_IDEMPOTENCY_KEY: &str = "toolgrid.dev/idempotencyKey";
/// The property an output that is not an object is wrapped in.
pub const WRAPPED_RESULT: &str = "result";

/// Whether a schema describes JSON objects only.
fn is_object_schema(schema: &Value) -> bool {
    schema.get("type") == Some(&json!("object"))
}

/// The `outputSchema` of a command's result schema: itself when it is an object schema,
/// else wrapped in an object.
pub fn output_schema(result_schema: &Value) -> Value {
    let mut schema = if is_object_schema(result_schema) {
        result_schema.clone()
    } else {
        let mut inner = result_schema.clone();
        if let Some(obj) = inner.as_object_mut() {
            obj.remove("$schema");
        }
        json!({
            "type": "object",
            "properties": {WRAPPED_RESULT: inner},
            "required": [WRAPPED_RESULT],
        })
    };
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("$schema".into(), json!(SCHEMA_DIALECT));
    }
    schema
}

/// A result as `structuredContent` for a tool whose result schema is `result_schema`.
pub fn structured(result_schema: Option<&Value>, result: Value) -> Option<Value> {
    match result_schema {
        Some(schema) if is_object_schema(schema) => Some(result),
        Some(_) => Some(json!({WRAPPED_RESULT: result})),
        None if result.is_object() => Some(result),
        None => None,
    }
}

/// A model-facing tool as an MCP `Tool`.
pub fn tool_json(tool: &ModelTool) -> Value {
    let hints = Hints::of(tool.effect);
    let mut input = tool.input_schema.clone();
    if let Some(obj) = input.as_object_mut() {
        obj.insert("$schema".into(), json!(SCHEMA_DIALECT));
        obj.entry("type").or_insert(json!("object"));
    }
    let mut out = json!({
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": input,
        "annotations": {
            "title": tool.title,
            "readOnlyHint": hints.read_only,
            "destructiveHint": hints.destructive,
            "idempotentHint": hints.idempotent,
            "openWorldHint": hints.open_world,
        },
        "_meta": {
            "toolgrid.dev/tool": tool.tool,
            "toolgrid.dev/command": tool.command,
            "toolgrid.dev/effect": tool.effect.as_str(),
            "toolgrid.dev/errors": tool.errors.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
        },
    });
    if let Some(schema) = &tool.output_schema {
        out["outputSchema"] = output_schema(schema);
    }
    out
}

/// The opaque cursor naming the page that starts at `offset`.
pub fn cursor(offset: usize) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("tools:{offset}"))
}

/// The offset a cursor names; a cursor this server did not make is invalid params.
pub fn parse_cursor(cursor: Option<&Value>) -> Result<usize, RpcError> {
    let invalid = || RpcError::new(INVALID_PARAMS, "Invalid params: unknown cursor");
    let Some(cursor) = cursor else {
        return Ok(0);
    };
    if cursor.is_null() {
        return Ok(0);
    }
    let text = cursor.as_str().ok_or_else(invalid)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| invalid())?;
    String::from_utf8(bytes)
        .ok()
        .and_then(|s| s.strip_prefix("tools:").and_then(|n| n.parse().ok()))
        .ok_or_else(invalid)
}

/// One page of tools: the page's tools and the cursor of the next, if any.
pub fn page(tools: &[ModelTool], offset: usize) -> Result<(Vec<Value>, Option<String>), RpcError> {
    if offset > tools.len() {
        return Err(RpcError::new(
            INVALID_PARAMS,
            "Invalid params: unknown cursor",
        ));
    }
    let end = (offset + PAGE_SIZE).min(tools.len());
    let next = (end < tools.len()).then(|| cursor(end));
    Ok((tools[offset..end].iter().map(tool_json).collect(), next))
}

/// A failed or refused call as a `CallToolResult`.
pub fn error_result(kind: &str, name: &str, message: &str, call_id: Option<&str>) -> Value {
    let text = if name.is_empty() {
        format!("{kind}: {message}")
    } else {
        format!("{kind} ({name}): {message}")
    };
    let mut error = json!({"kind": kind, "message": message});
    if !name.is_empty() {
        error["name"] = json!(name);
    }
    let mut meta = json!({META_ERROR: error});
    if let Some(id) = call_id {
        meta[META_CALL_ID] = json!(id);
        error["callId"] = json!(id);
        meta[META_ERROR] = error;
    }
    json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
        "_meta": meta,
    })
}

/// A succeeded call as a `CallToolResult`.
pub fn success_result(tool: &ModelTool, shaped: ModelResult, call_id: &str) -> Value {
    let mut meta = json!({META_CALL_ID: call_id});
    if let Some(page) = &shaped.page {
        meta["toolgrid.dev/page"] =
            json!({"page": page.page, "pages": page.pages, "next": page.next});
    }
    if let Some(file) = &shaped.file {
        meta["toolgrid.dev/file"] = json!(file);
    }
    if shaped.truncated {
        meta["toolgrid.dev/truncated"] = json!(true);
    }
    let mut content = vec![json!({"type": "text", "text": shaped.text})];
    if let Some(next) = shaped.page.as_ref().and_then(|p| p.next.clone()) {
        content.push(json!({
            "type": "resource_link",
            "uri": next,
            "name": "next page of the result",
            "mimeType": "application/json",
        }));
    }
    let mut out = json!({"content": content, "isError": false, "_meta": meta});
    if let Some(value) = shaped
        .structured
        .and_then(|v| structured(tool.output_schema.as_ref(), v))
    {
        out["structuredContent"] = value;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_schemas_are_object_schemas() {
        let object = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(output_schema(&object)["properties"]["a"]["type"], "string");
        let string = json!({"type": "string"});
        let wrapped = output_schema(&string);
        assert_eq!(wrapped["type"], "object");
        assert_eq!(wrapped["properties"]["result"]["type"], "string");
        assert_eq!(wrapped["$schema"], SCHEMA_DIALECT);
        assert_eq!(
            structured(Some(&string), json!("x")),
            Some(json!({"result": "x"}))
        );
        assert_eq!(
            structured(Some(&object), json!({"a": "x"})),
            Some(json!({"a": "x"}))
        );
        assert_eq!(structured(None, json!([1])), None);
    }

    #[test]
    fn cursors_round_trip_and_strangers_are_invalid() {
        assert_eq!(parse_cursor(Some(&json!(cursor(50)))), Ok(50));
        assert_eq!(parse_cursor(None), Ok(0));
        for bad in [json!("nope"), json!(3), json!(cursor(1).replace('d', "x"))] {
            assert_eq!(parse_cursor(Some(&bad)).unwrap_err().code, INVALID_PARAMS);
        }
        assert_eq!(page(&[], 10).unwrap_err().code, INVALID_PARAMS);
    }

    fn sample(effect: toolgrid_api::Effect, output: Option<Value>) -> ModelTool {
        ModelTool {
            name: "semver__compare".into(),
            tool: "semver".into(),
            command: "compare".into(),
            title: "semver compare".into(),
            description: "Compare two versions".into(),
            effect,
            input_schema: json!({"type": "object", "properties": {"a": {"type": "string"}},
                "required": ["a"], "additionalProperties": false}),
            output_schema: output,
            stdin_text: true,
            errors: vec![],
            result_policy: toolgrid_api::ResultPolicy {
                max_inline_bytes: None,
                overflow: Default::default(),
            },
        }
    }

    /// The shapes parse as the Rust SDK's (rmcp) model types.
    #[test]
    fn shapes_are_the_sdks_types() {
        let tool = sample(
            toolgrid_api::Effect::Write,
            Some(json!({"type": "integer"})),
        );
        let parsed: rmcp::model::Tool = serde_json::from_value(tool_json(&tool)).unwrap();
        let annotations = parsed.annotations.unwrap();
        assert_eq!(annotations.destructive_hint, Some(true));
        assert_eq!(annotations.read_only_hint, Some(false));
        assert!(parsed.output_schema.is_some());
        let shaped = ModelResult {
            structured: Some(json!(3)),
            text: "3".into(),
            page: None,
            file: None,
            truncated: false,
        };
        let ok: rmcp::model::CallToolResult =
            serde_json::from_value(success_result(&tool, shaped, "c1")).unwrap();
        assert_eq!(ok.structured_content, Some(json!({"result": 3})));
        let failed: rmcp::model::CallToolResult =
            serde_json::from_value(error_result("denied", "", "no", None)).unwrap();
        assert_eq!(failed.is_error, Some(true));
    }

    #[test]
    fn errors_carry_kind_name_and_message() {
        let r = error_result("tool-error", "invalid-version", "not semver", Some("c1"));
        assert_eq!(r["isError"], true);
        assert_eq!(r["_meta"][META_ERROR]["name"], "invalid-version");
        assert_eq!(r["_meta"][META_ERROR]["callId"], "c1");
        assert!(
            r["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("invalid-version")
        );
    }
}
