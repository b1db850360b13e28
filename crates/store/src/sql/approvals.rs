//! Approvals and audit: deciding a call that awaits approval, and the audit log (each
//! ended call's record, written in the commit that ends it, and refused calls' records).

use super::SqlStore;
use super::codec::{json_text, parse_json};
use super::conn::{Conn, query};
use super::rows::{insert_entry, select_call};
use super::writer::Write;
use crate::{Approvals, AuditLog, StoreError};
use async_trait::async_trait;
use toolgrid_core::call::{
    ApprovalDecision, AuditFilter, AuditRecord, CallError, CallRecord, CallSpec, CallState, Ended,
    ErrorKind, OplogEntry, Outcome, now_ms,
};

/// Decides a call awaiting approval (see [`Approvals::decide_approval`]).
struct DecideApproval {
    call_id: String,
    decision: ApprovalDecision,
    error: Option<CallError>,
}

#[async_trait]
impl Write for DecideApproval {
    type Output = CallRecord;

    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<CallRecord, StoreError> {
        let DecideApproval {
            call_id,
            decision,
            error,
        } = self;
        // Only this decision records itself in the call's spec: a batch run again finds it.
        if again
            && let Some(existing) = select_call(conn, call_id).await?
            && existing.spec.chain.approved.as_ref() == Some(decision)
        {
            return Ok(existing);
        }
        decide(conn, call_id, decision, error.as_ref()).await
    }
}

/// Appends a refused call's audit record (see [`AuditLog::append_audit`]).
struct AppendAudit(AuditRecord);

#[async_trait]
impl Write for AppendAudit {
    type Output = ();

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(), StoreError> {
        write_audit(conn, &self.0.call_id, &self.0).await
    }
}

/// Decides a call awaiting approval, in the writer's transaction: the conditional update
/// (`state = 'awaiting-approval'`) is what lets only one of two concurrent decisions win,
/// across connections and replicas alike.
async fn decide(
    conn: &mut dyn Conn,
    call_id: &str,
    decision: &ApprovalDecision,
    error: Option<&CallError>,
) -> Result<CallRecord, StoreError> {
    let now = now_ms();
    let row = query("SELECT state, spec_json FROM calls WHERE id = $1")
        .bind(call_id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else {
        return Err(StoreError::NotFound(call_id.to_string()));
    };
    let state: String = row.try_get("state")?;
    let state = CallState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("call state {state:?}")))?;
    if state != CallState::AwaitingApproval {
        return Err(StoreError::NotAwaiting {
            call_id: call_id.to_string(),
            state,
        });
    }
    let mut spec: CallSpec = parse_json(&row.try_get::<String>("spec_json")?, "spec")?;
    spec.chain.approved = Some(decision.clone());
    let ended = (!decision.approved).then(|| {
        error.cloned().unwrap_or_else(|| {
            CallError::new(
                ErrorKind::Denied,
                format!("denied by {}: {}", decision.by, decision.reason),
            )
        })
    });
    if ended.is_none() {
        // The call's time to run starts now, not when it was admitted.
        spec.deadline_ms = now.saturating_add(spec.limits.timeout_ms as i64);
    }
    let (new_state, entries, error_json, finished) = match &ended {
        None => (CallState::Pending, 1_i64, None, None),
        Some(error) => (CallState::Failed, 2, Some(json_text(error)), Some(now)),
    };
    let updated = query(
        "UPDATE calls SET state = $2, spec_json = $3, next_seq = next_seq + $4, error_json = $5, \
         finished_at_ms = $6 WHERE id = $1 AND state = 'awaiting-approval' RETURNING next_seq, epoch",
    )
    .bind(call_id)
    .bind(new_state.as_str())
    .bind(json_text(&spec))
    .bind(entries)
    .bind(error_json)
    .bind(finished)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(updated) = updated else {
        // Decided meanwhile (another connection or replica): the first decision stands.
        let state = select_call(conn, call_id)
            .await?
            .map(|r| r.state)
            .ok_or_else(|| StoreError::NotFound(call_id.to_string()))?;
        return Err(StoreError::NotAwaiting {
            call_id: call_id.to_string(),
            state,
        });
    };
    let first = updated.try_get::<i64>("next_seq")? - entries;
    let epoch: i64 = updated.try_get("epoch")?;
    let approval = OplogEntry::Approval(decision.clone());
    insert_entry(conn, call_id, first, epoch, &approval, now).await?;
    if let Some(error) = ended {
        let outcome = OplogEntry::Outcome(Outcome {
            state: Ended::Failed,
            error: Some(error),
            run: None,
        });
        insert_entry(conn, call_id, first + 1, epoch, &outcome, now).await?;
    }
    let record = select_call(conn, call_id)
        .await?
        .ok_or_else(|| StoreError::NotFound(call_id.to_string()))?;
    if record.state.is_terminal() {
        // A denied call ends here: its audit record goes in the same commit.
        insert_audit(conn, &record).await?;
    }
    Ok(record)
}

/// Writes the audit record of `call`, which has just ended, in the transaction that ends
/// it ([`toolgrid_core::middleware::audit::record_of`], keyed by the call's id): a call gets one
/// record however often its end is written again. Every path that ends a call calls it.
pub(super) async fn insert_audit(conn: &mut dyn Conn, call: &CallRecord) -> Result<(), StoreError> {
    let at = call.finished_at_ms.unwrap_or_else(now_ms);
    let record = toolgrid_core::middleware::audit::record_of(call, at);
    write_audit(conn, &call.id, &record).await
}

/// Inserts one audit record under `seq_id` (a sortable unique id: the call's id, or a
/// fresh UUIDv7 for a refusal); an id already written is left as it is (append-only).
async fn write_audit(
    conn: &mut dyn Conn,
    seq_id: &str,
    record: &AuditRecord,
) -> Result<(), StoreError> {
    query(
        "INSERT INTO audit (seq_id, call_id, at_ms, namespace, agent, tool, outcome, record_json) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (seq_id) DO NOTHING",
    )
    .bind(seq_id)
    .bind(record.call_id.as_str())
    .bind(record.at_ms)
    .bind(record.namespace.as_str())
    .bind(record.agent.as_str())
    .bind(record.tool.as_str())
    .bind(record.outcome.as_str())
    .bind(json_text(record))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[async_trait]
impl Approvals for SqlStore {
    async fn decide_approval(
        &self,
        call_id: &str,
        decision: ApprovalDecision,
        error: Option<CallError>,
    ) -> Result<CallRecord, StoreError> {
        self.write(DecideApproval {
            call_id: call_id.into(),
            decision,
            error,
        })
        .await
    }
}

#[async_trait]
impl AuditLog for SqlStore {
    async fn append_audit(&self, record: AuditRecord) -> Result<(), StoreError> {
        self.write(AppendAudit(record)).await
    }

    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, StoreError> {
        let limit = if filter.limit == 0 {
            100
        } else {
            filter.limit.min(10_000)
        };
        let rows = query(
            "SELECT record_json FROM audit WHERE ($1 = '' OR namespace = $1) \
             AND ($2 = '' OR agent = $2) AND ($3 = '' OR tool = $3) AND at_ms >= $4 \
             ORDER BY at_ms DESC, seq_id DESC LIMIT $5",
        )
        .bind(filter.namespace.as_deref().unwrap_or(""))
        .bind(filter.agent.as_deref().unwrap_or(""))
        .bind(filter.tool.as_deref().unwrap_or(""))
        .bind(filter.since_ms.unwrap_or(i64::MIN))
        .bind(i64::from(limit))
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        rows.iter()
            .map(|row| parse_json(&row.try_get::<String>("record_json")?, "audit record"))
            .collect()
    }
}
