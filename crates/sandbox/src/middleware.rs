//! Wasm middleware: a WebAssembly component of world `toolgrid:middleware/middleware`
//! (`wit/middleware.wit`), run in a fresh sandbox with limits for each decision. A trap, a
//! timeout or an answer that does not parse refuses the call (fail closed).
//!
//! The sandbox grants no imports at all (a component that imports anything does not
//! instantiate), so a middleware sees nothing but the call: no filesystem, network,
//! environment, clock or randomness. One engine compiles each component once (cached by
//! digest); every decision gets a new store and instance, so nothing carries over from one
//! call to the next. The deadline is enforced by epoch interruption, the memory by the
//! store's limits.

use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use toolgrid_core::middleware::{CallView, Rewrite, StepOutcome, WasmModule};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store, StoreLimits, StoreLimitsBuilder};

wasmtime::component::bindgen!({
    path: "../../wit/middleware.wit",
    world: "middleware",
});

use exports::toolgrid::middleware::decide::Verdict;

/// How often the engine's epoch advances: the granularity of the deadline.
const TICK: Duration = Duration::from_millis(10);
/// How often an idle epoch thread looks whether its engine is gone.
const IDLE_CHECK: Duration = Duration::from_secs(10);
/// Largest verdict string read back from a middleware (a deny message or a rewrite).
const MAX_VERDICT_BYTES: usize = 1 << 20;
/// Components compiled at most at once in the cache (older entries are dropped).
const MAX_CACHED: usize = 64;

/// Runs wasm middleware (one engine, a fresh store per decision).
///
/// The engine is made at the first decision, with the thread that advances its epoch: a
/// control plane whose chains hold no wasm middleware keeps neither, and does not run the
/// compiler's set-up at its start. That thread ticks only while a decision runs.
pub struct WasmRunner {
    engine: OnceLock<Ready>,
    /// Compiled components by digest; `Err` remembers why one cannot run.
    compiled: Mutex<HashMap<String, Result<MiddlewarePre<Limits>, String>>>,
}

/// The engine, its linker and what its epoch thread watches.
struct Ready {
    engine: Engine,
    linker: Arc<Linker<Limits>>,
    ticker: Arc<Ticker>,
}

/// The epoch thread's state: decisions running, and the thread to wake when one starts.
struct Ticker {
    running: AtomicUsize,
    thread: OnceLock<std::thread::Thread>,
}

impl Ticker {
    /// Counts a decision as running until the guard drops, waking the epoch thread.
    fn running(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::SeqCst);
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
        Running(self.clone())
    }
}

/// A running decision (see [`Ticker::running`]).
struct Running(Arc<Ticker>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a decision's store holds: only its limits.
struct Limits {
    limits: StoreLimits,
}

/// Why a decision failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WasmFailure {
    #[error("the component does not run as a middleware: {0}")]
    Invalid(String),
    #[error("it ran out of time (the limit is {0:?})")]
    Timeout(Duration),
    #[error("it ran out of memory (the limit is {0} bytes)")]
    OutOfMemory(u64),
    #[error("it trapped: {0}")]
    Trap(String),
    #[error("its answer is not a valid verdict: {0}")]
    BadVerdict(String),
}

impl WasmRunner {
    pub fn new() -> Self {
        WasmRunner {
            engine: OnceLock::new(),
            compiled: Mutex::new(HashMap::new()),
        }
    }

    /// The engine, made on first use.
    fn ready(&self) -> &Ready {
        self.engine.get_or_init(Ready::new)
    }

    /// What Middleware `name`'s component decides about `call`. A [`StepOutcome::Failed`]
    /// message names the cause (the chain adds the Middleware's name).
    pub async fn decide(&self, name: &str, module: &WasmModule, call: &CallView) -> StepOutcome {
        let pre = match self.prepare(module).await {
            Ok(pre) => pre,
            Err(message) => return StepOutcome::Failed(message),
        };
        let ready = self.ready();
        let engine = ready.engine.clone();
        let running = ready.ticker.running();
        let module = module.clone();
        let input = call.to_json().to_string();
        let current = call.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let _running = running;
            run(&engine, &pre, &module, &input)
        })
        .await;
        match joined {
            Ok(Ok(verdict)) => {
                outcome(verdict, &current).unwrap_or_else(|f| StepOutcome::Failed(f.to_string()))
            }
            Ok(Err(failure)) => StepOutcome::Failed(failure.to_string()),
            Err(error) => {
                tracing::warn!(middleware = name, %error, "a wasm middleware sandbox did not finish");
                StepOutcome::Failed(format!("the sandbox did not finish: {error}"))
            }
        }
    }

    /// The compiled component of `module`, compiled on first use (off the executor).
    async fn prepare(&self, module: &WasmModule) -> Result<MiddlewarePre<Limits>, String> {
        if let Some(known) = self.cached(&module.digest) {
            return known;
        }
        let ready = self.ready();
        let engine = ready.engine.clone();
        let linker = ready.linker.clone();
        let bytes = module.bytes.clone();
        let compiled = tokio::task::spawn_blocking(move || compile(&engine, &linker, &bytes))
            .await
            .map_err(|e| format!("compiling the component did not finish: {e}"))
            .and_then(|r| r.map_err(|f| f.to_string()));
        let mut cache = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(module.digest.clone(), compiled.clone());
        compiled.map_err(|m| format!("component {}: {m}", module.digest))
    }

    fn cached(&self, digest: &str) -> Option<Result<MiddlewarePre<Limits>, String>> {
        self.compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
            .cloned()
            .map(|r| r.map_err(|m| format!("component {digest}: {m}")))
    }
}

impl Default for WasmRunner {
    fn default() -> Self {
        Self::new()
    }
}

impl Ready {
    fn new() -> Self {
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            // A middleware is small and runs briefly: no need for large reservations.
            .memory_reservation(1 << 30)
            .memory_guard_size(64 << 10);
        let engine = match Engine::new(&config) {
            Ok(engine) => engine,
            Err(error) => {
                tracing::error!(%error, "the wasm middleware engine cannot be configured; using defaults with epochs");
                let mut config = Config::new();
                config.wasm_component_model(true).epoch_interruption(true);
                Engine::new(&config).expect("the default engine configuration with epochs is valid")
            }
        };
        let ticker = Arc::new(Ticker {
            running: AtomicUsize::new(0),
            thread: OnceLock::new(),
        });
        let weak = engine.weak();
        let watched = ticker.clone();
        if let Ok(handle) = std::thread::Builder::new()
            .name("middleware-epoch".into())
            .spawn(move || tick(&weak, &watched))
        {
            let _ = ticker.thread.set(handle.thread().clone());
        }
        let linker = Linker::new(&engine);
        Ready {
            engine,
            linker: Arc::new(linker),
            ticker,
        }
    }
}

/// The epoch thread: advances the engine's epoch every [`TICK`] while a decision runs, and
/// sleeps until one starts otherwise (a decision's deadline counts ticks from its start).
/// It ends with the engine.
fn tick(engine: &wasmtime::EngineWeak, ticker: &Ticker) {
    loop {
        if ticker.running.load(Ordering::SeqCst) == 0 {
            // Woken by the next decision; a wake-up that came first is kept.
            std::thread::park_timeout(IDLE_CHECK);
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if ticker.running.load(Ordering::SeqCst) > 0 {
            engine.increment_epoch();
        }
        drop(engine);
        std::thread::sleep(TICK);
    }
}

/// Compiles a middleware component and checks it against the world (it exports `decide`
/// with the right type and imports nothing).
fn compile(
    engine: &Engine,
    linker: &Linker<Limits>,
    bytes: &[u8],
) -> Result<MiddlewarePre<Limits>, WasmFailure> {
    let component =
        Component::new(engine, bytes).map_err(|e| WasmFailure::Invalid(format!("{e:#}")))?;
    let pre = linker
        .instantiate_pre(&component)
        .map_err(|e| WasmFailure::Invalid(format!("{e:#}")))?;
    MiddlewarePre::new(pre).map_err(|e| WasmFailure::Invalid(format!("{e:#}")))
}

/// One decision in a fresh store: instantiate, call `decide`, return what it answered.
fn run(
    engine: &Engine,
    pre: &MiddlewarePre<Limits>,
    module: &WasmModule,
    input: &str,
) -> Result<Verdict, WasmFailure> {
    let memory = usize::try_from(module.memory_bytes).unwrap_or(usize::MAX);
    let limits = StoreLimitsBuilder::new()
        .memory_size(memory)
        .instances(16)
        .memories(16)
        .tables(16)
        .table_elements(100_000)
        .trap_on_grow_failure(true)
        .build();
    let mut store = Store::new(engine, Limits { limits });
    store.limiter(|s| &mut s.limits);
    let ticks = module.timeout.as_millis().div_ceil(TICK.as_millis()).max(1) + 1;
    store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
    store.epoch_deadline_trap();
    let classify = |error: wasmtime::Error| classify(error, module);
    let instance = pre.instantiate(&mut store).map_err(classify)?;
    let verdict = instance
        .toolgrid_middleware_decide()
        .call_decide(&mut store, input)
        .map_err(classify)?;
    Ok(verdict)
}

fn classify(error: wasmtime::Error, module: &WasmModule) -> WasmFailure {
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        return match trap {
            wasmtime::Trap::Interrupt => WasmFailure::Timeout(module.timeout),
            wasmtime::Trap::AllocationTooLarge => WasmFailure::OutOfMemory(module.memory_bytes),
            other => WasmFailure::Trap(other.to_string()),
        };
    }
    let text = format!("{error:#}");
    if text.contains("memory") && (text.contains("limit") || text.contains("grow")) {
        return WasmFailure::OutOfMemory(module.memory_bytes);
    }
    WasmFailure::Trap(text)
}

/// What a verdict means for `call`: a rewrite's JSON is parsed here (absent `command` or
/// `args` keep the call's).
fn outcome(verdict: Verdict, call: &CallView) -> Result<StepOutcome, WasmFailure> {
    match verdict {
        Verdict::Allow => Ok(StepOutcome::Allow),
        Verdict::Deny(message) => {
            if message.len() > MAX_VERDICT_BYTES {
                return Err(WasmFailure::BadVerdict(format!(
                    "the deny message is longer than {MAX_VERDICT_BYTES} bytes"
                )));
            }
            Ok(StepOutcome::Deny(message))
        }
        Verdict::Rewrite(json) => parse_rewrite(&json, call).map(StepOutcome::Rewrite),
    }
}

/// Parses a rewrite's JSON `{"command"?: string, "args"?: object}` over `call`.
pub fn parse_rewrite(json: &str, call: &CallView) -> Result<Rewrite, WasmFailure> {
    if json.len() > MAX_VERDICT_BYTES {
        return Err(WasmFailure::BadVerdict(format!(
            "the rewrite is longer than {MAX_VERDICT_BYTES} bytes"
        )));
    }
    let value: Value = serde_json::from_str(json)
        .map_err(|e| WasmFailure::BadVerdict(format!("the rewrite is not JSON: {e}")))?;
    let Value::Object(mut object) = value else {
        return Err(WasmFailure::BadVerdict(
            "the rewrite is not a JSON object".into(),
        ));
    };
    if let Some(key) = object.keys().find(|k| *k != "command" && *k != "args") {
        return Err(WasmFailure::BadVerdict(format!(
            "the rewrite has an unknown key {key:?} (only command and args)"
        )));
    }
    let command = match object.remove("command") {
        None => call.command.clone(),
        Some(Value::String(command)) => command,
        Some(_) => {
            return Err(WasmFailure::BadVerdict(
                "the rewrite's command is not a string".into(),
            ));
        }
    };
    let args: Map<String, Value> = match object.remove("args") {
        None => call.args.clone(),
        Some(Value::Object(args)) => args,
        Some(_) => {
            return Err(WasmFailure::BadVerdict(
                "the rewrite's args is not an object".into(),
            ));
        }
    };
    Ok(Rewrite { command, args })
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::artifact::middleware_component;
    use toolgrid_core::spec::Effect;

    fn call() -> CallView {
        CallView {
            agent: "reporter".into(),
            namespace: "default".into(),
            tool: "uuid".into(),
            command: "generate".into(),
            args: serde_json::json!({"count": 3})
                .as_object()
                .cloned()
                .unwrap(),
            effect: Effect::Read,
            release: "1.0.0".into(),
            dry_run: false,
        }
    }

    fn module(bytes: Vec<u8>) -> WasmModule {
        WasmModule {
            digest: toolgrid_core::artifact::digest_of(&bytes),
            bytes: Arc::new(bytes),
            timeout: Duration::from_millis(300),
            memory_bytes: 4 << 20,
        }
    }

    /// A core module answering with a fixed verdict: `tag` (0 allow, 1 deny, 2 rewrite)
    /// and `text` as its string, after running `body` (extra instructions).
    pub(crate) fn fixed(tag: u8, text: &str, body: &str) -> Vec<u8> {
        let escaped: String = text.bytes().map(|b| format!("\\{b:02x}")).collect();
        let wat = format!(
            r#"(module
  (memory (export "memory") 2)
  (global $next (mut i32) (i32.const 4096))
  (data (i32.const 16) "{escaped}")
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (i32.and (i32.add (local.get 3) (i32.const 7)) (i32.const -8))))
    (local.get $p))
  (func (export "toolgrid:middleware/decide@0.1.0#decide") (param i32 i32) (result i32)
    {body}
    (i32.store8 (i32.const 0) (i32.const {tag}))
    (i32.store (i32.const 4) (i32.const 16))
    (i32.store (i32.const 8) (i32.const {len}))
    (i32.const 0)))"#,
            len = text.len()
        );
        middleware_component(&wat::parse_str(wat).unwrap()).unwrap()
    }

    async fn decide(bytes: Vec<u8>) -> StepOutcome {
        WasmRunner::new().decide("m", &module(bytes), &call()).await
    }

    #[tokio::test]
    async fn allow_deny_and_rewrite() {
        assert_eq!(decide(fixed(0, "", "")).await, StepOutcome::Allow);
        assert_eq!(
            decide(fixed(1, "no thanks", "")).await,
            StepOutcome::Deny("no thanks".into())
        );
        let StepOutcome::Rewrite(r) = decide(fixed(2, r#"{"args":{"count":1}}"#, "")).await else {
            panic!("a rewrite")
        };
        assert_eq!(r.command, "generate");
        assert_eq!(
            r.args,
            *serde_json::json!({"count": 1}).as_object().unwrap()
        );
        let StepOutcome::Rewrite(r) = decide(fixed(2, r#"{"command":"other"}"#, "")).await else {
            panic!("a rewrite")
        };
        assert_eq!(r.command, "other");
        assert_eq!(r.args, call().args);
    }

    fn failed(outcome: StepOutcome, says: &str) {
        let StepOutcome::Failed(message) = outcome else {
            panic!("failed, not {outcome:?}")
        };
        assert!(message.contains(says), "{message:?} should say {says:?}");
    }

    #[tokio::test]
    async fn traps_timeouts_memory_and_bad_answers_fail_closed() {
        failed(decide(fixed(0, "", "unreachable")).await, "trapped");
        failed(
            decide(fixed(0, "", "(loop $l (br $l))")).await,
            "ran out of time",
        );
        failed(
            decide(fixed(0, "", "(drop (memory.grow (i32.const 1000)))")).await,
            "ran out of memory",
        );
        failed(decide(fixed(2, "not json", "")).await, "not JSON");
        failed(decide(fixed(2, "[1]", "")).await, "not a JSON object");
        failed(
            decide(fixed(2, r#"{"args":{},"extra":1}"#, "")).await,
            "unknown key",
        );
        failed(decide(fixed(7, "", "")).await, "trapped");
        failed(decide(b"\0asm\x01\0\0\0".to_vec()).await, "does not run");
        // A component of another world (it exports nothing of ours).
        let other = wat::parse_str("(component)").unwrap();
        failed(decide(other).await, "does not run");
    }

    /// No engine (nor its epoch thread) until the first decision; a deadline still holds
    /// for a decision that comes after the thread has slept.
    #[tokio::test]
    async fn the_engine_is_made_at_the_first_decision() {
        let runner = WasmRunner::new();
        assert!(
            runner.engine.get().is_none(),
            "an engine before any decision"
        );
        let allow = module(fixed(0, "", ""));
        assert_eq!(
            runner.decide("m", &allow, &call()).await,
            StepOutcome::Allow
        );
        assert!(runner.engine.get().is_some());
        tokio::time::sleep(TICK * 5).await;
        failed(
            runner
                .decide("m", &module(fixed(0, "", "(loop $l (br $l))")), &call())
                .await,
            "ran out of time",
        );
        assert_eq!(
            runner.decide("m", &allow, &call()).await,
            StepOutcome::Allow
        );
    }

    #[tokio::test]
    async fn every_decision_gets_a_fresh_instance() {
        // Marks its memory and traps if it finds the mark: a reused instance would.
        let counting = r#"(if (i32.load (i32.const 1024)) (then unreachable))
            (i32.store (i32.const 1024) (i32.const 1))"#;
        let runner = WasmRunner::new();
        let m = module(fixed(0, "", counting));
        for _ in 0..3 {
            assert_eq!(runner.decide("m", &m, &call()).await, StepOutcome::Allow);
        }
    }

    #[test]
    fn rewrites_keep_what_they_leave_out() {
        let r = parse_rewrite("{}", &call()).unwrap();
        assert_eq!((r.command.as_str(), &r.args), ("generate", &call().args));
        assert!(matches!(
            parse_rewrite(r#"{"command": 1}"#, &call()),
            Err(WasmFailure::BadVerdict(_))
        ));
        assert!(matches!(
            parse_rewrite(r#"{"args": []}"#, &call()),
            Err(WasmFailure::BadVerdict(_))
        ));
    }
}
