//! Legacy-era (2025-06-18, 2025-11-25) sessions: who owns each `Mcp-Session-Id`, its
//! negotiated version, the `tools/call` requests in flight in it (so
//! `notifications/cancelled` can name one by request id), and its standalone GET stream.
//!
//! Invariants: a session id is 128 random bits; a session is served only to the caller that
//! opened it (another caller's id is "not found", exactly like an unknown one); a caller
//! holds at most [`MAX_SESSIONS_PER_CALLER`] sessions (opening one more ends its oldest) and
//! the server at most [`MAX_SESSIONS`]; a session unused for [`SESSION_IDLE`] expires; a
//! session has at most one GET stream (a new one replaces the old).

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use toolgrid_core::auth::Principal;

pub const MAX_SESSIONS_PER_CALLER: usize = 16;
pub const MAX_SESSIONS: usize = 4096;
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);

/// A `tools/call` in flight in a session.
#[derive(Clone, Debug, Default)]
struct InFlight {
    call_id: Option<String>,
    cancelled: bool,
}

struct Session {
    owner: Principal,
    version: &'static str,
    created: Instant,
    last_seen: Instant,
    in_flight: HashMap<String, InFlight>,
    listener: Option<mpsc::Sender<Value>>,
    /// What the owner could call when last told (see [`Sessions::changed`]).
    tools_fingerprint: u64,
}

/// Why a session is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Session not found")]
pub struct NotFound;

#[derive(Default)]
pub struct Sessions {
    inner: Mutex<HashMap<String, Session>>,
}

/// A request id as a map key (`1` and `"1"` differ).
pub fn request_key(id: &Value) -> String {
    id.to_string()
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session for `owner` at `version`; returns its id.
    pub fn open(&self, owner: &Principal, version: &'static str, tools_fingerprint: u64) -> String {
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.retain(|_, s| now.duration_since(s.last_seen) < SESSION_IDLE);
        let mut own: Vec<(Instant, String)> = sessions
            .iter()
            .filter(|(_, s)| &s.owner == owner)
            .map(|(id, s)| (s.created, id.clone()))
            .collect();
        own.sort();
        while own.len() >= MAX_SESSIONS_PER_CALLER {
            let (_, oldest) = own.remove(0);
            sessions.remove(&oldest);
        }
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        let id = hex::encode(rand::random::<[u8; 16]>());
        sessions.insert(
            id.clone(),
            Session {
                owner: owner.clone(),
                version,
                created: now,
                last_seen: now,
                in_flight: HashMap::new(),
                listener: None,
                tools_fingerprint,
            },
        );
        id
    }

    /// The session's negotiated version, when `caller` owns it and it has not expired.
    pub fn touch(&self, id: &str, caller: &Principal) -> Result<&'static str, NotFound> {
        let now = Instant::now();
        let mut sessions = self.lock();
        match sessions.get_mut(id) {
            Some(s) if now.duration_since(s.last_seen) >= SESSION_IDLE => {
                sessions.remove(id);
                Err(NotFound)
            }
            Some(s) if &s.owner == caller => {
                s.last_seen = now;
                Ok(s.version)
            }
            _ => Err(NotFound),
        }
    }

    /// Ends a session `caller` owns.
    pub fn close(&self, id: &str, caller: &Principal) -> Result<(), NotFound> {
        let mut sessions = self.lock();
        match sessions.get(id) {
            Some(s) if &s.owner == caller => {
                sessions.remove(id);
                Ok(())
            }
            _ => Err(NotFound),
        }
    }

    /// Records that request `request` of the session runs call `call_id`; returns whether
    /// the request was cancelled before the call was known.
    pub fn started(&self, id: &str, request: &str, call_id: &str) -> bool {
        let mut sessions = self.lock();
        let Some(s) = sessions.get_mut(id) else {
            return false;
        };
        let entry = s.in_flight.entry(request.to_string()).or_default();
        entry.call_id = Some(call_id.to_string());
        entry.cancelled
    }

    /// Forgets a finished request.
    pub fn finished(&self, id: &str, request: &str) {
        if let Some(s) = self.lock().get_mut(id) {
            s.in_flight.remove(request);
        }
    }

    /// Marks a request cancelled; returns its call when it is known. (A request not yet
    /// started is remembered, bounded by the session's in-flight limit.)
    pub fn cancel(&self, id: &str, request: &str) -> Option<String> {
        let mut sessions = self.lock();
        let s = sessions.get_mut(id)?;
        if !s.in_flight.contains_key(request) && s.in_flight.len() >= MAX_IN_FLIGHT {
            return None;
        }
        let entry = s.in_flight.entry(request.to_string()).or_default();
        entry.cancelled = true;
        entry.call_id.clone()
    }

    /// Whether a request was cancelled.
    pub fn is_cancelled(&self, id: &str, request: &str) -> bool {
        self.lock()
            .get(id)
            .and_then(|s| s.in_flight.get(request))
            .is_some_and(|f| f.cancelled)
    }

    /// Installs the session's GET stream (ending the previous one).
    pub fn listen(&self, id: &str, tx: mpsc::Sender<Value>) {
        if let Some(s) = self.lock().get_mut(id) {
            s.listener = Some(tx);
        }
    }

    /// The sessions with a live GET stream whose owner's tools changed, per
    /// `fingerprint(owner)`: their streams, with the new fingerprint recorded.
    pub fn changed(&self, fingerprint: impl Fn(&Principal) -> u64) -> Vec<mpsc::Sender<Value>> {
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.retain(|_, s| now.duration_since(s.last_seen) < SESSION_IDLE);
        let mut out = Vec::new();
        for s in sessions.values_mut() {
            if s.listener.as_ref().is_some_and(|l| l.is_closed()) {
                s.listener = None;
            }
            let now_fp = fingerprint(&s.owner);
            if now_fp != s.tools_fingerprint {
                s.tools_fingerprint = now_fp;
                if let Some(l) = &s.listener {
                    out.push(l.clone());
                }
            }
        }
        out
    }
}

/// Requests one session tracks at once.
pub const MAX_IN_FLIGHT: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::ids::ObjectKey;

    fn agent(name: &str) -> Principal {
        Principal::Agent {
            agent: ObjectKey::new("default", name),
        }
    }

    #[test]
    fn a_session_is_its_owners_only() {
        let sessions = Sessions::default();
        let id = sessions.open(&agent("a"), "2025-06-18", 0);
        assert_eq!(sessions.touch(&id, &agent("a")), Ok("2025-06-18"));
        assert_eq!(sessions.touch(&id, &agent("b")), Err(NotFound));
        assert_eq!(sessions.close(&id, &agent("b")), Err(NotFound));
        assert_eq!(sessions.touch("nope", &agent("a")), Err(NotFound));
        assert_eq!(sessions.close(&id, &agent("a")), Ok(()));
        assert_eq!(sessions.touch(&id, &agent("a")), Err(NotFound));
    }

    #[test]
    fn a_caller_holds_a_bounded_number_of_sessions() {
        let sessions = Sessions::default();
        let first = sessions.open(&agent("a"), "2025-06-18", 0);
        for _ in 0..MAX_SESSIONS_PER_CALLER {
            sessions.open(&agent("a"), "2025-06-18", 0);
        }
        assert_eq!(sessions.touch(&first, &agent("a")), Err(NotFound));
        assert_eq!(sessions.lock().len(), MAX_SESSIONS_PER_CALLER);
    }

    #[test]
    fn a_cancel_before_the_call_is_known_is_remembered() {
        let sessions = Sessions::default();
        let id = sessions.open(&agent("a"), "2025-06-18", 0);
        assert_eq!(sessions.cancel(&id, "1"), None);
        assert!(sessions.started(&id, "1", "call-1"));
        assert!(!sessions.started(&id, "2", "call-2"));
        assert_eq!(sessions.cancel(&id, "2"), Some("call-2".into()));
        sessions.finished(&id, "2");
        assert!(!sessions.is_cancelled(&id, "2"));
    }
}
