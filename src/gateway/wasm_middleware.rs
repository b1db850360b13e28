//! Wasm middleware: a WebAssembly component of world `toolgrid:middleware/middleware`
//! (`wit/middleware.wit`), run in a fresh sandbox with limits for each decision. A trap, a
//! timeout or an answer that does not parse refuses the call (fail closed).
//!
//! CONTRACT(issue 10, helper D).

use crate::middleware::{CallView, StepOutcome, WasmModule};

/// Runs wasm middleware (one engine, a fresh store per decision).
pub struct WasmRunner {}

impl WasmRunner {
    pub fn new() -> Self {
        WasmRunner {}
    }

    /// What Middleware `name`'s component decides about `call`.
    pub async fn decide(&self, name: &str, module: &WasmModule, _call: &CallView) -> StepOutcome {
        StepOutcome::Failed(format!(
            "wasm middleware {name} ({}) is not implemented yet",
            module.digest
        ))
    }
}

impl Default for WasmRunner {
    fn default() -> Self {
        Self::new()
    }
}
