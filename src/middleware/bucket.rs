//! Rate limits: token buckets keyed by agent, tool or both. The arithmetic is here (pure,
//! with fake time); the buckets themselves live in the store, so they hold across
//! control-plane restarts and replicas.
//!
//! CONTRACT(issue 10, helper C).

use super::CallView;
use crate::api::{RateKey, RateLimitStep};

/// A rate-limit step, resolved.
#[derive(Debug, Clone)]
pub struct RateLimit {
    pub key: RateKey,
    /// Bucket capacity.
    pub burst: u32,
    /// Tokens added per second.
    pub per_second: f64,
}

impl RateLimit {
    pub fn new(spec: &RateLimitStep) -> Self {
        let per = spec.per.get().as_secs_f64().max(0.001);
        RateLimit {
            key: spec.key,
            burst: spec.burst.unwrap_or(spec.requests).max(1),
            per_second: spec.requests as f64 / per,
        }
    }

    /// The store key of the bucket `call` draws from, for Middleware `middleware`.
    pub fn bucket_key(&self, middleware: &crate::catalog::ObjectKey, call: &CallView) -> String {
        let scope = match self.key {
            RateKey::Agent => format!("agent={}", call.agent),
            RateKey::Tool => format!("tool={}", call.tool),
            RateKey::AgentTool => format!("agent={};tool={}", call.agent, call.tool),
        };
        format!("{middleware}|{scope}")
    }
}
