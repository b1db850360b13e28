//! Policy: ordered rules, the first whose `when` holds decides allow, deny or rewrite.
//!
//! CONTRACT(issue 10, helper A): compile the rules and decide.

use super::{CallView, StepOutcome};
use crate::api::PolicyStep;

/// A policy step, compiled.
#[derive(Debug)]
pub struct Policy {
    pub spec: PolicyStep,
}

impl Policy {
    /// Compiles every expression of `spec` (`Err`: the field and the compiler's message).
    pub fn compile(spec: &PolicyStep) -> Result<Self, String> {
        Ok(Policy { spec: spec.clone() })
    }

    /// What the policy decides about `call`.
    pub fn decide(&self, _call: &CallView) -> StepOutcome {
        StepOutcome::Failed("policy is not implemented yet".into())
    }
}
