//! What an agent may call and what it gets: pure decisions over a catalog snapshot, shared
//! by the gateway's authorization (`gateway::authz`), `toolgrid why`, and the Agents'
//! status (`status.tools`).
//!
//! An agent may call a tool's command only when both agree: a **Ready ToolBinding** names
//! the agent and the tool (its release range resolved to a Ready release, its keys exist)
//! and its `commands` (default: all) allow the command; and the agent's **permissions**
//! allow the tool and command. A binding can only narrow: the call's config, secret keys and
//! filesystem are the intersection of what the binding lists and what the agent has.

use super::{ResolvedAgent, ResolvedBinding, ResolvedTool, Snapshot};
use std::fmt;
use toolgrid_api::conditions::Reason;
use toolgrid_api::{FilesystemAccess, Permission};
use toolgrid_core::call::{CallAccess, Filesystem};
use toolgrid_core::ids::ObjectKey;

/// Why an agent may not call a tool (or one of its commands).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The agent is not a Ready Agent (unknown, invalid, or a reference of it is missing).
    UnknownAgent { agent: ObjectKey, why: String },
    /// No ToolBinding names the agent and the tool.
    NoBinding,
    /// Bindings name the agent and the tool, but none is Ready; the first one's reason.
    BindingNotReady {
        binding: String,
        reason: Reason,
        message: String,
    },
    /// The binding's release range matches no Ready release of the tool.
    ReleaseRange { binding: String, message: String },
    /// The agent's permissions do not allow the tool, or the command.
    Permission { message: String },
    /// The Ready bindings' `commands` do not list the command (`commands`: the ones the
    /// agent's permissions allow, when no command was named).
    BindingCommands {
        binding: String,
        commands: Vec<String>,
    },
}

impl Refusal {
    /// A short machine-readable name: `no-binding`, `binding-not-ready`, `release-range`,
    /// `permission`, `binding-commands`, `unknown-agent`.
    pub fn cause(&self) -> &'static str {
        match self {
            Refusal::UnknownAgent { .. } => "unknown-agent",
            Refusal::NoBinding => "no-binding",
            Refusal::BindingNotReady { .. } => "binding-not-ready",
            Refusal::ReleaseRange { .. } => "release-range",
            Refusal::Permission { .. } => "permission",
            Refusal::BindingCommands { .. } => "binding-commands",
        }
    }

    /// The binding it is about, if any.
    pub fn binding(&self) -> Option<&str> {
        match self {
            Refusal::BindingNotReady { binding, .. }
            | Refusal::ReleaseRange { binding, .. }
            | Refusal::BindingCommands { binding, .. } => Some(binding),
            _ => None,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::UnknownAgent { agent, why } => write!(f, "agent {agent} is not Ready: {why}"),
            Refusal::NoBinding => f.write_str("no ToolBinding binds the agent to the tool"),
            Refusal::BindingNotReady {
                binding,
                reason,
                message,
            } => write!(f, "binding {binding} is not Ready ({reason}): {message}"),
            Refusal::ReleaseRange { binding, message } => write!(
                f,
                "release range: binding {binding} matches no Ready release ({message})"
            ),
            Refusal::Permission { message } => write!(f, "permissions: {message}"),
            Refusal::BindingCommands { binding, commands } => write!(
                f,
                "binding {binding} lists none of the commands {} in its commands",
                commands.join(", ")
            ),
        }
    }
}

/// What an allowed agent gets for a tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// The binding the calls go through.
    pub binding: ObjectKey,
    /// The release they run.
    pub release: ObjectKey,
    /// The tool's commands the agent may call (permissions and binding both allow).
    pub commands: Vec<String>,
    /// How the agent's model reaches the tool: the binding's `exposure`, else the Agent's,
    /// else both.
    pub exposure: toolgrid_api::Exposure,
}

/// One tool as one agent sees it: allowed, or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolAccess {
    pub tool: String,
    pub verdict: Result<Allowed, Refusal>,
}

/// Whether a pattern list (`*` for all) names `name`.
fn names(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| p == "*" || p == name)
}

fn permitted(permissions: &[Permission], tool: &str, command: &str) -> bool {
    permissions
        .iter()
        .any(|p| names(&p.tools, tool) && names(&p.commands, command))
}

fn binding_allows(binding: &ResolvedBinding, command: &str) -> bool {
    binding.spec.commands.is_empty() || names(&binding.spec.commands, command)
}

/// Decides whether `agent` may call `tool` (and, when given, `command`). Checks, in
/// order: the agent is Ready; a binding names it and the tool; its permissions allow the
/// tool (and command); a binding is Ready (else the first one's reason, a release range
/// that matches nothing being its own cause); a Ready binding allows the command.
pub fn decide(
    snapshot: &Snapshot,
    agent: &ObjectKey,
    tool: &ResolvedTool,
    command: Option<&str>,
) -> Result<Allowed, Refusal> {
    let Some(resolved) = snapshot.agent(agent) else {
        let id = crate::ResourceId {
            kind: toolgrid_api::Kind::Agent,
            key: agent.clone(),
        };
        let why = match snapshot.resources.get(&id) {
            Some(state) => format!("{}: {}", state.ready.reason, state.ready.message),
            None => "there is no such Agent".to_string(),
        };
        return Err(Refusal::UnknownAgent {
            agent: agent.clone(),
            why,
        });
    };
    let tool_name = tool.key.name.as_str();
    let bindings: Vec<&ResolvedBinding> = snapshot
        .bindings
        .values()
        .filter(|b| b.binds(agent, &tool.key))
        .map(|b| &**b)
        .collect();
    if bindings.is_empty() {
        return Err(Refusal::NoBinding);
    }
    let permissions = &resolved.spec.permissions;
    let permitted_commands: Vec<&str> = tool
        .commands
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| permitted(permissions, tool_name, c))
        .collect();
    if permitted_commands.is_empty() {
        return Err(Refusal::Permission {
            message: format!("the permissions of agent {agent} do not allow tool {tool_name:?}"),
        });
    }
    if let Some(command) = command
        && !permitted_commands.contains(&command)
    {
        return Err(Refusal::Permission {
            message: format!(
                "the permissions of agent {agent} allow tool {tool_name:?} but not command {command:?} (allowed: {})",
                permitted_commands.join(", ")
            ),
        });
    }
    let ready: Vec<&ResolvedBinding> = bindings.iter().copied().filter(|b| b.is_ready()).collect();
    let Some(first_ready) = ready.first() else {
        let binding = bindings[0];
        let name = binding.key.name.clone();
        return Err(if binding.ready.reason == Reason::NoMatchingRelease {
            Refusal::ReleaseRange {
                binding: name,
                message: binding.ready.message.clone(),
            }
        } else {
            Refusal::BindingNotReady {
                binding: name,
                reason: binding.ready.reason,
                message: binding.ready.message.clone(),
            }
        });
    };
    let through = match command {
        Some(command) => ready
            .iter()
            .copied()
            .find(|b| binding_allows(b, command))
            .ok_or_else(|| Refusal::BindingCommands {
                binding: first_ready.key.name.clone(),
                commands: vec![command.to_string()],
            })?,
        None => ready
            .iter()
            .copied()
            .find(|b| permitted_commands.iter().any(|c| binding_allows(b, c)))
            .ok_or_else(|| Refusal::BindingCommands {
                binding: first_ready.key.name.clone(),
                commands: permitted_commands.iter().map(|c| c.to_string()).collect(),
            })?,
    };
    let commands = permitted_commands
        .iter()
        .filter(|c| binding_allows(through, c))
        .map(|c| c.to_string())
        .collect();
    let Some(release) = through.release.clone() else {
        // is_ready() guarantees a release; kept total anyway.
        return Err(Refusal::BindingNotReady {
            binding: through.key.name.clone(),
            reason: through.ready.reason,
            message: through.ready.message.clone(),
        });
    };
    Ok(Allowed {
        binding: through.key.clone(),
        release,
        commands,
        exposure: through
            .spec
            .exposure
            .or(resolved.spec.exposure)
            .unwrap_or_default(),
    })
}

/// What a call through `binding` gets: the binding's lists intersected with what the
/// agent has (a key the agent lacks is not given).
pub fn call_access(agent: &ResolvedAgent, binding: &ResolvedBinding) -> CallAccess {
    let spec = &binding.spec;
    let secret_keys = |keys: &[String]| -> Vec<String> {
        let mut out: Vec<String> = keys
            .iter()
            .filter(|k| agent.secrets.contains_key(*k))
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    };
    CallAccess {
        agent: Some(agent.key.name.clone()),
        filesystem: match spec.filesystem_access {
            FilesystemAccess::None => Filesystem::None,
            FilesystemAccess::ReadOnly => Filesystem::ReadOnly,
            FilesystemAccess::ReadWrite => Filesystem::ReadWrite,
        },
        config: spec
            .config_keys_readable
            .iter()
            .filter_map(|k| agent.config.get(k).map(|v| (k.clone(), v.clone())))
            .collect(),
        secrets_readable: secret_keys(&spec.secret_keys_readable),
        secrets_revealable: secret_keys(&spec.secret_keys_revealable),
    }
}

/// Every tool of the agent's namespace, allowed or with the reason why not (`toolgrid
/// why`); only `tool` when given.
pub fn explain(snapshot: &Snapshot, agent: &ObjectKey, tool: Option<&str>) -> Vec<ToolAccess> {
    snapshot
        .tools
        .values()
        .filter(|t| t.key.namespace == agent.namespace)
        .filter(|t| tool.is_none_or(|name| t.key.name == name))
        .map(|t| ToolAccess {
            tool: t.key.name.clone(),
            verdict: decide(snapshot, agent, t, None),
        })
        .collect()
}
