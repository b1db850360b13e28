//! Approval: which calls wait, who may decide them, and what a lapsed wait becomes.

use super::CallView;
use crate::auth::Principal;
use crate::call::{
    ApprovalDecision, ApprovalWait, CallError, CallRecord, CallState, ErrorKind, TimeoutAction,
};
use crate::spec::{ApprovalStep, OnTimeout};
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

/// Who decides a call when its wait lapses ([`ApprovalDecision::by`]).
pub const TIMEOUT_DECIDER: &str = "timeout";

/// Whether `caller` may decide `record` (`Err`: why not, for a `permission-denied`).
///
/// Operators may decide any call. An agent may decide a call of its own namespace when the
/// asking Middleware names it in `approvers` (as `NAME` or `NAMESPACE/NAME`), and never a
/// call it made itself, also not when an operator acts as it (`--as`): the principal is then
/// that agent.
pub fn may_decide(caller: &Principal, record: &CallRecord) -> Result<(), String> {
    let agent = match caller {
        Principal::Operator { .. } => return Ok(()),
        Principal::Agent { agent } => agent,
    };
    let own = record.namespace == agent.namespace
        && record.spec.access.agent.as_deref() == Some(agent.name.as_str());
    if own {
        return Err(format!(
            "agent {agent} made call {} and may not decide its own call",
            record.id
        ));
    }
    let Some(wait) = &record.spec.chain.approval else {
        return Err(format!(
            "call {} never waited for approval, so no agent may decide it",
            record.id
        ));
    };
    let qualified = agent.to_string();
    let named = wait
        .approvers
        .iter()
        .any(|a| *a == agent.name || *a == qualified);
    if record.namespace != agent.namespace || !named {
        return Err(format!(
            "agent {agent} is not an approver of middleware {:?} in namespace {:?}",
            wait.middleware, record.namespace
        ));
    }
    Ok(())
}

/// Whether `caller` may see `record` among the calls waiting for approval: its own, or one
/// it may decide.
pub fn may_see_waiting(caller: &Principal, record: &CallRecord) -> bool {
    match caller {
        Principal::Operator { .. } => true,
        Principal::Agent { agent } => {
            (record.namespace == agent.namespace
                && record.spec.access.agent.as_deref() == Some(agent.name.as_str()))
                || may_decide(caller, record).is_ok()
        }
    }
}

/// What a wait that has lapsed at `now_ms` becomes: `None` while it has not; otherwise the
/// decision (by [`TIMEOUT_DECIDER`]) and, for `onTimeout: deny`, the error the call fails
/// with ([`ErrorKind::ApprovalTimeout`]).
pub fn due(now_ms: i64, wait: &ApprovalWait) -> Option<(ApprovalDecision, Option<CallError>)> {
    if now_ms < wait.deadline_ms {
        return None;
    }
    let approved = wait.on_timeout == TimeoutAction::Allow;
    let reason = format!(
        "no decision by the deadline of middleware {:?}; onTimeout: {}",
        wait.middleware,
        if approved { "allow" } else { "deny" }
    );
    let error = (!approved).then(|| {
        CallError::new(
            ErrorKind::ApprovalTimeout,
            format!(
                "nobody approved the call before middleware {:?}'s approval timeout",
                wait.middleware
            ),
        )
    });
    Some((
        ApprovalDecision {
            approved,
            by: TIMEOUT_DECIDER.to_string(),
            at_ms: now_ms,
            reason,
        },
        error,
    ))
}

/// The decision to apply to `record` at `now_ms`: a call still waiting whose wait lapsed.
pub fn lapsed(now_ms: i64, record: &CallRecord) -> Option<(ApprovalDecision, Option<CallError>)> {
    if record.state != CallState::AwaitingApproval {
        return None;
    }
    due(now_ms, record.spec.chain.approval.as_ref()?)
}

/// The error a call denied by `by` fails with ([`ErrorKind::Denied`]), naming who and why.
pub fn denial(by: &str, reason: &str) -> CallError {
    let why = if reason.is_empty() {
        "no reason given".to_string()
    } else {
        reason.to_string()
    };
    CallError::new(ErrorKind::Denied, format!("denied by {by}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{CallAccess, CallSpec, ChainRecord};
    use crate::fixtures;
    use crate::ids::ObjectKey;

    fn wait(deadline_ms: i64, on_timeout: TimeoutAction) -> ApprovalWait {
        ApprovalWait {
            middleware: "needs-ok".into(),
            approvers: vec!["reviewer".into(), "other/remote".into()],
            deadline_ms,
            on_timeout,
        }
    }

    fn record(agent: Option<&str>) -> CallRecord {
        CallRecord {
            namespace: "team".into(),
            command: "run".into(),
            release_digest: "sha256:00".into(),
            state: CallState::AwaitingApproval,
            spec: CallSpec {
                access: CallAccess {
                    agent: agent.map(String::from),
                    ..Default::default()
                },
                chain: ChainRecord {
                    approval: Some(wait(1_000, TimeoutAction::Deny)),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..fixtures::record("c1")
        }
    }

    fn agent(namespace: &str, name: &str) -> Principal {
        Principal::Agent {
            agent: ObjectKey::new(namespace, name),
        }
    }

    #[test]
    fn operators_decide_any_call() {
        let operator = Principal::Operator {
            subject: "admin".into(),
        };
        assert_eq!(may_decide(&operator, &record(Some("caller"))), Ok(()));
        assert_eq!(may_decide(&operator, &record(None)), Ok(()));
    }

    #[test]
    fn an_approver_of_the_namespace_decides_others_calls() {
        assert_eq!(
            may_decide(&agent("team", "reviewer"), &record(Some("caller"))),
            Ok(())
        );
        assert_eq!(
            may_decide(&agent("team", "reviewer"), &record(None)),
            Ok(())
        );
        assert!(may_see_waiting(
            &agent("team", "reviewer"),
            &record(Some("caller"))
        ));
    }

    #[test]
    fn the_calling_agent_never_decides_its_own_call() {
        // Also when named as an approver, and also when an operator acts as it.
        let mut own = record(Some("reviewer"));
        let error = may_decide(&agent("team", "reviewer"), &own).unwrap_err();
        assert!(error.contains("own call"), "{error}");
        own.spec.chain.approval = None;
        assert!(may_decide(&agent("team", "reviewer"), &own).is_err());
        assert!(may_see_waiting(&agent("team", "reviewer"), &own));
    }

    #[test]
    fn agents_not_named_or_of_another_namespace_may_not_decide() {
        let error = may_decide(&agent("team", "bystander"), &record(Some("caller"))).unwrap_err();
        assert!(error.contains("not an approver"), "{error}");
        assert!(!may_see_waiting(
            &agent("team", "bystander"),
            &record(Some("caller"))
        ));
        // Named, but from another namespace: approvers are of the call's namespace.
        assert!(may_decide(&agent("other", "remote"), &record(Some("caller"))).is_err());
        assert!(may_decide(&agent("other", "reviewer"), &record(Some("caller"))).is_err());
        // A call that never waited: no agent decides it.
        let mut plain = record(Some("caller"));
        plain.spec.chain.approval = None;
        assert!(may_decide(&agent("team", "reviewer"), &plain).is_err());
    }

    #[test]
    fn a_wait_lapses_at_its_deadline_only() {
        assert_eq!(due(999, &wait(1_000, TimeoutAction::Deny)), None);
        let (decision, error) = due(1_000, &wait(1_000, TimeoutAction::Deny)).unwrap();
        assert!(!decision.approved);
        assert_eq!(decision.by, TIMEOUT_DECIDER);
        assert_eq!(decision.at_ms, 1_000);
        assert_eq!(error.unwrap().kind, ErrorKind::ApprovalTimeout);
        let (decision, error) = due(5_000, &wait(1_000, TimeoutAction::Allow)).unwrap();
        assert!(decision.approved);
        assert_eq!(decision.by, "timeout");
        assert_eq!(error, None);
    }

    #[test]
    fn only_waiting_calls_lapse() {
        let mut call = record(Some("caller"));
        assert!(lapsed(2_000, &call).is_some());
        assert!(lapsed(500, &call).is_none());
        call.state = CallState::Pending;
        assert!(lapsed(2_000, &call).is_none());
    }

    #[test]
    fn a_denial_names_who_and_why() {
        let error = denial("operator:admin", "too risky");
        assert_eq!(error.kind, ErrorKind::Denied);
        assert_eq!(error.message, "denied by operator:admin: too risky");
        assert!(
            denial("agent:team/r", "")
                .message
                .contains("no reason given")
        );
    }
}
