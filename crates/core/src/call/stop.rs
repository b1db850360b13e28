//! How a call stopped from outside ends: cancelled by its caller, or cut off by its
//! deadline.
//!
//! Stopping is not rollback: whatever the call did before it stopped stays done. What the
//! outcome says is whether that may include an effect on the world:
//! - a call of a `read` or `idempotent` tool ends with the kind it was stopped for
//!   (`cancelled`, `timeout`): reading changed nothing, and an idempotent request can be
//!   made again safely;
//! - a call of a `write` or `external` tool that recorded an outgoing request (its start
//!   is committed before it leaves, so a recorded request may have been applied) ends
//!   `outcome-unknown`, naming why it was stopped and how many requests it made;
//! - one that recorded none ends with the kind it was stopped for: nothing left the sandbox.

use super::{CallError, ErrorKind};
use crate::spec::Effect;

/// The error of a call stopped for `kind` (`cancelled`, `timeout`) because of `reason`,
/// whose tool has `effect` and whose oplog records `requests` outgoing requests.
pub fn stopped_error(kind: ErrorKind, reason: &str, effect: Effect, requests: u64) -> CallError {
    if !effect.is_repeatable() && requests > 0 {
        return CallError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "{kind}: {reason}; the call ({effect}) had made {requests} outgoing request(s), \
                 which may have been applied (stopping is not rollback)"
            ),
        );
    }
    CallError::new(kind, reason.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_write_or_external_call_with_a_request_is_outcome_unknown() {
        for effect in [Effect::Read, Effect::Idempotent] {
            let error = stopped_error(ErrorKind::Cancelled, "by x", effect, 3);
            assert_eq!(error.kind, ErrorKind::Cancelled, "{effect}");
        }
        for effect in [Effect::Write, Effect::External] {
            assert_eq!(
                stopped_error(ErrorKind::Cancelled, "by x", effect, 0).kind,
                ErrorKind::Cancelled
            );
            let error = stopped_error(ErrorKind::Timeout, "deadline", effect, 1);
            assert_eq!(error.kind, ErrorKind::OutcomeUnknown);
            assert!(
                error.message.starts_with("timeout: deadline"),
                "{}",
                error.message
            );
        }
    }
}
