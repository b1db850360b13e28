//! The model-facing view of a tool: one entry per command, named as model APIs and MCP
//! name tools (`<tool>__<command>`, or `<tool>` for a one-command tool), with one JSON
//! object schema for its whole input (arguments and stdin), its result schema, its declared
//! errors and hints derived from the effect.
//!
//! Pure: built from a [`ResolvedTool`]; the front doors (MCP, `GET /v1/tools?format=`,
//! generated clients, `toolgrid call --help`) convert it to their shapes.

use super::snapshot::ResolvedTool;
use crate::json_schema::admits_null;
use serde_json::{Map, Value, json};
use toolgrid_api::{DeclaredError, Effect, ResultPolicy};
use toolgrid_core::interface::CommandInterface;

/// Between a tool's name and its command's in a model-facing name.
pub const NAME_SEPARATOR: &str = "__";

pub use toolgrid_core::interface::STDIN_PROPERTY;

/// One command of a tool as a model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelTool {
    /// `<tool>__<command>`, or `<tool>` when the tool has one command.
    pub name: String,
    pub tool: String,
    pub command: String,
    /// A human title: the tool's name, and the command's when there are several.
    pub title: String,
    /// The command's description, else the tool's.
    pub description: String,
    pub effect: Effect,
    /// One JSON object schema: positional args, options, flags, and [`STDIN_PROPERTY`].
    pub input_schema: Value,
    /// The result's JSON Schema, when the command declares one.
    pub output_schema: Option<Value>,
    /// Whether stdin is text (passed through) rather than a JSON document.
    pub stdin_text: bool,
    pub errors: Vec<DeclaredError>,
    pub result_policy: ResultPolicy,
}

/// MCP tool annotations, from the effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hints {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

impl Hints {
    /// `read`: read-only; `idempotent`: idempotent and not destructive; `write`:
    /// destructive; `external`: open world (and destructive, as MCP assumes of a tool that
    /// is not read-only unless told otherwise).
    pub fn of(effect: Effect) -> Self {
        match effect {
            Effect::Read => Hints {
                read_only: true,
                destructive: false,
                idempotent: true,
                open_world: false,
            },
            Effect::Idempotent => Hints {
                read_only: false,
                destructive: false,
                idempotent: true,
                open_world: false,
            },
            Effect::Write => Hints {
                read_only: false,
                destructive: true,
                idempotent: false,
                open_world: false,
            },
            Effect::External => Hints {
                read_only: false,
                destructive: true,
                idempotent: false,
                open_world: true,
            },
        }
    }
}

/// The model-facing name of a tool's command.
pub fn model_name(tool: &str, command: &str, one_command: bool) -> String {
    if one_command {
        tool.to_string()
    } else {
        format!("{tool}{NAME_SEPARATOR}{command}")
    }
}

/// A model-facing name split into the tool and, when it names one, the command.
/// (Tool and command names are kebab-case, so the separator cannot occur inside them.)
pub fn split_model_name(name: &str) -> (&str, Option<&str>) {
    match name.split_once(NAME_SEPARATOR) {
        Some((tool, command)) => (tool, Some(command)),
        None => (name, None),
    }
}

/// Every command of `tool` that `allowed` admits (all when `None`), as models see them.
pub fn model_tools_of(tool: &ResolvedTool, allowed: Option<&[String]>) -> Vec<ModelTool> {
    let one_command = tool.commands.len() == 1;
    tool.commands
        .iter()
        .filter(|c| allowed.is_none_or(|a| a.contains(&c.name)))
        .map(|c| model_tool(tool, c, one_command))
        .collect()
}

fn model_tool(tool: &ResolvedTool, command: &CommandInterface, one_command: bool) -> ModelTool {
    let spec = tool.spec.commands.iter().find(|c| c.name == command.name);
    let title = if one_command {
        tool.key.name.clone()
    } else {
        format!("{} {}", tool.key.name, command.name)
    };
    let description = if command.description.is_empty() {
        tool.spec.description.clone()
    } else {
        command.description.clone()
    };
    let stdin_text = command
        .stdin_schema()
        .is_none_or(|s| s.get("type") == Some(&json!("string")));
    ModelTool {
        name: model_name(&tool.key.name, &command.name, one_command),
        tool: tool.key.name.clone(),
        command: command.name.clone(),
        title,
        description,
        effect: tool.effect,
        input_schema: input_schema(command, spec.and_then(|s| s.stdin.as_ref())),
        output_schema: command.result_schema().cloned(),
        stdin_text,
        errors: spec.map(|s| s.errors.clone()).unwrap_or_default(),
        result_policy: tool.spec.result_policy.clone().unwrap_or(ResultPolicy {
            max_inline_bytes: None,
            overflow: Default::default(),
        }),
    }
}

/// The arguments schema with stdin as one more property.
fn input_schema(command: &CommandInterface, stdin: Option<&toolgrid_api::StdinSpec>) -> Value {
    let mut schema = command.args_schema().clone();
    if let (Some(stdin_schema), Some(spec)) = (command.stdin_schema(), stdin) {
        let mut property = stdin_schema.clone();
        if let Some(obj) = property.as_object_mut()
            && !spec.description.is_empty()
        {
            obj.entry("description").or_insert(json!(spec.description));
        }
        if let Some(props) = schema["properties"].as_object_mut() {
            props.insert(STDIN_PROPERTY.into(), property);
        }
        if spec.required
            && let Some(required) = schema["required"].as_array_mut()
        {
            required.push(json!(STDIN_PROPERTY));
        }
    }
    schema
}

/// Drops each `null` a model gave for an optional property whose own schema does not
/// admit `null`: OpenAI's strict mode makes optional properties nullable, and its `null`
/// means "absent" (see [`super::model_formats`]).
pub fn drop_absent_nulls(schema: &Value, input: &mut Map<String, Value>) {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    input.retain(|name, value| {
        !value.is_null()
            || required.contains(&name.as_str())
            || schema["properties"].get(name).is_none_or(admits_null)
    });
}

/// A model's input object split into the command's arguments and its stdin bytes; a `null`
/// for an optional property is taken as absent ([`drop_absent_nulls`]).
pub fn split_input(
    tool: &ModelTool,
    mut input: Map<String, Value>,
) -> (Map<String, Value>, Option<Vec<u8>>) {
    drop_absent_nulls(&tool.input_schema, &mut input);
    let has_stdin = tool.input_schema["properties"]
        .get(STDIN_PROPERTY)
        .is_some();
    if !has_stdin {
        return (input, None);
    }
    let stdin = input.remove(STDIN_PROPERTY).map(|v| match v {
        Value::String(s) if tool.stdin_text => s.into_bytes(),
        other => other.to_string().into_bytes(),
    });
    (input, stdin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_back_into_tool_and_command() {
        assert_eq!(
            model_name("github", "create-issue", false),
            "github__create-issue"
        );
        assert_eq!(model_name("echo", "default", true), "echo");
        assert_eq!(
            split_model_name("github__create-issue"),
            ("github", Some("create-issue"))
        );
        assert_eq!(split_model_name("echo"), ("echo", None));
    }

    #[test]
    fn nulls_for_optional_properties_are_absent() {
        let schema = json!({"type": "object", "required": ["a"], "properties": {
            "a": {"type": ["string", "null"]},
            "b": {"type": "string"},
            "c": {"type": ["integer", "null"]},
        }});
        let mut input: Map<String, Value> =
            serde_json::from_value(json!({"a": null, "b": null, "c": null, "d": null})).unwrap();
        drop_absent_nulls(&schema, &mut input);
        assert_eq!(
            Value::Object(input),
            json!({"a": null, "c": null, "d": null})
        );
    }

    #[test]
    fn hints_follow_the_effect() {
        assert!(Hints::of(Effect::Read).read_only);
        let idem = Hints::of(Effect::Idempotent);
        assert!(idem.idempotent && !idem.destructive && !idem.read_only);
        assert!(Hints::of(Effect::Write).destructive);
        assert!(Hints::of(Effect::External).open_world);
    }
}
