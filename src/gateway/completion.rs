//! Completion: turn a worker's raw result into the call's outcome, by the rules of the
//! command the call was admitted with.

use crate::catalog::interface::CommandInterface;
use crate::error::ErrorKind;
use crate::proto;
use crate::store::{CallError, CallOutcome, CallRecord, RunSummary};

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
            stderr_tail: stderr,
            ..CallError::new(kind, result.failure_message.clone())
        })
    };
    // A succeeded read-write call's workspace goes to the store with its end; one that
    // does not read is the call's failure (nothing is committed).
    let (judged, workspace) = match (judged, proto::commit_of(result)) {
        (Ok(value), Ok(commit)) => (Ok(value), commit),
        (Ok(_), Err(error)) => (
            Err(CallError::new(
                ErrorKind::WorkspaceInvalid,
                format!("the worker's workspace tree is not acceptable: {error}"),
            )),
            None,
        ),
        (Err(error), _) => (Err(error), None),
    };
    tracing::debug!(call = %record.id, "judged");
    CallOutcome {
        result: judged,
        run: RunSummary {
            exit_code: result.exit_code,
            stdout_bytes: result.stdout.len() as u64,
            run_micros: result.run_micros,
            epoch: result.epoch,
            worker: worker.to_string(),
            replayed: result.replayed,
        },
        workspace,
    }
}
