//! `Agent`: a caller identity, its permissions, and the config and secrets its tools may get.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A caller identity: a ServiceAccount (TokenReview) or a bearer token from a Secret.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toolgrid.dev",
    version = "v1alpha1",
    kind = "Agent",
    namespaced,
    status = "AgentStatus",
    shortname = "ag",
    category = "toolgrid",
    doc = "A caller identity (ServiceAccount or token), its permissions, and the config and secrets its tools may be given.",
    printcolumn(
        name = "ServiceAccount",
        type_ = "string",
        json_path = ".spec.serviceAccount"
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
pub struct AgentSpec {
    /// In-cluster identity, checked with a TokenReview.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// Or: a bearer token kept in a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretKeyRef>,
    /// Or: the subjects (`sub`) of OAuth access tokens from the configured authorization
    /// server (`toolgrid up --oauth-issuer`) that are this agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oauth_subjects: Vec<String>,
    /// What the agent may call; bindings can only narrow this.
    #[serde(default)]
    pub permissions: Vec<Permission>,
    /// Config its tools may read (keys chosen per binding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<LocalObjectRef>,
    /// Secrets its tools may use (keys chosen per binding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectRef>,
    /// How the agent's model reaches its tools unless a binding says otherwise (`direct`,
    /// `codemode`, `both`; default `both`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<crate::binding::Exposure>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Permission {
    /// Tool names; `*` for all.
    pub tools: Vec<String>,
    /// Command names; `*` for all (the default).
    #[serde(default = "all")]
    pub commands: Vec<String>,
}

fn all() -> Vec<String> {
    vec!["*".to_string()]
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalObjectRef {
    pub name: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Tools the agent can call now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}
