//! Who calls: [`Principal`], an authenticated caller (how a token becomes one is the
//! control plane's `auth`).

use crate::ids::ObjectKey;

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// May call anything and read everything (the admin token of `toolgrid up`, or a subject
    /// Kubernetes RBAC allows to operate toolgrid). May act as an agent (`--as`).
    Operator { subject: String },
    /// An Agent: calls only its bound tools, reads only its own calls.
    Agent { agent: ObjectKey },
}

/// How long a console session lives: `idle` after its last use, and `lifetime` after login
/// at most, however busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    pub idle: std::time::Duration,
    pub lifetime: std::time::Duration,
}

impl Default for SessionLimits {
    /// 30 minutes idle, 12 hours in all.
    fn default() -> Self {
        SessionLimits {
            idle: std::time::Duration::from_secs(30 * 60),
            lifetime: std::time::Duration::from_secs(12 * 60 * 60),
        }
    }
}

/// A console session as the store keeps it: the SHA-256 of its id (never the id, never the
/// caller's token), who it is, and when it lapses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleSession {
    /// SHA-256 of the session id the browser's cookie holds.
    pub id_hash: [u8; 32],
    pub principal: Principal,
    pub created_at_ms: i64,
    /// The last request seen with it (recorded at most every [`ConsoleSession::touch_every_ms`]).
    pub last_seen_ms: i64,
    /// Idle this long, it lapses.
    pub idle_timeout_ms: i64,
    /// It lapses at this time however busy.
    pub expires_at_ms: i64,
}

/// What a session is at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionCheck {
    /// Valid; `touch`: record the request as its last use now.
    Valid { touch: bool },
    /// Unused for longer than its idle timeout.
    Idle,
    /// Past its absolute expiry.
    Expired,
}

fn ms(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl ConsoleSession {
    /// A session of `principal` opened at `now_ms` under `limits`.
    pub fn new(
        id_hash: [u8; 32],
        principal: Principal,
        limits: SessionLimits,
        now_ms: i64,
    ) -> Self {
        ConsoleSession {
            id_hash,
            principal,
            created_at_ms: now_ms,
            last_seen_ms: now_ms,
            idle_timeout_ms: ms(limits.idle).max(1),
            expires_at_ms: now_ms.saturating_add(ms(limits.lifetime)),
        }
    }

    /// How stale `last_seen_ms` may be before a request records itself: an eighth of the
    /// idle timeout, at most a minute (so a busy session costs few writes, and lapses at
    /// most that much early).
    pub fn touch_every_ms(&self) -> i64 {
        (self.idle_timeout_ms / 8).clamp(0, 60_000)
    }

    /// Whether the session may be used at `now_ms`.
    pub fn check(&self, now_ms: i64) -> SessionCheck {
        if now_ms >= self.expires_at_ms {
            return SessionCheck::Expired;
        }
        let idle = now_ms.saturating_sub(self.last_seen_ms);
        if idle >= self.idle_timeout_ms {
            return SessionCheck::Idle;
        }
        SessionCheck::Valid {
            touch: idle >= self.touch_every_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn session(idle_s: u64, lifetime_s: u64) -> ConsoleSession {
        let limits = SessionLimits {
            idle: Duration::from_secs(idle_s),
            lifetime: Duration::from_secs(lifetime_s),
        };
        let principal = Principal::Operator {
            subject: "admin".into(),
        };
        ConsoleSession::new([1; 32], principal, limits, 1_000_000)
    }

    #[test]
    fn a_session_lapses_when_idle() {
        let s = session(60, 3600);
        assert_eq!(s.check(1_000_000), SessionCheck::Valid { touch: false });
        assert_eq!(
            s.check(1_000_000 + 59_999),
            SessionCheck::Valid { touch: true }
        );
        assert_eq!(s.check(1_000_000 + 60_000), SessionCheck::Idle);
        // Used meanwhile: its idle time counts from the last use.
        let used = ConsoleSession {
            last_seen_ms: 1_000_000 + 50_000,
            ..s.clone()
        };
        assert_eq!(
            used.check(1_000_000 + 60_000),
            SessionCheck::Valid { touch: true }
        );
        assert_eq!(used.check(1_000_000 + 110_000), SessionCheck::Idle);
    }

    #[test]
    fn a_busy_session_lapses_at_its_absolute_expiry() {
        let s = session(60, 120);
        let busy = ConsoleSession {
            last_seen_ms: 1_000_000 + 119_000,
            ..s.clone()
        };
        assert_eq!(
            busy.check(1_000_000 + 119_999),
            SessionCheck::Valid { touch: false }
        );
        assert_eq!(busy.check(1_000_000 + 120_000), SessionCheck::Expired);
        assert_eq!(s.check(i64::MAX), SessionCheck::Expired);
    }

    #[test]
    fn requests_record_themselves_at_most_every_eighth_of_the_idle_timeout() {
        let s = session(80, 3600);
        assert_eq!(s.touch_every_ms(), 10_000);
        assert_eq!(
            s.check(1_000_000 + 9_999),
            SessionCheck::Valid { touch: false }
        );
        assert_eq!(
            s.check(1_000_000 + 10_000),
            SessionCheck::Valid { touch: true }
        );
        assert_eq!(session(3600, 7200).touch_every_ms(), 60_000);
        // A clock that went back is no idle time.
        assert_eq!(s.check(999_000), SessionCheck::Valid { touch: false });
    }
}
