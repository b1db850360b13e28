//! Admission's first step: which command of the tool a call runs.

use std::sync::Arc;
use toolgrid_catalog::ResolvedTool;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::interface::CommandInterface;

/// The command a call names: `named` when given, else the first argv token when it names
/// a command (taken off `argv`), else the tool's only command.
pub(super) fn command_of(
    tool: &ResolvedTool,
    named: Option<String>,
    argv: &mut Vec<String>,
) -> Result<Arc<CommandInterface>, ApiError> {
    let names = || {
        tool.commands
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let command_name = match named.filter(|c| !c.is_empty()) {
        Some(name) => name,
        None => {
            if let Some(first) = argv.first()
                && tool.command(first).is_some()
            {
                argv.remove(0)
            } else if tool.commands.len() == 1 {
                tool.commands[0].name.clone()
            } else {
                return Err(ApiError::new(
                    ErrorKind::UnknownCommand,
                    format!(
                        "tool {:?} has several commands; name one of: {}",
                        tool.key.name,
                        names()
                    ),
                ));
            }
        }
    };
    tool.command(&command_name).cloned().ok_or_else(|| {
        ApiError::new(
            ErrorKind::UnknownCommand,
            format!(
                "tool {:?} has no command {command_name:?} (commands: {})",
                tool.key.name,
                names()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::ids::ObjectKey;

    fn tool(commands: &[&str]) -> ResolvedTool {
        let spec: toolgrid_api::ToolSpec = serde_json::from_value(serde_json::json!({
            "effect": "read",
            "commands": commands.iter().map(|c| serde_json::json!({"name": c})).collect::<Vec<_>>(),
        }))
        .unwrap();
        ResolvedTool {
            key: ObjectKey::new("default", "semver"),
            commands: spec
                .commands
                .iter()
                .map(|c| Arc::new(CommandInterface::compile(c, "command").unwrap()))
                .collect(),
            effect: spec.effect,
            timeout: std::time::Duration::from_secs(30),
            spec,
            release: None,
        }
    }

    #[test]
    fn a_call_names_its_command_or_the_first_word_or_the_only_one() {
        let several = tool(&["compare", "bump"]);
        let mut argv = vec!["1.0.0".to_string()];
        let named = command_of(&several, Some("bump".into()), &mut argv).unwrap();
        assert_eq!((named.name.as_str(), argv.len()), ("bump", 1));
        let mut argv = vec!["compare".to_string(), "1.0.0".to_string()];
        let first = command_of(&several, None, &mut argv).unwrap();
        assert_eq!(
            (first.name.as_str(), argv),
            ("compare", vec!["1.0.0".to_string()])
        );
        let mut argv = vec!["x".to_string()];
        let only = command_of(&tool(&["count"]), Some(String::new()), &mut argv).unwrap();
        assert_eq!((only.name.as_str(), argv.len()), ("count", 1));
    }

    #[test]
    fn an_unnamed_or_unknown_command_of_several_is_refused_naming_them() {
        let several = tool(&["compare", "bump"]);
        let error = command_of(&several, None, &mut vec!["1.0.0".into()]).unwrap_err();
        assert_eq!(error.kind, ErrorKind::UnknownCommand);
        assert!(error.message.contains("compare, bump"), "{}", error.message);
        let error = command_of(&several, Some("sort".into()), &mut Vec::new()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::UnknownCommand);
        assert!(
            error.message.contains("no command \"sort\""),
            "{}",
            error.message
        );
    }
}
