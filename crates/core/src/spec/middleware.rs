//! The steps a Middleware declares: policy rules, approval, redaction, audit, rate limits
//! and wasm middleware. The middleware decisions (`crate::middleware`) compile these.

use super::release::ArtifactSource;
use super::units::{ByteSize, GoDuration};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Ordered rules over the call; the first rule whose `when` holds decides. No rule
/// matching applies `default`.
///
/// CEL sees `call.agent`, `call.namespace`, `call.tool`, `call.command`, `call.args` (a map
/// by argument name), `call.effect` (`read|idempotent|write|external`), `call.release` (the
/// release's version) and `call.dryRun`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyStep {
    pub rules: Vec<PolicyRule>,
    /// What a call no rule matches gets (default: allow).
    #[serde(default)]
    pub default: PolicyDefault,
    /// The message a call denied by `default: deny` carries.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRule {
    /// CEL over `call`; default: every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    pub action: PolicyAction,
    /// For `deny`: the message the caller sees.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// For `rewrite`: what changes. The rewritten call is validated against the schema and
    /// authorized again, as the rewritten call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<PolicyRewrite>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PolicyAction {
    Allow,
    Deny,
    Rewrite,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PolicyDefault {
    #[default]
    Allow,
    Deny,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRewrite {
    /// The command to run instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Arguments to set, by name: each value is a CEL expression over `call`
    /// (`'min(call.args.limit, 10)'`, `'"main"'`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Arguments to remove, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// Holds matching calls in `awaiting-approval` until a person approves or denies them.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalStep {
    /// CEL over `call`; default: every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// How long a call waits for a decision (default 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Agents (in this namespace) that may decide besides operators; never the calling
    /// agent itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    #[default]
    Deny,
    Allow,
}

/// Removes matching values from results and error text before they reach the caller and
/// before they are stored.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedactStep {
    /// JSON pointers into the result (`/token`): the value is replaced.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Regular expressions over every string of the result and over error text.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// What replaces a redacted value (default `[REDACTED]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
}

/// Shapes the audit record every call gets, and can copy it to stdout.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditStep {
    /// Arguments left out of the record, by name (`"*"`: all of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_args: Vec<String>,
    /// Also write each record as one JSON line to the control plane's stdout.
    #[serde(default)]
    pub stdout: bool,
}

/// A token bucket of `requests` per `per`, held in the store (so it holds across restarts
/// and replicas), keyed by agent, tool, or both.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimitStep {
    pub requests: u32,
    pub per: GoDuration,
    /// What one bucket counts (default: `agent`).
    #[serde(default)]
    pub key: RateKey,
    /// Largest burst (default: `requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RateKey {
    /// One bucket per agent.
    #[default]
    Agent,
    /// One bucket per tool, shared by every agent.
    Tool,
    /// One bucket per agent and tool.
    AgentTool,
}

/// A middleware written as a WebAssembly component of world `toolgrid:middleware/middleware`
/// (`wit/middleware.wit`): it receives the call and answers allow, deny or rewrite.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WasmStep {
    pub artifact: ArtifactSource,
    /// Longest a decision may take (default 1s); past it the call is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    /// Largest linear memory (default 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
}
