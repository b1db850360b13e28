//! The integration tests, one test binary (`cargo test --test it`): each file beside this
//! one is a module, against the real `toolgrid` binary and its processes. One binary links
//! once (each links wasmtime, kube and sqlx), where one per file linked dozens of times.
//! `cargo test --test it code_mode::` runs one file's tests.

mod common;

mod approval;
mod audit_redact;
mod authz;
mod bench;
mod binaries;
mod builtins;
mod cancel;
mod chart;
mod code_mode;
mod console;
mod controller_fake;
mod drain;
mod dryrun_repeat;
mod e2e;
mod failover;
mod fairness;
mod gen_client;
mod ha;
mod hostile;
mod identity;
mod k8s_e2e;
mod layers;
mod mcp;
mod middleware_policy;
mod middleware_wasm;
mod model_schemas;
mod pinning;
mod progress;
mod ratelimit;
mod redaction;
mod results;
mod retry;
mod rollout;
mod runtime;
mod secret_exfiltration;
mod secrets;
mod sources;
mod tenancy;
mod tool_sources;
mod traces;
mod worker_auth;
mod workspace;
