//! `toolgrid call TOOL --help` and `toolgrid call TOOL COMMAND --help`: usage generated
//! from the Tool's definition (as the control plane serves it to the caller): arguments,
//! options with their types, defaults and descriptions, flags, stdin, the result, the
//! declared errors and the effect. Pure: a [`ToolDef`] in, text out.

use serde_json::Value;
use std::fmt::Write as _;
use toolgrid_api::Command;
use toolgrid_codegen::ToolDef;

/// What the effect means for a caller.
fn effect_text(effect: &str) -> String {
    let meaning = match effect {
        "read" => "no effect outside the call; safe to retry",
        "idempotent" => "changes the world, but repeating a call has the same result",
        "write" => "changes the world; never re-sent without an idempotency key",
        "external" => "calls out to systems whose effects toolgrid cannot see",
        _ => "",
    };
    if meaning.is_empty() {
        effect.to_string()
    } else {
        format!("{effect} ({meaning})")
    }
}

/// A short description of a JSON Schema's type: `string`, `integer >= 1`,
/// `one of: major, minor, patch`, `array of string`, ...
pub fn type_summary(schema: &Value) -> String {
    let Some(obj) = schema.as_object() else {
        return "any JSON value".into();
    };
    if let Some(Value::Array(values)) = obj.get("enum") {
        return format!(
            "one of: {}",
            values
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(c) = obj.get("const") {
        return format!("exactly {c}");
    }
    let mut out = match obj.get("type") {
        Some(Value::String(t)) if t == "array" => format!(
            "array of {}",
            obj.get("items").map_or("any".into(), type_summary)
        ),
        Some(Value::String(t)) if t == "object" => {
            match obj.get("properties").and_then(Value::as_object) {
                Some(p) if !p.is_empty() => format!(
                    "object {{{}}}",
                    p.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
                _ => "object".into(),
            }
        }
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .map(|t| t.as_str().unwrap_or("?").to_string())
            .collect::<Vec<_>>()
            .join(" or "),
        _ if obj.contains_key("anyOf") || obj.contains_key("oneOf") => "one of several".into(),
        _ => "any JSON value".into(),
    };
    for (key, label) in [
        ("format", "format"),
        ("pattern", "pattern"),
        ("minimum", ">="),
        ("maximum", "<="),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
    ] {
        if let Some(v) = obj.get(key) {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            let _ = write!(out, ", {label} {v}");
        }
    }
    out
}

fn description_of<'a>(tool: &'a ToolDef, command: &'a Command) -> &'a str {
    if command.description.is_empty() {
        &tool.description
    } else {
        &command.description
    }
}

/// One command's usage line: `compare <a> <b> [--part VALUE] [--verbose]`.
pub fn usage_line(command: &Command) -> String {
    let mut parts = vec![command.name.clone()];
    for p in &command.positional {
        let dots = if p.variadic { "..." } else { "" };
        parts.push(if p.required {
            format!("<{}>{dots}", p.name)
        } else {
            format!("[{}]{dots}", p.name)
        });
    }
    for o in &command.options {
        let value = o.name.to_ascii_uppercase().replace('-', "_");
        parts.push(if o.required && o.default.is_none() {
            format!("--{} {value}", o.name)
        } else {
            format!("[--{} {value}]", o.name)
        });
    }
    for f in &command.flags {
        parts.push(format!("[--{}]", f.name));
    }
    if let Some(stdin) = &command.stdin {
        parts.push(if stdin.required {
            "--stdin FILE|-".into()
        } else {
            "[--stdin FILE|-]".into()
        });
    }
    parts.join(" ")
}

/// The help of one command.
pub fn command_help(tool: &ToolDef, command: &Command) -> String {
    let one = tool.commands.len() == 1;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {}: {}",
        tool.name,
        command.name,
        description_of(tool, command)
    );
    let _ = writeln!(out);
    let args = usage_line(command)
        .strip_prefix(command.name.as_str())
        .unwrap_or_default()
        .to_string();
    let usage = if one {
        // The only command may be left out.
        format!("{} [{}]{args}", tool.name, command.name)
    } else {
        format!("{} {}{args}", tool.name, command.name)
    };
    let _ = writeln!(out, "Usage: toolgrid call {usage}");
    if !command.positional.is_empty() {
        let _ = writeln!(out, "\nArguments:");
        for p in &command.positional {
            let schema = p
                .schema
                .clone()
                .unwrap_or(serde_json::json!({"type": "string"}));
            let mut kind = type_summary(&schema);
            if p.variadic {
                kind = format!("{kind}, one or more");
            }
            let _ = writeln!(
                out,
                "  <{}>  {kind}{}{}",
                p.name,
                if p.required {
                    ", required"
                } else {
                    ", optional"
                },
                sentence(&p.description)
            );
        }
    }
    if !command.options.is_empty() {
        let _ = writeln!(out, "\nOptions:");
        for o in &command.options {
            let schema = o
                .schema
                .clone()
                .unwrap_or(serde_json::json!({"type": "string"}));
            let short = o
                .short
                .as_ref()
                .map(|s| format!("-{s}, "))
                .unwrap_or_default();
            let default = o
                .default
                .as_ref()
                .map(|d| format!(", default: {d}"))
                .unwrap_or_default();
            let required = if o.required && o.default.is_none() {
                ", required"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {short}--{} VALUE  {}{required}{default}{}",
                o.name,
                type_summary(&schema),
                sentence(&o.description)
            );
        }
    }
    if !command.flags.is_empty() {
        let _ = writeln!(out, "\nFlags:");
        for f in &command.flags {
            let short = f
                .short
                .as_ref()
                .map(|s| format!("-{s}, "))
                .unwrap_or_default();
            let _ = writeln!(out, "  {short}--{}{}", f.name, sentence(&f.description));
        }
    }
    if let Some(stdin) = &command.stdin {
        let schema = stdin
            .schema
            .clone()
            .unwrap_or(serde_json::json!({"type": "string"}));
        let text = schema.get("type") == Some(&Value::String("string".into()));
        let _ = writeln!(
            out,
            "\nStdin ({}{}): --stdin FILE, or --stdin - for this process's stdin{}",
            if text {
                "text".to_string()
            } else {
                format!("a JSON document: {}", type_summary(&schema))
            },
            if stdin.required {
                ", required"
            } else {
                ", optional"
            },
            sentence(&stdin.description)
        );
    }
    if let Some(result) = &command.result {
        let _ = writeln!(out, "\nResult: {}", type_summary(result));
    }
    if !command.errors.is_empty() {
        let _ = writeln!(out, "\nErrors:");
        for e in &command.errors {
            let _ = writeln!(
                out,
                "  {} (exit code {}{}){}",
                e.name,
                e.exit_code,
                if e.retryable { ", retryable" } else { "" },
                sentence(&e.description)
            );
        }
    }
    let _ = writeln!(out, "\nEffect: {}", effect_text(&tool.effect));
    out
}

/// `  text` after a field, or nothing.
fn sentence(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        String::new()
    } else {
        format!("  {text}")
    }
}

/// The help of a tool: its commands and their usage.
pub fn tool_help(tool: &ToolDef) -> String {
    if let [only] = tool.commands.as_slice() {
        return command_help(tool, only);
    }
    let mut out = String::new();
    let _ = writeln!(out, "{}: {}", tool.name, tool.description);
    let _ = writeln!(
        out,
        "\nUsage: toolgrid call {} COMMAND [ARGS...]",
        tool.name
    );
    let _ = writeln!(out, "\nCommands:");
    for c in &tool.commands {
        let first = description_of(tool, c)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let _ = writeln!(out, "  {}\n      {first}", usage_line(c));
    }
    let _ = writeln!(out, "\nEffect: {}", effect_text(&tool.effect));
    let _ = writeln!(
        out,
        "\n`toolgrid call {} COMMAND --help` shows a command's arguments, options, result and errors.",
        tool.name
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn semver() -> ToolDef {
        ToolDef {
            namespace: "default".into(),
            name: "semver".into(),
            description: "Versions.".into(),
            effect: "read".into(),
            commands: serde_json::from_value(json!([
                {"name": "compare", "description": "Compare.",
                 "positional": [{"name": "a", "description": "First."}, {"name": "b"}],
                 "result": {"type": "object", "properties": {"order": {"type": "integer"}}},
                 "errors": [{"name": "invalid-version", "exitCode": 3, "description": "Bad."}]},
                {"name": "bump", "positional": [{"name": "version"}],
                 "options": [{"name": "part", "schema": {"type": "string", "enum": ["major", "patch"]},
                              "default": "patch", "description": "Which part."}],
                 "flags": [{"name": "dry", "short": "d"}]}
            ]))
            .unwrap(),
        }
    }

    #[test]
    fn command_help_names_everything() {
        let tool = semver();
        let text = command_help(&tool, &tool.commands[1]);
        assert!(
            text.contains("Usage: toolgrid call semver bump <version> [--part PART] [--dry]"),
            "{text}"
        );
        assert!(
            text.contains("--part VALUE  one of: major, patch, default: \"patch\"  Which part."),
            "{text}"
        );
        assert!(text.contains("-d, --dry"), "{text}");
        assert!(text.contains("Effect: read (no effect"), "{text}");
        let text = command_help(&tool, &tool.commands[0]);
        assert!(text.contains("<a>  string, required  First."), "{text}");
        assert!(
            text.contains("invalid-version (exit code 3)  Bad."),
            "{text}"
        );
        assert!(text.contains("Result: object {order}"), "{text}");
    }

    #[test]
    fn tool_help_lists_commands() {
        let text = tool_help(&semver());
        assert!(text.contains("compare <a> <b>"), "{text}");
        assert!(
            text.contains("bump <version> [--part PART] [--dry]"),
            "{text}"
        );
    }
}
