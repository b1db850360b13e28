//! What the middleware chain decided about a call, as the call keeps it: each step's
//! decision (for the oplog, the audit record and the console), and the steps that still act
//! after admission: the approval the call waits for, the redaction of its result, the shape
//! of its audit record. Fixed at admission in [`super::CallSpec::chain`], so a restart or a
//! changed Middleware never changes how an admitted call is treated.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// The kind of a middleware step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepKind {
    Policy,
    Approval,
    Redact,
    Audit,
    RateLimit,
    Wasm,
    /// The built-in check for an agent's identical call within the Tool's `repeatWindow`.
    RepeatedCall,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Policy => "policy",
            StepKind::Approval => "approval",
            StepKind::Redact => "redact",
            StepKind::Audit => "audit",
            StepKind::RateLimit => "rateLimit",
            StepKind::Wasm => "wasm",
            StepKind::RepeatedCall => "repeatedCall",
        }
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one step did with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Let the call go on unchanged.
    Allow,
    /// Refused it.
    Deny,
    /// Changed its command or arguments (the rewritten call was checked again).
    Rewrite,
    /// Holds it until a person decides.
    AwaitApproval,
    /// Will act on its result (redact) or record (audit).
    Applied,
    /// Failed (a trap, a timeout, an expression that does not evaluate): the call is
    /// refused, never let by.
    Error,
}

/// One step's decision about a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// The Middleware's name (`""` for a built-in step).
    pub middleware: String,
    pub kind: StepKind,
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The redaction a call's result and error text get before they are stored or returned:
/// the union of every redact step of its chain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedactRules {
    /// JSON pointers into the result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Regular expressions (Rust `regex` syntax) over every string of the result and over
    /// error text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
    pub replacement: String,
}

impl RedactRules {
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.patterns.is_empty()
    }
}

/// How a call's audit record is written: the union of its chain's audit steps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditOptions {
    /// Argument names left out of the record; `"*"` leaves out all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_args: Vec<String>,
    /// Also write the record as one JSON line to the control plane's stdout.
    #[serde(default)]
    pub stdout: bool,
}

/// The approval a call waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalWait {
    /// The Middleware that asked.
    pub middleware: String,
    /// Agents that may decide besides operators (never the calling agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// Unix milliseconds at which `on_timeout` applies.
    pub deadline_ms: i64,
    pub on_timeout: TimeoutAction,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutAction {
    Deny,
    Allow,
}

/// Who decided a call that waited for approval, when and why. Kept in the call's spec and
/// in its oplog (`approval`), and given to the tool as `TOOLGRID_APPROVED_BY`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    pub approved: bool,
    /// `operator:<subject>`, `agent:<namespace>/<name>`, or `timeout`.
    pub by: String,
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Environment variable that carries the approver to the tool.
pub const APPROVED_BY_ENV: &str = "TOOLGRID_APPROVED_BY";

/// Everything the chain fixed about a call at admission.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainRecord {
    /// Each step's decision, in chain order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redact: Option<RedactRules>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditOptions>,
    /// Set when the call had to wait for approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalWait>,
    /// The decision, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<ApprovalDecision>,
}

/// What a call's audit record says happened to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuditOutcome {
    /// Refused before it was recorded (authorization or a middleware step).
    Refused,
    Succeeded,
    Failed,
}

impl AuditOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditOutcome::Refused => "refused",
            AuditOutcome::Succeeded => "succeeded",
            AuditOutcome::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "refused" => AuditOutcome::Refused,
            "succeeded" => AuditOutcome::Succeeded,
            "failed" => AuditOutcome::Failed,
            _ => return None,
        })
    }
}

/// One audit record: one per call, refused ones included. Append-only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// The call's id; for a refused call, a fresh id that no call has.
    pub call_id: String,
    /// Unix milliseconds when the call ended or was refused.
    pub at_ms: i64,
    pub namespace: String,
    /// The agent (`""` for an operator's own call).
    pub agent: String,
    /// Who asked: `operator:<subject>` or `agent:<namespace>/<name>`.
    pub caller: String,
    pub tool: String,
    pub command: String,
    /// Arguments, less the excluded ones (`null` when all are excluded).
    pub args: Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    pub outcome: AuditOutcome,
    /// The error kind of a failed or refused call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<super::ErrorKind>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_message: String,
    /// From admission to the end (0 for a refusal).
    pub duration_ms: i64,
    #[serde(default)]
    pub dry_run: bool,
}

/// Which audit records to read.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    pub namespace: Option<String>,
    pub agent: Option<String>,
    pub tool: Option<String>,
    /// Records at or after these Unix milliseconds.
    pub since_ms: Option<i64>,
    pub limit: u32,
}

/// The answer a dry run of a non-`read` command gives when the command sets no
/// `dryRunResult`.
pub const DRY_RUN_ACKNOWLEDGED: &str = "Operation acknowledged.";
