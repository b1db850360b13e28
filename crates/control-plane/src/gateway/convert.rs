//! Call records as the front doors return them: protobuf for gRPC, JSON for HTTP.

use serde_json::{Value, json};
use toolgrid_proto as proto;
use toolgrid_store::{CallRecord, CallState, OplogRecord};

pub fn state_to_proto(state: CallState) -> proto::CallState {
    match state {
        CallState::AwaitingApproval => proto::CallState::AwaitingApproval,
        CallState::Pending => proto::CallState::Pending,
        CallState::Running => proto::CallState::Running,
        CallState::Succeeded => proto::CallState::Succeeded,
        CallState::Failed => proto::CallState::Failed,
    }
}

pub fn call_to_proto(record: &CallRecord, deduplicated: bool) -> proto::Call {
    proto::Call {
        id: record.id.clone(),
        namespace: record.namespace.clone(),
        tool: record.tool.clone(),
        command: record.command.clone(),
        release: record.release.clone(),
        release_digest: record.release_digest.clone(),
        state: state_to_proto(record.state) as i32,
        result_json: record
            .result
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default(),
        error: record.error.as_ref().map(|e| proto::CallError {
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
        approval_json: approval_json(record)
            .map(|v| v.to_string())
            .unwrap_or_default(),
    }
}

/// The approval a call waits for or waited for, and its decision.
fn approval_json(record: &CallRecord) -> Option<Value> {
    let chain = &record.spec.chain;
    let wait = chain.approval.as_ref()?;
    Some(json!({"wait": wait, "decision": chain.approved}))
}

pub fn call_to_json(record: &CallRecord, deduplicated: bool) -> Value {
    let mut call = json!({
        "id": record.id,
        "namespace": record.namespace,
        "tool": record.tool,
        "command": record.command,
        "release": record.release,
        "releaseDigest": record.release_digest,
        "state": record.state.as_str(),
        "args": record.args,
        "createdAtMs": record.created_at_ms,
        "epoch": record.epoch,
        "deduplicated": deduplicated,
        "agent": record.spec.access.agent,
    });
    if let Some(result) = &record.result {
        call["result"] = result.clone();
    }
    if let Some(error) = &record.error {
        call["error"] = serde_json::to_value(error).unwrap_or_default();
    }
    if let Some(key) = &record.idempotency_key {
        call["idempotencyKey"] = json!(key);
    }
    if let Some(finished) = record.finished_at_ms {
        call["finishedAtMs"] = json!(finished);
        call["durationMs"] = json!(finished - record.created_at_ms);
    }
    if let Some(worker) = &record.worker {
        call["worker"] = json!(worker);
    }
    if record.spec.dry_run {
        call["dryRun"] = json!(true);
    }
    if !record.spec.chain.decisions.is_empty() {
        call["middleware"] = json!(record.spec.chain.decisions);
    }
    if let Some(approval) = approval_json(record) {
        call["approval"] = approval;
    }
    call
}

pub fn oplog_to_proto(entry: &OplogRecord) -> proto::OplogRecord {
    proto::OplogRecord {
        seq: entry.seq,
        epoch: entry.epoch,
        kind: entry.kind.clone(),
        payload_json: entry.payload.clone(),
        recorded_at_ms: entry.recorded_at_ms,
    }
}

/// An oplog entry for HTTP: its payload as JSON (or as the stored text, for a corrupted one).
pub fn oplog_to_json(entry: &OplogRecord) -> Value {
    json!({
        "seq": entry.seq,
        "epoch": entry.epoch,
        "kind": entry.kind,
        "payload": entry.payload_json(),
        "recordedAtMs": entry.recorded_at_ms,
    })
}
