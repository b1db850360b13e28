//! Model tool schemas: [`ModelTool`]s in the shapes model APIs take, so an agent loop can
//! hand them to a model unchanged (`GET /v1/tools?format=`, `toolgrid schema --format`).
//!
//! - [`ModelFormat::OpenAi`]: Chat Completions function tools,
//!   `{type: "function", function: {name, description, parameters, strict}}` (the Responses
//!   API takes the same fields flattened: `{type: "function", name, description,
//!   parameters, strict}`). With `strict: true` the parameters obey strict mode: every
//!   object lists all its properties in `required` and has `additionalProperties: false`,
//!   an optional property is nullable (`null` means absent), and keywords strict mode does
//!   not support (`default`, `examples`, `minLength`, unknown `format`s, ...) move into the
//!   description. A schema strict mode cannot express (a free-form value or object,
//!   `allOf`/`not`/`if`, tuples, or one over strict mode's size limits) is sent with
//!   `strict: false` and its original parameters, and the reason is listed in the answer's
//!   `notes`: nothing is dropped silently.
//! - [`ModelFormat::Anthropic`]: `{name, description, input_schema}`.
//! - [`ModelFormat::JsonSchema`]: toolgrid's own plain view (name, title, description,
//!   inputSchema, outputSchema, annotations, effect, errors).
//!
//! Names: OpenAI and Anthropic take `^[a-zA-Z0-9_-]{1,64}$`. `<tool>__<command>` fits the
//! pattern (kebab-case names); a longer one becomes [`fit_name`]'s deterministic short name
//! (its first 55 characters, `_`, and 8 hex digits of its SHA-256). Every answer carries a
//! `names` map from each name it uses to the tool and command it calls.
//!
//! Pure: no IO; the front doors only pick the tools and serialize the answer.

use super::model_tools::{Hints, ModelTool};
pub use crate::json_schema::admits_null;
use crate::json_schema::types_of;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use toolgrid_core::error::{ApiError, ErrorKind};

/// The longest name OpenAI and Anthropic accept.
pub const MAX_NAME_LEN: usize = 64;

/// OpenAI strict mode's limits (its Structured Outputs guide, "Supported schemas").
pub const MAX_STRICT_PROPERTIES: usize = 5000;
pub const MAX_STRICT_DEPTH: usize = 10;
pub const MAX_STRICT_ENUM_VALUES: usize = 1000;
pub const MAX_STRICT_STRING_CHARS: usize = 120_000;

/// The shape asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    OpenAi,
    Anthropic,
    JsonSchema,
}

impl ModelFormat {
    pub const ALL: [ModelFormat; 3] = [
        ModelFormat::OpenAi,
        ModelFormat::Anthropic,
        ModelFormat::JsonSchema,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ModelFormat::OpenAi => "openai",
            ModelFormat::Anthropic => "anthropic",
            ModelFormat::JsonSchema => "json-schema",
        }
    }
}

impl std::str::FromStr for ModelFormat {
    type Err = ApiError;

    /// An unknown format is `invalid-argument`.
    fn from_str(s: &str) -> Result<Self, ApiError> {
        ModelFormat::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("unknown format {s:?}: use openai, anthropic or json-schema"),
                )
            })
    }
}

fn name_char_ok(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// A name within `^[a-zA-Z0-9_-]{1,64}$`: `name` itself when it fits; otherwise its first
/// 55 characters (any outside the pattern replaced by `_`), then `_` and the first 8 hex
/// digits of the SHA-256 of the whole original name.
pub fn fit_name(name: &str) -> String {
    if !name.is_empty() && name.len() <= MAX_NAME_LEN && name.chars().all(name_char_ok) {
        return name.to_string();
    }
    let clean: String = name
        .chars()
        .map(|c| if name_char_ok(c) { c } else { '_' })
        .collect();
    let hash = hex::encode(Sha256::digest(name.as_bytes()));
    let head: String = clean.chars().take(MAX_NAME_LEN - 9).collect();
    format!("{head}_{}", &hash[..8])
}

/// The tools as `format` shapes them: `{format, tools, names, notes}`. `tools` is the
/// array to hand the model API; `names` maps each tool's name to `{tool, command}`;
/// `notes` lists, per name, what could not be said in the format (empty when nothing).
pub fn render(tools: &[ModelTool], format: ModelFormat) -> Value {
    let mut out = Vec::new();
    let mut names = Map::new();
    let mut notes = Map::new();
    for tool in tools {
        let name = match format {
            ModelFormat::JsonSchema => tool.name.clone(),
            _ => fit_name(&tool.name),
        };
        let mut tool_notes = Vec::new();
        if name != tool.name {
            tool_notes.push(format!(
                "{:?} is longer than {MAX_NAME_LEN} characters or has characters the API refuses; named {name:?}",
                tool.name
            ));
        }
        let entry = match format {
            ModelFormat::OpenAi => openai_tool(tool, &name, &mut tool_notes),
            ModelFormat::Anthropic => anthropic_tool(tool, &name),
            ModelFormat::JsonSchema => json_schema_tool(tool),
        };
        out.push(entry);
        names.insert(
            name.clone(),
            json!({"tool": tool.tool, "command": tool.command}),
        );
        if !tool_notes.is_empty() {
            notes.insert(name, json!(tool_notes));
        }
    }
    json!({"format": format.as_str(), "tools": out, "names": names, "notes": notes})
}

/// The tool a name in `render`'s answer calls (the name as given, or its shortened form).
pub fn resolve_name<'a>(tools: &'a [ModelTool], name: &str) -> Option<&'a ModelTool> {
    tools
        .iter()
        .find(|t| t.name == name)
        .or_else(|| tools.iter().find(|t| fit_name(&t.name) == name))
}

fn anthropic_tool(tool: &ModelTool, name: &str) -> Value {
    let mut schema = tool.input_schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("type".into(), json!("object"));
    } else {
        schema = json!({"type": "object"});
    }
    json!({"name": name, "description": tool.description, "input_schema": schema})
}

fn json_schema_tool(tool: &ModelTool) -> Value {
    let hints = Hints::of(tool.effect);
    let mut out = json!({
        "name": tool.name,
        "tool": tool.tool,
        "command": tool.command,
        "title": tool.title,
        "description": tool.description,
        "effect": tool.effect.as_str(),
        "inputSchema": tool.input_schema,
        "annotations": {
            "title": tool.title,
            "readOnlyHint": hints.read_only,
            "destructiveHint": hints.destructive,
            "idempotentHint": hints.idempotent,
            "openWorldHint": hints.open_world,
        },
        "errors": tool.errors.iter().map(|e| json!({
            "name": e.name,
            "exitCode": e.exit_code,
            "description": e.description,
            "retryable": e.retryable,
        })).collect::<Vec<_>>(),
    });
    if let Some(output) = &tool.output_schema {
        out["outputSchema"] = output.clone();
    }
    out
}

fn openai_tool(tool: &ModelTool, name: &str, notes: &mut Vec<String>) -> Value {
    let (parameters, strict) = match strict_parameters(&tool.input_schema) {
        Ok(schema) => (schema, true),
        Err(why) => {
            notes.push(format!("sent with strict: false: {why}"));
            (tool.input_schema.clone(), false)
        }
    };
    json!({
        "type": "function",
        "function": {
            "name": name,
            "description": tool.description,
            "parameters": parameters,
            "strict": strict,
        }
    })
}

/// Why a schema cannot be said in strict mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotStrict(pub String);

fn not_strict(at: &str, why: impl std::fmt::Display) -> NotStrict {
    NotStrict(format!("{}: {why}", if at.is_empty() { "/" } else { at }))
}

/// Keywords strict mode takes, for any schema (structure and annotations).
const STRICT_GENERAL: &[&str] = &[
    "type",
    "description",
    "title",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "properties",
    "required",
    "additionalProperties",
    "items",
];
/// Strict mode's supported constraints: strings, numbers, arrays.
const STRICT_CONSTRAINTS: &[&str] = &[
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];
/// The string formats strict mode supports.
pub const STRICT_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];
/// Keywords that change what is valid in a way strict mode cannot say.
const STRICT_IMPOSSIBLE: &[&str] = &[
    "allOf",
    "not",
    "if",
    "then",
    "else",
    "prefixItems",
    "patternProperties",
    "dependentSchemas",
    "dependentRequired",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
    "contains",
    "$dynamicRef",
];

/// Counters of strict mode's size limits over one schema.
#[derive(Default)]
struct Budget {
    properties: usize,
    enum_values: usize,
    chars: usize,
}

/// The parameters of a strict OpenAI function: the input schema made strict.
pub fn strict_parameters(input: &Value) -> Result<Value, NotStrict> {
    let mut budget = Budget::default();
    let mut out = strictify(input, "", 1, &mut budget)?;
    if !matches!(out.get("type"), Some(Value::String(t)) if t == "object") {
        return Err(not_strict("", "the root must be an object schema"));
    }
    if let (Some(defs), Some(obj)) = (input.get("$defs"), out.as_object_mut()) {
        let mut strict_defs = Map::new();
        for (name, def) in defs.as_object().into_iter().flatten() {
            budget.chars += name.len();
            strict_defs.insert(
                name.clone(),
                strictify(def, &format!("/$defs/{name}"), 1, &mut budget)?,
            );
        }
        obj.insert("$defs".into(), Value::Object(strict_defs));
    }
    if budget.properties > MAX_STRICT_PROPERTIES {
        return Err(not_strict(
            "",
            format!(
                "{} properties, over strict mode's {MAX_STRICT_PROPERTIES}",
                budget.properties
            ),
        ));
    }
    if budget.enum_values > MAX_STRICT_ENUM_VALUES {
        return Err(not_strict(
            "",
            format!(
                "{} enum values, over strict mode's {MAX_STRICT_ENUM_VALUES}",
                budget.enum_values
            ),
        ));
    }
    if budget.chars > MAX_STRICT_STRING_CHARS {
        return Err(not_strict(
            "",
            format!(
                "{} characters of names and enum values, over strict mode's {MAX_STRICT_STRING_CHARS}",
                budget.chars
            ),
        ));
    }
    Ok(out)
}

/// Appends `text` to a schema's description.
fn describe(obj: &mut Map<String, Value>, text: &str) {
    let joined = match obj.get("description").and_then(Value::as_str) {
        Some(d) if !d.is_empty() => {
            let sep = if d.ends_with('.') { " " } else { ". " };
            format!("{d}{sep}{text}")
        }
        _ => text.to_string(),
    };
    obj.insert("description".into(), json!(joined));
}

fn strictify(
    schema: &Value,
    at: &str,
    depth: usize,
    budget: &mut Budget,
) -> Result<Value, NotStrict> {
    if depth > MAX_STRICT_DEPTH {
        return Err(not_strict(
            at,
            format!("nested deeper than strict mode's {MAX_STRICT_DEPTH} levels"),
        ));
    }
    let Some(input) = schema.as_object() else {
        return Err(not_strict(
            at,
            "any value (a boolean schema) has no strict form",
        ));
    };
    for keyword in STRICT_IMPOSSIBLE {
        if input.contains_key(*keyword) {
            return Err(not_strict(at, format!("`{keyword}` has no strict form")));
        }
    }
    let mut out = Map::new();
    let mut moved: Vec<String> = Vec::new();
    for (key, value) in input {
        match key.as_str() {
            "$defs"
            | "properties"
            | "required"
            | "additionalProperties"
            | "items"
            | "anyOf"
            | "oneOf" => {}
            "enum" => {
                let n = value.as_array().map_or(0, Vec::len);
                budget.enum_values += n;
                budget.chars += value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::len)
                    .sum::<usize>();
                out.insert(key.clone(), value.clone());
            }
            "const" => {
                budget.chars += value.as_str().map_or(0, str::len);
                out.insert(key.clone(), value.clone());
            }
            "format" => match value.as_str() {
                Some(f) if STRICT_FORMATS.contains(&f) => {
                    out.insert(key.clone(), value.clone());
                }
                _ => moved.push(format!("format: {}", compact(value))),
            },
            "$schema" | "$id" | "$comment" => {}
            k if STRICT_GENERAL.contains(&k) || STRICT_CONSTRAINTS.contains(&k) => {
                out.insert(key.clone(), value.clone());
            }
            "default" => moved.insert(0, format!("Default: {}", compact(value))),
            other => moved.push(format!("{other}: {}", compact(value))),
        }
    }
    let types = types_of(input);
    // Alternatives.
    if let Some(branches) = input.get("anyOf").or_else(|| input.get("oneOf")) {
        let Some(branches) = branches.as_array() else {
            return Err(not_strict(at, "anyOf must be an array"));
        };
        let mut strict = Vec::new();
        for (i, b) in branches.iter().enumerate() {
            strict.push(strictify(b, &format!("{at}/anyOf/{i}"), depth, budget)?);
        }
        if input.contains_key("oneOf") {
            moved.push("exactly one of the alternatives".into());
        }
        out.insert("anyOf".into(), Value::Array(strict));
    }
    let is_object = types.iter().any(|t| t == "object") || input.contains_key("properties");
    if is_object {
        if types.len() > 1 {
            return Err(not_strict(at, "an object that may also be another type"));
        }
        let properties = input
            .get("properties")
            .and_then(Value::as_object)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| {
                not_strict(at, "a free-form object (no properties) has no strict form")
            })?;
        if let Some(extra) = input.get("additionalProperties")
            && extra != &Value::Bool(false)
        {
            return Err(not_strict(at, "an object taking extra properties"));
        }
        let required: Vec<&str> = input
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut strict_props = Map::new();
        for (name, property) in properties {
            budget.properties += 1;
            budget.chars += name.len();
            let path = format!("{at}/properties/{name}");
            let mut strict = strictify(property, &path, depth + 1, budget)?;
            if !required.contains(&name.as_str()) && !admits_null(property) {
                strict = nullable(strict);
            }
            strict_props.insert(name.clone(), strict);
        }
        out.insert("type".into(), json!("object"));
        out.insert(
            "required".into(),
            json!(strict_props.keys().cloned().collect::<Vec<_>>()),
        );
        out.insert("properties".into(), Value::Object(strict_props));
        out.insert("additionalProperties".into(), json!(false));
    } else if types.iter().any(|t| t == "array") || input.contains_key("items") {
        let items = input
            .get("items")
            .ok_or_else(|| not_strict(at, "an array without an item schema"))?;
        out.insert(
            "items".into(),
            strictify(items, &format!("{at}/items"), depth + 1, budget)?,
        );
        out.entry("type").or_insert(json!("array"));
    } else if types.is_empty()
        && !out.contains_key("anyOf")
        && !out.contains_key("enum")
        && !out.contains_key("const")
        && !out.contains_key("$ref")
    {
        return Err(not_strict(at, "a value of any type has no strict form"));
    }
    // A type union of several non-null types becomes alternatives of one type each.
    let non_null: Vec<&String> = types.iter().filter(|t| *t != "null").collect();
    if non_null.len() > 1 && !is_object {
        let mut branches = Vec::new();
        for t in &types {
            let mut branch = out.clone();
            branch.remove("description");
            branch.remove("title");
            branch.insert("type".into(), json!(t));
            branches.push(Value::Object(branch));
        }
        let mut alt = Map::new();
        for k in ["description", "title"] {
            if let Some(v) = out.get(k) {
                alt.insert(k.into(), v.clone());
            }
        }
        alt.insert("anyOf".into(), Value::Array(branches));
        out = alt;
    }
    if !moved.is_empty() {
        describe(&mut out, &format!("{}.", moved.join("; ")));
    }
    Ok(Value::Object(out))
}

/// `schema` or null (null: the property is absent).
fn nullable(schema: Value) -> Value {
    let Value::Object(mut obj) = schema else {
        return schema;
    };
    // A scalar type gains "null"; an object or array (whose keywords are structural) and
    // anything with enum, const or alternatives goes into anyOf.
    let simple = matches!(obj.get("type"), Some(Value::String(t)) if t != "object" && t != "array")
        && !obj.contains_key("enum")
        && !obj.contains_key("const")
        && !obj.contains_key("anyOf");
    if simple {
        let t = obj.remove("type").unwrap_or_default();
        obj.insert("type".into(), json!([t, "null"]));
        return Value::Object(obj);
    }
    if !obj.contains_key("anyOf")
        && !obj.contains_key("properties")
        && !obj.contains_key("items")
        && let Some(Value::Array(ts)) = obj.get_mut("type")
    {
        ts.push(json!("null"));
        if let Some(Value::Array(values)) = obj.get_mut("enum") {
            values.push(Value::Null);
        }
        return Value::Object(obj);
    }
    if let Some(Value::Array(branches)) = obj.get_mut("anyOf") {
        branches.push(json!({"type": "null"}));
        return Value::Object(obj);
    }
    let mut outer = Map::new();
    for k in ["description", "title"] {
        if let Some(v) = obj.remove(k) {
            outer.insert(k.into(), v);
        }
    }
    outer.insert(
        "anyOf".into(),
        json!([Value::Object(obj), {"type": "null"}]),
    );
    Value::Object(outer)
}

fn compact(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_api::{DeclaredError, Effect, ResultPolicy};

    fn tool(name: &str, input: Value) -> ModelTool {
        ModelTool {
            name: name.into(),
            tool: "t".into(),
            command: "c".into(),
            title: "t c".into(),
            description: "Does things.".into(),
            effect: Effect::Read,
            input_schema: input,
            output_schema: Some(json!({"type": "object"})),
            stdin_text: true,
            errors: vec![DeclaredError {
                name: "bad".into(),
                exit_code: 3,
                description: "Bad.".into(),
                retryable: false,
            }],
            result_policy: ResultPolicy {
                max_inline_bytes: None,
                overflow: Default::default(),
            },
        }
    }

    #[test]
    fn formats_parse_and_unknown_is_invalid_argument() {
        for f in ModelFormat::ALL {
            assert_eq!(f.as_str().parse::<ModelFormat>().unwrap(), f);
        }
        let err = "gemini".parse::<ModelFormat>().unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn short_names_stay_and_long_ones_shorten_deterministically() {
        assert_eq!(fit_name("semver__compare"), "semver__compare");
        let long = format!("{}__{}", "a".repeat(40), "b".repeat(40));
        let fitted = fit_name(&long);
        assert_eq!(fitted.len(), 64);
        assert_eq!(fitted, fit_name(&long));
        assert!(fitted.starts_with(&"a".repeat(40)));
        let other = format!("{}__{}", "a".repeat(40), "c".repeat(40));
        assert_ne!(fit_name(&other), fitted);
        assert!(fit_name("a.b").chars().all(name_char_ok));
        assert_ne!(fit_name("a.b"), fit_name("a_b"));
        let tools = vec![tool(&long, json!({"type": "object", "properties": {}}))];
        assert_eq!(resolve_name(&tools, &fitted).unwrap().name, long);
        let out = render(&tools, ModelFormat::Anthropic);
        assert_eq!(out["tools"][0]["name"], json!(fitted));
        assert_eq!(out["names"][&fitted]["tool"], json!("t"));
        assert!(out["notes"][&fitted][0].as_str().unwrap().contains("named"));
    }

    #[test]
    fn strict_mode_requires_everything_and_makes_optionals_nullable() {
        let input = json!({
            "type": "object",
            "properties": {
                "a": {"type": "string", "minLength": 1, "description": "The a"},
                "part": {"type": "string", "enum": ["major", "minor"], "default": "minor"},
                "n": {"type": "integer", "default": 3},
                "verbose": {"type": "boolean", "default": false},
                "when": {"type": "string", "format": "date-time"},
                "url": {"type": "string", "format": "uri"},
                "nested": {"type": "object", "properties": {"x": {"type": "number"}},
                           "required": []},
                "list": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
            },
            "required": ["a"],
            "additionalProperties": false,
        });
        let out = strict_parameters(&input).unwrap();
        let props = out["properties"].as_object().unwrap();
        assert_eq!(out["required"].as_array().unwrap().len(), props.len());
        assert_eq!(out["additionalProperties"], json!(false));
        assert_eq!(props["a"]["type"], json!("string"));
        assert_eq!(props["a"]["description"], json!("The a. minLength: 1."));
        assert!(props["a"].get("minLength").is_none());
        assert_eq!(props["n"]["type"], json!(["integer", "null"]));
        assert_eq!(props["n"]["description"], json!("Default: 3."));
        assert_eq!(
            props["part"]["anyOf"][1],
            json!({"type": "null"}),
            "{props:?}"
        );
        assert_eq!(props["part"]["description"], json!("Default: \"minor\"."));
        assert_eq!(props["when"]["format"], json!("date-time"));
        assert!(props["url"].get("format").is_none());
        let nested = &props["nested"]["anyOf"][0];
        assert_eq!(nested["required"], json!(["x"]));
        assert_eq!(nested["additionalProperties"], json!(false));
        assert_eq!(nested["properties"]["x"]["type"], json!(["number", "null"]));
        assert!(
            props["list"]["description"]
                .as_str()
                .unwrap()
                .contains("uniqueItems")
        );
    }

    #[test]
    fn what_strict_mode_cannot_say_goes_non_strict_with_a_note() {
        for property in [
            json!({}),
            json!({"type": "object"}),
            json!({"type": "object", "additionalProperties": {"type": "string"}}),
            json!({"allOf": [{"type": "string"}]}),
            json!({"type": "array", "prefixItems": [{"type": "string"}]}),
        ] {
            let input = json!({"type": "object", "properties": {"p": property},
                               "required": [], "additionalProperties": false});
            let out = render(&[tool("t__c", input.clone())], ModelFormat::OpenAi);
            assert_eq!(out["tools"][0]["function"]["strict"], json!(false));
            assert_eq!(out["tools"][0]["function"]["parameters"], input);
            assert!(
                out["notes"]["t__c"][0]
                    .as_str()
                    .unwrap()
                    .contains("/properties/p"),
                "{out}"
            );
        }
    }

    #[test]
    fn strict_limits_are_enforced() {
        let mut deep = json!({"type": "string"});
        for _ in 0..MAX_STRICT_DEPTH + 1 {
            deep = json!({"type": "object", "properties": {"d": deep}, "required": ["d"]});
        }
        assert!(strict_parameters(&deep).unwrap_err().0.contains("deeper"));
        let many: Map<String, Value> = (0..MAX_STRICT_ENUM_VALUES + 1)
            .map(|i| (format!("p{i}"), json!({"enum": [i]})))
            .collect();
        let wide = json!({"type": "object", "properties": many});
        assert!(strict_parameters(&wide).unwrap_err().0.contains("enum"));
    }

    #[test]
    fn type_unions_become_alternatives_and_nullable_stays_once() {
        let input = json!({"type": "object", "properties": {
            "v": {"type": ["string", "integer"], "description": "A value"},
            "m": {"type": ["string", "null"]},
        }, "required": ["v"]});
        let out = strict_parameters(&input).unwrap();
        assert_eq!(out["properties"]["v"]["anyOf"].as_array().unwrap().len(), 2);
        assert_eq!(out["properties"]["v"]["description"], json!("A value"));
        assert_eq!(out["properties"]["m"]["type"], json!(["string", "null"]));
    }

    #[test]
    fn anthropic_and_json_schema_shapes() {
        let input =
            json!({"type": "object", "properties": {"a": {"type": "string", "default": "x"}}});
        let tools = [tool("t__c", input.clone())];
        let a = render(&tools, ModelFormat::Anthropic);
        assert_eq!(
            a["tools"][0],
            json!({"name": "t__c", "description": "Does things.", "input_schema": input})
        );
        let j = render(&tools, ModelFormat::JsonSchema);
        let t = &j["tools"][0];
        assert_eq!(t["inputSchema"], input);
        assert_eq!(t["outputSchema"], json!({"type": "object"}));
        assert_eq!(t["annotations"]["readOnlyHint"], json!(true));
        assert_eq!(t["errors"][0]["name"], json!("bad"));
        assert_eq!(j["notes"], json!({}));
    }
}
