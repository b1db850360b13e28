//! The scheduler: worker sessions, slots, leases, epochs and failover.
//!
//! Calls wait in one queue and go to a worker of their release's pool with a free slot,
//! preferring one that has the release compiled. Every assignment bumps the call's epoch
//! in the store; a worker whose stream breaks or whose lease lapses loses its calls, which
//! are fenced (so its late appends are refused) and handed to another worker to replay.

mod link;
mod watch;

pub use link::WorkerLinkService;
pub use watch::{CallUpdate, CallWatch, Progress};

use crate::catalog::interface::CommandInterface;
use crate::error::ErrorKind;
use crate::proto::{self, ControlEvent, control_event};
use crate::store::{CallError, CallRecord, NewEntry, Store, StoreError, now_ms};
use crate::worker::recorder::is_host_entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};
use tonic::Status;

/// Timing of the worker link.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// How often workers heartbeat.
    pub heartbeat_interval: Duration,
    /// A worker silent this long is dead and loses its calls.
    pub lease: Duration,
    /// After a control plane restart, how long running calls wait for their worker to
    /// re-attach before they are reassigned.
    pub reattach_grace: Duration,
    /// How long past its deadline a running call may go unreported before it is failed.
    pub deadline_grace: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            heartbeat_interval: Duration::from_millis(500),
            lease: Duration::from_secs(2),
            reattach_grace: Duration::from_secs(5),
            deadline_grace: Duration::from_secs(5),
        }
    }
}

/// Judges a finished run into the call's outcome (the gateway's completion step).
pub type Judge =
    fn(&CommandInterface, &CallRecord, &proto::CallResult, &str) -> crate::store::CallOutcome;

/// The outbound half of a worker's stream.
pub type ControlSender = mpsc::Sender<Result<ControlEvent, Status>>;

struct WorkerEntry {
    session: u64,
    pool: String,
    slots: u32,
    busy: HashSet<String>,
    cached: HashSet<String>,
    tx: ControlSender,
    lease_until: Instant,
    /// Ends the session's stream at once (a lapsed lease), so a paused worker that wakes
    /// up finds its stream gone and its commits unacknowledged.
    stop: Arc<Notify>,
}

struct Queued {
    record: Arc<CallRecord>,
    interface: Option<Arc<CommandInterface>>,
}

struct Running {
    record: Arc<CallRecord>,
    interface: Option<Arc<CommandInterface>>,
    worker: String,
    session: u64,
    /// 0 while the assignment is being written.
    epoch: u64,
}

/// A running call found in the store at start-up, waiting for its worker to re-attach.
struct Orphan {
    record: Arc<CallRecord>,
    until: Instant,
}

#[derive(Default)]
struct State {
    workers: HashMap<String, WorkerEntry>,
    next_session: u64,
    queue: VecDeque<Queued>,
    running: HashMap<String, Running>,
    orphans: HashMap<String, Orphan>,
}

impl State {
    /// Gives back the slot `plan_one` reserved on `worker` for a call that did not go out.
    fn unreserve(&mut self, call_id: &str, worker: &str) {
        self.running.remove(call_id);
        if let Some(w) = self.workers.get_mut(worker) {
            w.busy.remove(call_id);
        }
    }
}

/// A running call past its deadline: its record, its worker's stream, its epoch.
type LateCall = (Arc<CallRecord>, Option<ControlSender>, u64);

/// A snapshot of one worker, for status and `toolgrid get pools`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    pub id: String,
    pub pool: String,
    pub slots: u32,
    pub busy: u32,
}

pub struct Scheduler {
    store: Arc<dyn Store>,
    calls: Arc<CallWatch>,
    config: SchedulerConfig,
    judge: Judge,
    state: Mutex<State>,
    wake: Notify,
    /// When this scheduler started; workers of a previous control plane may still be
    /// re-attaching until `reattach_grace` has passed.
    started: Instant,
}

impl Scheduler {
    pub fn new(
        store: Arc<dyn Store>,
        calls: Arc<CallWatch>,
        config: SchedulerConfig,
        judge: Judge,
    ) -> Arc<Self> {
        Arc::new(Scheduler {
            store,
            calls,
            config,
            judge,
            state: Mutex::default(),
            wake: Notify::new(),
            started: Instant::now(),
        })
    }

    /// Whether workers of a previous control plane may still be re-attaching, so an
    /// empty worker set says nothing about the pool's health yet.
    pub fn reattaching(&self) -> bool {
        self.started.elapsed() < self.config.reattach_grace
    }

    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Loads the calls a previous control plane left unfinished: pending ones queue again,
    /// running ones wait for their worker to re-attach.
    pub async fn recover(&self) -> Result<usize, StoreError> {
        let unfinished = self.store.unfinished_calls().await?;
        let count = unfinished.len();
        let until = Instant::now() + self.config.reattach_grace;
        let mut state = self.lock();
        for record in unfinished {
            let record = Arc::new(record);
            if record.state == crate::store::CallState::Running {
                state
                    .orphans
                    .insert(record.id.clone(), Orphan { record, until });
            } else {
                state.queue.push_back(Queued {
                    record,
                    interface: None,
                });
            }
        }
        drop(state);
        if count > 0 {
            tracing::info!(calls = count, "recovered unfinished calls");
        }
        self.wake.notify_one();
        Ok(count)
    }

    /// Queues a newly admitted call.
    pub fn submit(&self, record: CallRecord, interface: Arc<CommandInterface>) {
        self.lock().queue.push_back(Queued {
            record: Arc::new(record),
            interface: Some(interface),
        });
        self.wake.notify_one();
    }

    /// Workers attached now.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let state = self.lock();
        let mut workers: Vec<_> = state
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

    /// Calls of a release not yet ended (queued or running), e.g. before deleting it.
    pub fn calls_of_release(&self, namespace: &str, release: &str) -> usize {
        let state = self.lock();
        let matches = |r: &CallRecord| r.namespace == namespace && r.release == release;
        state.queue.iter().filter(|q| matches(&q.record)).count()
            + state
                .running
                .values()
                .filter(|r| matches(&r.record))
                .count()
            + state
                .orphans
                .values()
                .filter(|o| matches(&o.record))
                .count()
    }

    fn export_gauges(&self) {
        use crate::metrics::PoolLabel;
        let metrics = crate::metrics::global();
        let state = self.lock();
        let mut pools: HashMap<String, (i64, i64, i64)> = HashMap::new();
        for worker in state.workers.values() {
            let entry = pools.entry(worker.pool.clone()).or_default();
            entry.0 += 1;
            entry.1 += worker.busy.len() as i64;
        }
        for queued in &state.queue {
            pools.entry(queued.record.spec.pool.clone()).or_default().2 += 1;
        }
        for (pool, (workers, busy, queued)) in pools {
            let label = PoolLabel { pool };
            metrics.workers.get_or_create(&label).set(workers);
            metrics.busy_slots.get_or_create(&label).set(busy);
            metrics.queue_depth.get_or_create(&label).set(queued);
        }
    }

    /// Calls waiting for a slot, by pool.
    pub fn queued(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for q in &self.lock().queue {
            *out.entry(q.record.spec.pool.clone()).or_default() += 1;
        }
        out
    }

    /// Runs the dispatcher until the process ends: assignments, leases and deadlines.
    pub async fn run(self: Arc<Self>) {
        let tick = Duration::from_millis(100);
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(tick) => {}
            }
            self.expire_leases().await;
            self.expire_orphans().await;
            self.expire_deadlines().await;
            self.dispatch().await;
            self.calls.prune();
            self.export_gauges();
        }
    }

    /// Registers a worker's new session, adopting the in-flight calls it reports when the
    /// store agrees they are still its own. Returns the session and calls to abandon.
    pub(crate) async fn register(
        &self,
        register: &proto::Register,
        tx: ControlSender,
        stop: Arc<Notify>,
    ) -> (u64, Vec<String>) {
        let mut abandon = Vec::new();
        let mut adopted = Vec::new();
        for call in &register.in_flight {
            let current = self.store.get_call(&call.call_id).await.ok().flatten();
            match current {
                Some(record)
                    if record.state == crate::store::CallState::Running
                        && record.epoch == call.epoch
                        && record.worker.as_deref() == Some(register.worker_id.as_str()) =>
                {
                    adopted.push(record)
                }
                _ => abandon.push(call.call_id.clone()),
            }
        }
        let (session, stale) = {
            let mut state = self.lock();
            state.next_session += 1;
            let session = state.next_session;
            let mut busy = HashSet::new();
            for record in adopted {
                let id = record.id.clone();
                if state.orphans.remove(&id).is_none() {
                    // Still assigned to an older session of this worker, or unknown here.
                    if let Some(running) = state.running.get(&id)
                        && (running.worker != register.worker_id || running.epoch != record.epoch)
                    {
                        abandon.push(id);
                        continue;
                    }
                }
                let interface = state.running.remove(&id).and_then(|r| r.interface);
                busy.insert(id.clone());
                state.running.insert(
                    id,
                    Running {
                        epoch: record.epoch,
                        record: Arc::new(record),
                        interface,
                        worker: register.worker_id.clone(),
                        session,
                    },
                );
            }
            if state.workers.remove(&register.worker_id).is_some() {
                tracing::info!(worker = %register.worker_id, "worker re-attached; its old session ends");
            }
            // Calls of an older session that the worker no longer reports are taken back.
            let stale_ids: Vec<String> = state
                .running
                .iter()
                .filter(|(_, r)| r.worker == register.worker_id && r.session != session)
                .map(|(id, _)| id.clone())
                .collect();
            let stale: Vec<Running> = stale_ids
                .into_iter()
                .filter_map(|id| state.running.remove(&id))
                .collect();
            state.workers.insert(
                register.worker_id.clone(),
                WorkerEntry {
                    session,
                    pool: register.pool.clone(),
                    slots: register.slots.max(1),
                    busy,
                    cached: register.cached_digests.iter().cloned().collect(),
                    tx,
                    lease_until: Instant::now() + self.config.lease,
                    stop,
                },
            );
            (session, stale)
        };
        tracing::info!(worker = %register.worker_id, pool = %register.pool, slots = register.slots, session, "worker attached");
        for running in stale {
            let reason = format!("worker {} re-attached without it", register.worker_id);
            self.take_back(running.record, running.interface, running.epoch, &reason)
                .await;
        }
        self.wake.notify_one();
        (session, abandon)
    }

    pub(crate) fn heartbeat(
        &self,
        worker: &str,
        session: u64,
        heartbeat: &proto::Heartbeat,
    ) -> bool {
        let mut state = self.lock();
        match state.workers.get_mut(worker) {
            Some(entry) if entry.session == session => {
                entry.lease_until = Instant::now() + self.config.lease;
                entry
                    .cached
                    .extend(heartbeat.cached_digests.iter().cloned());
                true
            }
            _ => false,
        }
    }

    pub(crate) fn is_current(&self, worker: &str, session: u64) -> bool {
        self.lock()
            .workers
            .get(worker)
            .is_some_and(|w| w.session == session)
    }

    pub(crate) fn progress(&self, worker: &str, progress: &proto::WorkerProgress) {
        self.calls.progress(
            &progress.call_id,
            Progress {
                stage: progress.stage.clone(),
                message: progress.message.clone(),
                worker: worker.to_string(),
                epoch: progress.epoch,
            },
        );
    }

    /// Commits a worker's oplog entries under its epoch.
    pub(crate) async fn append(&self, append: &proto::OplogAppend) -> proto::AppendAck {
        let entries = append.entries.iter().map(entry_from_proto).collect();
        let result = self
            .store
            .append_oplog(&append.call_id, append.epoch, append.first_wseq, entries)
            .await;
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

    /// Completes a call from its worker's result; returns whether it was accepted.
    pub(crate) async fn complete(&self, worker: &str, result: proto::CallResult) -> bool {
        let (record, interface) = {
            let state = self.lock();
            match state.running.get(&result.call_id) {
                Some(r) => (Some(r.record.clone()), r.interface.clone()),
                None => (None, None),
            }
        };
        let record = match record {
            Some(record) => record,
            None => match self.store.get_call(&result.call_id).await {
                Ok(Some(record)) => Arc::new(record),
                _ => return false,
            },
        };
        let interface = match interface {
            Some(interface) => interface,
            None => match interface_of(&record) {
                Ok(interface) => Arc::new(interface),
                Err(error) => {
                    tracing::error!(call = %record.id, %error, "stored command definition does not compile");
                    return false;
                }
            },
        };
        let outcome = (self.judge)(&interface, &record, &result, worker);
        let entries = result.entries.iter().map(entry_from_proto).collect();
        let accepted = match self
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
                tracing::info!(
                    call = %done.id, tool = %done.tool, command = %done.command, worker, epoch = result.epoch,
                    state = done.state.as_str(), "call finished"
                );
                crate::metrics::call_ended(
                    &done.tool,
                    done.error
                        .as_ref()
                        .map(|e| e.kind.as_str())
                        .unwrap_or("succeeded"),
                );
                self.calls.finish(done);
                true
            }
            Err(StoreError::StaleEpoch { current, state, .. }) => {
                tracing::warn!(call = %result.call_id, worker, epoch = result.epoch, current, state, "result refused: stale epoch");
                false
            }
            Err(error) => {
                tracing::error!(call = %result.call_id, %error, "cannot store the call's result");
                false
            }
        };
        let mut state = self.lock();
        let matches = state
            .running
            .get(&result.call_id)
            .is_some_and(|r| r.worker == worker && r.epoch == result.epoch);
        if matches {
            state.running.remove(&result.call_id);
        }
        if let Some(entry) = state.workers.get_mut(worker) {
            entry.busy.remove(&result.call_id);
        }
        drop(state);
        self.wake.notify_one();
        accepted
    }

    /// A worker's session ended (stream closed or lease lapsed): its calls move on.
    pub(crate) async fn worker_lost(&self, worker: &str, session: u64, reason: &str) {
        let lost: Vec<Running> = {
            let mut state = self.lock();
            let current = state
                .workers
                .get(worker)
                .is_some_and(|w| w.session == session);
            if !current {
                return;
            }
            if let Some(entry) = state.workers.remove(worker) {
                entry.stop.notify_one();
            }
            let ids: Vec<String> = state
                .running
                .iter()
                .filter(|(_, r)| r.worker == worker && r.session == session)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| state.running.remove(&id))
                .collect()
        };
        tracing::warn!(worker, session, calls = lost.len(), "worker lost: {reason}");
        for running in lost {
            self.take_back(
                running.record,
                running.interface,
                running.epoch,
                &format!("worker {worker} lost: {reason}"),
            )
            .await;
        }
        self.wake.notify_one();
    }

    /// Fences a call's current assignment and queues it again (at the front).
    async fn take_back(
        &self,
        record: Arc<CallRecord>,
        interface: Option<Arc<CommandInterface>>,
        epoch: u64,
        reason: &str,
    ) {
        if epoch == 0 {
            // The assignment was never written: the call is still pending in the store.
            self.lock().queue.push_front(Queued { record, interface });
            return;
        }
        match self.store.fence_call(&record.id, epoch, reason).await {
            Ok(new_epoch) => {
                crate::metrics::global().failovers.inc();
                tracing::info!(call = %record.id, epoch = new_epoch, "call fenced and queued for another worker: {reason}");
                self.lock().queue.push_front(Queued { record, interface });
            }
            Err(StoreError::StaleEpoch { .. }) | Err(StoreError::NotFound(_)) => {}
            Err(error) => {
                tracing::error!(call = %record.id, %error, "cannot fence call; retrying later");
                let until = Instant::now();
                self.lock()
                    .orphans
                    .insert(record.id.clone(), Orphan { record, until });
            }
        }
    }

    async fn expire_leases(&self) {
        let now = Instant::now();
        let expired: Vec<(String, u64)> = self
            .lock()
            .workers
            .iter()
            .filter(|(_, w)| w.lease_until < now)
            .map(|(id, w)| (id.clone(), w.session))
            .collect();
        for (worker, session) in expired {
            self.worker_lost(&worker, session, "lease lapsed (no heartbeat)")
                .await;
        }
    }

    async fn expire_orphans(&self) {
        let now = Instant::now();
        let expired: Vec<Orphan> = {
            let mut state = self.lock();
            let ids: Vec<String> = state
                .orphans
                .iter()
                .filter(|(_, o)| o.until <= now)
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| state.orphans.remove(&id))
                .collect()
        };
        for orphan in expired {
            let epoch = orphan.record.epoch;
            self.take_back(
                orphan.record,
                None,
                epoch,
                "its worker did not re-attach after a control plane restart",
            )
            .await;
        }
    }

    async fn expire_deadlines(&self) {
        let now = now_ms();
        let grace = self.config.deadline_grace.as_millis() as i64;
        let (queued, running): (Vec<Arc<CallRecord>>, Vec<LateCall>) = {
            let mut state = self.lock();
            let mut queued = Vec::new();
            state.queue.retain(|q| {
                let late = q.record.spec.deadline_ms > 0 && q.record.spec.deadline_ms < now;
                if late {
                    queued.push(q.record.clone());
                }
                !late
            });
            let late: Vec<String> = state
                .running
                .iter()
                .filter(|(_, r)| {
                    r.record.spec.deadline_ms > 0 && r.record.spec.deadline_ms + grace < now
                })
                .map(|(id, _)| id.clone())
                .collect();
            let mut running = Vec::new();
            for id in late {
                if let Some(r) = state.running.remove(&id) {
                    let tx = state.workers.get_mut(&r.worker).map(|w| {
                        w.busy.remove(&id);
                        w.tx.clone()
                    });
                    running.push((r.record, tx, r.epoch));
                }
            }
            (queued, running)
        };
        for record in queued {
            self.fail(
                &record,
                ErrorKind::Timeout,
                "no worker slot became free before the call's deadline",
            )
            .await;
        }
        for (record, tx, epoch) in running {
            if let Some(tx) = tx {
                let cancel = proto::Cancel {
                    call_id: record.id.clone(),
                    epoch,
                    reason: "deadline passed".into(),
                };
                let _ = tx.try_send(Ok(ControlEvent {
                    event: Some(control_event::Event::Cancel(cancel)),
                }));
            }
            self.fail(
                &record,
                ErrorKind::Timeout,
                "the call's worker did not report before the deadline",
            )
            .await;
        }
    }

    async fn fail(&self, record: &CallRecord, kind: ErrorKind, message: &str) {
        let error = CallError {
            kind: kind.as_str().into(),
            message: message.into(),
            ..CallError::default()
        };
        match self.store.fail_call(&record.id, error).await {
            Ok(done) => {
                crate::metrics::call_ended(&done.tool, kind.as_str());
                self.calls.finish(done)
            }
            Err(error) => tracing::error!(call = %record.id, %error, "cannot fail call"),
        }
    }

    /// Hands queued calls to free slots.
    async fn dispatch(&self) {
        loop {
            let plan = self.plan_one();
            let Some((queued, worker, session, tx)) = plan else {
                return;
            };
            let call_id = queued.record.id.clone();
            match self.store.assign_call(&call_id, &worker).await {
                Ok(epoch) => {
                    // Epoch 1 is a call's first assignment; any later one re-runs it from its
                    // oplog. Without the oplog it must not run at all.
                    let (replay, attempt) = if epoch > 1 {
                        match self.store.oplog(&call_id).await {
                            Ok(entries) => {
                                let attempt =
                                    entries.iter().filter(|e| e.kind == "assigned").count() as u32;
                                let replay = entries
                                    .into_iter()
                                    .filter(|e| is_host_entry(&e.kind))
                                    .map(|e| proto::OplogEntry {
                                        kind: e.kind,
                                        payload: e.payload.to_string().into_bytes(),
                                    })
                                    .collect();
                                (replay, attempt.max(1))
                            }
                            Err(error) => {
                                tracing::error!(call = %call_id, %error, "cannot read the oplog to replay; retrying");
                                let mut state = self.lock();
                                state.unreserve(&call_id, &worker);
                                state.queue.push_front(queued);
                                return;
                            }
                        }
                    } else {
                        (Vec::new(), 1)
                    };
                    {
                        let mut state = self.lock();
                        if let Some(running) = state.running.get_mut(&call_id)
                            && running.worker == worker
                        {
                            running.epoch = epoch;
                        }
                    }
                    let assign = assign_of(&queued.record, epoch, attempt, replay);
                    tracing::info!(call = %call_id, tool = %queued.record.tool, worker, epoch, "call assigned");
                    self.calls.progress(
                        &call_id,
                        Progress {
                            stage: "assigned".into(),
                            message: String::new(),
                            worker: worker.clone(),
                            epoch,
                        },
                    );
                    if tx
                        .send(Ok(ControlEvent {
                            event: Some(control_event::Event::Assign(assign)),
                        }))
                        .await
                        .is_err()
                    {
                        self.worker_lost(&worker, session, "stream closed").await;
                    }
                }
                Err(StoreError::StaleEpoch { .. }) | Err(StoreError::NotFound(_)) => {
                    self.lock().unreserve(&call_id, &worker);
                }
                Err(error) => {
                    tracing::error!(call = %call_id, %error, "cannot assign call; retrying");
                    let mut state = self.lock();
                    state.unreserve(&call_id, &worker);
                    state.queue.push_front(queued);
                    return;
                }
            }
        }
    }

    /// Picks the first queued call that has a free slot, and reserves the slot.
    fn plan_one(&self) -> Option<(Queued, String, u64, ControlSender)> {
        let mut state = self.lock();
        let state = &mut *state;
        for index in 0..state.queue.len() {
            let record = &state.queue[index].record;
            let limit = record.spec.limits.instances;
            if limit > 0 {
                let running = state
                    .running
                    .values()
                    .filter(|r| r.record.release == record.release)
                    .count();
                if running >= limit as usize {
                    continue;
                }
            }
            let best = state
                .workers
                .iter()
                .filter(|(_, w)| w.pool == record.spec.pool && (w.busy.len() as u32) < w.slots)
                .min_by_key(|(id, w)| {
                    (
                        !w.cached.contains(&record.release_digest),
                        w.busy.len(),
                        (*id).clone(),
                    )
                })
                .map(|(id, _)| id.clone());
            let Some(worker) = best else { continue };
            let queued = state.queue.remove(index)?;
            let entry = state.workers.get_mut(&worker)?;
            entry.busy.insert(queued.record.id.clone());
            entry.cached.insert(queued.record.release_digest.clone());
            let (session, tx) = (entry.session, entry.tx.clone());
            state.running.insert(
                queued.record.id.clone(),
                Running {
                    record: queued.record.clone(),
                    interface: queued.interface.clone(),
                    worker: worker.clone(),
                    session,
                    epoch: 0,
                },
            );
            return Some((queued, worker, session, tx));
        }
        None
    }
}

/// Compiles the command definition stored with a call.
pub fn interface_of(record: &CallRecord) -> Result<CommandInterface, String> {
    let command: crate::api::Command = serde_json::from_value(record.spec.command.clone())
        .map_err(|e| format!("stored command definition: {e}"))?;
    CommandInterface::compile(&command, "command").map_err(|e| e.to_string())
}

fn entry_from_proto(entry: &proto::OplogEntry) -> NewEntry {
    let payload = serde_json::from_slice(&entry.payload).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&entry.payload).into_owned())
    });
    NewEntry::new(entry.kind.clone(), payload)
}

fn assign_of(
    record: &CallRecord,
    epoch: u64,
    attempt: u32,
    replay: Vec<proto::OplogEntry>,
) -> proto::Assign {
    let spec = &record.spec;
    let remaining = if spec.deadline_ms > 0 {
        (spec.deadline_ms - now_ms()).max(1) as u64
    } else {
        spec.limits.timeout_ms
    };
    proto::Assign {
        call_id: record.id.clone(),
        epoch,
        namespace: record.namespace.clone(),
        tool: record.tool.clone(),
        command: record.command.clone(),
        release: record.release.clone(),
        digest: record.release_digest.clone(),
        argv: spec.argv.clone(),
        stdin: record.stdin.clone(),
        env: spec.env.clone().into_iter().collect(),
        limits: Some(proto::Limits {
            memory_bytes: spec.limits.memory_bytes,
            cpu_time_ms: spec.limits.cpu_time_ms,
            output_bytes: spec.limits.output_bytes,
            timeout_ms: remaining.min(spec.limits.timeout_ms.max(1)),
        }),
        replay,
        effect: spec.effect.clone(),
        idempotency_key: record.idempotency_key.clone().unwrap_or_default(),
        attempt,
        egress_json: serde_json::to_string(&spec.egress).unwrap_or_default(),
    }
}
