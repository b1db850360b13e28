//! The records the store keeps.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallState {
    /// Recorded, waiting for a worker slot.
    Pending,
    /// Assigned to a worker.
    Running,
    Succeeded,
    Failed,
}

impl CallState {
    pub fn as_str(self) -> &'static str {
        match self {
            CallState::Pending => "pending",
            CallState::Running => "running",
            CallState::Succeeded => "succeeded",
            CallState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
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

/// A failed call's error, as callers see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallError {
    /// Stable kebab-case kind (see [`crate::error::ErrorKind`]).
    pub kind: String,
    pub message: String,
    /// The declared error's name, for a declared exit code.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// The sandbox limits of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunLimits {
    pub memory_bytes: u64,
    pub cpu_time_ms: u64,
    pub output_bytes: u64,
    pub timeout_ms: u64,
    /// Calls of the release running at once across the pool; 0 for no limit.
    #[serde(default)]
    pub instances: u32,
}

/// Everything a worker needs to run a call, fixed when the call is admitted so that a
/// reassigned call runs exactly the same way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallSpec {
    pub pool: String,
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub limits: RunLimits,
    pub effect: String,
    /// The command's definition as the call was admitted (an `api::Command`), so the
    /// result is judged by the same rules even if the Tool changes meanwhile.
    #[serde(default)]
    pub command: Value,
    /// Unix milliseconds by which the whole call must end.
    #[serde(default)]
    pub deadline_ms: i64,
    /// The release's egress rules when the call was admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::api::EgressRule>,
}

/// A call as the gateway admits it.
#[derive(Clone, Debug)]
pub struct NewCall {
    pub id: String,
    pub namespace: String,
    pub tool: String,
    pub command: String,
    pub release: String,
    pub release_digest: String,
    pub args: Value,
    pub spec: CallSpec,
    pub stdin: Vec<u8>,
    pub idempotency_key: Option<String>,
    /// Fingerprint of the request, to tell a retry from a different call with the same key.
    pub request_hash: String,
    /// Payload of the `call-started` entry.
    pub started: Value,
}

/// The answer to [`super::Store::create_call`].
#[derive(Clone, Debug)]
pub enum Created {
    New(CallRecord),
    /// An earlier call with the same idempotency key and request.
    Existing(CallRecord),
}

impl Created {
    pub fn record(&self) -> &CallRecord {
        match self {
            Created::New(r) | Created::Existing(r) => r,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    pub id: String,
    pub namespace: String,
    pub tool: String,
    pub command: String,
    pub release: String,
    pub release_digest: String,
    pub state: CallState,
    pub args: Value,
    pub spec: CallSpec,
    pub stdin: Vec<u8>,
    pub idempotency_key: Option<String>,
    pub request_hash: String,
    pub epoch: u64,
    pub worker: Option<String>,
    pub result: Option<Value>,
    pub error: Option<CallError>,
    pub created_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

/// An oplog entry to append.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEntry {
    pub kind: String,
    pub payload: Value,
}

impl NewEntry {
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        NewEntry {
            kind: kind.into(),
            payload,
        }
    }
}

/// A stored oplog entry.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OplogRecord {
    pub seq: u64,
    pub epoch: u64,
    pub kind: String,
    pub payload: Value,
    pub recorded_at_ms: i64,
}

#[derive(Clone, Debug, Default)]
pub struct CallFilter {
    pub namespace: Option<String>,
    pub tool: Option<String>,
    pub limit: u32,
}

/// What the store remembers of a resource between runs: its generation (bumped when the
/// spec changes) and last status, so conditions keep their transition times.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceRecord {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub spec_hash: String,
    pub generation: i64,
    pub status: Value,
}
