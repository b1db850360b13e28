//! The SQL implementation of [`Store`], for SQLite and PostgreSQL alike.

use super::model::*;
use super::{CallOutcome, Store, StoreError};
use async_trait::async_trait;
use serde_json::Value;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Row};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// A store on SQLite or PostgreSQL; writes are group-committed by one writer task.
pub struct SqlStore {
    reads: AnyPool,
    writer: mpsc::Sender<Job>,
    /// Write transactions committed so far (see [`SqlStore::commits`]).
    commits: Arc<AtomicU64>,
}

enum WriteOp {
    Create(Box<NewCall>),
    Assign {
        call_id: String,
        worker: String,
    },
    Fence {
        call_id: String,
        epoch: u64,
        reason: String,
    },
    Append {
        call_id: String,
        epoch: u64,
        entries: Vec<NewEntry>,
    },
    Complete {
        call_id: String,
        epoch: u64,
        entries: Vec<NewEntry>,
        outcome: CallOutcome,
    },
    Fail {
        call_id: String,
        error: CallError,
    },
    PutArtifact {
        digest: String,
        bytes: Vec<u8>,
    },
    SaveResources(Vec<ResourceRecord>),
}

enum Reply {
    Created(Box<Created>),
    Epoch(u64),
    Record(Box<CallRecord>),
    Done,
}

struct Job {
    op: WriteOp,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// The columns of a [`CallRecord`], as a literal so queries stay static strings.
macro_rules! call_columns {
    () => {
        "id, namespace, tool, command, release, release_digest, state, args_json, spec_json, stdin, \
         idempotency_key, request_hash, epoch, worker, result_json, error_json, created_at_ms, finished_at_ms"
    };
}

fn schema(backend: Backend) -> Vec<String> {
    let blob = match backend {
        Backend::Sqlite => "BLOB",
        Backend::Postgres => "BYTEA",
    };
    vec![
        "CREATE TABLE IF NOT EXISTS calls (
            id TEXT PRIMARY KEY,
            namespace TEXT NOT NULL,
            tool TEXT NOT NULL,
            command TEXT NOT NULL,
            release TEXT NOT NULL,
            release_digest TEXT NOT NULL,
            state TEXT NOT NULL,
            args_json TEXT NOT NULL,
            spec_json TEXT NOT NULL,
            stdin BLOBTYPE NOT NULL,
            idempotency_key TEXT,
            request_hash TEXT NOT NULL,
            epoch BIGINT NOT NULL,
            worker TEXT,
            next_seq BIGINT NOT NULL,
            result_json TEXT,
            error_json TEXT,
            created_at_ms BIGINT NOT NULL,
            finished_at_ms BIGINT
        )"
        .replace("BLOBTYPE", blob),
        "CREATE UNIQUE INDEX IF NOT EXISTS calls_by_key ON calls (namespace, idempotency_key) \
         WHERE idempotency_key IS NOT NULL"
            .into(),
        "CREATE INDEX IF NOT EXISTS calls_by_time ON calls (created_at_ms)".into(),
        "CREATE INDEX IF NOT EXISTS calls_by_state ON calls (state)".into(),
        "CREATE TABLE IF NOT EXISTS oplog (
            call_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            epoch BIGINT NOT NULL,
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            recorded_at_ms BIGINT NOT NULL,
            PRIMARY KEY (call_id, seq)
        )"
        .into(),
        "CREATE TABLE IF NOT EXISTS artifacts (
            digest TEXT PRIMARY KEY,
            size BIGINT NOT NULL,
            bytes BLOBTYPE NOT NULL,
            created_at_ms BIGINT NOT NULL
        )"
        .replace("BLOBTYPE", blob),
        "CREATE TABLE IF NOT EXISTS resources (
            kind TEXT NOT NULL,
            namespace TEXT NOT NULL,
            name TEXT NOT NULL,
            spec_hash TEXT NOT NULL,
            generation BIGINT NOT NULL,
            status_json TEXT NOT NULL,
            PRIMARY KEY (kind, namespace, name)
        )"
        .into(),
    ]
}

fn pool_options(backend: Backend, max: u32) -> AnyPoolOptions {
    let options = AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30));
    match backend {
        Backend::Postgres => options,
        Backend::Sqlite => options.after_connect(|conn, _| {
            Box::pin(async move {
                // WAL lets readers run beside the writer; FULL fsyncs every commit.
                for pragma in [
                    "PRAGMA journal_mode=WAL",
                    "PRAGMA synchronous=FULL",
                    "PRAGMA busy_timeout=10000",
                ] {
                    sqlx::query(pragma).execute(&mut *conn).await?;
                }
                Ok(())
            })
        }),
    }
}

impl SqlStore {
    /// Opens (and creates, for SQLite) the database at `url` and starts the writer.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let (backend, url) = if let Some(path) = url.strip_prefix("sqlite://") {
            let path = path.split('?').next().unwrap_or_default();
            if let Some(parent) = std::path::Path::new(path).parent()
                && !parent.as_os_str().is_empty()
            {
                std::fs::create_dir_all(parent)
                    .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
            }
            (Backend::Sqlite, format!("sqlite://{path}?mode=rwc"))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Backend::Postgres, url.to_string())
        } else {
            return Err(StoreError::UnsupportedUrl(url.to_string()));
        };
        let write_pool = pool_options(backend, 1).connect(&url).await?;
        for statement in schema(backend) {
            // Our own DDL, only the blob type name differs by backend.
            sqlx::query(AssertSqlSafe(statement))
                .execute(&write_pool)
                .await?;
        }
        let reads = pool_options(backend, 4).connect(&url).await?;
        let (writer, rx) = mpsc::channel(4096);
        let commits = Arc::new(AtomicU64::new(0));
        tokio::spawn(run_writer(write_pool, rx, commits.clone()));
        Ok(SqlStore {
            reads,
            writer,
            commits,
        })
    }

    /// How many write transactions (each one fsync on SQLite) the writer has committed:
    /// with group commit, a burst of concurrent writes costs far fewer than one each.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    async fn write(&self, op: WriteOp) -> Result<Reply, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.writer
            .send(Job { op, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

async fn run_writer(pool: AnyPool, mut rx: mpsc::Receiver<Job>, commits: Arc<AtomicU64>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        match commit_batch(&pool, &batch, &commits).await {
            Ok(replies) => {
                for (job, reply) in batch.into_iter().zip(replies) {
                    let _ = job.reply.send(reply);
                }
            }
            // One bad write must not fail its neighbours: retry each on its own.
            Err(error) if batch.len() == 1 => {
                let job = batch.remove(0);
                let _ = job.reply.send(Err(error.into()));
            }
            Err(_) => {
                for job in batch {
                    let reply =
                        match commit_batch(&pool, std::slice::from_ref(&job), &commits).await {
                            Ok(mut replies) => replies.remove(0),
                            Err(error) => Err(error.into()),
                        };
                    let _ = job.reply.send(reply);
                }
            }
        }
    }
}

/// Runs `jobs` in one transaction. A database error aborts the batch; refusals such as a
/// stale epoch are per job and change nothing.
async fn commit_batch(
    pool: &AnyPool,
    jobs: &[Job],
    commits: &AtomicU64,
) -> Result<Vec<Result<Reply, StoreError>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        match execute(&mut tx, &job.op).await {
            Err(StoreError::Database(error)) => return Err(error),
            reply => replies.push(reply),
        }
    }
    tx.commit().await?;
    commits.fetch_add(1, Ordering::Relaxed);
    Ok(replies)
}

async fn execute(conn: &mut AnyConnection, op: &WriteOp) -> Result<Reply, StoreError> {
    match op {
        WriteOp::Create(call) => create(conn, call)
            .await
            .map(|c| Reply::Created(Box::new(c))),
        WriteOp::Assign { call_id, worker } => {
            assign(conn, call_id, worker).await.map(Reply::Epoch)
        }
        WriteOp::Fence {
            call_id,
            epoch,
            reason,
        } => fence(conn, call_id, *epoch, reason).await.map(Reply::Epoch),
        WriteOp::Append {
            call_id,
            epoch,
            entries,
        } => {
            reserve_and_insert(conn, call_id, *epoch, entries, None).await?;
            Ok(Reply::Done)
        }
        WriteOp::Complete {
            call_id,
            epoch,
            entries,
            outcome,
        } => {
            let record = reserve_and_insert(conn, call_id, *epoch, entries, Some(outcome))
                .await?
                .ok_or_else(|| StoreError::NotFound(call_id.clone()))?;
            Ok(Reply::Record(Box::new(record)))
        }
        WriteOp::Fail { call_id, error } => fail(conn, call_id, error)
            .await
            .map(|r| Reply::Record(Box::new(r))),
        WriteOp::PutArtifact { digest, bytes } => {
            sqlx::query(
                "INSERT INTO artifacts (digest, size, bytes, created_at_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (digest) DO NOTHING",
            )
            .bind(digest.as_str())
            .bind(bytes.len() as i64)
            .bind(bytes.as_slice())
            .bind(now_ms())
            .execute(&mut *conn)
            .await?;
            Ok(Reply::Done)
        }
        WriteOp::SaveResources(records) => {
            sqlx::query("DELETE FROM resources")
                .execute(&mut *conn)
                .await?;
            for r in records {
                sqlx::query(
                    "INSERT INTO resources (kind, namespace, name, spec_hash, generation, status_json) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(r.kind.as_str())
                .bind(r.namespace.as_str())
                .bind(r.name.as_str())
                .bind(r.spec_hash.as_str())
                .bind(r.generation)
                .bind(r.status.to_string())
                .execute(&mut *conn)
                .await?;
            }
            Ok(Reply::Done)
        }
    }
}

fn json_text(value: &impl serde::Serialize) -> String {
    // Serializing our own plain data types cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

async fn create(conn: &mut AnyConnection, call: &NewCall) -> Result<Created, StoreError> {
    let now = now_ms();
    let inserted = sqlx::query(concat!(
        "INSERT INTO calls (id, namespace, tool, command, release, release_digest, state, args_json, \
         spec_json, stdin, idempotency_key, request_hash, epoch, worker, next_seq, result_json, \
         error_json, created_at_ms, finished_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $10, $11, 0, NULL, 1, NULL, NULL, $12, NULL) \
         ON CONFLICT DO NOTHING RETURNING ",
        call_columns!()
    ))
    .bind(call.id.as_str())
    .bind(call.namespace.as_str())
    .bind(call.tool.as_str())
    .bind(call.command.as_str())
    .bind(call.release.as_str())
    .bind(call.release_digest.as_str())
    .bind(json_text(&call.args))
    .bind(json_text(&call.spec))
    .bind(call.stdin.as_slice())
    .bind(call.idempotency_key.as_deref())
    .bind(call.request_hash.as_str())
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(inserted) = inserted else {
        let key = call.idempotency_key.clone().unwrap_or_default();
        let existing = select_by_key(conn, &call.namespace, &key)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("call {} exists twice", call.id)))?;
        if existing.request_hash != call.request_hash {
            return Err(StoreError::IdempotencyConflict {
                key,
                existing: existing.id,
            });
        }
        return Ok(Created::Existing(existing));
    };
    insert_entry(conn, &call.id, 0, 0, "call-started", &call.started, now).await?;
    Ok(Created::New(call_from_row(&inserted)?))
}

async fn insert_entry(
    conn: &mut AnyConnection,
    call_id: &str,
    seq: i64,
    epoch: i64,
    kind: &str,
    payload: &Value,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO oplog (call_id, seq, epoch, kind, payload, recorded_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(call_id)
    .bind(seq)
    .bind(epoch)
    .bind(kind)
    .bind(payload.to_string())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn assign(conn: &mut AnyConnection, call_id: &str, worker: &str) -> Result<u64, StoreError> {
    let row = sqlx::query(
        "UPDATE calls SET epoch = epoch + 1, worker = $2, state = 'running', next_seq = next_seq + 1 \
         WHERE id = $1 AND state IN ('pending', 'running') RETURNING epoch, next_seq",
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
    let payload = serde_json::json!({ "worker": worker, "epoch": epoch });
    insert_entry(
        conn,
        call_id,
        next_seq - 1,
        epoch,
        "assigned",
        &payload,
        now_ms(),
    )
    .await?;
    Ok(epoch as u64)
}

async fn fence(
    conn: &mut AnyConnection,
    call_id: &str,
    epoch: u64,
    reason: &str,
) -> Result<u64, StoreError> {
    let row = sqlx::query(
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
    let payload = serde_json::json!({ "reason": reason, "previousEpoch": epoch });
    insert_entry(
        conn,
        call_id,
        next_seq - 1,
        new_epoch,
        "fenced",
        &payload,
        now_ms(),
    )
    .await?;
    Ok(new_epoch as u64)
}

/// Reserves sequence numbers under the caller's epoch (the conditional update is the fence)
/// and writes `entries`, then the outcome when there is one (returning the ended call).
async fn reserve_and_insert(
    conn: &mut AnyConnection,
    call_id: &str,
    epoch: u64,
    entries: &[NewEntry],
    outcome: Option<&CallOutcome>,
) -> Result<Option<CallRecord>, StoreError> {
    let count = entries.len() as i64 + i64::from(outcome.is_some());
    let now = now_ms();
    let row = match outcome {
        None => {
            sqlx::query(
                "UPDATE calls SET next_seq = next_seq + $3 \
                 WHERE id = $1 AND epoch = $2 AND state = 'running' RETURNING next_seq",
            )
            .bind(call_id)
            .bind(epoch as i64)
            .bind(count)
            .fetch_optional(&mut *conn)
            .await?
        }
        Some(outcome) => {
            let (state, result, error) = match &outcome.result {
                Ok(value) => (CallState::Succeeded, Some(value.to_string()), None),
                Err(error) => (CallState::Failed, None, Some(json_text(error))),
            };
            sqlx::query(concat!(
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
    let first = row.try_get::<i64, _>("next_seq")? - count;
    let mut rows: Vec<(&str, &Value)> = entries
        .iter()
        .map(|e| (e.kind.as_str(), &e.payload))
        .collect();
    if let Some(outcome) = outcome {
        rows.push(("outcome", &outcome.entry));
    }
    insert_entries(conn, call_id, first, epoch as i64, &rows, now).await?;
    match outcome {
        Some(_) => Ok(Some(call_from_row(&row)?)),
        None => Ok(None),
    }
}

/// Entries per INSERT statement (6 parameters each, well under every backend's limit).
const ENTRIES_PER_INSERT: usize = 100;

/// Writes consecutive entries from sequence number `first`, many rows per statement.
async fn insert_entries(
    conn: &mut AnyConnection,
    call_id: &str,
    first: i64,
    epoch: i64,
    rows: &[(&str, &Value)],
    now: i64,
) -> Result<(), StoreError> {
    for (chunk_index, chunk) in rows.chunks(ENTRIES_PER_INSERT).enumerate() {
        let mut sql = String::from(
            "INSERT INTO oplog (call_id, seq, epoch, kind, payload, recorded_at_ms) VALUES ",
        );
        for i in 0..chunk.len() {
            let p = i * 6;
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${}, ${}, ${})",
                p + 1,
                p + 2,
                p + 3,
                p + 4,
                p + 5,
                p + 6
            ));
        }
        // Only numbered placeholders are formatted into the statement.
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (i, (kind, payload)) in chunk.iter().enumerate() {
            let seq = first + (chunk_index * ENTRIES_PER_INSERT + i) as i64;
            query = query
                .bind(call_id)
                .bind(seq)
                .bind(epoch)
                .bind(*kind)
                .bind(payload.to_string())
                .bind(now);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

async fn fail(
    conn: &mut AnyConnection,
    call_id: &str,
    error: &CallError,
) -> Result<CallRecord, StoreError> {
    let now = now_ms();
    let row = sqlx::query(
        "UPDATE calls SET next_seq = next_seq + 1, state = 'failed', error_json = $2, finished_at_ms = $3 \
         WHERE id = $1 AND state IN ('pending', 'running') RETURNING next_seq, epoch",
    )
    .bind(call_id)
    .bind(json_text(error))
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = row {
        let seq: i64 = row.try_get::<i64, _>("next_seq")? - 1;
        let epoch: i64 = row.try_get("epoch")?;
        let payload = serde_json::json!({ "state": "failed", "error": error });
        insert_entry(conn, call_id, seq, epoch, "outcome", &payload, now).await?;
    }
    select_call(conn, call_id)
        .await?
        .ok_or_else(|| StoreError::NotFound(call_id.to_string()))
}

/// Explains why a fenced update matched no row.
async fn refusal(conn: &mut AnyConnection, call_id: &str, epoch: u64) -> StoreError {
    let row = sqlx::query("SELECT epoch, state FROM calls WHERE id = $1")
        .bind(call_id)
        .fetch_optional(&mut *conn)
        .await;
    match row {
        Ok(Some(row)) => StoreError::StaleEpoch {
            call_id: call_id.to_string(),
            epoch,
            current: row.try_get::<i64, _>("epoch").unwrap_or_default() as u64,
            state: row.try_get("state").unwrap_or_default(),
        },
        Ok(None) => StoreError::NotFound(call_id.to_string()),
        Err(error) => StoreError::Database(error),
    }
}

async fn select_call(conn: &mut AnyConnection, id: &str) -> Result<Option<CallRecord>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        call_columns!(),
        " FROM calls WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| call_from_row(&r)).transpose()
}

async fn select_by_key(
    conn: &mut AnyConnection,
    namespace: &str,
    key: &str,
) -> Result<Option<CallRecord>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        call_columns!(),
        " FROM calls WHERE namespace = $1 AND idempotency_key = $2"
    ))
    .bind(namespace)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| call_from_row(&r)).transpose()
}

fn parse_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn call_from_row(row: &AnyRow) -> Result<CallRecord, StoreError> {
    let state: String = row.try_get("state")?;
    let result: Option<String> = row.try_get("result_json")?;
    let error: Option<String> = row.try_get("error_json")?;
    Ok(CallRecord {
        id: row.try_get("id")?,
        namespace: row.try_get("namespace")?,
        tool: row.try_get("tool")?,
        command: row.try_get("command")?,
        release: row.try_get("release")?,
        release_digest: row.try_get("release_digest")?,
        state: CallState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("call state {state:?}")))?,
        args: parse_json(&row.try_get::<String, _>("args_json")?, "call arguments")?,
        spec: parse_json(&row.try_get::<String, _>("spec_json")?, "call spec")?,
        stdin: row.try_get("stdin")?,
        idempotency_key: row.try_get("idempotency_key")?,
        request_hash: row.try_get("request_hash")?,
        epoch: row.try_get::<i64, _>("epoch")? as u64,
        worker: row.try_get("worker")?,
        result: result.map(|r| parse_json(&r, "call result")).transpose()?,
        error: error.map(|e| parse_json(&e, "call error")).transpose()?,
        created_at_ms: row.try_get("created_at_ms")?,
        finished_at_ms: row.try_get("finished_at_ms")?,
    })
}

#[async_trait]
impl Store for SqlStore {
    async fn create_call(&self, call: NewCall) -> Result<Created, StoreError> {
        match self.write(WriteOp::Create(Box::new(call))).await? {
            Reply::Created(created) => Ok(*created),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn assign_call(&self, call_id: &str, worker: &str) -> Result<u64, StoreError> {
        match self
            .write(WriteOp::Assign {
                call_id: call_id.into(),
                worker: worker.into(),
            })
            .await?
        {
            Reply::Epoch(epoch) => Ok(epoch),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn fence_call(&self, call_id: &str, epoch: u64, reason: &str) -> Result<u64, StoreError> {
        match self
            .write(WriteOp::Fence {
                call_id: call_id.into(),
                epoch,
                reason: reason.into(),
            })
            .await?
        {
            Reply::Epoch(epoch) => Ok(epoch),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn append_oplog(
        &self,
        call_id: &str,
        epoch: u64,
        entries: Vec<NewEntry>,
    ) -> Result<(), StoreError> {
        self.write(WriteOp::Append {
            call_id: call_id.into(),
            epoch,
            entries,
        })
        .await
        .map(|_| ())
    }

    async fn complete_call(
        &self,
        call_id: &str,
        epoch: u64,
        entries: Vec<NewEntry>,
        outcome: CallOutcome,
    ) -> Result<CallRecord, StoreError> {
        match self
            .write(WriteOp::Complete {
                call_id: call_id.into(),
                epoch,
                entries,
                outcome,
            })
            .await?
        {
            Reply::Record(record) => Ok(*record),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn fail_call(&self, call_id: &str, error: CallError) -> Result<CallRecord, StoreError> {
        match self
            .write(WriteOp::Fail {
                call_id: call_id.into(),
                error,
            })
            .await?
        {
            Reply::Record(record) => Ok(*record),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn get_call(&self, id: &str) -> Result<Option<CallRecord>, StoreError> {
        let mut conn = self.reads.acquire().await?;
        select_call(&mut conn, id).await
    }

    async fn find_call_by_key(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<CallRecord>, StoreError> {
        let mut conn = self.reads.acquire().await?;
        select_by_key(&mut conn, namespace, key).await
    }

    async fn list_calls(&self, filter: &CallFilter) -> Result<Vec<CallRecord>, StoreError> {
        let limit = if filter.limit == 0 {
            50
        } else {
            filter.limit.min(10_000)
        };
        let rows = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM calls WHERE ($1 = '' OR namespace = $1) AND ($2 = '' OR tool = $2) \
             ORDER BY created_at_ms DESC, id DESC LIMIT $3"
        ))
        .bind(filter.namespace.as_deref().unwrap_or(""))
        .bind(filter.tool.as_deref().unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(call_from_row).collect()
    }

    async fn unfinished_calls(&self) -> Result<Vec<CallRecord>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM calls WHERE state IN ('pending', 'running') ORDER BY created_at_ms, id"
        ))
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(call_from_row).collect()
    }

    async fn oplog(&self, call_id: &str) -> Result<Vec<OplogRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, epoch, kind, payload, recorded_at_ms FROM oplog WHERE call_id = $1 ORDER BY seq",
        )
        .bind(call_id)
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(OplogRecord {
                    seq: row.try_get::<i64, _>("seq")? as u64,
                    epoch: row.try_get::<i64, _>("epoch")? as u64,
                    kind: row.try_get("kind")?,
                    payload: parse_json(&row.try_get::<String, _>("payload")?, "oplog payload")?,
                    recorded_at_ms: row.try_get("recorded_at_ms")?,
                })
            })
            .collect()
    }

    async fn put_artifact(&self, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.write(WriteOp::PutArtifact {
            digest: digest.into(),
            bytes: bytes.to_vec(),
        })
        .await
        .map(|_| ())
    }

    async fn get_artifact(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let row = sqlx::query("SELECT bytes FROM artifacts WHERE digest = $1")
            .bind(digest)
            .fetch_optional(&self.reads)
            .await?;
        Ok(row.map(|r| r.try_get("bytes")).transpose()?)
    }

    async fn load_resources(&self) -> Result<Vec<ResourceRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT kind, namespace, name, spec_hash, generation, status_json FROM resources",
        )
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ResourceRecord {
                    kind: row.try_get("kind")?,
                    namespace: row.try_get("namespace")?,
                    name: row.try_get("name")?,
                    spec_hash: row.try_get("spec_hash")?,
                    generation: row.try_get("generation")?,
                    status: parse_json(
                        &row.try_get::<String, _>("status_json")?,
                        "resource status",
                    )?,
                })
            })
            .collect()
    }

    async fn save_resources(&self, records: Vec<ResourceRecord>) -> Result<(), StoreError> {
        self.write(WriteOp::SaveResources(records))
            .await
            .map(|_| ())
    }
}
