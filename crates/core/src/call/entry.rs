//! Oplog entries: one enum, tagged by `kind`, for everything a call's oplog holds.
//!
//! Every producer (gateway, store, worker host functions) builds an [`OplogEntry`] and every
//! consumer (replay, the scheduler, `toolgrid oplog`) reads one. The store keeps an entry as
//! two columns, its kind and its payload (the entry's JSON without `kind`); the worker link
//! carries the same two parts. [`OplogEntry::to_parts`] and [`OplogEntry::from_parts`] are
//! the only conversions, and a stored entry that does not parse is an [`EntryError`], never
//! a default value: replay treats it as a divergence.

use super::CallError;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// One entry of a call's oplog.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OplogEntry {
    /// The call as admitted (always entry 0).
    CallStarted(CallStarted),
    /// An assignment to a worker under a new epoch.
    Assigned(Assigned),
    /// An assignment taken back; the previous epoch's writes are refused from now on.
    Fenced(Fenced),
    /// A worker began re-running the call from its oplog.
    Replay(ReplayStarted),
    WallClock(WallClock),
    MonotonicClock(MonotonicClock),
    Random(Random),
    /// An outgoing request, committed before it leaves the sandbox.
    HttpRequest(HttpRequest),
    HttpResponse(HttpResponse),
    /// The request produced no response (DNS, connection, protocol, size).
    HttpError(HttpError),
    /// The egress policy refused the request.
    HttpDenied(HttpDenied),
    /// The tool reported progress (`toolgrid.progress`, `toolgrid:tool/progress.report`).
    Progress(ProgressReport),
    /// A program called a tool (code mode), committed before the call left the sandbox.
    ToolCall(super::ToolCall),
    /// The answer to a program's tool call, in the order the program was told.
    ToolResult(super::ToolResult),
    /// A person (or the approval's timeout) decided a call that waited for approval.
    Approval(super::ApprovalDecision),
    /// An attempt of a `read` or `idempotent` call failed for a transient reason and the
    /// call runs again after `backoffMs`: the entries before it belong to earlier attempts
    /// and are never replayed.
    Retry(Retry),
    /// How the call ended (always the last entry).
    Outcome(Outcome),
}

/// The kinds of [`OplogEntry`], for matching and display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    CallStarted,
    Assigned,
    Fenced,
    Replay,
    WallClock,
    MonotonicClock,
    Random,
    HttpRequest,
    HttpResponse,
    HttpError,
    HttpDenied,
    Progress,
    ToolCall,
    ToolResult,
    Approval,
    Retry,
    Outcome,
}

impl EntryKind {
    pub const ALL: [EntryKind; 17] = [
        EntryKind::CallStarted,
        EntryKind::Assigned,
        EntryKind::Fenced,
        EntryKind::Replay,
        EntryKind::WallClock,
        EntryKind::MonotonicClock,
        EntryKind::Random,
        EntryKind::HttpRequest,
        EntryKind::HttpResponse,
        EntryKind::HttpError,
        EntryKind::HttpDenied,
        EntryKind::Progress,
        EntryKind::ToolCall,
        EntryKind::ToolResult,
        EntryKind::Approval,
        EntryKind::Retry,
        EntryKind::Outcome,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::CallStarted => "call-started",
            EntryKind::Assigned => "assigned",
            EntryKind::Fenced => "fenced",
            EntryKind::Replay => "replay",
            EntryKind::WallClock => "wall-clock",
            EntryKind::MonotonicClock => "monotonic-clock",
            EntryKind::Random => "random",
            EntryKind::HttpRequest => "http-request",
            EntryKind::HttpResponse => "http-response",
            EntryKind::HttpError => "http-error",
            EntryKind::HttpDenied => "http-denied",
            EntryKind::Progress => "progress",
            EntryKind::ToolCall => "tool-call",
            EntryKind::ToolResult => "tool-result",
            EntryKind::Approval => "approval",
            EntryKind::Retry => "retry",
            EntryKind::Outcome => "outcome",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        EntryKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Entries that answer a guest's host call, and so are replayed after a failover.
    pub fn is_host(self) -> bool {
        matches!(
            self,
            EntryKind::WallClock
                | EntryKind::MonotonicClock
                | EntryKind::Random
                | EntryKind::HttpRequest
                | EntryKind::HttpResponse
                | EntryKind::HttpError
                | EntryKind::HttpDenied
                | EntryKind::Progress
                | EntryKind::ToolCall
                | EntryKind::ToolResult
        )
    }

    /// Entries matched by request number rather than by position.
    pub fn is_http(self) -> bool {
        matches!(
            self,
            EntryKind::HttpRequest
                | EntryKind::HttpResponse
                | EntryKind::HttpError
                | EntryKind::HttpDenied
        )
    }
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored or received entry that is not an [`OplogEntry`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("unknown oplog entry kind {0:?}")]
    UnknownKind(String),
    #[error("oplog entry {kind} does not parse: {reason}")]
    Malformed { kind: String, reason: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallStarted {
    pub namespace: String,
    pub tool: String,
    pub command: String,
    pub release: String,
    pub version: String,
    pub digest: String,
    /// The validated arguments by name (the tool's own JSON).
    pub args: Value,
    pub argv: Vec<String>,
    pub stdin_bytes: u64,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// A dry run: a `read` command runs for real, any other is answered without running.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// What each middleware step decided, in chain order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub middleware: Vec<super::Decision>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assigned {
    pub worker: String,
    pub epoch: u64,
    /// The version of its agent's workspace the call runs on (pinned at its first
    /// assignment, the same on every later one), for a call that sees a workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_version: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fenced {
    pub reason: String,
    pub previous_epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayStarted {
    pub worker: String,
    pub attempt: u32,
    pub epoch: u64,
    /// Host-call entries handed to the worker to replay.
    pub entries: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WallClock {
    pub secs: u64,
    pub nanos: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonotonicClock {
    pub ns: u64,
}

/// Which `wasi:random` interface a draw came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RandomSource {
    Secure,
    Insecure,
}

impl RandomSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RandomSource::Secure => "secure",
            RandomSource::Insecure => "insecure",
        }
    }
}

/// Consecutive draws of one source, as one byte string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Random {
    pub source: RandomSource,
    #[serde(rename = "hex", with = "hex_bytes")]
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequest {
    /// The request's number within the call, from 1, in the guest's issue order.
    pub seq: u64,
    pub method: String,
    /// The URL as the tool wrote it: secret references (`${secret:NAME}`) as written, never
    /// their values, and any secret value the tool wrote literally replaced by its reference.
    pub url: String,
    /// Headers as the tool wrote them, secret values redacted the same way; the headers at
    /// the indices in `digested` (credential headers, and any holding a reference) hold
    /// `sha256:<hex>` of their written value instead.
    pub headers: Vec<(String, String)>,
    /// Which of `headers` are recorded as a digest (absent in oplogs written before
    /// digests, whose credential headers a replay digests itself).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub digested: Vec<u32>,
    pub body_sha256: String,
    pub body_bytes: u64,
    pub idempotency_key: String,
    pub attempt: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpResponse {
    pub seq: u64,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    #[serde(rename = "bodyBase64", with = "base64_bytes")]
    pub body: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpError {
    pub seq: u64,
    pub message: String,
    /// The host name did not resolve (told to the guest as such).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unresolved: bool,
    /// A limit of the call stopped the request (`request-limit`, `response-limit`,
    /// `memory-limit`): a replay ends the call with the same kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<super::ErrorKind>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpDenied {
    pub seq: u64,
    pub message: String,
    /// Why, when it was not the egress policy (absent): `unknown-secret` for a request that
    /// referred to a secret the call may not use, `request-limit` for one whose references'
    /// values would add more than the host allows (the call ends with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<super::ErrorKind>,
}

/// A failed attempt that is followed by another (see [`super::retry`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// The attempt that failed, from 1.
    pub attempt: u32,
    /// Why it failed (the error the call would have ended with).
    pub error: CallError,
    /// How long the call waits before its next attempt is queued.
    pub backoff_ms: u64,
}

/// A progress event a tool reported, as recorded (and streamed to callers with stage
/// `progress`). Replayed in order: a replay that reports a different message diverges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressReport {
    /// The tool's text: valid UTF-8, at most 1 KiB (longer reports are cut at a character
    /// boundary), secret values redacted.
    pub message: String,
}

impl ProgressReport {
    /// Longest message kept, in bytes.
    pub const MAX_BYTES: usize = 1024;

    /// `bytes` as a message: at most [`ProgressReport::MAX_BYTES`], cut at a character
    /// boundary; bytes that are not UTF-8 become U+FFFD.
    pub fn bounded(bytes: &[u8]) -> String {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(Self::MAX_BYTES * 4)]);
        if text.len() <= Self::MAX_BYTES {
            return text.into_owned();
        }
        let mut end = Self::MAX_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_string()
    }
}

/// The state a call ended in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ended {
    Succeeded,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub state: Ended,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CallError>,
    /// Set when a worker's run ended the call (absent when the control plane failed it);
    /// its fields sit beside `state` in the stored payload.
    #[serde(flatten)]
    pub run: Option<RunSummary>,
}

/// What a worker reported of the run that ended a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub exit_code: i32,
    pub stdout_bytes: u64,
    pub run_micros: u64,
    pub epoch: u64,
    pub worker: String,
    /// Host calls answered from the oplog.
    pub replayed: u64,
}

impl OplogEntry {
    pub fn kind(&self) -> EntryKind {
        match self {
            OplogEntry::CallStarted(_) => EntryKind::CallStarted,
            OplogEntry::Assigned(_) => EntryKind::Assigned,
            OplogEntry::Fenced(_) => EntryKind::Fenced,
            OplogEntry::Replay(_) => EntryKind::Replay,
            OplogEntry::WallClock(_) => EntryKind::WallClock,
            OplogEntry::MonotonicClock(_) => EntryKind::MonotonicClock,
            OplogEntry::Random(_) => EntryKind::Random,
            OplogEntry::HttpRequest(_) => EntryKind::HttpRequest,
            OplogEntry::HttpResponse(_) => EntryKind::HttpResponse,
            OplogEntry::HttpError(_) => EntryKind::HttpError,
            OplogEntry::HttpDenied(_) => EntryKind::HttpDenied,
            OplogEntry::Progress(_) => EntryKind::Progress,
            OplogEntry::ToolCall(_) => EntryKind::ToolCall,
            OplogEntry::ToolResult(_) => EntryKind::ToolResult,
            OplogEntry::Approval(_) => EntryKind::Approval,
            OplogEntry::Retry(_) => EntryKind::Retry,
            OplogEntry::Outcome(_) => EntryKind::Outcome,
        }
    }

    /// Visits the text of this entry that a tool or a peer wrote, for a reader's filter
    /// (redaction, secret scrubbing): HTTP URLs and header values, response bodies (through
    /// `body`), HTTP error and refusal messages, progress messages, fence and approval
    /// reasons, and the messages and stderr tails of retries and of the outcome. The call's
    /// arguments (`call-started`) and the entries' structure (kinds, numbers, digests) are
    /// not visited.
    pub fn visit_written_text(
        &mut self,
        text: &mut dyn FnMut(&mut String),
        body: &mut dyn FnMut(&mut Vec<u8>),
    ) {
        let error = |error: &mut CallError, text: &mut dyn FnMut(&mut String)| {
            text(&mut error.message);
            text(&mut error.stderr_tail);
        };
        match self {
            OplogEntry::HttpRequest(request) => {
                text(&mut request.url);
                request.headers.iter_mut().for_each(|(_, v)| text(v));
            }
            OplogEntry::HttpResponse(response) => {
                response.headers.iter_mut().for_each(|(_, v)| text(v));
                body(&mut response.body);
            }
            OplogEntry::HttpError(e) => text(&mut e.message),
            OplogEntry::HttpDenied(denied) => text(&mut denied.message),
            OplogEntry::Progress(report) => text(&mut report.message),
            OplogEntry::ToolResult(result) => {
                if let super::NestedOutcome::Error(error) = &mut result.outcome {
                    text(&mut error.message)
                }
            }
            OplogEntry::Fenced(fenced) => text(&mut fenced.reason),
            OplogEntry::Approval(decision) => text(&mut decision.reason),
            OplogEntry::Retry(retry) => error(&mut retry.error, text),
            OplogEntry::Outcome(outcome) => {
                if let Some(e) = &mut outcome.error {
                    error(e, text);
                }
            }
            OplogEntry::CallStarted(_)
            | OplogEntry::Assigned(_)
            | OplogEntry::Replay(_)
            | OplogEntry::WallClock(_)
            | OplogEntry::MonotonicClock(_)
            | OplogEntry::Random(_)
            | OplogEntry::ToolCall(_) => {}
        }
    }

    /// The request number of an HTTP entry.
    pub fn http_seq(&self) -> Option<u64> {
        match self {
            OplogEntry::HttpRequest(e) => Some(e.seq),
            OplogEntry::HttpResponse(e) => Some(e.seq),
            OplogEntry::HttpError(e) => Some(e.seq),
            OplogEntry::HttpDenied(e) => Some(e.seq),
            _ => None,
        }
    }

    /// The entry as its kind and payload (the entry's JSON without `kind`).
    pub fn to_parts(&self) -> (EntryKind, Value) {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.remove("kind");
        }
        (self.kind(), value)
    }

    /// The payload as JSON text (what the store and the wire carry).
    pub fn payload_text(&self) -> String {
        self.to_parts().1.to_string()
    }

    /// Reads an entry from its kind and payload.
    pub fn from_parts(kind: &str, payload: Value) -> Result<Self, EntryError> {
        if EntryKind::parse(kind).is_none() {
            return Err(EntryError::UnknownKind(kind.to_string()));
        }
        let malformed = |reason: String| EntryError::Malformed {
            kind: kind.to_string(),
            reason,
        };
        let Value::Object(mut map) = payload else {
            return Err(malformed("the payload is not a JSON object".into()));
        };
        map.insert("kind".into(), Value::String(kind.to_string()));
        serde_json::from_value(Value::Object(map)).map_err(|e| malformed(e.to_string()))
    }

    /// Reads an entry from its kind and payload text.
    pub fn from_text(kind: &str, payload: &[u8]) -> Result<Self, EntryError> {
        let value = serde_json::from_slice(payload).map_err(|e| EntryError::Malformed {
            kind: kind.to_string(),
            reason: format!("the payload is not JSON: {e}"),
        })?;
        Self::from_parts(kind, value)
    }
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text).map_err(serde::de::Error::custom)
    }
}

mod base64_bytes {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_round_trip_through_kind_and_payload() {
        let entries = [
            OplogEntry::WallClock(WallClock { secs: 1, nanos: 2 }),
            OplogEntry::Random(Random {
                source: RandomSource::Insecure,
                bytes: vec![1, 2, 255],
            }),
            OplogEntry::HttpResponse(HttpResponse {
                seq: 3,
                status: 204,
                headers: vec![("a".into(), "b".into())],
                body: b"\x00hi".to_vec(),
            }),
            OplogEntry::HttpError(HttpError {
                seq: 1,
                message: "x".into(),
                unresolved: true,
                limit: None,
            }),
            OplogEntry::Retry(Retry {
                attempt: 2,
                error: CallError::new(super::super::ErrorKind::Unavailable, "busy"),
                backoff_ms: 400,
            }),
        ];
        for entry in entries {
            let (kind, payload) = entry.to_parts();
            assert!(payload.get("kind").is_none());
            assert_eq!(
                OplogEntry::from_parts(kind.as_str(), payload).unwrap(),
                entry
            );
        }
    }

    #[test]
    fn payloads_keep_the_stored_shape() {
        // Oplogs written before the typed model read the same.
        let entry = OplogEntry::from_parts(
            "http-request",
            json!({"seq": 1, "method": "GET", "url": "http://x/", "headers": [["a", "b"]],
                   "bodySha256": "00", "bodyBytes": 0, "idempotencyKey": "k", "attempt": 1}),
        )
        .unwrap();
        assert_eq!(entry.http_seq(), Some(1));
        let random =
            OplogEntry::from_parts("random", json!({"source": "secure", "hex": "0a0b"})).unwrap();
        assert_eq!(
            random,
            OplogEntry::Random(Random {
                source: RandomSource::Secure,
                bytes: vec![10, 11]
            })
        );
    }

    #[test]
    fn outcomes_keep_the_run_beside_the_state() {
        let outcome = OplogEntry::Outcome(Outcome {
            state: Ended::Succeeded,
            error: None,
            run: Some(RunSummary {
                exit_code: 0,
                stdout_bytes: 5,
                run_micros: 9,
                epoch: 2,
                worker: "w1".into(),
                replayed: 3,
            }),
        });
        let (_, payload) = outcome.to_parts();
        assert_eq!(payload["worker"], "w1");
        assert_eq!(payload["state"], "succeeded");
        assert_eq!(OplogEntry::from_parts("outcome", payload).unwrap(), outcome);
        let failed = OplogEntry::from_parts(
            "outcome",
            json!({"state": "failed", "error": {"kind": "timeout", "message": "m"}}),
        )
        .unwrap();
        assert!(matches!(
            failed,
            OplogEntry::Outcome(Outcome {
                run: None,
                error: Some(_),
                ..
            })
        ));
    }

    #[test]
    fn malformed_payloads_are_errors_never_defaults() {
        let cases = [
            (
                "http-response",
                json!({"seq": 1, "headers": [], "bodyBase64": ""}),
            ),
            (
                "http-response",
                json!({"seq": 1, "status": "200", "headers": [], "bodyBase64": ""}),
            ),
            (
                "http-response",
                json!({"seq": 1, "status": 200, "headers": [], "bodyBase64": "%%"}),
            ),
            ("wall-clock", json!({"secs": 1})),
            ("random", json!({"source": "secure", "hex": "zz"})),
            ("random", json!({"source": "other", "hex": "00"})),
            ("monotonic-clock", json!(null)),
            ("monotonic-clock", json!("12")),
        ];
        for (kind, payload) in cases {
            let error = OplogEntry::from_parts(kind, payload.clone()).unwrap_err();
            assert!(
                matches!(&error, EntryError::Malformed { kind: k, .. } if k == kind),
                "{kind} {payload}: {error}"
            );
        }
        assert_eq!(
            OplogEntry::from_parts("clock", json!({})).unwrap_err(),
            EntryError::UnknownKind("clock".into())
        );
        assert!(OplogEntry::from_text("wall-clock", b"{not json").is_err());
    }

    #[test]
    fn host_kinds_are_the_replayed_ones() {
        let host: Vec<_> = EntryKind::ALL
            .into_iter()
            .filter(|k| k.is_host())
            .map(EntryKind::as_str)
            .collect();
        assert_eq!(
            host,
            [
                "wall-clock",
                "monotonic-clock",
                "random",
                "http-request",
                "http-response",
                "http-error",
                "http-denied",
                "progress",
                "tool-call",
                "tool-result"
            ]
        );
        for kind in EntryKind::ALL {
            assert_eq!(EntryKind::parse(kind.as_str()), Some(kind));
        }
    }
}
