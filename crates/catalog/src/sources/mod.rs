//! Readers of tools from elsewhere: each turns what a ToolSource's upstream offers (an MCP
//! `tools/list` answer, an OpenAPI document) into a [`toolgrid_core::source::SourceSnapshot`],
//! pure functions over the bytes read; the IO (fetching them) is the caller's.

pub mod mcp;
pub mod openapi;

use toolgrid_core::interface::{ArgumentNames, CommandInterface};
use toolgrid_core::source::{ImportedTool, LeftOut, LeftOutReason, SourceLimits, SourceSnapshot};

/// The most left-out entries a snapshot lists; the rest are counted in one last entry.
pub const MAX_LEFT_OUT: usize = 100;

/// Bounds a snapshot as a whole, for the source's status: tools past
/// [`SourceLimits::max_total_bytes`] together are left out as `TooLarge`, and at most
/// [`MAX_LEFT_OUT`] left-out entries are listed.
fn bound(mut snapshot: SourceSnapshot, limits: &SourceLimits) -> SourceSnapshot {
    let mut total = 0usize;
    let mut kept = Vec::with_capacity(snapshot.tools.len());
    for tool in std::mem::take(&mut snapshot.tools) {
        let size = serde_json::to_vec(&tool)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if total.saturating_add(size) > limits.max_total_bytes {
            snapshot.left_out.push(LeftOut {
                name: tool.name,
                reason: LeftOutReason::TooLarge,
                message: format!(
                    "the source's tools together pass {} bytes",
                    limits.max_total_bytes
                ),
            });
            continue;
        }
        total += size;
        kept.push(tool);
    }
    snapshot.tools = kept;
    if snapshot.left_out.len() > MAX_LEFT_OUT {
        let more = snapshot.left_out.len() - (MAX_LEFT_OUT - 1);
        snapshot.left_out.truncate(MAX_LEFT_OUT - 1);
        snapshot.left_out.push(LeftOut {
            name: "...".into(),
            reason: LeftOutReason::TooLarge,
            message: format!("{more} more left out, not listed"),
        });
    }
    snapshot
}

/// `tool` if its command compiles as toolgrid calls it (argument names, every schema a
/// valid JSON Schema), else why it is left out: what a source offers must be callable.
fn callable(tool: ImportedTool) -> Result<ImportedTool, LeftOut> {
    match CommandInterface::compile_with(&tool.command, "command", ArgumentNames::Imported) {
        Ok(_) => Ok(tool),
        Err(error) => Err(LeftOut {
            name: tool.name,
            reason: LeftOutReason::UnsupportedSchema,
            message: format!("{}: {}", error.field, error.message),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::source::UpstreamTarget;
    use toolgrid_core::spec::Effect;

    fn tool(name: &str, description: &str) -> ImportedTool {
        ImportedTool {
            name: name.into(),
            description: description.into(),
            effect: Effect::Read,
            command: serde_json::from_value(serde_json::json!({"name": "default"})).unwrap(),
            target: UpstreamTarget::Mcp { tool: name.into() },
        }
    }

    #[test]
    fn a_snapshot_is_bounded_as_a_whole() {
        let limits = SourceLimits {
            max_total_bytes: 2_000,
            ..SourceLimits::default()
        };
        let snapshot = SourceSnapshot {
            tools: (0..10)
                .map(|i| tool(&format!("t{i}"), &"x".repeat(500)))
                .collect(),
            left_out: (0..150)
                .map(|i| LeftOut {
                    name: format!("l{i}"),
                    reason: LeftOutReason::NotAllowed,
                    message: String::new(),
                })
                .collect(),
            era: None,
        };
        let bounded = bound(snapshot, &limits);
        assert!(!bounded.tools.is_empty() && bounded.tools.len() < 10);
        let size: usize = bounded
            .tools
            .iter()
            .map(|t| serde_json::to_vec(t).unwrap().len())
            .sum();
        assert!(size <= 2_000);
        assert_eq!(bounded.left_out.len(), MAX_LEFT_OUT);
        let last = bounded.left_out.last().unwrap();
        assert_eq!(last.reason, LeftOutReason::TooLarge);
        assert!(last.message.contains("more left out"), "{last:?}");
    }
}
