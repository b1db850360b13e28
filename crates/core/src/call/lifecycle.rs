//! The transitions of a call, as plain functions over its state.
//!
//! [`Lifecycle`] is the part of a call every transition reads: its state, epoch and worker.
//! Each transition either returns the next lifecycle (and the oplog entry that records it)
//! or a [`Refusal`]; none does IO. The store runs them inside the transaction that writes
//! their result, so the rules are the same whichever backend holds the call.

use super::{
    Assigned, CallError, CallState, Ended, ErrorKind, Fenced, OplogEntry, Outcome, RunSummary,
};

/// The state, epoch and worker of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    pub state: CallState,
    /// Bumped by every assignment and every fence; 0 until the first assignment.
    pub epoch: u64,
    pub worker: Option<String>,
}

/// Why a transition does not apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The writer holds an older (or no) assignment of the call: it must stop at once.
    #[error("stale epoch {epoch} (the call is at epoch {current} in state {state})")]
    StaleEpoch {
        epoch: u64,
        current: u64,
        state: CallState,
    },
    /// The call has ended; nothing changes it any more.
    #[error("the call already ended ({0})")]
    Ended(CallState),
}

impl Lifecycle {
    /// A call just admitted: pending, never assigned.
    pub fn admitted() -> Self {
        Lifecycle {
            state: CallState::Pending,
            epoch: 0,
            worker: None,
        }
    }

    fn stale(&self, epoch: u64) -> Refusal {
        Refusal::StaleEpoch {
            epoch,
            current: self.epoch,
            state: self.state,
        }
    }

    /// Whether `epoch` holds the call's current assignment.
    pub fn holds(&self, epoch: u64) -> bool {
        self.state == CallState::Running && self.epoch == epoch
    }

    /// Hands the call to `worker` under a new epoch (a pending call, or a running one whose
    /// previous assignment is being replaced).
    pub fn assign(&self, worker: &str) -> Result<(Lifecycle, OplogEntry), Refusal> {
        if self.state.is_terminal() {
            return Err(Refusal::Ended(self.state));
        }
        let epoch = self.epoch + 1;
        let next = Lifecycle {
            state: CallState::Running,
            epoch,
            worker: Some(worker.to_string()),
        };
        let entry = OplogEntry::Assigned(Assigned {
            worker: worker.to_string(),
            epoch,
            workspace_version: None,
        });
        Ok((next, entry))
    }

    /// Accepts an append by the holder of `epoch`.
    pub fn append(&self, epoch: u64) -> Result<(), Refusal> {
        if self.holds(epoch) {
            Ok(())
        } else {
            Err(self.stale(epoch))
        }
    }

    /// Takes the call back from the holder of `epoch`: a new epoch refuses that holder's
    /// writes, and the call waits for another worker.
    pub fn fence(&self, epoch: u64, reason: &str) -> Result<(Lifecycle, OplogEntry), Refusal> {
        if !self.holds(epoch) {
            return Err(self.stale(epoch));
        }
        let next = Lifecycle {
            state: CallState::Pending,
            epoch: self.epoch + 1,
            worker: None,
        };
        let entry = OplogEntry::Fenced(Fenced {
            reason: reason.to_string(),
            previous_epoch: epoch,
        });
        Ok((next, entry))
    }

    /// Ends the call with its worker's judged result, for the holder of `epoch`.
    pub fn complete(
        &self,
        epoch: u64,
        result: &Result<serde_json::Value, CallError>,
        run: RunSummary,
    ) -> Result<(Lifecycle, OplogEntry), Refusal> {
        if !self.holds(epoch) {
            return Err(self.stale(epoch));
        }
        let (state, ended, error) = match result {
            Ok(_) => (CallState::Succeeded, Ended::Succeeded, None),
            Err(error) => (CallState::Failed, Ended::Failed, Some(error.clone())),
        };
        let next = Lifecycle {
            state,
            ..self.clone()
        };
        let entry = OplogEntry::Outcome(Outcome {
            state: ended,
            error,
            run: Some(run),
        });
        Ok((next, entry))
    }

    /// Ends a call that has not ended, whatever its epoch (it never reached a worker, its
    /// worker cannot go on, or its oplog cannot be replayed).
    pub fn fail(&self, error: &CallError) -> Result<(Lifecycle, OplogEntry), Refusal> {
        if self.state.is_terminal() {
            return Err(Refusal::Ended(self.state));
        }
        let next = Lifecycle {
            state: CallState::Failed,
            ..self.clone()
        };
        let entry = OplogEntry::Outcome(Outcome {
            state: Ended::Failed,
            error: Some(error.clone()),
            run: None,
        });
        Ok((next, entry))
    }

    /// The timeout a call has reached at `now_ms`, if any: a pending call at its deadline, a
    /// running one `grace_ms` past it (its worker should have reported by then).
    pub fn expire(&self, deadline_ms: i64, grace_ms: i64, now_ms: i64) -> Option<CallError> {
        if deadline_ms <= 0 {
            return None;
        }
        let message = match self.state {
            CallState::Pending if deadline_ms < now_ms => {
                "no worker slot became free before the call's deadline"
            }
            CallState::Running if deadline_ms + grace_ms < now_ms => {
                "the call's worker did not report before the deadline"
            }
            _ => return None,
        };
        Some(CallError::new(ErrorKind::Timeout, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(epoch: u64) -> RunSummary {
        RunSummary {
            exit_code: 0,
            stdout_bytes: 2,
            run_micros: 1,
            epoch,
            worker: "w".into(),
            replayed: 0,
        }
    }

    #[test]
    fn assign_then_complete() {
        let call = Lifecycle::admitted();
        assert!(call.append(0).is_err(), "nobody holds a pending call");
        let (call, entry) = call.assign("w1").unwrap();
        assert_eq!(call.state, CallState::Running);
        assert_eq!(call.epoch, 1);
        assert_eq!(
            entry,
            OplogEntry::Assigned(Assigned {
                worker: "w1".into(),
                epoch: 1,
                workspace_version: None,
            })
        );
        call.append(1).unwrap();
        let (done, entry) = call.complete(1, &Ok(json!({})), run(1)).unwrap();
        assert_eq!(done.state, CallState::Succeeded);
        assert!(matches!(
            entry,
            OplogEntry::Outcome(Outcome {
                state: Ended::Succeeded,
                ..
            })
        ));
        assert_eq!(
            done.assign("w2").unwrap_err(),
            Refusal::Ended(CallState::Succeeded)
        );
        assert!(done.fail(&CallError::new(ErrorKind::Timeout, "x")).is_err());
    }

    #[test]
    fn a_fence_refuses_the_old_holder() {
        let (call, _) = Lifecycle::admitted().assign("w1").unwrap();
        let (fenced, entry) = call.fence(1, "worker lost").unwrap();
        assert_eq!(fenced.state, CallState::Pending);
        assert_eq!(fenced.epoch, 2);
        assert!(matches!(
            entry,
            OplogEntry::Fenced(Fenced {
                previous_epoch: 1,
                ..
            })
        ));
        assert_eq!(
            fenced.append(1).unwrap_err(),
            Refusal::StaleEpoch {
                epoch: 1,
                current: 2,
                state: CallState::Pending
            }
        );
        assert!(fenced.complete(1, &Ok(json!(1)), run(1)).is_err());
        assert!(fenced.fence(1, "again").is_err(), "a fence happens once");
        let (again, _) = fenced.assign("w2").unwrap();
        assert_eq!(again.epoch, 3);
        again.append(3).unwrap();
        assert!(again.append(2).is_err());
    }

    #[test]
    fn a_running_call_can_be_reassigned_directly() {
        let (call, _) = Lifecycle::admitted().assign("w1").unwrap();
        let (call, _) = call.assign("w2").unwrap();
        assert_eq!(call.epoch, 2);
        assert!(call.append(1).is_err());
    }

    #[test]
    fn fail_ends_any_unfinished_call() {
        let error = CallError::new(ErrorKind::ReplayDivergence, "entry 3");
        let (failed, entry) = Lifecycle::admitted().fail(&error).unwrap();
        assert_eq!(failed.state, CallState::Failed);
        assert!(matches!(entry, OplogEntry::Outcome(Outcome { error: Some(e), .. }) if e == error));
    }

    #[test]
    fn deadlines_expire_pending_calls_at_once_and_running_ones_after_grace() {
        let pending = Lifecycle::admitted();
        assert!(pending.expire(1000, 500, 999).is_none());
        assert_eq!(
            pending.expire(1000, 500, 1001).map(|e| e.kind),
            Some(ErrorKind::Timeout)
        );
        let (running, _) = pending.assign("w").unwrap();
        assert!(running.expire(1000, 500, 1400).is_none());
        assert!(running.expire(1000, 500, 1501).is_some());
        assert!(running.expire(0, 0, i64::MAX).is_none(), "no deadline");
    }
}
