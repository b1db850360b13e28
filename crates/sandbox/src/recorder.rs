//! Record and replay of every nondeterministic host result a guest reads.
//!
//! A fresh call records each clock reading and random draw as an oplog entry. A call moved
//! to another worker is re-run from the start with the entries recorded so far: each host
//! call is answered from them, in order, until they run out, and then the call goes on
//! live. A host call that does not match the next recorded one is a replay divergence: the
//! call fails rather than silently mixing two histories.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use toolgrid_core::call::{
    EntryKind, HttpRequest, MonotonicClock, OplogEntry, Random, RandomSource, WallClock,
};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

/// Why a run must stop at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortKind {
    /// It made a host call its oplog does not have.
    Diverged,
    /// Its assignment was taken away: do nothing more, report nothing.
    Fenced,
    /// A commit went unacknowledged (the stream broke, the store failed): the run cannot
    /// go on, and the worker tells the control plane it gave the call up.
    Unacknowledged,
    /// A request may have been applied and repeating it is not safe.
    OutcomeUnknown,
}

/// An outgoing request of an earlier attempt, matched by its number.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedHttp {
    pub request: HttpRequest,
    /// `http-response`, `http-denied` or `http-error`, when one was recorded.
    pub outcome: Option<OplogEntry>,
}

/// The oplog of one running call, as the worker sees it.
#[derive(Default)]
pub struct HostLog {
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    replay: VecDeque<OplogEntry>,
    replayed: usize,
    /// Entries recorded live and not yet handed to the control plane.
    pending: Vec<OplogEntry>,
    recorded: usize,
    aborted: Option<(AbortKind, String)>,
    /// Outgoing requests of earlier attempts, by number: matched by number rather than by
    /// position, because when a response arrives relative to other host calls is timing.
    http: BTreeMap<u64, RecordedHttp>,
    /// The recorded random entry being replayed: its source, bytes, and how many are used.
    random: Option<(RandomSource, Vec<u8>, usize)>,
    /// Added to live monotonic readings after a replay, so time never runs backwards
    /// across workers.
    monotonic_offset: i128,
    last_monotonic: u64,
}

/// What replay made of one host call.
// Short-lived, one per host call: boxing the entry would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Replayed {
    /// Answer the guest with this recorded entry (of the kind asked for).
    Recorded(OplogEntry),
    /// Nothing left to replay: do it live and record it.
    Live,
    /// The next recorded entry is of another kind: the run has diverged.
    Diverged,
}

impl HostLog {
    /// A log that replays `replay` (the call's host-call entries, in oplog order) before
    /// it goes live. An HTTP outcome with no recorded request is a divergence at once.
    pub fn new(replay: Vec<OplogEntry>) -> Arc<Self> {
        let mut ordered = VecDeque::new();
        let mut http: BTreeMap<u64, RecordedHttp> = BTreeMap::new();
        let mut aborted = None;
        for entry in replay {
            match entry {
                OplogEntry::HttpRequest(request) => {
                    http.insert(
                        request.seq,
                        RecordedHttp {
                            request,
                            outcome: None,
                        },
                    );
                }
                outcome @ (OplogEntry::HttpResponse(_)
                | OplogEntry::HttpError(_)
                | OplogEntry::HttpDenied(_)) => {
                    let seq = outcome.http_seq().unwrap_or_default();
                    match http.get_mut(&seq) {
                        Some(recorded) if recorded.outcome.is_none() => {
                            recorded.outcome = Some(outcome)
                        }
                        _ => {
                            aborted.get_or_insert((
                                AbortKind::Diverged,
                                format!(
                                    "the oplog has a {} for request {seq} without its request (or twice)",
                                    outcome.kind()
                                ),
                            ));
                        }
                    }
                }
                other => ordered.push_back(other),
            }
        }
        Arc::new(HostLog {
            state: Mutex::new(LogState {
                replay: ordered,
                http,
                aborted,
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
    pub fn replay_next(&self, kind: EntryKind) -> Replayed {
        let mut state = self.lock();
        if state.aborted.is_some() {
            return Replayed::Diverged;
        }
        if let Some((_, bytes, used)) = &state.random
            && *used < bytes.len()
        {
            let reason = format!(
                "the guest made a {kind} host call while {} recorded random bytes were still unread",
                bytes.len() - used
            );
            state.aborted = Some((AbortKind::Diverged, reason));
            return Replayed::Diverged;
        }
        state.random = None;
        let next_kind = match state.replay.front() {
            None => return Replayed::Live,
            Some(entry) => entry.kind(),
        };
        if next_kind != kind {
            let reason = format!(
                "host call {} of the replay was {next_kind} in the oplog but {kind} now",
                state.replayed + 1,
            );
            state.aborted = Some((AbortKind::Diverged, reason));
            return Replayed::Diverged;
        }
        match state.replay.pop_front() {
            Some(entry) => {
                state.replayed += 1;
                Replayed::Recorded(entry)
            }
            None => Replayed::Live,
        }
    }

    /// Records a live host result.
    pub fn record(&self, entry: OplogEntry) {
        let mut state = self.lock();
        state.recorded += 1;
        state.pending.push(entry);
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

    /// The kind of the next recorded entry to replay, if any is left.
    pub fn peek_kind(&self) -> Option<EntryKind> {
        self.lock().replay.front().map(OplogEntry::kind)
    }

    /// Whether the replay still holds the answer to a program's tool call `seq`.
    pub fn has_tool_result(&self, seq: u64) -> bool {
        self.lock()
            .replay
            .iter()
            .any(|e| matches!(e, OplogEntry::ToolResult(r) if r.seq == seq))
    }

    /// True while recorded entries remain to be replayed.
    pub fn replaying(&self) -> bool {
        !self.lock().replay.is_empty()
    }

    /// Entries recorded since the last call, to be committed.
    pub fn take_pending(&self) -> Vec<OplogEntry> {
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
        match self.replay_next(EntryKind::MonotonicClock) {
            Replayed::Recorded(OplogEntry::MonotonicClock(MonotonicClock { ns })) => {
                let mut state = self.lock();
                state.monotonic_offset = i128::from(ns) - i128::from(live);
                state.last_monotonic = ns;
                ns
            }
            Replayed::Recorded(_) | Replayed::Diverged => live,
            Replayed::Live => {
                let adjusted = {
                    let mut state = self.lock();
                    let adjusted = (i128::from(live) + state.monotonic_offset).max(0) as u64;
                    let adjusted = adjusted.max(state.last_monotonic);
                    state.last_monotonic = adjusted;
                    adjusted
                };
                self.record(OplogEntry::MonotonicClock(MonotonicClock { ns: adjusted }));
                adjusted
            }
        }
    }

    fn wall(&self, live: Duration) -> Duration {
        match self.replay_next(EntryKind::WallClock) {
            Replayed::Recorded(OplogEntry::WallClock(WallClock { secs, nanos })) => {
                Duration::new(secs, nanos)
            }
            Replayed::Recorded(_) | Replayed::Diverged => live,
            Replayed::Live => {
                self.record(OplogEntry::WallClock(WallClock {
                    secs: live.as_secs(),
                    nanos: live.subsec_nanos(),
                }));
                live
            }
        }
    }

    /// Random draws are recorded as a byte stream: consecutive draws of one source share
    /// an entry, and a replay hands the bytes out again in the same order.
    fn random(&self, source: RandomSource, buf: &mut [u8], live: impl FnOnce(&mut [u8])) {
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
            if *recorded_source != source || left < buf.len() {
                let reason = format!(
                    "the guest asked for {} {} random bytes but the oplog has {left} {} bytes left",
                    buf.len(),
                    source.as_str(),
                    recorded_source.as_str()
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
        match self.replay_next(EntryKind::Random) {
            Replayed::Recorded(OplogEntry::Random(Random {
                source: recorded_source,
                bytes,
            })) if bytes.len() >= buf.len() && recorded_source == source => {
                buf.copy_from_slice(&bytes[..buf.len()]);
                self.lock().random = Some((recorded_source, bytes, buf.len()));
            }
            Replayed::Recorded(_) => {
                self.diverge(format!(
                    "the guest asked for {} {} random bytes but the oplog has a different draw",
                    buf.len(),
                    source.as_str()
                ));
                live(buf);
            }
            Replayed::Diverged => live(buf),
            Replayed::Live => {
                live(buf);
                let mut state = self.lock();
                state.recorded += 1;
                if let Some(OplogEntry::Random(last)) = state.pending.last_mut()
                    && last.source == source
                {
                    last.bytes.extend_from_slice(buf);
                    return;
                }
                state.pending.push(OplogEntry::Random(Random {
                    source,
                    bytes: buf.to_vec(),
                }));
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
    source: RandomSource,
}

impl RecordedRng {
    pub fn secure(log: Arc<HostLog>) -> Self {
        RecordedRng {
            log,
            source: RandomSource::Secure,
        }
    }

    pub fn insecure(log: Arc<HostLog>) -> Self {
        RecordedRng {
            log,
            source: RandomSource::Insecure,
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

    fn wall(secs: u64, nanos: u32) -> OplogEntry {
        OplogEntry::WallClock(WallClock { secs, nanos })
    }

    fn random(bytes: &[u8]) -> OplogEntry {
        OplogEntry::Random(Random {
            source: RandomSource::Secure,
            bytes: bytes.to_vec(),
        })
    }

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
        assert_eq!(
            entries,
            [
                OplogEntry::WallClock(WallClock {
                    secs: t.as_secs(),
                    nanos: t.subsec_nanos()
                }),
                OplogEntry::MonotonicClock(MonotonicClock { ns: m }),
                random(&r.to_le_bytes()),
            ]
        );
        assert!(log.take_pending().is_empty());
    }

    #[test]
    fn replay_answers_from_the_log_then_goes_live() {
        let recorded = vec![
            wall(42, 7),
            random(&[1, 2, 3, 4, 5, 6, 7, 8]),
            OplogEntry::MonotonicClock(MonotonicClock { ns: u64::MAX / 2 }),
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
        let log = HostLog::new(vec![wall(1, 0)]);
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
        assert!(matches!(&entries[0], OplogEntry::Random(r) if r.bytes.len() == 5 * 4 + 8));

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
        let log = HostLog::new(vec![random(&[1, 2, 3, 4, 5, 6, 7, 8]), wall(1, 0)]);
        let mut rng = RecordedRng::secure(log.clone());
        let wall = RecordedWallClock(log.clone());
        let _ = rng.next_u32();
        let _ = wall.now();
        assert!(log.divergence().is_some());
    }

    #[test]
    fn a_random_draw_of_another_size_is_a_divergence() {
        let log = HostLog::new(vec![random(&[1])]);
        let mut rng = RecordedRng::secure(log.clone());
        let _ = rng.next_u64();
        assert!(log.divergence().is_some());
    }

    #[test]
    fn an_http_outcome_without_its_request_is_a_divergence() {
        let log = HostLog::new(vec![OplogEntry::HttpError(
            toolgrid_core::call::HttpError {
                seq: 4,
                message: "x".into(),
                unresolved: false,
                limit: None,
            },
        )]);
        let reason = log.divergence().expect("diverged");
        assert!(reason.contains("request 4"), "{reason}");
    }
}
