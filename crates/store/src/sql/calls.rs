//! Calls and their oplogs: admission, assignment and fencing, appends, ends (completion,
//! failure, cancellation), and the reads of calls and entries.

use super::SqlStore;
use super::approvals::insert_audit;
use super::codec::{is_postgres, json_text, parse_json};
use super::commands::{self, StoredCommand};
use super::conn::{Conn, Row, query};
use super::rows::{EntryRow, call_columns, call_from_row, insert_entry, insert_rows, select_call};
use super::workspaces::{commit_refusal, commit_version, pin_workspace_base};
use super::writer::Write;
use crate::{CallLog, Durable, StoreError};
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Arc;
use toolgrid_core::call::{
    Assigned, CallError, CallFilter, CallRecord, CallSpec, CallState, Created, Ended, EntryKind,
    ErrorKind, Fenced, Lifecycle, NewCall, OplogEntry, OplogRecord, Outcome, now_ms,
};
use toolgrid_core::completion::CallOutcome;

/// Records a new call (see [`CallLog::create_call`]). Its JSON columns are serialized
/// before it is queued, so the writer's thread (the one every write waits on) does not.
struct CreateCall {
    call: Arc<NewCall>,
    args_json: String,
    /// The spec without its command's definition, which is `command`.
    spec_json: String,
    command: Option<StoredCommand>,
}

impl CreateCall {
    fn new(mut call: NewCall) -> Self {
        let (spec_json, command) = commands::split(&mut call.spec);
        CreateCall {
            args_json: json_text(&call.args),
            spec_json,
            command,
            call: Arc::new(call),
        }
    }
}

/// What recording a new call did: inserted it (the record is built from the call by
/// [`Admission::into_created`], off the writer's thread), or found its answer stored.
enum Admission {
    Inserted(Inserted),
    Stored(Box<Created>),
}

/// The columns an insert set that the new call does not carry itself.
struct Inserted {
    state: CallState,
    epoch: u64,
    worker: Option<String>,
    created_at_ms: i64,
    finished_at_ms: Option<i64>,
}

impl Inserted {
    /// The record of `call` as inserted.
    fn record(self, call: NewCall) -> CallRecord {
        CallRecord {
            id: call.id,
            namespace: call.namespace,
            tool: call.tool,
            command: call.command,
            release: call.release,
            release_digest: call.release_digest,
            state: self.state,
            args: call.args,
            spec: call.spec,
            stdin: call.stdin,
            idempotency_key: call.idempotency_key,
            request_hash: call.request_hash,
            epoch: self.epoch,
            worker: self.worker,
            result: call.dry_run_result,
            error: None,
            created_at_ms: self.created_at_ms,
            finished_at_ms: self.finished_at_ms,
        }
    }
}

impl Admission {
    /// The answer's record, built from `call`: the caller's alone by now (the writer drops
    /// a write at its commit, before answering it), so it is moved, not copied.
    fn into_created(self, call: Arc<NewCall>) -> Created {
        match self {
            Admission::Inserted(inserted) => Created::New(
                inserted.record(Arc::try_unwrap(call).unwrap_or_else(|call| (*call).clone())),
            ),
            Admission::Stored(created) => *created,
        }
    }
}

#[async_trait]
impl Write for CreateCall {
    type Output = Admission;

    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<Admission, StoreError> {
        let call = &self.call;
        if again
            && let Some(existing) = select_call(conn, &call.id).await?
            && existing.request_hash == call.request_hash
        {
            return Ok(Admission::Stored(Box::new(Created::New(existing))));
        }
        create(
            conn,
            call,
            &self.args_json,
            &self.spec_json,
            self.command.as_ref(),
        )
        .await
    }
}

/// Assigns a call to a worker (see [`CallLog::assign_call`]).
struct AssignCall {
    call_id: String,
    worker: String,
}

#[async_trait]
impl Write for AssignCall {
    type Output = u64;

    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<u64, StoreError> {
        let AssignCall { call_id, worker } = self;
        if again && let Some(epoch) = committed_assignment(conn, call_id, worker).await? {
            return Ok(epoch);
        }
        assign(conn, call_id, worker).await
    }
}

/// Takes a running call back from its worker (see [`CallLog::fence_call`]).
struct FenceCall {
    call_id: String,
    epoch: u64,
    reason: String,
}

#[async_trait]
impl Write for FenceCall {
    type Output = u64;

    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<u64, StoreError> {
        let FenceCall {
            call_id,
            epoch,
            reason,
        } = self;
        match fence(conn, call_id, *epoch, reason).await {
            Err(StoreError::StaleEpoch { current, state, .. })
                if again && current == epoch + 1 && state == CallState::Pending =>
            {
                // Only this fence moves a running call at `epoch` to pending at `epoch + 1`.
                Ok(current)
            }
            other => other,
        }
    }
}

/// Appends entries under an epoch (see [`CallLog::append_oplog`]).
struct AppendOplog {
    call_id: String,
    epoch: u64,
    first_wseq: u64,
    entries: Vec<OplogEntry>,
}

#[async_trait]
impl Write for AppendOplog {
    type Output = ();

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(), StoreError> {
        let AppendOplog {
            call_id,
            epoch,
            first_wseq,
            entries,
        } = self;
        // The fencing update matches no row for an append already stored (the same
        // call, epoch and wseq: a batch run again, or a repeat); only then is it asked why.
        match reserve_and_insert(conn, call_id, *epoch, *first_wseq, entries, None).await {
            Ok(_) => Ok(()),
            Err(StoreError::StaleEpoch { .. })
                if !entries.is_empty()
                    && wseq_stored(conn, call_id, *epoch, *first_wseq).await? =>
            {
                Ok(())
            }
            Err(error) => Err(error),
        }
    }
}

/// Ends a call under its epoch with its last entries (see [`CallLog::complete_call`]).
struct CompleteCall {
    call_id: String,
    epoch: u64,
    first_wseq: u64,
    entries: Vec<OplogEntry>,
    outcome: CallOutcome,
}

#[async_trait]
impl Write for CompleteCall {
    type Output = CallRecord;

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<CallRecord, StoreError> {
        let CompleteCall {
            call_id,
            epoch,
            first_wseq,
            entries,
            outcome,
        } = self;
        // A succeeded call's workspace goes in with its end, or the call fails instead.
        let mut judged;
        let mut outcome = outcome;
        let mut commit = None;
        if outcome.result.is_ok()
            && let Some(workspace) = &outcome.workspace
        {
            match commit_refusal(conn, call_id, *epoch, workspace).await? {
                Some(error) => {
                    judged = outcome.clone();
                    judged.result = Err(error);
                    judged.workspace = None;
                    outcome = &judged;
                }
                None => commit = Some(workspace),
            }
        }
        match reserve_and_insert(conn, call_id, *epoch, *first_wseq, entries, Some(outcome)).await {
            Ok(record) => {
                let record = record.ok_or_else(|| StoreError::NotFound(call_id.clone()))?;
                if let Some(commit) = commit {
                    commit_version(conn, call_id, commit).await?;
                }
                insert_audit(conn, &record).await?;
                Ok(record)
            }
            Err(StoreError::StaleEpoch {
                call_id: id,
                epoch: stale,
                current,
                state,
            }) => match select_call(conn, call_id).await? {
                Some(record) if ended_by(&record, *epoch, outcome) => Ok(record),
                _ => Err(StoreError::StaleEpoch {
                    call_id: id,
                    epoch: stale,
                    current,
                    state,
                }),
            },
            Err(error) => Err(error),
        }
    }
}

/// Ends a call whatever its epoch (see [`CallLog::fail_call`]).
struct FailCall {
    call_id: String,
    error: CallError,
}

#[async_trait]
impl Write for FailCall {
    type Output = CallRecord;

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<CallRecord, StoreError> {
        fail(conn, &self.call_id, &self.error).await
    }
}

/// Cancels a call not yet ended (see [`CallLog::cancel_call`]).
struct CancelCall {
    call_id: String,
    reason: String,
}

#[async_trait]
impl Write for CancelCall {
    type Output = CallRecord;

    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<CallRecord, StoreError> {
        let CancelCall { call_id, reason } = self;
        match cancel(conn, call_id, reason).await {
            // A batch run again finds the call ended by this very cancel.
            Err(StoreError::Ended { .. }) if again => select_call(conn, call_id)
                .await?
                .ok_or_else(|| StoreError::NotFound(call_id.clone())),
            other => other,
        }
    }
}

/// Serialises, across replicas, the admissions of one agent's identical calls (PostgreSQL;
/// on SQLite the write transaction already does), so that of two racing identical calls
/// one sees the other.
async fn lock_request(
    conn: &mut dyn Conn,
    namespace: &str,
    agent: &str,
    request_hash: &str,
) -> Result<(), StoreError> {
    if !is_postgres(conn) {
        return Ok(());
    }
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(format!("repeat\0{namespace}\0{agent}\0{request_hash}"));
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    query("SELECT 1 FROM (SELECT pg_advisory_xact_lock($1)) AS repeat_lock")
        .bind(i64::from_be_bytes(first))
        .fetch_one(&mut *conn)
        .await?;
    Ok(())
}

/// The agent's newest call with `request_hash` created at or after `since_ms`.
async fn select_repeat(
    conn: &mut dyn Conn,
    namespace: &str,
    agent: &str,
    request_hash: &str,
    since_ms: i64,
) -> Result<Option<CallRecord>, StoreError> {
    let row = query(concat!(
        "SELECT ",
        call_columns!(),
        " FROM calls WHERE agent <> '' AND namespace = $1 AND agent = $2 AND request_hash = $3 \
         AND created_at_ms >= $4 ORDER BY created_at_ms DESC, id DESC LIMIT 1"
    ))
    .bind(namespace)
    .bind(agent)
    .bind(request_hash)
    .bind(since_ms)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| call_from_row(&r)).transpose()
}

/// Whether an append numbered from `first_wseq` under (call, epoch) is already stored.
async fn wseq_stored(
    conn: &mut dyn Conn,
    call_id: &str,
    epoch: u64,
    first_wseq: u64,
) -> Result<bool, StoreError> {
    let row =
        query("SELECT 1 AS stored FROM oplog WHERE call_id = $1 AND epoch = $2 AND wseq = $3")
            .bind(call_id)
            .bind(epoch as i64)
            .bind(first_wseq as i64)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(row.is_some())
}

/// Whether `record` was ended under `epoch` with `outcome` (a repeated completion).
fn ended_by(record: &CallRecord, epoch: u64, outcome: &CallOutcome) -> bool {
    record.epoch == epoch
        && match &outcome.result {
            Ok(value) => {
                record.state == CallState::Succeeded && record.result.as_ref() == Some(value)
            }
            Err(error) => record.state == CallState::Failed && record.error.as_ref() == Some(error),
        }
}

/// The epoch of an assignment of the call to `worker` that is the call's last entry, i.e.
/// one that committed in an attempt whose outcome was unknown.
async fn committed_assignment(
    conn: &mut dyn Conn,
    call_id: &str,
    worker: &str,
) -> Result<Option<u64>, StoreError> {
    let row = query(
        "SELECT c.epoch AS epoch FROM calls c JOIN oplog o ON o.call_id = c.id AND o.seq = c.next_seq - 1 \
         WHERE c.id = $1 AND c.state = 'running' AND c.worker = $2 AND o.kind = 'assigned' AND o.epoch = c.epoch",
    )
    .bind(call_id)
    .bind(worker)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row
        .map(|r| r.try_get::<i64>("epoch"))
        .transpose()?
        .map(|e| e as u64))
}

async fn create(
    conn: &mut dyn Conn,
    call: &NewCall,
    args_json: &str,
    spec_json: &str,
    command: Option<&StoredCommand>,
) -> Result<Admission, StoreError> {
    let now = now_ms();
    // The idempotency scope and the listing filter of agents; '' for an operator's call.
    let agent = call.spec.access.agent.as_deref().unwrap_or("");
    if let Some(window) = call.repeat_window_ms {
        // The same key returns the earlier call before any repeat is looked for.
        if let Some(key) = &call.idempotency_key
            && let Some(existing) = select_by_key(conn, &call.namespace, agent, key).await?
        {
            return same_key(call, existing).map(|created| Admission::Stored(Box::new(created)));
        }
        lock_request(conn, &call.namespace, agent, &call.request_hash).await?;
        if let Some(earlier) = select_repeat(
            conn,
            &call.namespace,
            agent,
            &call.request_hash,
            now.saturating_sub(window.max(0)),
        )
        .await?
        {
            return Ok(Admission::Stored(Box::new(Created::Repeated(earlier))));
        }
    }
    // A dry run that does not run is recorded ended: never assigned, no worker, epoch 0.
    let dry_run = call.dry_run_result.as_ref();
    // Admission and assignment in one commit when the scheduler reserved a slot: the first
    // assignment, as `assign` makes it.
    let assignment = match (&call.assign_to, dry_run) {
        (Some(worker), None) => Some(
            Lifecycle::admitted()
                .assign(worker)
                .map_err(|refusal| StoreError::Corrupt(refusal.to_string()))?,
        ),
        _ => None,
    };
    let lifecycle = assignment
        .as_ref()
        .map(|(l, _)| l.clone())
        .unwrap_or_else(Lifecycle::admitted);
    let next_seq: i64 = if assignment.is_some() || dry_run.is_some() {
        2
    } else {
        1
    };
    // A call held by an approval step waits, unassigned, until it is decided; a dry run
    // answered without running never waits.
    let awaiting = call.spec.chain.approval.is_some() && dry_run.is_none();
    if awaiting && assignment.is_some() {
        return Err(StoreError::Corrupt(format!(
            "call {} awaits approval and cannot be assigned at admission",
            call.id
        )));
    }
    let state = match dry_run {
        Some(_) => CallState::Succeeded,
        None if awaiting => CallState::AwaitingApproval,
        None => lifecycle.state,
    };
    if let Some(command) = command {
        commands::store(conn, &call.release_digest, command).await?;
    }
    let inserted = query(
        "INSERT INTO calls (id, namespace, tool, command, release, release_digest, state, args_json, \
         spec_json, stdin, idempotency_key, request_hash, epoch, worker, next_seq, result_json, \
         error_json, created_at_ms, finished_at_ms, agent, command_digest) \
         VALUES ($1, $2, $3, $4, $5, $6, $13, $7, $8, $9, $10, $11, $14, $15, $16, $18, NULL, $12, $19, $17, $20) \
         ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(call.id.as_str())
    .bind(call.namespace.as_str())
    .bind(call.tool.as_str())
    .bind(call.command.as_str())
    .bind(call.release.as_str())
    .bind(call.release_digest.as_str())
    .bind(args_json)
    .bind(spec_json)
    .bind(call.stdin.as_slice())
    .bind(call.idempotency_key.as_deref())
    .bind(call.request_hash.as_str())
    .bind(now)
    .bind(state.as_str())
    .bind(lifecycle.epoch as i64)
    .bind(lifecycle.worker.as_deref())
    .bind(next_seq)
    .bind(agent)
    .bind(dry_run.map(Value::to_string))
    .bind(dry_run.map(|_| now))
    .bind(command.map(|c| c.digest.as_str()))
    .fetch_optional(&mut *conn)
    .await?;
    if inserted.is_none() {
        let key = call.idempotency_key.clone().unwrap_or_default();
        let existing = select_by_key(conn, &call.namespace, agent, &key)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("call {} exists twice", call.id)))?;
        return same_key(call, existing).map(|created| Admission::Stored(Box::new(created)));
    }
    // The call's first entries go in with one statement.
    let started = OplogEntry::CallStarted(call.started.clone());
    let mut rows = vec![EntryRow::of(0, 0, &started)];
    if dry_run.is_some() {
        // Ended by the control plane, so no run summary (as for a call it fails).
        let outcome = OplogEntry::Outcome(Outcome {
            state: Ended::Succeeded,
            error: None,
            run: None,
        });
        rows.push(EntryRow::of(1, 0, &outcome));
    }
    if let Some((lifecycle, assigned)) = &assignment {
        let base = pin_workspace_base(conn, &call.id, &call.namespace, &call.spec).await?;
        let mut assigned = assigned.clone();
        if let OplogEntry::Assigned(entry) = &mut assigned {
            entry.workspace_version = base;
        }
        rows.push(EntryRow::of(1, lifecycle.epoch as i64, &assigned));
    }
    insert_rows(conn, &call.id, &rows, now).await?;
    let inserted = Inserted {
        state,
        epoch: lifecycle.epoch,
        worker: lifecycle.worker,
        created_at_ms: now,
        finished_at_ms: dry_run.map(|_| now),
    };
    if state.is_terminal() {
        // A dry run answered without running ends here: its audit record too.
        let record = inserted.record(call.clone());
        insert_audit(conn, &record).await?;
        return Ok(Admission::Stored(Box::new(Created::New(record))));
    }
    Ok(Admission::Inserted(inserted))
}

/// The answer to a call whose idempotency key `existing` already used: that call, or a
/// conflict when the requests differ.
fn same_key(call: &NewCall, existing: CallRecord) -> Result<Created, StoreError> {
    if existing.request_hash != call.request_hash {
        return Err(StoreError::IdempotencyConflict {
            key: call.idempotency_key.clone().unwrap_or_default(),
            existing: existing.id,
        });
    }
    Ok(Created::Existing(existing))
}

async fn assign(conn: &mut dyn Conn, call_id: &str, worker: &str) -> Result<u64, StoreError> {
    let row = query(
        "UPDATE calls SET epoch = epoch + 1, worker = $2, state = 'running', next_seq = next_seq + 1 \
         WHERE id = $1 AND state IN ('pending', 'running') \
         RETURNING epoch, next_seq, namespace, spec_json, workspace_base",
    )
    .bind(call_id)
    .bind(worker)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Err(refusal(conn, call_id, 0).await);
    };
    let epoch: i64 = row.try_get("epoch")?;
    let next_seq: i64 = row.try_get("next_seq")?;
    let workspace_version = match row.try_get::<Option<i64>>("workspace_base")? {
        Some(base) => Some(base as u64),
        None => {
            let namespace: String = row.try_get("namespace")?;
            let spec: CallSpec = parse_json(&row.try_get::<String>("spec_json")?, "spec")?;
            pin_workspace_base(conn, call_id, &namespace, &spec).await?
        }
    };
    let entry = OplogEntry::Assigned(Assigned {
        worker: worker.to_string(),
        epoch: epoch as u64,
        workspace_version,
    });
    insert_entry(conn, call_id, next_seq - 1, epoch, &entry, now_ms()).await?;
    Ok(epoch as u64)
}

async fn fence(
    conn: &mut dyn Conn,
    call_id: &str,
    epoch: u64,
    reason: &str,
) -> Result<u64, StoreError> {
    let row = query(
        "UPDATE calls SET epoch = epoch + 1, worker = NULL, state = 'pending', next_seq = next_seq + 1 \
         WHERE id = $1 AND epoch = $2 AND state = 'running' RETURNING epoch, next_seq",
    )
    .bind(call_id)
    .bind(epoch as i64)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Err(refusal(conn, call_id, epoch).await);
    };
    let new_epoch: i64 = row.try_get("epoch")?;
    let next_seq: i64 = row.try_get("next_seq")?;
    let entry = OplogEntry::Fenced(Fenced {
        reason: reason.to_string(),
        previous_epoch: epoch,
    });
    insert_entry(conn, call_id, next_seq - 1, new_epoch, &entry, now_ms()).await?;
    Ok(new_epoch as u64)
}

/// Reserves sequence numbers under the caller's epoch (the conditional update is the fence)
/// and writes `entries`, then the outcome when there is one (returning the ended call).
async fn reserve_and_insert(
    conn: &mut dyn Conn,
    call_id: &str,
    epoch: u64,
    first_wseq: u64,
    entries: &[OplogEntry],
    outcome: Option<&CallOutcome>,
) -> Result<Option<CallRecord>, StoreError> {
    let count = entries.len() as i64 + i64::from(outcome.is_some());
    let now = now_ms();
    let row = match outcome {
        None => {
            // No entries carry wseq -1: an empty append never counts as already stored.
            let wseq = if entries.is_empty() {
                -1
            } else {
                first_wseq as i64
            };
            query(
                "UPDATE calls SET next_seq = next_seq + $3 \
                 WHERE id = $1 AND epoch = $2 AND state = 'running' \
                 AND NOT EXISTS (SELECT 1 FROM oplog WHERE call_id = $1 AND epoch = $2 AND wseq = $4) \
                 RETURNING next_seq",
            )
            .bind(call_id)
            .bind(epoch as i64)
            .bind(count)
            .bind(wseq)
            .fetch_optional(&mut *conn)
            .await?
        }
        Some(outcome) => {
            let (state, result, error) = match &outcome.result {
                Ok(value) => (CallState::Succeeded, Some(value.to_string()), None),
                Err(error) => (CallState::Failed, None, Some(json_text(error))),
            };
            query(concat!(
                "UPDATE calls SET next_seq = next_seq + $3, state = $4, result_json = $5, error_json = $6, \
                 finished_at_ms = $7 WHERE id = $1 AND epoch = $2 AND state = 'running' RETURNING next_seq, ",
                call_columns!()
            ))
            .bind(call_id)
            .bind(epoch as i64)
            .bind(count)
            .bind(state.as_str())
            .bind(result)
            .bind(error)
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?
        }
    };
    let Some(row) = row else {
        return Err(refusal(conn, call_id, epoch).await);
    };
    let first = row.try_get::<i64>("next_seq")? - count;
    let epoch = epoch as i64;
    let mut rows: Vec<EntryRow> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let (kind, payload) = e.to_parts();
            EntryRow {
                seq: first + i as i64,
                epoch,
                kind,
                payload,
                wseq: Some((first_wseq + i as u64) as i64),
            }
        })
        .collect();
    if let Some(outcome) = outcome {
        let (state, ended) = match &outcome.result {
            Ok(_) => (Ended::Succeeded, None),
            Err(error) => (Ended::Failed, Some(error.clone())),
        };
        let entry = OplogEntry::Outcome(Outcome {
            state,
            error: ended,
            run: Some(outcome.run.clone()),
        });
        rows.push(EntryRow::of(first + entries.len() as i64, epoch, &entry));
    }
    insert_rows(conn, call_id, &rows, now).await?;
    match outcome {
        Some(_) => Ok(Some(call_from_row(&row)?)),
        None => Ok(None),
    }
}

async fn fail(
    conn: &mut dyn Conn,
    call_id: &str,
    error: &CallError,
) -> Result<CallRecord, StoreError> {
    let now = now_ms();
    let row = query(
        "UPDATE calls SET next_seq = next_seq + 1, state = 'failed', error_json = $2, finished_at_ms = $3 \
         WHERE id = $1 AND state IN ('awaiting-approval', 'pending', 'running') RETURNING next_seq, epoch",
    )
    .bind(call_id)
    .bind(json_text(error))
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = row {
        let seq: i64 = row.try_get::<i64>("next_seq")? - 1;
        let epoch: i64 = row.try_get("epoch")?;
        let entry = OplogEntry::Outcome(Outcome {
            state: Ended::Failed,
            error: Some(error.clone()),
            run: None,
        });
        insert_entry(conn, call_id, seq, epoch, &entry, now).await?;
        let ended = select_call(conn, call_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(call_id.to_string()))?;
        insert_audit(conn, &ended).await?;
        return Ok(ended);
    }
    select_call(conn, call_id)
        .await?
        .ok_or_else(|| StoreError::NotFound(call_id.to_string()))
}

/// Cancels a call in the writer's transaction: its requests are counted and it is ended
/// in the same transaction, so no append of its worker falls between the two.
async fn cancel(
    conn: &mut dyn Conn,
    call_id: &str,
    reason: &str,
) -> Result<CallRecord, StoreError> {
    let Some(call) = select_call(conn, call_id).await? else {
        return Err(StoreError::NotFound(call_id.to_string()));
    };
    if call.state.is_terminal() {
        return Err(StoreError::Ended {
            call_id: call_id.to_string(),
            state: call.state,
        });
    }
    let row = query("SELECT COUNT(*) AS n FROM oplog WHERE call_id = $1 AND kind = $2")
        .bind(call_id)
        .bind(EntryKind::HttpRequest.as_str())
        .fetch_one(&mut *conn)
        .await?;
    let requests: i64 = row.try_get("n")?;
    let error = toolgrid_core::call::stopped_error(
        ErrorKind::Cancelled,
        reason,
        call.spec.effect,
        requests.max(0) as u64,
    );
    fail(conn, call_id, &error).await
}

/// Explains why a fenced update matched no row.
async fn refusal(conn: &mut dyn Conn, call_id: &str, epoch: u64) -> StoreError {
    let row = query("SELECT epoch, state FROM calls WHERE id = $1")
        .bind(call_id)
        .fetch_optional(&mut *conn)
        .await;
    match row {
        Ok(Some(row)) => StoreError::StaleEpoch {
            call_id: call_id.to_string(),
            epoch,
            current: row.try_get::<i64>("epoch").unwrap_or_default() as u64,
            state: row
                .try_get::<String>("state")
                .ok()
                .and_then(|s| CallState::parse(&s))
                .unwrap_or(CallState::Failed),
        },
        Ok(None) => StoreError::NotFound(call_id.to_string()),
        Err(error) => error,
    }
}

async fn select_by_key(
    conn: &mut dyn Conn,
    namespace: &str,
    agent: &str,
    key: &str,
) -> Result<Option<CallRecord>, StoreError> {
    let row = query(concat!(
        "SELECT ",
        call_columns!(),
        " FROM calls WHERE namespace = $1 AND agent = $2 AND idempotency_key = $3"
    ))
    .bind(namespace)
    .bind(agent)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| call_from_row(&r)).transpose()
}

#[async_trait]
impl CallLog for SqlStore {
    async fn create_call(&self, call: NewCall) -> Result<Created, StoreError> {
        let write = CreateCall::new(call);
        let call = write.call.clone();
        let admission = self.write(write).await?;
        Ok(admission.into_created(call))
    }

    async fn create_call_applied(&self, call: NewCall) -> Result<(Created, Durable), StoreError> {
        let write = CreateCall::new(call);
        let call = write.call.clone();
        let (admission, durable) = self.write_applied(write).await?;
        Ok((admission.into_created(call), durable))
    }

    async fn assign_call(&self, call_id: &str, worker: &str) -> Result<u64, StoreError> {
        self.write(AssignCall {
            call_id: call_id.into(),
            worker: worker.into(),
        })
        .await
    }

    async fn assign_call_applied(
        &self,
        call_id: &str,
        worker: &str,
    ) -> Result<(u64, Durable), StoreError> {
        self.write_applied(AssignCall {
            call_id: call_id.into(),
            worker: worker.into(),
        })
        .await
    }

    async fn fence_call(&self, call_id: &str, epoch: u64, reason: &str) -> Result<u64, StoreError> {
        self.write(FenceCall {
            call_id: call_id.into(),
            epoch,
            reason: reason.into(),
        })
        .await
    }

    async fn append_oplog(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
    ) -> Result<(), StoreError> {
        self.write(AppendOplog {
            call_id: call_id.into(),
            epoch,
            first_wseq,
            entries,
        })
        .await
    }

    async fn complete_call(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
        outcome: CallOutcome,
    ) -> Result<CallRecord, StoreError> {
        self.write(CompleteCall {
            call_id: call_id.into(),
            epoch,
            first_wseq,
            entries,
            outcome,
        })
        .await
    }

    async fn fail_call(&self, call_id: &str, error: CallError) -> Result<CallRecord, StoreError> {
        self.write(FailCall {
            call_id: call_id.into(),
            error,
        })
        .await
    }

    async fn cancel_call(&self, call_id: &str, reason: &str) -> Result<CallRecord, StoreError> {
        self.write(CancelCall {
            call_id: call_id.into(),
            reason: reason.into(),
        })
        .await
    }

    async fn get_call(&self, id: &str) -> Result<Option<CallRecord>, StoreError> {
        let mut conn = self.reads.acquire().await?;
        select_call(&mut *conn, id).await
    }

    async fn find_call_by_key(
        &self,
        namespace: &str,
        agent: &str,
        key: &str,
    ) -> Result<Option<CallRecord>, StoreError> {
        let mut conn = self.reads.acquire().await?;
        select_by_key(&mut *conn, namespace, agent, key).await
    }

    async fn list_calls(&self, filter: &CallFilter) -> Result<Vec<CallRecord>, StoreError> {
        let limit = if filter.limit == 0 {
            50
        } else {
            filter.limit.min(10_000)
        };
        let unfinished = filter.state.is_some_and(|state| !state.is_terminal());
        let rows = query(if unfinished { LIST_UNFINISHED } else { LIST })
            .bind(filter.namespace.as_deref().unwrap_or(""))
            .bind(filter.tool.as_deref().unwrap_or(""))
            .bind(i64::from(limit))
            .bind(filter.agent.as_deref().unwrap_or(""))
            .bind(filter.state.map(CallState::as_str).unwrap_or(""))
            .fetch_all(&mut *self.reads.acquire().await?)
            .await?;
        rows.iter().map(call_from_row).collect()
    }

    async fn unfinished_calls(&self) -> Result<Vec<CallRecord>, StoreError> {
        let rows = query(UNFINISHED)
            .fetch_all(&mut *self.reads.acquire().await?)
            .await?;
        rows.iter().map(call_from_row).collect()
    }

    async fn oplog(&self, call_id: &str) -> Result<Vec<OplogRecord>, StoreError> {
        let rows = query(
            "SELECT seq, epoch, kind, payload, recorded_at_ms FROM oplog WHERE call_id = $1 ORDER BY seq",
        )
        .bind(call_id)
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        rows.iter().map(oplog_from_row).collect()
    }

    async fn oplog_page(
        &self,
        call_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<OplogRecord>, StoreError> {
        let limit = limit.min(crate::MAX_OPLOG_PAGE_ENTRIES);
        // Past any seq the store holds (seqs are i64 in SQL): nothing.
        let Ok(from_seq) = i64::try_from(from_seq) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = query(
            "SELECT seq, epoch, kind, payload, recorded_at_ms FROM oplog \
             WHERE call_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        )
        .bind(call_id)
        .bind(from_seq)
        .bind(i64::from(limit))
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        rows.iter().map(oplog_from_row).collect()
    }
}

fn oplog_from_row(row: &Row) -> Result<OplogRecord, StoreError> {
    Ok(OplogRecord {
        seq: row.try_get::<i64>("seq")? as u64,
        epoch: row.try_get::<i64>("epoch")? as u64,
        kind: row.try_get("kind")?,
        payload: row.try_get("payload")?,
        recorded_at_ms: row.try_get("recorded_at_ms")?,
    })
}

/// The calls pending or running, oldest first (a control plane recovers them at start).
const UNFINISHED: &str = concat!(
    "SELECT ",
    call_columns!(),
    " FROM calls WHERE finished_at_ms IS NULL AND state IN ('pending', 'running') \
     ORDER BY created_at_ms, id"
);

/// The newest calls, each filter (`$1` namespace, `$2` tool, `$4` agent, `$5` state) left
/// out when empty; `$3` the limit. It walks `calls_by_time` from the newest call, which a
/// page of a busy listing ends soon.
const LIST: &str = concat!(
    "SELECT ",
    call_columns!(),
    " FROM calls WHERE ($1 = '' OR namespace = $1) AND ($2 = '' OR tool = $2) \
     AND ($4 = '' OR agent = $4) AND ($5 = '' OR state = $5) \
     ORDER BY created_at_ms DESC, id DESC LIMIT $3"
);

/// [`LIST`] for a state a call has not ended in (`$5`, not empty): it reads
/// `calls_unfinished`, the few calls not ended, not every call (the approval timer lists the
/// calls awaiting approval every 30 s: through [`LIST`] that read the whole table, a second
/// at half a million calls).
const LIST_UNFINISHED: &str = concat!(
    "SELECT ",
    call_columns!(),
    " FROM calls WHERE finished_at_ms IS NULL AND state = $5 \
     AND ($1 = '' OR namespace = $1) AND ($2 = '' OR tool = $2) AND ($4 = '' OR agent = $4) \
     ORDER BY created_at_ms DESC, id DESC LIMIT $3"
);

#[cfg(test)]
mod tests {
    use super::{LIST, LIST_UNFINISHED, UNFINISHED};
    use crate::SqlStore;

    /// How SQLite runs `sql` on the store's schema: the plan's steps.
    fn plan(path: &std::path::Path, sql: &str) -> String {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let unbound = std::iter::repeat_n(rusqlite::types::Null, statement.parameter_count());
        let steps: Vec<String> = statement
            .query_map(rusqlite::params_from_iter(unbound), |row| {
                row.get::<_, String>(3)
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        steps.join("; ")
    }

    #[tokio::test]
    async fn the_calls_not_ended_are_found_without_reading_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plan.db");
        let store = SqlStore::open(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        drop(store);
        // The approval timer's listing and the recovery at start search the index of the
        // calls not ended; a listing of every call walks the calls by time from the newest.
        for (sql, expected) in [
            (
                LIST_UNFINISHED,
                "SEARCH calls USING INDEX calls_unfinished (state=?)",
            ),
            (
                UNFINISHED,
                "SEARCH calls USING INDEX calls_unfinished (state=?)",
            ),
            (LIST, "SCAN calls USING INDEX calls_by_time"),
        ] {
            let plan = plan(&path, sql);
            assert!(plan.contains(expected), "{sql}\n{plan}");
        }
    }
}
