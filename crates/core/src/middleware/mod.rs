//! The middleware chain's domain: what each step decides about a call, as pure functions
//! over the call and the step's resolved spec. No IO: the gateway runs the chain (and does
//! the IO a step needs: the store's rate buckets, a wasm sandbox), the scheduler applies the
//! result-side steps, the store keeps what they decided.
//!
//! # The chain and its order
//!
//! A bound call's chain is every Ready `enforce: true` Middleware of its namespace (by
//! name), then the binding's `middleware` in the order listed (one named twice, or also
//! enforced, counts once). Agents cannot see or skip it. Its steps act in four phases:
//!
//! 1. **decide**, in chain order: `rateLimit` (takes a token), `policy` (allow, deny,
//!    rewrite), `wasm` (allow, deny, rewrite). A rewritten call is validated against the
//!    schema and authorized again, as the rewritten call, before the next step sees it.
//! 2. **repeated calls** (built in): the agent's identical call within the Tool's
//!    `repeatWindow` is refused, unless the command sets `allowRepeat` or the same
//!    idempotency key returns the first call.
//! 3. **approval**: the first approval step whose `when` holds makes the call wait in
//!    `awaiting-approval`.
//! 4. **result**, after the call ends: `redact` (every redact step, before the result is
//!    stored or returned), then `audit` (every call gets an audit record; audit steps shape
//!    it and can copy it to stdout).
//!
//! A step that cannot decide (a CEL expression that fails, a wasm middleware that traps or
//! runs out of time) refuses the call: the chain fails closed. So does a Middleware that is
//! not Ready: every binding naming it, and every binding of its namespace when it is
//! enforced, is not Ready either (`MiddlewareNotReady`), so their calls are refused before
//! the chain runs.

pub mod approval;
pub mod audit;
pub mod bucket;
pub mod cel;
pub mod policy;
pub mod redact;

use crate::call::{AuditOptions, RedactRules, StepKind};
use crate::ids::ObjectKey;
use crate::spec::Effect;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The call as middleware sees it (CEL's `call`, a wasm middleware's input).
#[derive(Clone, Debug, PartialEq)]
pub struct CallView {
    /// The agent's name.
    pub agent: String,
    pub namespace: String,
    pub tool: String,
    pub command: String,
    /// Validated arguments by name.
    pub args: Map<String, Value>,
    pub effect: Effect,
    /// The version of the release the call runs.
    pub release: String,
    pub dry_run: bool,
}

impl CallView {
    /// The call as JSON (`{agent, namespace, tool, command, args, effect, release, dryRun}`):
    /// what a wasm middleware receives.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "agent": self.agent,
            "namespace": self.namespace,
            "tool": self.tool,
            "command": self.command,
            "args": self.args,
            "effect": self.effect.as_str(),
            "release": self.release,
            "dryRun": self.dry_run,
        })
    }
}

/// A step's change to a call: the command to run, and the complete new arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewrite {
    pub command: String,
    pub args: Map<String, Value>,
}

/// What a deciding step (policy, wasm) answers.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOutcome {
    Allow,
    /// Refused, with the message the caller sees.
    Deny(String),
    Rewrite(Rewrite),
    /// The step could not decide (the reason): the call is refused
    /// ([`crate::call::ErrorKind::MiddlewareFailed`]).
    Failed(String),
}

/// A Ready Middleware, compiled.
#[derive(Debug)]
pub struct ResolvedMiddleware {
    pub key: ObjectKey,
    pub enforce: bool,
    pub step: Step,
}

impl ResolvedMiddleware {
    pub fn name(&self) -> &str {
        &self.key.name
    }
}

/// One compiled step.
#[derive(Debug)]
pub enum Step {
    Policy(policy::Policy),
    Approval(approval::ApprovalRule),
    Redact(RedactRules),
    Audit(AuditOptions),
    RateLimit(bucket::RateLimit),
    Wasm(WasmModule),
}

impl Step {
    pub fn kind(&self) -> StepKind {
        match self {
            Step::Policy(_) => StepKind::Policy,
            Step::Approval(_) => StepKind::Approval,
            Step::Redact(_) => StepKind::Redact,
            Step::Audit(_) => StepKind::Audit,
            Step::RateLimit(_) => StepKind::RateLimit,
            Step::Wasm(_) => StepKind::Wasm,
        }
    }
}

/// A wasm middleware's component, fetched and checked, with its limits.
#[derive(Clone, Debug)]
pub struct WasmModule {
    /// `sha256:<hex>` of the component.
    pub digest: String,
    pub bytes: Arc<Vec<u8>>,
    pub timeout: std::time::Duration,
    pub memory_bytes: u64,
}

/// Longest decision a wasm middleware may take when its spec says nothing.
pub const DEFAULT_WASM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest `timeout` a wasm middleware may ask for: it holds up every call it sees.
pub const MAX_WASM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Largest linear memory of a wasm middleware when its spec says nothing.
pub const DEFAULT_WASM_MEMORY: u64 = 64 << 20;
/// Largest `memory` a wasm middleware may ask for.
pub const MAX_WASM_MEMORY: u64 = 1 << 30;

/// Compiles a wasm step over its component's checked bytes (`digest` is theirs): the
/// limits, defaulted and bounded. The component itself is compiled by the sandbox's
/// wasm middleware runner (`toolgrid_sandbox::middleware::WasmRunner`) on first use.
pub fn compile_wasm(
    spec: &crate::spec::WasmStep,
    digest: &str,
    bytes: Arc<Vec<u8>>,
) -> Result<Step, String> {
    let timeout = spec.timeout.map_or(DEFAULT_WASM_TIMEOUT, |t| t.get());
    if timeout.is_zero() || timeout > MAX_WASM_TIMEOUT {
        return Err(format!(
            "spec.wasm.timeout: {timeout:?} is not above zero and at most {MAX_WASM_TIMEOUT:?}"
        ));
    }
    let memory_bytes = spec.memory.map_or(DEFAULT_WASM_MEMORY, |m| m.bytes());
    if !(64 << 10..=MAX_WASM_MEMORY).contains(&memory_bytes) {
        return Err(format!(
            "spec.wasm.memory: {memory_bytes} bytes is not between one 64Ki page and {MAX_WASM_MEMORY} bytes"
        ));
    }
    Ok(Step::Wasm(WasmModule {
        digest: digest.to_string(),
        bytes,
        timeout,
        memory_bytes,
    }))
}

#[cfg(test)]
mod wasm_tests {
    use super::*;
    use crate::spec::WasmStep;

    fn spec(yaml: &str) -> WasmStep {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn a_wasm_step_gets_default_and_bounded_limits() {
        let bytes = Arc::new(vec![1, 2, 3]);
        let Ok(Step::Wasm(m)) =
            compile_wasm(&spec("artifact: {file: m.wasm}"), "sha256:x", bytes.clone())
        else {
            panic!("compiles")
        };
        assert_eq!(
            (m.timeout, m.memory_bytes),
            (DEFAULT_WASM_TIMEOUT, DEFAULT_WASM_MEMORY)
        );
        assert_eq!(m.digest, "sha256:x");
        let Ok(Step::Wasm(m)) = compile_wasm(
            &spec("{artifact: {file: m.wasm}, timeout: 250ms, memory: 8Mi}"),
            "sha256:x",
            bytes.clone(),
        ) else {
            panic!("compiles")
        };
        assert_eq!(
            (m.timeout, m.memory_bytes),
            (std::time::Duration::from_millis(250), 8 << 20)
        );
        for bad in [
            "{artifact: {file: m.wasm}, timeout: 0s}",
            "{artifact: {file: m.wasm}, timeout: 1m}",
            "{artifact: {file: m.wasm}, memory: 1Ki}",
            "{artifact: {file: m.wasm}, memory: 2Gi}",
        ] {
            let error = compile_wasm(&spec(bad), "sha256:x", bytes.clone()).unwrap_err();
            assert!(error.starts_with("spec.wasm."), "{error}");
        }
    }
}
