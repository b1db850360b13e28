//! Durable state: calls, their oplogs, artifacts and resource bookkeeping.
//!
//! One [`Store`] trait with one SQL implementation over two backends: SQLite (the embedded
//! default: WAL, every commit fsynced) and PostgreSQL. Writes go through a single writer
//! task that commits whatever is queued in one transaction (group commit), so a burst of
//! oplog appends costs one fsync, not one each. Fencing lives here: an append or a
//! completion whose epoch is not the call's current one is refused.

mod sql;

pub use crate::call::{
    CallError, CallFilter, CallRecord, CallSpec, CallState, Created, NewCall, OplogEntry,
    OplogRecord, ResourceRecord, RunLimits, RunSummary, now_ms,
};
pub use crate::call::{
    DEFAULT_REQUEST_BYTES, DEFAULT_RESPONSE_BYTES, MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
};
pub use sql::SqlStore;

use async_trait::async_trait;
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
    #[error("idempotency key {key:?} was already used for a different call ({existing})")]
    IdempotencyConflict { key: String, existing: String },
    #[error("unsupported store URL {0:?}: use sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store writer has stopped")]
    Closed,
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// The durable state every other module goes through.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Records a new call with its `call-started` entry; a call with the same idempotency
    /// key in the namespace is returned instead (or refused if its request differs).
    async fn create_call(&self, call: NewCall) -> Result<Created, StoreError>;
    /// Starts a new assignment of a pending or running call: bumps its epoch, records
    /// `assigned`, and returns the new epoch.
    async fn assign_call(&self, call_id: &str, worker: &str) -> Result<u64, StoreError>;
    /// Takes a running call back from its worker (dead, lease lapsed): bumps the epoch so
    /// that worker's appends are refused, records why, and leaves the call pending.
    async fn fence_call(&self, call_id: &str, epoch: u64, reason: &str) -> Result<u64, StoreError>;
    /// Appends entries under `epoch`; refused with [`StoreError::StaleEpoch`] otherwise.
    async fn append_oplog(
        &self,
        call_id: &str,
        epoch: u64,
        entries: Vec<OplogEntry>,
    ) -> Result<(), StoreError>;
    /// Appends the last entries and the outcome, and ends the call, under `epoch`.
    async fn complete_call(
        &self,
        call_id: &str,
        epoch: u64,
        entries: Vec<OplogEntry>,
        outcome: CallOutcome,
    ) -> Result<CallRecord, StoreError>;
    /// Ends a call that never reached a worker (or cannot go on), whatever its epoch.
    async fn fail_call(&self, call_id: &str, error: CallError) -> Result<CallRecord, StoreError>;
    async fn get_call(&self, id: &str) -> Result<Option<CallRecord>, StoreError>;
    async fn find_call_by_key(
        &self,
        namespace: &str,
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
}

/// How a call ended, as the worker's result was judged.
#[derive(Clone, Debug)]
pub struct CallOutcome {
    pub result: Result<serde_json::Value, CallError>,
    /// What the worker reported of the run (recorded in the `outcome` entry).
    pub run: RunSummary,
}

/// Opens the store named by `url` (`sqlite://PATH` or `postgres://...`).
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(SqlStore::open(url).await?))
}
