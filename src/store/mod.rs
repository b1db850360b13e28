//! Durable state: calls, their oplogs, artifacts and resource bookkeeping.
//!
//! One [`Store`] trait with one SQL implementation over two backends: SQLite (the embedded
//! default: WAL, every commit fsynced) and PostgreSQL. Writes go through a single writer
//! task that commits whatever is queued in one transaction (group commit), so a burst of
//! oplog appends costs one fsync, not one each. Fencing lives here: an append or a
//! completion whose epoch is not the call's current one is refused.
//!
//! The schema carries a version and upgrades itself in place when opened (see
//! [`SCHEMA_VERSION`]); a write that fails for a passing reason (a lock, a lost connection, a
//! full disk) is retried with backoff before it fails as [`StoreError::Unavailable`].

pub mod faulty;
mod sql;

pub use crate::call::{
    CallError, CallFilter, CallRecord, CallSpec, CallState, Created, NewCall, OplogEntry,
    OplogRecord, ResourceRecord, RunLimits, RunSummary, now_ms,
};
pub use crate::call::{
    DEFAULT_REQUEST_BYTES, DEFAULT_RESPONSE_BYTES, MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
};
pub use faulty::{FaultyStore, Op};
pub use sql::{OpenOptions, RetryPolicy, SCHEMA_VERSION, SqlStore, is_transient};

use crate::call::Filesystem;
use crate::workspace::{self, WorkspaceKey};
use async_trait::async_trait;
use std::collections::HashSet;
use std::sync::Arc;

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
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// The durable state every other module goes through.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Records a new call with its `call-started` entry; a call with the same idempotency
    /// key in the namespace, by the same agent (`spec.access.agent`), is returned instead
    /// (or refused if its request differs).
    async fn create_call(&self, call: NewCall) -> Result<Created, StoreError>;
    /// Starts a new assignment of a pending or running call: bumps its epoch, records
    /// `assigned`, and returns the new epoch.
    async fn assign_call(&self, call_id: &str, worker: &str) -> Result<u64, StoreError>;
    /// Takes a running call back from its worker (dead, lease lapsed): bumps the epoch so
    /// that worker's appends are refused, records why, and leaves the call pending.
    async fn fence_call(&self, call_id: &str, epoch: u64, reason: &str) -> Result<u64, StoreError>;
    /// Appends entries under `epoch`; refused with [`StoreError::StaleEpoch`] otherwise.
    ///
    /// `first_wseq` is the writer's own number of the first entry within (call, epoch):
    /// entry `i` is `first_wseq + i`. An append whose first entry is already stored under
    /// that number is a repeat of one that committed, and succeeds without storing anything.
    async fn append_oplog(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
    ) -> Result<(), StoreError>;
    /// Appends the last entries (numbered from `first_wseq` as in
    /// [`append_oplog`](Store::append_oplog)) and the outcome, and ends the call, under
    /// `epoch`. Completing a call that this epoch already ended with the same outcome
    /// returns the ended call (a repeated completion); otherwise an ended call is refused
    /// with [`StoreError::StaleEpoch`].
    async fn complete_call(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
        outcome: CallOutcome,
    ) -> Result<CallRecord, StoreError>;
    /// Ends a call that never reached a worker (or cannot go on), whatever its epoch.
    async fn fail_call(&self, call_id: &str, error: CallError) -> Result<CallRecord, StoreError>;
    /// Cancels a call not yet ended, in one transaction: reads how many outgoing requests
    /// its oplog records, ends it `failed` with [`crate::call::stopped_error`] of
    /// `cancelled` (or `outcome-unknown`: a `write`/`external` call with a request
    /// recorded) and `reason`, and records the `outcome`. Ending it is the fence: every
    /// append and completion is conditional on the call running under its epoch, so no
    /// later commit of its worker is accepted, and (commit before effect) no request of it
    /// leaves after this returns. An ended call is refused with [`StoreError::Ended`].
    async fn cancel_call(&self, call_id: &str, reason: &str) -> Result<CallRecord, StoreError>;
    async fn get_call(&self, id: &str) -> Result<Option<CallRecord>, StoreError>;
    /// The call made with idempotency key `key` in `namespace` by `agent` (`""` for the
    /// calls of no agent): keys are scoped per agent.
    async fn find_call_by_key(
        &self,
        namespace: &str,
        agent: &str,
        key: &str,
    ) -> Result<Option<CallRecord>, StoreError>;
    async fn list_calls(&self, filter: &CallFilter) -> Result<Vec<CallRecord>, StoreError>;
    /// Calls not yet ended, oldest first (for a restarting control plane).
    async fn unfinished_calls(&self) -> Result<Vec<CallRecord>, StoreError>;
    async fn oplog(&self, call_id: &str) -> Result<Vec<OplogRecord>, StoreError>;
    async fn put_artifact(&self, digest: &str, bytes: &[u8]) -> Result<(), StoreError>;
    async fn get_artifact(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
    async fn load_resources(&self) -> Result<Vec<ResourceRecord>, StoreError>;
    /// Replaces the bookkeeping of every resource with `records`.
    async fn save_resources(&self, records: Vec<ResourceRecord>) -> Result<(), StoreError>;
    /// Retention: deletes the calls that ended (succeeded or failed) before `cutoff_ms`
    /// with their oplogs, then the artifacts stored before `cutoff_ms` that no remaining
    /// call uses and that are not in `keep_artifacts` (the digests of current releases).
    /// Calls still pending or running are never deleted. Works in bounded batches, so
    /// other writes go on between them.
    async fn delete_finished_before(
        &self,
        cutoff_ms: i64,
        keep_artifacts: &HashSet<String>,
    ) -> Result<RetentionReport, StoreError>;
    /// How many times retention has deleted artifacts through this store: a cache of
    /// stored digests must be forgotten when this changes.
    fn artifact_purges(&self) -> u64 {
        0
    }

    /// Decides a call in `awaiting-approval` (any other state: [`StoreError::NotAwaiting`]):
    /// records `decision` in its spec (`chain.approved`) and as an `approval` oplog entry,
    /// and in the same commit moves it to `pending` with a fresh deadline of
    /// `now + limits.timeout_ms` (approved), or ends it `failed` with `error` (denied, or
    /// timed out with `onTimeout: deny`; its audit record is written as for any end).
    async fn decide_approval(
        &self,
        call_id: &str,
        decision: crate::call::ApprovalDecision,
        error: Option<CallError>,
    ) -> Result<CallRecord, StoreError>;
    /// Takes one token from the bucket `key` (capacity `burst`, refilled at `per_second`),
    /// created full on first use: `Ok(None)` when taken, `Ok(Some(ms))` when empty (a token
    /// comes back in `ms`). Atomic across connections, processes and replicas.
    async fn take_token(
        &self,
        key: &str,
        burst: u32,
        per_second: f64,
        now_ms: i64,
    ) -> Result<Option<u64>, StoreError>;
    /// Appends an audit record (a refused call's; ended calls get theirs inside the commit
    /// that ends them).
    async fn append_audit(&self, record: crate::call::AuditRecord) -> Result<(), StoreError>;
    /// Audit records matching `filter`, newest first.
    async fn list_audit(
        &self,
        filter: &crate::call::AuditFilter,
    ) -> Result<Vec<crate::call::AuditRecord>, StoreError>;

    /// The workspace a call sees, with the base version pinned at its first assignment
    /// (`None`: no such call, or it sees no workspace).
    async fn call_workspace(&self, call_id: &str) -> Result<Option<CallWorkspace>, StoreError>;
    /// The newest version of a workspace (version 0, the empty tree, when none is stored).
    async fn workspace_head(&self, key: &WorkspaceKey) -> Result<workspace::Version, StoreError>;
    /// One version of a workspace (0 is the empty tree); `None` if it does not exist.
    async fn workspace_version(
        &self,
        key: &WorkspaceKey,
        version: u64,
    ) -> Result<Option<workspace::Version>, StoreError>;
    /// Every stored version of a workspace, oldest first.
    async fn workspace_history(
        &self,
        key: &WorkspaceKey,
    ) -> Result<Vec<workspace::Version>, StoreError>;
    /// Commits `commit` as version `base + 1` of workspace `key`, for a writer that is no
    /// call's run (a call's result written to its agent's workspace; `call_id` names the
    /// call in the version), if the head is still `base`: `Ok(None)` when it moved. The
    /// caller checks the tree against the workspace limits and holds the workspace's write
    /// lock (the scheduler's) meanwhile.
    async fn commit_workspace(
        &self,
        key: &WorkspaceKey,
        base: u64,
        commit: workspace::Commit,
        call_id: &str,
    ) -> Result<Option<u64>, StoreError>;
    /// The blobs among `digests` the store has, as `(digest, bytes)`.
    async fn blobs(&self, digests: &[String]) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
}

/// The workspace one call sees (see [`Store::call_workspace`]).
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

/// What [`Store::delete_finished_before`] deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub calls: u64,
    pub oplog_entries: u64,
    /// Digests of the deleted artifacts.
    pub artifacts: Vec<String>,
}

/// How a call ended, as the worker's result was judged.
#[derive(Clone, Debug)]
pub struct CallOutcome {
    pub result: Result<serde_json::Value, CallError>,
    /// What the worker reported of the run (recorded in the `outcome` entry).
    pub run: RunSummary,
    /// A succeeded read-write call's workspace: committed as the base version + 1 in the
    /// same transaction that ends the call, if the head is still the base, the tree within
    /// the workspace limits and every blob present and matching its digest (otherwise the
    /// call fails `workspace-conflict`, `workspace-limit` or `workspace-invalid` and
    /// nothing is committed). Ignored for a failed call.
    pub workspace: Option<workspace::Commit>,
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
