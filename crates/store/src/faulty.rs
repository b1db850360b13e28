//! A [`Store`] that fails on cue, for fault tests: it wraps another store and, when told,
//! fails the next N calls of an operation (before or after the real write), or delays every
//! call of one.
//!
//! `toolgrid up` wraps its store in one when `TOOLGRID_FAULTS` is set, e.g.
//! `TOOLGRID_FAULTS=complete:2,append:1,append:delay=200ms,complete:after=1`:
//!
//! - `OP:N` fails the next N calls of OP with [`StoreError::Unavailable`], writing nothing;
//! - `OP:after=N` performs the next N calls of OP and then reports them failed (the
//!   "commit outcome unknown" case);
//! - `OP:delay=DURATION` delays every call of OP (a humantime duration).
//!
//! OP is one of the names of [`Op`] (`create`, `assign`, `fence`, `append`, `complete`,
//! `fail`, `get`, `find`, `list`, `unfinished`, `oplog`, `oplog-page`, `put-artifact`, `get-artifact`,
//! `load-resources`, `save-resources`, `retention`, `decide`, `take-token`, `audit`, `sync`).
//! `sync` is the sync of an admission answered at its commit: `sync:N` leaves the next N
//! such admissions committed (their calls run) and fails their sync with
//! [`StoreError::NotDurable`].

use super::{
    Approvals, Artifacts, AuditLog, CallError, CallFilter, CallLog, CallOutcome, CallRecord,
    Created, NewCall, OplogEntry, OplogRecord, RateBuckets, ResourceChanges, ResourceRecord,
    Resources, Retention, RetentionReport, Store, StoreError, Workspaces,
};
use crate::ConsoleSessions;
use crate::Durable;
use crate::Rollouts;
use async_trait::async_trait;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolgrid_core::auth::ConsoleSession;

/// An operation of the store (see [`Store`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Create,
    Assign,
    Fence,
    Append,
    Complete,
    Fail,
    Get,
    Find,
    List,
    Unfinished,
    Oplog,
    OplogPage,
    PutArtifact,
    GetArtifact,
    LoadResources,
    SaveResources,
    Retention,
    Decide,
    TakeToken,
    Audit,
    /// The sync of an admission answered at its commit
    /// ([`CallLog::create_call_applied`]): a failure leaves the call committed (it runs) and
    /// its [`Durable`](crate::Durable) fails with [`StoreError::NotDurable`].
    Sync,
}

impl Op {
    pub const ALL: [Op; 21] = [
        Op::Create,
        Op::Assign,
        Op::Fence,
        Op::Append,
        Op::Complete,
        Op::Fail,
        Op::Get,
        Op::Find,
        Op::List,
        Op::Unfinished,
        Op::Oplog,
        Op::OplogPage,
        Op::PutArtifact,
        Op::GetArtifact,
        Op::LoadResources,
        Op::SaveResources,
        Op::Retention,
        Op::Decide,
        Op::TakeToken,
        Op::Audit,
        Op::Sync,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Assign => "assign",
            Op::Fence => "fence",
            Op::Append => "append",
            Op::Complete => "complete",
            Op::Fail => "fail",
            Op::Get => "get",
            Op::Find => "find",
            Op::List => "list",
            Op::Unfinished => "unfinished",
            Op::Oplog => "oplog",
            Op::OplogPage => "oplog-page",
            Op::PutArtifact => "put-artifact",
            Op::GetArtifact => "get-artifact",
            Op::LoadResources => "load-resources",
            Op::SaveResources => "save-resources",
            Op::Retention => "retention",
            Op::Decide => "decide",
            Op::TakeToken => "take-token",
            Op::Audit => "audit",
            Op::Sync => "sync",
        }
    }

    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

/// Makes the error an injected failure returns.
pub type ErrorFactory = Arc<dyn Fn(Op) -> StoreError + Send + Sync>;

/// The error injected by default: the store gave up on a passing failure.
pub fn unavailable(op: Op) -> StoreError {
    StoreError::Unavailable {
        attempts: 1,
        last: format!("injected fault in {}", op.name()),
    }
}

#[derive(Default)]
struct Faults {
    /// Fail this many calls before running them.
    before: u32,
    /// Run this many calls, then report them failed.
    after: u32,
    error: Option<ErrorFactory>,
    delay: Option<Duration>,
    injected: u64,
}

/// A [`Store`] wrapper that fails or delays operations when told to.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: Mutex<HashMap<Op, Faults>>,
}

/// What to do about one call.
enum Plan {
    Run,
    FailBefore(StoreError),
    FailAfter(StoreError),
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            faults: Mutex::new(HashMap::new()),
        }
    }

    /// A store with the faults of a `TOOLGRID_FAULTS` specification (see the module docs).
    pub fn from_spec(inner: Arc<dyn Store>, spec: &str) -> Result<Self, String> {
        let store = FaultyStore::new(inner);
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (op, what) = item
                .split_once(':')
                .ok_or_else(|| format!("fault {item:?}: write OP:N, OP:after=N or OP:delay=D"))?;
            let op = Op::parse(op).ok_or_else(|| format!("fault {item:?}: no operation {op:?}"))?;
            if let Some(delay) = what.strip_prefix("delay=") {
                let delay =
                    humantime::parse_duration(delay).map_err(|e| format!("fault {item:?}: {e}"))?;
                store.delay(op, delay);
            } else if let Some(n) = what.strip_prefix("after=") {
                let n = n.parse().map_err(|e| format!("fault {item:?}: {e}"))?;
                store.fail_after(op, n);
            } else {
                let n = what.parse().map_err(|e| format!("fault {item:?}: {e}"))?;
                store.fail_next(op, n);
            }
        }
        Ok(store)
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, HashMap<Op, Faults>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails the next `n` calls of `op` with [`StoreError::Unavailable`], writing nothing.
    pub fn fail_next(&self, op: Op, n: u32) {
        self.faults().entry(op).or_default().before += n;
    }

    /// Fails the next `n` calls of `op` with the error `error` makes, writing nothing.
    pub fn fail_next_with(
        &self,
        op: Op,
        n: u32,
        error: impl Fn(Op) -> StoreError + Send + Sync + 'static,
    ) {
        let mut faults = self.faults();
        let faults = faults.entry(op).or_default();
        faults.before += n;
        faults.error = Some(Arc::new(error));
    }

    /// Performs the next `n` calls of `op`, then reports each failed: the caller cannot
    /// tell whether it was written (a commit whose outcome is unknown).
    pub fn fail_after(&self, op: Op, n: u32) {
        self.faults().entry(op).or_default().after += n;
    }

    /// Delays every call of `op` by `delay` (`Duration::ZERO` to stop).
    pub fn delay(&self, op: Op, delay: Duration) {
        self.faults().entry(op).or_default().delay = (!delay.is_zero()).then_some(delay);
    }

    /// Forgets every fault.
    pub fn clear(&self) {
        self.faults().clear();
    }

    /// How many failures were injected into `op` so far.
    pub fn injected(&self, op: Op) -> u64 {
        self.faults().get(&op).map(|f| f.injected).unwrap_or(0)
    }

    /// Failures of `op` still to come.
    pub fn pending(&self, op: Op) -> u32 {
        self.faults()
            .get(&op)
            .map(|f| f.before + f.after)
            .unwrap_or(0)
    }

    async fn plan(&self, op: Op) -> Plan {
        let (delay, plan) = {
            let mut faults = self.faults();
            let Some(faults) = faults.get_mut(&op) else {
                return Plan::Run;
            };
            let error = || match &faults.error {
                Some(make) => make(op),
                None if op == Op::Sync => {
                    StoreError::NotDurable(format!("injected fault in {}", op.name()))
                }
                None => unavailable(op),
            };
            let plan = if faults.before > 0 {
                let e = error();
                faults.before -= 1;
                faults.injected += 1;
                Plan::FailBefore(e)
            } else if faults.after > 0 {
                let e = error();
                faults.after -= 1;
                faults.injected += 1;
                Plan::FailAfter(e)
            } else {
                Plan::Run
            };
            (faults.delay, plan)
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        plan
    }

    /// Runs `call` under the faults planned for `op`.
    async fn run<T>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.plan(op).await {
            Plan::Run => call.await,
            Plan::FailBefore(error) => Err(error),
            Plan::FailAfter(error) => {
                let _ = call.await;
                Err(error)
            }
        }
    }
}

#[async_trait]
impl CallLog for FaultyStore {
    async fn create_call(&self, call: NewCall) -> Result<Created, StoreError> {
        self.run(Op::Create, self.inner.create_call(call)).await
    }

    async fn create_call_applied(&self, call: NewCall) -> Result<(Created, Durable), StoreError> {
        let (created, durable) = self
            .run(Op::Create, self.inner.create_call_applied(call))
            .await?;
        match self.plan(Op::Sync).await {
            Plan::Run => Ok((created, durable)),
            // Committed either way: only its sync fails.
            Plan::FailBefore(error) | Plan::FailAfter(error) => {
                Ok((created, Durable::failed(error)))
            }
        }
    }

    async fn assign_call(&self, call_id: &str, worker: &str) -> Result<u64, StoreError> {
        self.run(Op::Assign, self.inner.assign_call(call_id, worker))
            .await
    }

    async fn assign_call_applied(
        &self,
        call_id: &str,
        worker: &str,
    ) -> Result<(u64, Durable), StoreError> {
        self.run(Op::Assign, self.inner.assign_call_applied(call_id, worker))
            .await
    }

    async fn fence_call(&self, call_id: &str, epoch: u64, reason: &str) -> Result<u64, StoreError> {
        self.run(Op::Fence, self.inner.fence_call(call_id, epoch, reason))
            .await
    }

    async fn append_oplog(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
    ) -> Result<(), StoreError> {
        self.run(
            Op::Append,
            self.inner.append_oplog(call_id, epoch, first_wseq, entries),
        )
        .await
    }

    async fn complete_call(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
        outcome: CallOutcome,
    ) -> Result<CallRecord, StoreError> {
        self.run(
            Op::Complete,
            self.inner
                .complete_call(call_id, epoch, first_wseq, entries, outcome),
        )
        .await
    }

    async fn fail_call(&self, call_id: &str, error: CallError) -> Result<CallRecord, StoreError> {
        self.run(Op::Fail, self.inner.fail_call(call_id, error))
            .await
    }

    async fn cancel_call(&self, call_id: &str, reason: &str) -> Result<CallRecord, StoreError> {
        self.run(Op::Fail, self.inner.cancel_call(call_id, reason))
            .await
    }

    async fn get_call(&self, id: &str) -> Result<Option<CallRecord>, StoreError> {
        self.run(Op::Get, self.inner.get_call(id)).await
    }

    async fn find_call_by_key(
        &self,
        namespace: &str,
        agent: &str,
        key: &str,
    ) -> Result<Option<CallRecord>, StoreError> {
        self.run(Op::Find, self.inner.find_call_by_key(namespace, agent, key))
            .await
    }

    async fn list_calls(&self, filter: &CallFilter) -> Result<Vec<CallRecord>, StoreError> {
        self.run(Op::List, self.inner.list_calls(filter)).await
    }

    async fn unfinished_calls(&self) -> Result<Vec<CallRecord>, StoreError> {
        self.run(Op::Unfinished, self.inner.unfinished_calls())
            .await
    }

    async fn oplog(&self, call_id: &str) -> Result<Vec<OplogRecord>, StoreError> {
        self.run(Op::Oplog, self.inner.oplog(call_id)).await
    }

    async fn oplog_page(
        &self,
        call_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<OplogRecord>, StoreError> {
        self.run(
            Op::OplogPage,
            self.inner.oplog_page(call_id, from_seq, limit),
        )
        .await
    }
}

#[async_trait]
impl Approvals for FaultyStore {
    async fn decide_approval(
        &self,
        call_id: &str,
        decision: toolgrid_core::call::ApprovalDecision,
        error: Option<CallError>,
    ) -> Result<CallRecord, StoreError> {
        self.run(
            Op::Decide,
            self.inner.decide_approval(call_id, decision, error),
        )
        .await
    }
}

#[async_trait]
impl AuditLog for FaultyStore {
    async fn append_audit(
        &self,
        record: toolgrid_core::call::AuditRecord,
    ) -> Result<(), StoreError> {
        self.run(Op::Audit, self.inner.append_audit(record)).await
    }

    async fn list_audit(
        &self,
        filter: &toolgrid_core::call::AuditFilter,
    ) -> Result<Vec<toolgrid_core::call::AuditRecord>, StoreError> {
        self.run(Op::Audit, self.inner.list_audit(filter)).await
    }
}

#[async_trait]
impl RateBuckets for FaultyStore {
    async fn take_token(
        &self,
        key: &str,
        burst: u32,
        per_second: f64,
        now_ms: i64,
    ) -> Result<Option<u64>, StoreError> {
        self.run(
            Op::TakeToken,
            self.inner.take_token(key, burst, per_second, now_ms),
        )
        .await
    }
}

#[async_trait]
impl Artifacts for FaultyStore {
    async fn put_artifact(&self, digest: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.run(Op::PutArtifact, self.inner.put_artifact(digest, bytes))
            .await
    }

    async fn get_artifact(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.run(Op::GetArtifact, self.inner.get_artifact(digest))
            .await
    }

    async fn read_artifact(
        &self,
        digest: &str,
        piece: usize,
    ) -> Result<Option<crate::ArtifactPieces>, StoreError> {
        self.run(Op::GetArtifact, self.inner.read_artifact(digest, piece))
            .await
    }

    fn artifact_purges(&self) -> u64 {
        self.inner.artifact_purges()
    }
}

#[async_trait]
impl Resources for FaultyStore {
    async fn load_resources(&self) -> Result<Vec<ResourceRecord>, StoreError> {
        self.run(Op::LoadResources, self.inner.load_resources())
            .await
    }

    async fn save_resources(&self, records: Vec<ResourceRecord>) -> Result<(), StoreError> {
        self.run(Op::SaveResources, self.inner.save_resources(records))
            .await
    }

    async fn update_resources(&self, changes: ResourceChanges) -> Result<(), StoreError> {
        // The same operation to the faults: saving the bookkeeping, whole or in part.
        self.run(Op::SaveResources, self.inner.update_resources(changes))
            .await
    }
}

#[async_trait]
impl Retention for FaultyStore {
    async fn delete_finished_before(
        &self,
        cutoff_ms: i64,
        keep_artifacts: &HashSet<String>,
    ) -> Result<RetentionReport, StoreError> {
        self.run(
            Op::Retention,
            self.inner.delete_finished_before(cutoff_ms, keep_artifacts),
        )
        .await
    }
}

#[async_trait]
impl Workspaces for FaultyStore {
    async fn call_workspace(
        &self,
        call_id: &str,
    ) -> Result<Option<super::CallWorkspace>, StoreError> {
        self.inner.call_workspace(call_id).await
    }

    async fn workspace_head(
        &self,
        key: &toolgrid_core::workspace::WorkspaceKey,
    ) -> Result<toolgrid_core::workspace::Version, StoreError> {
        self.inner.workspace_head(key).await
    }

    async fn workspace_version(
        &self,
        key: &toolgrid_core::workspace::WorkspaceKey,
        version: u64,
    ) -> Result<Option<toolgrid_core::workspace::Version>, StoreError> {
        self.inner.workspace_version(key, version).await
    }

    async fn workspace_history(
        &self,
        key: &toolgrid_core::workspace::WorkspaceKey,
    ) -> Result<Vec<toolgrid_core::workspace::Version>, StoreError> {
        self.inner.workspace_history(key).await
    }

    async fn commit_workspace(
        &self,
        key: &toolgrid_core::workspace::WorkspaceKey,
        base: u64,
        commit: toolgrid_core::workspace::Commit,
        call_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        self.inner
            .commit_workspace(key, base, commit, call_id)
            .await
    }

    async fn blobs(&self, digests: &[String]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.blobs(digests).await
    }
}

/// Console sessions pass through (no faults are injected into them).
#[async_trait]
impl ConsoleSessions for FaultyStore {
    async fn create_console_session(&self, session: ConsoleSession) -> Result<(), StoreError> {
        self.inner.create_console_session(session).await
    }

    async fn console_session(
        &self,
        id_hash: &[u8; 32],
    ) -> Result<Option<ConsoleSession>, StoreError> {
        self.inner.console_session(id_hash).await
    }

    async fn touch_console_session(
        &self,
        id_hash: &[u8; 32],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.inner.touch_console_session(id_hash, now_ms).await
    }

    async fn delete_console_session(&self, id_hash: &[u8; 32]) -> Result<bool, StoreError> {
        self.inner.delete_console_session(id_hash).await
    }

    async fn purge_console_sessions(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.inner.purge_console_sessions(now_ms).await
    }
}

/// Rollouts pass through (no faults are injected into them).
#[async_trait]
impl Rollouts for FaultyStore {
    async fn rollouts(&self) -> Result<Vec<toolgrid_core::rollout::Record>, StoreError> {
        self.inner.rollouts().await
    }

    async fn put_rollout(
        &self,
        expected: Option<&toolgrid_core::rollout::Record>,
        next: &toolgrid_core::rollout::Record,
    ) -> Result<bool, StoreError> {
        self.inner.put_rollout(expected, next).await
    }

    async fn release_tallies(
        &self,
        namespace: &str,
        tool: &str,
        since_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, toolgrid_core::rollout::Tally>, StoreError> {
        self.inner.release_tallies(namespace, tool, since_ms).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CallSpec, CallState};
    use serde_json::json;

    async fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = crate::open(&url).await.unwrap();
        (dir, store)
    }

    fn call(id: &str) -> NewCall {
        NewCall {
            id: id.into(),
            namespace: "default".into(),
            tool: "t".into(),
            command: "c".into(),
            release: "r".into(),
            release_digest: "sha256:00".into(),
            args: json!({}),
            spec: CallSpec::default(),
            stdin: Vec::new(),
            idempotency_key: None,
            request_hash: "h".into(),
            started: toolgrid_core::call::CallStarted {
                namespace: "default".into(),
                tool: "t".into(),
                command: "c".into(),
                release: "r".into(),
                version: "1.0.0".into(),
                digest: "sha256:0".into(),
                args: json!({}),
                argv: Vec::new(),
                stdin_bytes: 0,
                idempotency_key: None,
                dry_run: false,
                middleware: Vec::new(),
            },
            assign_to: None,
            repeat_window_ms: None,
            dry_run_result: None,
        }
    }

    #[tokio::test]
    async fn fails_the_next_n_calls_then_passes_through() {
        let (_dir, inner) = store().await;
        let faulty = FaultyStore::new(inner.clone());
        faulty.create_call(call("a")).await.unwrap();
        faulty.assign_call("a", "w").await.unwrap();
        faulty.fail_next(Op::Append, 2);
        let entry = || {
            vec![OplogEntry::MonotonicClock(
                toolgrid_core::call::MonotonicClock { ns: 1 },
            )]
        };
        for _ in 0..2 {
            let failed = faulty.append_oplog("a", 1, 0, entry()).await;
            assert!(
                matches!(failed, Err(StoreError::Unavailable { .. })),
                "{failed:?}"
            );
        }
        assert_eq!(inner.oplog("a").await.unwrap().len(), 2, "nothing written");
        faulty.append_oplog("a", 1, 0, entry()).await.unwrap();
        assert_eq!(inner.oplog("a").await.unwrap().len(), 3);
        assert_eq!(faulty.injected(Op::Append), 2);
        assert_eq!(faulty.pending(Op::Append), 0);
        // Other operations were never touched.
        assert_eq!(faulty.injected(Op::Complete), 0);
    }

    #[tokio::test]
    async fn fails_after_writing_and_with_a_chosen_error() {
        let (_dir, inner) = store().await;
        let faulty = FaultyStore::new(inner.clone());
        faulty.create_call(call("a")).await.unwrap();
        faulty.assign_call("a", "w").await.unwrap();
        faulty.fail_after(Op::Complete, 1);
        let outcome = CallOutcome {
            result: Ok(json!(1)),
            run: toolgrid_core::call::RunSummary {
                exit_code: 0,
                stdout_bytes: 1,
                run_micros: 1,
                epoch: 1,
                worker: "w".into(),
                replayed: 0,
            },
            workspace: None,
        };
        assert!(
            faulty
                .complete_call("a", 1, 0, vec![], outcome.clone())
                .await
                .is_err()
        );
        assert_eq!(
            inner.get_call("a").await.unwrap().unwrap().state,
            CallState::Succeeded,
            "written although reported failed"
        );
        // The repeated completion is recognised.
        let done = faulty
            .complete_call("a", 1, 0, vec![], outcome)
            .await
            .unwrap();
        assert_eq!(done.state, CallState::Succeeded);

        faulty.fail_next_with(Op::Get, 1, |_| StoreError::Closed);
        assert!(matches!(
            faulty.get_call("a").await,
            Err(StoreError::Closed)
        ));
        assert!(faulty.get_call("a").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn delays_and_specs() {
        let (_dir, inner) = store().await;
        let faulty =
            FaultyStore::from_spec(inner, "get:delay=50ms, create:1,complete:after=2").unwrap();
        assert_eq!(faulty.pending(Op::Create), 1);
        assert_eq!(faulty.pending(Op::Complete), 2);
        let start = std::time::Instant::now();
        assert!(faulty.get_call("x").await.unwrap().is_none());
        assert!(start.elapsed() >= Duration::from_millis(50));
        faulty.delay(Op::Get, Duration::ZERO);
        assert!(faulty.create_call(call("b")).await.is_err());
        assert!(faulty.create_call(call("b")).await.is_ok());
        faulty.clear();
        assert_eq!(faulty.pending(Op::Complete), 0);

        for bad in ["nope:1", "append", "append:x", "append:delay=soon"] {
            assert!(
                FaultyStore::from_spec(faulty.inner.clone(), bad).is_err(),
                "{bad}"
            );
        }
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
    }
}
