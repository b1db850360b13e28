//! The SQL implementation of the store's traits (see [`Store`](crate::Store)), for SQLite
//! and PostgreSQL alike.
//!
//! This module opens the store (URL, pools, schema upgrade) and holds what every concern
//! shares: the retry policy and the classification of passing failures. The writes go
//! through one group-commit writer ([`writer`]); each concern has its module: [`calls`]
//! (calls and their oplogs), [`workspaces`], [`approvals`] (approvals and audit),
//! [`buckets`] (rate limits), [`resources`] (artifacts and resource bookkeeping),
//! [`retention`], [`sessions`] (the console's), [`rollouts`] (canaries); [`migrations`] is the schema, [`rows`] the helpers they share,
//! [`conn`] runs their SQL on either kind of connection and [`native`] is the SQLite
//! writer's own connection.

mod approvals;
mod blob_reads;
mod buckets;
mod calls;
mod codec;
mod commands;
mod conn;
mod job;
mod migrations;
mod native;
mod resources;
mod retention;
mod rollouts;
mod rows;
mod run_delay;
mod sessions;
mod slice_reads;
mod sync;
mod wal_vfs;
mod workspaces;
mod writer;

pub use migrations::SCHEMA_VERSION;

use crate::{StoreError, WriteCounters};
use migrations::migrate;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, AssertSqlSafe};
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

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
    /// SQLite: how long the writer's thread, out of writes after eight batches of one write
    /// in a row, keeps looking for the next one (giving its core to any other thread that
    /// wants it, and sleeping once others have had it for a while) before it sleeps; until
    /// eight lone writes follow a larger batch it sleeps at once. Waking a sleeping thread on
    /// an idle core costs a call tens to hundreds of microseconds on a virtual machine; the
    /// looking costs at most this much CPU time per lone write. Zero: sleep at once.
    pub idle_poll: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            busy_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            idle_poll: DEFAULT_IDLE_POLL,
        }
    }
}

/// [`OpenOptions::idle_poll`] by default.
pub const DEFAULT_IDLE_POLL: Duration = Duration::from_millis(1);

/// A store on SQLite or PostgreSQL; writes are group-committed by one writer task.
pub struct SqlStore {
    reads: AnyPool,
    /// On SQLite, the database file, for artifacts read in pieces.
    blob_reads: Option<blob_reads::SqliteFile>,
    writer: writer::Jobs,
    artifact_purges: AtomicU64,
    /// Its commits and syncs so far (see [`SqlStore::write_counters`]).
    counters: WriteCounters,
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
                for pragma in [
                    "PRAGMA page_size=1024",
                    "PRAGMA journal_mode=WAL",
                    "PRAGMA synchronous=FULL",
                ] {
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

impl SqlStore {
    /// Opens (and creates, for SQLite) the database at `url`, upgrades its schema, and
    /// starts the writer.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, OpenOptions::default()).await
    }

    /// [`SqlStore::open`] with explicit options.
    pub async fn open_with(url: &str, mut options: OpenOptions) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let mut sqlite_path = None;
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
            sqlite_path = Some(std::path::PathBuf::from(path));
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
        let counters = WriteCounters::default();
        let blob_reads = sqlite_path.clone().map(|path| blob_reads::SqliteFile {
            path,
            busy_timeout: options.busy_timeout,
        });
        let sink = match sqlite_path {
            Some(path) => {
                // The schema is upgraded: the writer's own connection takes over the writes.
                write_pool.close().await;
                writer::Sink::Native(tokio::sync::Mutex::new(native::NativeSqlite::open(
                    &path,
                    options.busy_timeout,
                )?))
            }
            None => writer::Sink::Pool(write_pool),
        };
        let writer = writer::spawn(sink, options.retry, counters.clone(), options.idle_poll)?;
        Ok(SqlStore {
            reads,
            blob_reads,
            writer,
            artifact_purges: AtomicU64::new(0),
            counters,
        })
    }

    /// Its counts of commits and syncs, to read as they grow (the control plane exports
    /// them as metrics): with group commit, a burst of concurrent writes costs far fewer
    /// than one of each a write.
    pub fn write_counters(&self) -> WriteCounters {
        self.counters.clone()
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
    async fn a_new_database_has_small_pages_and_an_old_one_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let page_size = |path: &std::path::Path| -> i64 {
            rusqlite::Connection::open(path)
                .unwrap()
                .query_row("PRAGMA page_size", [], |row| row.get(0))
                .unwrap()
        };
        let new = dir.path().join("new.db");
        let store = SqlStore::open(&format!("sqlite://{}", new.display()))
            .await
            .unwrap();
        drop(store);
        assert_eq!(page_size(&new), 1024);

        let old = dir.path().join("old.db");
        rusqlite::Connection::open(&old)
            .unwrap()
            .execute_batch("PRAGMA page_size=4096; CREATE TABLE before (k INTEGER)")
            .unwrap();
        let store = SqlStore::open(&format!("sqlite://{}", old.display()))
            .await
            .unwrap();
        drop(store);
        assert_eq!(page_size(&old), 4096);
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
