//! The seven resource kinds of `toolgrid.dev/v1alpha1`, one file a kind.
//!
//! These Rust types are the single source of truth: the CRDs in `crds/` and in the Helm
//! chart are generated from them (`toolgrid crds`), and both resource sources (the
//! Kubernetes watcher and the manifest directory) deserialize into them.

// kube's `printcolumn(...)` repeats its keys once per column, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
mod agent;
#[allow(clippy::duplicated_attributes)]
mod binding;
pub mod conditions;
mod crds;
#[allow(clippy::duplicated_attributes)]
mod middleware;
#[allow(clippy::duplicated_attributes)]
mod pool;
#[allow(clippy::duplicated_attributes)]
mod release;
#[allow(clippy::duplicated_attributes)]
mod tool;
#[allow(clippy::duplicated_attributes)]
mod tool_source;

pub use agent::{Agent, AgentSpec, AgentStatus, LocalObjectRef, Permission, SecretKeyRef};
pub use binding::{
    Exposure, FilesystemAccess, ReleaseSelector, Rollout, RolloutStatus, ToolBinding,
    ToolBindingSpec, ToolBindingStatus,
};
pub use crds::{all_crds, crds_helm_yaml, crds_yaml};
pub use middleware::{Middleware, MiddlewareSpec, MiddlewareStatus};
pub use pool::{Autoscale, WorkerPool, WorkerPoolSpec, WorkerPoolStatus};
pub use release::{ToolRelease, ToolReleaseSpec, ToolReleaseStatus};
pub use tool::{Tool, ToolSpec, ToolStatus};
pub use tool_source::{
    McpSourceSpec, OpenApiDocument, OpenApiSourceSpec, REFRESH_ANNOTATION, SourceAuth,
    SourceAuthType, SourceHeader, ToolSource, ToolSourceSpec, ToolSourceStatus,
};

/// The value types the kinds are made of are the domain's ([`toolgrid_core::spec`]): a
/// kind and its fields can be named from here alike.
pub use toolgrid_core::spec::{
    ApprovalStep, ArtifactSource, AuditStep, Command, ConfigMapKeyRef, DeclaredError, Effect,
    EgressRule, Flag, NetworkPolicy, OnTimeout, OptionArg, Overflow, PolicyAction, PolicyDefault,
    PolicyRewrite, PolicyRule, PolicyStep, Positional, RateKey, RateLimitStep, RedactStep,
    ReleaseLimits, ResultPolicy, RetryPolicy, StdinSpec, WasmStep, units,
};

/// The API group of every toolgrid kind.
pub const GROUP: &str = "toolgrid.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "toolgrid.dev/v1alpha1";
/// The namespace of a manifest that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The kinds, for lookups by name in manifests and on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Tool,
    ToolRelease,
    ToolBinding,
    Middleware,
    Agent,
    WorkerPool,
    ToolSource,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Tool,
        Kind::ToolRelease,
        Kind::ToolBinding,
        Kind::Middleware,
        Kind::Agent,
        Kind::WorkerPool,
        Kind::ToolSource,
    ];

    /// The `kind:` field of a manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tool => "Tool",
            Kind::ToolRelease => "ToolRelease",
            Kind::ToolBinding => "ToolBinding",
            Kind::Middleware => "Middleware",
            Kind::Agent => "Agent",
            Kind::WorkerPool => "WorkerPool",
            Kind::ToolSource => "ToolSource",
        }
    }

    /// Parses a kind as a user types it: `Tool`, `tools`, `tool`, or the short name `tl`.
    pub fn parse(s: &str) -> Option<Kind> {
        let lower = s.to_ascii_lowercase();
        Kind::ALL.into_iter().find(|k| {
            let name = k.as_str().to_ascii_lowercase();
            lower == name || lower == k.plural() || lower == k.short_name()
        })
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Tool => "tools",
            Kind::ToolRelease => "toolreleases",
            Kind::ToolBinding => "toolbindings",
            Kind::Middleware => "middlewares",
            Kind::Agent => "agents",
            Kind::WorkerPool => "workerpools",
            Kind::ToolSource => "toolsources",
        }
    }

    pub fn short_name(self) -> &'static str {
        match self {
            Kind::Tool => "tl",
            Kind::ToolRelease => "tr",
            Kind::ToolBinding => "tb",
            Kind::Middleware => "mw",
            Kind::Agent => "ag",
            Kind::WorkerPool => "wp",
            Kind::ToolSource => "ts",
        }
    }
}

/// A resource's status as its kind's `*Status` type: what both resource sources write.
#[derive(Clone, Debug, PartialEq)]
pub enum KindStatus {
    Tool(ToolStatus),
    ToolRelease(ToolReleaseStatus),
    ToolBinding(ToolBindingStatus),
    Middleware(MiddlewareStatus),
    Agent(AgentStatus),
    WorkerPool(WorkerPoolStatus),
    ToolSource(ToolSourceStatus),
}

/// Runs `$body` with `$status` bound to the `*Status` inside `$value`, whatever the kind.
macro_rules! each_status {
    ($value:expr, $status:ident => $body:expr) => {
        match $value {
            KindStatus::Tool($status) => $body,
            KindStatus::ToolRelease($status) => $body,
            KindStatus::ToolBinding($status) => $body,
            KindStatus::Middleware($status) => $body,
            KindStatus::Agent($status) => $body,
            KindStatus::WorkerPool($status) => $body,
            KindStatus::ToolSource($status) => $body,
        }
    };
}

impl KindStatus {
    /// An empty status of `kind`.
    pub fn empty(kind: Kind) -> KindStatus {
        match kind {
            Kind::Tool => KindStatus::Tool(ToolStatus::default()),
            Kind::ToolRelease => KindStatus::ToolRelease(ToolReleaseStatus::default()),
            Kind::ToolBinding => KindStatus::ToolBinding(ToolBindingStatus::default()),
            Kind::Middleware => KindStatus::Middleware(MiddlewareStatus::default()),
            Kind::Agent => KindStatus::Agent(AgentStatus::default()),
            Kind::WorkerPool => KindStatus::WorkerPool(WorkerPoolStatus::default()),
            Kind::ToolSource => KindStatus::ToolSource(ToolSourceStatus::default()),
        }
    }

    /// Sets what every kind's status has: its conditions and the generation they describe.
    pub fn set_conditions(
        &mut self,
        conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
        observed_generation: i64,
    ) {
        each_status!(self, status => {
            status.conditions = conditions;
            status.observed_generation = Some(observed_generation);
        })
    }

    /// The status as written to the API (and kept in the store).
    pub fn to_value(&self) -> serde_json::Value {
        each_status!(self, status => serde_json::to_value(status).unwrap_or_default())
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_from_every_spelling() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.as_str()), Some(kind));
            assert_eq!(Kind::parse(kind.plural()), Some(kind));
            assert_eq!(Kind::parse(kind.short_name()), Some(kind));
        }
        assert_eq!(Kind::parse("releases"), None);
    }

    #[test]
    fn a_kind_status_writes_its_own_fields_and_nothing_unset() {
        let mut tool = KindStatus::empty(Kind::Tool);
        tool.set_conditions(Vec::new(), 3);
        assert_eq!(
            tool.to_value(),
            serde_json::json!({"conditions": [], "observedGeneration": 3})
        );
        let mut release = KindStatus::ToolRelease(ToolReleaseStatus {
            digest: Some("sha256:aa".into()),
            ..ToolReleaseStatus::default()
        });
        release.set_conditions(Vec::new(), 1);
        assert_eq!(
            release.to_value(),
            serde_json::json!({"conditions": [], "observedGeneration": 1, "digest": "sha256:aa"})
        );
        for kind in Kind::ALL {
            let mut status = KindStatus::empty(kind);
            status.set_conditions(Vec::new(), 1);
            assert_eq!(status.to_value()["observedGeneration"], 1, "{kind}");
        }
    }
}
