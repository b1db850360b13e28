//! Durable state: calls, their oplogs, artifacts and resource bookkeeping.
//!
//! One trait per concern ([`CallLog`], [`Approvals`], [`AuditLog`], [`RateBuckets`],
//! [`Artifacts`], [`Resources`], [`Retention`], [`Workspaces`], [`ConsoleSessions`], [`Rollouts`]),
//! [`Store`] for all of them,
//! and one SQL implementation over two backends: SQLite (the embedded
//! default: WAL, every commit fsynced) and PostgreSQL. Writes go through a single writer
//! (on SQLite a thread with its own connection) that commits whatever is queued in one
//! transaction (group commit), so a burst of oplog appends costs one fsync, not one each. Fencing lives here: an append or a
//! completion whose epoch is not the call's current one is refused.
//!
//! The schema carries a version and upgrades itself in place when opened (see
//! [`SCHEMA_VERSION`]); a write that fails for a passing reason (a lock, a lost connection, a
//! full disk) is retried with backoff before it fails as [`StoreError::Unavailable`].

mod counters;
pub mod faulty;
mod pieces;
mod sql;
mod traits;

pub use counters::WriteCounters;
pub use faulty::{FaultyStore, Op};
pub use pieces::ArtifactPieces;

/// Entries one [`CallLog::oplog_page`] returns at most, whatever its caller asks for.
pub const MAX_OPLOG_PAGE_ENTRIES: u32 = 1000;
pub use sql::{
    DEFAULT_IDLE_POLL, OpenOptions, RetryPolicy, SCHEMA_VERSION, SqlStore, is_transient,
};
pub use toolgrid_core::call::{
    CallError, CallFilter, CallRecord, CallSpec, CallState, Created, NewCall, OplogEntry,
    OplogRecord, ResourceChanges, ResourceRecord, ResourceRecordKey, RunLimits, RunSummary, now_ms,
};
pub use toolgrid_core::call::{
    DEFAULT_REQUEST_BYTES, DEFAULT_RESPONSE_BYTES, MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
};
pub use toolgrid_core::completion::CallOutcome;
pub use traits::{
    Approvals, Artifacts, AuditLog, CallLog, ConsoleSessions, Durable, RateBuckets, Resources,
    Retention, Rollouts, Store, Workspaces,
};

use std::sync::Arc;
use toolgrid_core::call::Filesystem;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::workspace::WorkspaceKey;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The writer holds an older assignment of the call: it must stop at once.
    #[error(
        "stale epoch {epoch} for call {call_id} (the call is at epoch {current} in state {state})"
    )]
    StaleEpoch {
        call_id: String,
        epoch: u64,
        current: u64,
        state: CallState,
    },
    #[error("no call {0}")]
    NotFound(String),
    /// The call is not waiting for approval (decided already, or never asked).
    #[error("call {call_id} is {state}, not awaiting approval")]
    NotAwaiting { call_id: String, state: CallState },
    /// The call has ended already: it cannot be cancelled.
    #[error("call {call_id} has ended already ({state}); cancellation is not rollback")]
    Ended { call_id: String, state: CallState },
    #[error("idempotency key {key:?} was already used for a different call ({existing})")]
    IdempotencyConflict { key: String, existing: String },
    #[error("unsupported store URL {0:?}: use sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store writer has stopped")]
    Closed,
    /// The database kept failing for a passing reason (busy, connection lost, disk full)
    /// until the writer gave up; nothing of the write was applied (or, if its commit's
    /// outcome was unknown, it was applied exactly once: appends and completions are
    /// idempotent).
    #[error("the store is unavailable after {attempts} attempts: {last}")]
    Unavailable { attempts: u32, last: String },
    /// The database was written by a newer toolgrid: this binary must not touch it.
    #[error(
        "the store's schema is version {found}, newer than this binary's {supported}: upgrade toolgrid"
    )]
    SchemaTooNew { found: i64, supported: i64 },
    /// A write was committed (readers see it) but the sync that makes it durable failed:
    /// it may be lost if the machine stops before the next sync succeeds.
    #[error("the write was committed but could not be made durable: {0}")]
    NotDurable(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// A store refusal at a front door: the kinds a caller can act on, `internal` for the rest.
impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        let kind = match &error {
            StoreError::IdempotencyConflict { .. } => ErrorKind::IdempotencyConflict,
            StoreError::NotFound(_) => ErrorKind::NotFound,
            StoreError::NotAwaiting { .. } => ErrorKind::NotAwaitingApproval,
            StoreError::Ended { .. } => ErrorKind::NotCancellable,
            // Committed, not known to be durable: a retry with the same key finds the write.
            StoreError::NotDurable(_) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        };
        ApiError::new(kind, error.to_string())
    }
}

/// The workspace one call sees (see [`Workspaces::call_workspace`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallWorkspace {
    pub key: WorkspaceKey,
    pub filesystem: Filesystem,
    /// The version the call started from, pinned durably at its first assignment and reused
    /// by every re-assignment; `None` while it was never assigned.
    pub base: Option<u64>,
    pub state: CallState,
    pub epoch: u64,
}

/// What [`Retention::delete_finished_before`] deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub calls: u64,
    pub oplog_entries: u64,
    /// Command definitions no call named any more.
    pub commands: u64,
    /// Digests of the deleted artifacts.
    pub artifacts: Vec<String>,
}

/// Opens the store named by `url` (`sqlite://PATH` or `postgres://...`), upgrading its
/// schema if it is older than this binary's.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(SqlStore::open(url).await?))
}

/// [`open`] with explicit options (busy timeout, write retries).
pub async fn open_with(url: &str, options: OpenOptions) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(SqlStore::open_with(url, options).await?))
}
