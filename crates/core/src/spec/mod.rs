//! The value types the resources declare and the domain speaks: a Tool's commands and
//! policies, a release's artifact, limits and egress, a Middleware's steps, and the units
//! users write (sizes, durations).
//!
//! They carry no Kubernetes machinery: the resource kinds in `toolgrid-api` are made of
//! them (so the CRDs are generated from these types too), while the call model, the typed
//! command interfaces and the middleware decisions use them directly.

mod middleware;
mod release;
pub mod schema;
mod tool;
pub mod units;

pub use middleware::{
    ApprovalStep, AuditStep, OnTimeout, PolicyAction, PolicyDefault, PolicyRewrite, PolicyRule,
    PolicyStep, RateKey, RateLimitStep, RedactStep, WasmStep,
};
pub use release::{
    ArtifactSource, CommandArtifact, ConfigMapKeyRef, EgressRule, NetworkPolicy, ReleaseFile,
    ReleaseLimits,
};
pub use tool::{
    Command, DeclaredError, Effect, Flag, OptionArg, Overflow, Positional, ResultPolicy,
    RetryPolicy, StdinSpec,
};
pub use units::{ByteSize, GoDuration};
