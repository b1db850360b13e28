//! Canary rollouts: which release a new call runs, and when a canary steps on, is promoted
//! or is rolled back. Plain functions over a [`Plan`] (what a binding declares), a
//! [`Progress`] (where the rollout is, kept by the store) and [`Tally`]s (what each release
//! did since the step began); the control plane's rollout task does the IO.
//!
//! A call is split by the SHA-256 of its idempotency key (its id when it has none), so a
//! call tried again with the same key lands on the same side at the same weight.

use crate::call::ErrorKind;
use sha2::{Digest, Sha256};
use std::fmt;

/// A share of new calls, in percent (0 to 100).
pub type Weight = u8;

/// The steps when a binding names none: a tenth, a half, all.
pub const DEFAULT_STEPS: &[Weight] = &[10, 50, 100];
/// How long a step lasts when the binding does not say.
pub const DEFAULT_INTERVAL_MS: i64 = 5 * 60 * 1000;
/// The canary's error rate may exceed the stable release's by this many percentage points.
pub const DEFAULT_MAX_ERROR_RATE_INCREASE: f64 = 10.0;
/// Fewer canary calls than this in a step: the step is not judged yet (it goes on).
pub const DEFAULT_MIN_CALLS: u64 = 20;

/// What a binding's `rollout` declares, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The weights the canary steps through, ascending, each 1 to 100.
    pub steps: Vec<Weight>,
    pub interval_ms: i64,
    /// Percentage points.
    pub max_error_rate_increase: f64,
    pub min_calls: u64,
}

/// Why a declared rollout cannot be followed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("steps: {0} steps; at most {MAX_STEPS}")]
    TooManySteps(usize),
    #[error("steps: {0} is not a weight from 1 to 100")]
    WeightOutOfRange(u32),
    #[error("steps: {0} does not follow a larger or equal weight; steps ascend")]
    NotAscending(u32),
    #[error("interval: must be at least one second")]
    IntervalTooShort,
    #[error("maxErrorRateIncrease: {0} is not from 0 to 100 percentage points")]
    ThresholdOutOfRange(String),
}

/// Steps a plan may declare: a rollout is judged step by step, and a binding's status and
/// every judgement carry the whole list, so a manifest cannot make it grow without end.
pub const MAX_STEPS: usize = 100;

impl Plan {
    /// Checks declared steps (empty: [`DEFAULT_STEPS`]) and the rest.
    pub fn new(
        steps: &[u32],
        interval_ms: Option<i64>,
        max_error_rate_increase: Option<f64>,
        min_calls: Option<u64>,
    ) -> Result<Plan, PlanError> {
        if steps.len() > MAX_STEPS {
            return Err(PlanError::TooManySteps(steps.len()));
        }
        let mut checked = Vec::with_capacity(steps.len());
        for &step in steps {
            if !(1..=100).contains(&step) {
                return Err(PlanError::WeightOutOfRange(step));
            }
            if checked
                .last()
                .is_some_and(|&last: &Weight| u32::from(last) > step)
            {
                return Err(PlanError::NotAscending(step));
            }
            checked.push(step as Weight);
        }
        if checked.is_empty() {
            checked = DEFAULT_STEPS.to_vec();
        }
        let interval_ms = interval_ms.unwrap_or(DEFAULT_INTERVAL_MS);
        if interval_ms < 1000 {
            return Err(PlanError::IntervalTooShort);
        }
        let max = max_error_rate_increase.unwrap_or(DEFAULT_MAX_ERROR_RATE_INCREASE);
        if !(0.0..=100.0).contains(&max) {
            return Err(PlanError::ThresholdOutOfRange(max.to_string()));
        }
        Ok(Plan {
            steps: checked,
            interval_ms,
            max_error_rate_increase: max,
            min_calls: min_calls.unwrap_or(DEFAULT_MIN_CALLS),
        })
    }
}

/// Where a rollout is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// At `step`, judged at the end of each interval.
    Progressing,
    /// Every new call runs the canary.
    Promoted,
    /// Rolled back: every new call runs the stable release.
    Aborted,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Progressing => "Progressing",
            Phase::Promoted => "Promoted",
            Phase::Aborted => "Aborted",
        }
    }

    pub fn parse(text: &str) -> Option<Phase> {
        match text {
            "Progressing" => Some(Phase::Progressing),
            "Promoted" => Some(Phase::Promoted),
            "Aborted" => Some(Phase::Aborted),
            _ => None,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a binding's rollout of one canary is, as the store keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub phase: Phase,
    /// Index into the plan's steps (clamped to them when the plan shrinks).
    pub step: usize,
    /// When the current step began (Unix ms): its calls are those that ended since.
    pub step_started_ms: i64,
    /// Why the phase is what it is, with the figures (for the status and `Degraded`).
    pub message: String,
    /// What each side did in the last judged step.
    pub stable: Tally,
    pub canary: Tally,
}

impl Progress {
    /// A rollout starting now at its first step.
    pub fn start(now_ms: i64) -> Progress {
        Progress {
            phase: Phase::Progressing,
            step: 0,
            step_started_ms: now_ms,
            message: "started".into(),
            stable: Tally::default(),
            canary: Tally::default(),
        }
    }

    /// The step it is at, counted from 1 (the last when the plan has fewer).
    pub fn step_number(&self, plan: &Plan) -> u32 {
        let last = plan.steps.len().saturating_sub(1);
        u32::try_from(self.step.min(last) + 1).unwrap_or(u32::MAX)
    }

    /// The canary's share of new calls now.
    pub fn weight(&self, plan: &Plan) -> Weight {
        match self.phase {
            Phase::Progressing => plan
                .steps
                .get(self.step)
                .or(plan.steps.last())
                .copied()
                .unwrap_or(0),
            Phase::Promoted => 100,
            Phase::Aborted => 0,
        }
    }
}

/// A binding's rollout of one canary, as the store keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The binding's namespace and name.
    pub binding: crate::ids::ObjectKey,
    /// The canary release's name: a binding given another canary starts over.
    pub canary: String,
    pub progress: Progress,
}

/// Calls of one release that ended in a window, and how many of them the release is to
/// blame for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub calls: u64,
    pub errors: u64,
}

impl Tally {
    /// Counts one ended call: `error` is its kind when it failed.
    pub fn add(&mut self, error: Option<ErrorKind>) {
        match error {
            None => self.calls += 1,
            Some(kind) if blames_release(kind) => {
                self.calls += 1;
                self.errors += 1;
            }
            // Refused by policy, cancelled, timed out waiting: says nothing of the release.
            Some(kind) if says_nothing(kind) => {}
            Some(_) => self.calls += 1,
        }
    }

    /// Errors per hundred calls (0 for no calls).
    pub fn error_rate(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.errors as f64 * 100.0 / self.calls as f64
        }
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} errors in {} calls ({:.1}%)",
            self.errors,
            self.calls,
            self.error_rate()
        )
    }
}

/// A failure that is the release's doing: its code failed, broke its result, trapped or ran
/// past a limit.
pub fn blames_release(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ToolError
            | ErrorKind::InvalidResult
            | ErrorKind::Trap
            | ErrorKind::Timeout
            | ErrorKind::CpuLimit
            | ErrorKind::MemoryLimit
            | ErrorKind::OutputLimit
            | ErrorKind::RequestLimit
            | ErrorKind::ResponseLimit
            | ErrorKind::ToolCallLimit
            | ErrorKind::WorkspaceLimit
            | ErrorKind::InvalidArtifact
            | ErrorKind::ReplayDivergence
    )
}

/// An end that is no run of the release at all: refusals by policy or a person, and calls
/// given up before they ran.
fn says_nothing(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::PermissionDenied
            | ErrorKind::Denied
            | ErrorKind::EgressDenied
            | ErrorKind::UnknownSecret
            | ErrorKind::SecretUnavailable
            | ErrorKind::RateLimited
            | ErrorKind::QueueFull
            | ErrorKind::Cancelled
            | ErrorKind::InvalidArgument
    )
}

/// Which release a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Stable,
    Canary,
}

/// The side of a call known by `key` (its idempotency key, else its id) at `weight`: the
/// canary when the key's bucket (0 to 99, from its SHA-256) is below the weight.
pub fn side(key: &str, weight: Weight) -> Side {
    if bucket(key) < u32::from(weight.min(100)) {
        Side::Canary
    } else {
        Side::Stable
    }
}

fn bucket(key: &str) -> u32 {
    let digest = Sha256::digest(key.as_bytes());
    let head = u64::from_be_bytes([
        digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7],
    ]);
    (head % 100) as u32
}

/// What an operator asks of a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The next step now (`full`: every call to the canary now).
    Promote { full: bool },
    /// Roll back: every new call to the stable release.
    Abort,
}

/// Why an operator's order was not followed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    #[error("the rollout is already {0}")]
    Ended(Phase),
}

/// The rollout after an operator's `order` at `now_ms`.
pub fn apply(
    plan: &Plan,
    progress: &Progress,
    order: Order,
    now_ms: i64,
) -> Result<Progress, OrderError> {
    if progress.phase != Phase::Progressing {
        return Err(OrderError::Ended(progress.phase));
    }
    let mut next = progress.clone();
    next.step_started_ms = now_ms;
    match order {
        Order::Abort => {
            next.phase = Phase::Aborted;
            next.message = "aborted by an operator".into();
        }
        Order::Promote { full } if full || progress.step + 1 >= plan.steps.len() => {
            next.phase = Phase::Promoted;
            next.step = plan.steps.len().saturating_sub(1);
            next.message = "promoted by an operator".into();
        }
        Order::Promote { .. } => {
            next.step = progress.step + 1;
            next.message = format!(
                "stepped to {}% by an operator",
                plan.steps[next.step.min(plan.steps.len() - 1)]
            );
        }
    }
    Ok(next)
}

/// The rollout at `now_ms`, judged on what each side did since its step began: `None` while
/// the step goes on (its interval has not passed, or the canary has had too few calls to
/// judge). The canary is rolled back when its error rate exceeds the stable release's by
/// more than the plan allows, else it steps on; past its last step at 100% it is promoted,
/// and a last step below 100% holds until an operator promotes it.
pub fn judge(
    plan: &Plan,
    progress: &Progress,
    stable: Tally,
    canary: Tally,
    now_ms: i64,
) -> Option<Progress> {
    if progress.phase != Phase::Progressing {
        return None;
    }
    let over = canary.error_rate() - stable.error_rate();
    // Enough failures to be sure before the interval ends: no need to wait for it.
    let early = canary.calls >= plan.min_calls && over > plan.max_error_rate_increase;
    if !early
        && (now_ms - progress.step_started_ms < plan.interval_ms || canary.calls < plan.min_calls)
    {
        return None;
    }
    let mut next = progress.clone();
    next.stable = stable;
    next.canary = canary;
    next.step_started_ms = now_ms;
    let weight = progress.weight(plan);
    if over > plan.max_error_rate_increase {
        next.phase = Phase::Aborted;
        next.message = format!(
            "rolled back at {weight}%: the canary had {canary}, the stable release {stable}; \
             more than {:.1} points over",
            plan.max_error_rate_increase
        );
        return Some(next);
    }
    let last = plan.steps.len().saturating_sub(1);
    if progress.step >= last {
        if weight < 100 {
            return None;
        }
        next.phase = Phase::Promoted;
        next.message = format!("promoted: the canary had {canary}, the stable release {stable}");
    } else {
        next.step = progress.step + 1;
        next.message = format!(
            "stepped from {weight}% to {}%: the canary had {canary}, the stable release {stable}",
            plan.steps[next.step]
        );
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan::new(&[10, 50, 100], Some(60_000), Some(10.0), Some(20)).unwrap()
    }

    fn tally(calls: u64, errors: u64) -> Tally {
        Tally { calls, errors }
    }

    #[test]
    fn a_plan_is_checked() {
        assert_eq!(
            Plan::new(&[], None, None, None).unwrap().steps,
            DEFAULT_STEPS
        );
        assert_eq!(
            Plan::new(&[0], None, None, None),
            Err(PlanError::WeightOutOfRange(0))
        );
        assert_eq!(
            Plan::new(&[101], None, None, None),
            Err(PlanError::WeightOutOfRange(101))
        );
        assert_eq!(
            Plan::new(&[50, 10], None, None, None),
            Err(PlanError::NotAscending(10))
        );
        // Equal weights may repeat, but not without end.
        assert_eq!(
            Plan::new(&[50; MAX_STEPS], None, None, None)
                .unwrap()
                .steps
                .len(),
            MAX_STEPS
        );
        assert_eq!(
            Plan::new(&[50; MAX_STEPS + 1], None, None, None),
            Err(PlanError::TooManySteps(MAX_STEPS + 1))
        );
        assert_eq!(
            Plan::new(&[10], Some(10), None, None),
            Err(PlanError::IntervalTooShort)
        );
        assert!(matches!(
            Plan::new(&[10], None, Some(150.0), None),
            Err(PlanError::ThresholdOutOfRange(_))
        ));
    }

    #[test]
    fn the_split_follows_the_weight_and_keeps_a_key_on_its_side() {
        let keys: Vec<String> = (0..10_000).map(|i| format!("key-{i}")).collect();
        for weight in [0u8, 10, 50, 100] {
            let canary = keys
                .iter()
                .filter(|k| side(k, weight) == Side::Canary)
                .count();
            let share = canary as f64 / keys.len() as f64 * 100.0;
            assert!(
                (share - f64::from(weight)).abs() < 2.0,
                "weight {weight}: {share:.2}% went to the canary"
            );
        }
        // A key on the canary at 10% stays there at every larger weight.
        for key in keys.iter().filter(|k| side(k, 10) == Side::Canary) {
            assert_eq!(side(key, 10), Side::Canary, "the same key, the same side");
            assert_eq!(side(key, 50), Side::Canary);
        }
    }

    #[test]
    fn a_step_waits_for_its_interval_and_enough_calls() {
        let plan = plan();
        let start = Progress::start(0);
        assert_eq!(start.weight(&plan), 10);
        assert_eq!(
            judge(&plan, &start, tally(100, 0), tally(19, 0), 120_000),
            None
        );
        assert_eq!(
            judge(&plan, &start, tally(100, 0), tally(30, 0), 59_999),
            None
        );
        let next = judge(&plan, &start, tally(100, 1), tally(30, 0), 60_000).unwrap();
        assert_eq!(
            (next.phase, next.step, next.weight(&plan)),
            (Phase::Progressing, 1, 50)
        );
        assert_eq!((start.step_number(&plan), next.step_number(&plan)), (1, 2));
        assert_eq!(next.step_started_ms, 60_000);
        assert_eq!(next.canary, tally(30, 0));
    }

    #[test]
    fn a_healthy_canary_steps_to_promotion() {
        let plan = plan();
        let mut progress = Progress::start(0);
        let mut now = 0;
        for expected in [50, 100] {
            now += 60_000;
            progress = judge(&plan, &progress, tally(100, 5), tally(100, 8), now).unwrap();
            assert_eq!(progress.weight(&plan), expected);
            assert_eq!(progress.phase, Phase::Progressing);
        }
        now += 60_000;
        progress = judge(&plan, &progress, tally(100, 5), tally(100, 8), now).unwrap();
        assert_eq!(progress.phase, Phase::Promoted);
        assert_eq!(progress.weight(&plan), 100);
        assert_eq!(
            judge(&plan, &progress, tally(1, 1), tally(100, 100), now * 2),
            None
        );
    }

    #[test]
    fn a_failing_canary_is_rolled_back_without_waiting_for_the_interval() {
        let plan = plan();
        let start = Progress::start(0);
        let aborted = judge(&plan, &start, tally(200, 2), tally(40, 12), 5_000).unwrap();
        assert_eq!(aborted.phase, Phase::Aborted);
        assert_eq!(aborted.weight(&plan), 0);
        assert!(
            aborted.message.contains("12 errors in 40 calls (30.0%)"),
            "{}",
            aborted.message
        );
        assert!(
            aborted.message.contains("2 errors in 200 calls (1.0%)"),
            "{}",
            aborted.message
        );
    }

    #[test]
    fn a_last_step_below_all_holds_for_an_operator() {
        let plan = Plan::new(&[25], Some(1_000), None, Some(1)).unwrap();
        let start = Progress::start(0);
        assert_eq!(
            judge(&plan, &start, tally(10, 0), tally(10, 0), 10_000),
            None
        );
        let promoted = apply(&plan, &start, Order::Promote { full: false }, 10).unwrap();
        assert_eq!(
            (promoted.phase, promoted.weight(&plan)),
            (Phase::Promoted, 100)
        );
    }

    #[test]
    fn operators_step_promote_and_abort() {
        let plan = plan();
        let start = Progress::start(0);
        let stepped = apply(&plan, &start, Order::Promote { full: false }, 5).unwrap();
        assert_eq!(
            (stepped.phase, stepped.weight(&plan)),
            (Phase::Progressing, 50)
        );
        let full = apply(&plan, &start, Order::Promote { full: true }, 5).unwrap();
        assert_eq!((full.phase, full.weight(&plan)), (Phase::Promoted, 100));
        let aborted = apply(&plan, &stepped, Order::Abort, 6).unwrap();
        assert_eq!((aborted.phase, aborted.weight(&plan)), (Phase::Aborted, 0));
        assert_eq!(
            apply(&plan, &aborted, Order::Promote { full: true }, 7),
            Err(OrderError::Ended(Phase::Aborted))
        );
    }

    #[test]
    fn only_the_releases_own_failures_count_against_it() {
        let mut t = Tally::default();
        t.add(None);
        t.add(Some(ErrorKind::ToolError));
        t.add(Some(ErrorKind::Trap));
        t.add(Some(ErrorKind::PermissionDenied));
        t.add(Some(ErrorKind::Denied));
        t.add(Some(ErrorKind::Unavailable));
        assert_eq!(t, tally(4, 2));
    }
}
