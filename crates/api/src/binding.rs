//! `ToolBinding`: which agents may call a tool, which releases, with what access.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Grants agents a tool; a binding can only narrow what an agent's permissions allow.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toolgrid.dev",
    version = "v1alpha1",
    kind = "ToolBinding",
    namespaced,
    status = "ToolBindingStatus",
    shortname = "tb",
    category = "toolgrid",
    doc = "Which agents may call which tool (and which release range), with what access, through which middleware.",
    printcolumn(name = "Tool", type_ = "string", json_path = ".spec.tool"),
    printcolumn(
        name = "Release",
        type_ = "string",
        json_path = ".status.resolvedRelease"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolBindingSpec {
    /// Agent names in this namespace.
    pub agents: Vec<String>,
    pub tool: String,
    /// Which release serves the binding; default: the newest Ready release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseSelector>,
    /// Commands allowed through this binding (default: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    #[serde(default)]
    pub filesystem_access: FilesystemAccess,
    /// Keys of the agent's ConfigMap the tool reads as environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_keys_readable: Vec<String>,
    /// Secret keys usable by reference; the tool never sees their value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_keys_readable: Vec<String>,
    /// Secret keys the tool sees as plaintext.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_keys_revealable: Vec<String>,
    /// Middleware names, applied in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub middleware: Vec<String>,
    /// How a model reaches the tool: `direct` (as a tool of its own), `codemode` (only
    /// from a program of the `code` tool, not listed to the model) or `both`. Default: the
    /// Agent's `exposure`, else `both`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<Exposure>,
}

/// How a model reaches a bound tool.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Exposure {
    /// Listed to the model and called directly; a program of the `code` tool cannot call it.
    Direct,
    /// Only from a program of the `code` tool: not listed to the model as a tool, and a
    /// direct call is refused.
    Codemode,
    /// Both.
    #[default]
    Both,
}

impl Exposure {
    /// Whether a direct call (or listing to the model) is allowed.
    pub fn direct(self) -> bool {
        matches!(self, Exposure::Direct | Exposure::Both)
    }

    /// Whether a program of the `code` tool may call it.
    pub fn codemode(self) -> bool {
        matches!(self, Exposure::Codemode | Exposure::Both)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Exposure::Direct => "direct",
            Exposure::Codemode => "codemode",
            Exposure::Both => "both",
        }
    }
}

/// A semver range (`^1.2`), or one release by name.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FilesystemAccess {
    #[default]
    None,
    ReadOnly,
    ReadWrite,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolBindingStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The release calls through this binding run now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_release: Option<String>,
}
