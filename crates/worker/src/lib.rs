//! The sandbox worker process: it attaches to the control plane over the worker link
//! ([`link`]) and runs each assigned call in a fresh sandbox (`toolgrid-sandbox`), committing
//! every host result before its effect ([`process`]); an artifact it fetches is checked as
//! it comes ([`fetched`]). An imported tool's call (a ToolSource's MCP tool or OpenAPI
//! operation) is one recorded HTTP exchange instead ([`upstream`]).

pub mod credential;
pub mod fetched;
pub mod link;
pub mod process;
pub mod upstream;

pub use process::{WorkerConfig, WorkerCredential, run};
