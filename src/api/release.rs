//! `ToolRelease`: one immutable, digest-pinned version of a tool's WebAssembly artifact.

use super::units::{ByteSize, GoDuration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
}

/// Exactly one of `file`, `configMap` or `url`; `digest` pins the bytes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactSource {
    /// A path relative to the manifest file (manifest directories only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// A key of a ConfigMap in the same namespace (`binaryData` or `data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKeyRef>,
    /// An HTTP(S) URL; requires `digest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `sha256:<hex>`; verified for every source when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKeyRef {
    pub name: String,
    pub key: String,
}

/// Per-call limits of the sandbox.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseLimits {
    /// Linear memory of one call (default 64Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// CPU time of one call (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_time: Option<GoDuration>,
    /// Bytes a call may write to stdout (default 1Mi; at most 16Mi, a larger value is
    /// clamped to 16Mi and the Ready condition says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<ByteSize>,
    /// Largest body of an outgoing request, checked while it streams (default 8Mi; at most
    /// 64Mi). A larger request ends the call as `request-limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<ByteSize>,
    /// Largest body of a response to an outgoing request (default 8Mi; at most 16Mi). A
    /// larger response ends the call as `response-limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_bytes: Option<ByteSize>,
    /// Calls of this release running at once across the pool (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<u32>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default)]
    pub egress: Vec<EgressRule>,
}

/// A destination a tool may reach.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressRule {
    /// A host name, `*.suffix`, or an IP address.
    pub host: String,
    /// Allowed ports; empty means 80 and 443.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Allow loopback, private, link-local and metadata addresses for this host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private: bool,
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
