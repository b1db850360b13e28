//! A call's idle deadline: how long it may run, restarted by each progress event it reports.
//!
//! A Tool's `timeout` is an *idle* timeout: a call that reports no progress for `timeout` is
//! cut off; each progress event the tool reports restarts it. `maxTimeout` (default: the
//! timeout) bounds the whole run: no progress extends a call past `started + maxTimeout`.
//!
//! Invariants (tested below with fake time):
//! - the deadline starts at `started + min(timeout, max)`;
//! - a progress event at `now` moves it to `min(now + timeout, started + max)`, never
//!   earlier than it was (a late-arriving, older event changes nothing);
//! - it never passes the hard cap `started + max`.
//!
//! The same arithmetic serves the worker (its timer, in milliseconds since the run began)
//! and the scheduler (its view of the deadline, in Unix milliseconds); neither reads a clock
//! here.

use super::RunLimits;

/// The deadline arithmetic of one call, in milliseconds on any one clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleDeadline {
    /// The idle timeout: how long a call may go without progress.
    pub timeout_ms: u64,
    /// The cap on the whole run, from `started_ms` (at least `timeout_ms`).
    pub max_ms: u64,
    /// When the call's time started (admission, or the approval that let it run).
    pub started_ms: i64,
}

impl IdleDeadline {
    /// The deadline arithmetic of a call admitted with `limits` whose first deadline is
    /// `deadline_ms` (so its time started at `deadline_ms - timeout`). `None` for a call
    /// without a deadline (0).
    pub fn of(limits: &RunLimits, deadline_ms: i64) -> Option<Self> {
        if deadline_ms <= 0 {
            return None;
        }
        let timeout_ms = limits.timeout_ms;
        Some(IdleDeadline {
            timeout_ms,
            max_ms: limits.max_timeout_ms.max(timeout_ms),
            started_ms: deadline_ms.saturating_sub(ms(timeout_ms)),
        })
    }

    /// The hard cap: no progress extends the call past it.
    pub fn hard_ms(&self) -> i64 {
        self.started_ms
            .saturating_add(ms(self.max_ms.max(self.timeout_ms)))
    }

    /// The deadline before any progress.
    pub fn initial_ms(&self) -> i64 {
        self.started_ms
            .saturating_add(ms(self.timeout_ms))
            .min(self.hard_ms())
    }

    /// The deadline right after a progress event at `now_ms`.
    pub fn after_progress(&self, now_ms: i64) -> i64 {
        now_ms
            .saturating_add(ms(self.timeout_ms))
            .min(self.hard_ms())
            .max(self.initial_ms())
    }

    /// `current` moved by a progress event at `now_ms`: never earlier than it was, never
    /// past the hard cap.
    pub fn extend(&self, current_ms: i64, now_ms: i64) -> i64 {
        current_ms
            .max(self.after_progress(now_ms))
            .min(self.hard_ms())
    }

    /// The deadline after progress events at `times` (any order): what a restarted control
    /// plane derives from the progress entries recorded in a call's oplog.
    pub fn after_all(&self, times: impl IntoIterator<Item = i64>) -> i64 {
        times
            .into_iter()
            .fold(self.initial_ms(), |current, at| self.extend(current, at))
    }
}

fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline(timeout_ms: u64, max_ms: u64) -> IdleDeadline {
        IdleDeadline {
            timeout_ms,
            max_ms,
            started_ms: 1_000,
        }
    }

    #[test]
    fn progress_restarts_the_idle_timeout() {
        let d = deadline(100, 1_000);
        assert_eq!(d.initial_ms(), 1_100);
        // Progress at t=1050: 100 ms from then.
        assert_eq!(d.after_progress(1_050), 1_150);
        let mut current = d.initial_ms();
        for at in [1_050, 1_140, 1_230] {
            current = d.extend(current, at);
        }
        assert_eq!(current, 1_330);
    }

    #[test]
    fn progress_never_extends_past_max_timeout() {
        let d = deadline(100, 250);
        assert_eq!(d.hard_ms(), 1_250);
        assert_eq!(d.after_progress(1_200), 1_250);
        assert_eq!(d.extend(1_250, 5_000), 1_250);
        // A call whose max is its timeout (the default) is never extended.
        let fixed = deadline(100, 100);
        assert_eq!(fixed.extend(fixed.initial_ms(), 1_090), 1_100);
    }

    #[test]
    fn an_older_event_never_moves_the_deadline_back() {
        let d = deadline(100, 1_000);
        let late = d.extend(d.initial_ms(), 1_500);
        assert_eq!(late, 1_600);
        assert_eq!(d.extend(late, 1_010), 1_600);
        // Before the call started (clock skew between hosts): the initial deadline stands.
        assert_eq!(d.after_progress(0), 1_100);
    }

    #[test]
    fn a_max_below_the_timeout_is_the_timeout() {
        let d = deadline(100, 10);
        assert_eq!(d.hard_ms(), 1_100);
        assert_eq!(d.initial_ms(), 1_100);
        assert_eq!(d.after_progress(1_090), 1_100);
    }

    #[test]
    fn recorded_progress_gives_the_same_deadline_in_any_order() {
        let d = deadline(100, 1_000);
        let times = [1_050, 1_400, 1_200];
        assert_eq!(d.after_all(times), 1_500);
        assert_eq!(d.after_all([1_400, 1_050, 1_200]), 1_500);
        assert_eq!(d.after_all([]), d.initial_ms());
        assert_eq!(d.after_all([9_000]), d.hard_ms());
    }

    #[test]
    fn limits_give_the_arithmetic_back_from_the_first_deadline() {
        let limits = RunLimits {
            timeout_ms: 200,
            max_timeout_ms: 0,
            ..RunLimits::default()
        };
        let d = IdleDeadline::of(&limits, 10_200).unwrap();
        assert_eq!(d.started_ms, 10_000);
        assert_eq!(d.hard_ms(), 10_200, "max defaults to the timeout");
        let limits = RunLimits {
            max_timeout_ms: 1_000,
            ..limits
        };
        let d = IdleDeadline::of(&limits, 10_200).unwrap();
        assert_eq!(d.hard_ms(), 11_000);
        assert!(IdleDeadline::of(&limits, 0).is_none());
        // Huge values saturate instead of overflowing.
        let huge = IdleDeadline {
            timeout_ms: u64::MAX,
            max_ms: u64::MAX,
            started_ms: i64::MAX - 5,
        };
        assert_eq!(huge.after_progress(i64::MAX - 1), i64::MAX);
    }
}
