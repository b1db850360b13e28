//! A call as it is admitted and kept: its spec (fixed at admission) and its record.

use super::{CallError, CallState, OplogEntry};
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

/// The sandbox limits of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunLimits {
    pub memory_bytes: u64,
    pub cpu_time_ms: u64,
    pub output_bytes: u64,
    /// The idle timeout: how long the call may run without reporting progress.
    pub timeout_ms: u64,
    /// The cap on the whole run that progress cannot extend past (the Tool's `maxTimeout`);
    /// 0: the timeout (calls admitted before progress existed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_timeout_ms: u64,
    /// Calls of the release running at once across the pool; 0 for no limit.
    #[serde(default)]
    pub instances: u32,
    /// Largest outgoing request body (and preview 1 request document); 0 for the default.
    #[serde(default)]
    pub request_bytes: u64,
    /// Largest response body an outgoing request may receive; 0 for the default.
    #[serde(default)]
    pub response_bytes: u64,
}

/// Default of a release's `limits.requestBytes`.
pub const DEFAULT_REQUEST_BYTES: u64 = 8 << 20;
/// Largest `limits.requestBytes` honoured; a larger value is clamped to it.
pub const MAX_REQUEST_BYTES: u64 = 64 << 20;
/// Default of a release's `limits.responseBytes`.
pub const DEFAULT_RESPONSE_BYTES: u64 = 8 << 20;
/// Largest `limits.responseBytes` honoured: a response is recorded in the oplog (base64) and
/// committed in one message, which must stay well under the 64 MiB gRPC message limit.
pub const MAX_RESPONSE_BYTES: u64 = 16 << 20;
/// Largest `limits.outputBytes` honoured: a call's stdout travels to the control plane in
/// one message (64 MiB gRPC limit) and is stored with the call.
pub const MAX_OUTPUT_BYTES: u64 = 16 << 20;

impl RunLimits {
    /// The stdout limit a worker enforces: `outputBytes`, at most [`MAX_OUTPUT_BYTES`].
    pub fn effective_output_bytes(&self) -> u64 {
        self.output_bytes.clamp(1, MAX_OUTPUT_BYTES)
    }

    /// The request limit a worker enforces (0 means the default).
    pub fn effective_request_bytes(&self) -> u64 {
        effective(self.request_bytes, DEFAULT_REQUEST_BYTES, MAX_REQUEST_BYTES)
    }

    /// The response limit a worker enforces (0 means the default).
    pub fn effective_response_bytes(&self) -> u64 {
        effective(
            self.response_bytes,
            DEFAULT_RESPONSE_BYTES,
            MAX_RESPONSE_BYTES,
        )
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn effective(value: u64, default: u64, max: u64) -> u64 {
    if value == 0 { default } else { value.min(max) }
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
    /// The Tool's effect when the call was admitted: whether its requests may be re-sent,
    /// whether it is retried, and whether stopping it leaves its outcome unknown.
    pub effect: crate::spec::Effect,
    /// The command's definition as the call was admitted, so the result is judged by the
    /// same rules even if the Tool changes meanwhile (absent only in a spec built without
    /// one, such as a benchmark's). Shared: every call of a command holds the one its
    /// tool's compiled interface keeps ([`crate::interface::CommandInterface::definition`]).
    #[serde(default)]
    pub command: Option<std::sync::Arc<crate::spec::Command>>,
    /// Unix milliseconds by which the whole call must end.
    #[serde(default)]
    pub deadline_ms: i64,
    /// The release's egress rules when the call was admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::spec::EgressRule>,
    /// The agent the call acts for and what its binding grants.
    #[serde(default)]
    pub access: super::CallAccess,
    /// Who asked: `operator:<subject>` or `agent:<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub caller: String,
    /// A dry run (`--dry-run`, `dryRun: true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// What the middleware chain decided, and what it still does (approval, redaction,
    /// audit).
    #[serde(default)]
    pub chain: super::ChainRecord,
    /// Attempts and backoff of the call (absent: it runs once, as calls admitted before
    /// retries existed did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<super::retry::RetrySpec>,
    /// The Tool's `resultPolicy` when the call was admitted: what model-facing front doors
    /// return for a large result (absent: inline up to the default size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_policy: Option<crate::spec::ResultPolicy>,
    /// The Tool declares `codeMode`: the call's program may call the caller's tools.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub code_mode: bool,
    /// An imported tool's call (a ToolSource's MCP tool or OpenAPI operation): the worker
    /// makes this upstream request instead of running a wasm instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<crate::source::UpstreamCall>,
    /// The release's read-only files when the call was admitted (`spec.files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<crate::artifact::FileRef>,
    /// The W3C trace context of the span that admitted the call: the spans of its
    /// dispatches, runs and completion, on any replica or worker and after a failover, are
    /// its children. None when the control plane exported no traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
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
    /// The `call-started` entry.
    pub started: super::CallStarted,
    /// A worker whose slot the scheduler reserved: the call is recorded already assigned
    /// to it (epoch 1), admission and assignment in one commit.
    pub assign_to: Option<String>,
    /// Refuse the call as [`Created::Repeated`] when the same agent recorded a call with
    /// the same `request_hash` within this many milliseconds (and no idempotency key
    /// matched). `None`: no check.
    pub repeat_window_ms: Option<i64>,
    /// A dry run of a command that must not run: the call is recorded already succeeded
    /// with this result (and its `outcome` entry), and never queued.
    pub dry_run_result: Option<Value>,
}

/// The answer to the store's `create_call` (`toolgrid_store::CallLog::create_call`).
#[derive(Clone, Debug)]
pub enum Created {
    New(CallRecord),
    /// An earlier call with the same idempotency key and request.
    Existing(CallRecord),
    /// Nothing recorded: the agent's identical call (this earlier one) is within the repeat
    /// window.
    Repeated(CallRecord),
}

impl Created {
    pub fn record(&self) -> &CallRecord {
        match self {
            Created::New(r) | Created::Existing(r) | Created::Repeated(r) => r,
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

impl CallRecord {
    /// The approval the call waits for or waited for, and its decision (`{wait, decision}`),
    /// as the front doors show it; `None` for a call no approval step held.
    pub fn approval_json(&self) -> Option<Value> {
        let wait = self.spec.chain.approval.as_ref()?;
        Some(serde_json::json!({"wait": wait, "decision": self.spec.chain.approved}))
    }
}

/// A stored oplog entry, as the store holds it: the payload is kept as written, so an entry
/// that no longer parses (a corrupted row) is still shown, and reading it as an
/// [`OplogEntry`] is an error the reader must handle.
#[derive(Clone, Debug, PartialEq)]
pub struct OplogRecord {
    pub seq: u64,
    pub epoch: u64,
    pub kind: String,
    /// The payload's JSON text.
    pub payload: String,
    pub recorded_at_ms: i64,
}

impl OplogRecord {
    /// The entry this record holds.
    pub fn entry(&self) -> Result<OplogEntry, super::EntryError> {
        OplogEntry::from_text(&self.kind, self.payload.as_bytes())
    }

    /// Rewrites the text of this record's entry that a tool or a peer wrote, for a reader's
    /// filter ([`OplogEntry::visit_written_text`]), and stores the entry again. A payload
    /// that does not parse as its kind (a corrupted row) goes through `text` whole.
    pub fn rewrite_written_text(
        &mut self,
        text: &mut dyn FnMut(&mut String),
        body: &mut dyn FnMut(&mut Vec<u8>),
    ) {
        match self.entry() {
            Ok(mut entry) => {
                entry.visit_written_text(text, body);
                self.payload = entry.payload_text();
            }
            Err(_) => text(&mut self.payload),
        }
    }

    /// The payload as JSON for display (a string when it is not JSON).
    pub fn payload_json(&self) -> Value {
        serde_json::from_str(&self.payload).unwrap_or_else(|_| Value::String(self.payload.clone()))
    }
}

#[derive(Clone, Debug, Default)]
pub struct CallFilter {
    pub namespace: Option<String>,
    pub tool: Option<String>,
    /// Only the calls made by (or, for an operator, as) this agent.
    pub agent: Option<String>,
    /// Only calls in this state (`toolgrid calls --awaiting-approval`).
    pub state: Option<CallState>,
    pub limit: u32,
}
