//! [`ApiError`] on the wire: the gRPC status code of each [`ErrorKind`], with the kind (and
//! a rate limit's retry-after) in the status's metadata so a client gets the exact kind back.

use tonic::{Code, Status};
use toolgrid_core::error::{ApiError, ErrorKind};

/// The gRPC status code of a call refused with this kind.
pub fn grpc_code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::UnknownTool | ErrorKind::UnknownCommand | ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::PermissionDenied
        | ErrorKind::Denied
        | ErrorKind::EgressDenied
        | ErrorKind::UnknownSecret
        | ErrorKind::ApprovalTimeout => Code::PermissionDenied,
        ErrorKind::RateLimited | ErrorKind::QueueFull => Code::ResourceExhausted,
        ErrorKind::RepeatedCall => Code::AlreadyExists,
        ErrorKind::NotAwaitingApproval | ErrorKind::NotCancellable | ErrorKind::RolloutEnded => {
            Code::FailedPrecondition
        }
        ErrorKind::MiddlewareFailed => Code::Unavailable,
        ErrorKind::SecretUnavailable => Code::FailedPrecondition,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::IdempotencyConflict | ErrorKind::WorkerIdInUse => Code::AlreadyExists,
        ErrorKind::Timeout => Code::DeadlineExceeded,
        ErrorKind::CpuLimit
        | ErrorKind::MemoryLimit
        | ErrorKind::OutputLimit
        | ErrorKind::RequestLimit
        | ErrorKind::ResponseLimit
        | ErrorKind::ToolCallLimit
        | ErrorKind::WorkspaceLimit => Code::ResourceExhausted,
        ErrorKind::WorkspaceConflict => Code::Aborted,
        ErrorKind::WorkspaceInvalid => Code::InvalidArgument,
        ErrorKind::Cancelled => Code::Cancelled,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::ToolError
        | ErrorKind::InvalidResult
        | ErrorKind::Trap
        | ErrorKind::InvalidArtifact
        | ErrorKind::ReplayDivergence
        | ErrorKind::OutcomeUnknown => Code::Aborted,
    }
}

/// gRPC metadata key that carries the kind of a refused request.
pub const GRPC_KIND_KEY: &str = "toolgrid-error-kind";

/// gRPC metadata key that carries a refusal's retry-after, in milliseconds.
pub const GRPC_RETRY_AFTER_KEY: &str = "retry-after-ms";

/// The status a refusal is sent as.
pub fn status_of(error: ApiError) -> Status {
    let mut status = Status::new(grpc_code(error.kind), error.message);
    if let Ok(value) = error.kind.as_str().parse() {
        status.metadata_mut().insert(GRPC_KIND_KEY, value);
    }
    if let Some(ms) = error.retry_after_ms
        && let Ok(value) = ms.to_string().parse()
    {
        status.metadata_mut().insert(GRPC_RETRY_AFTER_KEY, value);
    }
    status
}

/// The refusal a status carries (a status without a kind: the closest kind of its code).
pub fn error_of(status: &Status) -> ApiError {
    let kind = status
        .metadata()
        .get(GRPC_KIND_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(ErrorKind::parse)
        .unwrap_or(match status.code() {
            Code::InvalidArgument => ErrorKind::InvalidArgument,
            Code::NotFound => ErrorKind::NotFound,
            Code::PermissionDenied => ErrorKind::PermissionDenied,
            Code::Unauthenticated => ErrorKind::Unauthenticated,
            Code::Unavailable => ErrorKind::Unavailable,
            Code::DeadlineExceeded => ErrorKind::Timeout,
            _ => ErrorKind::Internal,
        });
    let mut error = ApiError::new(kind, status.message());
    error.retry_after_ms = status
        .metadata()
        .get(GRPC_RETRY_AFTER_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names_and_grpc() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(kind.as_str()), Some(kind));
            let status = status_of(ApiError::new(kind, "x"));
            assert_eq!(error_of(&status).kind, kind);
        }
    }
}
