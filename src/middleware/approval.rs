//! Approval: which calls wait, who may decide them, and what a lapsed wait becomes.

use super::CallView;
use crate::api::{ApprovalStep, OnTimeout};
use crate::call::{ApprovalWait, TimeoutAction};
use std::time::Duration;

/// Default of an approval step's `timeout`.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(3600);

/// An approval step, compiled.
#[derive(Debug)]
pub struct ApprovalRule {
    /// `when`, compiled (`None`: every call).
    pub when: Option<super::cel::Expression>,
    pub timeout: Duration,
    pub on_timeout: TimeoutAction,
    pub approvers: Vec<String>,
}

impl ApprovalRule {
    /// Compiles `spec` (`Err`: the CEL compiler's message).
    pub fn compile(spec: &ApprovalStep) -> Result<Self, String> {
        let when = match &spec.when {
            Some(source) => Some(super::cel::Expression::compile(source)?),
            None => None,
        };
        Ok(ApprovalRule {
            when,
            timeout: spec
                .timeout
                .map(|t| t.get())
                .unwrap_or(DEFAULT_APPROVAL_TIMEOUT),
            on_timeout: match spec.on_timeout {
                OnTimeout::Deny => TimeoutAction::Deny,
                OnTimeout::Allow => TimeoutAction::Allow,
            },
            approvers: spec.approvers.clone(),
        })
    }

    /// Whether `call` must wait (`Err`: `when` did not evaluate to a boolean).
    pub fn matches(&self, call: &CallView) -> Result<bool, String> {
        match &self.when {
            None => Ok(true),
            Some(when) => when.eval_bool(call),
        }
    }

    pub fn wait(&self, middleware: &str, now_ms: i64) -> ApprovalWait {
        ApprovalWait {
            middleware: middleware.to_string(),
            approvers: self.approvers.clone(),
            deadline_ms: now_ms.saturating_add(self.timeout.as_millis() as i64),
            on_timeout: self.on_timeout,
        }
    }
}
