//! What the concerns share: the call row and its columns, oplog entries, numbered
//! placeholders.

use super::codec::parse_json;
use super::conn::{Conn, Row, built_query, query};
use crate::StoreError;
use toolgrid_core::call::{CallRecord, CallSpec, CallState, EntryKind, OplogEntry};

/// The columns of a [`CallRecord`], as a literal so queries stay static strings.
macro_rules! call_columns {
    () => {
        concat!(
            "id, namespace, tool, command, release, release_digest, state, args_json, spec_json, stdin, \
             idempotency_key, request_hash, epoch, worker, result_json, error_json, created_at_ms, \
             finished_at_ms, ",
            $crate::sql::commands::command_json!()
        )
    };
}
pub(super) use call_columns;

/// Placeholders `$first, $first+1, ...` for `n` values.
pub(super) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One oplog row of a call to insert.
pub(super) struct EntryRow {
    pub seq: i64,
    pub epoch: i64,
    pub kind: EntryKind,
    pub payload: serde_json::Value,
    /// The writer's number (a worker's append); None for the control plane's entries.
    pub wseq: Option<i64>,
}

impl EntryRow {
    pub(super) fn of(seq: i64, epoch: i64, entry: &OplogEntry) -> EntryRow {
        let (kind, payload) = entry.to_parts();
        EntryRow {
            seq,
            epoch,
            kind,
            payload,
            wseq: None,
        }
    }
}

/// Rows per INSERT statement (7 parameters each, well under every backend's limit).
const ROWS_PER_INSERT: usize = 100;

/// Inserts a call's oplog rows, many per statement: one round trip to the database for
/// the entries a write adds, not one each.
pub(super) async fn insert_rows(
    conn: &mut dyn Conn,
    call_id: &str,
    rows: &[EntryRow],
    now: i64,
) -> Result<(), StoreError> {
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let mut sql = String::from(
            "INSERT INTO oplog (call_id, seq, epoch, kind, payload, recorded_at_ms, wseq) VALUES ",
        );
        for i in 0..chunk.len() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("({})", placeholders(i * 7 + 1, 7)));
        }
        // Only numbered placeholders are formatted into the statement.
        let mut query = built_query(sql);
        for row in chunk {
            query = query
                .bind(call_id)
                .bind(row.seq)
                .bind(row.epoch)
                .bind(row.kind.as_str())
                .bind(row.payload.to_string())
                .bind(now)
                .bind(row.wseq);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Inserts one oplog entry at sequence number `seq` (entries without a writer's number).
pub(super) async fn insert_entry(
    conn: &mut dyn Conn,
    call_id: &str,
    seq: i64,
    epoch: i64,
    entry: &OplogEntry,
    now: i64,
) -> Result<(), StoreError> {
    insert_rows(conn, call_id, &[EntryRow::of(seq, epoch, entry)], now).await
}

pub(super) async fn select_call(
    conn: &mut dyn Conn,
    id: &str,
) -> Result<Option<CallRecord>, StoreError> {
    let row = query(concat!(
        "SELECT ",
        call_columns!(),
        " FROM calls WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| call_from_row(&r)).transpose()
}

pub(super) fn call_from_row(row: &Row) -> Result<CallRecord, StoreError> {
    let state: String = row.try_get("state")?;
    let result: Option<String> = row.try_get("result_json")?;
    let error: Option<String> = row.try_get("error_json")?;
    let mut spec: CallSpec = parse_json(&row.try_get::<String>("spec_json")?, "call spec")?;
    // The definition stored apart (a row written before definitions were has it in its
    // spec, and names none).
    if let Some(digest) = row.try_get::<Option<String>>("command_digest")? {
        let definition = row
            .try_get::<Option<String>>("command_json")?
            .ok_or_else(|| {
                StoreError::Corrupt(format!("command definition {digest} is missing"))
            })?;
        spec.command = Some(super::commands::parsed(&digest, &definition)?);
    }
    Ok(CallRecord {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        tool: row.try_get("tool")?,
        command: row.try_get("command")?,
        release: row.try_get("release")?,
        release_digest: row.try_get("release_digest")?,
        state: CallState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("call state {state:?}")))?,
        args: parse_json(&row.try_get::<String>("args_json")?, "call arguments")?,
        spec,
        stdin: row.try_get("stdin")?,
        idempotency_key: row.try_get("idempotency_key")?,
        request_hash: row.try_get("request_hash")?,
        epoch: row.try_get::<i64>("epoch")? as u64,
        worker: row.try_get("worker")?,
        result: result.map(|r| parse_json(&r, "call result")).transpose()?,
        error: error.map(|e| parse_json(&e, "call error")).transpose()?,
        created_at_ms: row.try_get("created_at_ms")?,
        finished_at_ms: row.try_get("finished_at_ms")?,
    })
}
