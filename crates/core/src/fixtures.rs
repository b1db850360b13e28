//! Test fixtures shared by the crate's test modules: the call types with plain defaults.
//! A test states only what it cares about and takes the rest with a struct update,
//! `CallRecord { state: CallState::Running, epoch: 1, ..record("c1") }`.
//!
//! Builders used by one module's tests only stay with that module (the scheduler's are in
//! `scheduler/fixtures.rs`).

use crate::call::{CallAccess, CallRecord, CallSpec, CallStarted, CallState, Filesystem, NewCall};

/// Call `id` as the store records it at admission: tool `t`, command `c`, release `t-1`
/// (digest `sha256:1`), in namespace `default`, with empty arguments and a default spec;
/// pending, never assigned, created at 0.
pub fn record(id: &str) -> CallRecord {
    CallRecord {
        id: id.into(),
        namespace: "default".into(),
        tool: "t".into(),
        command: "c".into(),
        release: "t-1".into(),
        release_digest: "sha256:1".into(),
        state: CallState::Pending,
        args: serde_json::json!({}),
        spec: CallSpec::default(),
        stdin: Vec::new(),
        idempotency_key: None,
        request_hash: String::new(),
        epoch: 0,
        worker: None,
        result: None,
        error: None,
        created_at_ms: 0,
        finished_at_ms: None,
    }
}

/// What a call acting for `agent` may use: its workspace as `filesystem`, nothing else.
pub fn access(agent: &str, filesystem: Filesystem) -> CallAccess {
    CallAccess {
        agent: Some(agent.into()),
        filesystem,
        ..CallAccess::default()
    }
}

/// `record` as the gateway admits it (its `call-started` entry from [`started`]), neither
/// assigned at admission nor checked for repeats.
pub fn new_call(record: &CallRecord) -> NewCall {
    NewCall {
        id: record.id.clone(),
        namespace: record.namespace.clone(),
        tool: record.tool.clone(),
        command: record.command.clone(),
        release: record.release.clone(),
        release_digest: record.release_digest.clone(),
        args: record.args.clone(),
        spec: record.spec.clone(),
        stdin: record.stdin.clone(),
        idempotency_key: record.idempotency_key.clone(),
        request_hash: record.request_hash.clone(),
        started: started(record),
        assign_to: None,
        repeat_window_ms: None,
        dry_run_result: None,
    }
}

/// The `call-started` entry of `record`, of release version `1.0.0`, with no middleware
/// decisions.
fn started(record: &CallRecord) -> CallStarted {
    CallStarted {
        namespace: record.namespace.clone(),
        tool: record.tool.clone(),
        command: record.command.clone(),
        release: record.release.clone(),
        version: "1.0.0".into(),
        digest: record.release_digest.clone(),
        args: record.args.clone(),
        argv: record.spec.argv.clone(),
        stdin_bytes: record.stdin.len() as u64,
        idempotency_key: record.idempotency_key.clone(),
        dry_run: record.spec.dry_run,
        middleware: Vec::new(),
    }
}
