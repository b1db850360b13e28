//! Builders of the scheduler tests' inputs: timing, calls, events with plain defaults, the
//! event sequences the tests keep repeating (attach a worker, get a call running on it),
//! and readers of the commands that come out.
//!
//! Events with many fields take `..` overrides over a default ([`Attaching`]); the others
//! are one function each, its arguments in the order of the variant's fields. Ids and epochs
//! are plain literals (`"a"`, `"w1"`, `1`) here and in the queries of [`State`] below; the
//! builders make the [`CallId`]s, [`WorkerId`]s and [`Epoch`](crate::ids::Epoch)s.

use super::{Call, Command, Event, Refusal, Reported, State, Timing};
use crate::call::{CallRecord, CallSpec, CallState, ErrorKind, Filesystem};
use crate::fixtures;
use crate::ids::{CallId, WorkerId};
use std::time::{Duration, Instant};

/// The pool every worker and call of these tests is in unless a test says otherwise.
pub const POOL: &str = "default/default";

/// A lease of 2 s, re-attach and deadline graces of 5 s, a first store retry after 200 ms.
pub fn timing() -> Timing {
    Timing {
        lease: Duration::from_secs(2),
        reattach_grace: Duration::from_secs(5),
        deadline_grace: Duration::from_secs(5),
        retry_backoff: Duration::from_millis(200),
    }
}

// Calls.

/// Pending call `id` of [`POOL`] (otherwise [`fixtures::record`]), its deadline far away
/// (an hour from now) unless a test sets it.
pub fn record(id: &str) -> CallRecord {
    CallRecord {
        spec: CallSpec {
            pool: POOL.into(),
            deadline_ms: crate::call::now_ms() + 3_600_000,
            ..CallSpec::default()
        },
        ..fixtures::record(id)
    }
}

/// [`record`] as the store has it while `worker` runs it under `epoch`.
pub fn running(id: &str, epoch: u64, worker: &str) -> CallRecord {
    CallRecord {
        state: CallState::Running,
        epoch,
        worker: Some(worker.into()),
        ..record(id)
    }
}

/// [`record`] as submitted (no compiled interface).
pub fn pending(id: &str) -> Call {
    Call::new(record(id), None)
}

/// [`pending`], acting for `agent` and seeing its workspace as `filesystem`.
pub fn with_fs(id: &str, agent: &str, filesystem: Filesystem) -> Call {
    let mut r = record(id);
    r.spec.access = fixtures::access(agent, filesystem);
    Call::new(r, None)
}

/// [`pending`], acting for `agent` (namespace `default`), no filesystem.
pub fn of_agent(id: &str, agent: &str) -> Call {
    let mut r = record(id);
    r.spec.access.agent = Some(agent.into());
    Call::new(r, None)
}

// Events.

/// The fields of [`Event::Attach`]; [`attaching`] has the defaults, `.into()` makes the event.
pub struct Attaching {
    pub worker: WorkerId,
    pub pool: String,
    pub slots: u32,
    pub cached: Vec<String>,
    pub in_flight: Vec<Reported>,
    pub secret: String,
    pub resume: Option<String>,
}

/// `worker` attaching to [`POOL`] with `slots`, nothing cached or in flight, its session's
/// secret `WORKER-secret`, presenting no earlier one.
pub fn attaching(worker: &str, slots: u32) -> Attaching {
    Attaching {
        worker: worker.into(),
        pool: POOL.into(),
        slots,
        cached: Vec::new(),
        in_flight: Vec::new(),
        secret: format!("{worker}-secret"),
        resume: None,
    }
}

impl From<Attaching> for Event {
    fn from(a: Attaching) -> Event {
        Event::Attach {
            worker: a.worker,
            pool: a.pool,
            slots: a.slots,
            cached: a.cached,
            in_flight: a.in_flight,
            secret: a.secret,
            resume: a.resume,
        }
    }
}

/// An attaching worker reports call `id` as running under `epoch`; the store has `stored`.
pub fn reported(id: &str, epoch: u64, stored: CallRecord) -> Reported {
    Reported {
        call_id: id.into(),
        epoch: epoch.into(),
        stored: Some(stored),
    }
}

pub fn heartbeat(worker: &str, session: u64) -> Event {
    Event::Heartbeat {
        worker: worker.into(),
        session,
        cached: Vec::new(),
        draining: false,
    }
}

/// A heartbeat of a worker that is stopping.
pub fn draining(worker: &str, session: u64) -> Event {
    Event::Heartbeat {
        worker: worker.into(),
        session,
        cached: Vec::new(),
        draining: true,
    }
}

pub fn detached(worker: &str, session: u64, reason: &str) -> Event {
    Event::Detached {
        worker: worker.into(),
        session,
        reason: reason.into(),
    }
}

pub fn assigned(call_id: &str, epoch: u64) -> Event {
    Event::Assigned {
        call_id: call_id.into(),
        epoch: epoch.into(),
    }
}

pub fn assign_failed(call_id: &str) -> Event {
    Event::AssignFailed {
        call_id: call_id.into(),
    }
}

pub fn fence_failed(call_id: &str) -> Event {
    Event::FenceFailed {
        call_id: call_id.into(),
    }
}

pub fn fail_failed(call_id: &str) -> Event {
    Event::FailFailed {
        call_id: call_id.into(),
    }
}

pub fn fenced(call_id: &str) -> Event {
    Event::Fenced {
        call_id: call_id.into(),
    }
}

pub fn finished(call_id: &str) -> Event {
    Event::Finished {
        call_id: call_id.into(),
    }
}

pub fn stopped(call_id: &str, reason: &str) -> Event {
    Event::Stopped {
        call_id: call_id.into(),
        reason: reason.into(),
    }
}

pub fn abandoned(worker: &str, session: u64, call_id: &str, epoch: u64, reason: &str) -> Event {
    Event::Abandoned {
        worker: worker.into(),
        session,
        call_id: call_id.into(),
        epoch: epoch.into(),
        reason: reason.into(),
    }
}

/// `worker`'s session sends call `id` back to run again after `backoff`, its first attempt
/// having failed.
pub fn retrying(worker: &str, session: u64, call_id: &str, epoch: u64, backoff: Duration) -> Event {
    Event::Retrying {
        worker: worker.into(),
        session,
        call_id: call_id.into(),
        epoch: epoch.into(),
        backoff,
        reason: "attempt 1 failed".into(),
    }
}

// Sequences.

/// Fake time's origin, and a scheduler of [`timing`] that has seen nothing yet.
pub fn start() -> (Instant, State) {
    (Instant::now(), State::new(timing()))
}

/// [`start`], then worker `w1` attaches with `slots` and call `a` runs on it under epoch 1
/// ([`running_on`]): the origin, the state and `w1`'s session.
pub fn w1_running_a(slots: u32) -> (Instant, State, u64) {
    let (t0, mut state) = start();
    let (session, _) = attach(&mut state, "w1", slots, t0);
    running_on(&mut state, "a", "w1", t0);
    (t0, state, session)
}

/// Attaches `worker` ([`attaching`]): its session and the commands that followed.
pub fn attach(state: &mut State, worker: &str, slots: u32, now: Instant) -> (u64, Vec<Command>) {
    attach_as(state, worker, slots, now, None)
}

/// Attaches `worker`, whose sessions all get the secret `WORKER-secret`, presenting
/// `resume` as the proof of being the same worker.
pub fn attach_as(
    state: &mut State,
    worker: &str,
    slots: u32,
    now: Instant,
    resume: Option<&str>,
) -> (u64, Vec<Command>) {
    let attach = Attaching {
        resume: resume.map(String::from),
        ..attaching(worker, slots)
    };
    let commands = state.on(attach.into(), now);
    let session = commands
        .iter()
        .find_map(|c| match c {
            Command::Registered { session, .. } => Some(*session),
            _ => None,
        })
        .expect("registered");
    (session, commands)
}

/// A call assigned to `worker` and written at epoch 1.
pub fn running_on(state: &mut State, id: &str, worker: &str, now: Instant) -> Vec<Command> {
    let out = state.on(Event::Submitted(pending(id)), now);
    assert_eq!(assigns(&out), [(id.to_string(), worker.to_string())]);
    state.on(assigned(id, 1), now)
}

/// Submits `calls` in order: the ids of those assigned at once.
pub fn submit_ids(state: &mut State, calls: Vec<Call>, now: Instant) -> Vec<String> {
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

// Queries.

/// [`State::holding`]: whether `worker`'s session `session` holds call `call_id` under `epoch`.
pub fn holding(
    state: &State,
    call_id: &str,
    worker: &str,
    session: u64,
    epoch: u64,
) -> Result<Call, Refusal> {
    state.holding(&call_id.into(), &worker.into(), session, epoch.into())
}

/// [`State::is_session`].
pub fn is_session(state: &State, worker: &str, session: u64) -> bool {
    state.is_session(&worker.into(), session)
}

/// [`State::deadline_of`].
pub fn deadline_of(state: &State, call_id: &str) -> Option<i64> {
    state.deadline_of(&call_id.into())
}

/// [`State::progressed`].
pub fn progressed(state: &mut State, call_id: &str, now_ms: i64) {
    state.progressed(&call_id.into(), now_ms)
}

/// [`State::unreserve`].
pub fn unreserve(state: &mut State, call_id: &str) {
    state.unreserve(&call_id.into())
}

/// The key the state machine tracks call `id` under (for a test that reaches into it).
pub fn call_id(id: &str) -> CallId {
    id.into()
}

// What comes out.

/// The assignments among `commands`: (call, worker).
pub fn assigns(commands: &[Command]) -> Vec<(String, String)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Assign { call, worker, .. } => {
                Some((call.record.id.clone(), worker.to_string()))
            }
            _ => None,
        })
        .collect()
}

/// The fences among `commands`: (call, epoch).
/// The session `commands` registered (the first of them must be the registration) and the
/// calls it told the worker to abandon.
pub fn registered(commands: &[Command]) -> (u64, Vec<String>) {
    match commands.first() {
        Some(Command::Registered {
            session, abandon, ..
        }) => (*session, abandon.iter().map(|c| c.to_string()).collect()),
        other => panic!("not a registration first: {other:?}"),
    }
}

pub fn fences(commands: &[Command]) -> Vec<(String, u64)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Fence { call, epoch, .. } => Some((call.record.id.clone(), epoch.get())),
            _ => None,
        })
        .collect()
}

/// The failures among `commands`: (call, error kind).
pub fn fails(commands: &[Command]) -> Vec<(String, ErrorKind)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Fail { call, error } => Some((call.record.id.clone(), error.kind)),
            _ => None,
        })
        .collect()
}
