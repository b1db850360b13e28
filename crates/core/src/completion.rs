//! Completion: turn a worker's report of a finished run into the call's outcome, by the rules
//! of the command the call was admitted with.

use crate::call::{CallError, CallRecord, ErrorKind, RunSummary};
use crate::interface::CommandInterface;
use crate::workspace::{Commit, TreeError, WorkspaceKey};

/// What a worker reports of a finished run (the worker link's `CallResult`, converted at
/// the edge).
#[derive(Clone, Debug)]
pub struct RunReport<'a> {
    pub exit_code: i32,
    pub stdout: &'a [u8],
    pub stderr_tail: &'a [u8],
    /// The run failed before the tool could answer (a limit, a trap, a divergent replay):
    /// its kind and message.
    pub failure: Option<(ErrorKind, &'a str)>,
    pub run_micros: u64,
    pub epoch: u64,
    /// Host calls answered from the oplog.
    pub replayed: u64,
    /// A read-write call's new workspace tree and blobs (`Ok(None)`: none sent; `Err`: what
    /// was sent is not an acceptable tree).
    pub workspace: Result<Option<Commit>, TreeError>,
}

/// How a call ended, as the worker's result was judged.
#[derive(Clone, Debug)]
pub struct CallOutcome {
    pub result: Result<serde_json::Value, CallError>,
    /// What the worker reported of the run (recorded in the `outcome` entry).
    pub run: RunSummary,
    /// A succeeded read-write call's workspace: committed as the base version + 1 in the
    /// same transaction that ends the call, if the head is still the base, the tree within
    /// the workspace limits and every blob present and matching its digest (otherwise the
    /// call fails `workspace-conflict`, `workspace-limit` or `workspace-invalid` and
    /// nothing is committed). Ignored for a failed call.
    pub workspace: Option<Commit>,
}

/// Judges a finished run (the scheduler calls this for every result).
pub fn judge(
    interface: &CommandInterface,
    record: &CallRecord,
    result: RunReport<'_>,
    worker: &str,
) -> CallOutcome {
    let stderr = String::from_utf8_lossy(result.stderr_tail)
        .trim_end()
        .to_string();
    let judged = match result.failure {
        None => interface.judge(result.exit_code, result.stdout, result.stderr_tail),
        Some((kind, message)) => Err(CallError {
            stderr_tail: stderr,
            ..CallError::new(kind, message)
        }),
    };
    // A succeeded read-write call's workspace goes to the store with its end; one that
    // does not read is the call's failure (nothing is committed).
    let writes = WorkspaceKey::written_by(&record.namespace, &record.spec.access);
    let (judged, workspace) = match (judged, result.workspace) {
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
    use crate::call::{CallSpec, CallState, Filesystem};
    use crate::fixtures::{self, access};

    fn record(filesystem: Filesystem) -> CallRecord {
        CallRecord {
            state: CallState::Running,
            spec: CallSpec {
                access: access("alice", filesystem),
                ..CallSpec::default()
            },
            epoch: 1,
            worker: Some("w".into()),
            ..fixtures::record("c")
        }
    }

    fn report(exit_code: i32, workspace: Result<Option<Commit>, TreeError>) -> RunReport<'static> {
        RunReport {
            exit_code,
            stdout: b"{}",
            stderr_tail: b"",
            failure: None,
            run_micros: 0,
            epoch: 1,
            replayed: 0,
            workspace,
        }
    }

    #[test]
    fn a_read_write_success_carries_its_tree_and_nothing_else_does() {
        let command: crate::spec::Command =
            serde_json::from_value(serde_json::json!({"name": "c"})).unwrap();
        let interface = CommandInterface::compile(&command, "command").unwrap();
        let tree = crate::workspace::Tree::from_rows([(
            "a".to_string(),
            crate::workspace::blob_digest(b"x"),
            1,
        )])
        .unwrap();
        let with_tree = || {
            Ok(Some(Commit {
                tree: tree.clone(),
                blobs: Vec::new(),
            }))
        };
        let judged = judge(
            &interface,
            &record(Filesystem::ReadWrite),
            report(0, with_tree()),
            "w",
        );
        assert!(judged.result.is_ok());
        assert_eq!(judged.workspace.map(|c| c.tree.len()), Some(1));
        // A read-write success without a tree is the worker's fault, not a silent no-op.
        let judged = judge(
            &interface,
            &record(Filesystem::ReadWrite),
            report(0, Ok(None)),
            "w",
        );
        assert_eq!(judged.result.unwrap_err().kind, ErrorKind::WorkspaceInvalid);
        // A hostile path in the tree (refused where the wire converts) fails the call by name.
        let hostile = crate::workspace::Tree::from_rows([(
            "../escape".to_string(),
            crate::workspace::blob_digest(b"x"),
            1,
        )])
        .map(|_| None);
        assert!(hostile.is_err());
        let judged = judge(
            &interface,
            &record(Filesystem::ReadWrite),
            report(0, hostile),
            "w",
        );
        assert_eq!(judged.result.unwrap_err().kind, ErrorKind::WorkspaceInvalid);
        // A read-only call's success stays a success; the store refuses any tree it carries.
        let judged = judge(
            &interface,
            &record(Filesystem::ReadOnly),
            report(0, Ok(None)),
            "w",
        );
        assert!(judged.result.is_ok() && judged.workspace.is_none());
        // A failed call never carries a tree.
        let judged = judge(
            &interface,
            &record(Filesystem::ReadWrite),
            report(5, with_tree()),
            "w",
        );
        assert!(judged.result.is_err() && judged.workspace.is_none());
    }
}
