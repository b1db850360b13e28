//! Errors at the front doors: [`ApiError`], a kind and a message. The kinds themselves are
//! the call model's ([`crate::call::ErrorKind`]); each transport maps them to its own status
//! codes at its edge (`toolgrid-proto` for gRPC, the gateway for HTTP).

pub use crate::call::ErrorKind;

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
