//! Retries: which failed attempts of a call run again, and after how long.
//!
//! A call of a `read` or `idempotent` tool whose attempt fails for a **transient** reason
//! runs again, up to the Tool's `retry.attempts` in all (default [`DEFAULT_ATTEMPTS`]), each
//! retry after a backoff that doubles from `retry.backoff` (default [`DEFAULT_BACKOFF`]) up
//! to [`MAX_BACKOFF`]. A `write` or `external` call runs once, whatever its `retry` says.
//!
//! Transient ([`Transient`]):
//! - a declared error with `retryable: true` (the tool exited with its code);
//! - `unavailable` (the worker could not fetch the release, the tool's pool went away);
//! - `replay-divergence` reported by a worker: the call's worker was lost, and the run that
//!   took it over could not replay the attempt's oplog (the tool did not repeat its host
//!   calls). Repeating a `read`/`idempotent` call's requests is harmless, so it starts a
//!   fresh attempt instead of failing. A stored oplog that does not parse is not transient
//!   (the store is corrupt), and a worker lost mid-call is not a failed attempt at all: the
//!   call fails over and replays within the same attempt.
//!
//! Everything else (timeouts, limits, invalid results, undeclared or non-retryable exit
//! codes, refusals) ends the call. A retry is never planned past the call's deadline: when
//! the backoff would end at or after it, the call ends with the attempt's error.
//!
//! [`decide`] is pure: the scheduler gives it the failed attempt, the error, the policy
//! fixed at admission and the time, and does what it answers (records a `retry` oplog
//! entry, takes the call back, queues it after the backoff).

use super::{CallError, ErrorKind};
use crate::spec::{DeclaredError, Effect, RetryPolicy};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Attempts in all of a `read` or `idempotent` call whose Tool sets no `retry`.
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// Most attempts honoured; a larger `retry.attempts` is clamped to it.
pub const MAX_ATTEMPTS: u32 = 10;
/// Wait before the first retry when the Tool's `retry` sets no `backoff`.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A call's retry policy, fixed when it is admitted (kept in its spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetrySpec {
    /// Attempts in all, including the first (at least 1).
    pub attempts: u32,
    /// Wait before the first retry, in milliseconds; doubles for each later one.
    pub backoff_ms: u64,
}

impl RetrySpec {
    /// A call that runs once.
    pub const ONCE: RetrySpec = RetrySpec {
        attempts: 1,
        backoff_ms: 0,
    };

    /// The policy of a call of a tool with `effect` and `retry`: only `read` and
    /// `idempotent` calls get more than one attempt.
    pub fn of(effect: Effect, retry: Option<&RetryPolicy>) -> RetrySpec {
        if !effect.is_repeatable() {
            return RetrySpec::ONCE;
        }
        let attempts = retry
            .map(|r| r.attempts)
            .unwrap_or(DEFAULT_ATTEMPTS)
            .clamp(1, MAX_ATTEMPTS);
        let backoff = retry
            .and_then(|r| r.backoff)
            .map(|b| b.get())
            .unwrap_or(DEFAULT_BACKOFF)
            .min(MAX_BACKOFF);
        RetrySpec {
            attempts,
            backoff_ms: backoff.as_millis() as u64,
        }
    }

    /// The wait before attempt `failed + 1`: `backoff * 2^(failed - 1)`, at most
    /// [`MAX_BACKOFF`].
    pub fn backoff_after(&self, failed: u32) -> Duration {
        let factor = 1u64 << failed.saturating_sub(1).min(20);
        Duration::from_millis(self.backoff_ms.saturating_mul(factor)).min(MAX_BACKOFF)
    }
}

/// Why a failed attempt may be run again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transient {
    /// A declared error with `retryable: true`.
    Declared,
    /// `unavailable`.
    Unavailable,
    /// The run that took over from a lost worker could not replay the attempt.
    ReplayLost,
}

/// Whether `error` is transient. `declared` is the command's declared error for the
/// error's exit code, if it has one.
pub fn transient(error: &CallError, declared: Option<&DeclaredError>) -> Option<Transient> {
    match error.kind {
        ErrorKind::ToolError
            if error.exit_code != 0
                && declared.is_some_and(|d| {
                    d.retryable && d.exit_code == error.exit_code && d.name == error.name
                }) =>
        {
            Some(Transient::Declared)
        }
        ErrorKind::Unavailable => Some(Transient::Unavailable),
        ErrorKind::ReplayDivergence => Some(Transient::ReplayLost),
        _ => None,
    }
}

/// What follows a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run attempt `next` after `backoff`.
    Retry {
        next: u32,
        backoff: Duration,
        why: Transient,
    },
    /// The call ends with the attempt's error.
    End(EndReason),
}

/// Why a failed attempt ends the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The error is not transient.
    NotTransient,
    /// That was the last attempt the policy allows.
    AttemptsUsed,
    /// The backoff would reach the call's deadline.
    Deadline,
}

/// Decides what follows attempt `failed` (from 1) ending with `error`, at `now_ms` (Unix
/// milliseconds) for a call due by `deadline_ms` (0: none).
pub fn decide(
    spec: &RetrySpec,
    failed: u32,
    error: &CallError,
    declared: Option<&DeclaredError>,
    now_ms: i64,
    deadline_ms: i64,
) -> Decision {
    let Some(why) = transient(error, declared) else {
        return Decision::End(EndReason::NotTransient);
    };
    if failed.max(1) >= spec.attempts.max(1) {
        return Decision::End(EndReason::AttemptsUsed);
    }
    let backoff = spec.backoff_after(failed.max(1));
    if deadline_ms > 0 && now_ms.saturating_add(backoff.as_millis() as i64) >= deadline_ms {
        return Decision::End(EndReason::Deadline);
    }
    Decision::Retry {
        next: failed.max(1) + 1,
        backoff,
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::units::GoDuration;

    fn declared(retryable: bool) -> DeclaredError {
        DeclaredError {
            name: "upstream-busy".into(),
            exit_code: 5,
            description: String::new(),
            retryable,
        }
    }

    fn tool_error() -> CallError {
        CallError {
            name: "upstream-busy".into(),
            exit_code: 5,
            ..CallError::new(ErrorKind::ToolError, "503")
        }
    }

    fn policy(attempts: u32, backoff: &str) -> RetryPolicy {
        RetryPolicy {
            attempts,
            backoff: Some(serde_json::from_value::<GoDuration>(backoff.into()).unwrap()),
        }
    }

    #[test]
    fn only_read_and_idempotent_calls_get_more_than_one_attempt() {
        assert_eq!(RetrySpec::of(Effect::Read, None).attempts, DEFAULT_ATTEMPTS);
        assert_eq!(
            RetrySpec::of(Effect::Idempotent, None).attempts,
            DEFAULT_ATTEMPTS
        );
        assert_eq!(
            RetrySpec::of(Effect::Read, None).backoff_ms,
            DEFAULT_BACKOFF.as_millis() as u64
        );
        let five = policy(5, "100ms");
        assert_eq!(RetrySpec::of(Effect::Write, Some(&five)), RetrySpec::ONCE);
        assert_eq!(
            RetrySpec::of(Effect::External, Some(&five)),
            RetrySpec::ONCE
        );
        assert_eq!(RetrySpec::of(Effect::Write, None), RetrySpec::ONCE);
        assert_eq!(
            RetrySpec::of(Effect::Read, Some(&five)),
            RetrySpec {
                attempts: 5,
                backoff_ms: 100
            }
        );
        // `attempts: 1` turns retries off; nonsense is clamped.
        assert_eq!(
            RetrySpec::of(Effect::Read, Some(&policy(1, "1s"))).attempts,
            1
        );
        assert_eq!(
            RetrySpec::of(Effect::Read, Some(&policy(0, "1s"))).attempts,
            1
        );
        assert_eq!(
            RetrySpec::of(Effect::Read, Some(&policy(1000, "1h"))),
            RetrySpec {
                attempts: MAX_ATTEMPTS,
                backoff_ms: MAX_BACKOFF.as_millis() as u64
            }
        );
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let spec = RetrySpec {
            attempts: 10,
            backoff_ms: 100,
        };
        let waits: Vec<u64> = (1..=6)
            .map(|n| spec.backoff_after(n).as_millis() as u64)
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200]);
        assert_eq!(spec.backoff_after(40), MAX_BACKOFF);
        let huge = RetrySpec {
            attempts: 3,
            backoff_ms: u64::MAX,
        };
        assert_eq!(huge.backoff_after(3), MAX_BACKOFF);
    }

    #[test]
    fn transient_failures_are_the_retryable_declared_ones_unavailable_and_a_lost_replay() {
        assert_eq!(
            transient(&tool_error(), Some(&declared(true))),
            Some(Transient::Declared)
        );
        assert_eq!(transient(&tool_error(), Some(&declared(false))), None);
        assert_eq!(transient(&tool_error(), None), None);
        // A declared error of another code does not make this one retryable.
        let other = CallError {
            exit_code: 6,
            ..tool_error()
        };
        assert_eq!(transient(&other, Some(&declared(true))), None);
        assert_eq!(
            transient(&CallError::new(ErrorKind::Unavailable, "x"), None),
            Some(Transient::Unavailable)
        );
        assert_eq!(
            transient(&CallError::new(ErrorKind::ReplayDivergence, "x"), None),
            Some(Transient::ReplayLost)
        );
        for kind in [
            ErrorKind::Timeout,
            ErrorKind::InvalidResult,
            ErrorKind::OutputLimit,
            ErrorKind::OutcomeUnknown,
            ErrorKind::Cancelled,
            ErrorKind::EgressDenied,
        ] {
            assert_eq!(transient(&CallError::new(kind, "x"), None), None, "{kind}");
        }
    }

    #[test]
    fn a_failed_attempt_runs_again_until_the_attempts_are_used() {
        let spec = RetrySpec {
            attempts: 3,
            backoff_ms: 100,
        };
        let now = 1_000_000;
        let far = now + 3_600_000;
        let d = Some(declared(true));
        assert_eq!(
            decide(&spec, 1, &tool_error(), d.as_ref(), now, far),
            Decision::Retry {
                next: 2,
                backoff: Duration::from_millis(100),
                why: Transient::Declared
            }
        );
        assert_eq!(
            decide(&spec, 2, &tool_error(), d.as_ref(), now, far),
            Decision::Retry {
                next: 3,
                backoff: Duration::from_millis(200),
                why: Transient::Declared
            }
        );
        assert_eq!(
            decide(&spec, 3, &tool_error(), d.as_ref(), now, far),
            Decision::End(EndReason::AttemptsUsed)
        );
        assert_eq!(
            decide(&RetrySpec::ONCE, 1, &tool_error(), d.as_ref(), now, far),
            Decision::End(EndReason::AttemptsUsed)
        );
        assert_eq!(
            decide(
                &spec,
                1,
                &CallError::new(ErrorKind::Timeout, "x"),
                None,
                now,
                far
            ),
            Decision::End(EndReason::NotTransient)
        );
    }

    #[test]
    fn no_retry_is_planned_past_the_deadline() {
        let spec = RetrySpec {
            attempts: 3,
            backoff_ms: 1_000,
        };
        let error = CallError::new(ErrorKind::Unavailable, "x");
        // Fake time: the deadline is 1.5 s away, then 0.5 s away.
        let now = 50_000;
        assert!(matches!(
            decide(&spec, 1, &error, None, now, now + 1_500),
            Decision::Retry { next: 2, .. }
        ));
        assert_eq!(
            decide(&spec, 1, &error, None, now + 1_000, now + 1_500),
            Decision::End(EndReason::Deadline)
        );
        // No deadline: only the attempts bound it.
        assert!(matches!(
            decide(&spec, 2, &error, None, now, 0),
            Decision::Retry { next: 3, .. }
        ));
    }
}
