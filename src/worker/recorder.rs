//! Record and replay of every nondeterministic host result a guest reads.
//!
//! A fresh call records each clock reading and random draw as an oplog entry. A call moved
//! to another worker is re-run from the start with the entries recorded so far: each host
//! call is answered from them, in order, until they run out, and then the call goes on
//! live. A host call that does not match the next recorded one is a replay divergence: the
//! call fails rather than silently mixing two histories.

use crate::store::NewEntry;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

pub const WALL_CLOCK: &str = "wall-clock";
pub const MONOTONIC_CLOCK: &str = "monotonic-clock";
pub const RANDOM: &str = "random";
/// The start of an outgoing request, committed before it leaves.
pub const HTTP_REQUEST: &str = "http-request";
/// Its response.
pub const HTTP_RESPONSE: &str = "http-response";
/// Its refusal by the egress policy.
pub const HTTP_DENIED: &str = "http-denied";
/// Its failure (DNS, connection, protocol).
pub const HTTP_ERROR: &str = "http-error";

/// Host-call entry kinds that are replayed (everything a guest can observe).
pub fn is_host_entry(kind: &str) -> bool {
    matches!(kind, WALL_CLOCK | MONOTONIC_CLOCK | RANDOM) || kind.starts_with("http-")
}

/// Why a run must stop at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortKind {
    /// It made a host call its oplog does not have.
    Diverged,
    /// Its assignment was taken away: do nothing more, report nothing.
    Fenced,
    /// A request may have been applied and repeating it is not safe.
    OutcomeUnknown,
}

/// An outgoing request of an earlier attempt, matched by its number.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedHttp {
    pub request: Value,
    /// `http-response`, `http-denied` or `http-error`, when one was recorded.
    pub outcome: Option<NewEntry>,
}

/// The oplog of one running call, as the worker sees it.
#[derive(Default)]
pub struct HostLog {
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    replay: VecDeque<NewEntry>,
    replayed: usize,
    /// Entries recorded live and not yet handed to the control plane.
    pending: Vec<NewEntry>,
    recorded: usize,
    aborted: Option<(AbortKind, String)>,
    /// Outgoing requests of earlier attempts, by number: matched by number rather than by
    /// position, because when a response arrives relative to other host calls is timing.
    http: std::collections::BTreeMap<u64, RecordedHttp>,
    /// The recorded random entry being replayed: its source, bytes, and how many are used.
    random: Option<(String, Vec<u8>, usize)>,
    /// Added to live monotonic readings after a replay, so time never runs backwards
    /// across workers.
    monotonic_offset: i128,
    last_monotonic: u64,
}

/// What replay made of one host call.
pub enum Replayed {
    /// Answer the guest with this recorded payload.
    Recorded(Value),
    /// Nothing left to replay: do it live and record it.
    Live,
    /// The next recorded entry is of another kind: the run has diverged.
    Diverged,
}

impl HostLog {
    pub fn new(replay: Vec<NewEntry>) -> Arc<Self> {
        let mut ordered = VecDeque::new();
        let mut http: std::collections::BTreeMap<u64, RecordedHttp> = Default::default();
        for entry in replay {
            if entry.kind.starts_with("http-") {
                let Some(seq) = entry.payload.get("seq").and_then(Value::as_u64) else {
                    continue;
                };
                if entry.kind == HTTP_REQUEST {
                    http.insert(
                        seq,
                        RecordedHttp {
                            request: entry.payload,
                            outcome: None,
                        },
                    );
                } else if let Some(recorded) = http.get_mut(&seq) {
                    recorded.outcome = Some(entry);
                }
            } else {
                ordered.push_back(entry);
            }
        }
        Arc::new(HostLog {
            state: Mutex::new(LogState {
                replay: ordered,
                http,
                ..LogState::default()
            }),
        })
    }

    /// The recorded request number `seq`, if an earlier attempt made it.
    pub fn take_http(&self, seq: u64) -> Option<RecordedHttp> {
        let mut state = self.lock();
        let recorded = state.http.remove(&seq);
        if recorded.is_some() {
            state.replayed += 1;
        }
        recorded
    }

    /// Stops the run: the epoch callback traps at its next tick, and every host call that
    /// could have an effect refuses. The first reason wins.
    pub fn abort(&self, kind: AbortKind, reason: String) {
        let mut state = self.lock();
        state.aborted.get_or_insert((kind, reason));
    }

    pub fn aborted(&self) -> Option<(AbortKind, String)> {
        self.lock().aborted.clone()
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        // A poisoned lock means a host call panicked; the data is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers the next host call of `kind` from the replay, if any is left.
    pub fn replay_next(&self, kind: &str) -> Replayed {
        let mut state = self.lock();
        if state.aborted.is_some() {
            return Replayed::Diverged;
        }
        if let Some((_, bytes, used)) = &state.random
            && *used < bytes.len()
        {
            let reason = format!(
                "the guest made a {kind:?} host call while {} recorded random bytes were still unread",
                bytes.len() - used
            );
            state.aborted = Some((AbortKind::Diverged, reason));
            return Replayed::Diverged;
        }
        state.random = None;
        match state.replay.front() {
            None => Replayed::Live,
            Some(entry) if entry.kind == kind => {
                let entry = state
                    .replay
                    .pop_front()
                    .map(|e| e.payload)
                    .unwrap_or(Value::Null);
                state.replayed += 1;
                Replayed::Recorded(entry)
            }
            Some(entry) => {
                let reason = format!(
                    "host call {} of the replay was {:?} in the oplog but {kind:?} now",
                    state.replayed + 1,
                    entry.kind
                );
                state.aborted = Some((AbortKind::Diverged, reason));
                Replayed::Diverged
            }
        }
    }

    /// Records a live host result.
    pub fn record(&self, kind: &str, payload: Value) {
        let mut state = self.lock();
        state.recorded += 1;
        state.pending.push(NewEntry::new(kind, payload));
    }

    /// Marks the run as diverged (for host calls whose recorded payload does not fit).
    pub fn diverge(&self, reason: String) {
        self.abort(AbortKind::Diverged, reason);
    }

    pub fn divergence(&self) -> Option<String> {
        match self.lock().aborted.clone() {
            Some((AbortKind::Diverged, reason)) => Some(reason),
            _ => None,
        }
    }

    /// True while recorded entries remain to be replayed.
    pub fn replaying(&self) -> bool {
        !self.lock().replay.is_empty()
    }

    /// Entries recorded since the last call, to be committed.
    pub fn take_pending(&self) -> Vec<NewEntry> {
        std::mem::take(&mut self.lock().pending)
    }

    pub fn pending_len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Entries replayed and recorded so far.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.replayed, state.recorded)
    }

    /// Host calls (or random bytes) left unanswered by a run that ended early: also a
    /// divergence.
    pub fn unreplayed(&self) -> usize {
        let state = self.lock();
        let partial = state
            .random
            .as_ref()
            .is_some_and(|(_, bytes, used)| *used < bytes.len());
        state.replay.len() + state.http.len() + usize::from(partial)
    }

    fn monotonic(&self, live: u64) -> u64 {
        let kind = MONOTONIC_CLOCK;
        match self.replay_next(kind) {
            Replayed::Recorded(payload) => match payload.get("ns").and_then(Value::as_u64) {
                Some(ns) => {
                    let mut state = self.lock();
                    state.monotonic_offset = i128::from(ns) - i128::from(live);
                    state.last_monotonic = ns;
                    ns
                }
                None => {
                    self.diverge(format!("recorded {kind} entry has no ns"));
                    live
                }
            },
            Replayed::Diverged => live,
            Replayed::Live => {
                let adjusted = {
                    let mut state = self.lock();
                    let adjusted = (i128::from(live) + state.monotonic_offset).max(0) as u64;
                    let adjusted = adjusted.max(state.last_monotonic);
                    state.last_monotonic = adjusted;
                    adjusted
                };
                self.record(kind, json!({ "ns": adjusted }));
                adjusted
            }
        }
    }

    fn wall(&self, live: Duration) -> Duration {
        let kind = WALL_CLOCK;
        match self.replay_next(kind) {
            Replayed::Recorded(payload) => {
                let secs = payload.get("secs").and_then(Value::as_u64);
                let nanos = payload.get("nanos").and_then(Value::as_u64);
                match (secs, nanos) {
                    (Some(secs), Some(nanos)) => Duration::new(secs, nanos as u32),
                    _ => {
                        self.diverge(format!("recorded {kind} entry is malformed"));
                        live
                    }
                }
            }
            Replayed::Diverged => live,
            Replayed::Live => {
                self.record(
                    kind,
                    json!({ "secs": live.as_secs(), "nanos": live.subsec_nanos() }),
                );
                live
            }
        }
    }

    /// Random draws are recorded as a byte stream: consecutive draws of one source share
    /// an entry, and a replay hands the bytes out again in the same order.
    fn random(&self, source: &'static str, buf: &mut [u8], live: impl FnOnce(&mut [u8])) {
        let mut state = self.lock();
        if state.aborted.is_some() {
            drop(state);
            live(buf);
            return;
        }
        // Continue the entry being replayed.
        if let Some((recorded_source, bytes, used)) = &mut state.random
            && *used < bytes.len()
        {
            let left = bytes.len() - *used;
            if recorded_source != source || left < buf.len() {
                let reason = format!(
                    "the guest asked for {} {source} random bytes but the oplog has {left} {recorded_source} bytes left",
                    buf.len()
                );
                state.aborted = Some((AbortKind::Diverged, reason));
                drop(state);
                live(buf);
                return;
            }
            buf.copy_from_slice(&bytes[*used..*used + buf.len()]);
            *used += buf.len();
            return;
        }
        drop(state);
        match self.replay_next(RANDOM) {
            Replayed::Recorded(payload) => {
                let bytes = payload
                    .get("hex")
                    .and_then(Value::as_str)
                    .and_then(|h| hex::decode(h).ok());
                let recorded_source = payload
                    .get("source")
                    .and_then(Value::as_str)
                    .unwrap_or("secure")
                    .to_string();
                match bytes {
                    Some(bytes) if bytes.len() >= buf.len() && recorded_source == source => {
                        buf.copy_from_slice(&bytes[..buf.len()]);
                        self.lock().random = Some((recorded_source, bytes, buf.len()));
                    }
                    _ => {
                        self.diverge(format!(
                            "the guest asked for {} {source} random bytes but the oplog has a different draw",
                            buf.len()
                        ));
                        live(buf);
                    }
                }
            }
            Replayed::Diverged => live(buf),
            Replayed::Live => {
                live(buf);
                let mut state = self.lock();
                state.recorded += 1;
                if let Some(last) = state.pending.last_mut()
                    && last.kind == RANDOM
                    && last.payload.get("source").and_then(Value::as_str) == Some(source)
                    && let Some(Value::String(hex_bytes)) = last.payload.get_mut("hex")
                {
                    hex_bytes.push_str(&hex::encode(&*buf));
                    return;
                }
                state.pending.push(NewEntry::new(
                    RANDOM,
                    json!({ "source": source, "hex": hex::encode(&*buf) }),
                ));
            }
        }
    }
}

/// `wasi:clocks/wall-clock` through the log.
pub struct RecordedWallClock(pub Arc<HostLog>);

impl HostWallClock for RecordedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        let live = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.0.wall(live)
    }
}

/// `wasi:clocks/monotonic-clock` through the log.
pub struct RecordedMonotonicClock {
    log: Arc<HostLog>,
    start: Instant,
}

impl RecordedMonotonicClock {
    pub fn new(log: Arc<HostLog>) -> Self {
        RecordedMonotonicClock {
            log,
            start: Instant::now(),
        }
    }
}

impl HostMonotonicClock for RecordedMonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        let live = self.start.elapsed().as_nanos() as u64;
        self.log.monotonic(live)
    }
}

/// `wasi:random` (secure and insecure) through the log.
pub struct RecordedRng {
    log: Arc<HostLog>,
    source: &'static str,
}

impl RecordedRng {
    pub fn secure(log: Arc<HostLog>) -> Self {
        RecordedRng {
            log,
            source: "secure",
        }
    }

    pub fn insecure(log: Arc<HostLog>) -> Self {
        RecordedRng {
            log,
            source: "insecure",
        }
    }

    fn fill(&mut self, buf: &mut [u8]) {
        self.log.random(self.source, buf, |b| rand::fill(b));
    }
}

impl rand::TryRng for RecordedRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.fill(dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn live_readings_are_recorded_in_order() {
        let log = HostLog::new(Vec::new());
        let wall = RecordedWallClock(log.clone());
        let mono = RecordedMonotonicClock::new(log.clone());
        let mut rng = RecordedRng::secure(log.clone());
        let t = wall.now();
        let m = mono.now();
        let r = rng.next_u64();
        let entries = log.take_pending();
        let kinds: Vec<_> = entries.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, [WALL_CLOCK, MONOTONIC_CLOCK, RANDOM]);
        assert_eq!(entries[0].payload["secs"], t.as_secs());
        assert_eq!(entries[1].payload["ns"], m);
        assert_eq!(entries[2].payload["hex"], hex::encode(r.to_le_bytes()));
        assert!(log.take_pending().is_empty());
    }

    #[test]
    fn replay_answers_from_the_log_then_goes_live() {
        let recorded = vec![
            NewEntry::new(WALL_CLOCK, json!({"secs": 42, "nanos": 7})),
            NewEntry::new(
                RANDOM,
                json!({"source": "secure", "hex": "0102030405060708"}),
            ),
            NewEntry::new(MONOTONIC_CLOCK, json!({"ns": u64::MAX / 2})),
        ];
        let log = HostLog::new(recorded);
        let wall = RecordedWallClock(log.clone());
        let mono = RecordedMonotonicClock::new(log.clone());
        let mut rng = RecordedRng::secure(log.clone());
        assert_eq!(wall.now(), Duration::new(42, 7));
        assert_eq!(rng.next_u64(), u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(mono.now(), u64::MAX / 2);
        assert!(!log.replaying());
        assert!(
            log.take_pending().is_empty(),
            "replayed entries are not recorded again"
        );
        // Live again: the monotonic clock continues from the replayed reading.
        assert!(mono.now() >= u64::MAX / 2);
        assert_eq!(log.take_pending().len(), 1);
        assert!(log.divergence().is_none());
    }

    #[test]
    fn a_different_host_call_is_a_divergence() {
        let log = HostLog::new(vec![NewEntry::new(
            WALL_CLOCK,
            json!({"secs": 1, "nanos": 0}),
        )]);
        let mut rng = RecordedRng::secure(log.clone());
        let _ = rng.next_u32();
        let reason = log.divergence().expect("diverged");
        assert!(reason.contains("wall-clock"), "{reason}");
    }

    #[test]
    fn consecutive_random_draws_share_an_entry_and_replay_byte_for_byte() {
        let log = HostLog::new(Vec::new());
        let mut rng = RecordedRng::secure(log.clone());
        let draws: Vec<u32> = (0..5).map(|_| rng.next_u32()).collect();
        let wide = rng.next_u64();
        let entries = log.take_pending();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(
            entries[0].payload["hex"].as_str().unwrap().len(),
            2 * (5 * 4 + 8)
        );

        let replay = HostLog::new(entries);
        let mut rng = RecordedRng::secure(replay.clone());
        let again: Vec<u32> = (0..5).map(|_| rng.next_u32()).collect();
        assert_eq!(again, draws);
        assert_eq!(rng.next_u64(), wide);
        assert_eq!(replay.unreplayed(), 0);
        assert!(replay.divergence().is_none());
    }

    #[test]
    fn unread_random_bytes_before_another_host_call_are_a_divergence() {
        let log = HostLog::new(vec![
            NewEntry::new(
                RANDOM,
                json!({"source": "secure", "hex": "0102030405060708"}),
            ),
            NewEntry::new(WALL_CLOCK, json!({"secs": 1, "nanos": 0})),
        ]);
        let mut rng = RecordedRng::secure(log.clone());
        let wall = RecordedWallClock(log.clone());
        let _ = rng.next_u32();
        let _ = wall.now();
        assert!(log.divergence().is_some());
    }

    #[test]
    fn a_random_draw_of_another_size_is_a_divergence() {
        let log = HostLog::new(vec![NewEntry::new(
            RANDOM,
            json!({"source": "secure", "hex": "01"}),
        )]);
        let mut rng = RecordedRng::secure(log.clone());
        let _ = rng.next_u64();
        assert!(log.divergence().is_some());
    }
}
