//! The wasmtime runtime of a worker: one engine, compiled releases cached on disk and in
//! memory as `InstancePre`s, and a fresh `Store` and instance for every call.

use super::limits::{
    CappedOutput, MemoryLimitExceeded, MemoryLimiter, OutputLimitExceeded, TailOutput, Tripwires,
};
use super::recorder::{HostLog, RecordedMonotonicClock, RecordedRng, RecordedWallClock};
use crate::error::ErrorKind;
use crate::store::{NewEntry, RunLimits};
use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;
use wasmtime::component::{Component, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, Module, PoolingAllocationConfig, Store,
    UpdateDeadline,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// How often the engine's epoch advances: the granularity of CPU-time accounting and of
/// yielding to other calls on the same thread.
pub const TICK: Duration = Duration::from_millis(10);

/// Bytes of a guest's stderr kept for error messages.
const STDERR_TAIL: usize = 8 * 1024;

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
#[derive(Debug, thiserror::Error)]
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
    Module(wasmtime::InstancePre<ModuleState>),
    Component(CommandPre<ComponentState>),
}

impl Compiled {
    pub fn kind(&self) -> &'static str {
        match self {
            Compiled::Module(_) => "module",
            Compiled::Component(_) => "component",
        }
    }
}

/// The state of a preview 1 call.
pub struct ModuleState {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
}

/// The state of a preview 2 call.
pub struct ComponentState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
}

impl WasiView for ComponentState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// One call to run.
#[derive(Clone, Debug, Default)]
pub struct RunRequest {
    pub call_id: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub limits: RunLimits,
    /// Host-call entries of earlier attempts, answered before going live.
    pub replay: Vec<NewEntry>,
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
}

#[derive(Debug, thiserror::Error)]
#[error("CPU time limit of {limit_ms} ms exceeded")]
struct CpuLimitExceeded {
    limit_ms: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("replay diverged: {0}")]
struct ReplayDiverged(String);

/// The engine, its linkers, and the compiled releases.
pub struct Runtime {
    engine: Engine,
    module_linker: wasmtime::Linker<ModuleState>,
    component_linker: wasmtime::component::Linker<ComponentState>,
    compiled: Mutex<HashMap<String, Arc<OnceCell<Arc<Compiled>>>>>,
    cache_dir: PathBuf,
    engine_key: String,
    stop_ticker: Arc<AtomicBool>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::SeqCst);
    }
}

impl Runtime {
    pub fn new(config: &RuntimeConfig) -> anyhow::Result<Self> {
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
                .max_memory_size(usize::try_from(config.max_memory_bytes).unwrap_or(usize::MAX));
            wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&wasm)?;
        let mut module_linker = wasmtime::Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut module_linker, |s: &mut ModuleState| {
            &mut s.wasi
        })?;
        let mut component_linker = wasmtime::component::Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut component_linker)?;

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
            cache_dir: config.cache_dir.clone(),
            engine_key,
            stop_ticker,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
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
                // SAFETY: the cache directory is this worker's own; it holds only code this
                // engine serialized, under a name keyed by the engine's compatibility hash.
                Ok(if kind == "module" {
                    Artifact::Module(unsafe { Module::deserialize_file(&engine, &path)? })
                } else {
                    Artifact::Component(unsafe { Component::deserialize_file(&engine, &path)? })
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
                _ => tracing::warn!(%digest, "unreadable compiled cache entry; recompiling"),
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
        let artifact = tokio::task::spawn_blocking(move || compile_artifact(&engine, &bytes))
            .await
            .map_err(|e| CompileError::Invalid(e.to_string()))??;
        let (kind, serialized) = match &artifact {
            Artifact::Module(m) => ("module", m.serialize()),
            Artifact::Component(c) => ("component", c.serialize()),
        };
        if let Ok(serialized) = serialized {
            let path = self.cache_path(digest, kind);
            if let Err(error) = write_atomically(&path, &serialized) {
                tracing::warn!(%digest, %error, "cannot cache compiled code");
            }
        }
        self.link(artifact)
    }

    fn link(&self, artifact: Artifact) -> Result<Compiled, CompileError> {
        match artifact {
            Artifact::Module(module) => {
                let is_command = module
                    .get_export("_start")
                    .is_some_and(|e| e.func().is_some());
                if !is_command {
                    return Err(CompileError::NotACommand(
                        "the module exports no `_start` function".into(),
                    ));
                }
                let pre = self
                    .module_linker
                    .instantiate_pre(&module)
                    .map_err(|e| CompileError::NotACommand(format!("{e:#}")))?;
                Ok(Compiled::Module(pre))
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
    pub async fn run(&self, compiled: &Compiled, request: RunRequest) -> RunOutcome {
        let started = Instant::now();
        let trips = Arc::new(Tripwires::default());
        let log = HostLog::new(request.replay);
        let stdout = CappedOutput::new(request.limits.output_bytes, trips.clone());
        let stderr = TailOutput::new(STDERR_TAIL);
        let mut builder = WasiCtxBuilder::new();
        builder
            .args(&request.argv)
            .envs(&request.env)
            .stdin(MemoryInputPipe::new(request.stdin))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(RecordedWallClock(log.clone()))
            .monotonic_clock(RecordedMonotonicClock::new(log.clone()))
            .secure_random(RecordedRng::secure(log.clone()))
            .insecure_random(RecordedRng::insecure(log.clone()))
            .insecure_random_seed(seed_of(&request.call_id));
        let limiter = MemoryLimiter::new(request.limits.memory_bytes, trips.clone());
        let timeout = Duration::from_millis(request.limits.timeout_ms.max(1));
        let cpu_limit_ms = request.limits.cpu_time_ms.max(1);

        let result = match compiled {
            Compiled::Module(pre) => {
                let state = ModuleState {
                    wasi: builder.build_p1(),
                    limiter,
                };
                let mut store = Store::new(&self.engine, state);
                store.limiter(|s| &mut s.limiter);
                arm_cpu_budget(&mut store, cpu_limit_ms, log.clone());
                tokio::time::timeout(timeout, async {
                    let instance = pre.instantiate_async(&mut store).await?;
                    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
                    start.call_async(&mut store, ()).await
                })
                .await
            }
            Compiled::Component(pre) => {
                let state = ComponentState {
                    wasi: builder.build(),
                    table: ResourceTable::new(),
                    limiter,
                };
                let mut store = Store::new(&self.engine, state);
                store.limiter(|s| &mut s.limiter);
                arm_cpu_budget(&mut store, cpu_limit_ms, log.clone());
                tokio::time::timeout(timeout, async {
                    let command = pre.instantiate_async(&mut store).await?;
                    match command.wasi_cli_run().call_run(&mut store).await? {
                        Ok(()) => Ok(()),
                        Err(()) => Err(I32Exit(1).into()),
                    }
                })
                .await
            }
        };

        let (exit_code, failure) = match result {
            Err(_elapsed) => (
                -1,
                Some(Failure {
                    kind: ErrorKind::Timeout,
                    message: format!(
                        "the call did not finish within its timeout of {} ms",
                        timeout.as_millis()
                    ),
                }),
            ),
            Ok(result) => classify(result, &trips, &log),
        };
        RunOutcome {
            exit_code,
            stdout: stdout.contents(),
            stderr_tail: stderr.contents(),
            failure,
            log,
            elapsed: started.elapsed(),
        }
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

/// Checks that `bytes` are a valid WASI command (a preview 1 module exporting `_start`,
/// or a preview 2 component exporting `wasi:cli/run`) without compiling it: the control
/// plane's check before a release is Ready. Returns `module` or `component`.
pub fn validate_artifact(bytes: &[u8]) -> Result<&'static str, CompileError> {
    use wasmparser::{Parser, Payload, Validator, WasmFeatures};
    let kind = if Parser::is_component(bytes) {
        "component"
    } else if Parser::is_core_wasm(bytes) {
        "module"
    } else {
        return Err(CompileError::Invalid(
            "not a WebAssembly module or component (bad magic number or version)".into(),
        ));
    };
    Validator::new_with_features(WasmFeatures::default())
        .validate_all(bytes)
        .map_err(|e| CompileError::Invalid(e.to_string()))?;
    let mut depth = 0usize;
    let mut is_command = false;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| CompileError::Invalid(e.to_string()))? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ExportSection(exports) if depth == 1 && kind == "module" => {
                for export in exports {
                    let export = export.map_err(|e| CompileError::Invalid(e.to_string()))?;
                    is_command |= export.name == "_start";
                }
            }
            Payload::ComponentExportSection(exports) if depth == 1 => {
                for export in exports {
                    let export = export.map_err(|e| CompileError::Invalid(e.to_string()))?;
                    is_command |= export.name.name.starts_with("wasi:cli/run@0.2");
                }
            }
            _ => {}
        }
    }
    if !is_command {
        return Err(CompileError::NotACommand(if kind == "module" {
            "the module exports no `_start` function".into()
        } else {
            "the component does not export wasi:cli/run@0.2".into()
        }));
    }
    Ok(kind)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Counts epoch ticks spent running guest code against the CPU budget, yields to other
/// calls at every tick, and stops a diverged replay before it can do anything else.
fn arm_cpu_budget<T: 'static>(store: &mut Store<T>, limit_ms: u64, log: Arc<HostLog>) {
    let budget = limit_ms.div_ceil(TICK.as_millis() as u64).max(1);
    let mut used = 0u64;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        used += 1;
        if used > budget {
            return Err(CpuLimitExceeded { limit_ms }.into());
        }
        if let Some(reason) = log.divergence() {
            return Err(ReplayDiverged(reason).into());
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
    if let Some(reason) = log.divergence() {
        return failure(ErrorKind::ReplayDivergence, reason);
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
    if let Some(diverged) = error.downcast_ref::<ReplayDiverged>() {
        return failure(ErrorKind::ReplayDivergence, diverged.0.clone());
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
