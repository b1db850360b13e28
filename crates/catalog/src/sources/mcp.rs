//! An MCP server's `tools/list` answer as imported tools.
//!
//! Each tool the server lists becomes an [`ImportedTool`] whose one command takes the
//! input schema's properties as options (local `$ref`s into `$defs`/`definitions` inlined,
//! since each option's schema stands alone), whose result is the output schema, and whose
//! effect comes from the annotations: `readOnlyHint` reads, `idempotentHint` is idempotent,
//! anything else writes (a server's hints are not trusted to be careful, so the absence of
//! a hint is the careful answer), unless the ToolSource overrides it. What cannot be
//! imported is listed with its reason ([`LeftOut`]); nothing a server sends can fail the
//! whole listing but its size, which the caller bounds when reading.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use toolgrid_core::source::{
    ImportedTool, LeftOut, LeftOutReason, SourceLimits, SourceSnapshot, ToolFilter, UpstreamTarget,
    cut_text, schema_bytes, valid_argument_name, valid_imported_name,
};
use toolgrid_core::spec::{Command, Effect, OptionArg};

/// How deep `$ref`s are followed when inlined.
const MAX_REF_DEPTH: usize = 32;

/// One tool of a `tools/list` answer, as far as importing needs it (both protocol eras).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct McpTool {
    name: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    input_schema: Option<Value>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    annotations: Option<Annotations>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Annotations {
    #[serde(default)]
    read_only_hint: Option<bool>,
    #[serde(default)]
    idempotent_hint: Option<bool>,
}

/// The effect MCP annotations give a tool: `readOnlyHint` reads; `idempotentHint` is
/// idempotent; otherwise it writes.
fn effect_of(annotations: Option<&Annotations>) -> Effect {
    match annotations {
        Some(a) if a.read_only_hint == Some(true) => Effect::Read,
        Some(a) if a.idempotent_hint == Some(true) => Effect::Idempotent,
        _ => Effect::Write,
    }
}

/// The tools of `listed` (every `tools` entry of every `tools/list` page, in order) that
/// `source` imports: those `filter` admits, each with the effect `overrides` gives it or
/// its annotations', within `limits`.
pub fn read_mcp_tools(
    listed: &[Value],
    source: &str,
    filter: &ToolFilter,
    overrides: &BTreeMap<String, Effect>,
    limits: &SourceLimits,
) -> SourceSnapshot {
    let mut snapshot = SourceSnapshot::default();
    let mut seen = BTreeSet::new();
    for raw in listed {
        let name = raw
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("(unnamed)")
            .to_string();
        let left_out = |reason: LeftOutReason, message: String| LeftOut {
            name: cut_text(&name, 256).to_string(),
            reason,
            message,
        };
        let tool = match McpTool::deserialize(raw) {
            Ok(tool) => tool,
            Err(error) => {
                snapshot.left_out.push(left_out(
                    LeftOutReason::UnsupportedSchema,
                    format!("not a tool: {error}"),
                ));
                continue;
            }
        };
        if !filter.admits(&tool.name) {
            snapshot.left_out.push(left_out(
                LeftOutReason::NotAllowed,
                "not admitted by allowTools/denyTools".into(),
            ));
            continue;
        }
        if !valid_imported_name(source, &tool.name) || !seen.insert(tool.name.clone()) {
            snapshot.left_out.push(left_out(
                LeftOutReason::InvalidName,
                format!(
                    "{:?} cannot follow \"{source}__\" in a tool name (letters, digits, '-' \
                     and '_', 64 characters in all) or is listed twice",
                    cut_text(&tool.name, 256)
                ),
            ));
            continue;
        }
        if snapshot.tools.len() >= limits.max_tools {
            snapshot.left_out.push(left_out(
                LeftOutReason::TooLarge,
                format!("the source offers more than {} tools", limits.max_tools),
            ));
            continue;
        }
        match import(tool, overrides, limits) {
            Ok(imported) => match super::callable(imported) {
                Ok(imported) => snapshot.tools.push(imported),
                Err(left_out) => snapshot.left_out.push(left_out),
            },
            Err((reason, message)) => snapshot.left_out.push(left_out(reason, message)),
        }
    }
    super::bound(snapshot, limits)
}

/// One admitted tool as an [`ImportedTool`], or why it cannot be.
fn import(
    tool: McpTool,
    overrides: &BTreeMap<String, Effect>,
    limits: &SourceLimits,
) -> Result<ImportedTool, (LeftOutReason, String)> {
    let unsupported = |message: String| (LeftOutReason::UnsupportedSchema, message);
    let input = tool
        .input_schema
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    for schema in std::iter::once(&input).chain(tool.output_schema.as_ref()) {
        if schema_bytes(schema) > limits.max_schema_bytes {
            return Err((
                LeftOutReason::TooLarge,
                format!("a schema is larger than {} bytes", limits.max_schema_bytes),
            ));
        }
    }
    let Value::Object(input) = input else {
        return Err(unsupported("the input schema is not an object".into()));
    };
    if input.get("type").is_some_and(|t| t != "object") {
        return Err(unsupported("the input schema is not of type object".into()));
    }
    let required: BTreeSet<&str> = input
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut options = Vec::new();
    if let Some(properties) = input.get("properties") {
        let Value::Object(properties) = properties else {
            return Err(unsupported("`properties` is not an object".into()));
        };
        for (name, schema) in properties {
            if !valid_argument_name(name) {
                return Err(unsupported(format!(
                    "the argument {:?} cannot be an option name",
                    cut_text(name, 64)
                )));
            }
            let schema = inline_refs(schema, &input, 0).map_err(unsupported)?;
            options.push(OptionArg {
                name: name.clone(),
                short: None,
                description: schema
                    .get("description")
                    .and_then(Value::as_str)
                    .map(|d| cut_text(d, limits.max_description_bytes).to_string())
                    .unwrap_or_default(),
                schema: Some(schema),
                default: None,
                required: required.contains(name.as_str()),
            });
        }
    }
    let result = match &tool.output_schema {
        Some(Value::Object(output)) => {
            Some(inline_refs(&Value::Object(output.clone()), output, 0).map_err(unsupported)?)
        }
        Some(_) => return Err(unsupported("the output schema is not an object".into())),
        None => None,
    };
    let description = tool
        .description
        .or(tool.title)
        .map(|d| cut_text(&d, limits.max_description_bytes).to_string())
        .unwrap_or_default();
    Ok(ImportedTool {
        effect: overrides
            .get(&tool.name)
            .copied()
            .unwrap_or_else(|| effect_of(tool.annotations.as_ref())),
        command: Command {
            name: "default".into(),
            description: description.clone(),
            positional: Vec::new(),
            options,
            flags: Vec::new(),
            stdin: None,
            result,
            errors: Vec::new(),
            dry_run_result: None,
            allow_repeat: false,
        },
        description,
        target: UpstreamTarget::Mcp {
            tool: tool.name.clone(),
        },
        name: tool.name,
    })
}

/// `schema` with every local `$ref` (`#/$defs/…`, `#/definitions/…`) into `root` replaced
/// by what it names, and the root's `$defs`/`definitions` dropped; a ref that is not local,
/// names nothing, or goes deeper than [`MAX_REF_DEPTH`] (a cycle) is an error.
fn inline_refs(schema: &Value, root: &Map<String, Value>, depth: usize) -> Result<Value, String> {
    if depth > MAX_REF_DEPTH {
        return Err("a `$ref` cycle, or references nested too deep".into());
    }
    match schema {
        Value::Object(map) => {
            if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
                let target = resolve_local(reference, root)
                    .ok_or_else(|| format!("`$ref` {reference:?} names nothing in the schema"))?;
                let mut inlined = inline_refs(target, root, depth + 1)?;
                // Siblings of `$ref` (a description, say) stay.
                if let Value::Object(inlined_map) = &mut inlined {
                    for (key, value) in map {
                        if key != "$ref" {
                            inlined_map.insert(key.clone(), inline_refs(value, root, depth + 1)?);
                        }
                    }
                }
                return Ok(inlined);
            }
            let mut out = Map::new();
            for (key, value) in map {
                if depth == 0 && (key == "$defs" || key == "definitions") {
                    continue;
                }
                out.insert(key.clone(), inline_refs(value, root, depth + 1)?);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => items
            .iter()
            .map(|v| inline_refs(v, root, depth + 1))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other.clone()),
    }
}

/// What a local JSON pointer `#/…` names in `root`.
fn resolve_local<'a>(reference: &str, root: &'a Map<String, Value>) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    let mut parts = pointer.split('/').skip(1);
    let first = parts.next()?;
    let mut at = root.get(&unescape(first))?;
    for part in parts {
        at = match at {
            Value::Object(map) => map.get(&unescape(part))?,
            Value::Array(items) => items.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

fn unescape(part: &str) -> String {
    part.replace("~1", "/").replace("~0", "~")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(listed: &[Value]) -> SourceSnapshot {
        read_mcp_tools(
            listed,
            "everything",
            &ToolFilter::default(),
            &BTreeMap::new(),
            &SourceLimits::default(),
        )
    }

    #[test]
    fn a_tool_becomes_one_command_with_an_option_per_property() {
        let snapshot = read(&[json!({
            "name": "add",
            "description": "Adds two numbers",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "a": {"type": "number", "description": "First"},
                    "b": {"type": "number"}
                },
                "required": ["a", "b"]
            },
            "outputSchema": {"type": "object", "properties": {"sum": {"type": "number"}}},
            "annotations": {"readOnlyHint": true}
        })]);
        assert!(snapshot.left_out.is_empty(), "{:?}", snapshot.left_out);
        let tool = &snapshot.tools[0];
        assert_eq!(tool.name, "add");
        assert_eq!(tool.effect, Effect::Read);
        assert_eq!(tool.target, UpstreamTarget::Mcp { tool: "add".into() });
        assert_eq!(tool.command.name, "default");
        let a = &tool.command.options[0];
        assert_eq!(
            (a.name.as_str(), a.required, a.description.as_str()),
            ("a", true, "First")
        );
        assert_eq!(
            a.schema,
            Some(json!({"type": "number", "description": "First"}))
        );
        assert_eq!(
            tool.command.result,
            Some(json!({"type": "object", "properties": {"sum": {"type": "number"}}}))
        );
    }

    #[test]
    fn a_tool_toolgrid_could_not_call_is_left_out() {
        let snapshot = read(&[
            json!({"name": "camel", "inputSchema": {"type": "object", "properties": {"petId": {"type": "integer"}}}}),
            json!({"name": "broken", "inputSchema": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}),
        ]);
        assert_eq!(snapshot.tools.len(), 1);
        assert_eq!(snapshot.tools[0].command.options[0].name, "petId");
        assert_eq!(snapshot.left_out[0].name, "broken");
        assert_eq!(
            snapshot.left_out[0].reason,
            LeftOutReason::UnsupportedSchema
        );
        assert!(
            snapshot.left_out[0]
                .message
                .contains("not a valid JSON Schema"),
            "{}",
            snapshot.left_out[0].message
        );
    }

    #[test]
    fn effects_come_from_annotations_unless_overridden() {
        let tool = |name: &str, annotations: Value| json!({"name": name, "inputSchema": {"type": "object"}, "annotations": annotations});
        let listed = [
            tool(
                "reader",
                json!({"readOnlyHint": true, "idempotentHint": true}),
            ),
            tool("setter", json!({"idempotentHint": true})),
            tool("writer", json!({"destructiveHint": false})),
            tool("plain", Value::Null),
            tool("overridden", json!({"readOnlyHint": true})),
        ];
        let overrides = BTreeMap::from([("overridden".to_string(), Effect::Write)]);
        let snapshot = read_mcp_tools(
            &listed,
            "s",
            &ToolFilter::default(),
            &overrides,
            &SourceLimits::default(),
        );
        let effects: Vec<(&str, Effect)> = snapshot
            .tools
            .iter()
            .map(|t| (t.name.as_str(), t.effect))
            .collect();
        assert_eq!(
            effects,
            [
                ("reader", Effect::Read),
                ("setter", Effect::Idempotent),
                ("writer", Effect::Write),
                ("plain", Effect::Write),
                ("overridden", Effect::Write),
            ]
        );
    }

    #[test]
    fn local_refs_are_inlined_and_cycles_refused() {
        let snapshot = read(&[
            json!({
                "name": "order",
                "inputSchema": {
                    "type": "object",
                    "$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}}}},
                    "properties": {"item": {"$ref": "#/$defs/Item", "description": "what"}}
                }
            }),
            json!({
                "name": "loop",
                "inputSchema": {
                    "type": "object",
                    "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
                    "properties": {"head": {"$ref": "#/$defs/Node"}}
                }
            }),
            json!({
                "name": "dangling",
                "inputSchema": {"type": "object", "properties": {"x": {"$ref": "#/$defs/Nope"}}}
            }),
        ]);
        assert_eq!(
            snapshot.tools[0].command.options[0].schema,
            Some(
                json!({"type": "object", "properties": {"sku": {"type": "string"}}, "description": "what"})
            )
        );
        let reasons: Vec<(&str, LeftOutReason)> = snapshot
            .left_out
            .iter()
            .map(|l| (l.name.as_str(), l.reason))
            .collect();
        assert_eq!(
            reasons,
            [
                ("loop", LeftOutReason::UnsupportedSchema),
                ("dangling", LeftOutReason::UnsupportedSchema)
            ]
        );
    }

    #[test]
    fn hostile_listings_are_bounded_and_named() {
        let limits = SourceLimits {
            max_tools: 2,
            max_description_bytes: 16,
            max_schema_bytes: 1024,
            ..SourceLimits::default()
        };
        let filter = ToolFilter {
            allow: vec![],
            deny: vec!["secret-*".into()],
        };
        let listed = [
            json!({"name": "a", "description": "x".repeat(100_000)}),
            json!({"name": "a"}),
            json!({"name": "has space"}),
            json!({"name": "secret-admin"}),
            json!({"name": "big", "inputSchema": {"type": "object", "properties": {"p": {"enum": vec!["v"; 1000]}}}}),
            json!({"name": "not-object", "inputSchema": {"type": "string"}}),
            json!({"name": "bad-arg", "inputSchema": {"type": "object", "properties": {"a b": {}}}}),
            json!({"description": "no name"}),
            json!(42),
            json!({"name": "b"}),
            json!({"name": "c"}),
        ];
        let snapshot = read_mcp_tools(&listed, "s", &filter, &BTreeMap::new(), &limits);
        assert_eq!(
            snapshot
                .tools
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(snapshot.tools[0].description.len(), 16, "cut to the limit");
        let reasons: Vec<(&str, LeftOutReason)> = snapshot
            .left_out
            .iter()
            .map(|l| (l.name.as_str(), l.reason))
            .collect();
        assert_eq!(
            reasons,
            [
                ("a", LeftOutReason::InvalidName),
                ("has space", LeftOutReason::InvalidName),
                ("secret-admin", LeftOutReason::NotAllowed),
                ("big", LeftOutReason::TooLarge),
                ("not-object", LeftOutReason::UnsupportedSchema),
                ("bad-arg", LeftOutReason::UnsupportedSchema),
                ("(unnamed)", LeftOutReason::UnsupportedSchema),
                ("(unnamed)", LeftOutReason::UnsupportedSchema),
                ("c", LeftOutReason::TooLarge),
            ]
        );
    }
}
