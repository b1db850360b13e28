//! `ToolRelease`: one immutable, digest-pinned version of a tool's WebAssembly artifact.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgrid_core::spec::{
    ArtifactSource, CommandArtifact, NetworkPolicy, ReleaseFile, ReleaseLimits,
};

/// One version of a tool: the artifact that runs, its limits, egress and worker pool.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toolgrid.dev",
    version = "v1alpha1",
    kind = "ToolRelease",
    namespaced,
    status = "ToolReleaseStatus",
    shortname = "tr",
    category = "toolgrid",
    doc = "One immutable version of a tool: a digest-pinned WebAssembly artifact with its limits, egress and worker pool.",
    printcolumn(name = "Tool", type_ = "string", json_path = ".spec.tool"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(
        name = "Digest",
        type_ = "string",
        json_path = ".status.digest",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolReleaseSpec {
    /// The Tool this release implements (same namespace).
    pub tool: String,
    /// Semantic version; immutable once the release is Ready.
    pub version: String,
    /// Where the WebAssembly module or component comes from.
    pub artifact: ArtifactSource,
    /// The WorkerPool that runs it (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ReleaseLimits>,
    /// Outgoing network access; none unless listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// Read-only files every call sees beside the artifact, each pinned by digest (at most
    /// 16): an interpreter's standard library, a model, a dictionary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ReleaseFile>,
    /// Commands of the Tool that run their own artifact, with their own files and limits
    /// (at most 16): a `code` tool whose `run` is a JavaScript engine and whose `python`
    /// is CPython. Every other command runs `artifact`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<CommandArtifact>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolReleaseStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The digest of the artifact that runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Artifact size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// `module` (WASI preview 1) or `component` (WASI preview 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_kind: Option<String>,
}
