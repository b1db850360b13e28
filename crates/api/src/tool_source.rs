//! `ToolSource`: tools a team already runs elsewhere (an MCP server, an HTTP API described
//! by OpenAPI), imported as `<source>__<tool>` under the same bindings, middleware, oplog
//! and exactly-once rules as toolgrid's own.

use crate::agent::SecretKeyRef;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toolgrid_core::source::SourceSnapshot;
use toolgrid_core::spec::{ConfigMapKeyRef, Effect, GoDuration};

/// The annotation `toolgrid refresh` sets: a source whose value differs from
/// `status.refreshed` is read again (its generation does not change).
pub const REFRESH_ANNOTATION: &str = "toolgrid.dev/refresh";

/// An MCP server or an OpenAPI API whose tools become bindable tools.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toolgrid.dev",
    version = "v1alpha1",
    kind = "ToolSource",
    namespaced,
    status = "ToolSourceStatus",
    shortname = "ts",
    category = "toolgrid",
    doc = "Tools from elsewhere: an MCP server or an OpenAPI API, each tool callable as <source>__<tool>.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".status.kind"),
    printcolumn(name = "Tools", type_ = "integer", json_path = ".status.toolCount"),
    printcolumn(
        name = "LeftOut",
        type_ = "integer",
        json_path = ".status.leftOutCount"
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
pub struct ToolSourceSpec {
    /// An MCP server over streamable HTTP (either era of the protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpSourceSpec>,
    /// An HTTP API described by an OpenAPI 3.0 or 3.1 document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openapi: Option<OpenApiSourceSpec>,
    /// The WorkerPool whose workers make the upstream requests (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Effects by upstream name (MCP tool or `operationId`), over those derived from MCP
    /// annotations or HTTP methods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub effects: BTreeMap<String, Effect>,
    /// Whole-call deadline of each imported tool (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout: Option<GoDuration>,
}

/// An MCP server.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpSourceSpec {
    /// The streamable HTTP endpoint (`https://…/mcp`).
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<SourceAuth>,
    /// Headers sent with every request, each a value or a Secret key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<SourceHeader>,
    /// Tools imported (exact names or globs with `*`; empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_tools: Vec<String>,
    /// Tools never imported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_tools: Vec<String>,
    /// How long listing the server may take (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    /// Allow plain `http://` (default: https only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
    /// Allow loopback, private, link-local and metadata addresses (default: public only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private: bool,
}

/// An HTTP API described by OpenAPI.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenApiSourceSpec {
    /// Where the document is.
    pub spec: OpenApiDocument,
    /// Where requests go (default: the document's first server, or the origin of its URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<SourceAuth>,
    /// Headers sent with every request, each a value or a Secret key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<SourceHeader>,
    /// Operations imported, by `operationId` (exact or globs with `*`; empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_operations: Vec<String>,
    /// Operations never imported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_operations: Vec<String>,
    /// Allow plain `http://` (default: https only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
    /// Allow loopback, private, link-local and metadata addresses (default: public only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private: bool,
}

/// Where an OpenAPI document is: one of `url`, `configMap`, `file`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OpenApiDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKeyRef>,
    /// A file next to the manifest (`toolgrid up` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// How toolgrid authenticates to the upstream. The calling agent's own token never goes.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceAuth {
    #[serde(rename = "type")]
    pub kind: SourceAuthType,
    /// The bearer token (`type: bearer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SourceAuthType {
    /// `Authorization: Bearer <the Secret's value>`.
    Bearer,
    /// `Authorization: Bearer <a signed identity token>` minted for each upstream request
    /// (`iss` the platform, `aud` the upstream, `sub` the agent), verifiable against the
    /// platform's `/.well-known/jwks.json`.
    Identity,
}

/// A header sent with every request: a `value`, or a Secret key (`secretRef`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceHeader {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolSourceStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `mcp` or `openapi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The generation the snapshot was read for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_generation: Option<i64>,
    /// The `toolgrid.dev/refresh` annotation the snapshot answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshed: Option<String>,
    /// The last refresh failed (reason and message): the earlier snapshot is still served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_error: Option<String>,
    /// When the snapshot was read (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_out_count: Option<i64>,
    /// What the source offered when it was last read: each tool (name, effect, schemas,
    /// how it is called) and what was left out and why. Calls use this snapshot until the
    /// source is read again (a new generation, or `toolgrid refresh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "toolgrid_core::spec::schema::any_value")]
    pub snapshot: Option<SourceSnapshot>,
}
