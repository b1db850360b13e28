//! The sandbox worker process: it attaches to the control plane over the worker link
//! ([`link`]) and runs each assigned call in a fresh sandbox (`toolgrid-sandbox`), committing
//! every host result before its effect ([`process`]).

pub mod credential;
pub mod link;
pub mod process;

pub use process::{WorkerConfig, WorkerCredential, run};
