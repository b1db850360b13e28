//! What a release declares besides its version: where its artifact comes from, the
//! sandbox's per-call limits and outgoing network access.

use super::units::{ByteSize, GoDuration};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// A read-only file every call of a release sees beside its artifact, at an absolute guest
/// path (an interpreter's standard library, a model, a dictionary). Its bytes come from a
/// source like the artifact's and are pinned by digest; the sandbox preopens the file's
/// directory read-only, holding only the release's files.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseFile {
    /// Where the guest sees the file: an absolute path of plain components, not under
    /// `/workspace` (e.g. `/usr/local/lib/python315.zip`).
    pub path: String,
    /// Where its bytes come from: exactly one of `file`, `configMap` or `url`, and `digest`.
    pub artifact: ArtifactSource,
}

/// A command of the Tool that runs its own artifact instead of the release's (a `code`
/// tool whose `run` is a JavaScript engine and whose `python` is CPython). A call of the
/// command runs this artifact, sees this entry's `files` instead of the release's, and has
/// the release's limits with the ones given here in their place.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandArtifact {
    /// The Tool's command (its `commands[].name`).
    pub name: String,
    /// Where the command's WebAssembly module or component comes from: exactly one of
    /// `file`, `configMap` or `url`, with `digest`.
    pub artifact: ArtifactSource,
    /// Read-only files the command's calls see, instead of the release's `files`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ReleaseFile>,
    /// Limits of the command's calls; each one given replaces the release's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ReleaseLimits>,
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

impl ReleaseLimits {
    /// These limits with each one `over` gives in its place.
    pub fn overlaid(&self, over: &ReleaseLimits) -> ReleaseLimits {
        ReleaseLimits {
            memory: over.memory.or(self.memory),
            cpu_time: over.cpu_time.or(self.cpu_time),
            output_bytes: over.output_bytes.or(self.output_bytes),
            request_bytes: over.request_bytes.or(self.request_bytes),
            response_bytes: over.response_bytes.or(self.response_bytes),
            instances: over.instances.or(self.instances),
        }
    }
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
    /// Headers the host sets on every request to this destination, by name: the one place
    /// a secret is used by reference. A value may hold `${secret:NAME}` references (keys
    /// the binding makes readable or revealable), substituted as the request leaves. A
    /// header of the same name the tool writes is replaced; `${secret:...}` text the tool
    /// writes anywhere is sent as written, never substituted.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
}
