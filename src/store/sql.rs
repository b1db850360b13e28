//! The SQL implementation of [`Store`], for SQLite and PostgreSQL alike.

use super::{CallOutcome, RetentionReport, Store, StoreError};
use crate::call::*;
use crate::workspace::{self, WorkspaceKey};
use async_trait::async_trait;
use serde_json::Value;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Row};
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 256;

/// Calls deleted per retention transaction.
const RETENTION_BATCH: i64 = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// How the writer retries a write that failed for a passing reason (see [`is_transient`]):
/// after `first_delay`, doubling up to `max_delay`, until `give_up_after` has passed since
/// the first attempt; then the write fails with [`StoreError::Unavailable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub first_delay: Duration,
    pub max_delay: Duration,
    pub give_up_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(2),
            give_up_after: Duration::from_secs(60),
        }
    }
}

/// How a store is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// SQLite: how long a statement waits for another connection's lock before it fails
    /// (and is retried by the writer). `?busy_timeout_ms=N` in the URL overrides it.
    pub busy_timeout: Duration,
    /// Retries of failed writes (and of the schema upgrade at open).
    pub retry: RetryPolicy,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            busy_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
        }
    }
}

/// A store on SQLite or PostgreSQL; writes are group-committed by one writer task.
pub struct SqlStore {
    reads: AnyPool,
    writer: mpsc::Sender<Job>,
    artifact_purges: AtomicU64,
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
        first_wseq: u64,
        entries: Vec<OplogEntry>,
    },
    Complete {
        call_id: String,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
        outcome: CallOutcome,
    },
    Fail {
        call_id: String,
        error: CallError,
    },
    /// Cancels a call not yet ended (see [`Store::cancel_call`]).
    Cancel {
        call_id: String,
        reason: String,
    },
    /// Decides a call awaiting approval (see [`Store::decide_approval`]).
    Decide {
        call_id: String,
        decision: ApprovalDecision,
        error: Option<CallError>,
    },
    PutArtifact {
        digest: String,
        bytes: Vec<u8>,
    },
    SaveResources(Vec<ResourceRecord>),
    /// Takes a token from a rate-limit bucket (see [`Store::take_token`]).
    TakeToken {
        key: String,
        burst: u32,
        per_second: f64,
        now_ms: i64,
    },
    /// Appends a refused call's audit record.
    AppendAudit(Box<AuditRecord>),
    /// Deletes up to `limit` calls that ended before `cutoff_ms`, and their oplogs.
    PurgeCalls {
        cutoff_ms: i64,
        limit: i64,
    },
    /// Commits a workspace version on `base` written by no call's run (see
    /// [`Store::commit_workspace`]).
    CommitWorkspace {
        key: WorkspaceKey,
        base: u64,
        commit: workspace::Commit,
        call_id: String,
    },
    /// Deletes artifacts stored before `cutoff_ms` that no call uses, except `keep`.
    PurgeArtifacts {
        cutoff_ms: i64,
        keep: HashSet<String>,
    },
}

enum Reply {
    Created(Box<Created>),
    Epoch(u64),
    Record(Box<CallRecord>),
    Purged {
        calls: u64,
        entries: u64,
    },
    PurgedArtifacts(Vec<String>),
    /// A rate-limit answer: `None` taken, `Some(ms)` refused.
    Token(Option<u64>),
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

/// One step of the schema. Steps are applied in order, each once, in one transaction at
/// open; the `schema_version` table records the last one applied. Never edit a step that
/// has shipped: add the next one.
struct Migration {
    version: i64,
    statements: fn(Backend) -> Vec<String>,
}

const MIGRATIONS: &[Migration] = &[
    // The schema before versions existed, exactly (so its databases are version 1).
    Migration {
        version: 1,
        statements: schema_v1,
    },
    // The writer's own number of each entry within (call, epoch): a repeated append is
    // recognised and not stored twice.
    Migration {
        version: 2,
        statements: |_| {
            vec![
                "ALTER TABLE oplog ADD COLUMN wseq BIGINT".into(),
                "CREATE UNIQUE INDEX IF NOT EXISTS oplog_by_wseq ON oplog (call_id, epoch, wseq) \
                 WHERE wseq IS NOT NULL"
                    .into(),
            ]
        },
    },
    // Retention finds ended calls by their end, and artifacts' users by digest.
    Migration {
        version: 3,
        statements: |_| {
            vec![
                "CREATE INDEX IF NOT EXISTS calls_by_finish ON calls (finished_at_ms) \
                 WHERE finished_at_ms IS NOT NULL"
                    .into(),
                "CREATE INDEX IF NOT EXISTS calls_by_digest ON calls (release_digest)".into(),
            ]
        },
    },
    // The agent a call acts for ('' for an operator's own calls): agents list and read
    // only their own calls, and idempotency keys are scoped per agent.
    Migration {
        version: 4,
        statements: |_| {
            vec![
                "ALTER TABLE calls ADD COLUMN agent TEXT NOT NULL DEFAULT ''".into(),
                "DROP INDEX IF EXISTS calls_by_key".into(),
                "CREATE UNIQUE INDEX IF NOT EXISTS calls_by_key ON calls (namespace, agent, idempotency_key) \
                 WHERE idempotency_key IS NOT NULL"
                    .into(),
                "CREATE INDEX IF NOT EXISTS calls_by_agent ON calls (namespace, agent, created_at_ms)"
                    .into(),
            ]
        },
    },
    // Workspaces: blobs by digest, versions by (namespace, agent, version), and the version
    // each call started from (pinned at its first assignment).
    Migration {
        version: 5,
        statements: schema_v5,
    },
    // Middleware: the audit log (append-only), rate-limit buckets, and the index that finds
    // an agent's identical recent call.
    Migration {
        version: 6,
        statements: |_| {
            vec![
                "CREATE TABLE IF NOT EXISTS audit (
                    seq_id TEXT PRIMARY KEY,
                    call_id TEXT NOT NULL,
                    at_ms BIGINT NOT NULL,
                    namespace TEXT NOT NULL,
                    agent TEXT NOT NULL,
                    tool TEXT NOT NULL,
                    outcome TEXT NOT NULL,
                    record_json TEXT NOT NULL
                )"
                .into(),
                "CREATE INDEX IF NOT EXISTS audit_by_time ON audit (at_ms)".into(),
                "CREATE INDEX IF NOT EXISTS audit_by_agent ON audit (namespace, agent, at_ms)"
                    .into(),
                "CREATE TABLE IF NOT EXISTS rate_buckets (
                    key TEXT PRIMARY KEY,
                    tokens DOUBLE PRECISION NOT NULL,
                    updated_at_ms BIGINT NOT NULL
                )"
                .into(),
                // Only agents' calls are checked for repeats: operators' calls stay out of
                // the index, and their admission pays nothing for it.
                "CREATE INDEX IF NOT EXISTS calls_by_request ON calls (namespace, agent, request_hash, created_at_ms) \
                 WHERE agent <> ''"
                    .into(),
            ]
        },
    },
];

/// The schema version this binary writes; a store at a newer one is refused.
pub const SCHEMA_VERSION: i64 = 6;

fn schema_v5(backend: Backend) -> Vec<String> {
    let blob = match backend {
        Backend::Sqlite => "BLOB",
        Backend::Postgres => "BYTEA",
    };
    vec![
        "ALTER TABLE calls ADD COLUMN workspace_base BIGINT".into(),
        "CREATE TABLE IF NOT EXISTS workspace_blobs (
            digest TEXT PRIMARY KEY,
            size BIGINT NOT NULL,
            bytes BLOBTYPE NOT NULL,
            created_at_ms BIGINT NOT NULL
        )"
        .replace("BLOBTYPE", blob),
        "CREATE TABLE IF NOT EXISTS workspace_versions (
            namespace TEXT NOT NULL,
            agent TEXT NOT NULL,
            version BIGINT NOT NULL,
            tree_json TEXT NOT NULL,
            tree_digest TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            call_id TEXT NOT NULL,
            PRIMARY KEY (namespace, agent, version)
        )"
        .into(),
    ]
}

fn schema_v1(backend: Backend) -> Vec<String> {
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

fn pool_options(backend: Backend, max: u32, busy_timeout: Duration) -> AnyPoolOptions {
    let options = AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30));
    match backend {
        Backend::Postgres => options,
        Backend::Sqlite => options.after_connect(move |conn, _| {
            Box::pin(async move {
                // WAL lets readers run beside the writer; FULL fsyncs every commit.
                for pragma in ["PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"] {
                    sqlx::query(pragma).execute(&mut *conn).await?;
                }
                let busy = format!("PRAGMA busy_timeout={}", busy_timeout.as_millis());
                // A number formatted into our own pragma.
                sqlx::query(AssertSqlSafe(busy)).execute(&mut *conn).await?;
                Ok(())
            })
        }),
    }
}

/// Whether a database error is passing (a lock held by another connection, a lost or
/// refused connection, a server shutting down, an I/O error, a full disk), so the same
/// write may succeed later; anything else (a bad statement, a constraint) is not.
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        sqlx::Error::Database(error) => error.code().is_some_and(|code| transient_code(&code)),
        _ => false,
    }
}

/// `code` is a PostgreSQL SQLSTATE (five characters) or an SQLite extended result code (a
/// number below 10000).
fn transient_code(code: &str) -> bool {
    if code.len() == 5 {
        // Connection exceptions, insufficient resources (disk full, out of memory, too many
        // connections), shutdowns, I/O errors, serialization failures, deadlocks, lock
        // timeouts.
        return code.starts_with("08")
            || code.starts_with("53")
            || matches!(
                code,
                "57P01" | "57P02" | "57P03" | "58030" | "40001" | "40P01" | "55P03"
            );
    }
    match code.parse::<u32>() {
        // SQLite primary codes: BUSY, LOCKED, IOERR, FULL, CANTOPEN, PROTOCOL.
        Ok(extended) => matches!(extended & 0xff, 5 | 6 | 10 | 13 | 14 | 15),
        Err(_) => false,
    }
}

/// Runs `attempt` until it succeeds, fails for good, or `policy` gives up on a transient
/// failure. `attempt` is told how many attempts came before it.
async fn retrying<T, F, Fut>(policy: RetryPolicy, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let start = Instant::now();
    let mut delay = policy.first_delay;
    let mut attempts = 0u32;
    loop {
        let error = match attempt(attempts).await {
            Err(StoreError::Database(error)) if is_transient(&error) => error,
            other => return other,
        };
        attempts += 1;
        if start.elapsed() + delay > policy.give_up_after {
            tracing::error!(%error, attempts, "store write failed; giving up");
            return Err(StoreError::Unavailable {
                attempts,
                last: error.to_string(),
            });
        }
        tracing::warn!(%error, attempts, retry_in = ?delay, "store write failed; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(policy.max_delay);
    }
}

/// Brings the schema to [`SCHEMA_VERSION`] in one transaction; returns the version found.
async fn migrate(pool: &AnyPool, backend: Backend) -> Result<i64, StoreError> {
    let mut tx = pool.begin().await?;
    if backend == Backend::Postgres {
        // Two processes opening one database upgrade it one after the other.
        sqlx::query("SELECT 1 FROM (SELECT pg_advisory_xact_lock(7406283)) AS upgrade_lock")
            .fetch_one(&mut *tx)
            .await?;
    }
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS schema_version (id INTEGER PRIMARY KEY, version BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await?;
    // A write first: SQLite takes its write lock here, before reading the version.
    sqlx::query(
        "INSERT INTO schema_version (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    )
    .execute(&mut *tx)
    .await?;
    let found: i64 = sqlx::query("SELECT version FROM schema_version WHERE id = 1")
        .fetch_one(&mut *tx)
        .await?
        .try_get("version")?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > found) {
        for statement in (migration.statements)(backend) {
            // Our own DDL.
            sqlx::query(AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await?;
        }
        tracing::debug!(version = migration.version, "store migration applied");
    }
    if found < SCHEMA_VERSION {
        sqlx::query("UPDATE schema_version SET version = $1 WHERE id = 1")
            .bind(SCHEMA_VERSION)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(found)
}

impl SqlStore {
    /// Opens (and creates, for SQLite) the database at `url`, upgrades its schema, and
    /// starts the writer.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, OpenOptions::default()).await
    }

    /// [`SqlStore::open`] with explicit options.
    pub async fn open_with(url: &str, mut options: OpenOptions) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let (backend, url) = if let Some(path) = url.strip_prefix("sqlite://") {
            let (path, query) = path.split_once('?').unwrap_or((path, ""));
            for (key, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
                if key == "busy_timeout_ms"
                    && let Ok(ms) = value.parse()
                {
                    options.busy_timeout = Duration::from_millis(ms);
                }
            }
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
        let write_pool = pool_options(backend, 1, options.busy_timeout)
            .connect(&url)
            .await?;
        let found = retrying(options.retry, |_| migrate(&write_pool, backend)).await?;
        if found != SCHEMA_VERSION {
            tracing::info!(from = found, to = SCHEMA_VERSION, "store schema upgraded");
        }
        let reads = pool_options(backend, 4, options.busy_timeout)
            .connect(&url)
            .await?;
        let (writer, rx) = mpsc::channel(4096);
        let commits = Arc::new(AtomicU64::new(0));
        tokio::spawn(run_writer(write_pool, rx, options.retry, commits.clone()));
        Ok(SqlStore {
            reads,
            writer,
            artifact_purges: AtomicU64::new(0),
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

/// The same [`StoreError::Unavailable`] for every job of a batch that gave up.
fn unavailable_again(error: &StoreError) -> Option<StoreError> {
    match error {
        StoreError::Unavailable { attempts, last } => Some(StoreError::Unavailable {
            attempts: *attempts,
            last: last.clone(),
        }),
        _ => None,
    }
}

async fn run_writer(
    pool: AnyPool,
    mut rx: mpsc::Receiver<Job>,
    retry: RetryPolicy,
    commits: Arc<AtomicU64>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // A retried batch may have committed already (the connection died during COMMIT):
        // every operation recognises its own earlier commit (see `execute`).
        let result = retrying(retry, |tried| {
            commit_batch(&pool, &batch, tried > 0, &commits)
        })
        .await;
        match result {
            Ok(replies) => {
                for (job, reply) in batch.into_iter().zip(replies) {
                    let _ = job.reply.send(reply);
                }
            }
            Err(error) if batch.len() == 1 => {
                let job = batch.remove(0);
                let _ = job.reply.send(Err(error));
            }
            // The database stayed unreachable: retrying each write alone would not help.
            Err(error @ StoreError::Unavailable { .. }) => {
                for job in batch {
                    let again = unavailable_again(&error).unwrap_or(StoreError::Closed);
                    let _ = job.reply.send(Err(again));
                }
            }
            // One bad write must not fail its neighbours: retry each on its own.
            Err(_) => {
                for job in batch {
                    let single = std::slice::from_ref(&job);
                    let reply = match retrying(retry, |_| {
                        commit_batch(&pool, single, true, &commits)
                    })
                    .await
                    {
                        Ok(mut replies) => replies.remove(0),
                        Err(error) => Err(error),
                    };
                    let _ = job.reply.send(reply);
                }
            }
        }
    }
}

/// Runs `jobs` in one transaction. A database error aborts the batch; refusals such as a
/// stale epoch are per job and change nothing. `again` says the batch (or a batch with
/// these jobs) was tried before and may have committed.
async fn commit_batch(
    pool: &AnyPool,
    jobs: &[Job],
    again: bool,
    commits: &AtomicU64,
) -> Result<Vec<Result<Reply, StoreError>>, StoreError> {
    let mut tx = pool.begin().await?;
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        match execute(&mut tx, &job.op, again).await {
            Err(StoreError::Database(error)) => return Err(StoreError::Database(error)),
            reply => replies.push(reply),
        }
    }
    tx.commit().await?;
    commits.fetch_add(1, Ordering::Relaxed);
    Ok(replies)
}

/// Runs one write. With `again` the write may have committed in an earlier attempt whose
/// outcome was unknown; each operation then recognises its own commit instead of being
/// applied twice (appends and completions always do).
async fn execute(conn: &mut AnyConnection, op: &WriteOp, again: bool) -> Result<Reply, StoreError> {
    match op {
        WriteOp::Create(call) => {
            if again
                && let Some(existing) = select_call(conn, &call.id).await?
                && existing.request_hash == call.request_hash
            {
                return Ok(Reply::Created(Box::new(Created::New(existing))));
            }
            create(conn, call)
                .await
                .map(|c| Reply::Created(Box::new(c)))
        }
        WriteOp::Assign { call_id, worker } => {
            if again && let Some(epoch) = committed_assignment(conn, call_id, worker).await? {
                return Ok(Reply::Epoch(epoch));
            }
            assign(conn, call_id, worker).await.map(Reply::Epoch)
        }
        WriteOp::Fence {
            call_id,
            epoch,
            reason,
        } => match fence(conn, call_id, *epoch, reason).await {
            Err(StoreError::StaleEpoch { current, state, .. })
                if again && current == epoch + 1 && state == CallState::Pending =>
            {
                // Only this fence moves a running call at `epoch` to pending at `epoch + 1`.
                Ok(Reply::Epoch(current))
            }
            other => other.map(Reply::Epoch),
        },
        WriteOp::Append {
            call_id,
            epoch,
            first_wseq,
            entries,
        } => {
            // The fencing update matches no row for an append already stored (the same
            // call, epoch and wseq: a batch run again, or a repeat); only then is it asked why.
            match reserve_and_insert(conn, call_id, *epoch, *first_wseq, entries, None).await {
                Ok(_) => Ok(Reply::Done),
                Err(StoreError::StaleEpoch { .. })
                    if !entries.is_empty()
                        && wseq_stored(conn, call_id, *epoch, *first_wseq).await? =>
                {
                    Ok(Reply::Done)
                }
                Err(error) => Err(error),
            }
        }
        WriteOp::Complete {
            call_id,
            epoch,
            first_wseq,
            entries,
            outcome,
        } => {
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
            match reserve_and_insert(conn, call_id, *epoch, *first_wseq, entries, Some(outcome))
                .await
            {
                Ok(record) => {
                    let record = record.ok_or_else(|| StoreError::NotFound(call_id.clone()))?;
                    if let Some(commit) = commit {
                        commit_version(conn, call_id, commit).await?;
                    }
                    insert_audit(conn, &record).await?;
                    Ok(Reply::Record(Box::new(record)))
                }
                Err(StoreError::StaleEpoch {
                    call_id: id,
                    epoch: stale,
                    current,
                    state,
                }) => match select_call(conn, call_id).await? {
                    Some(record) if ended_by(&record, *epoch, outcome) => {
                        Ok(Reply::Record(Box::new(record)))
                    }
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
        WriteOp::CommitWorkspace {
            key,
            base,
            commit,
            call_id,
        } => {
            let head = head_version(conn, key).await?;
            if head != *base {
                // Run again, this very commit may be the head already.
                if again && head == base + 1 {
                    let row = sqlx::query(
                        "SELECT tree_digest, call_id FROM workspace_versions \
                         WHERE namespace = $1 AND agent = $2 AND version = $3",
                    )
                    .bind(key.namespace.as_str())
                    .bind(key.agent.as_str())
                    .bind(head as i64)
                    .fetch_one(&mut *conn)
                    .await?;
                    if row.try_get::<String, _>("tree_digest")? == commit.tree.digest()
                        && row.try_get::<String, _>("call_id")? == *call_id
                    {
                        return Ok(Reply::Epoch(head));
                    }
                }
                return Ok(Reply::Done);
            }
            insert_version(conn, key, base + 1, commit, call_id).await?;
            Ok(Reply::Epoch(base + 1))
        }
        WriteOp::Fail { call_id, error } => fail(conn, call_id, error)
            .await
            .map(|r| Reply::Record(Box::new(r))),
        WriteOp::Cancel { call_id, reason } => {
            match cancel(conn, call_id, reason).await {
                // A batch run again finds the call ended by this very cancel.
                Err(StoreError::Ended { .. }) if again => select_call(conn, call_id)
                    .await?
                    .ok_or_else(|| StoreError::NotFound(call_id.clone())),
                other => other,
            }
            .map(|r| Reply::Record(Box::new(r)))
        }
        WriteOp::Decide {
            call_id,
            decision,
            error,
        } => {
            // Only this decision records itself in the call's spec: a batch run again finds it.
            if again
                && let Some(existing) = select_call(conn, call_id).await?
                && existing.spec.chain.approved.as_ref() == Some(decision)
            {
                return Ok(Reply::Record(Box::new(existing)));
            }
            decide(conn, call_id, decision, error.as_ref())
                .await
                .map(|r| Reply::Record(Box::new(r)))
        }
        WriteOp::AppendAudit(record) => write_audit(conn, &record.call_id, record)
            .await
            .map(|()| Reply::Done),
        WriteOp::PutArtifact { digest, bytes } => {
            // Storing an artifact again refreshes its time, so retention keeps what the
            // catalog has just stored.
            sqlx::query(
                "INSERT INTO artifacts (digest, size, bytes, created_at_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (digest) DO UPDATE SET created_at_ms = excluded.created_at_ms",
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
        WriteOp::PurgeCalls { cutoff_ms, limit } => {
            let (calls, entries) = purge_calls(conn, *cutoff_ms, *limit).await?;
            Ok(Reply::Purged { calls, entries })
        }
        WriteOp::PurgeArtifacts { cutoff_ms, keep } => purge_artifacts(conn, *cutoff_ms, keep)
            .await
            .map(Reply::PurgedArtifacts),
        // A batch run again may take a second token for one request: the bucket errs on
        // the side of refusing.
        WriteOp::TakeToken {
            key,
            burst,
            per_second,
            now_ms,
        } => take_token(conn, key, *burst, *per_second, *now_ms)
            .await
            .map(Reply::Token),
    }
}

fn is_postgres(conn: &AnyConnection) -> bool {
    conn.backend_name() == "PostgreSQL"
}

/// Takes a token from bucket `key` (created full), atomically: PostgreSQL locks the row
/// (`FOR UPDATE`) until the transaction ends, so replicas take turns; SQLite's write lock,
/// taken by the insert, serialises every writer of the database file.
async fn take_token(
    conn: &mut AnyConnection,
    key: &str,
    burst: u32,
    per_second: f64,
    now: i64,
) -> Result<Option<u64>, StoreError> {
    sqlx::query(
        "INSERT INTO rate_buckets (key, tokens, updated_at_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (key) DO NOTHING",
    )
    .bind(key)
    .bind(f64::from(burst.max(1)))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let select = if is_postgres(conn) {
        "SELECT tokens, updated_at_ms FROM rate_buckets WHERE key = $1 FOR UPDATE"
    } else {
        "SELECT tokens, updated_at_ms FROM rate_buckets WHERE key = $1"
    };
    let row = sqlx::query(select).bind(key).fetch_one(&mut *conn).await?;
    let taken = crate::middleware::bucket::take(
        row.try_get("tokens")?,
        row.try_get("updated_at_ms")?,
        burst,
        per_second,
        now,
    );
    sqlx::query("UPDATE rate_buckets SET tokens = $2, updated_at_ms = $3 WHERE key = $1")
        .bind(key)
        .bind(taken.tokens)
        .bind(taken.updated_at_ms)
        .execute(&mut *conn)
        .await?;
    Ok(taken.retry_after_ms)
}

/// Serialises, across replicas, the admissions of one agent's identical calls (PostgreSQL;
/// on SQLite the write transaction already does), so that of two racing identical calls
/// one sees the other.
async fn lock_request(
    conn: &mut AnyConnection,
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
    sqlx::query("SELECT 1 FROM (SELECT pg_advisory_xact_lock($1)) AS repeat_lock")
        .bind(i64::from_be_bytes(first))
        .fetch_one(&mut *conn)
        .await?;
    Ok(())
}

/// The agent's newest call with `request_hash` created at or after `since_ms`.
async fn select_repeat(
    conn: &mut AnyConnection,
    namespace: &str,
    agent: &str,
    request_hash: &str,
    since_ms: i64,
) -> Result<Option<CallRecord>, StoreError> {
    let row = sqlx::query(concat!(
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
    conn: &mut AnyConnection,
    call_id: &str,
    epoch: u64,
    first_wseq: u64,
) -> Result<bool, StoreError> {
    let row = sqlx::query(
        "SELECT 1 AS stored FROM oplog WHERE call_id = $1 AND epoch = $2 AND wseq = $3",
    )
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
    conn: &mut AnyConnection,
    call_id: &str,
    worker: &str,
) -> Result<Option<u64>, StoreError> {
    let row = sqlx::query(
        "SELECT c.epoch AS epoch FROM calls c JOIN oplog o ON o.call_id = c.id AND o.seq = c.next_seq - 1 \
         WHERE c.id = $1 AND c.state = 'running' AND c.worker = $2 AND o.kind = 'assigned' AND o.epoch = c.epoch",
    )
    .bind(call_id)
    .bind(worker)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row
        .map(|r| r.try_get::<i64, _>("epoch"))
        .transpose()?
        .map(|e| e as u64))
}

/// Placeholders `$first, $first+1, ...` for `n` values.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Deletes up to `limit` calls that ended before `cutoff_ms`, oldest first, with their
/// oplogs; returns how many calls and entries went.
async fn purge_calls(
    conn: &mut AnyConnection,
    cutoff_ms: i64,
    limit: i64,
) -> Result<(u64, u64), StoreError> {
    let ids: Vec<String> = sqlx::query(
        "SELECT id FROM calls WHERE state IN ('succeeded', 'failed') AND finished_at_ms < $1 \
         ORDER BY finished_at_ms, id LIMIT $2",
    )
    .bind(cutoff_ms)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|row| row.try_get("id"))
    .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Ok((0, 0));
    }
    // Only numbered placeholders are formatted into the statements.
    let list = placeholders(1, ids.len());
    let mut entries = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM oplog WHERE call_id IN ({list})"
    )));
    let mut calls = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM calls WHERE id IN ({list}) AND state IN ('succeeded', 'failed')"
    )));
    for id in &ids {
        entries = entries.bind(id.as_str());
        calls = calls.bind(id.as_str());
    }
    let entries = entries.execute(&mut *conn).await?.rows_affected();
    let calls = calls.execute(&mut *conn).await?.rows_affected();
    Ok((calls, entries))
}

/// Deletes the artifacts stored before `cutoff_ms` that no call uses and that are not in
/// `keep`; returns their digests.
async fn purge_artifacts(
    conn: &mut AnyConnection,
    cutoff_ms: i64,
    keep: &HashSet<String>,
) -> Result<Vec<String>, StoreError> {
    let unused: Vec<String> = sqlx::query(
        "SELECT digest FROM artifacts WHERE created_at_ms < $1 \
         AND NOT EXISTS (SELECT 1 FROM calls WHERE calls.release_digest = artifacts.digest) \
         ORDER BY digest",
    )
    .bind(cutoff_ms)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|row| row.try_get("digest"))
    .collect::<Result<_, _>>()?;
    let mut deleted = Vec::new();
    for digest in unused.into_iter().filter(|d| !keep.contains(d)) {
        sqlx::query("DELETE FROM artifacts WHERE digest = $1")
            .bind(digest.as_str())
            .execute(&mut *conn)
            .await?;
        deleted.push(digest);
    }
    Ok(deleted)
}

fn json_text(value: &impl serde::Serialize) -> String {
    // Serializing our own plain data types cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

async fn create(conn: &mut AnyConnection, call: &NewCall) -> Result<Created, StoreError> {
    let now = now_ms();
    // The idempotency scope and the listing filter of agents; '' for an operator's call.
    let agent = call.spec.access.agent.as_deref().unwrap_or("");
    if let Some(window) = call.repeat_window_ms {
        // The same key returns the earlier call before any repeat is looked for.
        if let Some(key) = &call.idempotency_key
            && let Some(existing) = select_by_key(conn, &call.namespace, agent, key).await?
        {
            return same_key(call, existing);
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
            return Ok(Created::Repeated(earlier));
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
    let inserted = sqlx::query(concat!(
        "INSERT INTO calls (id, namespace, tool, command, release, release_digest, state, args_json, \
         spec_json, stdin, idempotency_key, request_hash, epoch, worker, next_seq, result_json, \
         error_json, created_at_ms, finished_at_ms, agent) \
         VALUES ($1, $2, $3, $4, $5, $6, $13, $7, $8, $9, $10, $11, $14, $15, $16, $18, NULL, $12, $19, $17) \
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
    .bind(state.as_str())
    .bind(lifecycle.epoch as i64)
    .bind(lifecycle.worker.as_deref())
    .bind(next_seq)
    .bind(agent)
    .bind(dry_run.map(Value::to_string))
    .bind(dry_run.map(|_| now))
    .fetch_optional(&mut *conn)
    .await?;
    let Some(inserted) = inserted else {
        let key = call.idempotency_key.clone().unwrap_or_default();
        let existing = select_by_key(conn, &call.namespace, agent, &key)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("call {} exists twice", call.id)))?;
        return same_key(call, existing);
    };
    let started = OplogEntry::CallStarted(call.started.clone());
    insert_entry(conn, &call.id, 0, 0, &started, now).await?;
    if dry_run.is_some() {
        // Ended by the control plane, so no run summary (as for a call it fails).
        let outcome = OplogEntry::Outcome(Outcome {
            state: Ended::Succeeded,
            error: None,
            run: None,
        });
        insert_entry(conn, &call.id, 1, 0, &outcome, now).await?;
    }
    if let Some((lifecycle, assigned)) = &assignment {
        let base = pin_workspace_base(conn, &call.id, &call.namespace, &call.spec).await?;
        let mut assigned = assigned.clone();
        if let OplogEntry::Assigned(entry) = &mut assigned {
            entry.workspace_version = base;
        }
        insert_entry(conn, &call.id, 1, lifecycle.epoch as i64, &assigned, now).await?;
    }
    let record = call_from_row(&inserted)?;
    if record.state.is_terminal() {
        // A dry run answered without running ends here: its audit record too.
        insert_audit(conn, &record).await?;
    }
    Ok(Created::New(record))
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

async fn insert_entry(
    conn: &mut AnyConnection,
    call_id: &str,
    seq: i64,
    epoch: i64,
    entry: &OplogEntry,
    now: i64,
) -> Result<(), StoreError> {
    let (kind, payload) = entry.to_parts();
    sqlx::query(
        "INSERT INTO oplog (call_id, seq, epoch, kind, payload, recorded_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(call_id)
    .bind(seq)
    .bind(epoch)
    .bind(kind.as_str())
    .bind(payload.to_string())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn assign(conn: &mut AnyConnection, call_id: &str, worker: &str) -> Result<u64, StoreError> {
    let row = sqlx::query(
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
    let workspace_version = match row.try_get::<Option<i64>, _>("workspace_base")? {
        Some(base) => Some(base as u64),
        None => {
            let namespace: String = row.try_get("namespace")?;
            let spec: CallSpec = parse_json(&row.try_get::<String, _>("spec_json")?, "spec")?;
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

/// At a call's first assignment, records the head of the workspace it sees as its base:
/// every later assignment (a replay after failover) starts from the same version. Returns
/// the base (`None` for a call without a workspace).
async fn pin_workspace_base(
    conn: &mut AnyConnection,
    call_id: &str,
    namespace: &str,
    spec: &CallSpec,
) -> Result<Option<u64>, StoreError> {
    let Some(key) = WorkspaceKey::of_call(namespace, &spec.access) else {
        return Ok(None);
    };
    let head = head_version(conn, &key).await?;
    sqlx::query("UPDATE calls SET workspace_base = $2 WHERE id = $1 AND workspace_base IS NULL")
        .bind(call_id)
        .bind(head as i64)
        .execute(&mut *conn)
        .await?;
    Ok(Some(head))
}

/// The newest stored version of a workspace (0 when none is).
async fn head_version(conn: &mut AnyConnection, key: &WorkspaceKey) -> Result<u64, StoreError> {
    let row = sqlx::query(
        "SELECT MAX(version) AS head FROM workspace_versions WHERE namespace = $1 AND agent = $2",
    )
    .bind(key.namespace.as_str())
    .bind(key.agent.as_str())
    .fetch_one(&mut *conn)
    .await?;
    Ok(row.try_get::<Option<i64>, _>("head")?.unwrap_or(0) as u64)
}

/// Why a succeeded call's workspace commit cannot be taken (the call then fails with it),
/// checked in the transaction that would end the call. `Ok(None)`: the commit may go in
/// (or the call is not running under `epoch`, which the completion itself refuses).
async fn commit_refusal(
    conn: &mut AnyConnection,
    call_id: &str,
    epoch: u64,
    commit: &workspace::Commit,
) -> Result<Option<CallError>, StoreError> {
    let row = sqlx::query(
        "SELECT namespace, spec_json, workspace_base FROM calls \
         WHERE id = $1 AND epoch = $2 AND state = 'running'",
    )
    .bind(call_id)
    .bind(epoch as i64)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let namespace: String = row.try_get("namespace")?;
    let spec: CallSpec = parse_json(&row.try_get::<String, _>("spec_json")?, "spec")?;
    let invalid = |message: String| Ok(Some(CallError::new(ErrorKind::WorkspaceInvalid, message)));
    let Some(key) = WorkspaceKey::written_by(&namespace, &spec.access) else {
        return invalid("the worker sent a workspace for a call that may not write one".into());
    };
    let Some(base) = row.try_get::<Option<i64>, _>("workspace_base")? else {
        return invalid("the call has no base version".into());
    };
    let head = head_version(conn, &key).await?;
    if head != base as u64 {
        return Ok(Some(CallError::new(
            ErrorKind::WorkspaceConflict,
            format!("workspace {key} is at version {head}, not at {base} where the call started"),
        )));
    }
    if let Err(exceeded) = workspace::Limits::default().check(&commit.tree) {
        return Ok(Some(CallError::new(
            ErrorKind::WorkspaceLimit,
            exceeded.to_string(),
        )));
    }
    if let Err(error) = commit.tree.validate() {
        return invalid(error.to_string());
    }
    let mut sent = HashSet::new();
    for (digest, bytes) in &commit.blobs {
        if workspace::blob_digest(bytes) != *digest {
            return invalid(format!("blob {digest} does not match its bytes"));
        }
        sent.insert(digest.as_str());
    }
    let missing: Vec<String> = commit
        .tree
        .files
        .values()
        .map(|f| f.digest.clone())
        .filter(|d| !sent.contains(d.as_str()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let stored = stored_blobs(conn, &missing).await?;
    if let Some(absent) = missing.iter().find(|d| !stored.contains(*d)) {
        return invalid(format!("blob {absent} was neither sent nor stored"));
    }
    for (path, file) in &commit.tree.files {
        if let Some((_, bytes)) = commit.blobs.iter().find(|(d, _)| *d == file.digest)
            && bytes.len() as u64 != file.size
        {
            return invalid(format!(
                "{path}: size {} does not match its blob",
                file.size
            ));
        }
    }
    Ok(None)
}

/// Which of `digests` are stored.
async fn stored_blobs(
    conn: &mut AnyConnection,
    digests: &[String],
) -> Result<HashSet<String>, StoreError> {
    let mut out = HashSet::new();
    for chunk in digests.chunks(100) {
        let sql = format!(
            "SELECT digest FROM workspace_blobs WHERE digest IN ({})",
            placeholders(1, chunk.len())
        );
        // Only numbered placeholders are formatted into the statement.
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for digest in chunk {
            query = query.bind(digest.as_str());
        }
        for row in query.fetch_all(&mut *conn).await? {
            out.insert(row.try_get::<String, _>("digest")?);
        }
    }
    Ok(out)
}

/// Writes a commit as version `base + 1` of the call's workspace (checked by
/// [`commit_refusal`] in the same transaction).
async fn commit_version(
    conn: &mut AnyConnection,
    call_id: &str,
    commit: &workspace::Commit,
) -> Result<(), StoreError> {
    let row = sqlx::query("SELECT namespace, spec_json, workspace_base FROM calls WHERE id = $1")
        .bind(call_id)
        .fetch_one(&mut *conn)
        .await?;
    let namespace: String = row.try_get("namespace")?;
    let spec: CallSpec = parse_json(&row.try_get::<String, _>("spec_json")?, "spec")?;
    let key = WorkspaceKey::written_by(&namespace, &spec.access)
        .ok_or_else(|| StoreError::Corrupt(format!("call {call_id} writes no workspace")))?;
    let base = row
        .try_get::<Option<i64>, _>("workspace_base")?
        .ok_or_else(|| StoreError::Corrupt(format!("call {call_id} has no base version")))?;
    insert_version(conn, &key, base as u64 + 1, commit, call_id).await
}

/// Inserts version `version` of workspace `key` with the blobs it brings.
async fn insert_version(
    conn: &mut AnyConnection,
    key: &WorkspaceKey,
    version: u64,
    commit: &workspace::Commit,
    call_id: &str,
) -> Result<(), StoreError> {
    let now = now_ms();
    for (digest, bytes) in &commit.blobs {
        sqlx::query(
            "INSERT INTO workspace_blobs (digest, size, bytes, created_at_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(digest.as_str())
        .bind(bytes.len() as i64)
        .bind(bytes.as_slice())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(
        "INSERT INTO workspace_versions (namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(key.namespace.as_str())
    .bind(key.agent.as_str())
    .bind(version as i64)
    .bind(commit.tree.to_json())
    .bind(commit.tree.digest())
    .bind(now)
    .bind(call_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn version_from_row(row: &AnyRow) -> Result<workspace::Version, StoreError> {
    let tree = workspace::Tree::from_json(&row.try_get::<String, _>("tree_json")?)
        .map_err(|e| StoreError::Corrupt(format!("workspace tree: {e}")))?;
    Ok(workspace::Version {
        key: WorkspaceKey::new(
            row.try_get::<String, _>("namespace")?,
            row.try_get::<String, _>("agent")?,
        ),
        version: row.try_get::<i64, _>("version")? as u64,
        tree,
        tree_digest: row.try_get("tree_digest")?,
        created_at_ms: row.try_get("created_at_ms")?,
        call_id: row.try_get("call_id")?,
    })
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
    conn: &mut AnyConnection,
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
            sqlx::query(
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
    let mut rows: Vec<(EntryKind, Value, Option<i64>)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let (kind, payload) = e.to_parts();
            (kind, payload, Some((first_wseq + i as u64) as i64))
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
        let (kind, payload) = entry.to_parts();
        rows.push((kind, payload, None));
    }
    insert_entries(conn, call_id, first, epoch as i64, &rows, now).await?;
    match outcome {
        Some(_) => Ok(Some(call_from_row(&row)?)),
        None => Ok(None),
    }
}

/// Entries per INSERT statement (7 parameters each, well under every backend's limit).
const ENTRIES_PER_INSERT: usize = 100;

/// Writes consecutive entries from sequence number `first`, many rows per statement.
async fn insert_entries(
    conn: &mut AnyConnection,
    call_id: &str,
    first: i64,
    epoch: i64,
    rows: &[(EntryKind, Value, Option<i64>)],
    now: i64,
) -> Result<(), StoreError> {
    for (chunk_index, chunk) in rows.chunks(ENTRIES_PER_INSERT).enumerate() {
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
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (i, (kind, payload, wseq)) in chunk.iter().enumerate() {
            let seq = first + (chunk_index * ENTRIES_PER_INSERT + i) as i64;
            query = query
                .bind(call_id)
                .bind(seq)
                .bind(epoch)
                .bind(kind.as_str())
                .bind(payload.to_string())
                .bind(now)
                .bind(*wseq);
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
         WHERE id = $1 AND state IN ('awaiting-approval', 'pending', 'running') RETURNING next_seq, epoch",
    )
    .bind(call_id)
    .bind(json_text(error))
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = row {
        let seq: i64 = row.try_get::<i64, _>("next_seq")? - 1;
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
    conn: &mut AnyConnection,
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
    let row = sqlx::query("SELECT COUNT(*) AS n FROM oplog WHERE call_id = $1 AND kind = $2")
        .bind(call_id)
        .bind(EntryKind::HttpRequest.as_str())
        .fetch_one(&mut *conn)
        .await?;
    let requests: i64 = row.try_get("n")?;
    let error = crate::call::stopped_error(
        ErrorKind::Cancelled,
        reason,
        &call.spec.effect,
        requests.max(0) as u64,
    );
    fail(conn, call_id, &error).await
}

/// Decides a call awaiting approval, in the writer's transaction: the conditional update
/// (`state = 'awaiting-approval'`) is what lets only one of two concurrent decisions win,
/// across connections and replicas alike.
async fn decide(
    conn: &mut AnyConnection,
    call_id: &str,
    decision: &ApprovalDecision,
    error: Option<&CallError>,
) -> Result<CallRecord, StoreError> {
    let now = now_ms();
    let row = sqlx::query("SELECT state, spec_json FROM calls WHERE id = $1")
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
    let mut spec: CallSpec = parse_json(&row.try_get::<String, _>("spec_json")?, "spec")?;
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
    let updated = sqlx::query(
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
    let first = updated.try_get::<i64, _>("next_seq")? - entries;
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
/// it ([`crate::middleware::audit::record_of`], keyed by the call's id): a call gets one
/// record however often its end is written again. Every path that ends a call calls it.
async fn insert_audit(conn: &mut AnyConnection, call: &CallRecord) -> Result<(), StoreError> {
    let at = call.finished_at_ms.unwrap_or_else(now_ms);
    let record = crate::middleware::audit::record_of(call, at);
    write_audit(conn, &call.id, &record).await
}

/// Inserts one audit record under `seq_id` (a sortable unique id: the call's id, or a
/// fresh UUIDv7 for a refusal); an id already written is left as it is (append-only).
async fn write_audit(
    conn: &mut AnyConnection,
    seq_id: &str,
    record: &AuditRecord,
) -> Result<(), StoreError> {
    sqlx::query(
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
            state: row
                .try_get::<String, _>("state")
                .ok()
                .and_then(|s| CallState::parse(&s))
                .unwrap_or(CallState::Failed),
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
    agent: &str,
    key: &str,
) -> Result<Option<CallRecord>, StoreError> {
    let row = sqlx::query(concat!(
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
    async fn decide_approval(
        &self,
        call_id: &str,
        decision: ApprovalDecision,
        error: Option<CallError>,
    ) -> Result<CallRecord, StoreError> {
        match self
            .write(WriteOp::Decide {
                call_id: call_id.into(),
                decision,
                error,
            })
            .await?
        {
            Reply::Record(record) => Ok(*record),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn take_token(
        &self,
        key: &str,
        burst: u32,
        per_second: f64,
        now_ms: i64,
    ) -> Result<Option<u64>, StoreError> {
        match self
            .write(WriteOp::TakeToken {
                key: key.into(),
                burst,
                per_second,
                now_ms,
            })
            .await?
        {
            Reply::Token(answer) => Ok(answer),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn append_audit(&self, record: AuditRecord) -> Result<(), StoreError> {
        self.write(WriteOp::AppendAudit(Box::new(record)))
            .await
            .map(|_| ())
    }

    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, StoreError> {
        let limit = if filter.limit == 0 {
            100
        } else {
            filter.limit.min(10_000)
        };
        let rows = sqlx::query(
            "SELECT record_json FROM audit WHERE ($1 = '' OR namespace = $1) \
             AND ($2 = '' OR agent = $2) AND ($3 = '' OR tool = $3) AND at_ms >= $4 \
             ORDER BY at_ms DESC, seq_id DESC LIMIT $5",
        )
        .bind(filter.namespace.as_deref().unwrap_or(""))
        .bind(filter.agent.as_deref().unwrap_or(""))
        .bind(filter.tool.as_deref().unwrap_or(""))
        .bind(filter.since_ms.unwrap_or(i64::MIN))
        .bind(i64::from(limit))
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| parse_json(&row.try_get::<String, _>("record_json")?, "audit record"))
            .collect()
    }

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
        first_wseq: u64,
        entries: Vec<OplogEntry>,
    ) -> Result<(), StoreError> {
        self.write(WriteOp::Append {
            call_id: call_id.into(),
            epoch,
            first_wseq,
            entries,
        })
        .await
        .map(|_| ())
    }

    async fn complete_call(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
        outcome: CallOutcome,
    ) -> Result<CallRecord, StoreError> {
        match self
            .write(WriteOp::Complete {
                call_id: call_id.into(),
                epoch,
                first_wseq,
                entries,
                outcome,
            })
            .await?
        {
            Reply::Record(record) => Ok(*record),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    async fn commit_workspace(
        &self,
        key: &WorkspaceKey,
        base: u64,
        commit: workspace::Commit,
        call_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        match self
            .write(WriteOp::CommitWorkspace {
                key: key.clone(),
                base,
                commit,
                call_id: call_id.into(),
            })
            .await?
        {
            Reply::Epoch(version) => Ok(Some(version)),
            Reply::Done => Ok(None),
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

    async fn cancel_call(&self, call_id: &str, reason: &str) -> Result<CallRecord, StoreError> {
        match self
            .write(WriteOp::Cancel {
                call_id: call_id.into(),
                reason: reason.into(),
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
        agent: &str,
        key: &str,
    ) -> Result<Option<CallRecord>, StoreError> {
        let mut conn = self.reads.acquire().await?;
        select_by_key(&mut conn, namespace, agent, key).await
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
             AND ($4 = '' OR agent = $4) AND ($5 = '' OR state = $5) \
             ORDER BY created_at_ms DESC, id DESC LIMIT $3"
        ))
        .bind(filter.namespace.as_deref().unwrap_or(""))
        .bind(filter.tool.as_deref().unwrap_or(""))
        .bind(i64::from(limit))
        .bind(filter.agent.as_deref().unwrap_or(""))
        .bind(filter.state.map(CallState::as_str).unwrap_or(""))
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
                    payload: row.try_get("payload")?,
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

    async fn delete_finished_before(
        &self,
        cutoff_ms: i64,
        keep_artifacts: &HashSet<String>,
    ) -> Result<RetentionReport, StoreError> {
        let mut report = RetentionReport::default();
        // One bounded transaction per batch: other writes go between them.
        loop {
            let reply = self
                .write(WriteOp::PurgeCalls {
                    cutoff_ms,
                    limit: RETENTION_BATCH,
                })
                .await?;
            let Reply::Purged { calls, entries } = reply else {
                return Err(StoreError::Corrupt("unexpected writer reply".into()));
            };
            report.calls += calls;
            report.oplog_entries += entries;
            if calls < RETENTION_BATCH as u64 {
                break;
            }
        }
        let reply = self
            .write(WriteOp::PurgeArtifacts {
                cutoff_ms,
                keep: keep_artifacts.clone(),
            })
            .await?;
        let Reply::PurgedArtifacts(artifacts) = reply else {
            return Err(StoreError::Corrupt("unexpected writer reply".into()));
        };
        if !artifacts.is_empty() {
            self.artifact_purges.fetch_add(1, Ordering::SeqCst);
        }
        report.artifacts = artifacts;
        Ok(report)
    }

    async fn call_workspace(
        &self,
        call_id: &str,
    ) -> Result<Option<super::CallWorkspace>, StoreError> {
        let row = sqlx::query(
            "SELECT namespace, spec_json, workspace_base, state, epoch FROM calls WHERE id = $1",
        )
        .bind(call_id)
        .fetch_optional(&self.reads)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let namespace: String = row.try_get("namespace")?;
        let spec: CallSpec = parse_json(&row.try_get::<String, _>("spec_json")?, "spec")?;
        let Some(key) = WorkspaceKey::of_call(&namespace, &spec.access) else {
            return Ok(None);
        };
        let state: String = row.try_get("state")?;
        Ok(Some(super::CallWorkspace {
            key,
            filesystem: spec.access.filesystem,
            base: row
                .try_get::<Option<i64>, _>("workspace_base")?
                .map(|v| v as u64),
            state: CallState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("call state {state:?}")))?,
            epoch: row.try_get::<i64, _>("epoch")? as u64,
        }))
    }

    async fn workspace_head(&self, key: &WorkspaceKey) -> Result<workspace::Version, StoreError> {
        let row = sqlx::query(
            "SELECT namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id \
             FROM workspace_versions WHERE namespace = $1 AND agent = $2 \
             ORDER BY version DESC LIMIT 1",
        )
        .bind(key.namespace.as_str())
        .bind(key.agent.as_str())
        .fetch_optional(&self.reads)
        .await?;
        match row {
            Some(row) => version_from_row(&row),
            None => Ok(workspace::Version::empty(key.clone())),
        }
    }

    async fn workspace_version(
        &self,
        key: &WorkspaceKey,
        version: u64,
    ) -> Result<Option<workspace::Version>, StoreError> {
        if version == 0 {
            return Ok(Some(workspace::Version::empty(key.clone())));
        }
        let row = sqlx::query(
            "SELECT namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id \
             FROM workspace_versions WHERE namespace = $1 AND agent = $2 AND version = $3",
        )
        .bind(key.namespace.as_str())
        .bind(key.agent.as_str())
        .bind(version.min(i64::MAX as u64) as i64)
        .fetch_optional(&self.reads)
        .await?;
        row.map(|row| version_from_row(&row)).transpose()
    }

    async fn workspace_history(
        &self,
        key: &WorkspaceKey,
    ) -> Result<Vec<workspace::Version>, StoreError> {
        let rows = sqlx::query(
            "SELECT namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id \
             FROM workspace_versions WHERE namespace = $1 AND agent = $2 ORDER BY version",
        )
        .bind(key.namespace.as_str())
        .bind(key.agent.as_str())
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(version_from_row).collect()
    }

    async fn blobs(&self, digests: &[String]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for chunk in digests.chunks(100) {
            let sql = format!(
                "SELECT digest, bytes FROM workspace_blobs WHERE digest IN ({})",
                placeholders(1, chunk.len())
            );
            // Only numbered placeholders are formatted into the statement.
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for digest in chunk {
                query = query.bind(digest.as_str());
            }
            for row in query.fetch_all(&self.reads).await? {
                out.push((row.try_get("digest")?, row.try_get("bytes")?));
            }
        }
        Ok(out)
    }

    fn artifact_purges(&self) -> u64 {
        self.artifact_purges.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors_are_told_from_permanent_ones() {
        use std::io::{Error, ErrorKind};
        assert!(is_transient(&sqlx::Error::Io(Error::new(
            ErrorKind::ConnectionRefused,
            "refused"
        ))));
        assert!(is_transient(&sqlx::Error::Io(Error::other("disk"))));
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(is_transient(&sqlx::Error::Protocol("eof".into())));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert!(!is_transient(&sqlx::Error::PoolClosed));
        assert!(!is_transient(&sqlx::Error::ColumnNotFound("x".into())));

        // SQLite extended result codes.
        for code in [
            "5", "517", "261", "6", "262", "10", "266", "3850", "13", "14",
        ] {
            assert!(transient_code(code), "SQLite {code}");
        }
        for code in ["1", "19", "2067", "1555", "11", "8"] {
            assert!(!transient_code(code), "SQLite {code}");
        }
        // PostgreSQL SQLSTATEs.
        for code in [
            "08000", "08006", "08001", "57P01", "57P02", "57P03", "53100", "53300", "58030",
            "40001", "40P01",
        ] {
            assert!(transient_code(code), "PostgreSQL {code}");
        }
        for code in ["23505", "42601", "42P01", "22P02", "25P02"] {
            assert!(!transient_code(code), "PostgreSQL {code}");
        }
        assert!(!transient_code("busy"));
    }

    #[tokio::test]
    async fn real_errors_are_classified() {
        sqlx::any::install_default_drivers();
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let pool = pool_options(Backend::Sqlite, 1, Duration::from_millis(10))
            .connect(&url)
            .await
            .unwrap();
        let syntax = sqlx::query("SELEC 1").execute(&pool).await.unwrap_err();
        assert!(!is_transient(&syntax), "{syntax}");
        sqlx::query("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&pool)
            .await
            .unwrap();
        let unique = sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(!is_transient(&unique), "{unique}");

        // Another connection holds the write lock past the busy timeout.
        let other = pool_options(Backend::Sqlite, 1, Duration::from_millis(10))
            .connect(&url)
            .await
            .unwrap();
        let mut holder = other.acquire().await.unwrap();
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut *holder)
            .await
            .unwrap();
        let busy = sqlx::query("INSERT INTO t VALUES (2)")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(is_transient(&busy), "{busy}");
        sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
    }

    #[tokio::test]
    async fn retrying_gives_up_with_unavailable() {
        let policy = RetryPolicy {
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(4),
            give_up_after: Duration::from_millis(40),
        };
        let result: Result<(), StoreError> = retrying(policy, |_| async {
            Err(StoreError::Database(sqlx::Error::PoolTimedOut))
        })
        .await;
        assert!(
            matches!(result, Err(StoreError::Unavailable { attempts, .. }) if attempts > 3),
            "{result:?}"
        );
        let mut seen = 0;
        let result = retrying(policy, |tried| {
            seen = tried;
            async move {
                if tried < 2 {
                    Err(StoreError::Database(sqlx::Error::PoolTimedOut))
                } else {
                    Ok(tried)
                }
            }
        })
        .await;
        assert_eq!(result.unwrap(), 2);
        assert_eq!(seen, 2);
        let result: Result<(), StoreError> = retrying(policy, |_| async {
            Err(StoreError::Database(sqlx::Error::RowNotFound))
        })
        .await;
        assert!(
            matches!(result, Err(StoreError::Database(_))),
            "permanent: no retry"
        );
    }
}
