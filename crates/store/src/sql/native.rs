//! The SQLite writer's own connection: the store's writes run on it, on the writer's
//! thread, each statement a direct call into SQLite.
//!
//! Through sqlx every statement is a round trip to the connection's worker thread (about
//! 40 µs each, nine a call); applying a batch of writes took longer than its commit's
//! `fdatasync`. This connection is opened by the writer on a thread of its own after the
//! schema is upgraded, with the pragmas of sqlx's connections (WAL, foreign keys on, the
//! busy timeout); reads keep sqlx's pool.
//!
//! A commit here does not sync (`synchronous=NORMAL`): the writer's syncer syncs the
//! write-ahead log right after ([`Syncer`](super::sync::Syncer)), which is what
//! `synchronous=FULL` does inside the commit, so that the writer can answer a write that
//! asked to be answered early between the two, and apply the next batch meanwhile (see [`CallLog::create_call_applied`](crate::CallLog::create_call_applied)).
//! Every frame is in the log before its commit returns, and `fdatasync` of the log makes
//! every frame written so far durable: a synced commit is durable with all before it.

use super::Backend;
use super::conn::{Arg, BlobWrites, Conn, NativeRow, Query, Row};
use crate::StoreError;
use async_trait::async_trait;
use rusqlite::CachedStatement;
use rusqlite::OpenFlags;
use rusqlite::types::{Value, ValueRef};
use std::borrow::Cow;
use std::path::Path;
use std::time::Duration;

/// Statements kept prepared (the writes' statements, and the row counts of multi-row
/// inserts, fit).
const STATEMENT_CACHE: usize = 256;

/// How much write-ahead log the writer lets grow before a commit checkpoints it into the
/// database. SQLite's default, 1,000 pages, is 1 MB with this store's 1 KiB pages: under
/// sixteen callers that was dozens of checkpoints a second, each copying pages and syncing
/// the log and the database on the writer's thread while every write waited. With 4 MiB,
/// durable calls under sixteen callers ran 5–7% faster (p99 +1 ms: each checkpoint is
/// longer); 16 MiB ran no faster and doubled the p99 (BENCHMARKS.md).
const WAL_CHECKPOINT_BYTES: i64 = 4 << 20;

/// The size the write-ahead log file is cut back to when it restarts after a checkpoint, if
/// a large commit grew it past that: storing the Python runtime (a 104.5 MB module) left a
/// 107 MB log on disk for good. Twice the checkpoint size, so that under steady writes
/// (checkpointed at 4 MiB, then the log restarts) the file is never cut and grown again.
const WAL_KEPT_BYTES: i64 = 2 * WAL_CHECKPOINT_BYTES;

/// The writer's SQLite connection.
pub(super) struct NativeSqlite {
    conn: rusqlite::Connection,
    /// The write-ahead log (`PATH-wal`), opened at the first sync: it exists while any
    /// connection is open, and this one is open as long as the writer.
    wal_path: std::path::PathBuf,
    /// Why a sync failed, once one has ([`Syncer`](super::sync::Syncer) sets it): every
    /// later batch is refused until the store is opened again.
    sync_failed: SyncFailed,
    /// Whether the open transaction wrote a blob in place ([`BlobWrites`]): its end gives
    /// back the connection's page cache ([`Self::release_cache`]).
    wrote_blob: bool,
}

/// Why a sync of the log failed, once one has (shared by the writer and its syncer).
pub(super) type SyncFailed = std::sync::Arc<std::sync::Mutex<Option<String>>>;

impl NativeSqlite {
    /// Opens the database at `path` (which exists: the schema was upgraded on it).
    pub(super) fn open(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        // Through the VFS that writes a commit's log frames at once (`wal_vfs`).
        let vfs = super::wal_vfs::register()
            .map_err(|e| StoreError::Database(sqlx::Error::Configuration(e.into())))?;
        let conn = rusqlite::Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            vfs,
        )
        .map_err(database)?;
        conn.busy_timeout(busy_timeout).map_err(database)?;
        // WAL lets readers run beside the writer; NORMAL commits without a sync, which the
        // syncer does after each commit (and SQLite before each checkpoint).
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
        )
        .map_err(database)?;
        let page_size: i64 = conn
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .map_err(database)?;
        conn.pragma_update(
            None,
            "wal_autocheckpoint",
            WAL_CHECKPOINT_BYTES / page_size.max(512),
        )
        .map_err(database)?;
        conn.pragma_update(None, "journal_size_limit", WAL_KEPT_BYTES)
            .map_err(database)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let mut wal_path = path.as_os_str().to_owned();
        wal_path.push("-wal");
        Ok(NativeSqlite {
            conn,
            wal_path: wal_path.into(),
            sync_failed: SyncFailed::default(),
            wrote_blob: false,
        })
    }

    /// Syncs the log at `path` instead (a test's way to make syncs fail).
    #[cfg(test)]
    pub(super) fn set_wal_path(&mut self, path: std::path::PathBuf) {
        self.wal_path = path;
    }

    /// The write-ahead log's path and the flag its syncer sets when a sync fails.
    pub(super) fn wal(&self) -> (std::path::PathBuf, SyncFailed) {
        (self.wal_path.clone(), self.sync_failed.clone())
    }

    /// Begins a write transaction, taking the database's write lock at once (waiting up to
    /// the busy timeout for another connection's).
    pub(super) fn begin(&mut self) -> Result<(), StoreError> {
        let failed = self
            .sync_failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(failed) = failed {
            return Err(StoreError::NotDurable(format!(
                "an earlier sync failed ({failed}); open the store again"
            )));
        }
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(database)
    }

    pub(super) fn commit(&mut self) -> Result<(), StoreError> {
        let committed = self.conn.execute_batch("COMMIT").map_err(database);
        self.release_cache();
        committed
    }

    /// Rolls back the open transaction, if one is still open (a failed COMMIT may have
    /// ended it already).
    pub(super) fn rollback(&mut self) {
        if !self.conn.is_autocommit()
            && let Err(error) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::warn!(%error, "store writer: rollback failed");
        }
        self.release_cache();
    }

    /// After a transaction that wrote a blob, frees the pages the connection's cache holds
    /// (`PRAGMA shrink_memory`). Writing an artifact fills the cache (about 2 MiB, SQLite's
    /// default) with pages of the artifact's bytes, which no write reads again; the cache
    /// kept them until other writes displaced them, and an idle control plane never made
    /// those (BENCHMARKS.md). The calls' pages come back from the operating system's cache
    /// as the next writes read them.
    fn release_cache(&mut self) {
        if !self.wrote_blob || !self.conn.is_autocommit() {
            return;
        }
        self.wrote_blob = false;
        if let Err(error) = self.conn.execute_batch("PRAGMA shrink_memory") {
            tracing::warn!(%error, "store writer: its page cache was not freed");
        }
        // SQLite allocates with the C library's malloc, which keeps what it freed between
        // chunks still in use: glibc gives those pages back only when asked.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: no arguments to uphold; it only returns free memory to the system.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Prepares `query` (from the cache when it ran before) and binds its arguments: a
    /// `$N` parameter takes the N-th argument, wherever and however often it appears.
    fn prepare(&self, query: &Query<'_>) -> Result<CachedStatement<'_>, StoreError> {
        let mut statement = self.conn.prepare_cached(query.sql()).map_err(database)?;
        for index in 1..=statement.parameter_count() {
            let number = statement
                .parameter_name(index)
                .and_then(|name| name.strip_prefix('$').or(name.strip_prefix('?')))
                .and_then(|number| number.parse::<usize>().ok())
                .unwrap_or(index);
            let arg = number
                .checked_sub(1)
                .and_then(|at| query.args().get(at))
                .ok_or_else(|| {
                    StoreError::Database(sqlx::Error::Encode(
                        format!(
                            "statement parameter ${number} has no argument ({} given)",
                            query.args().len()
                        )
                        .into(),
                    ))
                })?;
            let bound = match arg {
                Arg::Int(value) => statement.raw_bind_parameter(index, value),
                Arg::Real(value) => statement.raw_bind_parameter(index, value),
                Arg::Text(value) => {
                    statement.raw_bind_parameter(index, value.as_deref() as Option<&str>)
                }
                Arg::Blob(value) => {
                    statement.raw_bind_parameter(index, value.as_deref() as Option<&[u8]>)
                }
            };
            bound.map_err(database)?;
        }
        Ok(statement)
    }

    /// Runs `query`, keeping at most `limit` of its rows.
    fn rows(&self, query: &Query<'_>, limit: usize) -> Result<Vec<Row>, StoreError> {
        let mut statement = self.prepare(query)?;
        let columns: std::sync::Arc<[String]> = statement
            .column_names()
            .into_iter()
            .map(String::from)
            .collect();
        let mut rows = statement.raw_query();
        let mut out = Vec::new();
        while out.len() < limit
            && let Some(row) = rows.next().map_err(database)?
        {
            let values = (0..columns.len())
                .map(|i| row.get_ref(i).map(owned))
                .collect::<Result<Vec<_>, _>>()
                .map_err(database)?;
            out.push(Row::Native(NativeRow {
                columns: columns.clone(),
                values,
            }));
        }
        Ok(out)
    }
}

#[async_trait]
impl Conn for NativeSqlite {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn execute(&mut self, query: Query<'_>) -> Result<u64, StoreError> {
        {
            let mut statement = self.prepare(&query)?;
            let mut rows = statement.raw_query();
            while rows.next().map_err(database)?.is_some() {}
        }
        Ok(self.conn.changes())
    }

    async fn fetch_all(&mut self, query: Query<'_>) -> Result<Vec<Row>, StoreError> {
        self.rows(&query, usize::MAX)
    }

    async fn fetch_optional(&mut self, query: Query<'_>) -> Result<Option<Row>, StoreError> {
        Ok(self.rows(&query, 1)?.pop())
    }

    fn blob_writes(&mut self) -> Option<&mut dyn BlobWrites> {
        Some(self)
    }
}

impl BlobWrites for NativeSqlite {
    fn write_blob(
        &mut self,
        table: &'static str,
        column: &'static str,
        rowid: i64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.wrote_blob = true;
        let mut blob = self
            .conn
            .blob_open(rusqlite::MAIN_DB, table, column, rowid, false)
            .map_err(database)?;
        blob.write_at(bytes, 0).map_err(database)
    }
}

/// An SQLite error as the store's database error, its extended result code kept so that
/// [`is_transient`](super::is_transient) tells a busy database from a bad statement.
pub(super) fn database(error: rusqlite::Error) -> StoreError {
    let (code, message) = match &error {
        rusqlite::Error::SqliteFailure(failure, message) => (
            Some(failure.extended_code),
            message.clone().unwrap_or_else(|| failure.to_string()),
        ),
        other => (None, other.to_string()),
    };
    StoreError::Database(sqlx::Error::Database(Box::new(SqliteError {
        code,
        message,
        source: error,
    })))
}

/// An error of the native connection, as sqlx's database errors are.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct SqliteError {
    code: Option<i32>,
    message: String,
    source: rusqlite::Error,
}

impl sqlx::error::DatabaseError for SqliteError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        self.code.map(|code| Cow::Owned(code.to_string()))
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use rusqlite::ffi;
        match self.code {
            Some(ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY) => {
                sqlx::error::ErrorKind::UniqueViolation
            }
            Some(ffi::SQLITE_CONSTRAINT_FOREIGNKEY) => sqlx::error::ErrorKind::ForeignKeyViolation,
            Some(ffi::SQLITE_CONSTRAINT_NOTNULL) => sqlx::error::ErrorKind::NotNullViolation,
            Some(ffi::SQLITE_CONSTRAINT_CHECK) => sqlx::error::ErrorKind::CheckViolation,
            _ => sqlx::error::ErrorKind::Other,
        }
    }
}

/// A column's value, owned.
fn owned(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(match std::str::from_utf8(t) {
            Ok(text) => text.to_owned(),
            // SQLite does not check that what it stores as text is UTF-8.
            Err(_) => String::from_utf8_lossy(t).into_owned(),
        }),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::conn::query;
    use crate::sql::is_transient;
    use rusqlite::ffi;

    /// SQLite as `.cargo/config.toml` builds it (`LIBSQLITE3_FLAGS`): a page cache per
    /// connection and no memory statistics, so the writer takes no process-wide lock at each
    /// page it fetches or block it allocates.
    #[test]
    fn sqlite_is_built_without_its_process_wide_locks() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut statement = conn.prepare("PRAGMA compile_options").unwrap();
        let options: Vec<String> = statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
        assert!(options.iter().any(|o| o == "THREADSAFE=1"), "{options:?}");
    }

    fn open(dir: &tempfile::TempDir, busy: Duration) -> NativeSqlite {
        let path = dir.path().join("t.db");
        rusqlite::Connection::open(&path).unwrap();
        NativeSqlite::open(&path, busy).unwrap()
    }

    fn database_error(error: StoreError) -> sqlx::Error {
        match error {
            StoreError::Database(error) => error,
            other => panic!("not a database error: {other:?}"),
        }
    }

    #[tokio::test]
    async fn numbered_parameters_bind_by_number_wherever_they_appear() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir, Duration::from_millis(10));
        query("CREATE TABLE t (a INTEGER, b TEXT, c BLOB, d REAL)")
            .execute(&mut conn)
            .await
            .unwrap();
        // $2 before $1, $1 twice.
        let changed = query("INSERT INTO t (b, a, c, d) VALUES ($2, $1, $3, $1 * 1.5)")
            .bind(4i64)
            .bind("four")
            .bind(&b"\x00\x01"[..])
            .execute(&mut conn)
            .await
            .unwrap();
        assert_eq!(changed, 1);
        query("INSERT INTO t (a, b) VALUES ($1, $2)")
            .bind(None::<i64>)
            .bind(None::<String>)
            .execute(&mut conn)
            .await
            .unwrap();
        let rows = query("SELECT a, b, c, d FROM t ORDER BY a")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].try_get::<Option<i64>>("a").unwrap(), None);
        assert_eq!(rows[0].try_get::<Option<String>>("b").unwrap(), None);
        assert_eq!(rows[1].try_get::<i64>("a").unwrap(), 4);
        assert_eq!(rows[1].try_get::<String>("b").unwrap(), "four");
        assert_eq!(rows[1].try_get::<Vec<u8>>("c").unwrap(), vec![0, 1]);
        assert_eq!(rows[1].try_get::<f64>("d").unwrap(), 6.0);
        let one = query("SELECT b FROM t WHERE a = $1")
            .bind(4i64)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(one.try_get::<String>("b").unwrap(), "four");

        // A missing column and a wrong type are named errors.
        let missing = database_error(one.try_get::<String>("nope").unwrap_err());
        assert!(matches!(missing, sqlx::Error::ColumnNotFound(ref c) if c == "nope"));
        let wrong = database_error(one.try_get::<i64>("b").unwrap_err());
        assert!(matches!(wrong, sqlx::Error::ColumnDecode { ref index, .. } if index == "b"));
        assert!(matches!(
            query("SELECT b FROM t WHERE a = $1")
                .bind(5i64)
                .fetch_one(&mut conn)
                .await,
            Err(StoreError::Database(sqlx::Error::RowNotFound))
        ));
    }

    /// A database in `dir` with 1 KiB pages and a table `t (v BLOB)`, opened as the writer's.
    fn blob_table(dir: &tempfile::TempDir) -> (NativeSqlite, std::path::PathBuf) {
        let path = dir.path().join("t.db");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "PRAGMA page_size=1024; PRAGMA journal_mode=WAL; CREATE TABLE t (v BLOB)",
            )
            .unwrap();
        let conn = NativeSqlite::open(&path, Duration::from_millis(100)).unwrap();
        (conn, path)
    }

    /// The log is checkpointed into the database once it holds about 4 MiB of pages, not
    /// SQLite's 1,000 pages (1 MB with 1 KiB pages).
    #[tokio::test]
    async fn the_log_grows_to_its_checkpoint_size_before_the_database_does() {
        let dir = tempfile::tempdir().unwrap();
        let (mut conn, path) = blob_table(&dir);
        let database_bytes = || std::fs::metadata(&path).unwrap().len();
        let write = |conn: &mut NativeSqlite, commits: usize| {
            for _ in 0..commits {
                conn.conn
                    .execute("INSERT INTO t (v) VALUES (zeroblob(100000))", [])
                    .unwrap();
            }
        };
        let before = database_bytes();
        // 2 MB in 20 commits: past SQLite's default, short of ours; nothing copied yet.
        write(&mut conn, 20);
        assert_eq!(database_bytes(), before, "checkpointed before 4 MiB of log");
        // 3 MB more: a commit past 4 MiB checkpoints, and the database holds the rows.
        write(&mut conn, 30);
        assert!(
            database_bytes() > before + (3 << 20),
            "not checkpointed past 4 MiB: {} bytes",
            database_bytes()
        );
    }

    /// A commit larger than the checkpoint size grows the log file; the file is cut back to
    /// 8 MiB once the log restarts after the checkpoint, not kept at its largest.
    #[tokio::test]
    async fn the_log_file_is_cut_back_after_a_large_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = blob_table(&dir);
        let wal = dir.path().join("t.db-wal");
        let log_bytes = || std::fs::metadata(&wal).unwrap().len();
        // One commit of 20 MB: a log of 20 MB and more, checkpointed at its commit.
        conn.conn
            .execute("INSERT INTO t (v) VALUES (zeroblob(20000000))", [])
            .unwrap();
        assert!(log_bytes() > 20_000_000, "log of {} bytes", log_bytes());
        // The next commit restarts the log from its start and cuts the file back.
        conn.conn
            .execute("INSERT INTO t (v) VALUES (zeroblob(1000))", [])
            .unwrap();
        assert!(
            log_bytes() <= WAL_KEPT_BYTES as u64,
            "the log file kept {} bytes",
            log_bytes()
        );
        // Both rows are there.
        let rows: i64 = conn
            .conn
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 2);
    }

    /// The bytes of pages the connection's cache holds (`SQLITE_DBSTATUS_CACHE_USED`).
    fn cache_used(conn: &NativeSqlite) -> i32 {
        let (mut current, mut highest) = (0, 0);
        // SAFETY: the handle is the open connection's, used on this thread only, and both
        // out-pointers are valid for the call.
        let status = unsafe {
            ffi::sqlite3_db_status(
                conn.conn.handle(),
                ffi::SQLITE_DBSTATUS_CACHE_USED,
                &mut current,
                &mut highest,
                0,
            )
        };
        assert_eq!(status, ffi::SQLITE_OK);
        current
    }

    /// A transaction that wrote a blob in place leaves the connection's page cache empty
    /// when it commits (and when it rolls back), not full of the blob's pages; other
    /// transactions keep their cache.
    #[tokio::test]
    async fn a_blob_written_does_not_stay_in_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (mut conn, _) = blob_table(&dir);
        let bytes = vec![7u8; 8 << 20];
        for end in ["commit", "rollback"] {
            conn.begin().unwrap();
            conn.conn
                .execute(
                    "INSERT INTO t (v) VALUES (zeroblob(?1))",
                    [bytes.len() as i64],
                )
                .unwrap();
            let rowid = conn.conn.last_insert_rowid();
            conn.write_blob("t", "v", rowid, &bytes).unwrap();
            assert!(
                cache_used(&conn) > 1 << 20,
                "the blob's pages were never cached: {} bytes",
                cache_used(&conn)
            );
            match end {
                "commit" => conn.commit().unwrap(),
                _ => conn.rollback(),
            }
            assert!(
                cache_used(&conn) < 64 << 10,
                "after the {end}, the cache holds {} bytes",
                cache_used(&conn)
            );
        }
        // A transaction without a blob keeps what it cached.
        conn.begin().unwrap();
        for _ in 0..100 {
            conn.conn
                .execute("INSERT INTO t (v) VALUES (zeroblob(10000))", [])
                .unwrap();
        }
        conn.commit().unwrap();
        assert!(
            cache_used(&conn) > 512 << 10,
            "a write without a blob lost its cache: {} bytes",
            cache_used(&conn)
        );
        // The committed blob reads back whole.
        let stored: Vec<u8> = conn
            .conn
            .query_row("SELECT v FROM t WHERE rowid = 1", [], |row| row.get(0))
            .unwrap();
        assert!(stored == bytes);
    }

    #[tokio::test]
    async fn a_missing_argument_is_refused_not_retried() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir, Duration::from_millis(10));
        let error = database_error(
            query("SELECT $1 + $2 AS n")
                .bind(1i64)
                .fetch_all(&mut conn)
                .await
                .err()
                .unwrap(),
        );
        assert!(matches!(error, sqlx::Error::Encode(_)), "{error}");
        assert!(!is_transient(&error));
    }

    #[tokio::test]
    async fn errors_keep_their_sqlite_codes() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir, Duration::from_millis(10));
        let syntax = database_error(query("SELEC 1").execute(&mut conn).await.unwrap_err());
        assert!(!is_transient(&syntax), "{syntax}");
        query("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            .execute(&mut conn)
            .await
            .unwrap();
        query("INSERT INTO t VALUES (1)")
            .execute(&mut conn)
            .await
            .unwrap();
        let unique = database_error(
            query("INSERT INTO t VALUES (1)")
                .execute(&mut conn)
                .await
                .unwrap_err(),
        );
        assert!(!is_transient(&unique), "{unique}");
        assert!(
            unique
                .as_database_error()
                .is_some_and(|e| e.is_unique_violation()),
            "{unique}"
        );

        // Another connection holds the write lock past the busy timeout: passing.
        let other = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
        other.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let busy = database_error(conn.begin().unwrap_err());
        assert!(is_transient(&busy), "{busy}");
        assert_eq!(busy.as_database_error().unwrap().code().unwrap(), "5");
        other.execute_batch("ROLLBACK").unwrap();

        // A transaction rolled back leaves nothing; committed, it stays.
        conn.begin().unwrap();
        query("INSERT INTO t VALUES (2)")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.rollback();
        conn.rollback(); // none open: nothing to do
        conn.begin().unwrap();
        query("INSERT INTO t VALUES (3)")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.commit().unwrap();
        let keys: Vec<i64> = query("SELECT k FROM t ORDER BY k")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get("k").unwrap())
            .collect();
        assert_eq!(keys, vec![1, 3]);
    }
}
