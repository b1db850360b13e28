//! The control plane: the front doors and everything between a caller and a worker.
//!
//! | module | owns |
//! |---|---|
//! | [`gateway`] | the gRPC, HTTP and MCP front doors, admission, the middleware chain, results |
//! | [`auth`] | authenticating callers' and workers' tokens (join secret, ServiceAccounts, OAuth) |
//! | [`rollout`] | judging canary rollouts on their calls' outcomes, operators' promote and abort |
//! | [`scheduler`] | the scheduler's driver (around `toolgrid_core::scheduler`'s state machine) and the worker link |
//! | [`source`] | the manifest directory as a resource source |
//! | [`tool_sources`] | reading a ToolSource's offer (an MCP server, an OpenAPI document), each failure named |
//! | [`artifacts`] | checked release artifacts into the store |
//! | [`identity`] | signed per-call identity tokens for upstreams, their keys and JWKS |
//! | [`platform`] | one control plane wired together, local worker processes, TLS, retention |
//! | [`metrics`] | the Prometheus registry |

pub mod artifacts;
pub mod auth;
pub mod gateway;
pub mod identity;
pub mod metrics;
pub mod platform;
pub mod rollout;
pub mod scheduler;
pub mod source;
pub mod tool_sources;
