//! The wire's messages converted to and from the domain's types, once, at this edge.

use crate::{CallResult, OplogEntry, WorkspaceFile};
use serde_json::Value;
use toolgrid_core::call::{self, CallRecord, CallState, ErrorKind, OplogRecord};
use toolgrid_core::completion::RunReport;
use toolgrid_core::workspace;

// The wire carries an oplog entry as its kind and its payload's JSON, converted here once.

impl From<&call::OplogEntry> for OplogEntry {
    fn from(entry: &call::OplogEntry) -> Self {
        let (kind, payload) = entry.to_parts();
        OplogEntry {
            kind: kind.as_str().to_string(),
            payload: payload.to_string().into_bytes(),
        }
    }
}

impl TryFrom<&OplogEntry> for call::OplogEntry {
    type Error = call::EntryError;

    fn try_from(entry: &OplogEntry) -> Result<Self, Self::Error> {
        call::OplogEntry::from_text(&entry.kind, &entry.payload)
    }
}

/// A program's tool call answer off the wire. An unknown error kind is `internal`.
pub fn nested_answer(answer: crate::ToolCallAnswer) -> call::NestedAnswer {
    let outcome = if answer.ok {
        match serde_json::from_str(&answer.value_json) {
            Ok(value) => call::NestedOutcome::Value(value),
            Err(error) => call::NestedOutcome::error(
                ErrorKind::Internal,
                format!("the control plane sent a result that is not JSON: {error}"),
            ),
        }
    } else {
        call::NestedOutcome::error(
            ErrorKind::parse(&answer.error_kind).unwrap_or(ErrorKind::Internal),
            answer.error_message,
        )
    };
    call::NestedAnswer {
        call: (!answer.child_call_id.is_empty()).then_some(answer.child_call_id),
        outcome,
    }
}

/// A program's tool call answer for the wire.
pub fn nested_answer_to_wire(
    request_id: u64,
    answer: &call::NestedAnswer,
) -> crate::ToolCallAnswer {
    let mut wire = crate::ToolCallAnswer {
        request_id,
        child_call_id: answer.call.clone().unwrap_or_default(),
        ..Default::default()
    };
    match &answer.outcome {
        call::NestedOutcome::Value(value) => {
            wire.ok = true;
            wire.value_json = value.to_string();
        }
        call::NestedOutcome::Error(error) => {
            wire.error_kind = error.kind.as_str().to_string();
            wire.error_message = error.message.clone();
        }
    }
    wire
}

/// Converts a batch of entries for the wire.
pub fn entries_to_wire(entries: &[call::OplogEntry]) -> Vec<OplogEntry> {
    entries.iter().map(OplogEntry::from).collect()
}

/// Reads a batch of entries off the wire; the first that does not parse is the error.
pub fn entries_from_wire(
    entries: &[OplogEntry],
) -> Result<Vec<call::OplogEntry>, call::EntryError> {
    entries.iter().map(call::OplogEntry::try_from).collect()
}

/// Bytes of entries one message on the worker link carries at most (unless a single entry is
/// larger: entries are capped well below the link's 64 MiB message limit, see
/// `call::MAX_RESPONSE_BYTES`).
pub const LINK_BATCH_BYTES: usize = 4 << 20;

/// Splits entries into consecutive batches of at most [`LINK_BATCH_BYTES`] each (a larger
/// single entry travels alone), so no message on the worker link outgrows its limit.
pub fn link_batches(entries: Vec<OplogEntry>) -> Vec<Vec<OplogEntry>> {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut size = 0;
    for entry in entries {
        let bytes = entry.kind.len() + entry.payload.len() + 8;
        if !batch.is_empty() && size + bytes > LINK_BATCH_BYTES {
            batches.push(std::mem::take(&mut batch));
            size = 0;
        }
        size += bytes;
        batch.push(entry);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

// A workspace tree on the wire: one `WorkspaceFile` per file, checked again when read.

/// A tree for the wire.
pub fn tree_to_wire(tree: &workspace::Tree) -> Vec<WorkspaceFile> {
    tree.files
        .iter()
        .map(|(path, file)| WorkspaceFile {
            path: path.to_string(),
            digest: file.digest.clone(),
            size: file.size,
        })
        .collect()
}

/// Reads a tree off the wire (from a peer: every path and digest is validated).
pub fn tree_from_wire(files: &[WorkspaceFile]) -> Result<workspace::Tree, workspace::TreeError> {
    workspace::Tree::from_rows(
        files
            .iter()
            .map(|f| (f.path.clone(), f.digest.clone(), f.size)),
    )
}

/// The workspace a worker's result carries, if any.
pub fn commit_of(result: &CallResult) -> Result<Option<workspace::Commit>, workspace::TreeError> {
    if !result.has_workspace {
        return Ok(None);
    }
    Ok(Some(workspace::Commit {
        tree: tree_from_wire(&result.workspace_tree)?,
        blobs: result
            .workspace_blobs
            .iter()
            .map(|b| (b.digest.clone(), b.data.clone()))
            .collect(),
    }))
}

/// A worker's result as the report the call is judged by.
impl<'a> From<&'a CallResult> for RunReport<'a> {
    fn from(result: &'a CallResult) -> Self {
        RunReport {
            exit_code: result.exit_code,
            stdout: &result.stdout,
            stderr_tail: &result.stderr_tail,
            failure: (!result.failure_kind.is_empty()).then(|| {
                (
                    ErrorKind::parse(&result.failure_kind).unwrap_or(ErrorKind::Internal),
                    result.failure_message.as_str(),
                )
            }),
            run_micros: result.run_micros,
            epoch: result.epoch,
            replayed: result.replayed,
            workspace: commit_of(result),
        }
    }
}

// Call records and their oplogs, as the `Tools` service answers them.

impl From<CallState> for crate::CallState {
    fn from(state: CallState) -> Self {
        match state {
            CallState::AwaitingApproval => crate::CallState::AwaitingApproval,
            CallState::Pending => crate::CallState::Pending,
            CallState::Running => crate::CallState::Running,
            CallState::Succeeded => crate::CallState::Succeeded,
            CallState::Failed => crate::CallState::Failed,
        }
    }
}

/// A call record for the wire; `deduplicated` says the request found an earlier call by
/// its idempotency key.
pub fn call_to_proto(record: &CallRecord, deduplicated: bool) -> crate::Call {
    crate::Call {
        id: record.id.clone(),
        namespace: record.namespace.clone(),
        tool: record.tool.clone(),
        command: record.command.clone(),
        release: record.release.clone(),
        release_digest: record.release_digest.clone(),
        state: crate::CallState::from(record.state) as i32,
        result_json: record
            .result
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default(),
        error: record.error.as_ref().map(|e| crate::CallError {
            kind: e.kind.as_str().into(),
            message: e.message.clone(),
            name: e.name.clone(),
            exit_code: e.exit_code,
            stderr_tail: e.stderr_tail.clone(),
        }),
        args_json: record.args.to_string(),
        idempotency_key: record.idempotency_key.clone().unwrap_or_default(),
        created_at_ms: record.created_at_ms,
        finished_at_ms: record.finished_at_ms.unwrap_or_default(),
        epoch: record.epoch,
        worker: record.worker.clone().unwrap_or_default(),
        deduplicated,
        agent: record.spec.access.agent.clone().unwrap_or_default(),
        dry_run: record.spec.dry_run,
        middleware_json: if record.spec.chain.decisions.is_empty() {
            String::new()
        } else {
            serde_json::to_string(&record.spec.chain.decisions).unwrap_or_default()
        },
        approval_json: record
            .approval_json()
            .map(|v| v.to_string())
            .unwrap_or_default(),
    }
}

impl From<&OplogRecord> for crate::OplogRecord {
    fn from(entry: &OplogRecord) -> Self {
        crate::OplogRecord {
            seq: entry.seq,
            epoch: entry.epoch,
            kind: entry.kind.clone(),
            payload_json: entry.payload.clone(),
            recorded_at_ms: entry.recorded_at_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_batches_stay_under_the_budget_and_keep_order() {
        let entry = |n: usize| OplogEntry {
            kind: "http-response".into(),
            payload: vec![b'x'; n],
        };
        let entries = vec![
            entry(3 << 20),
            entry(2 << 20),
            entry(9 << 20),
            entry(10),
            entry(10),
        ];
        let sizes: Vec<Vec<usize>> = link_batches(entries)
            .iter()
            .map(|b| b.iter().map(|e| e.payload.len()).collect())
            .collect();
        assert_eq!(
            sizes,
            [vec![3 << 20], vec![2 << 20], vec![9 << 20], vec![10, 10]]
        );
        assert!(link_batches(Vec::new()).is_empty());
    }

    #[test]
    fn a_result_reports_its_failure_and_refuses_a_hostile_tree() {
        let ok = CallResult {
            call_id: "c".into(),
            epoch: 1,
            stdout: b"{}".to_vec(),
            ..Default::default()
        };
        let report = RunReport::from(&ok);
        assert!(report.failure.is_none() && matches!(report.workspace, Ok(None)));
        let failed = CallResult {
            failure_kind: "memory-limit".into(),
            failure_message: "out of memory".into(),
            ..ok.clone()
        };
        assert_eq!(
            RunReport::from(&failed).failure,
            Some((ErrorKind::MemoryLimit, "out of memory"))
        );
        let unknown = CallResult {
            failure_kind: "no-such-kind".into(),
            ..ok.clone()
        };
        assert_eq!(
            RunReport::from(&unknown).failure.map(|f| f.0),
            Some(ErrorKind::Internal)
        );
        let hostile = CallResult {
            has_workspace: true,
            workspace_tree: vec![WorkspaceFile {
                path: "../escape".into(),
                digest: workspace::blob_digest(b"x"),
                size: 1,
            }],
            ..ok
        };
        assert!(RunReport::from(&hostile).workspace.is_err());
    }
}
