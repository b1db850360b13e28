//! Sandbox workers: a process that attaches to the control plane over the worker link and
//! runs each assigned call in a fresh wasmtime sandbox, recording every host result.

pub mod credential;
pub mod egress;
pub mod http;
mod limits;
pub mod link;
pub mod process;
pub mod progress;
pub mod recorder;
pub mod runtime;
pub mod secrets;
pub mod workspace;

pub use process::{WorkerConfig, WorkerCredential, run};
pub use runtime::{Compiled, Failure, RunOutcome, RunRequest, Runtime, RuntimeConfig};
