//! Tools: checked (their commands compiled) before their releases, and finished after
//! them, served by their newest Ready release.

use super::declared::Declared;
use super::{DEFAULT_TIMEOUT, Resolver};
use crate::snapshot::{ResolvedRelease, ResolvedTool};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgrid_api::conditions::{Desired, Reason};
use toolgrid_api::{Kind, KindStatus, Tool, ToolStatus};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::{CommandInterface, FieldError, is_kebab};

/// The Tools that passed their checks, with their declarations, until they are finished.
pub(super) type ValidTools<'a> = BTreeMap<ObjectKey, (Declared<'a, Tool>, ResolvedTool)>;

impl<'a> Resolver<'a> {
    pub(super) fn tools(&mut self) -> ValidTools<'a> {
        let mut valid = BTreeMap::new();
        for d in self.declared(Kind::Tool, &self.input.set.tools) {
            let checked = match self.checked_before(d.object, &d.id.key) {
                Some(tool) => Ok(tool),
                None => check_tool(d.object, &d.id.key),
            };
            match checked {
                Err(e) => self.invalid(&d, e),
                Ok(tool) => {
                    valid.insert(d.id.key.clone(), (d, tool));
                }
            }
        }
        valid
    }

    /// The previous round's check of this Tool when its spec is the same: [`check_tool`]
    /// depends on the spec and the key only, so its compiled commands are kept.
    fn checked_before(&self, tool: &Tool, key: &ObjectKey) -> Option<ResolvedTool> {
        let previous = self.input.reuse?.tools.get(key)?;
        (previous.spec == tool.spec).then(|| ResolvedTool {
            release: None,
            ..ResolvedTool::clone(previous)
        })
    }

    pub(super) fn finish_tools(&mut self, tools: ValidTools<'a>) {
        let newest = newest_releases(&self.snapshot.releases);
        for (key, (d, mut tool)) in tools {
            let newest = newest.get(&key);
            tool.release = newest.map(|r| r.key.clone());
            let mut status = ToolStatus::default();
            let commands = tool
                .commands
                .iter()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
                .join(",");
            let mut columns = vec![
                ("Effect".into(), tool.effect.as_str().to_string()),
                ("Commands".into(), commands),
            ];
            let ready = match newest {
                Some(release) => {
                    status.release = Some(release.key.name.clone());
                    status.version = Some(release.version.to_string());
                    columns.push(("Release".into(), release.key.name.clone()));
                    Desired::ready(
                        Reason::Released,
                        format!(
                            "calls run release {} (version {})",
                            release.key.name, release.version
                        ),
                    )
                }
                None => {
                    columns.push(("Release".into(), "<none>".into()));
                    Desired::not_ready(
                        Reason::NoReadyRelease,
                        format!(
                            "no Ready ToolRelease of tool {:?} in namespace {:?}",
                            key.name, key.namespace
                        ),
                    )
                }
            };
            self.record_declared(&d, ready, KindStatus::Tool(status), columns);
            self.snapshot.tools.insert(key, Arc::new(tool));
        }
    }
}

/// The newest Ready release of each tool, by the tool's key (one pass over the releases;
/// of releases with equal versions, the last by key, as `Iterator::max_by` picks).
fn newest_releases(
    releases: &BTreeMap<ObjectKey, Arc<ResolvedRelease>>,
) -> BTreeMap<ObjectKey, Arc<ResolvedRelease>> {
    let mut newest: BTreeMap<ObjectKey, Arc<ResolvedRelease>> = BTreeMap::new();
    for release in releases.values() {
        let tool = ObjectKey::new(release.key.namespace.clone(), release.tool.clone());
        match newest.get(&tool) {
            Some(kept) if kept.version > release.version => {}
            _ => {
                newest.insert(tool, release.clone());
            }
        }
    }
    newest
}

/// Checks a Tool and compiles its commands.
pub fn check_tool(tool: &Tool, key: &ObjectKey) -> Result<ResolvedTool, FieldError> {
    if !is_kebab(&key.name) {
        return Err(FieldError::new(
            "metadata.name",
            format!(
                "{:?} is not a valid tool name (lowercase letters, digits and dashes, at most 63)",
                key.name
            ),
        ));
    }
    let spec = &tool.spec;
    if spec.commands.is_empty() {
        return Err(FieldError::new(
            "spec.commands",
            "a tool needs at least one command",
        ));
    }
    let mut commands: Vec<Arc<CommandInterface>> = Vec::new();
    for (i, command) in spec.commands.iter().enumerate() {
        let field = format!("spec.commands[{i}]");
        if commands.iter().any(|c| c.name == command.name) {
            return Err(FieldError::new(
                format!("{field}.name"),
                format!("command {:?} is declared twice", command.name),
            ));
        }
        commands.push(Arc::new(CommandInterface::compile(command, &field)?));
    }
    let timeout = spec.timeout.map(|t| t.get()).unwrap_or(DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        return Err(FieldError::new("spec.timeout", "must be longer than zero"));
    }
    if let Some(max) = spec.max_timeout
        && max.get() < timeout
    {
        return Err(FieldError::new(
            "spec.maxTimeout",
            format!(
                "{max} is shorter than the timeout ({})",
                toolgrid_api::units::GoDuration(timeout)
            ),
        ));
    }
    if let Some(retry) = &spec.retry
        && retry.attempts == 0
    {
        return Err(FieldError::new("spec.retry.attempts", "must be at least 1"));
    }
    Ok(ResolvedTool {
        key: key.clone(),
        spec: spec.clone(),
        effect: spec.effect,
        timeout,
        commands,
        release: None,
    })
}
