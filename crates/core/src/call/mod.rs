//! The call model: a call's states, its oplog entries, its errors and the rules that move it
//! from one state to the next.
//!
//! This module owns the call and nothing else. It imports no transport, storage or
//! sandbox: the gateway, the store, the scheduler and the worker all speak these types, and
//! protobuf messages, SQL rows and HTTP JSON convert to and from them at the edges.
//!
//! A call's life (see `docs/architecture.md`):
//!
//! ```text
//!  admit ──▶ pending ──assign──▶ running ──complete──▶ succeeded | failed
//!    │         ▲                   │  │
//!    │         └──────fence────────┘  └──append (same epoch)
//!    └─▶ awaiting-approval ──approve──▶ pending  (deny or timeout: ──▶ failed)
//!  fail / expire: awaiting-approval | pending | running ──▶ failed
//! ```
//!
//! Every assignment and every fence bumps the call's **epoch**; an append or a completion
//! under any other epoch is refused ([`Refusal::StaleEpoch`]), which is what keeps a
//! reassigned call from running twice. The store applies these rules inside the transaction
//! that records them; the scheduler applies them to its view.

mod access;
mod chain;
mod deadline;
mod entry;
mod error;
mod lifecycle;
pub mod nested;
mod record;
mod resources;
pub mod retry;
mod stop;

pub use access::{CallAccess, Filesystem};
pub use chain::{
    APPROVED_BY_ENV, ApprovalDecision, ApprovalWait, AuditFilter, AuditOptions, AuditOutcome,
    AuditRecord, ChainRecord, DRY_RUN_ACKNOWLEDGED, Decision, RedactRules, StepKind, TimeoutAction,
    Verdict,
};
pub use deadline::IdleDeadline;
pub use entry::{
    Assigned, CallStarted, Ended, EntryError, EntryKind, Fenced, HttpDenied, HttpError,
    HttpRequest, HttpResponse, MonotonicClock, OplogEntry, Outcome, ProgressReport, Random,
    RandomSource, ReplayStarted, Retry, RunSummary, WallClock,
};
pub use error::ErrorKind;
pub use lifecycle::{Lifecycle, Refusal};
pub use nested::{
    MAX_NESTED_CALLS, NestedAnswer, NestedError, NestedOutcome, NestedRequest, ToolCall, ToolResult,
};
pub use record::{
    CallFilter, CallRecord, CallSpec, Created, DEFAULT_REQUEST_BYTES, DEFAULT_RESPONSE_BYTES,
    MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES, NewCall, OplogRecord, RunLimits,
    now_ms,
};
pub use resources::{ResourceChanges, ResourceRecord, ResourceRecordKey};
pub use stop::stopped_error;

/// The stage of a tool's own progress report (`WorkerProgress.stage`, `Progress.stage`);
/// the scheduler's own stages are `accepted`, `assigned` and `running`.
pub const TOOL_PROGRESS: &str = "progress";

use serde::{Deserialize, Serialize};

/// Where a call is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallState {
    /// Recorded, held by an approval step until a person decides (or its timeout); holds no
    /// worker slot.
    #[serde(rename = "awaiting-approval")]
    AwaitingApproval,
    /// Recorded, waiting for a worker slot.
    Pending,
    /// Assigned to a worker under the call's current epoch.
    Running,
    Succeeded,
    Failed,
}

impl CallState {
    pub fn as_str(self) -> &'static str {
        match self {
            CallState::AwaitingApproval => "awaiting-approval",
            CallState::Pending => "pending",
            CallState::Running => "running",
            CallState::Succeeded => "succeeded",
            CallState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "awaiting-approval" => CallState::AwaitingApproval,
            "pending" => CallState::Pending,
            "running" => CallState::Running,
            "succeeded" => CallState::Succeeded,
            "failed" => CallState::Failed,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, CallState::Succeeded | CallState::Failed)
    }
}

impl std::fmt::Display for CallState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed call's error, as callers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallError {
    pub kind: ErrorKind,
    pub message: String,
    /// The declared error's name, for a declared exit code.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
}

impl CallError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CallError {
            kind,
            message: message.into(),
            name: String::new(),
            exit_code: 0,
            stderr_tail: String::new(),
        }
    }
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}
