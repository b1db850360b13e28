//! The store's operations, one trait per concern, and [`Store`], all of them at once.
//!
//! A component that needs one concern can take just that trait (`Arc<dyn Workspaces>`,
//! upcast from an `Arc<dyn Store>`); whoever holds a `dyn Store` calls every operation on it
//! directly. A concrete store ([`SqlStore`](crate::SqlStore),
//! [`FaultyStore`](crate::FaultyStore)) needs the trait of the operation in scope.

use crate::{
    ArtifactPieces, CallError, CallFilter, CallOutcome, CallRecord, CallWorkspace, Created,
    NewCall, OplogEntry, OplogRecord, ResourceChanges, ResourceRecord, RetentionReport, StoreError,
};
use async_trait::async_trait;
use std::collections::HashSet;
use toolgrid_core::workspace::{self, WorkspaceKey};

/// Whether a write answered before its sync ([`CallLog::create_call_applied`]) is durable:
/// [`wait`](Durable::wait) answers once the sync that covers it has returned.
#[must_use = "a write answered early is durable only once its Durable answers"]
#[derive(Debug)]
pub struct Durable(Option<tokio::sync::oneshot::Receiver<Result<(), StoreError>>>);

impl Durable {
    /// Durable already (the commit that answered synced it).
    pub fn already() -> Self {
        Durable(None)
    }

    /// Durable when `synced` answers.
    pub(crate) fn when(synced: tokio::sync::oneshot::Receiver<Result<(), StoreError>>) -> Self {
        Durable(Some(synced))
    }

    /// A sync that failed with `error` (a fault injected by [`FaultyStore`](crate::FaultyStore)).
    pub(crate) fn failed(error: StoreError) -> Self {
        let (synced, durable) = tokio::sync::oneshot::channel();
        let _ = synced.send(Err(error));
        Durable(Some(durable))
    }

    /// Waits for the sync; [`StoreError::NotDurable`] when it failed (the write is
    /// committed, and may be lost if the machine stops).
    pub async fn wait(self) -> Result<(), StoreError> {
        match self.0 {
            None => Ok(()),
            Some(synced) => synced.await.map_err(|_| StoreError::Closed)?,
        }
    }
}

/// The durable state every other module goes through: every concern at once. Implemented
/// by every type that implements all of them.
pub trait Store:
    CallLog
    + Approvals
    + AuditLog
    + RateBuckets
    + Artifacts
    + Resources
    + Retention
    + Workspaces
    + ConsoleSessions
    + Rollouts
    + Send
    + Sync
    + 'static
{
}

impl<T> Store for T where
    T: CallLog
        + Approvals
        + AuditLog
        + RateBuckets
        + Artifacts
        + Resources
        + Retention
        + Workspaces
        + ConsoleSessions
        + Rollouts
        + Send
        + Sync
        + 'static
{
}

/// Calls and their oplogs: admission, assignment and fencing by epoch, appends, ends, and
/// the reads of calls and entries.
#[async_trait]
pub trait CallLog: Send + Sync {
    /// Records a new call with its `call-started` entry; a call with the same idempotency
    /// key in the namespace, by the same agent (`spec.access.agent`), is returned instead
    /// (or refused if its request differs).
    async fn create_call(&self, call: NewCall) -> Result<Created, StoreError>;

    /// [`create_call`](Self::create_call), answered as soon as the admission is committed
    /// (visible to every reader), before it is durable; the [`Durable`] answers once it is.
    ///
    /// Between the two only work that nothing outside the platform can observe may start
    /// (the call's run: every effect of a run is committed before it leaves, and the writer
    /// syncs in order, so an effect's commit is never durable before its call's admission).
    /// Nothing about the call may be told to its caller before the [`Durable`] answers.
    /// A store whose commits are durable at once answers with [`Durable::already`].
    async fn create_call_applied(&self, call: NewCall) -> Result<(Created, Durable), StoreError> {
        Ok((self.create_call(call).await?, Durable::already()))
    }
    /// Starts a new assignment of a pending or running call: bumps its epoch, records
    /// `assigned`, and returns the new epoch.
    async fn assign_call(&self, call_id: &str, worker: &str) -> Result<u64, StoreError>;
    /// [`assign_call`](Self::assign_call), answered at its commit like
    /// [`create_call_applied`](Self::create_call_applied): the call may go to its worker
    /// before the assignment is durable (every effect of the run is committed after it).
    async fn assign_call_applied(
        &self,
        call_id: &str,
        worker: &str,
    ) -> Result<(u64, Durable), StoreError> {
        Ok((self.assign_call(call_id, worker).await?, Durable::already()))
    }
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
    /// [`append_oplog`](CallLog::append_oplog)) and the outcome, and ends the call, under
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
    /// its oplog records, ends it `failed` with [`toolgrid_core::call::stopped_error`] of
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
    /// A call's whole oplog, in order: for replay, failover and retries, which need all of
    /// it. A reader that shows entries pages with [`CallLog::oplog_page`].
    async fn oplog(&self, call_id: &str) -> Result<Vec<OplogRecord>, StoreError>;
    /// At most `limit` entries of a call's oplog with `seq >= from_seq`, in order, read by
    /// the query (the rest of the oplog is never loaded). `limit` is capped at
    /// [`crate::MAX_OPLOG_PAGE_ENTRIES`]; `0` reads nothing.
    async fn oplog_page(
        &self,
        call_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<OplogRecord>, StoreError>;
}

/// Durable approval: the one decision on a call held by an approval step.
#[async_trait]
pub trait Approvals: Send + Sync {
    /// Decides a call in `awaiting-approval` (any other state: [`StoreError::NotAwaiting`]):
    /// records `decision` in its spec (`chain.approved`) and as an `approval` oplog entry,
    /// and in the same commit moves it to `pending` with a fresh deadline of
    /// `now + limits.timeout_ms` (approved), or ends it `failed` with `error` (denied, or
    /// timed out with `onTimeout: deny`; its audit record is written as for any end).
    async fn decide_approval(
        &self,
        call_id: &str,
        decision: toolgrid_core::call::ApprovalDecision,
        error: Option<CallError>,
    ) -> Result<CallRecord, StoreError>;
}

/// The append-only audit log: one record per ended call (written with its end) and one per
/// refused call.
#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Appends an audit record (a refused call's; ended calls get theirs inside the commit
    /// that ends them).
    async fn append_audit(
        &self,
        record: toolgrid_core::call::AuditRecord,
    ) -> Result<(), StoreError>;
    /// Audit records matching `filter`, newest first.
    async fn list_audit(
        &self,
        filter: &toolgrid_core::call::AuditFilter,
    ) -> Result<Vec<toolgrid_core::call::AuditRecord>, StoreError>;
}

/// Rate-limit token buckets shared by every replica on the store.
#[async_trait]
pub trait RateBuckets: Send + Sync {
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
}

/// Release artifacts (components), stored by digest.
#[async_trait]
pub trait Artifacts: Send + Sync {
    /// Stores `bytes` under `digest` (again: refreshes its time). The bytes are taken, not
    /// copied: a built-in runtime is 100 MB and more, and the writer holds them until their
    /// commit.
    async fn put_artifact(&self, digest: &str, bytes: Vec<u8>) -> Result<(), StoreError>;
    async fn get_artifact(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Reads `digest` in pieces of at most `piece` bytes, never holding it whole; `None`
    /// when it is not stored.
    async fn read_artifact(
        &self,
        digest: &str,
        piece: usize,
    ) -> Result<Option<ArtifactPieces>, StoreError>;
    /// How many times retention has deleted artifacts through this store: a cache of
    /// stored digests must be forgotten when this changes.
    fn artifact_purges(&self) -> u64 {
        0
    }
}

/// The bookkeeping of declared resources (spec hashes, generations, status).
#[async_trait]
pub trait Resources: Send + Sync {
    async fn load_resources(&self) -> Result<Vec<ResourceRecord>, StoreError>;
    /// Replaces the bookkeeping of every resource with `records`.
    async fn save_resources(&self, records: Vec<ResourceRecord>) -> Result<(), StoreError>;
    /// Writes `changes.saved` (replacing their stored records) and deletes the records of
    /// `changes.removed`, in one transaction; every other record stays as it is.
    async fn update_resources(&self, changes: ResourceChanges) -> Result<(), StoreError>;
}

/// Retention: deleting what has ended long enough ago.
#[async_trait]
pub trait Retention: Send + Sync {
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
}

/// Agents' workspaces: versioned trees of files, their blobs, and the version each call
/// starts from.
#[async_trait]
pub trait Workspaces: Send + Sync {
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

/// The console's sessions, shared by every replica on the store: a session is known by the
/// SHA-256 of its id only.
#[async_trait]
pub trait ConsoleSessions: Send + Sync {
    /// Records a new session.
    async fn create_console_session(
        &self,
        session: toolgrid_core::auth::ConsoleSession,
    ) -> Result<(), StoreError>;
    /// The session whose id hashes to `id_hash`, lapsed or not (`None`: no such session,
    /// or it was deleted).
    async fn console_session(
        &self,
        id_hash: &[u8; 32],
    ) -> Result<Option<toolgrid_core::auth::ConsoleSession>, StoreError>;
    /// Records a use of the session at `now_ms` (never moves its last use backwards).
    async fn touch_console_session(
        &self,
        id_hash: &[u8; 32],
        now_ms: i64,
    ) -> Result<(), StoreError>;
    /// Deletes the session (logout): whether there was one.
    async fn delete_console_session(&self, id_hash: &[u8; 32]) -> Result<bool, StoreError>;
    /// Deletes every session lapsed at `now_ms` (idle or past its expiry): how many.
    async fn purge_console_sessions(&self, now_ms: i64) -> Result<u64, StoreError>;
}

/// Canary rollouts: where each binding's is, and what each release's calls did.
#[async_trait]
pub trait Rollouts: Send + Sync {
    /// Every binding's rollout.
    async fn rollouts(&self) -> Result<Vec<toolgrid_core::rollout::Record>, StoreError>;
    /// Stores `next` if the binding's rollout is still `expected` (`None`: it has none
    /// yet): whether it was stored. Two replicas judging one step at once store one
    /// outcome.
    async fn put_rollout(
        &self,
        expected: Option<&toolgrid_core::rollout::Record>,
        next: &toolgrid_core::rollout::Record,
    ) -> Result<bool, StoreError>;
    /// What the calls of each release of `tool` in `namespace` that ended at or after
    /// `since_ms` did, by release name.
    async fn release_tallies(
        &self,
        namespace: &str,
        tool: &str,
        since_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, toolgrid_core::rollout::Tally>, StoreError>;
}
