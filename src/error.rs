//! Errors at the front doors: [`ApiError`] (a kind and a message) and its gRPC form. The
//! kinds themselves are the call model's ([`crate::call::ErrorKind`]); this module maps them
//! to transport status codes.

pub use crate::call::ErrorKind;

/// The gRPC status code of a call refused with this kind.
pub fn grpc_code(kind: ErrorKind) -> tonic::Code {
    use tonic::Code;
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::UnknownTool | ErrorKind::UnknownCommand | ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::PermissionDenied
        | ErrorKind::Denied
        | ErrorKind::EgressDenied
        | ErrorKind::UnknownSecret
        | ErrorKind::ApprovalTimeout => Code::PermissionDenied,
        ErrorKind::RateLimited => Code::ResourceExhausted,
        ErrorKind::RepeatedCall => Code::AlreadyExists,
        ErrorKind::NotAwaitingApproval | ErrorKind::NotCancellable => Code::FailedPrecondition,
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

/// An error a front door returns before or instead of a call record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// When to try again ([`ErrorKind::RateLimited`]): HTTP `Retry-After` (seconds, rounded
    /// up) and gRPC metadata `retry-after-ms`.
    pub retry_after_ms: Option<u64>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    pub fn with_retry_after(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms);
        self
    }
}

/// gRPC metadata key that carries a refusal's retry-after, in milliseconds.
pub const GRPC_RETRY_AFTER_KEY: &str = "retry-after-ms";

impl From<ApiError> for tonic::Status {
    fn from(error: ApiError) -> Self {
        let mut status = tonic::Status::new(grpc_code(error.kind), error.message);
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
}

impl From<&tonic::Status> for ApiError {
    fn from(status: &tonic::Status) -> Self {
        let kind = status
            .metadata()
            .get(GRPC_KIND_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorKind::parse)
            .unwrap_or(match status.code() {
                tonic::Code::InvalidArgument => ErrorKind::InvalidArgument,
                tonic::Code::NotFound => ErrorKind::NotFound,
                tonic::Code::PermissionDenied => ErrorKind::PermissionDenied,
                tonic::Code::Unauthenticated => ErrorKind::Unauthenticated,
                tonic::Code::Unavailable => ErrorKind::Unavailable,
                tonic::Code::DeadlineExceeded => ErrorKind::Timeout,
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
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> Self {
        use crate::store::StoreError;
        let kind = match &error {
            StoreError::IdempotencyConflict { .. } => ErrorKind::IdempotencyConflict,
            StoreError::NotFound(_) => ErrorKind::NotFound,
            StoreError::NotAwaiting { .. } => ErrorKind::NotAwaitingApproval,
            StoreError::Ended { .. } => ErrorKind::NotCancellable,
            _ => ErrorKind::Internal,
        };
        ApiError::new(kind, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names_and_grpc() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(kind.as_str()), Some(kind));
            let status: tonic::Status = ApiError::new(kind, "x").into();
            assert_eq!(ApiError::from(&status).kind, kind);
        }
    }
}
