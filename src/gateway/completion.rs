//! Completion: turn a worker's raw result into the call's outcome, by the rules of the
//! command the call was admitted with.

use crate::catalog::interface::CommandInterface;
use crate::error::ErrorKind;
use crate::proto;
use crate::store::{CallError, CallOutcome, CallRecord};
use serde_json::json;

/// Judges a finished run (the scheduler calls this for every result).
pub fn judge(
    interface: &CommandInterface,
    record: &CallRecord,
    result: &proto::CallResult,
    worker: &str,
) -> CallOutcome {
    let stderr = String::from_utf8_lossy(&result.stderr_tail)
        .trim_end()
        .to_string();
    let judged = if result.failure_kind.is_empty() {
        interface.judge(result.exit_code, &result.stdout, &result.stderr_tail)
    } else {
        let kind = ErrorKind::parse(&result.failure_kind).unwrap_or(ErrorKind::Internal);
        Err(CallError {
            kind: kind.as_str().into(),
            message: result.failure_message.clone(),
            stderr_tail: stderr,
            ..CallError::default()
        })
    };
    let entry = match &judged {
        Ok(_) => json!({
            "state": "succeeded",
            "exitCode": result.exit_code,
            "stdoutBytes": result.stdout.len(),
            "runMicros": result.run_micros,
            "epoch": result.epoch,
            "worker": worker,
            "replayed": result.replayed,
        }),
        Err(error) => json!({
            "state": "failed",
            "exitCode": result.exit_code,
            "error": error,
            "stdoutBytes": result.stdout.len(),
            "runMicros": result.run_micros,
            "epoch": result.epoch,
            "worker": worker,
            "replayed": result.replayed,
        }),
    };
    tracing::debug!(call = %record.id, "judged");
    CallOutcome {
        result: judged,
        entry,
    }
}
