//! The scheduler: worker sessions, slots, leases, epochs and failover.
//!
//! Calls wait in their agent's lane of their pool's queue (the lanes take turns; each holds
//! at most [`SchedulerConfig::max_queued_per_agent`] calls admission put there) and go to a
//! worker of their release's pool with a free slot, preferring one that has the release
//! compiled. Every assignment bumps the call's epoch
//! in the store; a worker whose stream breaks, whose lease lapses, or who gives a call up
//! loses its calls, which are fenced (so its late appends are refused) and handed to
//! another worker to replay.
//!
//! The decisions are a pure state machine ([`toolgrid_core::scheduler::State`]); [`Scheduler`] is its driver:
//! it feeds the state machine events (from worker streams, from store writes, from the
//! clock), runs the commands it returns (store writes, messages to workers), and feeds their
//! outcomes back. It sleeps until the state machine's next deadline, or the next event.

mod link;
mod nested;
pub mod secrets;
mod watch;

pub use link::WorkerLinkService;
pub use nested::NestedCaller;
pub use secrets::{SecretError, SecretSource, StaticSecrets, UpstreamCredentialsFor};
pub use toolgrid_core::scheduler::{QueueFull, Refusal, WorkerInfo};
pub use watch::{CallUpdate, CallWatch, Progress};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};
use tonic::Status;
use toolgrid_core::call::{CallError, EntryKind, OplogEntry, RedactRules, TOOL_PROGRESS};
use toolgrid_core::completion::{RunReport, judge};
use toolgrid_core::ids::{CallId, Epoch, WorkerId};
use toolgrid_core::interface::CommandInterface;
use toolgrid_core::middleware::redact::Redactor;
use toolgrid_core::scheduler::{Call, Command, Event, Reported, State, Timing};
use toolgrid_proto::{self as proto, ControlEvent, control_event};
use toolgrid_store::{CallRecord, Store, StoreError, now_ms};
use tracing::Instrument as _;

/// Timing of the worker link.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// How often workers heartbeat.
    pub heartbeat_interval: Duration,
    /// A worker silent this long is dead and loses its calls.
    pub lease: Duration,
    /// After a control plane restart, how long running calls wait for their worker to
    /// re-attach before they are reassigned, counted from when the worker port listens.
    pub reattach_grace: Duration,
    /// How long past its deadline a running call may go unreported before it is failed.
    pub deadline_grace: Duration,
    /// How many calls of one agent may wait for a worker of one pool; admission refuses
    /// more with `queue-full`.
    pub max_queued_per_agent: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            heartbeat_interval: Duration::from_millis(500),
            lease: Duration::from_secs(2),
            reattach_grace: Duration::from_secs(5),
            deadline_grace: Duration::from_secs(5),
            max_queued_per_agent: toolgrid_core::scheduler::DEFAULT_MAX_PER_AGENT,
        }
    }
}

/// A worker session the scheduler opened.
#[derive(Debug)]
pub struct Registration {
    pub session: u64,
    /// The proof a later session of the same worker presents to replace this one.
    pub secret: String,
    /// In-flight calls the worker reported that it must give up.
    pub abandon: Vec<CallId>,
}

/// A `Register` refused because its worker id has a live session, and the newcomer did not
/// present that session's secret.
#[derive(Debug, thiserror::Error)]
#[error(
    "worker id {0} is attached already; only that worker (presenting its session secret) may replace its session"
)]
pub struct WorkerIdInUse(pub String);

/// The outbound half of a worker's stream.
pub type ControlSender = mpsc::Sender<Result<ControlEvent, Status>>;

/// A worker session's stream and the switch that ends it.
struct Session {
    tx: ControlSender,
    stop: Arc<Notify>,
}

/// What the control plane answers a worker's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultAnswer {
    /// Stored: the worker may forget it.
    Stored,
    /// Refused for good (the call moved on, or the result is malformed): forget it.
    Refused,
    /// Refused for good, untouched: the sending session does not hold the call under that
    /// epoch (the call is another worker's, or ended, or was taken back).
    NotHeld(Refusal),
    /// Not stored now (the store is unavailable): keep it and send it again.
    Retry,
}

pub struct Scheduler {
    store: Arc<dyn Store>,
    calls: Arc<CallWatch>,
    config: SchedulerConfig,
    state: Mutex<State>,
    sessions: Mutex<HashMap<(WorkerId, u64), Session>>,
    /// Wakes the timer when an event may have moved the next deadline.
    wake: Notify,
    /// Where the values of the secrets a call is granted are read at each assignment.
    secrets: std::sync::RwLock<Option<Arc<dyn SecretSource>>>,
    /// Compiled redactions by their rules: a call's progress messages and its end reuse
    /// one compilation (at most [`MAX_REDACTORS`] kept).
    redactors: std::sync::Mutex<HashMap<RedactRules, Arc<Redactor>>>,
    /// Where programs' tool calls are admitted (the gateway).
    nested: std::sync::RwLock<Option<std::sync::Weak<dyn NestedCaller>>>,
}

/// Compiled redactions the scheduler keeps at most (all are dropped when it is full).
const MAX_REDACTORS: usize = 256;

impl Scheduler {
    pub fn new(store: Arc<dyn Store>, calls: Arc<CallWatch>, config: SchedulerConfig) -> Arc<Self> {
        let timing = Timing {
            lease: config.lease,
            reattach_grace: config.reattach_grace,
            deadline_grace: config.deadline_grace,
            retry_backoff: Duration::from_millis(200),
        };
        Arc::new(Scheduler {
            store,
            calls,
            config,
            state: Mutex::new(State::new(timing).with_max_per_agent(config.max_queued_per_agent)),
            sessions: Mutex::default(),
            wake: Notify::new(),
            secrets: std::sync::RwLock::new(None),
            redactors: std::sync::Mutex::default(),
            nested: std::sync::RwLock::default(),
        })
    }

    /// The call's redaction (its redact steps, fixed at admission), if it has any, compiled
    /// once per set of rules. Rules that do not compile (admission checked them, so only a
    /// spec stored by another version) fail the call with the reason instead of letting its
    /// result through unredacted.
    pub(crate) fn redactor(&self, record: &CallRecord) -> Result<Option<Arc<Redactor>>, CallError> {
        let Some(rules) = record.spec.chain.redact.as_ref().filter(|r| !r.is_empty()) else {
            return Ok(None);
        };
        let mut cache = self.redactors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = cache.get(rules) {
            return Ok(Some(known.clone()));
        }
        let compiled = Arc::new(Redactor::new(rules).map_err(|error| {
            CallError::new(
                toolgrid_core::call::ErrorKind::MiddlewareFailed,
                format!(
                    "the call's redaction does not compile, so its result is withheld: {error}"
                ),
            )
        })?);
        if cache.len() >= MAX_REDACTORS {
            cache.clear();
        }
        cache.insert(rules.clone(), compiled.clone());
        Ok(Some(compiled))
    }

    /// What scrubs `record`'s secret values (as they are now) out of what an agent reads of
    /// it ([`secrets::scrubber`]).
    pub(crate) fn scrubber(
        &self,
        record: &CallRecord,
    ) -> Result<toolgrid_core::secret::scrub::Scrubber, SecretError> {
        let source = self.secret_source();
        secrets::scrubber_with(
            &record.spec.access,
            &record.namespace,
            source.as_deref(),
            record.spec.upstream.as_ref().map(|u| u.source.as_str()),
        )
    }

    /// Sets where secret values are read when a call is assigned. Without one, a call
    /// granted any secret fails `secret-unavailable` when it is assigned.
    pub fn set_secret_source(&self, source: Arc<dyn SecretSource>) {
        *self.secrets.write().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    fn secret_source(&self) -> Option<Arc<dyn SecretSource>> {
        self.secrets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<(WorkerId, u64), Session>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Feeds one event to the state machine and runs what follows.
    fn on(self: &Arc<Self>, event: Event) -> Vec<Command> {
        let commands = self.lock().on(event, Instant::now());
        self.wake.notify_one();
        let mut kept = Vec::new();
        for command in commands {
            match command {
                registered @ Command::Registered { .. } => kept.push(registered),
                other => self.execute(other),
            }
        }
        kept
    }

    /// Whether workers of a previous control plane may still be re-attaching, so an
    /// empty worker set says nothing about the pool's health yet.
    pub fn reattaching(&self) -> bool {
        self.lock().reattaching(Instant::now())
    }

    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    /// Loads the calls a previous control plane left unfinished: pending ones queue again,
    /// running ones wait for their worker to re-attach.
    pub async fn recover(self: &Arc<Self>) -> Result<usize, StoreError> {
        let unfinished = self.store.unfinished_calls().await?;
        let count = unfinished.len();
        // A call that reported progress keeps the deadline its recorded progress gave it.
        let mut deadlines = HashMap::new();
        for record in &unfinished {
            let Some(rule) =
                toolgrid_core::call::IdleDeadline::of(&record.spec.limits, record.spec.deadline_ms)
            else {
                continue;
            };
            if record.epoch == 0 || rule.hard_ms() <= rule.initial_ms() {
                continue;
            }
            let oplog = self.store.oplog(&record.id).await?;
            let times = oplog
                .iter()
                .filter(|e| e.kind == EntryKind::Progress.as_str())
                .map(|e| e.recorded_at_ms);
            deadlines.insert(CallId::from(record.id.as_str()), rule.after_all(times));
        }
        self.lock().restore_deadlines(deadlines);
        self.on(Event::Recovered(unfinished));
        if count > 0 {
            tracing::info!(calls = count, "recovered unfinished calls");
        }
        Ok(count)
    }

    /// The worker port listens: the re-attach grace starts now.
    pub fn listening(self: &Arc<Self>) {
        self.on(Event::Listening);
    }

    /// Queues a newly admitted call.
    pub fn submit(self: &Arc<Self>, record: CallRecord, interface: Arc<CommandInterface>) {
        self.on(Event::Submitted(Call::new(record, Some(interface))));
    }

    /// Reserves a worker slot for a call about to be admitted, so the store can record the
    /// admission and the assignment in one commit (`Ok(None)`: it will queue, and holds a
    /// place in its agent's lane until it is submitted or unreserved). [`QueueFull`]: the
    /// agent has as many calls waiting in the pool as it may; the call must not be recorded.
    pub fn reserve(&self, call: &toolgrid_store::NewCall) -> Result<Option<String>, QueueFull> {
        Ok(self.lock().reserve(call)?.map(WorkerId::into_string))
    }

    /// Gives a reservation back (the admission did not create the call).
    pub fn unreserve(self: &Arc<Self>, call_id: &str) {
        self.lock().unreserve(&CallId::from(call_id));
        self.on(Event::Tick);
    }

    /// Hands a call admitted and assigned in one commit to its reserved worker.
    pub fn admitted_assigned(
        self: &Arc<Self>,
        record: CallRecord,
        interface: Arc<CommandInterface>,
    ) {
        let epoch = Epoch::from(record.epoch);
        let call = Call::new(record, Some(interface));
        self.on(Event::AdmittedAssigned { call, epoch });
    }

    /// Holds workspace `key` for `holder`, a writer that is no call (see
    /// [`State::hold_workspace`]): false while a call (or another holder) writes it.
    pub fn hold_workspace(
        &self,
        key: &toolgrid_core::workspace::WorkspaceKey,
        holder: &str,
    ) -> bool {
        self.lock().hold_workspace(key, holder)
    }

    /// Gives back what [`Scheduler::hold_workspace`] held; calls waiting for the workspace
    /// may be assigned now.
    pub fn release_workspace(self: &Arc<Self>, holder: &str) {
        self.lock().release_workspace(holder);
        self.on(Event::Tick);
    }

    /// A call the store has just ended from outside (cancelled): the scheduler forgets it,
    /// frees its slot, and tells its worker, if it runs, to stop at once.
    pub fn stopped(self: &Arc<Self>, call_id: &str, reason: &str) {
        self.on(Event::Stopped {
            call_id: CallId::from(call_id),
            reason: reason.to_string(),
        });
    }

    /// Drains worker `worker` (`toolgrid drain`): the scheduler offers it no new call and
    /// tells it to drain. The calls it holds, or `None` when no such worker is attached.
    pub fn drain(self: &Arc<Self>, worker: &str) -> Option<u32> {
        let busy = self
            .workers()
            .into_iter()
            .find(|w| w.id.as_str() == worker)?
            .busy;
        self.on(Event::Drain {
            worker: WorkerId::from(worker),
        });
        Some(busy)
    }

    /// Workers attached now.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.lock().workers()
    }

    /// Calls of a release not yet ended (queued or running), e.g. before deleting it.
    pub fn calls_of_release(&self, namespace: &str, release: &str) -> usize {
        self.lock().calls_of_release(namespace, release)
    }

    /// The pools of the calls running now on artifact `digest`.
    pub fn pools_running(&self, digest: &str) -> std::collections::BTreeSet<String> {
        self.lock().pools_running(digest)
    }

    /// Calls waiting for a slot, by pool.
    pub fn queued(&self) -> HashMap<String, usize> {
        self.lock().queued()
    }

    fn export_gauges(&self) {
        use crate::metrics::PoolLabel;
        let metrics = crate::metrics::global();
        let (workers, queued) = {
            let state = self.lock();
            (state.workers(), state.queued())
        };
        let mut pools: HashMap<String, (i64, i64, i64)> = HashMap::new();
        for worker in workers {
            let entry = pools.entry(worker.pool).or_default();
            entry.0 += 1;
            entry.1 += i64::from(worker.busy);
        }
        for (pool, count) in queued {
            pools.entry(pool).or_default().2 += count as i64;
        }
        for (pool, (workers, busy, queued)) in pools {
            let label = PoolLabel { pool };
            metrics.workers.get_or_create(&label).set(workers);
            metrics.busy_slots.get_or_create(&label).set(busy);
            metrics.queue_depth.get_or_create(&label).set(queued);
        }
    }

    /// Runs the timer until the process ends: sleeps until the state machine's next
    /// deadline (a lease, a grace, a retry, a call's deadline) or until an event arrives.
    pub async fn run(self: Arc<Self>) {
        // Gauges are exported (and finished watchers pruned) about this often, not per event.
        const IDLE: Duration = Duration::from_secs(1);
        let mut housekept = Instant::now();
        loop {
            let (wake, deadline_ms) = {
                let state = self.lock();
                (state.next_wake(), state.next_deadline_ms())
            };
            let now = Instant::now();
            let mut until = wake.unwrap_or(now + IDLE).min(now + IDLE);
            if let Some(deadline_ms) = deadline_ms {
                let in_ms = (deadline_ms - now_ms() + 1).max(0) as u64;
                until = until.min(now + Duration::from_millis(in_ms));
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(until.into()) => {
                    self.on(Event::Tick);
                }
            }
            if housekept.elapsed() >= IDLE {
                housekept = Instant::now();
                self.calls.prune();
                self.export_gauges();
            }
        }
    }

    /// Runs one command's IO; its outcome comes back as an event.
    fn execute(self: &Arc<Self>, command: Command) {
        let this = self.clone();
        match command {
            Command::Registered { .. } | Command::RefuseAttach { .. } => {}
            Command::Drain { worker, session } => {
                self.send(
                    &worker,
                    session,
                    control_event::Event::Drain(proto::Drain {}),
                );
            }
            Command::EndSession { worker, session } => {
                if let Some(s) = self.sessions().remove(&(worker, session)) {
                    s.stop.notify_one();
                }
            }
            Command::Cancel {
                worker,
                session,
                call_id,
                epoch,
                reason,
            } => {
                let cancel = proto::Cancel {
                    call_id: call_id.into_string(),
                    epoch: epoch.get(),
                    reason,
                };
                self.send(&worker, session, control_event::Event::Cancel(cancel));
            }
            // The session is the state machine's to check when the write returns.
            Command::Assign { call, worker, .. } => {
                tokio::spawn(async move { this.assign(call, worker).await });
            }
            Command::Send {
                call,
                worker,
                session,
                epoch,
            } => {
                tokio::spawn(async move {
                    this.send_assignment(&call, &worker, session, epoch, Vec::new(), 1)
                        .await
                });
            }
            Command::Fence {
                call,
                epoch,
                reason,
            } => {
                tokio::spawn(async move {
                    let id = call.id().clone();
                    let event = match this
                        .store
                        .fence_call(id.as_str(), epoch.get(), &reason)
                        .await
                    {
                        Ok(new_epoch) => {
                            crate::metrics::global().failovers.inc();
                            tracing::info!(call = %id, epoch = new_epoch, "call fenced and queued for another worker: {reason}");
                            Event::Fenced { call_id: id }
                        }
                        Err(StoreError::StaleEpoch { .. }) | Err(StoreError::NotFound(_)) => {
                            Event::FenceRefused { call_id: id }
                        }
                        Err(error) => {
                            tracing::error!(call = %id, %error, "cannot fence the call; trying again");
                            Event::FenceFailed { call_id: id }
                        }
                    };
                    this.on(event);
                });
            }
            Command::Fail { call, error } => {
                tokio::spawn(async move {
                    let id = call.id().clone();
                    let kind = error.kind;
                    let mut error = error;
                    match this.redactor(&call.record) {
                        Ok(Some(redactor)) => redactor.redact_error(&mut error),
                        Ok(None) => {}
                        Err(refusal) => error = refusal,
                    }
                    let sent = error.clone();
                    let event = match this.store.fail_call(id.as_str(), error).await {
                        Ok(done) => {
                            crate::metrics::call_ended(&done.tool, kind.as_str());
                            // Only when this failure ended it (a call that had ended
                            // already has had its line).
                            if done.error.as_ref() == Some(&sent) {
                                audit_to_stdout(&done);
                            }
                            this.calls.finish(done);
                            Event::Finished { call_id: id }
                        }
                        Err(StoreError::NotFound(_)) => Event::Finished { call_id: id },
                        Err(error) => {
                            tracing::error!(call = %id, %error, "cannot fail the call; trying again");
                            Event::FailFailed { call_id: id }
                        }
                    };
                    this.on(event);
                });
            }
        }
    }

    /// The outbound stream of a worker session, while it is open.
    fn session_tx(&self, worker: &WorkerId, session: u64) -> Option<ControlSender> {
        self.sessions()
            .get(&(worker.clone(), session))
            .map(|s| s.tx.clone())
    }

    /// Sends on a session's stream, waiting for room; false only when the stream is gone.
    async fn send_in_order(
        &self,
        worker: &WorkerId,
        session: u64,
        event: control_event::Event,
    ) -> bool {
        match self.session_tx(worker, session) {
            Some(tx) => tx
                .send(Ok(ControlEvent { event: Some(event) }))
                .await
                .is_ok(),
            None => false,
        }
    }

    /// Sends on a session's stream if there is room now (a cancel: best effort).
    fn send(&self, worker: &WorkerId, session: u64, event: control_event::Event) -> bool {
        match self.session_tx(worker, session) {
            Some(tx) => tx.try_send(Ok(ControlEvent { event: Some(event) })).is_ok(),
            None => false,
        }
    }

    /// Writes an assignment and sends it with the call's replay.
    async fn assign(self: Arc<Self>, call: Call, worker: WorkerId) {
        let id = call.id().clone();
        // Sent at its commit, while the store syncs it (every effect of the run is committed
        // after it, in order). Its sync is not waited for: a failed sync fails every later
        // write, this call's end too, and the writer logs it.
        let epoch = match self
            .store
            .assign_call_applied(id.as_str(), worker.as_str())
            .await
        {
            Ok((epoch, durable)) => {
                drop(durable);
                Epoch::from(epoch)
            }
            Err(StoreError::StaleEpoch { .. }) | Err(StoreError::NotFound(_)) => {
                self.on(Event::AssignRefused { call_id: id });
                return;
            }
            Err(error) => {
                tracing::error!(call = %id, %error, "cannot assign the call; trying again");
                self.on(Event::AssignFailed { call_id: id });
                return;
            }
        };
        // Epoch 1 is a call's first assignment; any later one re-runs it from its oplog.
        // Without the oplog it must not run at all.
        let (replay, attempt) = if epoch > Epoch::FIRST {
            match self.store.oplog(id.as_str()).await {
                Ok(records) => match replay_of(&records) {
                    Ok(replay) => {
                        let attempt = records
                            .iter()
                            .filter(|e| e.kind == EntryKind::Assigned.as_str())
                            .count() as u32;
                        (replay, attempt.max(1))
                    }
                    Err(message) => {
                        tracing::error!(call = %id, %message, "the oplog cannot be replayed");
                        self.on(Event::ReplayUnreadable {
                            call_id: id,
                            message,
                        });
                        return;
                    }
                },
                Err(error) => {
                    tracing::error!(call = %id, %error, "cannot read the oplog to replay; trying again");
                    self.on(Event::AssignFailed { call_id: id });
                    return;
                }
            }
        } else {
            (Vec::new(), 1)
        };
        // The state machine sends it (or fences it, if the worker left meanwhile).
        let commands = {
            let mut state = self.lock();
            state.on(
                Event::Assigned {
                    call_id: id.clone(),
                    epoch,
                },
                Instant::now(),
            )
        };
        self.wake.notify_one();
        for command in commands {
            match command {
                Command::Send {
                    call,
                    worker,
                    session,
                    epoch,
                } if call.id() == &id => {
                    self.send_assignment(&call, &worker, session, epoch, replay.clone(), attempt)
                        .await
                }
                other => self.execute(other),
            }
        }
    }

    /// Sends an assignment in the call's `dispatch` span (a child of the span that admitted
    /// the call), whose trace context the worker's spans take up.
    async fn send_assignment(
        self: &Arc<Self>,
        call: &Call,
        worker: &WorkerId,
        session: u64,
        epoch: Epoch,
        replay: Vec<proto::OplogEntry>,
        attempt: u32,
    ) {
        let span = toolgrid_trace::child_span!(
            call.record.spec.traceparent.as_deref(),
            "dispatch",
            call = %call.record.id,
            tool = %call.record.tool,
            worker = worker.as_str(),
            epoch = epoch.get(),
            attempt,
        );
        self.send_assignment_in(call, worker, session, epoch, replay, attempt)
            .instrument(span)
            .await
    }

    async fn send_assignment_in(
        self: &Arc<Self>,
        call: &Call,
        worker: &WorkerId,
        session: u64,
        epoch: Epoch,
        replay: Vec<proto::OplogEntry>,
        attempt: u32,
    ) {
        // Secret values are read now, for this assignment only, and never stored; a call
        // whose secrets cannot be read fails rather than run without them.
        let source = self.secret_source();
        let delivery = match secrets::delivery(
            &call.record.spec.access,
            &call.record.namespace,
            source.as_deref(),
        )
        .and_then(|mut delivery| {
            secrets::add_upstream(&mut delivery, &call.record, source.as_deref())?;
            Ok(delivery)
        }) {
            Ok(delivery) => delivery,
            Err(error) => {
                tracing::warn!(call = %call.record.id, worker = worker.as_str(), epoch = epoch.get(), %error, "call failed: its secrets cannot be resolved");
                self.execute(Command::Fail {
                    call: call.clone(),
                    error: toolgrid_core::call::CallError::new(
                        toolgrid_core::call::ErrorKind::SecretUnavailable,
                        error.to_string(),
                    ),
                });
                return;
            }
        };
        // A replay too large for one message goes ahead of its Assign in chunks.
        let replay_bytes: usize = replay.iter().map(|e| e.payload.len()).sum();
        let (replay, chunks) = if replay_bytes > proto::LINK_BATCH_BYTES {
            let batches = proto::link_batches(replay);
            let chunks = batches.len() as u32;
            for entries in batches {
                let chunk = proto::ReplayChunk {
                    call_id: call.record.id.clone(),
                    epoch: epoch.get(),
                    entries,
                };
                if !self
                    .send_in_order(worker, session, control_event::Event::ReplayChunk(chunk))
                    .await
                {
                    break;
                }
            }
            (Vec::new(), chunks)
        } else {
            (replay, 0)
        };
        let mut assign = assign_of(call, epoch, attempt, replay, delivery);
        assign.replay_chunks = chunks;
        // The dispatch span's (this runs in it).
        assign.traceparent = toolgrid_trace::current().unwrap_or_default();
        tracing::info!(call = %call.record.id, tool = %call.record.tool, worker = worker.as_str(), epoch = epoch.get(), "call assigned");
        self.calls.assigned(&call.record.id);
        self.calls.progress(
            &call.record.id,
            Progress {
                stage: "assigned".into(),
                message: String::new(),
                worker: worker.to_string(),
                epoch: epoch.get(),
            },
        );
        if !self
            .send_in_order(worker, session, control_event::Event::Assign(assign))
            .await
        {
            self.on(Event::Detached {
                worker: worker.clone(),
                session,
                reason: "stream closed".into(),
            });
        }
    }

    /// Registers a worker's new session, adopting the in-flight calls it reports when the
    /// store agrees they are still its own. Returns the session, its secret (the proof a
    /// later session of the same worker presents) and the calls to abandon; or, when the
    /// worker id has a live session and the newcomer did not present its secret, the
    /// refusal (nothing changed).
    pub(crate) async fn register(
        self: &Arc<Self>,
        worker: &WorkerId,
        register: &proto::Register,
        tx: ControlSender,
        stop: Arc<Notify>,
    ) -> Result<Registration, WorkerIdInUse> {
        let mut secret = [0u8; 32];
        rand::fill(&mut secret);
        let secret = hex::encode(secret);
        let mut in_flight = Vec::new();
        for call in &register.in_flight {
            let stored = self.store.get_call(&call.call_id).await.ok().flatten();
            in_flight.push(Reported {
                call_id: CallId::from(call.call_id.as_str()),
                epoch: Epoch::from(call.epoch),
                stored,
            });
        }
        // The stream is installed under its session while the state lock is held, so the
        // first commands that follow (an assignment to this worker) find it.
        let mut registered = None;
        let commands = {
            let mut state = self.lock();
            let commands = state.on(
                Event::Attach {
                    worker: worker.clone(),
                    pool: register.pool.clone(),
                    slots: register.slots,
                    cached: register.cached_digests.clone(),
                    in_flight,
                    secret: secret.clone(),
                    resume: Some(register.resume_secret.clone()).filter(|r| !r.is_empty()),
                },
                Instant::now(),
            );
            for command in &commands {
                if let Command::Registered {
                    worker,
                    session,
                    abandon,
                } = command
                {
                    self.sessions().insert(
                        (worker.clone(), *session),
                        Session {
                            tx: tx.clone(),
                            stop: stop.clone(),
                        },
                    );
                    registered = Some((*session, abandon.clone()));
                }
            }
            commands
        };
        self.wake.notify_one();
        let mut refused = false;
        for command in commands {
            match command {
                Command::Registered { .. } => {}
                Command::RefuseAttach { .. } => refused = true,
                other => self.execute(other),
            }
        }
        match registered {
            Some((session, abandon)) if !refused => {
                tracing::info!(worker = %register.worker_id, pool = %register.pool, slots = register.slots, session, "worker attached");
                Ok(Registration {
                    session,
                    secret,
                    abandon,
                })
            }
            _ => {
                tracing::warn!(worker = %register.worker_id, pool = %register.pool, "a second worker with the id of a live one was refused (it did not present the live session's secret)");
                Err(WorkerIdInUse(register.worker_id.clone()))
            }
        }
    }

    pub(crate) fn heartbeat(
        self: &Arc<Self>,
        worker: &WorkerId,
        session: u64,
        heartbeat: &proto::Heartbeat,
    ) {
        self.on(Event::Heartbeat {
            worker: worker.clone(),
            session,
            cached: heartbeat.cached_digests.clone(),
            draining: heartbeat.draining,
        });
    }

    pub(crate) fn is_current(&self, worker: &WorkerId, session: u64) -> bool {
        self.lock().is_session(worker, session)
    }

    /// Publishes a call's progress, when the session holds the call under that epoch.
    pub(crate) fn progress(
        &self,
        worker: &WorkerId,
        session: u64,
        progress: &proto::WorkerProgress,
    ) -> Result<(), Refusal> {
        let call_id = CallId::from(progress.call_id.as_str());
        let holding = {
            let mut state = self.lock();
            let holding = state.holding(&call_id, worker, session, Epoch::from(progress.epoch));
            // The tool's own report restarts the call's idle deadline.
            if holding.is_ok() && progress.stage == TOOL_PROGRESS {
                state.progressed(&call_id, now_ms());
            }
            holding
        };
        let call = match holding {
            Ok(call) => call,
            Err(refusal) => {
                tracing::warn!(call = %progress.call_id, worker = worker.as_str(), epoch = progress.epoch, %refusal, "progress refused");
                return Err(refusal);
            }
        };
        // Progress text reaches callers too: it gets the call's redaction (withheld when
        // the redaction does not compile).
        // However long a worker's message, callers get at most 1 KiB of it.
        let text = toolgrid_core::call::ProgressReport::bounded(progress.message.as_bytes());
        let message = match self.redactor(&call.record) {
            _ if text.is_empty() => String::new(),
            Ok(Some(redactor)) => redactor.redact_text(&text),
            Ok(None) => text,
            Err(_) => String::new(),
        };
        self.calls.progress(
            &progress.call_id,
            Progress {
                stage: progress.stage.clone(),
                message,
                worker: worker.to_string(),
                epoch: progress.epoch,
            },
        );
        Ok(())
    }

    /// A worker gave a call up (it could not commit, so it cannot go on): fence it now, so
    /// another worker takes it without waiting for the deadline.
    pub(crate) fn abandoned(
        self: &Arc<Self>,
        worker: &WorkerId,
        session: u64,
        abandoned: &proto::Abandoned,
    ) {
        tracing::warn!(call = %abandoned.call_id, worker = worker.as_str(), epoch = abandoned.epoch, reason = %abandoned.reason, "worker gave the call up");
        self.on(Event::Abandoned {
            worker: worker.clone(),
            session,
            call_id: CallId::from(abandoned.call_id.as_str()),
            epoch: Epoch::from(abandoned.epoch),
            reason: abandoned.reason.clone(),
        });
    }

    /// Commits a worker's oplog entries under its epoch, when the session holds the call
    /// under that epoch; otherwise refuses them untouched (`AppendAck.error` names why).
    pub(crate) async fn append(
        &self,
        worker: &WorkerId,
        session: u64,
        append: &proto::OplogAppend,
    ) -> proto::AppendAck {
        let holding = self.lock().holding(
            &CallId::from(append.call_id.as_str()),
            worker,
            session,
            Epoch::from(append.epoch),
        );
        if let Err(refusal) = holding {
            tracing::warn!(call = %append.call_id, worker = worker.as_str(), epoch = append.epoch, %refusal, "oplog append refused");
            return proto::AppendAck {
                call_id: append.call_id.clone(),
                request_id: append.request_id,
                ok: false,
                error: refusal.as_str().to_string(),
            };
        }
        let result = match proto::entries_from_wire(&append.entries) {
            Ok(entries) => {
                self.store
                    .append_oplog(&append.call_id, append.epoch, append.first_wseq, entries)
                    .await
            }
            Err(error) => Err(StoreError::Corrupt(format!("the worker sent {error}"))),
        };
        let error = match result {
            Ok(()) => String::new(),
            Err(StoreError::StaleEpoch { .. }) => "stale-epoch".to_string(),
            Err(error) => {
                tracing::error!(call = %append.call_id, %error, "oplog append failed");
                error.to_string()
            }
        };
        proto::AppendAck {
            call_id: append.call_id.clone(),
            request_id: append.request_id,
            ok: error.is_empty(),
            error,
        }
    }

    /// Completes a call from its worker's result, when the session holds the call under the
    /// result's epoch; otherwise the result is refused and the call is not touched.
    pub(crate) async fn complete(
        self: &Arc<Self>,
        worker: &WorkerId,
        session: u64,
        result: proto::CallResult,
    ) -> ResultAnswer {
        let received = std::time::Instant::now();
        let holding = self.lock().holding(
            &CallId::from(result.call_id.as_str()),
            worker,
            session,
            Epoch::from(result.epoch),
        );
        let call = match holding {
            Ok(call) => call,
            Err(refusal) => {
                tracing::warn!(call = %result.call_id, worker = worker.as_str(), epoch = result.epoch, %refusal, "result refused");
                return ResultAnswer::NotHeld(refusal);
            }
        };
        let span = toolgrid_trace::child_span!(
            call.record.spec.traceparent.as_deref(),
            "complete",
            call = %call.record.id,
            tool = %call.record.tool,
            worker = worker.as_str(),
            epoch = result.epoch,
        );
        self.complete_held(worker, session, result, received, call)
            .instrument(span)
            .await
    }

    /// Completes a call the session holds (see [`Scheduler::complete`]).
    async fn complete_held(
        self: &Arc<Self>,
        worker: &WorkerId,
        session: u64,
        result: proto::CallResult,
        received: std::time::Instant,
        call: Call,
    ) -> ResultAnswer {
        let interface = match &call.interface {
            Some(interface) => interface.clone(),
            None => match interface_of(&call.record) {
                Ok(interface) => Arc::new(interface),
                Err(error) => {
                    tracing::error!(call = %call.record.id, %error, "stored command definition does not compile");
                    return ResultAnswer::Refused;
                }
            },
        };
        let entries: Vec<OplogEntry> = match proto::entries_from_wire(&result.entries) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::error!(call = %result.call_id, %error, "result refused: malformed oplog entry");
                return ResultAnswer::Refused;
            }
        };
        self.calls.result_received(
            &result.call_id,
            std::time::Duration::from_micros(result.run_micros),
        );
        let mut outcome = judge(
            &interface,
            &call.record,
            RunReport::from(&result),
            worker.as_str(),
        );
        // Redaction, before the result or the error is stored (and so before any caller
        // sees it).
        match self.redactor(&call.record) {
            Ok(Some(redactor)) => redactor.redact_result(&mut outcome.result),
            Ok(None) => {}
            Err(refusal) => outcome.result = Err(refusal),
        }
        // A transient failure of a read or idempotent call is an attempt, not the end.
        if let Err(error) = &outcome.result
            && let Some(answer) = self
                .retry(&call, &interface, worker, session, &result, &entries, error)
                .await
        {
            return answer;
        }
        match self
            .store
            .complete_call(
                &result.call_id,
                result.epoch,
                result.first_wseq,
                entries,
                outcome,
            )
            .await
        {
            Ok(done) => {
                crate::metrics::stage(crate::metrics::Stage::Completion, received.elapsed());
                tracing::info!(
                    call = %done.id, tool = %done.tool, command = %done.command, worker = worker.as_str(), epoch = result.epoch,
                    state = done.state.as_str(), "call finished"
                );
                crate::metrics::call_ended(
                    &done.tool,
                    done.error
                        .as_ref()
                        .map(|e| e.kind.as_str())
                        .unwrap_or("succeeded"),
                );
                audit_to_stdout(&done);
                self.calls.finish(done);
                self.on(Event::Finished {
                    call_id: call.id().clone(),
                });
                ResultAnswer::Stored
            }
            Err(StoreError::StaleEpoch { current, state, .. }) => {
                tracing::warn!(call = %result.call_id, worker = worker.as_str(), epoch = result.epoch, current, %state, "result refused: stale epoch");
                ResultAnswer::Refused
            }
            Err(StoreError::NotFound(_)) => ResultAnswer::Refused,
            Err(error) => {
                tracing::error!(call = %result.call_id, %error, "cannot store the call's result; the worker keeps it");
                ResultAnswer::Retry
            }
        }
    }

    /// Runs a failed attempt's call again when its retry policy says so (see
    /// [`toolgrid_core::call::retry`]): commits the attempt's last entries and a `retry` entry under
    /// its epoch, then the state machine takes the call back and queues it after the
    /// backoff. `None`: the call ends with `error` (not transient, attempts used, or the
    /// deadline too near).
    #[allow(clippy::too_many_arguments)]
    async fn retry(
        self: &Arc<Self>,
        call: &Call,
        interface: &CommandInterface,
        worker: &WorkerId,
        session: u64,
        result: &proto::CallResult,
        entries: &[OplogEntry],
        error: &CallError,
    ) -> Option<ResultAnswer> {
        use toolgrid_core::call::retry::{self, Decision};
        let spec = call.record.spec.retry.filter(|s| s.attempts > 1)?;
        let declared = interface.declared_error(error.exit_code);
        retry::transient(error, declared)?;
        let id = &call.record.id;
        let records = match self.store.oplog(id).await {
            Ok(records) => records,
            Err(error) => {
                tracing::error!(call = %id, %error, "cannot read the oplog to count attempts; the worker keeps the result");
                return Some(ResultAnswer::Retry);
            }
        };
        let retries: Vec<(u64, toolgrid_core::call::Retry)> = records
            .iter()
            .filter(|r| r.kind == EntryKind::Retry.as_str())
            .filter_map(|r| match r.entry() {
                Ok(OplogEntry::Retry(retry)) => Some((r.epoch, retry)),
                _ => None,
            })
            .collect();
        let (failed, backoff) = match retries.last() {
            // This attempt's retry is committed already (the worker sent its result again).
            Some((epoch, committed)) if *epoch == result.epoch => (
                committed.attempt,
                Duration::from_millis(committed.backoff_ms),
            ),
            _ => {
                let failed = retries.len() as u32 + 1;
                let decision = retry::decide(
                    &spec,
                    failed,
                    error,
                    declared,
                    now_ms(),
                    call.record.spec.deadline_ms,
                );
                let Decision::Retry { backoff, .. } = decision else {
                    tracing::info!(call = %id, attempt = failed, kind = %error.kind, ?decision, "the attempt failed; the call ends");
                    return None;
                };
                let mut entries = entries.to_vec();
                entries.push(OplogEntry::Retry(toolgrid_core::call::Retry {
                    attempt: failed,
                    error: error.clone(),
                    backoff_ms: backoff.as_millis() as u64,
                }));
                match self
                    .store
                    .append_oplog(id, result.epoch, result.first_wseq, entries)
                    .await
                {
                    Ok(()) => {}
                    Err(StoreError::StaleEpoch { .. }) | Err(StoreError::NotFound(_)) => {
                        return Some(ResultAnswer::Refused);
                    }
                    Err(error) => {
                        tracing::error!(call = %id, %error, "cannot record the retry; the worker keeps the result");
                        return Some(ResultAnswer::Retry);
                    }
                }
                (failed, backoff)
            }
        };
        let reason = format!(
            "attempt {failed} failed ({}{}): attempt {} in {} ms",
            error.kind,
            if error.name.is_empty() {
                String::new()
            } else {
                format!(" {}", error.name)
            },
            failed + 1,
            backoff.as_millis()
        );
        tracing::info!(call = %id, worker = worker.as_str(), epoch = result.epoch, "{reason}");
        self.calls.progress(
            id,
            Progress {
                stage: "retrying".into(),
                message: reason.clone(),
                worker: worker.to_string(),
                epoch: result.epoch,
            },
        );
        self.on(Event::Retrying {
            worker: worker.clone(),
            session,
            call_id: call.id().clone(),
            epoch: Epoch::from(result.epoch),
            backoff,
            reason,
        });
        Some(ResultAnswer::Stored)
    }

    /// A worker's session ended (stream closed or lease lapsed): its calls move on.
    pub(crate) fn worker_lost(self: &Arc<Self>, worker: &WorkerId, session: u64, reason: &str) {
        tracing::warn!(
            worker = worker.as_str(),
            session,
            "worker session ended: {reason}"
        );
        self.on(Event::Detached {
            worker: worker.clone(),
            session,
            reason: reason.to_string(),
        });
        self.sessions().remove(&(worker.clone(), session));
    }
}

/// Writes an ended call's audit record to stdout as one JSON line when its audit steps
/// ask for it (the store has committed the record itself with the end).
pub(crate) fn audit_to_stdout(done: &CallRecord) {
    if !done.spec.chain.audit.as_ref().is_some_and(|a| a.stdout) {
        return;
    }
    let at = done.finished_at_ms.unwrap_or_else(now_ms);
    let record = toolgrid_core::middleware::audit::record_of(done, at);
    if let Some(line) =
        toolgrid_core::middleware::audit::stdout_line(done.spec.chain.audit.as_ref(), &record)
    {
        toolgrid_core::middleware::audit::print_line(&line);
    }
}

/// The host-call entries of a call's oplog, for a worker to replay; a stored entry that does
/// not parse is named in the error (the call ends as a replay divergence).
///
/// Only the current attempt's entries (those after the last `retry` entry) are replayed:
/// an earlier attempt failed and ended, and a new attempt starts afresh.
pub fn replay_of(
    records: &[toolgrid_store::OplogRecord],
) -> Result<Vec<proto::OplogEntry>, String> {
    let mut replay = Vec::new();
    let current = records
        .iter()
        .rposition(|r| r.kind == EntryKind::Retry.as_str())
        .map_or(0, |last| last + 1);
    for record in &records[current..] {
        let entry: OplogEntry = record.entry().map_err(|error| {
            format!(
                "oplog entry {} ({}) cannot be replayed: {error}",
                record.seq, record.kind
            )
        })?;
        if entry.kind().is_host() {
            // It parses: the stored payload goes as it is, not serialized a second time.
            replay.push(proto::OplogEntry {
                kind: record.kind.clone(),
                payload: record.payload.clone().into_bytes(),
            });
        }
    }
    Ok(replay)
}

/// Compiles the command definition stored with a call.
pub fn interface_of(record: &CallRecord) -> Result<CommandInterface, String> {
    let command = record
        .spec
        .command
        .as_ref()
        .ok_or("the call's spec holds no command definition")?;
    CommandInterface::compile(command, "command").map_err(|e| e.to_string())
}

/// `TOOLGRID_APPROVED_BY` for a call that waited for approval and was approved: who
/// decided it (`operator:...`, `agent:...` or `timeout`).
fn approved_by(spec: &toolgrid_store::CallSpec) -> Option<(String, String)> {
    spec.chain
        .approved
        .as_ref()
        .filter(|d| d.approved)
        .map(|d| {
            (
                toolgrid_core::call::APPROVED_BY_ENV.to_string(),
                d.by.clone(),
            )
        })
}

fn assign_of(
    call: &Call,
    epoch: Epoch,
    attempt: u32,
    replay: Vec<proto::OplogEntry>,
    delivery: secrets::Delivery,
) -> proto::Assign {
    let record = &call.record;
    let spec = &record.spec;
    let now = now_ms();
    // What is left of the call's deadline as it stands (moved by its progress so far), and
    // of its hard cap.
    let (remaining, max_remaining) = match call.idle_deadline() {
        Some(rule) => (
            (call.deadline_ms - now).max(1) as u64,
            (rule.hard_ms() - now).max(1) as u64,
        ),
        None => (spec.limits.timeout_ms, spec.limits.timeout_ms),
    };
    proto::Assign {
        call_id: record.id.clone(),
        epoch: epoch.get(),
        namespace: record.namespace.clone(),
        tool: record.tool.clone(),
        command: record.command.clone(),
        release: record.release.clone(),
        digest: record.release_digest.clone(),
        argv: spec.argv.clone(),
        stdin: record.stdin.clone(),
        env: spec
            .env
            .clone()
            .into_iter()
            .chain(delivery.env)
            // Only the approval itself sets it: no config key can pose as an approver.
            .filter(|(name, _)| name != toolgrid_core::call::APPROVED_BY_ENV)
            .chain(approved_by(spec))
            .collect(),
        limits: Some(proto::Limits {
            memory_bytes: spec.limits.memory_bytes,
            cpu_time_ms: spec.limits.cpu_time_ms,
            output_bytes: spec.limits.output_bytes,
            timeout_ms: remaining.min(spec.limits.timeout_ms.max(1)),
            request_bytes: spec.limits.request_bytes,
            response_bytes: spec.limits.response_bytes,
            idle_timeout_ms: spec.limits.timeout_ms,
            max_timeout_ms: max_remaining,
        }),
        replay,
        effect: spec.effect.as_str().into(),
        idempotency_key: record.idempotency_key.clone().unwrap_or_default(),
        attempt,
        egress_json: serde_json::to_string(&spec.egress).unwrap_or_default(),
        upstream_json: spec
            .upstream
            .as_ref()
            .and_then(|u| serde_json::to_string(u).ok())
            .unwrap_or_default(),
        args_json: if spec.upstream.is_some() {
            record.args.to_string()
        } else {
            String::new()
        },
        replay_chunks: 0,
        secrets: delivery.secrets,
        agent: spec.access.agent.clone().unwrap_or_default(),
        filesystem: match toolgrid_core::workspace::WorkspaceKey::of_call(
            &record.namespace,
            &spec.access,
        ) {
            Some(_) => spec.access.filesystem.as_str().to_string(),
            None => String::new(),
        },
        files: spec
            .files
            .iter()
            .map(|f| proto::ReleaseFile {
                path: f.path.clone(),
                digest: f.digest.clone(),
                size: f.size,
            })
            .collect(),
        // The dispatch span's, set as it is sent.
        traceparent: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::call::{ErrorKind, Retry, WallClock};

    fn record(seq: u64, entry: &OplogEntry) -> toolgrid_store::OplogRecord {
        toolgrid_store::OplogRecord {
            seq,
            epoch: 1,
            kind: entry.kind().as_str().to_string(),
            payload: entry.payload_text(),
            recorded_at_ms: 0,
        }
    }

    #[test]
    fn a_replay_holds_only_the_current_attempts_host_calls() {
        let clock = |secs| OplogEntry::WallClock(WallClock { secs, nanos: 0 });
        let retry = |attempt| {
            OplogEntry::Retry(Retry {
                attempt,
                error: CallError::new(ErrorKind::Unavailable, "busy"),
                backoff_ms: 10,
            })
        };
        let entries = [
            clock(1),
            clock(2),
            retry(1),
            clock(3),
            retry(2),
            clock(4),
            clock(5),
        ];
        let records: Vec<_> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| record(i as u64, e))
            .collect();
        let replay = replay_of(&records).unwrap();
        let secs: Vec<u64> = replay
            .iter()
            .map(
                |e| match OplogEntry::from_text(&e.kind, &e.payload).unwrap() {
                    OplogEntry::WallClock(c) => c.secs,
                    other => panic!("{other:?}"),
                },
            )
            .collect();
        assert_eq!(secs, [4, 5]);
        // Right after a retry, nothing is replayed: the next attempt starts afresh.
        assert!(replay_of(&records[..5]).unwrap().is_empty());
        // Without retries, every host call is.
        assert_eq!(replay_of(&records[..2]).unwrap().len(), 2);
    }
}
