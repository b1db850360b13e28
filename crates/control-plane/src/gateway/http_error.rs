//! Refusals over HTTP: the status code of each [`ErrorKind`], and [`HttpError`], an
//! [`ApiError`] as an HTTP response (`{"error": {"kind", "message", ...}}`, with
//! `Retry-After` for a rate limit). The gRPC codes are `toolgrid_proto::status`'s.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use toolgrid_core::error::{ApiError, ErrorKind};

/// A refusal answered before the request's body was read. On HTTP/1 the server closes the
/// connection after it (what is left of the body cannot be told from a next request), so
/// the response says so (`Connection: close`) and a client sends its next request on a
/// new connection instead of one about to close (a client that reused it saw "server
/// disconnected"). HTTP/2 streams are independent: nothing to say there.
pub fn before_body(mut response: Response, version: Version) -> Response {
    if version < Version::HTTP_2 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The HTTP status of a response carrying this kind.
pub fn http_status(kind: ErrorKind) -> StatusCode {
    let code = match kind {
        ErrorKind::InvalidArgument => 400,
        ErrorKind::Unauthenticated => 401,
        ErrorKind::PermissionDenied
        | ErrorKind::Denied
        | ErrorKind::EgressDenied
        | ErrorKind::UnknownSecret
        | ErrorKind::ApprovalTimeout => 403,
        ErrorKind::RateLimited | ErrorKind::QueueFull => 429,
        ErrorKind::MiddlewareFailed => 503,
        ErrorKind::UnknownTool | ErrorKind::UnknownCommand | ErrorKind::NotFound => 404,
        ErrorKind::IdempotencyConflict
        | ErrorKind::WorkerIdInUse
        | ErrorKind::WorkspaceConflict
        | ErrorKind::RepeatedCall
        | ErrorKind::NotAwaitingApproval
        | ErrorKind::NotCancellable
        | ErrorKind::RolloutEnded => 409,
        ErrorKind::Cancelled => 499,
        ErrorKind::Internal => 500,
        ErrorKind::Unavailable => 503,
        ErrorKind::Timeout => 504,
        // The call ran and failed: the request itself was fine.
        _ => 422,
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// An [`ApiError`] answered over HTTP: what every HTTP handler returns on refusal (`?`
/// converts an `ApiError`).
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(error: ApiError) -> Self {
        HttpError(error)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let HttpError(error) = self;
        let status = http_status(error.kind);
        let mut body = json!({"error": {"kind": error.kind.as_str(), "message": error.message}});
        let mut response = match error.retry_after_ms {
            Some(ms) => {
                body["error"]["retryAfterMs"] = json!(ms);
                let seconds = ms.div_ceil(1000).max(1).to_string();
                (
                    status,
                    [(axum::http::header::RETRY_AFTER, seconds)],
                    Json(body),
                )
                    .into_response()
            }
            None => (status, Json(body)).into_response(),
        };
        response.extensions_mut().insert(error.kind);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_status_and_refusals_of_the_request_are_4xx() {
        for kind in ErrorKind::ALL {
            let status = http_status(kind);
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{kind}: {status}"
            );
        }
        assert_eq!(
            http_status(ErrorKind::Unauthenticated),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            http_status(ErrorKind::RateLimited),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            http_status(ErrorKind::QueueFull),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(http_status(ErrorKind::ToolError).as_u16(), 422);
    }
}
