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
        name = "Canary",
        type_ = "string",
        json_path = ".status.rollout.canary"
    ),
    printcolumn(
        name = "Weight",
        type_ = "integer",
        json_path = ".status.rollout.weight"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.rollout.phase"),
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
    /// A canary: a share of new calls runs another release of the tool, judged on its own
    /// errors against the stable release (`spec.release`, or the newest Ready release
    /// other than the canary), stepped on, promoted or rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

/// A canary rollout on a binding: `{canary: fetch-1.3.0, steps: [10, 50, 100], interval: 5m}`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rollout {
    /// The canary ToolRelease, by name (a release of the binding's tool).
    pub canary: String,
    /// The canary's share of new calls, in percent, step by step (ascending, 1 to 100;
    /// default `[10, 50, 100]`). Past its last step at 100 the canary is promoted; a last
    /// step below 100 holds until `toolgrid rollout promote`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<u32>,
    /// How long each step lasts before it is judged (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<toolgrid_core::spec::GoDuration>,
    /// The canary is rolled back when its error rate (tool errors, invalid results, traps,
    /// limits; not refusals by policy) exceeds the stable release's by more than this many
    /// percentage points (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_error_rate_increase: Option<f64>,
    /// A step is judged only once the canary has ended this many calls in it (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_calls: Option<u64>,
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
    /// The canary rollout, when `spec.rollout` names a Ready release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// Where a binding's rollout is: the split, the step and what each release did in the
/// last judged step.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    pub stable: String,
    pub canary: String,
    /// The canary's share of new calls now, in percent.
    pub weight: u32,
    /// `Progressing`, `Promoted` or `Aborted`.
    pub phase: String,
    /// The step (from 1) of `steps`.
    pub step: u32,
    pub steps: Vec<u32>,
    pub message: String,
    pub stable_calls: u64,
    pub stable_errors: u64,
    pub canary_calls: u64,
    pub canary_errors: u64,
}
