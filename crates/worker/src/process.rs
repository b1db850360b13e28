//! The worker process: attach to the control plane, run what it assigns, report results,
//! and re-attach after a broken stream with the calls still in flight.

pub use super::link::WorkerCredential;
use super::link::{Link, LinkSlot, link_client};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_stream::wrappers::ReceiverStream;
use toolgrid_core::call::RunLimits;
use toolgrid_core::call::{OplogEntry, ReplayStarted};
use toolgrid_core::spec::Effect;
use toolgrid_proto::{self as proto, WorkerEvent, control_event, worker_event};
use toolgrid_sandbox::http::AppendError;
use toolgrid_sandbox::http::OplogSink;
use toolgrid_sandbox::recorder::AbortKind;
use toolgrid_sandbox::runtime::{PrepareError, RunRequest, Runtime, RuntimeConfig};
use tracing::Instrument;

/// Settings of one worker process.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The control plane's gRPC address (`http://127.0.0.1:7070`).
    pub control_plane: String,
    pub worker_id: String,
    /// `namespace/name` of the WorkerPool.
    pub pool: String,
    pub slots: u32,
    pub cache_dir: PathBuf,
    pub max_memory_bytes: u64,
    pub pooling: bool,
    /// Exit after this long without reaching the control plane.
    pub reconnect_timeout: Duration,
    /// Exit when this process is no longer our parent (workers started by `toolgrid up`).
    pub parent_pid: Option<u32>,
    /// The token it attaches with.
    pub credential: WorkerCredential,
    /// What to trust for an `https://` control plane.
    pub trust: toolgrid_proto::tls::Trust,
    /// On SIGTERM, how long the calls it holds may take to finish on it before the rest
    /// are given up to another worker.
    pub drain_grace: Duration,
}

/// A call this worker holds: running, or finished with its result not yet acknowledged.
struct Held {
    epoch: u64,
    task: Option<AbortHandle>,
    result: Option<proto::CallResult>,
}

#[derive(Default)]
struct InFlight {
    calls: Mutex<HashMap<String, Held>>,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reported(&self) -> Vec<proto::InFlightCall> {
        self.lock()
            .iter()
            .map(|(id, held)| proto::InFlightCall {
                call_id: id.clone(),
                epoch: held.epoch,
            })
            .collect()
    }

    fn busy(&self) -> u32 {
        self.lock().values().filter(|h| h.result.is_none()).count() as u32
    }

    fn abandon(&self, call_id: &str) {
        if let Some(held) = self.lock().remove(call_id)
            && let Some(task) = held.task
        {
            task.abort();
        }
    }
}

/// Runs the worker until the control plane stays unreachable past its reconnect timeout.
///
/// The work runs as a task on the runtime's worker threads, not on the thread that awaits
/// this (the binary's `block_on` thread): the link's connection tasks run there too, so a
/// message from the control plane wakes the session's loop on the thread that read it
/// rather than on another one.
pub async fn run(config: WorkerConfig) -> anyhow::Result<()> {
    tokio::spawn(serve(config)).await?
}

async fn serve(config: WorkerConfig) -> anyhow::Result<()> {
    start_guest_runtime()?;
    let runtime = Arc::new(Runtime::new(&RuntimeConfig {
        cache_dir: config.cache_dir.clone(),
        slots: config.slots,
        max_memory_bytes: config.max_memory_bytes,
        pooling: config.pooling,
    })?);
    if let Some(parent) = config.parent_pid {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if std::os::unix::process::parent_id() != parent {
                    tracing::warn!("parent process {parent} is gone; exiting");
                    std::process::exit(0);
                }
            }
        });
    }
    let in_flight = Arc::new(InFlight::default());
    let slot = LinkSlot::new();
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drain_asked = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(drain_on_sigterm(
        config.drain_grace,
        draining.clone(),
        drain_asked.clone(),
        in_flight.clone(),
        slot.clone(),
    ));
    let mut last_attached = Instant::now();
    let mut backoff = Duration::from_millis(50);
    // The secret of this worker's last session: it proves a new session is this worker.
    let mut resume = String::new();
    loop {
        match session(
            &config,
            &runtime,
            &in_flight,
            &slot,
            (&draining, &drain_asked),
            &mut resume,
        )
        .await
        {
            Ok(attached) => {
                if attached {
                    last_attached = Instant::now();
                    backoff = Duration::from_millis(50);
                }
            }
            Err(error) => match error.downcast_ref::<tonic::Status>().map(|s| s.code()) {
                Some(
                    tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied
                    | tonic::Code::AlreadyExists,
                ) => tracing::warn!(%error, "the control plane refused this worker"),
                _ => tracing::debug!(%error, "cannot attach to the control plane"),
            },
        }
        slot.clear();
        if last_attached.elapsed() > config.reconnect_timeout {
            anyhow::bail!(
                "the control plane at {} has been unreachable for {:?}",
                config.control_plane,
                config.reconnect_timeout
            );
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// SIGTERM (a pod deleted, a rolling update, scale-in) or the control plane's `Drain`
/// (`toolgrid drain`): the worker drains. It tells the
/// control plane at once (a heartbeat with `draining`), which offers it no new call; the
/// calls it holds finish on it, their results acknowledged, within `grace`; those that do
/// not are given up (`Abandoned`, so they move to another worker now rather than at the
/// lease's end); then it exits.
async fn drain_on_sigterm(
    grace: Duration,
    draining: Arc<std::sync::atomic::AtomicBool>,
    asked: Arc<tokio::sync::Notify>,
    in_flight: Arc<InFlight>,
    slot: LinkSlot,
) {
    use std::sync::atomic::Ordering;
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    let why = match term {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = asked.notified() => "the control plane asked",
        },
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM: only the control plane can drain this worker");
            asked.notified().await;
            "the control plane asked"
        }
    };
    draining.store(true, Ordering::SeqCst);
    tracing::info!(busy = in_flight.busy(), grace = ?grace, "{why}: draining (no new calls; finishing those held)");
    if let Some(link) = slot.get() {
        let beat = proto::Heartbeat {
            busy: in_flight.busy(),
            cached_digests: Vec::new(),
            draining: true,
        };
        link.send(worker_event::Event::Heartbeat(beat)).await;
    }
    let deadline = Instant::now() + grace;
    // Held until each result is acknowledged (stored), so none is lost by exiting.
    while !in_flight.lock().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left: Vec<(String, u64)> = in_flight
        .lock()
        .iter()
        .filter(|(_, held)| held.result.is_none())
        .map(|(id, held)| (id.clone(), held.epoch))
        .collect();
    for (call_id, epoch) in left {
        tracing::warn!(call = %call_id, "the drain's grace period is over: giving the call up");
        in_flight.abandon(&call_id);
        if let Some(link) = slot.get() {
            let abandoned = proto::Abandoned {
                call_id,
                epoch,
                reason: "the worker stopped (its drain grace period ended)".into(),
            };
            link.send(worker_event::Event::Abandoned(abandoned)).await;
        }
    }
    // Let the last messages leave.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tracing::info!("drained; exiting");
    std::process::exit(0);
}

/// One attachment; returns whether it registered before it ended.
async fn session(
    config: &WorkerConfig,
    runtime: &Arc<Runtime>,
    in_flight: &Arc<InFlight>,
    slot: &LinkSlot,
    (draining, drain_asked): (
        &Arc<std::sync::atomic::AtomicBool>,
        &Arc<tokio::sync::Notify>,
    ),
    resume: &mut String,
) -> anyhow::Result<bool> {
    let bearer = config.credential.bearer().map_err(anyhow::Error::msg)?;
    let channel = toolgrid_proto::tls::client_endpoint(&config.control_plane, &config.trust)?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect()
        .await?;
    let mut client = link_client(channel.clone(), bearer.clone());
    let (tx, rx) = mpsc::channel::<WorkerEvent>(4096);
    let mut cached = runtime.cached_digests();
    cached.extend(runtime.compiled_digests());
    let register = proto::Register {
        worker_id: config.worker_id.clone(),
        pool: config.pool.clone(),
        slots: config.slots,
        cached_digests: cached,
        in_flight: in_flight.reported(),
        version: env!("CARGO_PKG_VERSION").into(),
        resume_secret: resume.clone(),
    };
    tx.send(WorkerEvent {
        event: Some(worker_event::Event::Register(register)),
    })
    .await?;
    let mut inbound = client.attach(ReceiverStream::new(rx)).await?.into_inner();
    let Some(first) = inbound.message().await? else {
        anyhow::bail!("the control plane closed the stream before Registered");
    };
    let Some(control_event::Event::Registered(registered)) = first.event else {
        anyhow::bail!("the control plane did not answer Register with Registered");
    };
    *resume = registered.session_secret.clone();
    for call_id in &registered.abandon {
        tracing::warn!(call = %call_id, "abandoning a call the control plane moved elsewhere");
        in_flight.abandon(call_id);
    }
    tracing::info!(worker = %config.worker_id, pool = %config.pool, "attached to {}", config.control_plane);

    let link = Arc::new(Link::new(tx.clone(), channel, config.credential.clone()));
    slot.set(link.clone());
    // Results that finished while detached go now.
    let pending: Vec<proto::CallResult> = in_flight
        .lock()
        .values()
        .filter_map(|h| h.result.clone())
        .collect();
    for result in pending {
        link.send(worker_event::Event::Result(result)).await;
    }

    let heartbeat = {
        let (tx, in_flight, runtime, draining) = (
            tx.clone(),
            in_flight.clone(),
            runtime.clone(),
            draining.clone(),
        );
        let every = Duration::from_millis(u64::from(registered.heartbeat_interval_ms.max(50)));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let beat = proto::Heartbeat {
                    busy: in_flight.busy(),
                    cached_digests: runtime.compiled_digests(),
                    draining: draining.load(std::sync::atomic::Ordering::SeqCst),
                };
                if tx
                    .send(WorkerEvent {
                        event: Some(worker_event::Event::Heartbeat(beat)),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
    };

    // Chunked replays being received, by (call, epoch): chunks so far and their entries.
    let mut replays: HashMap<(String, u64), (u32, Vec<proto::OplogEntry>)> = HashMap::new();
    let outcome = loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => message,
            Ok(None) => break Ok(true),
            Err(status) => {
                tracing::warn!(status = %status.message(), "worker stream broke");
                break Ok(true);
            }
        };
        match message.event {
            Some(control_event::Event::ReplayChunk(chunk)) => {
                // Parts of a large replay come ahead of their Assign, in order.
                if replays.len() >= MAX_PENDING_REPLAYS
                    && !replays.contains_key(&(chunk.call_id.clone(), chunk.epoch))
                {
                    tracing::warn!(call = %chunk.call_id, "too many replays being received; dropping one");
                    continue;
                }
                let (count, entries) = replays
                    .entry((chunk.call_id, chunk.epoch))
                    .or_insert_with(|| (0, Vec::new()));
                *count += 1;
                entries.extend(chunk.entries);
            }
            Some(control_event::Event::Assign(mut assign)) => {
                if draining.load(std::sync::atomic::Ordering::SeqCst) {
                    // Offered before the control plane heard it is stopping: back at once.
                    let abandoned = proto::Abandoned {
                        call_id: assign.call_id,
                        epoch: assign.epoch,
                        reason: "the worker is draining".into(),
                    };
                    link.send(worker_event::Event::Abandoned(abandoned)).await;
                    continue;
                }
                if assign.replay_chunks > 0 {
                    let key = (assign.call_id.clone(), assign.epoch);
                    match replays.remove(&key) {
                        Some((count, mut entries)) if count == assign.replay_chunks => {
                            entries.append(&mut assign.replay);
                            assign.replay = entries;
                        }
                        _ => {
                            // The replay did not arrive whole: this worker cannot run the
                            // call; the control plane gives it to another.
                            tracing::warn!(call = %assign.call_id, "a chunked replay arrived incomplete; giving the call up");
                            let abandoned = proto::Abandoned {
                                call_id: assign.call_id,
                                epoch: assign.epoch,
                                reason: "its replay arrived incomplete".into(),
                            };
                            link.send(worker_event::Event::Abandoned(abandoned)).await;
                            continue;
                        }
                    }
                }
                start_call(config, runtime, in_flight, slot, assign)
            }
            Some(control_event::Event::Ack(ack)) => link.acknowledge(ack),
            Some(control_event::Event::ToolAnswer(answer)) => link.answer(answer),
            Some(control_event::Event::ResultAck(ack)) if !ack.ok && ack.retry => {
                // Not stored yet (the store is unavailable): keep it and send it again.
                let result = in_flight
                    .lock()
                    .get(&ack.call_id)
                    .and_then(|h| h.result.clone());
                if let Some(result) = result {
                    tracing::warn!(call = %ack.call_id, "the control plane could not store the result yet; sending it again");
                    let link = link.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(RESULT_RETRY).await;
                        link.send(worker_event::Event::Result(result)).await;
                    });
                }
            }
            Some(control_event::Event::ResultAck(ack)) => {
                // Stored, or refused for good (the call moved on).
                let mut calls = in_flight.lock();
                if calls.get(&ack.call_id).is_some_and(|h| h.result.is_some()) {
                    calls.remove(&ack.call_id);
                }
            }
            Some(control_event::Event::Cancel(cancel)) => {
                tracing::warn!(call = %cancel.call_id, reason = %cancel.reason, "call cancelled");
                let matches = in_flight
                    .lock()
                    .get(&cancel.call_id)
                    .is_some_and(|h| h.epoch == cancel.epoch);
                if matches {
                    in_flight.abandon(&cancel.call_id);
                }
            }
            Some(control_event::Event::Drain(_)) => drain_asked.notify_one(),
            Some(control_event::Event::Registered(_)) | None => {}
        }
    };
    heartbeat.abort();
    link.close();
    outcome
}

fn start_call(
    config: &WorkerConfig,
    runtime: &Arc<Runtime>,
    in_flight: &Arc<InFlight>,
    slot: &LinkSlot,
    assign: proto::Assign,
) {
    let call_id = assign.call_id.clone();
    let epoch = assign.epoch;
    // The run's span, child of the scheduler's dispatch span when the control plane traces.
    let span = tracing::info_span!("run", call = %call_id, tool = %assign.tool, command = %assign.command, agent = %assign.agent, worker = %config.worker_id, epoch, attempt = assign.attempt);
    toolgrid_trace::adopt(&span, &assign.traceparent);
    {
        // A newer assignment of a call replaces an older one still held here.
        let mut calls = in_flight.lock();
        if let Some(old) = calls.remove(&call_id)
            && let Some(task) = old.task
        {
            task.abort();
        }
        calls.insert(
            call_id.clone(),
            Held {
                epoch,
                task: None,
                result: None,
            },
        );
    }
    let (runtime, in_flight_task, slot, worker_id) = (
        runtime.clone(),
        in_flight.clone(),
        slot.clone(),
        config.worker_id.clone(),
    );
    // Guests run on their own threads: a guest busy in a long host call cannot hold up this
    // worker's stream, its heartbeats or its acks.
    let task = guests().spawn(
        async move {
            let call_id = assign.call_id.clone();
            let result = match run_call(&runtime, &slot, &worker_id, assign).await {
                Ran::Result(result) => *result,
                Ran::Fenced => {
                    // The call belongs to another worker now; forget it quietly.
                    let mut calls = in_flight_task.lock();
                    if calls.get(&call_id).is_some_and(|h| h.epoch == epoch) {
                        calls.remove(&call_id);
                    }
                    return;
                }
                Ran::Abandoned(reason) => {
                    // A commit went unacknowledged: this run cannot go on. Say so, so the
                    // control plane hands the call to another worker at once.
                    {
                        let mut calls = in_flight_task.lock();
                        if calls.get(&call_id).is_some_and(|h| h.epoch == epoch) {
                            calls.remove(&call_id);
                        }
                    }
                    if let Some(link) = slot.get() {
                        let abandoned = proto::Abandoned {
                            call_id,
                            epoch,
                            reason,
                        };
                        link.send(worker_event::Event::Abandoned(abandoned)).await;
                    }
                    return;
                }
            };
            let held = {
                let mut calls = in_flight_task.lock();
                match calls.get_mut(&result.call_id) {
                    Some(held) if held.epoch == result.epoch => {
                        held.result = Some(result.clone());
                        held.task = None;
                        true
                    }
                    _ => false,
                }
            };
            if held && let Some(link) = slot.get() {
                link.send(worker_event::Event::Result(result)).await;
            }
        }
        .instrument(span),
    );
    if let Some(held) = in_flight.lock().get_mut(&call_id)
        && held.epoch == epoch
    {
        held.task = Some(task.abort_handle());
    }
}

/// How one assignment ended on this worker.
enum Ran {
    /// It ran to an end (a result or a failure) to report.
    Result(Box<proto::CallResult>),
    /// It was taken away mid-run: report nothing.
    Fenced,
    /// A commit went unacknowledged, so it stopped; the reason is reported.
    Abandoned(String),
}

/// The runtime calls run on, apart from the one that serves the worker link, so that guests
/// (and their synchronous host work) never starve the link's heartbeats and acks. Started by
/// [`run`]; it lives as long as the process.
static GUESTS: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

fn start_guest_runtime() -> std::io::Result<()> {
    if GUESTS.get().is_none() {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("guest")
            .enable_all()
            .build()?;
        // A concurrent start won the race: its runtime serves, and this one is not needed.
        if let Err(unused) = GUESTS.set(runtime) {
            std::mem::forget(unused);
        }
    }
    Ok(())
}

/// Where calls run: the guest runtime, or (before [`run`] started it) the current one.
fn guests() -> tokio::runtime::Handle {
    GUESTS
        .get()
        .map(|runtime| runtime.handle().clone())
        .unwrap_or_else(tokio::runtime::Handle::current)
}

/// Chunked replays a session receives at once, at most (each is followed by its Assign).
const MAX_PENDING_REPLAYS: usize = 64;

/// How long a result the control plane could not store waits before it is sent again.
const RESULT_RETRY: Duration = Duration::from_millis(500);

/// Runs one assignment.
async fn run_call(
    runtime: &Runtime,
    slot: &LinkSlot,
    worker_id: &str,
    assign: proto::Assign,
) -> Ran {
    let mut result = proto::CallResult {
        call_id: assign.call_id.clone(),
        epoch: assign.epoch,
        ..Default::default()
    };
    tracing::info!(filesystem = %assign.filesystem, "call started");
    if let Some(link) = slot.get() {
        let progress = proto::WorkerProgress {
            call_id: assign.call_id.clone(),
            epoch: assign.epoch,
            stage: "running".into(),
            message: String::new(),
        };
        link.send(worker_event::Event::Progress(progress)).await;
    }
    // An imported tool's call is an upstream exchange, not a wasm run.
    let upstream = if assign.upstream_json.is_empty() {
        None
    } else {
        let parsed =
            serde_json::from_str::<toolgrid_core::source::UpstreamCall>(&assign.upstream_json)
                .and_then(|upstream| {
                    let args = match assign.args_json.as_str() {
                        "" => serde_json::Map::new(),
                        text => serde_json::from_str(text)?,
                    };
                    Ok((upstream, args))
                });
        match parsed {
            Ok(parsed) => Some(parsed),
            Err(error) => {
                result.failure_kind = "internal".into();
                result.failure_message =
                    format!("the assignment's upstream does not parse: {error}");
                return Ran::Result(Box::new(result));
            }
        }
    };
    let digest = assign.digest.clone();
    let compiled = match &upstream {
        Some(_) => Ok(None),
        None => runtime
            .prepare(&digest, || fetch_artifact(slot.clone(), digest.clone()))
            .await
            .map(Some),
    };
    let compiled = match compiled {
        Ok(compiled) => compiled,
        Err(error) => {
            let kind = match error {
                PrepareError::Compile(_) => "invalid-artifact",
                PrepareError::Fetch(_) => "unavailable",
            };
            tracing::error!(%error, "cannot prepare the release");
            result.failure_kind = kind.into();
            result.failure_message = error.to_string();
            return Ran::Result(Box::new(result));
        }
    };
    let files: Vec<toolgrid_core::artifact::FileRef> = assign
        .files
        .iter()
        .map(|f| toolgrid_core::artifact::FileRef {
            path: f.path.clone(),
            digest: f.digest.clone(),
            size: f.size,
        })
        .collect();
    let mounts = match runtime
        .files()
        .mounts(&files, |digest| {
            let slot = slot.clone();
            async move {
                fetch_artifact(slot, digest)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .await
    {
        Ok(mounts) => mounts,
        Err(error) => {
            use toolgrid_sandbox::files::FilesError;
            let kind = match error {
                FilesError::Fetch { .. } => "unavailable",
                FilesError::Invalid { .. } | FilesError::DigestMismatch { .. } => {
                    "invalid-artifact"
                }
                FilesError::Io(_) => "internal",
            };
            tracing::error!(%error, "cannot prepare the release's files");
            result.failure_kind = kind.into();
            result.failure_message = error.to_string();
            return Ran::Result(Box::new(result));
        }
    };
    let limits = assign.limits.unwrap_or_default();
    let attempt = assign.attempt.max(1);
    let egress: Vec<toolgrid_core::spec::EgressRule> = if assign.egress_json.is_empty() {
        Vec::new()
    } else {
        match serde_json::from_str(&assign.egress_json) {
            Ok(rules) => rules,
            Err(error) => {
                result.failure_kind = "internal".into();
                result.failure_message =
                    format!("the assignment's egress rules do not parse: {error}");
                return Ran::Result(Box::new(result));
            }
        }
    };
    // Config and revealed secrets, as the control plane granted them; the host's own
    // variables cannot be shadowed by them.
    let mut env: Vec<(String, String)> = assign
        .env
        .into_iter()
        .filter(|(name, _)| name != "TOOLGRID_CALL_ID" && name != "TOOLGRID_ATTEMPT")
        .collect();
    env.push(("TOOLGRID_CALL_ID".into(), assign.call_id.clone()));
    env.push(("TOOLGRID_ATTEMPT".into(), attempt.to_string()));
    // The replay as the control plane sent it; an entry that does not parse ends the call
    // as a divergence before anything runs.
    let replay = match proto::entries_from_wire(&assign.replay) {
        Ok(replay) => replay,
        Err(error) => {
            result.failure_kind = toolgrid_core::error::ErrorKind::ReplayDivergence
                .as_str()
                .into();
            result.failure_message = format!("the replay cannot be read: {error}");
            return Ran::Result(Box::new(result));
        }
    };
    let mut prelude = Vec::new();
    if !replay.is_empty() || attempt > 1 {
        prelude.push(OplogEntry::Replay(ReplayStarted {
            worker: worker_id.to_string(),
            attempt,
            epoch: assign.epoch,
            entries: replay.len() as u64,
        }));
    }
    // The workspace: a fresh copy of the call's base version, removed when the call ends.
    let (workspace, base_tree) = match assign.filesystem.as_str() {
        "" => (None, None),
        access @ ("readOnly" | "readWrite") => {
            match prepare_workspace(slot.clone(), &assign.call_id, assign.epoch).await {
                Ok((dir, tree)) => (Some((dir, access == "readWrite")), Some(tree)),
                Err((kind, message)) => {
                    tracing::error!(%message, "cannot prepare the workspace");
                    result.failure_kind = kind.as_str().into();
                    result.failure_message = message;
                    return Ran::Result(Box::new(result));
                }
            }
        }
        other => {
            result.failure_kind = toolgrid_core::error::ErrorKind::Internal.as_str().into();
            result.failure_message = format!("unknown filesystem access {other:?}");
            return Ran::Result(Box::new(result));
        }
    };
    let sent = Arc::new(AtomicU64::new(0));
    let sink: Arc<dyn OplogSink> = Arc::new(LinkSink {
        slot: slot.clone(),
        call_id: assign.call_id.clone(),
        epoch: assign.epoch,
        sent: sent.clone(),
    });
    let request = RunRequest {
        call_id: assign.call_id.clone(),
        attempt,
        repeatable: Effect::parse(&assign.effect).is_some_and(Effect::is_repeatable),
        egress,
        sink: Some(sink.clone()),
        prelude,
        argv: assign.argv,
        env,
        stdin: assign.stdin,
        limits: RunLimits {
            memory_bytes: limits.memory_bytes,
            cpu_time_ms: limits.cpu_time_ms,
            output_bytes: limits.output_bytes,
            timeout_ms: limits.timeout_ms,
            max_timeout_ms: limits.max_timeout_ms,
            instances: 0,
            request_bytes: limits.request_bytes,
            response_bytes: limits.response_bytes,
        },
        idle_timeout_ms: limits.idle_timeout_ms,
        replay,
        secrets: assign
            .secrets
            .into_iter()
            .map(|(name, value)| (name, toolgrid_core::secret::SecretValue::new(value)))
            .collect(),
        workspace: workspace.as_ref().map(|(dir, writable)| {
            toolgrid_sandbox::workspace::WorkspaceMount {
                dir: dir.path().to_path_buf(),
                writable: *writable,
            }
        }),
        mounts,
    };
    let outcome = match (upstream, &compiled) {
        (Some((upstream, args)), _) => {
            let call_id = assign.call_id.clone();
            toolgrid_sandbox::exchange::run_exchange(request, move |host| {
                crate::upstream::exchange(host, call_id, upstream, args)
            })
            .await
        }
        (None, Some(compiled)) => {
            let span = tracing::info_span!("sandbox", digest = %digest);
            runtime.run(compiled, request).instrument(span).await
        }
        (None, None) => {
            result.failure_kind = "internal".into();
            result.failure_message = "no artifact was prepared".into();
            return Ran::Result(Box::new(result));
        }
    };
    let (replayed, recorded) = outcome.log.counts();
    if outcome.fenced {
        return match outcome.log.aborted() {
            Some((AbortKind::Unacknowledged, reason)) => {
                tracing::warn!(%reason, "call abandoned: a commit went unacknowledged");
                Ran::Abandoned(reason)
            }
            aborted => {
                tracing::warn!(
                    reason = aborted.map(|(_, r)| r).unwrap_or_default(),
                    "call abandoned: its assignment was taken away"
                );
                Ran::Fenced
            }
        };
    }
    tracing::info!(
        exit = outcome.exit_code,
        failure = outcome
            .failure
            .as_ref()
            .map(|f| f.kind.as_str())
            .unwrap_or(""),
        replayed,
        recorded,
        micros = outcome.elapsed.as_micros() as u64,
        "call ran"
    );
    result.exit_code = outcome.exit_code;
    result.stdout = outcome.stdout.to_vec();
    result.stderr_tail = outcome.stderr_tail.to_vec();
    if let Some(failure) = outcome.failure {
        result.failure_kind = failure.kind.as_str().into();
        result.failure_message = failure.message;
    } else if outcome.exit_code == 0
        && let (Some((dir, true)), Some(base)) = (workspace, base_tree)
    {
        // A read-write call that exited 0: its tree goes back with the result, committed
        // only if the call is judged a success.
        let scanned = tokio::task::spawn_blocking(move || {
            let scanned = toolgrid_sandbox::workspace::scan(
                dir.path(),
                &toolgrid_core::workspace::Limits::default(),
            );
            drop(dir);
            scanned.map(|s| {
                let blobs = s.new_blobs(&base);
                (s.tree, blobs)
            })
        })
        .await;
        match scanned {
            Ok(Ok((tree, blobs))) => {
                result.has_workspace = true;
                result.workspace_tree = proto::tree_to_wire(&tree);
                result.workspace_blobs = blobs
                    .into_iter()
                    .map(|(digest, data)| proto::WorkspaceBlob { digest, data })
                    .collect();
            }
            Ok(Err(error)) => {
                result.failure_kind = error.kind().as_str().into();
                result.failure_message = error.to_string();
            }
            Err(error) => {
                result.failure_kind = toolgrid_core::error::ErrorKind::Internal.as_str().into();
                result.failure_message = format!("the workspace scan stopped: {error}");
            }
        }
    }
    // Entries still buffered go with the result, unless they are large: then they are
    // committed first (in link-sized appends), so the result message stays small.
    let mut pending = proto::entries_to_wire(&outcome.log.take_pending());
    let pending_bytes: usize = pending.iter().map(|e| e.payload.len()).sum();
    if pending_bytes > proto::LINK_BATCH_BYTES {
        let entries = match proto::entries_from_wire(&pending) {
            Ok(entries) => entries,
            Err(error) => {
                return Ran::Abandoned(format!("a recorded entry does not encode: {error}"));
            }
        };
        match sink.append(entries).await {
            Ok(()) => pending.clear(),
            Err(AppendError::Fenced) => return Ran::Fenced,
            Err(AppendError::Unacknowledged(why)) => {
                return Ran::Abandoned(format!(
                    "the control plane did not acknowledge the last entries: {why}"
                ));
            }
        }
    }
    result.first_wseq = sent.load(Ordering::SeqCst);
    result.entries = pending;
    result.run_micros = outcome.elapsed.as_micros() as u64;
    result.replayed = replayed as u64;
    result.recorded = recorded as u64;
    Ran::Result(Box::new(result))
}

/// Commits a call's entries over the current attachment under its epoch.
struct LinkSink {
    slot: LinkSlot,
    call_id: String,
    epoch: u64,
    /// Entries sent so far under this epoch: the next append's first wseq.
    sent: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl OplogSink for LinkSink {
    async fn append(&self, entries: Vec<OplogEntry>) -> Result<(), AppendError> {
        let first_wseq = self.sent.fetch_add(entries.len() as u64, Ordering::SeqCst);
        match self.slot.get() {
            Some(link) => {
                link.append(&self.call_id, self.epoch, first_wseq, entries)
                    .await
            }
            None => Err(AppendError::Unacknowledged(
                "not attached to the control plane".into(),
            )),
        }
    }

    async fn progress(&self, message: String) {
        if let Some(link) = self.slot.get() {
            let progress = proto::WorkerProgress {
                call_id: self.call_id.clone(),
                epoch: self.epoch,
                stage: toolgrid_core::call::TOOL_PROGRESS.into(),
                message,
            };
            link.send(worker_event::Event::Progress(progress)).await;
        }
    }

    /// Sends the program's tool call over the current attachment; when the stream closes
    /// before the answer (a control plane restart), sends it again on the next one. The
    /// run's deadline bounds the wait (the run drops this future).
    async fn call_tool(
        &self,
        seq: u64,
        request: toolgrid_core::call::NestedRequest,
    ) -> toolgrid_sandbox::tools::NestedAnswer {
        let span =
            tracing::info_span!("tool_call", seq, tool = %request.tool, command = %request.command);
        let wire = proto::ToolCallRequest {
            call_id: self.call_id.clone(),
            epoch: self.epoch,
            request_id: 0,
            seq,
            tool: request.tool,
            command: request.command,
            args_json: request.args.to_string(),
            traceparent: toolgrid_trace::traceparent(&span).unwrap_or_default(),
        };
        async {
            let mut previous = None;
            loop {
                let link = self.slot.next_after(previous.as_ref()).await;
                if let Some(answer) = link.tool_call(wire.clone()).await {
                    return proto::convert::nested_answer(answer);
                }
                tracing::warn!(call = %self.call_id, seq, "the stream closed before a tool call's answer; sending it again on the next attachment");
                previous = Some(link);
            }
        }
        .instrument(span)
        .await
    }
}

/// Downloads an artifact from the control plane, riding out a reconnect or two.
async fn fetch_artifact(slot: LinkSlot, digest: String) -> Result<Vec<u8>, PrepareError> {
    let mut last_error = String::from("not attached to the control plane");
    for attempt in 0..20 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let Some(link) = slot.get() else { continue };
        let mut client = match link.client() {
            Ok(client) => client,
            Err(error) => {
                last_error = error;
                continue;
            }
        };
        let request = proto::FetchArtifactRequest {
            digest: digest.clone(),
        };
        let mut stream = match client.fetch_artifact(request).await {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == tonic::Code::NotFound => {
                return Err(PrepareError::Fetch(status.message().to_string()));
            }
            Err(status) => {
                last_error = status.message().to_string();
                continue;
            }
        };
        let mut fetched = crate::fetched::Fetched::default();
        let received = loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    if let Err(refused) = fetched.push(chunk.total_size, &chunk.data) {
                        break Err(refused.to_string());
                    }
                }
                Ok(None) => break fetched.finish().map_err(|refused| refused.to_string()),
                Err(status) => break Err(status.message().to_string()),
            }
        };
        match received {
            Ok(bytes) => return Ok(bytes),
            Err(error) => last_error = error,
        }
    }
    Err(PrepareError::Fetch(last_error))
}

/// Fetches the call's base version and writes it into a fresh directory.
async fn prepare_workspace(
    slot: LinkSlot,
    call_id: &str,
    epoch: u64,
) -> Result<
    (tempfile::TempDir, toolgrid_core::workspace::Tree),
    (toolgrid_core::error::ErrorKind, String),
> {
    use toolgrid_core::error::ErrorKind;
    let (tree, blobs) = fetch_workspace(slot, call_id, epoch).await.map_err(|e| {
        (
            ErrorKind::Unavailable,
            format!("cannot fetch the workspace: {e}"),
        )
    })?;
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::Builder::new()
            .prefix("toolgrid-workspace-")
            .tempdir()
            .map_err(|e| (ErrorKind::Internal, format!("workspace directory: {e}")))?;
        toolgrid_sandbox::workspace::materialize(dir.path(), &tree, &blobs)
            .map_err(|e| (e.kind(), e.to_string()))?;
        Ok((dir, tree))
    })
    .await
    .map_err(|e| {
        (
            ErrorKind::Internal,
            format!("the workspace copy stopped: {e}"),
        )
    })?
}

/// Downloads the version a call starts from: its tree and every blob, checked against the
/// tree and bounded by the workspace limits. Rides out a reconnect or two.
async fn fetch_workspace(
    slot: LinkSlot,
    call_id: &str,
    epoch: u64,
) -> Result<(toolgrid_core::workspace::Tree, HashMap<String, Vec<u8>>), String> {
    let limits = toolgrid_core::workspace::Limits::default();
    let mut last_error = String::from("not attached to the control plane");
    for attempt in 0..20 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let Some(link) = slot.get() else { continue };
        let mut client = match link.client() {
            Ok(client) => client,
            Err(error) => {
                last_error = error;
                continue;
            }
        };
        let request = proto::FetchWorkspaceRequest {
            call_id: call_id.to_string(),
            epoch,
        };
        let mut stream = match client.fetch_workspace(request).await {
            Ok(response) => response.into_inner(),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::Internal
                ) =>
            {
                return Err(status.message().to_string());
            }
            Err(status) => {
                last_error = status.message().to_string();
                continue;
            }
        };
        let mut tree = None;
        let mut blobs: HashMap<String, Vec<u8>> = HashMap::new();
        let mut received = 0u64;
        let complete = loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    let Some(tree) = &tree else {
                        let first = proto::tree_from_wire(&chunk.files)
                            .map_err(|e| format!("the workspace tree is not acceptable: {e}"))?;
                        limits.check(&first).map_err(|e| e.to_string())?;
                        tree = Some(first);
                        continue;
                    };
                    let expected = tree
                        .files
                        .values()
                        .find(|f| f.digest == chunk.digest)
                        .map(|f| f.size)
                        .ok_or_else(|| format!("blob {} is not in the tree", chunk.digest))?;
                    let blob = blobs.entry(chunk.digest.clone()).or_default();
                    if chunk.offset != blob.len() as u64
                        || blob.len() as u64 + chunk.data.len() as u64 > expected
                    {
                        return Err(format!("blob {} arrived out of order", chunk.digest));
                    }
                    received += chunk.data.len() as u64;
                    if received > limits.max_bytes {
                        return Err("the workspace is larger than its limit".into());
                    }
                    blob.extend_from_slice(&chunk.data);
                }
                Ok(None) => break true,
                Err(status) => {
                    last_error = status.message().to_string();
                    break false;
                }
            }
        };
        if !complete {
            continue;
        }
        let tree = tree.ok_or("the workspace stream was empty")?;
        for (digest, bytes) in &blobs {
            if toolgrid_core::workspace::blob_digest(bytes) != *digest {
                return Err(format!("blob {digest} does not match its bytes"));
            }
        }
        return Ok((tree, blobs));
    }
    Err(last_error)
}
