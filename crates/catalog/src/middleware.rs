//! Middleware resources compiled into their steps, and a binding's chain: which
//! Middleware, in which order (the order and the steps' decisions are
//! `toolgrid_core::middleware`'s).

use crate::{ResolvedBinding, Snapshot};
use std::sync::Arc;
use toolgrid_api::MiddlewareSpec;
use toolgrid_core::call::{AuditOptions, RedactRules};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::middleware::{ResolvedMiddleware, Step, approval, bucket, policy, redact};

/// What [`compile`] answers for a `wasm` step: it needs its artifact fetched and checked,
/// which the catalog does (see `Resolver::wasm_step` in [`crate::resolve`]).
pub const WASM_NEEDS_ARTIFACT: &str = "wasm middleware needs its artifact";

/// Compiles a Middleware's one step (`Err`: the compiler's message, naming the field
/// under the step, e.g. `rules[1].when: ...`). A `wasm` step is compiled with its artifact
/// elsewhere: here it is `Err(`[`WASM_NEEDS_ARTIFACT`]`)`.
pub fn compile(spec: &MiddlewareSpec) -> Result<Step, String> {
    if let Some(policy) = &spec.policy {
        return policy::Policy::compile(policy).map(Step::Policy);
    }
    if let Some(approval) = &spec.approval {
        return approval::ApprovalRule::compile(approval)
            .map(Step::Approval)
            .map_err(|e| format!("when: {e}"));
    }
    if let Some(redact) = &spec.redact {
        return Ok(Step::Redact(RedactRules {
            paths: redact.paths.clone(),
            patterns: redact.patterns.clone(),
            replacement: redact
                .replacement
                .clone()
                .unwrap_or_else(|| redact::DEFAULT_REDACTION.to_string()),
        }));
    }
    if let Some(audit) = &spec.audit {
        return Ok(Step::Audit(AuditOptions {
            exclude_args: audit.exclude_args.clone(),
            stdout: audit.stdout,
        }));
    }
    if let Some(rate) = &spec.rate_limit {
        return Ok(Step::RateLimit(bucket::RateLimit::new(rate)));
    }
    Err(WASM_NEEDS_ARTIFACT.to_string())
}

/// The Middleware a call passes through, in order.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    pub links: Vec<Arc<ResolvedMiddleware>>,
}

/// Why a binding has no usable chain: a Middleware it names is not Ready. The catalog
/// already makes such a binding not Ready (and one of a namespace whose enforced
/// Middleware is not Ready); should a call reach the chain anyway it is refused
/// ([`toolgrid_core::call::ErrorKind::MiddlewareFailed`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("middleware {name} is not ready: {message}")]
pub struct ChainError {
    pub name: String,
    pub message: String,
}

/// The chain of calls through `binding`: enforced Middleware of its namespace by name, then
/// its own list in order, each once.
pub fn chain_for(snapshot: &Snapshot, binding: &ResolvedBinding) -> Result<Chain, ChainError> {
    chain_in(snapshot, &binding.key.namespace, &binding.spec.middleware)
}

/// The chain of a binding of namespace `ns` that lists `listed`.
pub fn chain_in(snapshot: &Snapshot, ns: &str, listed: &[String]) -> Result<Chain, ChainError> {
    let mut links: Vec<Arc<ResolvedMiddleware>> = snapshot
        .middleware
        .values()
        .filter(|m| m.enforce && m.key.namespace == ns)
        .cloned()
        .collect();
    for name in listed {
        if links.iter().any(|l| &l.key.name == name) {
            continue;
        }
        match snapshot
            .middleware
            .get(&ObjectKey::new(ns.to_string(), name.clone()))
        {
            Some(m) => links.push(m.clone()),
            None => {
                return Err(ChainError {
                    name: name.clone(),
                    message: "it does not exist or is not Ready".into(),
                });
            }
        }
    }
    Ok(Chain { links })
}
