//! Approval at the front doors: deciding a call that waits for approval (by a person, or by
//! its timeout), and listing the calls that wait. Who may decide is
//! [`toolgrid_core::middleware::approval`]'s pure decision; the store makes the decision atomic.

use super::{Gateway, authz, caller_name};
use std::sync::Arc;
use toolgrid_core::auth::Principal;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::middleware::approval;
use toolgrid_store::{CallFilter, CallRecord, now_ms};

impl Gateway {
    /// Approves (`approve`) or denies a call waiting for approval, as `caller`, with
    /// `reason`. Operators may decide any call, agents named in the asking Middleware's
    /// `approvers` calls of their namespace; never the calling agent its own call
    /// ([`ErrorKind::PermissionDenied`]). A call not waiting is
    /// [`ErrorKind::NotAwaitingApproval`]. An approved call is queued at once.
    pub async fn decide(
        &self,
        caller: &Principal,
        call_id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<CallRecord, ApiError> {
        let record = self.record(call_id).await?;
        if let Err(why) = approval::may_decide(caller, &record) {
            // A call the caller may neither read nor decide is not revealed.
            return Err(if authz::may_read_call(caller, &record) {
                ApiError::new(ErrorKind::PermissionDenied, why)
            } else {
                ApiError::new(ErrorKind::NotFound, format!("no call {call_id:?}"))
            });
        }
        let by = caller_name(caller);
        let decision = toolgrid_core::call::ApprovalDecision {
            approved: approve,
            by: by.clone(),
            at_ms: now_ms(),
            reason: reason.to_string(),
        };
        let error = (!approve).then(|| approval::denial(&by, reason));
        let record = self.apply_decision(&record.id, decision, error).await?;
        tracing::info!(call = %record.id, by = %by, approved = approve, "approval decided");
        Ok(record)
    }

    /// Records a decision and acts on it: an approved call is queued at once, a denied one
    /// has ended (its waiters are told).
    async fn apply_decision(
        &self,
        call_id: &str,
        decision: toolgrid_core::call::ApprovalDecision,
        error: Option<toolgrid_core::call::CallError>,
    ) -> Result<CallRecord, ApiError> {
        let record = self.store.decide_approval(call_id, decision, error).await?;
        if record.state.is_terminal() {
            crate::scheduler::audit_to_stdout(&record);
            self.calls.finish(record.clone());
        } else {
            match crate::scheduler::interface_of(&record) {
                Ok(interface) => self.scheduler.submit(record.clone(), Arc::new(interface)),
                Err(why) => {
                    let error = toolgrid_core::call::CallError::new(
                        ErrorKind::Internal,
                        format!("the approved call cannot be queued: {why}"),
                    );
                    let failed = self.store.fail_call(&record.id, error).await?;
                    crate::scheduler::audit_to_stdout(&failed);
                    self.calls.finish(failed.clone());
                    return Ok(failed);
                }
            }
        }
        Ok(record)
    }

    /// Applies the approval timeouts that have lapsed at `now_ms` (`onTimeout: deny` fails
    /// the call `approval-timeout`, `allow` queues it, decided by `timeout`). The waiting
    /// calls are read from the store, so a restarted control plane picks up where the last
    /// one stopped. Returns how many calls were decided.
    ///
    /// The store is read only when a known deadline has come (the earliest among the calls
    /// the last read found and those admitted since), on the first call, or when `rescan`
    /// says so (a periodic safety net for calls admitted elsewhere).
    pub async fn apply_approval_timeouts(
        &self,
        now_ms: i64,
        rescan: bool,
    ) -> Result<usize, ApiError> {
        use std::sync::atomic::Ordering;
        if !rescan && self.approval_wake_ms.load(Ordering::SeqCst) > now_ms {
            return Ok(0);
        }
        // Calls admitted from now on lower the mark themselves; this read may miss them.
        let previous = self.approval_wake_ms.swap(i64::MAX, Ordering::SeqCst);
        let waiting = match self
            .store
            .list_calls(&CallFilter {
                state: Some(toolgrid_core::call::CallState::AwaitingApproval),
                limit: 10_000,
                ..Default::default()
            })
            .await
        {
            Ok(waiting) => waiting,
            Err(error) => {
                self.approval_wake_ms.fetch_min(previous, Ordering::SeqCst);
                return Err(error.into());
            }
        };
        let mut decided = 0;
        let mut next = i64::MAX;
        for record in waiting {
            let Some((decision, error)) = approval::lapsed(now_ms, &record) else {
                if let Some(wait) = &record.spec.chain.approval {
                    next = next.min(wait.deadline_ms);
                }
                continue;
            };
            match self.apply_decision(&record.id, decision, error).await {
                Ok(_) => decided += 1,
                // Decided by a person meanwhile: that decision stands.
                Err(e) if e.kind == ErrorKind::NotAwaitingApproval => {}
                Err(e) => {
                    tracing::warn!(call = %record.id, error = %e.message, "approval timeout not applied; retrying");
                    next = next.min(now_ms);
                }
            }
        }
        self.approval_wake_ms.fetch_min(next, Ordering::SeqCst);
        Ok(decided)
    }

    /// The calls waiting for approval that `caller` may read, oldest first.
    pub async fn awaiting_approval(
        &self,
        caller: &Principal,
        namespace: &str,
    ) -> Result<Vec<CallRecord>, ApiError> {
        let namespace = match caller {
            Principal::Agent { agent } => {
                if !namespace.is_empty() && namespace != agent.namespace {
                    return Ok(Vec::new());
                }
                Some(agent.namespace.clone())
            }
            Principal::Operator { .. } => (!namespace.is_empty()).then(|| namespace.to_string()),
        };
        let mut calls: Vec<CallRecord> = self
            .store
            .list_calls(&CallFilter {
                namespace,
                state: Some(toolgrid_core::call::CallState::AwaitingApproval),
                limit: 10_000,
                ..Default::default()
            })
            .await?
            .into_iter()
            .filter(|r| approval::may_see_waiting(caller, r))
            .collect();
        calls.reverse();
        Ok(calls)
    }
}
