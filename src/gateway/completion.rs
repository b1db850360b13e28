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
    let writes = crate::workspace::WorkspaceKey::written_by(&record.namespace, &record.spec.access);
    let (judged, workspace) = match (judged, proto::commit_of(result)) {
        (Ok(_), Ok(None)) if writes.is_some() => (
            Err(CallError::new(
                ErrorKind::WorkspaceInvalid,
                "the worker sent no workspace tree for a read-write call",
            )),
            None,
        ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{CallAccess, CallState, Filesystem};
    use crate::store::CallSpec;

    fn record(filesystem: Filesystem) -> CallRecord {
        CallRecord {
            id: "c".into(),
            namespace: "default".into(),
            tool: "t".into(),
            command: "c".into(),
            release: "t-1".into(),
            release_digest: "sha256:1".into(),
            state: CallState::Running,
            args: serde_json::json!({}),
            spec: CallSpec {
                access: CallAccess {
                    agent: Some("alice".into()),
                    filesystem,
                    ..CallAccess::default()
                },
                ..CallSpec::default()
            },
            stdin: Vec::new(),
            idempotency_key: None,
            request_hash: String::new(),
            epoch: 1,
            worker: Some("w".into()),
            result: None,
            error: None,
            created_at_ms: 0,
            finished_at_ms: None,
        }
    }

    #[test]
    fn a_read_write_success_carries_its_tree_and_nothing_else_does() {
        let command: crate::api::Command =
            serde_json::from_value(serde_json::json!({"name": "c"})).unwrap();
        let interface = CommandInterface::compile(&command, "command").unwrap();
        let ok = proto::CallResult {
            call_id: "c".into(),
            epoch: 1,
            stdout: b"{}".to_vec(),
            ..Default::default()
        };
        let with_tree = proto::CallResult {
            has_workspace: true,
            workspace_tree: vec![proto::WorkspaceFile {
                path: "a".into(),
                digest: crate::workspace::blob_digest(b"x"),
                size: 1,
            }],
            ..ok.clone()
        };
        let judged = judge(&interface, &record(Filesystem::ReadWrite), &with_tree, "w");
        assert!(judged.result.is_ok());
        assert_eq!(judged.workspace.map(|c| c.tree.len()), Some(1));
        // A read-write success without a tree is the worker's fault, not a silent no-op.
        let judged = judge(&interface, &record(Filesystem::ReadWrite), &ok, "w");
        assert_eq!(judged.result.unwrap_err().kind, ErrorKind::WorkspaceInvalid);
        // A hostile path in the tree fails the call by name.
        let mut hostile = with_tree.clone();
        hostile.workspace_tree[0].path = "../escape".into();
        let judged = judge(&interface, &record(Filesystem::ReadWrite), &hostile, "w");
        assert_eq!(judged.result.unwrap_err().kind, ErrorKind::WorkspaceInvalid);
        // A read-only call's success stays a success; the store refuses any tree it carries.
        let judged = judge(&interface, &record(Filesystem::ReadOnly), &ok, "w");
        assert!(judged.result.is_ok() && judged.workspace.is_none());
        // A failed call never carries a tree.
        let failed = proto::CallResult {
            exit_code: 5,
            ..with_tree
        };
        let judged = judge(&interface, &record(Filesystem::ReadWrite), &failed, "w");
        assert!(judged.result.is_err() && judged.workspace.is_none());
    }
}
