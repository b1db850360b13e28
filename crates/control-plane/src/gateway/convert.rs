//! Call records and oplog entries as HTTP returns them (JSON); gRPC's are
//! `toolgrid_proto::convert`'s.

use serde_json::{Value, json};
use toolgrid_core::call::{CallRecord, OplogRecord};

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
    if let Some(approval) = record.approval_json() {
        call["approval"] = approval;
    }
    call
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
