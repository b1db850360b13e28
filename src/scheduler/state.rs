//! The scheduler's decisions, as a pure state machine.
//!
//! [`State::on`] takes one [`Event`] (a worker attached, a store write came back, time
//! passed) and the current time, updates the scheduler's view, and returns the
//! [`Command`]s that follow (write an assignment, fence a call, send a cancel). It does no IO
//! and reads no clock: the driver in `super` does the IO, feeds each outcome back as an
//! event, and sleeps until [`State::next_wake`]. Tests drive it with fake time.
//!
//! Invariants:
//! - a call is in exactly one of: the queue, `running`, `fencing`, `failing`, `orphans`;
//! - a running call's slot is counted in its worker's `busy` set while the worker's session
//!   is the current one;
//! - a store write that fails keeps the call here and is tried again after a backoff: no
//!   call is ever dropped because the store was briefly unavailable;
//! - a worker session acts only on the calls it holds: an append, a result, a progress
//!   report or an abandonment for a call not assigned to that very session under that very
//!   epoch is refused ([`State::holding`]) and changes nothing;
//! - a worker id has one session at a time, and a newcomer with the same id replaces it only
//!   by presenting that session's secret (handed out in `Registered`): anyone else is refused
//!   ([`Command::RefuseAttach`]) while the first session lives.

use crate::auth::worker::secrets_match;
use crate::call::{CallError, CallRecord, CallState, ErrorKind, IdleDeadline, Lifecycle, NewCall};
use crate::catalog::interface::CommandInterface;
use crate::workspace::{WorkspaceKey, WriteLocks};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Timing the state machine needs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A worker silent this long is dead and loses its calls.
    pub lease: Duration,
    /// After a control plane restart, how long running calls wait for their worker to
    /// re-attach (from the moment the worker port listens).
    pub reattach_grace: Duration,
    /// How long past its deadline a running call may go unreported before it is failed.
    pub deadline_grace: Duration,
    /// First wait before a failed store write is tried again (doubling, up to 16x).
    pub retry_backoff: Duration,
}

/// A call and the compiled interface it was admitted with (`None` after a restart).
#[derive(Clone)]
pub struct Call {
    pub record: Arc<CallRecord>,
    pub interface: Option<Arc<CommandInterface>>,
    /// The call's deadline as it stands (Unix ms; 0: none): `spec.deadline_ms`, moved by
    /// each progress report the tool made, never past the Tool's `maxTimeout`
    /// ([`IdleDeadline`]). It travels with the call through fencing and re-queueing.
    pub deadline_ms: i64,
}

impl Call {
    pub fn new(record: CallRecord, interface: Option<Arc<CommandInterface>>) -> Self {
        Call {
            deadline_ms: record.spec.deadline_ms,
            record: Arc::new(record),
            interface,
        }
    }

    /// The deadline arithmetic of the call (`None`: it has no deadline).
    pub fn idle_deadline(&self) -> Option<IdleDeadline> {
        IdleDeadline::of(&self.record.spec.limits, self.record.spec.deadline_ms)
    }

    /// A progress report of the tool at `now_ms` restarts the call's idle deadline.
    fn progressed(&mut self, now_ms: i64) {
        if let Some(rule) = self.idle_deadline() {
            self.deadline_ms = rule.extend(self.deadline_ms, now_ms);
        }
    }

    fn id(&self) -> &str {
        &self.record.id
    }

    /// The workspace this call writes, if it is a read-write call of an agent.
    fn writes(&self) -> Option<WorkspaceKey> {
        WorkspaceKey::written_by(&self.record.namespace, &self.record.spec.access)
    }
}

/// A call a worker reported as still running when it attached, with the store's view of it.
pub struct Reported {
    pub call_id: String,
    pub epoch: u64,
    /// The call as the store has it now (`None`: unknown, or the read failed).
    pub stored: Option<CallRecord>,
}

/// Why a worker session may not act on a call (append to it, complete it, report its
/// progress, give it up).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The call is not assigned to this session: another worker's (or another session's of
    /// this worker), queued, ended, or unknown.
    #[error("not-held")]
    NotHeld,
    /// Assigned to this session, but under another epoch (an earlier run of it).
    #[error("stale-epoch")]
    StaleEpoch,
}

impl Refusal {
    /// The name the worker sees (`AppendAck.error`, `ResultAck.error`).
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotHeld => "not-held",
            Refusal::StaleEpoch => "stale-epoch",
        }
    }
}

pub enum Event {
    /// The worker port listens: the re-attach grace of recovered calls starts now.
    Listening,
    /// Unfinished calls loaded from the store at start-up.
    Recovered(Vec<CallRecord>),
    /// A call was admitted and waits for a slot.
    Submitted(Call),
    /// A call was admitted and assigned in the same commit, to a slot reserved with
    /// [`State::reserve`].
    AdmittedAssigned {
        call: Call,
        epoch: u64,
    },
    /// A worker opened a session.
    Attach {
        worker: String,
        pool: String,
        slots: u32,
        cached: Vec<String>,
        in_flight: Vec<Reported>,
        /// The secret of the new session (the driver made it; the worker gets it in
        /// `Registered`).
        secret: String,
        /// The secret of the worker's previous session, if it presents one: the proof that
        /// lets it replace a session still alive under its id.
        resume: Option<String>,
    },
    Heartbeat {
        worker: String,
        session: u64,
        cached: Vec<String>,
    },
    /// A worker's stream ended.
    Detached {
        worker: String,
        session: u64,
        reason: String,
    },
    /// The store recorded an assignment.
    Assigned {
        call_id: String,
        epoch: u64,
    },
    /// The store refused an assignment: the call ended or is gone.
    AssignRefused {
        call_id: String,
    },
    /// The assignment could not be written, or its oplog not read: try again later.
    AssignFailed {
        call_id: String,
    },
    /// The call's oplog cannot be replayed: it ends as a divergence.
    ReplayUnreadable {
        call_id: String,
        message: String,
    },
    /// The store fenced a call; it waits for another worker.
    Fenced {
        call_id: String,
    },
    /// A fence was refused (the call moved on meanwhile): forget it.
    FenceRefused {
        call_id: String,
    },
    FenceFailed {
        call_id: String,
    },
    /// The call ended in the store (a completion, or a failure the scheduler wrote).
    Finished {
        call_id: String,
    },
    FailFailed {
        call_id: String,
    },
    /// The store ended the call from outside (its caller cancelled it): forget it, and
    /// tell the worker running it, if any, to stop at once.
    Stopped {
        call_id: String,
        reason: String,
    },
    /// The worker gave the call up (it could not commit): fence it now.
    Abandoned {
        worker: String,
        session: u64,
        call_id: String,
        epoch: u64,
        reason: String,
    },
    /// A failed attempt of the call is to run again (its `retry` entry is committed under
    /// `epoch`): take it back now and queue it once `backoff` has passed.
    Retrying {
        worker: String,
        session: u64,
        call_id: String,
        epoch: u64,
        backoff: Duration,
        reason: String,
    },
    /// Time passed.
    Tick,
}

#[derive(Clone)]
pub enum Command {
    /// Refuse a worker's `Register`: its id has a live session and it did not present that
    /// session's secret.
    RefuseAttach {
        worker: String,
        session: u64,
    },
    /// Answer a worker's `Register`.
    Registered {
        worker: String,
        session: u64,
        abandon: Vec<String>,
    },
    /// Write an assignment (bumping the epoch), read the oplog to replay if it is not the
    /// first, and send it to the worker's session.
    Assign {
        call: Call,
        worker: String,
        session: u64,
    },
    /// Send an assignment already written (admission and assignment in one commit).
    Send {
        call: Call,
        worker: String,
        session: u64,
        epoch: u64,
    },
    Fence {
        call: Call,
        epoch: u64,
        reason: String,
    },
    Fail {
        call: Call,
        error: CallError,
    },
    Cancel {
        worker: String,
        session: u64,
        call_id: String,
        epoch: u64,
        reason: String,
    },
    /// End a session's stream (its lease lapsed).
    EndSession {
        worker: String,
        session: u64,
    },
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Registered {
                worker,
                session,
                abandon,
            } => {
                write!(f, "Registered({worker}#{session}, abandon {abandon:?})")
            }
            Command::Assign {
                call,
                worker,
                session,
            } => {
                write!(f, "Assign({} -> {worker}#{session})", call.id())
            }
            Command::Send {
                call,
                worker,
                session,
                epoch,
            } => {
                write!(f, "Send({} -> {worker}#{session} @{epoch})", call.id())
            }
            Command::Fence {
                call,
                epoch,
                reason,
            } => {
                write!(f, "Fence({} @{epoch}: {reason})", call.id())
            }
            Command::Fail { call, error } => write!(f, "Fail({}: {})", call.id(), error.kind),
            Command::Cancel {
                worker,
                call_id,
                epoch,
                ..
            } => {
                write!(f, "Cancel({call_id} @{epoch} on {worker})")
            }
            Command::EndSession { worker, session } => write!(f, "EndSession({worker}#{session})"),
            Command::RefuseAttach { worker, session } => {
                write!(f, "RefuseAttach({worker}: #{session} lives)")
            }
        }
    }
}

struct Worker {
    session: u64,
    /// The session's secret: whoever presents it is this worker.
    secret: String,
    pool: String,
    slots: u32,
    busy: HashSet<String>,
    cached: HashSet<String>,
    lease_until: Instant,
}

struct Queued {
    call: Call,
    /// Not before this (a store write for it failed).
    not_before: Option<Instant>,
}

struct Running {
    call: Call,
    worker: String,
    session: u64,
    /// 0 while the assignment is being written.
    epoch: u64,
}

/// A call whose assignment is being taken back (fence in flight, or retried at `retry_at`).
struct Fencing {
    call: Call,
    epoch: u64,
    reason: String,
    retry_at: Option<Instant>,
    failures: u32,
}

/// A call being failed by the scheduler (write in flight, or retried at `retry_at`).
struct Failing {
    call: Call,
    error: CallError,
    retry_at: Option<Instant>,
    failures: u32,
}

/// A running call found in the store at start-up, waiting for its worker to re-attach.
struct Orphan {
    call: Call,
    /// `None` until the worker port listens.
    until: Option<Instant>,
}

/// The secrets of a session being opened.
struct Session {
    secret: String,
    resume: Option<String>,
}

/// Where a call may run.
struct Placement<'a> {
    pool: &'a str,
    release: &'a str,
    digest: &'a str,
    /// Calls of the release at once; 0 for no limit.
    instances: u32,
}

impl<'a> Placement<'a> {
    fn of(record: &'a CallRecord) -> Self {
        Placement {
            pool: &record.spec.pool,
            release: &record.release,
            digest: &record.release_digest,
            instances: record.spec.limits.instances,
        }
    }
}

/// One worker as status reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    pub id: String,
    pub pool: String,
    pub slots: u32,
    pub busy: u32,
}

pub struct State {
    timing: Timing,
    workers: HashMap<String, Worker>,
    next_session: u64,
    queue: VecDeque<Queued>,
    running: HashMap<String, Running>,
    fencing: HashMap<String, Fencing>,
    failing: HashMap<String, Failing>,
    orphans: HashMap<String, Orphan>,
    /// Slots reserved for calls being admitted (call id → worker, session).
    reserved: HashMap<String, (String, u64)>,
    /// When the worker port started listening.
    listening_since: Option<Instant>,
    /// Consecutive failed assignment writes of a call, for its backoff.
    assign_failures: HashMap<String, u32>,
    /// Which call writes each workspace (from its first assignment until it ends).
    writers: WriteLocks,
    /// Calls being taken back for another attempt, and how long each waits once it is.
    retry_waits: HashMap<String, Duration>,
    /// Deadlines the recorded progress of unfinished calls gave them, applied when they are
    /// recovered (see [`State::restore_deadlines`]).
    restored: HashMap<String, i64>,
}

impl State {
    pub fn new(timing: Timing) -> Self {
        State {
            timing,
            workers: HashMap::new(),
            next_session: 0,
            queue: VecDeque::new(),
            running: HashMap::new(),
            fencing: HashMap::new(),
            failing: HashMap::new(),
            orphans: HashMap::new(),
            reserved: HashMap::new(),
            listening_since: None,
            assign_failures: HashMap::new(),
            writers: WriteLocks::default(),
            retry_waits: HashMap::new(),
            restored: HashMap::new(),
        }
    }

    /// Before [`Event::Recovered`]: the deadlines (Unix ms) the progress recorded in the
    /// oplogs of unfinished calls gave them, so a restart does not cut off a call that was
    /// progressing. A deadline is never moved earlier than the spec's.
    pub fn restore_deadlines(&mut self, deadlines: HashMap<String, i64>) {
        self.restored = deadlines;
    }

    /// A progress report of the tool, accepted from the session holding the call (checked
    /// with [`State::holding`]) at `now_ms`: the call's idle deadline restarts, up to its
    /// `maxTimeout`.
    pub fn progressed(&mut self, call_id: &str, now_ms: i64) {
        if let Some(running) = self.running.get_mut(call_id) {
            running.call.progressed(now_ms);
        }
    }

    /// The deadline of a call this scheduler tracks as it stands (Unix ms).
    pub fn deadline_of(&self, call_id: &str) -> Option<i64> {
        self.running
            .get(call_id)
            .map(|r| r.call.deadline_ms)
            .or_else(|| self.orphans.get(call_id).map(|o| o.call.deadline_ms))
            .or_else(|| {
                self.queue
                    .iter()
                    .find(|q| q.call.id() == call_id)
                    .map(|q| q.call.deadline_ms)
            })
    }

    fn backoff(&self, failures: u32) -> Duration {
        self.timing.retry_backoff * 2u32.pow(failures.min(4))
    }

    /// Handles one event at `now`; returns what the driver must do.
    pub fn on(&mut self, event: Event, now: Instant) -> Vec<Command> {
        let mut out = Vec::new();
        match event {
            Event::Listening => {
                self.listening_since.get_or_insert(now);
                let until = now + self.timing.reattach_grace;
                for orphan in self.orphans.values_mut() {
                    orphan.until.get_or_insert(until);
                }
            }
            Event::Recovered(records) => {
                let until = self.listening_since.map(|t| t + self.timing.reattach_grace);
                for record in records {
                    let mut call = Call::new(record, None);
                    if let Some(restored) = self.restored.remove(call.id()) {
                        call.deadline_ms = call.deadline_ms.max(restored);
                    }
                    if call.record.epoch > 0 {
                        // Assigned before the restart: it still holds its workspace.
                        self.writers.take(call.writes().as_ref(), call.id());
                    }
                    if call.record.state == CallState::Running {
                        self.orphans
                            .insert(call.id().to_string(), Orphan { call, until });
                    } else {
                        self.enqueue_back(call);
                    }
                }
            }
            Event::Submitted(call) => self.enqueue_back(call),
            Event::AdmittedAssigned { call, epoch } => {
                let id = call.id().to_string();
                match self.reserved.remove(&id) {
                    Some((worker, session)) if self.is_current(&worker, session) => {
                        self.running.insert(
                            id,
                            Running {
                                call: call.clone(),
                                worker: worker.clone(),
                                session,
                                epoch,
                            },
                        );
                        out.push(Command::Send {
                            call,
                            worker,
                            session,
                            epoch,
                        });
                    }
                    // The worker went away while the call was being written: take it back.
                    _ => self.fence(
                        call,
                        epoch,
                        "its worker left before the call reached it".into(),
                        &mut out,
                    ),
                }
            }
            Event::Attach {
                worker,
                pool,
                slots,
                cached,
                in_flight,
                secret,
                resume,
            } => {
                let session = Session { secret, resume };
                self.attach(
                    worker, pool, slots, cached, in_flight, session, now, &mut out,
                )
            }
            Event::Heartbeat {
                worker,
                session,
                cached,
            } => {
                if let Some(w) = self.workers.get_mut(&worker)
                    && w.session == session
                {
                    w.lease_until = now + self.timing.lease;
                    w.cached.extend(cached);
                }
            }
            Event::Detached {
                worker,
                session,
                reason,
            } => self.lose_worker(&worker, session, &reason, &mut out),
            Event::Assigned { call_id, epoch } => {
                self.assign_failures.remove(&call_id);
                if let Some(running) = self.running.get_mut(&call_id) {
                    running.epoch = epoch;
                    let (worker, session) = (running.worker.clone(), running.session);
                    let call = running.call.clone();
                    if self.is_current(&worker, session) {
                        out.push(Command::Send {
                            call,
                            worker,
                            session,
                            epoch,
                        });
                    } else {
                        self.running.remove(&call_id);
                        self.fence(
                            call,
                            epoch,
                            format!("worker {worker} left before the call reached it"),
                            &mut out,
                        );
                    }
                }
            }
            Event::AssignRefused { call_id } => {
                self.release(&call_id);
                self.writers.release(&call_id);
            }
            Event::AssignFailed { call_id } => {
                if let Some(running) = self.release(&call_id) {
                    let failures = self.assign_failures.entry(call_id).or_default();
                    *failures += 1;
                    let backoff = self.timing.retry_backoff * 2u32.pow((*failures - 1).min(4));
                    self.queue.push_front(Queued {
                        call: running.call,
                        not_before: Some(now + backoff),
                    });
                }
            }
            Event::ReplayUnreadable { call_id, message } => {
                if let Some(running) = self.release(&call_id) {
                    let error = CallError::new(ErrorKind::ReplayDivergence, message);
                    self.fail(running.call, error, &mut out);
                }
            }
            Event::Fenced { call_id } => {
                // A call taken back for another attempt waits out its backoff first.
                let not_before = self.retry_waits.remove(&call_id).map(|wait| now + wait);
                if let Some(fencing) = self.fencing.remove(&call_id) {
                    self.queue.push_front(Queued {
                        call: fencing.call,
                        not_before,
                    });
                }
            }
            Event::FenceRefused { call_id } => {
                self.retry_waits.remove(&call_id);
                self.fencing.remove(&call_id);
                self.writers.release(&call_id);
            }
            Event::FenceFailed { call_id } => {
                let backoff = self.fencing.get(&call_id).map(|f| self.backoff(f.failures));
                if let (Some(fencing), Some(backoff)) = (self.fencing.get_mut(&call_id), backoff) {
                    fencing.failures += 1;
                    fencing.retry_at = Some(now + backoff);
                }
            }
            Event::Finished { call_id } => {
                self.retry_waits.remove(&call_id);
                self.assign_failures.remove(&call_id);
                self.release(&call_id);
                self.failing.remove(&call_id);
                self.fencing.remove(&call_id);
                self.orphans.remove(&call_id);
                self.queue.retain(|q| q.call.id() != call_id);
                self.writers.release(&call_id);
            }
            Event::Stopped { call_id, reason } => {
                if let Some(running) = self.release(&call_id)
                    && running.epoch > 0
                    && self.is_current(&running.worker, running.session)
                {
                    out.push(Command::Cancel {
                        worker: running.worker,
                        session: running.session,
                        call_id: call_id.clone(),
                        epoch: running.epoch,
                        reason,
                    });
                }
                self.assign_failures.remove(&call_id);
                self.failing.remove(&call_id);
                self.fencing.remove(&call_id);
                self.orphans.remove(&call_id);
                self.queue.retain(|q| q.call.id() != call_id);
                self.writers.release(&call_id);
            }
            Event::FailFailed { call_id } => {
                let backoff = self.failing.get(&call_id).map(|f| self.backoff(f.failures));
                if let (Some(failing), Some(backoff)) = (self.failing.get_mut(&call_id), backoff) {
                    failing.failures += 1;
                    failing.retry_at = Some(now + backoff);
                }
            }
            Event::Abandoned {
                worker,
                session,
                call_id,
                epoch,
                reason,
            } => {
                let holds = self.holding(&call_id, &worker, session, epoch).is_ok();
                if holds && let Some(running) = self.release(&call_id) {
                    let reason = format!("worker {worker} gave it up: {reason}");
                    self.fence(running.call, epoch, reason, &mut out);
                }
            }
            Event::Retrying {
                worker,
                session,
                call_id,
                epoch,
                backoff,
                reason,
            } => {
                let holds = self.holding(&call_id, &worker, session, epoch).is_ok();
                if holds && let Some(running) = self.release(&call_id) {
                    self.retry_waits.insert(call_id, backoff);
                    self.fence(running.call, epoch, reason, &mut out);
                }
            }
            Event::Tick => {}
        }
        self.expire(now, &mut out);
        self.dispatch(now, &mut out);
        out
    }

    fn is_current(&self, worker: &str, session: u64) -> bool {
        self.workers
            .get(worker)
            .is_some_and(|w| w.session == session)
    }

    fn enqueue_back(&mut self, call: Call) {
        self.queue.push_back(Queued {
            call,
            not_before: None,
        });
    }

    /// Takes a call out of `running`, freeing its slot.
    fn release(&mut self, call_id: &str) -> Option<Running> {
        let running = self.running.remove(call_id)?;
        if let Some(w) = self.workers.get_mut(&running.worker) {
            w.busy.remove(call_id);
        }
        Some(running)
    }

    fn fence(&mut self, call: Call, epoch: u64, reason: String, out: &mut Vec<Command>) {
        if epoch == 0 {
            // Never assigned in the store: it is still pending there.
            self.queue.push_front(Queued {
                call,
                not_before: None,
            });
            return;
        }
        out.push(Command::Fence {
            call: call.clone(),
            epoch,
            reason: reason.clone(),
        });
        self.fencing.insert(
            call.id().to_string(),
            Fencing {
                call,
                epoch,
                reason,
                retry_at: None,
                failures: 0,
            },
        );
    }

    fn fail(&mut self, call: Call, error: CallError, out: &mut Vec<Command>) {
        out.push(Command::Fail {
            call: call.clone(),
            error: error.clone(),
        });
        self.failing.insert(
            call.id().to_string(),
            Failing {
                call,
                error,
                retry_at: None,
                failures: 0,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn attach(
        &mut self,
        worker: String,
        pool: String,
        slots: u32,
        cached: Vec<String>,
        in_flight: Vec<Reported>,
        secrets: Session,
        now: Instant,
        out: &mut Vec<Command>,
    ) {
        if let Some(old) = self.workers.get(&worker) {
            let old_session = old.session;
            if old.lease_until <= now {
                // Dead already, though no tick said so yet.
                self.lose_worker(&worker, old_session, "lease lapsed (no heartbeat)", out);
            } else if !secrets
                .resume
                .as_deref()
                .is_some_and(|presented| secrets_match(&old.secret, presented))
            {
                // Only the worker itself may replace its live session.
                out.push(Command::RefuseAttach {
                    worker,
                    session: old_session,
                });
                return;
            }
        }
        self.next_session += 1;
        let session = self.next_session;
        if let Some(old) = self.workers.remove(&worker) {
            out.push(Command::EndSession {
                worker: worker.clone(),
                session: old.session,
            });
        }
        let mut abandon = Vec::new();
        let mut busy = HashSet::new();
        let mut adopted = HashSet::new();
        for reported in in_flight {
            let id = reported.call_id.clone();
            // The store must say it runs there, under that epoch, in the pool this session
            // was authorized for (a worker of another pool cannot claim it by its id).
            let agrees = reported.stored.as_ref().is_some_and(|r| {
                r.state == CallState::Running
                    && r.epoch == reported.epoch
                    && r.worker.as_deref() == Some(worker.as_str())
                    && r.spec.pool == pool
            });
            // The scheduler's own view must agree too: not fenced or reassigned meanwhile.
            let ours = match self.running.get(&id) {
                Some(r) => r.worker == worker && r.epoch == reported.epoch,
                None => !self.fencing.contains_key(&id) && !self.failing.contains_key(&id),
            };
            if !(agrees && ours) {
                abandon.push(id);
                continue;
            }
            let call = match (
                self.orphans.remove(&id),
                self.running.remove(&id),
                reported.stored,
            ) {
                (_, Some(running), _) => running.call,
                (Some(orphan), None, _) => orphan.call,
                (None, None, Some(stored)) => Call::new(stored, None),
                (None, None, None) => continue,
            };
            self.writers.take(call.writes().as_ref(), call.id());
            busy.insert(id.clone());
            adopted.insert(id.clone());
            self.running.insert(
                id,
                Running {
                    call,
                    worker: worker.clone(),
                    session,
                    epoch: reported.epoch,
                },
            );
        }
        // Calls of an older session of this worker that it no longer reports are taken back.
        let stale: Vec<String> = self
            .running
            .iter()
            .filter(|(id, r)| r.worker == worker && r.session != session && !adopted.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        self.workers.insert(
            worker.clone(),
            Worker {
                session,
                secret: secrets.secret,
                pool,
                slots: slots.max(1),
                busy,
                cached: cached.into_iter().collect(),
                lease_until: now + self.timing.lease,
            },
        );
        out.push(Command::Registered {
            worker: worker.clone(),
            session,
            abandon,
        });
        for id in stale {
            if let Some(running) = self.running.remove(&id) {
                let reason = format!("worker {worker} re-attached without it");
                self.fence(running.call, running.epoch, reason, out);
            }
        }
    }

    fn lose_worker(&mut self, worker: &str, session: u64, reason: &str, out: &mut Vec<Command>) {
        if !self.is_current(worker, session) {
            return;
        }
        self.workers.remove(worker);
        out.push(Command::EndSession {
            worker: worker.to_string(),
            session,
        });
        let lost: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| r.worker == worker && r.session == session && r.epoch > 0)
            .map(|(id, _)| id.clone())
            .collect();
        for id in lost {
            if let Some(running) = self.running.remove(&id) {
                let why = format!("worker {worker} lost: {reason}");
                self.fence(running.call, running.epoch, why, out);
            }
        }
        // Reservations and assignments still being written to this session are settled when
        // their write returns (AdmittedAssigned / Assigned find the session gone).
        self.reserved
            .retain(|_, (w, s)| !(w == worker && *s == session));
    }

    /// Leases, orphans, deadlines, and store writes due to be tried again.
    fn expire(&mut self, now: Instant, out: &mut Vec<Command>) {
        let lapsed: Vec<(String, u64)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.lease_until <= now)
            .map(|(id, w)| (id.clone(), w.session))
            .collect();
        for (worker, session) in lapsed {
            self.lose_worker(&worker, session, "lease lapsed (no heartbeat)", out);
        }

        let orphans: Vec<String> = self
            .orphans
            .iter()
            .filter(|(_, o)| o.until.is_some_and(|t| t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in orphans {
            if let Some(orphan) = self.orphans.remove(&id) {
                let epoch = orphan.call.record.epoch;
                let reason = "its worker did not re-attach after a control plane restart".into();
                self.fence(orphan.call, epoch, reason, out);
            }
        }

        let wall = crate::call::now_ms();
        let grace = self.timing.deadline_grace.as_millis() as i64;
        let pending = Lifecycle::admitted();
        let mut late = Vec::new();
        self.queue
            .retain(|q| match pending.expire(q.call.deadline_ms, grace, wall) {
                Some(error) => {
                    late.push((q.call.clone(), error));
                    false
                }
                None => true,
            });
        for (call, error) in late {
            self.fail(call, error, out);
        }
        let running = Lifecycle {
            state: CallState::Running,
            epoch: 1,
            worker: None,
        };
        let late: Vec<String> = self
            .running
            .iter()
            .filter(|(_, r)| running.expire(r.call.deadline_ms, grace, wall).is_some())
            .map(|(id, _)| id.clone())
            .collect();
        for id in late {
            if let Some(r) = self.release(&id) {
                if self.is_current(&r.worker, r.session) {
                    out.push(Command::Cancel {
                        worker: r.worker.clone(),
                        session: r.session,
                        call_id: id.clone(),
                        epoch: r.epoch,
                        reason: "deadline passed".into(),
                    });
                }
                let error = running
                    .expire(r.call.deadline_ms, grace, wall)
                    .unwrap_or_else(|| CallError::new(ErrorKind::Timeout, "deadline passed"));
                self.fail(r.call, error, out);
            }
        }

        for fencing in self.fencing.values_mut() {
            if fencing.retry_at.is_some_and(|t| t <= now) {
                fencing.retry_at = None;
                out.push(Command::Fence {
                    call: fencing.call.clone(),
                    epoch: fencing.epoch,
                    reason: fencing.reason.clone(),
                });
            }
        }
        for failing in self.failing.values_mut() {
            if failing.retry_at.is_some_and(|t| t <= now) {
                failing.retry_at = None;
                out.push(Command::Fail {
                    call: failing.call.clone(),
                    error: failing.error.clone(),
                });
            }
        }
    }

    /// Hands queued calls to free slots, preferring a worker that has the release compiled.
    fn dispatch(&mut self, now: Instant, out: &mut Vec<Command>) {
        let mut index = 0;
        while index < self.queue.len() {
            let queued = &self.queue[index];
            if queued.not_before.is_some_and(|t| t > now) {
                index += 1;
                continue;
            }
            let record = queued.call.record.clone();
            let writes = queued.call.writes();
            if !self.writers.may_assign(writes.as_ref(), &record.id) {
                // Another call writes its workspace: it waits, the calls behind it do not.
                index += 1;
                continue;
            }
            let Some((worker, session)) = self.pick(&record) else {
                index += 1;
                continue;
            };
            let Some(queued) = self.queue.remove(index) else {
                break;
            };
            let id = record.id.clone();
            self.writers.take(writes.as_ref(), &id);
            if let Some(w) = self.workers.get_mut(&worker) {
                w.busy.insert(id.clone());
                w.cached.insert(record.release_digest.clone());
            }
            self.running.insert(
                id,
                Running {
                    call: queued.call.clone(),
                    worker: worker.clone(),
                    session,
                    epoch: 0,
                },
            );
            out.push(Command::Assign {
                call: queued.call,
                worker,
                session,
            });
        }
    }

    /// The best worker with a free slot for a call, within the release's instance limit.
    fn pick(&self, record: &CallRecord) -> Option<(String, u64)> {
        self.place(&Placement::of(record))
    }

    fn place(&self, placement: &Placement<'_>) -> Option<(String, u64)> {
        let limit = placement.instances;
        if limit > 0 {
            let running = self
                .running
                .values()
                .filter(|r| r.call.record.release == placement.release)
                .count()
                + self.reserved.len();
            if running >= limit as usize {
                return None;
            }
        }
        self.workers
            .iter()
            .filter(|(_, w)| w.pool == placement.pool && (w.busy.len() as u32) < w.slots)
            .min_by_key(|(id, w)| {
                (
                    !w.cached.contains(placement.digest),
                    w.busy.len(),
                    (*id).clone(),
                )
            })
            .map(|(id, w)| (id.clone(), w.session))
    }

    /// Reserves a slot for a call about to be admitted, so that admission and assignment
    /// are one commit. Returns the worker, or `None` when the call must queue.
    pub fn reserve(&mut self, call: &NewCall) -> Option<String> {
        if !self.queue.is_empty() {
            // Calls already waiting go first.
            return None;
        }
        let writes = WorkspaceKey::written_by(&call.namespace, &call.spec.access);
        if !self.writers.may_assign(writes.as_ref(), &call.id) {
            return None;
        }
        let placement = Placement {
            pool: &call.spec.pool,
            release: &call.release,
            digest: &call.release_digest,
            instances: call.spec.limits.instances,
        };
        let (worker, session) = self.place(&placement)?;
        self.writers.take(writes.as_ref(), &call.id);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.busy.insert(call.id.clone());
            w.cached.insert(call.release_digest.clone());
        }
        self.reserved
            .insert(call.id.clone(), (worker.clone(), session));
        Some(worker)
    }

    /// Holds workspace `key` for `holder` (a writer that is no call, such as a result file
    /// written for a call that has ended), as a read-write call holds it: false while
    /// another holds it. Calls that would write it wait until [`State::release_workspace`].
    pub fn hold_workspace(&mut self, key: &WorkspaceKey, holder: &str) -> bool {
        self.writers.take(Some(key), holder)
    }

    /// Gives back what [`State::hold_workspace`] held.
    pub fn release_workspace(&mut self, holder: &str) {
        self.writers.release(holder);
    }

    /// Gives back a reservation that was not used (the call was a duplicate, or the write
    /// failed).
    pub fn unreserve(&mut self, call_id: &str) {
        self.writers.release(call_id);
        if let Some((worker, _)) = self.reserved.remove(call_id)
            && let Some(w) = self.workers.get_mut(&worker)
        {
            w.busy.remove(call_id);
        }
    }

    /// When the state machine next needs a [`Event::Tick`], if nothing else happens first.
    pub fn next_wake(&self) -> Option<Instant> {
        let leases = self.workers.values().map(|w| w.lease_until);
        let orphans = self.orphans.values().filter_map(|o| o.until);
        let queued = self.queue.iter().filter_map(|q| q.not_before);
        let fences = self.fencing.values().filter_map(|f| f.retry_at);
        let fails = self.failing.values().filter_map(|f| f.retry_at);
        leases
            .chain(orphans)
            .chain(queued)
            .chain(fences)
            .chain(fails)
            .min()
    }

    /// The earliest wall-clock deadline (Unix ms) of a call this scheduler tracks, plus
    /// grace for running ones: when a deadline must be checked.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        let grace = self.timing.deadline_grace.as_millis() as i64;
        let queued = self
            .queue
            .iter()
            .map(|q| q.call.deadline_ms)
            .filter(|d| *d > 0);
        let running = self
            .running
            .values()
            .map(|r| r.call.deadline_ms)
            .filter(|d| *d > 0)
            .map(|d| d + grace);
        queued.chain(running).min()
    }

    /// The call, when worker session `session` of `worker` holds it under `epoch` (it was
    /// assigned to that session, and the assignment is written); otherwise why not.
    pub fn holding(
        &self,
        call_id: &str,
        worker: &str,
        session: u64,
        epoch: u64,
    ) -> Result<Call, Refusal> {
        let running = self
            .running
            .get(call_id)
            .filter(|r| r.worker == worker && r.session == session && r.epoch > 0)
            .filter(|_| self.is_current(worker, session))
            .ok_or(Refusal::NotHeld)?;
        if running.epoch != epoch {
            return Err(Refusal::StaleEpoch);
        }
        Ok(running.call.clone())
    }

    pub fn is_session(&self, worker: &str, session: u64) -> bool {
        self.is_current(worker, session)
    }

    pub fn workers(&self) -> Vec<WorkerInfo> {
        let mut workers: Vec<_> = self
            .workers
            .iter()
            .map(|(id, w)| WorkerInfo {
                id: id.clone(),
                pool: w.pool.clone(),
                slots: w.slots,
                busy: w.busy.len() as u32,
            })
            .collect();
        workers.sort_by(|a, b| a.id.cmp(&b.id));
        workers
    }

    /// Calls waiting for a slot, by pool.
    pub fn queued(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for q in &self.queue {
            *out.entry(q.call.record.spec.pool.clone()).or_default() += 1;
        }
        out
    }

    /// Calls of a release not yet ended that this scheduler tracks.
    pub fn calls_of_release(&self, namespace: &str, release: &str) -> usize {
        let matches = |c: &Call| c.record.namespace == namespace && c.record.release == release;
        self.queue.iter().filter(|q| matches(&q.call)).count()
            + self.running.values().filter(|r| matches(&r.call)).count()
            + self.orphans.values().filter(|o| matches(&o.call)).count()
            + self.fencing.values().filter(|f| matches(&f.call)).count()
    }

    /// Whether workers of a previous control plane may still be re-attaching.
    pub fn reattaching(&self, now: Instant) -> bool {
        match self.listening_since {
            None => true,
            Some(since) => now < since + self.timing.reattach_grace,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{CallSpec, RunLimits};

    fn timing() -> Timing {
        Timing {
            lease: Duration::from_secs(2),
            reattach_grace: Duration::from_secs(5),
            deadline_grace: Duration::from_secs(5),
            retry_backoff: Duration::from_millis(200),
        }
    }

    fn record(id: &str, state: CallState, epoch: u64, worker: Option<&str>) -> CallRecord {
        CallRecord {
            id: id.into(),
            namespace: "default".into(),
            tool: "t".into(),
            command: "c".into(),
            release: "t-1".into(),
            release_digest: "sha256:1".into(),
            state,
            args: serde_json::json!({}),
            spec: CallSpec {
                pool: "default/default".into(),
                limits: RunLimits::default(),
                // Far away unless a test sets it.
                deadline_ms: crate::call::now_ms() + 3_600_000,
                ..CallSpec::default()
            },
            stdin: Vec::new(),
            idempotency_key: None,
            request_hash: String::new(),
            epoch,
            worker: worker.map(String::from),
            result: None,
            error: None,
            created_at_ms: 0,
            finished_at_ms: None,
        }
    }

    fn pending(id: &str) -> Call {
        Call::new(record(id, CallState::Pending, 0, None), None)
    }

    fn attach(state: &mut State, worker: &str, slots: u32, now: Instant) -> (u64, Vec<Command>) {
        attach_as(state, worker, slots, now, None)
    }

    /// Attaches `worker`, whose sessions all get the secret `WORKER-secret`, presenting
    /// `resume` as the proof of being the same worker.
    fn attach_as(
        state: &mut State,
        worker: &str,
        slots: u32,
        now: Instant,
        resume: Option<&str>,
    ) -> (u64, Vec<Command>) {
        let commands = state.on(
            Event::Attach {
                worker: worker.into(),
                pool: "default/default".into(),
                slots,
                cached: Vec::new(),
                in_flight: Vec::new(),
                secret: format!("{worker}-secret"),
                resume: resume.map(String::from),
            },
            now,
        );
        let session = commands
            .iter()
            .find_map(|c| match c {
                Command::Registered { session, .. } => Some(*session),
                _ => None,
            })
            .expect("registered");
        (session, commands)
    }

    fn assigns(commands: &[Command]) -> Vec<(String, String)> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Assign { call, worker, .. } => {
                    Some((call.record.id.clone(), worker.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn fences(commands: &[Command]) -> Vec<(String, u64)> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Fence { call, epoch, .. } => Some((call.record.id.clone(), *epoch)),
                _ => None,
            })
            .collect()
    }

    fn fails(commands: &[Command]) -> Vec<(String, ErrorKind)> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Fail { call, error } => Some((call.record.id.clone(), error.kind)),
                _ => None,
            })
            .collect()
    }

    /// A call assigned to `worker` and written at epoch 1.
    fn running_on(state: &mut State, id: &str, worker: &str, now: Instant) -> Vec<Command> {
        let out = state.on(Event::Submitted(pending(id)), now);
        assert_eq!(assigns(&out), [(id.to_string(), worker.to_string())]);
        state.on(
            Event::Assigned {
                call_id: id.into(),
                epoch: 1,
            },
            now,
        )
    }

    #[test]
    fn a_call_goes_to_a_free_slot_and_waits_when_there_is_none() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let out = state.on(Event::Submitted(pending("a")), t0);
        assert!(assigns(&out).is_empty(), "no worker yet");
        assert_eq!(state.queued().values().sum::<usize>(), 1);
        let (_, out) = attach(&mut state, "w1", 1, t0);
        assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
        let out = state.on(Event::Submitted(pending("b")), t0);
        assert!(assigns(&out).is_empty(), "the only slot is busy");
        let out = state.on(
            Event::Assigned {
                call_id: "a".into(),
                epoch: 1,
            },
            t0,
        );
        assert!(matches!(out.as_slice(), [Command::Send { epoch: 1, .. }]));
        let out = state.on(
            Event::Finished {
                call_id: "a".into(),
            },
            t0,
        );
        assert_eq!(assigns(&out), [("b".to_string(), "w1".to_string())]);
    }

    #[test]
    fn a_lost_worker_has_its_calls_fenced_and_reassigned() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 1, t0);
        running_on(&mut state, "a", "w1", t0);
        let out = state.on(
            Event::Detached {
                worker: "w1".into(),
                session: s1,
                reason: "stream closed".into(),
            },
            t0,
        );
        assert_eq!(fences(&out), [("a".to_string(), 1)]);
        let (_, out) = attach(&mut state, "w2", 1, t0);
        assert!(assigns(&out).is_empty(), "not before the fence is written");
        let out = state.on(
            Event::Fenced {
                call_id: "a".into(),
            },
            t0,
        );
        assert_eq!(assigns(&out), [("a".to_string(), "w2".to_string())]);
    }

    #[test]
    fn a_silent_worker_loses_its_lease_at_the_lease_and_not_before() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (session, _) = attach(&mut state, "w1", 1, t0);
        running_on(&mut state, "a", "w1", t0);
        assert_eq!(state.next_wake(), Some(t0 + Duration::from_secs(2)));
        let t1 = t0 + Duration::from_millis(1500);
        state.on(
            Event::Heartbeat {
                worker: "w1".into(),
                session,
                cached: Vec::new(),
            },
            t1,
        );
        let out = state.on(Event::Tick, t0 + Duration::from_millis(3000));
        assert!(fences(&out).is_empty(), "the heartbeat renewed the lease");
        let out = state.on(Event::Tick, t1 + Duration::from_secs(2));
        assert_eq!(fences(&out), [("a".to_string(), 1)]);
        assert!(
            out.iter()
                .any(|c| matches!(c, Command::EndSession { session: s, .. } if *s == session))
        );
        assert!(state.workers().is_empty());
    }

    #[test]
    fn an_abandoned_call_is_fenced_at_once_but_only_for_its_holder() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (session, _) = attach(&mut state, "w1", 2, t0);
        running_on(&mut state, "a", "w1", t0);
        let stale = state.on(
            Event::Abandoned {
                worker: "w1".into(),
                session,
                call_id: "a".into(),
                epoch: 7,
                reason: "x".into(),
            },
            t0,
        );
        assert!(fences(&stale).is_empty(), "a stale epoch changes nothing");
        let out = state.on(
            Event::Abandoned {
                worker: "w1".into(),
                session,
                call_id: "a".into(),
                epoch: 1,
                reason: "commit unacknowledged".into(),
            },
            t0,
        );
        assert_eq!(fences(&out), [("a".to_string(), 1)]);
        let out = state.on(
            Event::Fenced {
                call_id: "a".into(),
            },
            t0,
        );
        assert_eq!(
            assigns(&out),
            [("a".to_string(), "w1".to_string())],
            "the slot was freed; the worker itself is still alive"
        );
    }

    #[test]
    fn a_store_error_keeps_the_call_and_retries_with_backoff() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        attach(&mut state, "w1", 1, t0);
        state.on(Event::Submitted(pending("a")), t0);
        let out = state.on(
            Event::AssignFailed {
                call_id: "a".into(),
            },
            t0,
        );
        assert!(assigns(&out).is_empty(), "not again at once");
        let wake = state.next_wake().expect("a retry is due");
        assert_eq!(wake, t0 + Duration::from_millis(200));
        let out = state.on(Event::Tick, wake);
        assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
        let out = state.on(
            Event::AssignFailed {
                call_id: "a".into(),
            },
            wake,
        );
        assert!(assigns(&out).is_empty());
        assert_eq!(state.next_wake(), Some(wake + Duration::from_millis(400)));

        // A failed fence and a failed failure are retried too, never dropped.
        let t1 = t0 + Duration::from_secs(1);
        let out = state.on(Event::Tick, t1);
        assert_eq!(assigns(&out).len(), 1);
        let out = state.on(
            Event::Assigned {
                call_id: "a".into(),
                epoch: 1,
            },
            t1,
        );
        assert!(matches!(out.as_slice(), [Command::Send { .. }]));
        let out = state.on(
            Event::FenceFailed {
                call_id: "a".into(),
            },
            t1,
        );
        assert!(out.is_empty(), "not fencing: nothing to retry");
    }

    #[test]
    fn deadlines_fail_queued_calls_and_cancel_running_ones_after_grace() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let mut late = record("q", CallState::Pending, 0, None);
        late.spec.deadline_ms = crate::call::now_ms() - 1;
        let out = state.on(Event::Submitted(Call::new(late, None)), t0);
        assert_eq!(fails(&out), [("q".to_string(), ErrorKind::Timeout)]);
        let out = state.on(
            Event::FailFailed {
                call_id: "q".into(),
            },
            t0,
        );
        assert!(fails(&out).is_empty());
        let out = state.on(Event::Tick, t0 + Duration::from_secs(1));
        assert_eq!(
            fails(&out),
            [("q".to_string(), ErrorKind::Timeout)],
            "retried"
        );
        state.on(
            Event::Finished {
                call_id: "q".into(),
            },
            t0,
        );
    }

    #[test]
    fn a_running_call_past_deadline_and_grace_is_cancelled_and_failed() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        attach(&mut state, "w1", 1, t0);
        running_on(&mut state, "a", "w1", t0);
        // Age the call: its deadline moves into the past beyond the grace.
        if let Some(r) = state.running.get_mut("a") {
            let mut aged = (*r.call.record).clone();
            aged.spec.deadline_ms = crate::call::now_ms() - 6_000;
            r.call.deadline_ms = aged.spec.deadline_ms;
            r.call.record = Arc::new(aged);
        }
        let out = state.on(Event::Tick, t0);
        assert!(
            out.iter()
                .any(|c| matches!(c, Command::Cancel { call_id, epoch: 1, .. } if call_id == "a"))
        );
        assert_eq!(fails(&out), [("a".to_string(), ErrorKind::Timeout)]);
        assert_eq!(state.workers()[0].busy, 0, "the slot is free again");
    }

    #[test]
    fn a_late_result_of_a_fenced_call_is_not_held() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 1, t0);
        running_on(&mut state, "a", "w1", t0);
        assert!(state.holding("a", "w1", s1, 1).is_ok());
        state.on(
            Event::Detached {
                worker: "w1".into(),
                session: s1,
                reason: "x".into(),
            },
            t0,
        );
        assert!(
            state.holding("a", "w1", s1, 1).err() == Some(Refusal::NotHeld),
            "its result goes to the store, which refuses it"
        );
        state.on(
            Event::Fenced {
                call_id: "a".into(),
            },
            t0,
        );
        let (s2, _) = attach(&mut state, "w2", 1, t0);
        state.on(
            Event::Assigned {
                call_id: "a".into(),
                epoch: 3,
            },
            t0,
        );
        assert!(state.holding("a", "w2", s2, 3).is_ok());
        assert!(
            state.holding("a", "w2", s2, 2).err() == Some(Refusal::StaleEpoch),
            "a stale epoch holds nothing"
        );
    }

    #[test]
    fn recovered_calls_wait_for_their_worker_from_when_the_port_listens() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let orphan = record("a", CallState::Running, 1, Some("w1"));
        state.on(Event::Recovered(vec![orphan.clone()]), t0);
        assert!(state.reattaching(t0));
        // The catalog takes a minute to sync: the grace has not started.
        let t1 = t0 + Duration::from_secs(60);
        let out = state.on(Event::Tick, t1);
        assert!(fences(&out).is_empty());
        state.on(Event::Listening, t1);
        assert_eq!(state.next_wake(), Some(t1 + Duration::from_secs(5)));

        // Its worker re-attaches in time and keeps it.
        let out = state.on(
            Event::Attach {
                worker: "w1".into(),
                pool: "default/default".into(),
                slots: 1,
                cached: Vec::new(),
                in_flight: vec![Reported {
                    call_id: "a".into(),
                    epoch: 1,
                    stored: Some(orphan),
                }],
                secret: "w1-secret".into(),
                resume: None,
            },
            t1 + Duration::from_secs(1),
        );
        let session = match &out[0] {
            Command::Registered {
                abandon, session, ..
            } if abandon.is_empty() => *session,
            other => panic!("{other:?}"),
        };
        assert!(state.holding("a", "w1", session, 1).is_ok());
        for secs in [2, 4] {
            state.on(
                Event::Heartbeat {
                    worker: "w1".into(),
                    session,
                    cached: Vec::new(),
                },
                t1 + Duration::from_secs(secs),
            );
        }
        let out = state.on(Event::Tick, t1 + Duration::from_millis(5500));
        assert!(
            fences(&out).is_empty(),
            "adopted: the grace no longer applies"
        );
        assert!(state.holding("a", "w1", session, 1).is_ok());
    }

    #[test]
    fn an_orphan_whose_worker_does_not_return_is_fenced_after_grace() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        state.on(Event::Listening, t0);
        let orphan = record("a", CallState::Running, 4, Some("w1"));
        state.on(Event::Recovered(vec![orphan]), t0);
        let out = state.on(Event::Tick, t0 + Duration::from_secs(4));
        assert!(fences(&out).is_empty());
        let out = state.on(Event::Tick, t0 + Duration::from_secs(5));
        assert_eq!(fences(&out), [("a".to_string(), 4)]);
    }

    #[test]
    fn a_worker_of_another_pool_cannot_claim_a_call_by_its_worker_id() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        state.on(Event::Listening, t0);
        let orphan = record("a", CallState::Running, 1, Some("w1"));
        state.on(Event::Recovered(vec![orphan.clone()]), t0);
        let out = state.on(
            Event::Attach {
                worker: "w1".into(),
                pool: "team/other".into(),
                slots: 1,
                cached: Vec::new(),
                in_flight: vec![Reported {
                    call_id: "a".into(),
                    epoch: 1,
                    stored: Some(orphan),
                }],
                secret: "w1-secret".into(),
                resume: None,
            },
            t0,
        );
        let session = match &out[0] {
            Command::Registered {
                abandon, session, ..
            } if abandon == &["a".to_string()] => *session,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            state.holding("a", "w1", session, 1).err(),
            Some(Refusal::NotHeld)
        );
    }

    #[test]
    fn a_reattaching_worker_gives_up_calls_the_store_moved_on() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        state.on(Event::Listening, t0);
        let out = state.on(
            Event::Attach {
                worker: "w1".into(),
                pool: "default/default".into(),
                slots: 1,
                cached: Vec::new(),
                in_flight: vec![Reported {
                    call_id: "a".into(),
                    epoch: 1,
                    stored: Some(record("a", CallState::Running, 2, Some("w2"))),
                }],
                secret: "w1-secret".into(),
                resume: None,
            },
            t0,
        );
        assert!(
            matches!(&out[0], Command::Registered { abandon, .. } if abandon == &["a".to_string()])
        );
        assert_eq!(state.workers()[0].busy, 0);
    }

    #[test]
    fn a_second_session_of_a_worker_replaces_the_first_and_takes_back_unreported_calls() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 2, t0);
        running_on(&mut state, "a", "w1", t0);
        let (s2, out) = attach_as(&mut state, "w1", 2, t0, Some("w1-secret"));
        assert_ne!(s1, s2);
        assert!(
            out.iter()
                .any(|c| matches!(c, Command::EndSession { session, .. } if *session == s1))
        );
        assert_eq!(fences(&out), [("a".to_string(), 1)]);
        assert!(!state.is_session("w1", s1));
        // The old session's end changes nothing now.
        let out = state.on(
            Event::Detached {
                worker: "w1".into(),
                session: s1,
                reason: "closed".into(),
            },
            t0,
        );
        assert!(fences(&out).is_empty());
        assert!(state.is_session("w1", s2));
    }

    #[test]
    fn admission_and_assignment_in_one_commit_uses_the_reserved_slot() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (session, _) = attach(&mut state, "w1", 1, t0);
        let new = crate::call::NewCall {
            id: "a".into(),
            namespace: "default".into(),
            tool: "t".into(),
            command: "c".into(),
            release: "t-1".into(),
            release_digest: "sha256:1".into(),
            args: serde_json::json!({}),
            spec: record("a", CallState::Pending, 0, None).spec,
            stdin: Vec::new(),
            idempotency_key: None,
            request_hash: String::new(),
            started: crate::call::CallStarted {
                namespace: "default".into(),
                tool: "t".into(),
                command: "c".into(),
                release: "t-1".into(),
                version: "1.0.0".into(),
                digest: "sha256:1".into(),
                args: serde_json::json!({}),
                argv: Vec::new(),
                stdin_bytes: 0,
                idempotency_key: None,
                dry_run: false,
                middleware: Vec::new(),
            },
            assign_to: None,
            repeat_window_ms: None,
            dry_run_result: None,
        };
        assert_eq!(state.reserve(&new).as_deref(), Some("w1"));
        let mut other = new.clone();
        other.id = "b".into();
        assert_eq!(state.reserve(&other), None, "the only slot is reserved");
        let out = state.on(
            Event::AdmittedAssigned {
                call: Call::new(record("a", CallState::Running, 1, Some("w1")), None),
                epoch: 1,
            },
            t0,
        );
        assert!(matches!(out.as_slice(), [Command::Send { epoch: 1, .. }]));
        assert!(state.holding("a", "w1", session, 1).is_ok());
        state.unreserve("zzz");
        assert_eq!(state.workers()[0].busy, 1);
    }

    #[test]
    fn a_session_may_act_only_on_calls_it_holds_under_their_epoch() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 1, t0);
        let (s2, _) = attach(&mut state, "w2", 1, t0);
        // Queued while the assignment is being written: nobody holds it yet.
        let out = state.on(Event::Submitted(pending("a")), t0);
        let holder = assigns(&out)[0].1.clone();
        let (holder_session, rogue, rogue_session) = if holder == "w1" {
            (s1, "w2", s2)
        } else {
            (s2, "w1", s1)
        };
        assert_eq!(
            state.holding("a", &holder, holder_session, 0).err(),
            Some(Refusal::NotHeld)
        );
        state.on(
            Event::Assigned {
                call_id: "a".into(),
                epoch: 1,
            },
            t0,
        );
        assert!(state.holding("a", &holder, holder_session, 1).is_ok());
        assert_eq!(
            state.holding("a", &holder, holder_session, 2).err(),
            Some(Refusal::StaleEpoch)
        );
        assert_eq!(
            state.holding("a", rogue, rogue_session, 1).err(),
            Some(Refusal::NotHeld),
            "another worker's call"
        );
        assert_eq!(
            state.holding("a", &holder, holder_session + 100, 1).err(),
            Some(Refusal::NotHeld),
            "another session of the holder"
        );
        assert_eq!(
            state.holding("zzz", &holder, holder_session, 1).err(),
            Some(Refusal::NotHeld)
        );
        // The rogue cannot give the call up either: nothing is fenced, the holder keeps it.
        let out = state.on(
            Event::Abandoned {
                worker: rogue.into(),
                session: rogue_session,
                call_id: "a".into(),
                epoch: 1,
                reason: "forged".into(),
            },
            t0,
        );
        assert!(fences(&out).is_empty());
        assert!(state.holding("a", &holder, holder_session, 1).is_ok());
        assert_eq!(Refusal::NotHeld.as_str(), "not-held");
        assert_eq!(Refusal::StaleEpoch.to_string(), "stale-epoch");
    }

    #[test]
    fn a_same_id_newcomer_without_the_session_secret_is_refused_and_changes_nothing() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 1, t0);
        running_on(&mut state, "a", "w1", t0);
        for resume in [None, Some("w2-secret"), Some("w1-secre")] {
            let out = state.on(
                Event::Attach {
                    worker: "w1".into(),
                    pool: "default/default".into(),
                    slots: 8,
                    cached: Vec::new(),
                    in_flight: vec![Reported {
                        call_id: "a".into(),
                        epoch: 1,
                        stored: Some(record("a", CallState::Running, 1, Some("w1"))),
                    }],
                    secret: "rogue-secret".into(),
                    resume: resume.map(String::from),
                },
                t0 + Duration::from_millis(500),
            );
            assert!(
                matches!(out.as_slice(), [Command::RefuseAttach { session, .. }] if *session == s1),
                "{resume:?}: {out:?}"
            );
            assert!(state.is_session("w1", s1));
            assert!(state.holding("a", "w1", s1, 1).is_ok());
            assert_eq!(state.workers()[0].slots, 1);
        }
        // Once the first session is dead (its lease lapsed), the id is free again.
        let later = t0 + Duration::from_secs(3);
        let (s2, out) = attach(&mut state, "w1", 1, later);
        assert_ne!(s1, s2);
        assert_eq!(fences(&out), [("a".to_string(), 1)]);
        assert!(state.is_session("w1", s2));
    }

    fn with_fs(id: &str, agent: &str, filesystem: crate::call::Filesystem) -> Call {
        let mut r = record(id, CallState::Pending, 0, None);
        r.spec.access = crate::call::CallAccess {
            agent: Some(agent.into()),
            filesystem,
            ..Default::default()
        };
        Call::new(r, None)
    }

    fn submit_ids(state: &mut State, calls: Vec<Call>, now: Instant) -> Vec<String> {
        let mut ids = Vec::new();
        for call in calls {
            ids.extend(
                assigns(&state.on(Event::Submitted(call), now))
                    .into_iter()
                    .map(|(id, _)| id),
            );
        }
        ids
    }

    #[test]
    fn read_write_calls_of_one_workspace_run_one_at_a_time_and_others_do_not_wait() {
        use crate::call::Filesystem::{ReadOnly, ReadWrite};
        let t0 = Instant::now();
        let mut state = State::new(timing());
        attach(&mut state, "w1", 8, t0);
        let ids = submit_ids(
            &mut state,
            vec![
                with_fs("w-a1", "a", ReadWrite),
                with_fs("w-a2", "a", ReadWrite),
                with_fs("r-a", "a", ReadOnly),
                with_fs("w-b", "b", ReadWrite),
                pending("plain"),
            ],
            t0,
        );
        assert_eq!(ids, ["w-a1", "r-a", "w-b", "plain"], "w-a2 waits for w-a1");
        state.on(
            Event::Assigned {
                call_id: "w-a1".into(),
                epoch: 1,
            },
            t0,
        );
        let out = state.on(
            Event::Finished {
                call_id: "w-a1".into(),
            },
            t0,
        );
        assert_eq!(assigns(&out), [("w-a2".to_string(), "w1".to_string())]);
    }

    #[test]
    fn a_writer_keeps_its_workspace_while_it_is_fenced_and_reassigned() {
        use crate::call::Filesystem::ReadWrite;
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 1, t0);
        let ids = submit_ids(&mut state, vec![with_fs("first", "a", ReadWrite)], t0);
        assert_eq!(ids, ["first"]);
        state.on(
            Event::Assigned {
                call_id: "first".into(),
                epoch: 1,
            },
            t0,
        );
        let out = state.on(
            Event::Detached {
                worker: "w1".into(),
                session: s1,
                reason: "killed".into(),
            },
            t0,
        );
        assert_eq!(fences(&out), [("first".to_string(), 1)]);
        // A second writer arrives while the first is being fenced, and a worker frees up.
        let (_, out) = attach(&mut state, "w2", 2, t0);
        assert!(assigns(&out).is_empty());
        let ids = submit_ids(&mut state, vec![with_fs("second", "a", ReadWrite)], t0);
        assert!(
            ids.is_empty(),
            "the fenced writer still holds the workspace"
        );
        let out = state.on(
            Event::Fenced {
                call_id: "first".into(),
            },
            t0,
        );
        assert_eq!(assigns(&out), [("first".to_string(), "w2".to_string())]);
        let out = state.on(
            Event::Finished {
                call_id: "first".into(),
            },
            t0,
        );
        assert_eq!(assigns(&out), [("second".to_string(), "w2".to_string())]);
    }

    #[test]
    fn admission_does_not_reserve_a_slot_for_a_second_writer() {
        use crate::call::Filesystem::{ReadOnly, ReadWrite};
        let t0 = Instant::now();
        let mut state = State::new(timing());
        attach(&mut state, "w1", 4, t0);
        let new = |id: &str, fs| {
            let call = with_fs(id, "a", fs);
            NewCall {
                id: id.into(),
                namespace: call.record.namespace.clone(),
                tool: "t".into(),
                command: "c".into(),
                release: "t-1".into(),
                release_digest: "sha256:1".into(),
                args: serde_json::json!({}),
                spec: call.record.spec.clone(),
                stdin: Vec::new(),
                idempotency_key: None,
                request_hash: String::new(),
                started: crate::call::CallStarted {
                    namespace: "default".into(),
                    tool: "t".into(),
                    command: "c".into(),
                    release: "t-1".into(),
                    version: "1.0.0".into(),
                    digest: "sha256:1".into(),
                    args: serde_json::json!({}),
                    argv: Vec::new(),
                    stdin_bytes: 0,
                    idempotency_key: None,
                    dry_run: false,
                    middleware: Vec::new(),
                },
                assign_to: None,
                repeat_window_ms: None,
                dry_run_result: None,
            }
        };
        assert!(state.reserve(&new("one", ReadWrite)).is_some());
        assert!(state.reserve(&new("two", ReadWrite)).is_none());
        assert!(state.reserve(&new("reader", ReadOnly)).is_some());
        state.unreserve("one");
        assert!(state.reserve(&new("two", ReadWrite)).is_some());
    }

    #[test]
    fn after_a_restart_a_writer_assigned_before_goes_before_one_never_assigned() {
        use crate::call::Filesystem::ReadWrite;
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let mut fresh = with_fs("fresh", "a", ReadWrite).record.as_ref().clone();
        fresh.created_at_ms = 1;
        let mut fenced = with_fs("fenced", "a", ReadWrite).record.as_ref().clone();
        fenced.epoch = 2;
        state.on(Event::Recovered(vec![fresh, fenced]), t0);
        let (_, out) = attach(&mut state, "w1", 4, t0);
        assert_eq!(assigns(&out), [("fenced".to_string(), "w1".to_string())]);
    }

    #[test]
    fn a_call_to_retry_is_taken_back_and_queued_again_after_its_backoff() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 1, t0);
        running_on(&mut state, "a", "w1", t0);
        let retrying = |session: u64, epoch: u64| Event::Retrying {
            worker: "w1".into(),
            session,
            call_id: "a".into(),
            epoch,
            backoff: Duration::from_secs(1),
            reason: "attempt 1 failed".into(),
        };
        // Only the session holding the call under that epoch may send it back.
        assert!(fences(&state.on(retrying(s1 + 7, 1), t0)).is_empty());
        assert!(fences(&state.on(retrying(s1, 2), t0)).is_empty());
        let out = state.on(retrying(s1, 1), t0);
        assert_eq!(fences(&out), [("a".to_string(), 1)]);
        assert!(assigns(&out).is_empty());
        // Fenced: it waits out its backoff, though its worker's slot is free.
        let out = state.on(
            Event::Fenced {
                call_id: "a".into(),
            },
            t0,
        );
        assert!(assigns(&out).is_empty(), "not before the backoff");
        assert_eq!(state.queued().values().sum::<usize>(), 1);
        assert_eq!(state.next_wake(), Some(t0 + Duration::from_secs(1)));
        let other = state.on(
            Event::Submitted(pending("b")),
            t0 + Duration::from_millis(10),
        );
        assert_eq!(
            assigns(&other),
            [("b".to_string(), "w1".to_string())],
            "the waiting call does not hold the slot"
        );
        state.on(
            Event::Finished {
                call_id: "b".into(),
            },
            t0 + Duration::from_millis(20),
        );
        let out = state.on(Event::Tick, t0 + Duration::from_millis(999));
        assert!(assigns(&out).is_empty());
        let out = state.on(Event::Tick, t0 + Duration::from_secs(1));
        assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
    }

    #[test]
    fn a_call_waiting_out_its_backoff_keeps_its_deadline() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let (s1, _) = attach(&mut state, "w1", 1, t0);
        let mut late = record("a", CallState::Pending, 0, None);
        // Far at first; it passes while the call waits out its backoff (below).
        late.spec.deadline_ms = crate::call::now_ms() + 60_000;
        let out = state.on(Event::Submitted(Call::new(late, None)), t0);
        assert_eq!(assigns(&out), [("a".to_string(), "w1".to_string())]);
        state.on(
            Event::Assigned {
                call_id: "a".into(),
                epoch: 1,
            },
            t0,
        );
        let out = state.on(
            Event::Retrying {
                worker: "w1".into(),
                session: s1,
                call_id: "a".into(),
                epoch: 1,
                backoff: Duration::from_secs(30),
                reason: "attempt 1 failed".into(),
            },
            t0,
        );
        assert_eq!(fences(&out), [("a".to_string(), 1)]);
        state.on(
            Event::Fenced {
                call_id: "a".into(),
            },
            t0,
        );
        assert!(state.next_deadline_ms().is_some());
        // The queued call's deadline moves into the past: the next look fails it.
        if let Some(q) = state.queue.iter_mut().find(|q| q.call.record.id == "a") {
            let mut record = (*q.call.record).clone();
            record.spec.deadline_ms = crate::call::now_ms() - 60_000;
            q.call = Call::new(record, None);
        }
        let out = state.on(Event::Tick, t0 + Duration::from_millis(1));
        assert_eq!(fails(&out), [("a".to_string(), ErrorKind::Timeout)]);
        assert!(assigns(&out).is_empty());
    }

    /// A running call whose tool reports progress, timeout 10 s and maxTimeout 60 s, that
    /// started 16 s ago (so its first deadline is 6 s past, beyond the grace).
    fn progressing(state: &mut State, id: &str, t0: Instant) -> i64 {
        running_on(state, id, "w1", t0);
        let now = crate::call::now_ms();
        if let Some(r) = state.running.get_mut(id) {
            let mut record = (*r.call.record).clone();
            record.spec.limits.timeout_ms = 10_000;
            record.spec.limits.max_timeout_ms = 60_000;
            record.spec.deadline_ms = now - 6_000;
            r.call = Call::new(record, None);
        }
        now
    }

    #[test]
    fn progress_moves_a_running_calls_deadline_up_to_its_max_timeout() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        attach(&mut state, "w1", 2, t0);
        let now = progressing(&mut state, "a", t0);
        state.progressed("a", now);
        assert_eq!(state.deadline_of("a"), Some(now + 10_000));
        // Progressing, it is not cut off at its first deadline.
        let out = state.on(Event::Tick, t0);
        assert!(fails(&out).is_empty(), "{out:?}");
        // However much it reports, never past started + maxTimeout.
        state.progressed("a", now + 1_000_000);
        assert_eq!(state.deadline_of("a"), Some(now - 16_000 + 60_000));
        // An older report does not move it back.
        state.progressed("a", now);
        assert_eq!(state.deadline_of("a"), Some(now + 44_000));
        // The same call without progress is cut off.
        let _ = progressing(&mut state, "b", t0);
        let out = state.on(Event::Tick, t0);
        assert_eq!(fails(&out), [("b".to_string(), ErrorKind::Timeout)]);
    }

    #[test]
    fn a_restart_keeps_the_deadline_recorded_progress_gave_a_call() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        let now = crate::call::now_ms();
        let mut pending = record("p", CallState::Pending, 2, None);
        pending.spec.limits.timeout_ms = 10_000;
        pending.spec.limits.max_timeout_ms = 60_000;
        pending.spec.deadline_ms = now - 1_000;
        let mut late = pending.clone();
        late.id = "late".into();
        state.restore_deadlines([("p".to_string(), now + 9_000)].into());
        let out = state.on(Event::Recovered(vec![pending, late]), t0);
        // Without its progress the call would have expired already; with it, it queues.
        assert_eq!(fails(&out), [("late".to_string(), ErrorKind::Timeout)]);
        assert_eq!(state.deadline_of("p"), Some(now + 9_000));
    }

    #[test]
    fn a_stopped_call_is_forgotten_and_its_worker_told_to_stop() {
        let t0 = Instant::now();
        let mut state = State::new(timing());
        attach(&mut state, "w1", 1, t0);
        running_on(&mut state, "a", "w1", t0);
        // Another call waits for the slot.
        let out = state.on(Event::Submitted(pending("b")), t0);
        assert!(assigns(&out).is_empty());
        let out = state.on(
            Event::Stopped {
                call_id: "a".into(),
                reason: "cancelled by operator:x".into(),
            },
            t0,
        );
        assert!(
            out.iter()
                .any(|c| matches!(c, Command::Cancel { call_id, epoch: 1, .. } if call_id == "a")),
            "{out:?}"
        );
        // Its slot goes to the next call at once.
        assert_eq!(assigns(&out), [("b".to_string(), "w1".to_string())]);
        // A queued call stopped is just dropped.
        let out = state.on(Event::Submitted(pending("c")), t0);
        assert!(assigns(&out).is_empty());
        let out = state.on(
            Event::Stopped {
                call_id: "c".into(),
                reason: "cancelled".into(),
            },
            t0,
        );
        assert!(!out.iter().any(|c| matches!(c, Command::Cancel { .. })));
        assert_eq!(state.queued().values().sum::<usize>(), 0);
    }
}
