//! The error kinds callers see: one stable kebab-case name each, the same on every front
//! door (gRPC metadata and `CallError.kind`, HTTP JSON, the CLI's one-line errors). The
//! transports map them to their own status codes at the edge (`crate::error`).

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Arguments or stdin break the Tool's schema.
    InvalidArgument,
    /// No such tool in the namespace.
    UnknownTool,
    /// The tool has no such command.
    UnknownCommand,
    /// The tool has no Ready release (or its pool has no workers).
    Unavailable,
    /// The caller may not make this call.
    PermissionDenied,
    /// The caller is not known.
    Unauthenticated,
    /// The idempotency key was used for a different request.
    IdempotencyConflict,
    /// A worker registered with the id of a live worker without proving it is that worker.
    WorkerIdInUse,
    /// No such call.
    NotFound,
    /// The tool exited non-zero (with a declared error, or a generic one).
    ToolError,
    /// The tool's stdout is not JSON or breaks the result schema.
    InvalidResult,
    /// The call ran past its timeout.
    Timeout,
    /// The guest used up its CPU time.
    CpuLimit,
    /// The guest grew its memory past the limit.
    MemoryLimit,
    /// The guest wrote more output than allowed.
    OutputLimit,
    /// An outgoing request (its document or body) was larger than allowed.
    RequestLimit,
    /// A response body was larger than allowed.
    ResponseLimit,
    /// A program (code mode) called tools more often than one call may
    /// ([`crate::call::MAX_NESTED_CALLS`]).
    ToolCallLimit,
    /// The guest trapped (unreachable, out-of-bounds access, stack overflow, ...).
    Trap,
    /// The release's artifact is not a runnable WASI command.
    InvalidArtifact,
    /// A re-run call made a host call the oplog does not have.
    ReplayDivergence,
    /// A request may have reached its destination, and repeating it is not safe.
    OutcomeUnknown,
    /// The guest's outgoing request was refused by the egress policy.
    EgressDenied,
    /// A person or policy refused the call.
    Denied,
    /// A secret the call's binding grants could not be resolved when the call was assigned
    /// (deleted, or the key is missing): the call fails instead of running without it.
    SecretUnavailable,
    /// The tool's outgoing request referred to a secret (`${secret:NAME}`) the call may not
    /// use: the request is refused and never leaves.
    UnknownSecret,
    /// The call's workspace grew past its size limit (total bytes or file count); nothing
    /// of the call was committed.
    WorkspaceLimit,
    /// The workspace's head moved past the version the call started from (another writer
    /// committed first); nothing of the call was committed.
    WorkspaceConflict,
    /// A workspace path or entry is not acceptable (absolute, `..`, not UTF-8, not a
    /// regular file, a digest that does not match its bytes).
    WorkspaceInvalid,
    /// A rate limit's bucket is empty: try again after the retry-after the refusal carries.
    RateLimited,
    /// The caller's queue of calls waiting for a worker of the pool is full (the scheduler's
    /// per-agent cap): the call was not recorded; try again after the retry-after the refusal
    /// carries.
    QueueFull,
    /// The agent made the same call (tool, command, arguments, stdin) within the Tool's
    /// repeat window, without the first call's idempotency key.
    RepeatedCall,
    /// No one decided a call that waited for approval before its timeout, and the step's
    /// `onTimeout` is `deny`.
    ApprovalTimeout,
    /// A middleware step could not decide (a wasm middleware trapped, ran out of time or
    /// answered nonsense; a CEL expression did not evaluate; a Middleware is not Ready): the
    /// call is refused, never let by.
    MiddlewareFailed,
    /// An approval or denial of a call that is not waiting for one (decided already).
    NotAwaitingApproval,
    Cancelled,
    /// A cancel of a call that has ended already (cancellation is not rollback).
    NotCancellable,
    /// A promote or abort of a canary rollout that was promoted or rolled back already.
    RolloutEnded,
    Internal,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 39] = [
        ErrorKind::InvalidArgument,
        ErrorKind::UnknownTool,
        ErrorKind::UnknownCommand,
        ErrorKind::Unavailable,
        ErrorKind::PermissionDenied,
        ErrorKind::Unauthenticated,
        ErrorKind::IdempotencyConflict,
        ErrorKind::WorkerIdInUse,
        ErrorKind::NotFound,
        ErrorKind::ToolError,
        ErrorKind::InvalidResult,
        ErrorKind::Timeout,
        ErrorKind::CpuLimit,
        ErrorKind::MemoryLimit,
        ErrorKind::OutputLimit,
        ErrorKind::RequestLimit,
        ErrorKind::ResponseLimit,
        ErrorKind::ToolCallLimit,
        ErrorKind::Trap,
        ErrorKind::InvalidArtifact,
        ErrorKind::ReplayDivergence,
        ErrorKind::OutcomeUnknown,
        ErrorKind::EgressDenied,
        ErrorKind::Denied,
        ErrorKind::SecretUnavailable,
        ErrorKind::UnknownSecret,
        ErrorKind::WorkspaceLimit,
        ErrorKind::WorkspaceConflict,
        ErrorKind::WorkspaceInvalid,
        ErrorKind::RateLimited,
        ErrorKind::QueueFull,
        ErrorKind::RepeatedCall,
        ErrorKind::ApprovalTimeout,
        ErrorKind::MiddlewareFailed,
        ErrorKind::NotAwaitingApproval,
        ErrorKind::Cancelled,
        ErrorKind::NotCancellable,
        ErrorKind::RolloutEnded,
        ErrorKind::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid-argument",
            ErrorKind::UnknownTool => "unknown-tool",
            ErrorKind::UnknownCommand => "unknown-command",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::PermissionDenied => "permission-denied",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::IdempotencyConflict => "idempotency-conflict",
            ErrorKind::WorkerIdInUse => "worker-id-in-use",
            ErrorKind::NotFound => "not-found",
            ErrorKind::ToolError => "tool-error",
            ErrorKind::InvalidResult => "invalid-result",
            ErrorKind::Timeout => "timeout",
            ErrorKind::CpuLimit => "cpu-limit",
            ErrorKind::MemoryLimit => "memory-limit",
            ErrorKind::OutputLimit => "output-limit",
            ErrorKind::RequestLimit => "request-limit",
            ErrorKind::ResponseLimit => "response-limit",
            ErrorKind::ToolCallLimit => "tool-call-limit",
            ErrorKind::Trap => "trap",
            ErrorKind::InvalidArtifact => "invalid-artifact",
            ErrorKind::ReplayDivergence => "replay-divergence",
            ErrorKind::OutcomeUnknown => "outcome-unknown",
            ErrorKind::EgressDenied => "egress-denied",
            ErrorKind::Denied => "denied",
            ErrorKind::SecretUnavailable => "secret-unavailable",
            ErrorKind::UnknownSecret => "unknown-secret",
            ErrorKind::WorkspaceLimit => "workspace-limit",
            ErrorKind::WorkspaceConflict => "workspace-conflict",
            ErrorKind::WorkspaceInvalid => "workspace-invalid",
            ErrorKind::RateLimited => "rate-limited",
            ErrorKind::QueueFull => "queue-full",
            ErrorKind::RepeatedCall => "repeated-call",
            ErrorKind::ApprovalTimeout => "approval-timeout",
            ErrorKind::MiddlewareFailed => "middleware-failed",
            ErrorKind::NotAwaitingApproval => "not-awaiting-approval",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::NotCancellable => "not-cancellable",
            ErrorKind::RolloutEnded => "rollout-ended",
            ErrorKind::Internal => "internal",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl serde::Serialize for ErrorKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ErrorKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ErrorKind::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown error kind {name:?}")))
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
