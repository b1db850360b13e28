//! The scheduler's decisions, as a pure state machine.
//!
//! [`State::on`] takes one [`Event`] (a worker attached, a store write came back, time
//! passed) and the current time, updates the scheduler's view, and returns the
//! [`Command`]s that follow (write an assignment, fence a call, send a cancel). It does no IO
//! and reads no clock: its driver (`toolgrid_control_plane::scheduler`) does the IO, feeds
//! each outcome back as an event, and sleeps until [`State::next_wake`]. Tests drive it
//! with fake time. Calls, workers and epochs are [`CallId`], [`WorkerId`] and [`Epoch`].
//!
//! The queue is fair between agents ([`queue`]): a lane per agent per pool, served in
//! turns, each lane capped at admission ([`State::reserve`] refuses with [`QueueFull`]).
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

use crate::call::{CallError, CallRecord, CallState, ErrorKind, IdleDeadline, Lifecycle, NewCall};
use crate::ids::{CallId, Epoch, WorkerId};
use crate::interface::CommandInterface;
use crate::secret::secrets_match;
use crate::workspace::{WorkspaceKey, WriteLocks};
use queue::Queued;
pub use queue::{DEFAULT_MAX_PER_AGENT, Lane, Party, QUEUE_FULL_RETRY_AFTER_MS, QueueFull};
use std::collections::{BTreeSet, HashMap, HashSet};
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
    /// `record.id`, as the state machine speaks it.
    id: CallId,
}

impl Call {
    pub fn new(record: CallRecord, interface: Option<Arc<CommandInterface>>) -> Self {
        Call {
            deadline_ms: record.spec.deadline_ms,
            id: CallId::from(record.id.as_str()),
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

    /// The call's id (its record's).
    pub fn id(&self) -> &CallId {
        &self.id
    }

    /// The call's epoch as the store had it when its record was read (0: never assigned).
    fn recorded_epoch(&self) -> Epoch {
        Epoch::from(self.record.epoch)
    }

    /// The workspace this call writes, if it is a read-write call of an agent.
    fn writes(&self) -> Option<WorkspaceKey> {
        WorkspaceKey::written_by(&self.record.namespace, &self.record.spec.access)
    }
}

/// A call a worker reported as still running when it attached, with the store's view of it.
pub struct Reported {
    pub call_id: CallId,
    pub epoch: Epoch,
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
        epoch: Epoch,
    },
    /// A worker opened a session.
    Attach {
        worker: WorkerId,
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
        worker: WorkerId,
        session: u64,
        cached: Vec<String>,
        /// The worker is stopping: offer it no new call.
        draining: bool,
    },
    /// An operator drains a worker (`toolgrid drain`): it is offered no new call and told
    /// to drain.
    Drain {
        worker: WorkerId,
    },
    /// A worker's stream ended.
    Detached {
        worker: WorkerId,
        session: u64,
        reason: String,
    },
    /// The store recorded an assignment.
    Assigned {
        call_id: CallId,
        epoch: Epoch,
    },
    /// The store refused an assignment: the call ended or is gone.
    AssignRefused {
        call_id: CallId,
    },
    /// The assignment could not be written, or its oplog not read: try again later.
    AssignFailed {
        call_id: CallId,
    },
    /// The call's oplog cannot be replayed: it ends as a divergence.
    ReplayUnreadable {
        call_id: CallId,
        message: String,
    },
    /// The store fenced a call; it waits for another worker.
    Fenced {
        call_id: CallId,
    },
    /// A fence was refused (the call moved on meanwhile): forget it.
    FenceRefused {
        call_id: CallId,
    },
    FenceFailed {
        call_id: CallId,
    },
    /// The call ended in the store (a completion, or a failure the scheduler wrote).
    Finished {
        call_id: CallId,
    },
    FailFailed {
        call_id: CallId,
    },
    /// The store ended the call from outside (its caller cancelled it): forget it, and
    /// tell the worker running it, if any, to stop at once.
    Stopped {
        call_id: CallId,
        reason: String,
    },
    /// The worker gave the call up (it could not commit): fence it now.
    Abandoned {
        worker: WorkerId,
        session: u64,
        call_id: CallId,
        epoch: Epoch,
        reason: String,
    },
    /// A failed attempt of the call is to run again (its `retry` entry is committed under
    /// `epoch`): take it back now and queue it once `backoff` has passed.
    Retrying {
        worker: WorkerId,
        session: u64,
        call_id: CallId,
        epoch: Epoch,
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
        worker: WorkerId,
        session: u64,
    },
    /// Tell a worker to drain (finish what it holds within its grace period, give up the
    /// rest, exit).
    Drain {
        worker: WorkerId,
        session: u64,
    },
    /// Answer a worker's `Register`.
    Registered {
        worker: WorkerId,
        session: u64,
        abandon: Vec<CallId>,
    },
    /// Write an assignment (bumping the epoch), read the oplog to replay if it is not the
    /// first, and send it to the worker's session.
    Assign {
        call: Call,
        worker: WorkerId,
        session: u64,
    },
    /// Send an assignment already written (admission and assignment in one commit).
    Send {
        call: Call,
        worker: WorkerId,
        session: u64,
        epoch: Epoch,
    },
    Fence {
        call: Call,
        epoch: Epoch,
        reason: String,
    },
    Fail {
        call: Call,
        error: CallError,
    },
    Cancel {
        worker: WorkerId,
        session: u64,
        call_id: CallId,
        epoch: Epoch,
        reason: String,
    },
    /// End a session's stream (its lease lapsed).
    EndSession {
        worker: WorkerId,
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
            Command::Drain { worker, session } => write!(f, "Drain({worker}#{session})"),
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
    busy: HashSet<CallId>,
    cached: HashSet<String>,
    lease_until: Instant,
    /// Stopping: it is offered no new call (its held calls finish on it).
    draining: bool,
}

struct Running {
    call: Call,
    worker: WorkerId,
    session: u64,
    /// [`Epoch::ZERO`] while the assignment is being written.
    epoch: Epoch,
}

/// A call whose assignment is being taken back (fence in flight, or retried at `retry_at`).
struct Fencing {
    call: Call,
    epoch: Epoch,
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
    pub id: WorkerId,
    pub pool: String,
    pub slots: u32,
    pub busy: u32,
}

pub struct State {
    timing: Timing,
    workers: HashMap<WorkerId, Worker>,
    next_session: u64,
    queue: queue::Queue,
    /// How many calls admission may put in one lane.
    max_per_agent: u32,
    /// Calls being admitted that will queue (no slot was free): each counts in its lane
    /// until it is [`Event::Submitted`] (or [`State::unreserve`]d).
    admitting: HashMap<CallId, Lane>,
    running: HashMap<CallId, Running>,
    fencing: HashMap<CallId, Fencing>,
    failing: HashMap<CallId, Failing>,
    orphans: HashMap<CallId, Orphan>,
    /// Slots reserved for calls being admitted (call id → worker, session).
    reserved: HashMap<CallId, (WorkerId, u64)>,
    /// When the worker port started listening.
    listening_since: Option<Instant>,
    /// Consecutive failed assignment writes of a call, for its backoff.
    assign_failures: HashMap<CallId, u32>,
    /// Which call writes each workspace (from its first assignment until it ends).
    writers: WriteLocks,
    /// Calls being taken back for another attempt, and how long each waits once it is.
    retry_waits: HashMap<CallId, Duration>,
    /// Deadlines the recorded progress of unfinished calls gave them, applied when they are
    /// recovered (see [`State::restore_deadlines`]).
    restored: HashMap<CallId, i64>,
}

impl State {
    pub fn new(timing: Timing) -> Self {
        State {
            timing,
            workers: HashMap::new(),
            next_session: 0,
            queue: queue::Queue::default(),
            max_per_agent: DEFAULT_MAX_PER_AGENT,
            admitting: HashMap::new(),
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

    /// At most `max` calls of one agent (one [`Lane`]) wait in a pool's queue; admission
    /// refuses more ([`State::reserve`]). At least 1.
    pub fn with_max_per_agent(mut self, max: u32) -> Self {
        self.max_per_agent = max.max(1);
        self
    }

    /// Before [`Event::Recovered`]: the deadlines (Unix ms) the progress recorded in the
    /// oplogs of unfinished calls gave them, so a restart does not cut off a call that was
    /// progressing. A deadline is never moved earlier than the spec's.
    pub fn restore_deadlines(&mut self, deadlines: HashMap<CallId, i64>) {
        self.restored = deadlines;
    }

    /// A progress report of the tool, accepted from the session holding the call (checked
    /// with [`State::holding`]) at `now_ms`: the call's idle deadline restarts, up to its
    /// `maxTimeout`.
    pub fn progressed(&mut self, call_id: &CallId, now_ms: i64) {
        if let Some(running) = self.running.get_mut(call_id) {
            running.call.progressed(now_ms);
        }
    }

    /// The deadline of a call this scheduler tracks as it stands (Unix ms).
    pub fn deadline_of(&self, call_id: &CallId) -> Option<i64> {
        self.running
            .get(call_id)
            .map(|r| r.call.deadline_ms)
            .or_else(|| self.orphans.get(call_id).map(|o| o.call.deadline_ms))
            .or_else(|| self.queue.find(call_id).map(|q| q.call.deadline_ms))
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
                    if call.recorded_epoch() > Epoch::ZERO {
                        // Assigned before the restart: it still holds its workspace.
                        self.writers
                            .take(call.writes().as_ref(), call.id().as_str());
                    }
                    if call.record.state == CallState::Running {
                        self.orphans
                            .insert(call.id().clone(), Orphan { call, until });
                    } else {
                        self.enqueue_back(call);
                    }
                }
            }
            Event::Submitted(call) => {
                self.admitting.remove(call.id());
                self.enqueue_back(call)
            }
            Event::AdmittedAssigned { call, epoch } => {
                let id = call.id().clone();
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
                draining,
            } => {
                if let Some(w) = self.workers.get_mut(&worker)
                    && w.session == session
                {
                    w.lease_until = now + self.timing.lease;
                    w.cached.extend(cached);
                    // Once draining, always (a new session starts afresh).
                    w.draining |= draining;
                }
            }
            Event::Drain { worker } => {
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.draining = true;
                    out.push(Command::Drain {
                        worker,
                        session: w.session,
                    });
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
                self.writers.release(call_id.as_str());
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
                self.writers.release(call_id.as_str());
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
                self.queue.retain(|q| q.call.id() != &call_id);
                self.writers.release(call_id.as_str());
            }
            Event::Stopped { call_id, reason } => {
                if let Some(running) = self.release(&call_id)
                    && running.epoch > Epoch::ZERO
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
                self.queue.retain(|q| q.call.id() != &call_id);
                self.writers.release(call_id.as_str());
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

    fn is_current(&self, worker: &WorkerId, session: u64) -> bool {
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
    fn release(&mut self, call_id: &CallId) -> Option<Running> {
        let running = self.running.remove(call_id)?;
        if let Some(w) = self.workers.get_mut(&running.worker) {
            w.busy.remove(call_id);
        }
        Some(running)
    }

    fn fence(&mut self, call: Call, epoch: Epoch, reason: String, out: &mut Vec<Command>) {
        if epoch == Epoch::ZERO {
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
            call.id().clone(),
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
            call.id().clone(),
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
        worker: WorkerId,
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
                    && Epoch::from(r.epoch) == reported.epoch
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
            self.writers
                .take(call.writes().as_ref(), call.id().as_str());
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
        let stale: Vec<CallId> = self
            .running
            .iter()
            .filter(|(id, r)| r.worker == worker && r.session != session && !adopted.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        // So are the calls a previous control plane left running on it that it does not
        // report (it gave them up when its stream broke): no need to wait out the grace.
        let unreported: Vec<CallId> = self
            .orphans
            .iter()
            .filter(|(id, o)| {
                o.call.record.worker.as_deref() == Some(worker.as_str()) && !adopted.contains(*id)
            })
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
                draining: false,
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
        for id in unreported {
            if let Some(orphan) = self.orphans.remove(&id) {
                let epoch = orphan.call.recorded_epoch();
                let reason = format!("worker {worker} re-attached without it");
                self.fence(orphan.call, epoch, reason, out);
            }
        }
    }

    fn lose_worker(
        &mut self,
        worker: &WorkerId,
        session: u64,
        reason: &str,
        out: &mut Vec<Command>,
    ) {
        if !self.is_current(worker, session) {
            return;
        }
        self.workers.remove(worker);
        out.push(Command::EndSession {
            worker: worker.clone(),
            session,
        });
        let lost: Vec<CallId> = self
            .running
            .iter()
            .filter(|(_, r)| r.worker == *worker && r.session == session && r.epoch > Epoch::ZERO)
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
            .retain(|_, (w, s)| !(*w == *worker && *s == session));
    }

    /// Leases, orphans, deadlines, and store writes due to be tried again.
    fn expire(&mut self, now: Instant, out: &mut Vec<Command>) {
        let lapsed: Vec<(WorkerId, u64)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.lease_until <= now)
            .map(|(id, w)| (id.clone(), w.session))
            .collect();
        for (worker, session) in lapsed {
            self.lose_worker(&worker, session, "lease lapsed (no heartbeat)", out);
        }

        let orphans: Vec<CallId> = self
            .orphans
            .iter()
            .filter(|(_, o)| o.until.is_some_and(|t| t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in orphans {
            if let Some(orphan) = self.orphans.remove(&id) {
                let epoch = orphan.call.recorded_epoch();
                let reason = "its worker did not re-attach after a control plane restart".into();
                self.fence(orphan.call, epoch, reason, out);
            }
        }

        let wall = crate::call::now_ms();
        let grace = self.timing.deadline_grace.as_millis() as i64;
        let pending = Lifecycle::admitted();
        let mut late = Vec::new();
        // Only when the earliest waiting deadline has passed is the queue looked through.
        if self
            .queue
            .earliest_deadline_ms()
            .is_some_and(|deadline| deadline <= wall)
        {
            self.queue
                .retain(|q| match pending.expire(q.call.deadline_ms, grace, wall) {
                    Some(error) => {
                        late.push((q.call.clone(), error));
                        false
                    }
                    None => true,
                });
        }
        for (call, error) in late {
            self.fail(call, error, out);
        }
        let running = Lifecycle {
            state: CallState::Running,
            epoch: 1,
            worker: None,
        };
        let late: Vec<CallId> = self
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
    /// Each pool's lanes take turns ([`queue`]): the next call is the first one that may go
    /// now of the lane whose turn it is; a lane none of whose calls may go (backoff, a
    /// workspace another call writes, the release's instance limit) passes its turn.
    fn dispatch(&mut self, now: Instant, out: &mut Vec<Command>) {
        for pool in self.queue.pools() {
            while self.has_free_slot(&pool) {
                let Some((party, index, worker, session)) = self.next_offer(&pool, now) else {
                    break;
                };
                let Some(queued) = self.queue.served(&pool, &party, index) else {
                    break;
                };
                let id = queued.call.id().clone();
                let record = queued.call.record.clone();
                self.writers
                    .take(queued.call.writes().as_ref(), id.as_str());
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
                        epoch: Epoch::ZERO,
                    },
                );
                out.push(Command::Assign {
                    call: queued.call,
                    worker,
                    session,
                });
            }
        }
    }

    /// Whether a worker of `pool` has a free slot.
    fn has_free_slot(&self, pool: &str) -> bool {
        self.workers
            .values()
            .any(|w| w.pool == pool && !w.draining && (w.busy.len() as u32) < w.slots)
    }

    /// The call of `pool` that goes to a worker next, if any may go now: its lane's party,
    /// its place in the lane, and the worker's session.
    fn next_offer(&self, pool: &str, now: Instant) -> Option<(Party, usize, WorkerId, u64)> {
        self.queue.offers(pool).find_map(|(party, index, queued)| {
            if queued.not_before.is_some_and(|t| t > now) {
                return None;
            }
            let writes = queued.call.writes();
            if !self
                .writers
                .may_assign(writes.as_ref(), queued.call.id().as_str())
            {
                // Another call writes its workspace: it waits, the calls behind it do not.
                return None;
            }
            let (worker, session) = self.pick(&queued.call.record)?;
            Some((party.clone(), index, worker, session))
        })
    }

    /// The best worker with a free slot for a call, within the release's instance limit.
    fn pick(&self, record: &CallRecord) -> Option<(WorkerId, u64)> {
        self.place(&Placement::of(record))
    }

    fn place(&self, placement: &Placement<'_>) -> Option<(WorkerId, u64)> {
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
            .filter(|(_, w)| {
                w.pool == placement.pool && !w.draining && (w.busy.len() as u32) < w.slots
            })
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
    /// are one commit. `Ok(Some(worker))`: the slot; `Ok(None)`: the call must queue, and
    /// counts in its lane until it is submitted (or unreserved); [`QueueFull`]: its lane
    /// holds the most calls it may, and the call must not be recorded.
    pub fn reserve(&mut self, call: &NewCall) -> Result<Option<WorkerId>, QueueFull> {
        match self.reserve_slot(call) {
            Some(worker) => Ok(Some(worker)),
            None => {
                let lane = Lane {
                    pool: call.spec.pool.clone(),
                    party: Party::of(&call.namespace, call.spec.access.agent.as_deref()),
                };
                let queued = self.queue.len_of(&lane)
                    + self.admitting.values().filter(|l| **l == lane).count();
                if queued >= self.max_per_agent as usize {
                    return Err(QueueFull {
                        lane,
                        queued,
                        max: self.max_per_agent,
                    });
                }
                self.admitting.insert(CallId::from(call.id.as_str()), lane);
                Ok(None)
            }
        }
    }

    fn reserve_slot(&mut self, call: &NewCall) -> Option<WorkerId> {
        if self.queue.has_waiting(&call.spec.pool) {
            // Calls already waiting for this pool go first (in their turns).
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
        let id = CallId::from(call.id.as_str());
        if let Some(w) = self.workers.get_mut(&worker) {
            w.busy.insert(id.clone());
            w.cached.insert(call.release_digest.clone());
        }
        self.reserved.insert(id, (worker.clone(), session));
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
    /// failed): its slot, or its place in its lane.
    pub fn unreserve(&mut self, call_id: &CallId) {
        self.admitting.remove(call_id);
        self.writers.release(call_id.as_str());
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
        let queued = self.queue.earliest_not_before();
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
        let queued = self.queue.earliest_deadline_ms();
        let running = self
            .running
            .values()
            .map(|r| r.call.deadline_ms)
            .filter(|d| *d > 0)
            .map(|d| d + grace);
        queued.into_iter().chain(running).min()
    }

    /// The call, when worker session `session` of `worker` holds it under `epoch` (it was
    /// assigned to that session, and the assignment is written); otherwise why not.
    pub fn holding(
        &self,
        call_id: &CallId,
        worker: &WorkerId,
        session: u64,
        epoch: Epoch,
    ) -> Result<Call, Refusal> {
        let running = self
            .running
            .get(call_id)
            .filter(|r| r.worker == *worker && r.session == session && r.epoch > Epoch::ZERO)
            .filter(|_| self.is_current(worker, session))
            .ok_or(Refusal::NotHeld)?;
        if running.epoch != epoch {
            return Err(Refusal::StaleEpoch);
        }
        Ok(running.call.clone())
    }

    pub fn is_session(&self, worker: &WorkerId, session: u64) -> bool {
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
        for q in self.queue.iter() {
            *out.entry(q.call.record.spec.pool.clone()).or_default() += 1;
        }
        out
    }

    /// Calls waiting in one lane (an agent's calls in a pool).
    pub fn queued_in(&self, lane: &Lane) -> usize {
        self.queue.len_of(lane)
    }

    /// Calls of a release not yet ended that this scheduler tracks.
    pub fn calls_of_release(&self, namespace: &str, release: &str) -> usize {
        let matches = |c: &Call| c.record.namespace == namespace && c.record.release == release;
        self.queue.iter().filter(|q| matches(&q.call)).count()
            + self.running.values().filter(|r| matches(&r.call)).count()
            + self.orphans.values().filter(|o| matches(&o.call)).count()
            + self.fencing.values().filter(|f| matches(&f.call)).count()
    }

    /// The pools of the calls running now on artifact (or release file) `digest`: a worker fetches an
    /// artifact only to run a call assigned to it, so only a worker that may serve one of
    /// these pools has a reason to fetch it.
    pub fn pools_running(&self, digest: &str) -> BTreeSet<String> {
        self.running
            .values()
            .filter(|r| {
                r.call.record.release_digest == digest
                    || r.call.record.spec.files.iter().any(|f| f.digest == digest)
            })
            .map(|r| r.call.record.spec.pool.clone())
            .collect()
    }

    /// Whether workers of a previous control plane may still be re-attaching.
    pub fn reattaching(&self, now: Instant) -> bool {
        match self.listening_since {
            None => true,
            Some(since) => now < since + self.timing.reattach_grace,
        }
    }
}

mod queue;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
