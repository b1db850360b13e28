//! `Middleware`: a step every bound call passes through.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolgrid_core::spec::{
    ApprovalStep, AuditStep, PolicyStep, RateLimitStep, RedactStep, WasmStep,
};

/// One step of the call path: exactly one of policy, approval, redact, audit, rateLimit or
/// wasm. Middleware can narrow or rewrite a call, never widen what it may do.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toolgrid.dev",
    version = "v1alpha1",
    kind = "Middleware",
    namespaced,
    status = "MiddlewareStatus",
    shortname = "mw",
    category = "toolgrid",
    plural = "middlewares",
    doc = "A step every bound call passes through: policy, approval, redaction, audit, rate limit, or a wasm middleware.",
    printcolumn(name = "Enforce", type_ = "boolean", json_path = ".spec.enforce"),
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
pub struct MiddlewareSpec {
    /// Applies to every binding in the namespace and cannot be removed by one.
    #[serde(default)]
    pub enforce: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redact: Option<RedactStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasm: Option<WasmStep>,
}

impl MiddlewareSpec {
    /// The names of the steps that are set; a valid spec has exactly one.
    pub fn steps(&self) -> Vec<&'static str> {
        let mut steps = Vec::new();
        if self.policy.is_some() {
            steps.push("policy");
        }
        if self.approval.is_some() {
            steps.push("approval");
        }
        if self.redact.is_some() {
            steps.push("redact");
        }
        if self.audit.is_some() {
            steps.push("audit");
        }
        if self.rate_limit.is_some() {
            steps.push("rateLimit");
        }
        if self.wasm.is_some() {
            steps.push("wasm");
        }
        steps
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MiddlewareStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
