//! toolgrid: a Kubernetes operator and control plane that runs typed WebAssembly tools for
//! AI agents, each call in a fresh sandbox, every side effect in a durable oplog.
//!
//! The modules follow docs/architecture.md: resources ([`api`]) are resolved into
//! a [`catalog`]; the [`gateway`] admits calls, the [`scheduler`] hands them to
//! [`worker`]s over the worker link, and the [`store`] keeps calls and oplogs durable.

pub mod api;
pub mod auth;
pub mod call;
pub mod catalog;
pub mod cli;
pub mod controller;
pub mod error;
pub mod gateway;
pub mod metrics;
pub mod middleware;
pub mod platform;
pub mod proto;
pub mod scheduler;
pub mod store;
pub mod telemetry;
pub mod worker;
pub mod workspace;
