//! The schema: its steps, applied in order at open.

use super::Backend;
use crate::StoreError;
use sqlx::{AnyPool, AssertSqlSafe, Row};

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
    // Console sessions: the SHA-256 of each session id, who it is, when it lapses.
    Migration {
        version: 7,
        statements: |_| {
            vec![
                "CREATE TABLE IF NOT EXISTS console_sessions (
                    id_hash TEXT PRIMARY KEY,
                    principal_kind TEXT NOT NULL,
                    principal_namespace TEXT NOT NULL,
                    principal_name TEXT NOT NULL,
                    created_at_ms BIGINT NOT NULL,
                    last_seen_ms BIGINT NOT NULL,
                    idle_timeout_ms BIGINT NOT NULL,
                    expires_at_ms BIGINT NOT NULL
                )"
                .into(),
                "CREATE INDEX IF NOT EXISTS console_sessions_by_expiry ON console_sessions (expires_at_ms)"
                    .into(),
            ]
        },
    },
    // Canary rollouts: where each binding's is.
    Migration {
        version: 8,
        statements: |_| {
            vec![
                "CREATE TABLE IF NOT EXISTS rollouts (
                    namespace TEXT NOT NULL,
                    binding TEXT NOT NULL,
                    canary TEXT NOT NULL,
                    phase TEXT NOT NULL,
                    step BIGINT NOT NULL,
                    step_started_ms BIGINT NOT NULL,
                    message TEXT NOT NULL,
                    stable_calls BIGINT NOT NULL,
                    stable_errors BIGINT NOT NULL,
                    canary_calls BIGINT NOT NULL,
                    canary_errors BIGINT NOT NULL,
                    PRIMARY KEY (namespace, binding)
                )"
                .into(),
            ]
        },
    },
    // The calls not ended, by state and age, in an index of their own (partial: a call
    // leaves it when it ends), in place of an index of every call by state: listing the
    // calls awaiting approval, and finding the unfinished ones at start, read only those; a
    // call's end removes one entry and adds none.
    Migration {
        version: 9,
        statements: |_| {
            vec![
                // Every end has recorded its time; this keeps the index right on a
                // database where one did not.
                "UPDATE calls SET finished_at_ms = created_at_ms \
                 WHERE finished_at_ms IS NULL AND state IN ('succeeded', 'failed')"
                    .into(),
                "CREATE INDEX IF NOT EXISTS calls_unfinished ON calls (state, created_at_ms) \
                 WHERE finished_at_ms IS NULL"
                    .into(),
                "DROP INDEX IF EXISTS calls_by_state".into(),
            ]
        },
    },
    // Command definitions stored once per release and definition, not in every call's row
    // (see `sql/commands.rs`): a call's row names its definition, and the index by release
    // digest holds that name, so the definitions no call names are found by it.
    Migration {
        version: 10,
        statements: |_| {
            vec![
                "CREATE TABLE IF NOT EXISTS call_commands (
                    release_digest TEXT NOT NULL,
                    digest TEXT NOT NULL,
                    definition TEXT NOT NULL,
                    PRIMARY KEY (release_digest, digest)
                )"
                .into(),
                "ALTER TABLE calls ADD COLUMN command_digest TEXT".into(),
                "DROP INDEX IF EXISTS calls_by_digest".into(),
                "CREATE INDEX IF NOT EXISTS calls_by_digest ON calls (release_digest, command_digest)"
                    .into(),
            ]
        },
    },
    // When each artifact was last stored, in a table of its own: retention keeps what was
    // stored since its cutoff, and storing an artifact again refreshes its time. Kept in
    // the artifact's row, the time could not change without SQLite reading the row's blob
    // back and writing the row whole (the Python runtime's module is 104.5 MB). Without
    // it, the bytes are the row's last column, which SQLite can make as a blob of zeros
    // without holding them, for the bytes to be written into in place. On PostgreSQL the
    // bytes are stored uncompressed, so that a piece of them is read without the rest.
    Migration {
        version: 11,
        statements: |backend| {
            let mut statements = vec![
                "CREATE TABLE IF NOT EXISTS artifact_times (
                    digest TEXT PRIMARY KEY,
                    stored_at_ms BIGINT NOT NULL
                )"
                .into(),
                // `WHERE true` tells SQLite's parser that `ON CONFLICT` is not a join's.
                "INSERT INTO artifact_times (digest, stored_at_ms) \
                 SELECT digest, created_at_ms FROM artifacts WHERE true \
                 ON CONFLICT (digest) DO NOTHING"
                    .into(),
                // On SQLite this rewrites each artifact's row, once.
                "ALTER TABLE artifacts DROP COLUMN created_at_ms".into(),
            ];
            if backend == Backend::Postgres {
                // Out of line and uncompressed, so that a piece of an artifact is read
                // without the rest (`sql/slice_reads.rs`); the rows stored before are
                // stored again so.
                statements
                    .push("ALTER TABLE artifacts ALTER COLUMN bytes SET STORAGE EXTERNAL".into());
                statements.push("UPDATE artifacts SET bytes = bytes || ''::bytea".into());
            }
            statements
        },
    },
];

/// The schema version this binary writes; a store at a newer one is refused.
pub const SCHEMA_VERSION: i64 = 11;

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

/// Brings the schema to [`SCHEMA_VERSION`] in one transaction; returns the version found.
pub(super) async fn migrate(pool: &AnyPool, backend: Backend) -> Result<i64, StoreError> {
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
