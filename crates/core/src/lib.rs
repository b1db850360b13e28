//! toolgrid's domain: the call model, the typed command interfaces, the middleware
//! decisions, workspaces, and the scheduler's state machine. No IO happens here: no async
//! runtime, transport, storage, sandbox or cluster client is a dependency of this crate, so
//! every rule in it is a plain function over plain data, tested without any of them (the
//! scheduler's with fake time). The layers above speak these types and convert protobuf
//! messages, SQL rows and HTTP JSON to and from them at their edges.
//!
//! | module | owns |
//! |---|---|
//! | [`ids`] | the identifiers passed around: [`ids::ObjectKey`], [`ids::CallId`], [`ids::WorkerId`], [`ids::Epoch`] |
//! | [`spec`] | the value types resources declare (a Tool's commands, a release's limits, a Middleware's steps, units) |
//! | [`call`] | a call's states, oplog entries, errors, lifecycle transitions, retries and deadlines |
//! | [`interface`] | a command's typed interface: argv parsing, argument and result validation |
//! | [`completion`] | judging a finished run against its command |
//! | [`middleware`] | what each middleware step decides |
//! | [`guest`] | the guest's filesystem layout (where the workspace is mounted) |
//! | [`workspace`] | workspace trees, paths, diffs, limits, the one-writer rule |
//! | [`rollout`] | canary rollouts: the split of new calls by weight, stepping, promotion and rollback |
//! | [`scheduler`] | the scheduler's decisions: `State::on(event, now) -> commands` |
//! | [`auth`] | who calls ([`auth::Principal`]) |
//! | [`secret`] | secret values in memory (never printed), compared in constant time; references in declared headers; scrubbing values and their encodings |
//! | [`net`] | the addresses egress treats as private |
//! | [`source`] | tools from elsewhere: what an MCP server or an OpenAPI document offers, as imported tools |
//! | [`artifact`] | what a release's or a middleware's WebAssembly must be |
//! | [`error`] | [`error::ApiError`], a refusal at a front door |

pub mod artifact;
pub mod auth;
pub mod call;
pub mod completion;
pub mod error;
#[cfg(test)]
mod fixtures;
pub mod guest;
pub mod ids;
pub mod interface;
pub mod middleware;
pub mod net;
pub mod rollout;
pub mod scheduler;
pub mod secret;
pub mod source;
pub mod spec;
pub mod workspace;
