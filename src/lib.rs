//! The `toolgrid` command line: every subcommand, on top of the workspace's crates (see
//! `docs/architecture.md`): `up` and `controller` assemble a control plane
//! (`toolgrid-control-plane`, `toolgrid-controller`), `worker` runs one
//! (`toolgrid-worker`), and the rest are clients of the gRPC API (`toolgrid-proto`).

pub mod allocator;
pub mod cli;
pub mod telemetry;
