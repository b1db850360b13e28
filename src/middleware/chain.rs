//! A binding's chain: which Middleware, in which order (see the module above).
//!

use super::ResolvedMiddleware;
use crate::catalog::{ResolvedBinding, Snapshot};
use std::sync::Arc;

/// The Middleware a call passes through, in order.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    pub links: Vec<Arc<ResolvedMiddleware>>,
}

/// Why a binding has no usable chain: a Middleware it names is not Ready. The catalog
/// already makes such a binding not Ready (and one of a namespace whose enforced
/// Middleware is not Ready); should a call reach the chain anyway it is refused
/// ([`crate::call::ErrorKind::MiddlewareFailed`]).
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
        match snapshot.middleware.get(&crate::catalog::ObjectKey::new(
            ns.to_string(),
            name.clone(),
        )) {
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
