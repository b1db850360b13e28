//! `POST /v1/namespaces/{ns}/tools/{tool}/{command}:call` with `Accept: text/event-stream`:
//! the call as a stream of server-sent events instead of one JSON answer.
//!
//! - `event: progress`, one per progress event of the call, oldest first: `data` is
//!   `{"stage": ..., "message": ..., "worker": ..., "epoch": ...}`. Stage `progress` is the
//!   tool's own report (`message` its text); `accepted`, `assigned` and `running` are the
//!   platform's.
//! - `event: result`, last: `data` is the call record, the same JSON the plain answer has
//!   (a call that waits for approval comes back at once, `awaiting-approval`).
//! - `event: error` instead, when the call is refused or cannot be read: `data` is the
//!   error envelope `{"error": {"kind": ..., "message": ...}}`.
//!
//! Each `data` is one line of JSON. The stream ends after `result` or `error`. A client
//! that goes away does not cancel the call (`POST /v1/calls/{id}/cancel` does). What is
//! buffered for a slow client is bounded (a channel of [`BUFFER`] events; the producer
//! waits for the client).

use super::convert::call_to_json;
use super::{Admitted, Gateway};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use toolgrid_core::error::ApiError;

/// Events buffered for one client, at most.
const BUFFER: usize = 64;

/// Whether a request asks for the event stream.
pub fn wants_events(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.split(';').next().map(str::trim) == Some("text/event-stream"))
}

fn error_event(error: &ApiError) -> Event {
    let body = json!({"error": {"kind": error.kind.as_str(), "message": error.message}});
    Event::default().event("error").data(body.to_string())
}

/// The event stream of a call being admitted (`admitted`: what admission answered).
pub fn call_events(gateway: Arc<Gateway>, admitted: Result<Admitted, ApiError>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(BUFFER);
    tokio::spawn(async move {
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(error) => {
                let _ = tx.send(error_event(&error)).await;
                return;
            }
        };
        let record = admitted.record;
        let result = |record: &toolgrid_store::CallRecord| {
            Event::default()
                .event("result")
                .data(call_to_json(record, admitted.deduplicated).to_string())
        };
        if record.state.is_terminal()
            || record.state == toolgrid_core::call::CallState::AwaitingApproval
        {
            let _ = tx.send(result(&record)).await;
            return;
        }
        let mut follow = super::follow::Follow::new(&gateway, &record, admitted.updates);
        let ended = loop {
            match follow.next(&gateway).await {
                super::follow::Step::Progress(news) => {
                    for p in news {
                        let data = json!({
                            "stage": p.stage, "message": p.message, "worker": p.worker, "epoch": p.epoch,
                        });
                        let event = Event::default().event("progress").data(data.to_string());
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                }
                super::follow::Step::Ended(ended) => break *ended,
            }
        };
        let event = match ended {
            Ok(done) => result(&done),
            Err(error) => error_event(&error),
        };
        let _ = tx.send(event).await;
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_asked_for_by_its_media_type() {
        let mut headers = axum::http::HeaderMap::new();
        assert!(!wants_events(&headers));
        headers.insert("accept", "application/json".parse().unwrap());
        assert!(!wants_events(&headers));
        headers.insert(
            "accept",
            "application/json, text/event-stream;q=0.9".parse().unwrap(),
        );
        assert!(wants_events(&headers));
    }
}
