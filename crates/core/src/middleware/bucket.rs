//! Rate limits: token buckets keyed by agent, tool or both. The arithmetic is here (pure,
//! with fake time); the buckets themselves live in the store, so they hold across
//! control-plane restarts and replicas (`Store::take_token` runs [`take`] inside one write
//! transaction).

use super::CallView;
use crate::spec::{RateKey, RateLimitStep};

/// A rate-limit step, resolved.
#[derive(Debug, Clone)]
pub struct RateLimit {
    pub key: RateKey,
    /// Bucket capacity.
    pub burst: u32,
    /// Tokens added per second.
    pub per_second: f64,
}

impl RateLimit {
    pub fn new(spec: &RateLimitStep) -> Self {
        let per = spec.per.get().as_secs_f64().max(0.001);
        RateLimit {
            key: spec.key,
            burst: spec.burst.unwrap_or(spec.requests).max(1),
            per_second: spec.requests as f64 / per,
        }
    }

    /// The store key of the bucket `call` draws from, for Middleware `middleware`.
    pub fn bucket_key(&self, middleware: &crate::ids::ObjectKey, call: &CallView) -> String {
        let scope = match self.key {
            RateKey::Agent => format!("agent={}", call.agent),
            RateKey::Tool => format!("tool={}", call.tool),
            RateKey::AgentTool => format!("agent={};tool={}", call.agent, call.tool),
        };
        format!("{middleware}|{scope}")
    }
}

/// The longest retry-after a refusal names: a bucket that never refills (`requests: 0`)
/// says "a day", not "never".
pub const MAX_RETRY_AFTER_MS: u64 = 24 * 60 * 60 * 1000;

/// A bucket after one attempt to take a token from it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Taken {
    /// Tokens left (fractional: refill is continuous).
    pub tokens: f64,
    /// The time the tokens were counted at.
    pub updated_at_ms: i64,
    /// `None`: a token was taken. `Some(ms)`: the bucket had no whole token; one is back in
    /// `ms` milliseconds (at least 1, at most [`MAX_RETRY_AFTER_MS`]).
    pub retry_after_ms: Option<u64>,
}

/// Takes one token from a bucket that held `tokens` at `updated_at_ms`, with capacity
/// `burst` (at least 1), refilled continuously at `per_second`.
///
/// The refill since `updated_at_ms` is added first, capped at `burst` (so does a stored
/// count above a lowered `burst`). A clock that went backwards (`now_ms` before
/// `updated_at_ms`, e.g. another replica's clock ahead of this one's) refills nothing and
/// keeps `updated_at_ms`, so no interval is ever counted twice. A refused take changes
/// only the refill bookkeeping, never the count of tokens taken.
pub fn take(tokens: f64, updated_at_ms: i64, burst: u32, per_second: f64, now_ms: i64) -> Taken {
    let burst = f64::from(burst.max(1));
    let rate = if per_second.is_finite() && per_second > 0.0 {
        per_second
    } else {
        0.0
    };
    let held = if tokens.is_finite() {
        tokens.max(0.0)
    } else {
        0.0
    };
    let elapsed_ms = now_ms.saturating_sub(updated_at_ms).max(0) as f64;
    let available = (held + elapsed_ms * rate / 1000.0).min(burst);
    let updated_at_ms = updated_at_ms.max(now_ms);
    if available >= 1.0 {
        return Taken {
            tokens: available - 1.0,
            updated_at_ms,
            retry_after_ms: None,
        };
    }
    let retry = if rate == 0.0 {
        MAX_RETRY_AFTER_MS
    } else {
        // Rounded up to whole milliseconds, forgiving float noise of up to a microsecond;
        // `as` saturates, and a tiny rate's huge wait is capped.
        let wait_ms = (1.0 - available) * 1000.0 / rate;
        ((wait_ms - 1e-3).ceil() as u64).clamp(1, MAX_RETRY_AFTER_MS)
    };
    Taken {
        tokens: available,
        updated_at_ms,
        retry_after_ms: Some(retry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::units::GoDuration;

    /// Takes `n` times at `now`, returning the bucket and how many were taken.
    fn drain(
        mut tokens: f64,
        mut at: i64,
        burst: u32,
        rate: f64,
        now: i64,
        n: u32,
    ) -> (Taken, u32) {
        let mut taken = 0;
        let mut last = None;
        for _ in 0..n {
            let t = take(tokens, at, burst, rate, now);
            if t.retry_after_ms.is_none() {
                taken += 1;
            }
            tokens = t.tokens;
            at = t.updated_at_ms;
            last = Some(t);
        }
        (last.expect("n > 0"), taken)
    }

    #[test]
    fn a_full_bucket_gives_burst_tokens_then_refuses() {
        let (last, taken) = drain(5.0, 1_000, 5, 1.0, 1_000, 8);
        assert_eq!(taken, 5);
        assert_eq!(last.retry_after_ms, Some(1_000));
        assert_eq!(last.tokens, 0.0);
    }

    #[test]
    fn refill_is_continuous_and_capped_at_burst() {
        // Empty at t=0, 2 tokens a second: half a token after 250 ms is not enough.
        let t = take(0.0, 0, 3, 2.0, 250);
        assert_eq!(t.retry_after_ms, Some(250));
        assert_eq!(t.tokens, 0.5);
        assert_eq!(t.updated_at_ms, 250);
        // A refused take does not lose the half token: at 500 ms there is one.
        let t = take(t.tokens, t.updated_at_ms, 3, 2.0, 500);
        assert_eq!(t.retry_after_ms, None);
        assert_eq!(t.tokens, 0.0);
        // An hour later the bucket holds `burst`, not 7200.
        let (_, taken) = drain(0.0, 500, 3, 2.0, 3_600_500, 10);
        assert_eq!(taken, 3);
    }

    #[test]
    fn retry_after_is_the_time_until_one_whole_token() {
        // 10 requests per minute: one token every 6 s.
        let t = take(0.0, 0, 10, 10.0 / 60.0, 0);
        assert_eq!(t.retry_after_ms, Some(6_000));
        let t = take(0.0, 0, 10, 10.0 / 60.0, 5_000);
        assert_eq!(t.retry_after_ms, Some(1_000));
        // Never less than a millisecond.
        let t = take(0.999_999_9, 0, 10, 1_000_000.0, 0);
        assert_eq!(t.retry_after_ms, Some(1));
    }

    #[test]
    fn a_clock_going_backwards_refills_nothing_and_counts_nothing_twice() {
        let t = take(0.0, 10_000, 5, 1.0, 4_000);
        assert_eq!(t.retry_after_ms, Some(1_000));
        assert_eq!(t.updated_at_ms, 10_000, "the later time is kept");
        assert_eq!(t.tokens, 0.0);
        // Once the clock passes the stored time again, only the time after it refills.
        let t = take(t.tokens, t.updated_at_ms, 5, 1.0, 11_000);
        assert_eq!(t.retry_after_ms, None);
        assert_eq!(t.tokens, 0.0);
    }

    #[test]
    fn odd_stored_values_and_rates_are_safe() {
        // A lowered burst caps what is stored.
        let t = take(50.0, 0, 2, 1.0, 0);
        assert_eq!((t.tokens, t.retry_after_ms), (1.0, None));
        // Corrupt counts are empty buckets.
        for bad in [f64::NAN, f64::NEG_INFINITY, -3.0] {
            assert_eq!(take(bad, 0, 2, 1.0, 0).retry_after_ms, Some(1_000));
        }
        // A bucket that never refills says "a day".
        assert_eq!(
            take(0.0, 0, 1, 0.0, 0).retry_after_ms,
            Some(MAX_RETRY_AFTER_MS)
        );
        assert_eq!(
            take(0.0, 0, 1, 1e-12, 0).retry_after_ms,
            Some(MAX_RETRY_AFTER_MS)
        );
        // burst 0 is treated as 1.
        assert_eq!(take(5.0, 0, 0, 1.0, 0).tokens, 0.0);
        // Extreme times do not overflow.
        assert_eq!(take(0.0, i64::MIN, 3, 1.0, i64::MAX).tokens, 2.0);
    }

    #[test]
    fn a_step_resolves_burst_and_rate() {
        let step = RateLimitStep {
            requests: 30,
            per: "1m".parse::<GoDuration>().expect("duration"),
            key: RateKey::Tool,
            burst: None,
        };
        let limit = RateLimit::new(&step);
        assert_eq!(limit.burst, 30);
        assert!((limit.per_second - 0.5).abs() < 1e-9);
        let limit = RateLimit::new(&RateLimitStep {
            burst: Some(5),
            ..step
        });
        assert_eq!(limit.burst, 5);
    }
}
