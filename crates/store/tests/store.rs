//! One test suite for both store backends: SQLite always, PostgreSQL when
//! `TOOLGRID_TEST_POSTGRES_URL` names a server (CI starts one; `.ci/start-postgres`; under
//! `CI=true` its absence is a failure, `toolgrid_testkit::require`).

use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolgrid_core::call::{
    Assigned, CallStarted, ErrorKind, MonotonicClock, OplogEntry, Random, RandomSource, RunSummary,
    WallClock,
};
use toolgrid_core::call::{CallAccess, Filesystem};
use toolgrid_core::workspace::{self, WorkspaceKey};
use toolgrid_store::{
    CallError, CallFilter, CallLog, CallOutcome, CallSpec, CallState, Created, NewCall,
    OpenOptions, ResourceRecord, RetryPolicy, SCHEMA_VERSION, Store, StoreError,
};
use toolgrid_testkit::postgres::{fresh_postgres, restart_postgres};

/// Cases share the PostgreSQL server; the one that restarts it runs alone.
static SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The backends of a case, holding the shared server while they are iterated.
struct Backends {
    _server: tokio::sync::RwLockReadGuard<'static, ()>,
    urls: std::vec::IntoIter<(String, String)>,
}

impl Iterator for Backends {
    type Item = (String, String);
    fn next(&mut self) -> Option<Self::Item> {
        self.urls.next()
    }
}

/// The admin URL of the test PostgreSQL server, if there is one. Without one the
/// PostgreSQL half of each case is skipped, except in CI (`CI=true`), where that fails.
fn postgres_admin_url() -> Option<String> {
    match std::env::var("TOOLGRID_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            toolgrid_testkit::require(
                "PostgreSQL for the store suite (TOOLGRID_TEST_POSTGRES_URL, from .ci/start-postgres)",
                false,
            );
            None
        }
    }
}

/// The backends to run a case on: a fresh SQLite file, and a fresh PostgreSQL database.
async fn backends(dir: &tempfile::TempDir) -> Backends {
    let server = SERVER.read().await;
    let mut urls = vec![(
        "sqlite".to_string(),
        format!("sqlite://{}", dir.path().join("store.db").display()),
    )];
    if let Some(admin) = postgres_admin_url() {
        urls.push(("postgres".to_string(), fresh_postgres(&admin).await));
    }
    Backends {
        _server: server,
        urls: urls.into_iter(),
    }
}

fn new_call(id: &str, key: Option<&str>, args: serde_json::Value) -> NewCall {
    NewCall {
        id: id.into(),
        namespace: "default".into(),
        tool: "semver".into(),
        command: "compare".into(),
        release: "semver-1.0.0".into(),
        release_digest: "sha256:00".into(),
        request_hash: format!("hash-of-{args}"),
        args,
        spec: CallSpec {
            pool: "default/default".into(),
            argv: vec!["semver".into(), "compare".into()],
            effect: toolgrid_core::spec::Effect::Read,
            deadline_ms: 1,
            ..CallSpec::default()
        },
        stdin: b"in".to_vec(),
        idempotency_key: key.map(String::from),
        started: CallStarted {
            namespace: "default".into(),
            tool: "semver".into(),
            command: "compare".into(),
            release: "semver-1.0.0".into(),
            version: "1.0.0".into(),
            digest: "sha256:00".into(),
            args: json!({}),
            argv: vec!["semver".into(), "compare".into()],
            stdin_bytes: 2,
            idempotency_key: key.map(String::from),
            dry_run: false,
            middleware: Vec::new(),
        },
        assign_to: None,
        repeat_window_ms: None,
        dry_run_result: None,
    }
}

fn success(value: serde_json::Value) -> CallOutcome {
    CallOutcome {
        result: Ok(value),
        run: RunSummary {
            exit_code: 0,
            stdout_bytes: 1,
            run_micros: 1,
            epoch: 1,
            worker: "w".into(),
            replayed: 0,
        },
        workspace: None,
    }
}

fn is_stale(result: Result<impl std::fmt::Debug, StoreError>) -> bool {
    matches!(result, Err(StoreError::StaleEpoch { .. }))
}

#[tokio::test]
async fn calls_move_through_epochs_and_stale_writers_are_fenced() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let Created::New(call) = store
            .create_call(new_call("c1", None, json!({"a": 1})))
            .await
            .unwrap()
        else {
            panic!("{backend}: a new call")
        };
        assert_eq!(call.state, CallState::Pending);
        assert_eq!(call.epoch, 0);
        assert_eq!(call.stdin, b"in");

        let epoch = store.assign_call("c1", "w1").await.unwrap();
        assert_eq!(epoch, 1, "{backend}");
        store
            .append_oplog(
                "c1",
                1,
                0,
                vec![OplogEntry::WallClock(WallClock { secs: 1, nanos: 2 })],
            )
            .await
            .unwrap();
        assert!(
            is_stale(
                store
                    .append_oplog(
                        "c1",
                        0,
                        0,
                        vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 0 })]
                    )
                    .await
            ),
            "{backend}"
        );

        // The worker is lost: its epoch is fenced off.
        let fenced = store.fence_call("c1", 1, "worker lost").await.unwrap();
        assert_eq!(fenced, 2);
        assert_eq!(
            store.get_call("c1").await.unwrap().unwrap().state,
            CallState::Pending
        );
        assert!(
            is_stale(
                store
                    .append_oplog(
                        "c1",
                        1,
                        1,
                        vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 1 })]
                    )
                    .await
            ),
            "{backend}"
        );
        assert!(
            is_stale(
                store
                    .complete_call("c1", 1, 1, vec![], success(json!(1)))
                    .await
            ),
            "{backend}"
        );
        assert!(
            is_stale(store.fence_call("c1", 1, "again").await),
            "{backend}"
        );

        let epoch = store.assign_call("c1", "w2").await.unwrap();
        assert_eq!(epoch, 3);
        let done = store
            .complete_call(
                "c1",
                3,
                0,
                vec![OplogEntry::Random(Random {
                    source: RandomSource::Secure,
                    bytes: vec![0],
                })],
                success(json!({"order": 1})),
            )
            .await
            .unwrap();
        assert_eq!(done.state, CallState::Succeeded);
        assert_eq!(done.result, Some(json!({"order": 1})));
        assert_eq!(done.worker.as_deref(), Some("w2"));
        assert!(done.finished_at_ms.is_some());
        // Nothing more once it has ended, whatever the epoch.
        assert!(
            is_stale(
                store
                    .complete_call("c1", 3, 1, vec![], success(json!(2)))
                    .await
            ),
            "{backend}"
        );
        assert!(is_stale(store.assign_call("c1", "w3").await), "{backend}");

        let oplog = store.oplog("c1").await.unwrap();
        let kinds: Vec<&str> = oplog.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "call-started",
                "assigned",
                "wall-clock",
                "fenced",
                "assigned",
                "random",
                "outcome"
            ],
            "{backend}"
        );
        let seqs: Vec<u64> = oplog.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..7).collect::<Vec<u64>>());
        let epochs: Vec<u64> = oplog.iter().map(|e| e.epoch).collect();
        assert_eq!(epochs, [0, 1, 1, 2, 3, 3, 3], "{backend}");
        assert_eq!(
            oplog[1].entry().unwrap(),
            OplogEntry::Assigned(Assigned {
                worker: "w1".into(),
                epoch: 1,
                workspace_version: None,
            })
        );
        assert!(matches!(store.get_call("nope").await, Ok(None)));
        assert!(matches!(
            store.assign_call("nope", "w").await,
            Err(StoreError::NotFound(_))
        ));
    }
}

#[tokio::test]
async fn idempotency_keys_return_the_first_call_or_refuse_a_different_one() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let first = store
            .create_call(new_call("k1", Some("key"), json!({"a": 1})))
            .await
            .unwrap();
        assert!(matches!(first, Created::New(_)), "{backend}");
        let again = store
            .create_call(new_call("k2", Some("key"), json!({"a": 1})))
            .await
            .unwrap();
        let Created::Existing(existing) = again else {
            panic!("{backend}: the first call again")
        };
        assert_eq!(existing.id, "k1");
        let conflict = store
            .create_call(new_call("k3", Some("key"), json!({"a": 2})))
            .await;
        assert!(
            matches!(&conflict, Err(StoreError::IdempotencyConflict { existing, .. }) if existing == "k1"),
            "{backend}: {conflict:?}"
        );
        let mut elsewhere = new_call("k4", Some("key"), json!({"a": 1}));
        elsewhere.namespace = "other".into();
        assert!(
            matches!(store.create_call(elsewhere).await.unwrap(), Created::New(_)),
            "keys are per namespace"
        );
        // Keys are per agent: another agent's same key is another call, found under its
        // own scope only.
        let mut by_agent = new_call("k5", Some("key"), json!({"a": 9}));
        by_agent.spec.access.agent = Some("reporter".into());
        assert!(
            matches!(store.create_call(by_agent).await.unwrap(), Created::New(_)),
            "{backend}: keys are per agent"
        );
        let mut again_by_agent = new_call("k6", Some("key"), json!({"a": 9}));
        again_by_agent.spec.access.agent = Some("reporter".into());
        let Created::Existing(existing) = store.create_call(again_by_agent).await.unwrap() else {
            panic!("{backend}: the agent's first call again")
        };
        assert_eq!(existing.id, "k5");
        assert_eq!(
            store
                .find_call_by_key("default", "reporter", "key")
                .await
                .unwrap()
                .unwrap()
                .id,
            "k5"
        );
        let mine = store
            .list_calls(&CallFilter {
                agent: Some("reporter".into()),
                limit: 10,
                ..CallFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(
            mine.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["k5"],
            "{backend}: an agent's listing holds its calls only"
        );
        assert_eq!(
            store
                .find_call_by_key("default", "", "key")
                .await
                .unwrap()
                .unwrap()
                .id,
            "k1"
        );
        assert!(
            store
                .find_call_by_key("default", "", "missing")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store.get_call("k3").await.unwrap().is_none(),
            "{backend}: the refused call left nothing"
        );
    }
}

#[tokio::test]
async fn failures_listing_and_unfinished_calls() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        for id in ["a", "b", "c"] {
            store
                .create_call(new_call(id, None, json!({"id": id})))
                .await
                .unwrap();
            // Distinct creation times keep the order stable.
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
        store.assign_call("b", "w").await.unwrap();
        let error = CallError::new(ErrorKind::Timeout, "too slow");
        let failed = store.fail_call("c", error.clone()).await.unwrap();
        assert_eq!(failed.state, CallState::Failed);
        assert_eq!(failed.error, Some(error));
        assert_eq!(
            store.oplog("c").await.unwrap().last().unwrap().kind,
            "outcome"
        );

        let unfinished: Vec<String> = store
            .unfinished_calls()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(unfinished, ["a", "b"], "{backend}");
        let listed: Vec<String> = store
            .list_calls(&CallFilter {
                limit: 2,
                ..CallFilter::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(listed, ["c", "b"], "{backend}: newest first, limited");
        let none = store
            .list_calls(&CallFilter {
                tool: Some("other".into()),
                limit: 10,
                ..CallFilter::default()
            })
            .await
            .unwrap();
        assert!(none.is_empty());
    }
}

#[tokio::test]
async fn artifacts_and_resource_records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let bytes: Vec<u8> = (0..=255u8).cycle().take(3 << 20).collect();
        store
            .put_artifact("sha256:big", bytes.clone())
            .await
            .unwrap();
        store
            .put_artifact("sha256:big", bytes.clone())
            .await
            .unwrap();
        assert_eq!(
            store.get_artifact("sha256:big").await.unwrap().as_deref(),
            Some(bytes.as_slice()),
            "{backend}"
        );
        assert!(store.get_artifact("sha256:none").await.unwrap().is_none());

        let record = |name: &str, generation| ResourceRecord {
            kind: "Tool".into(),
            namespace: "default".into(),
            name: name.into(),
            spec_hash: "h".into(),
            generation,
            status: json!({"observedGeneration": generation}),
        };
        store
            .save_resources(vec![record("a", 1), record("b", 2)])
            .await
            .unwrap();
        store.save_resources(vec![record("b", 3)]).await.unwrap();
        let loaded = store.load_resources().await.unwrap();
        assert_eq!(loaded, vec![record("b", 3)], "{backend}: saving replaces");

        // An update writes and deletes only the records it names.
        store
            .save_resources(vec![record("b", 3), record("c", 1), record("d", 1)])
            .await
            .unwrap();
        store
            .update_resources(toolgrid_store::ResourceChanges {
                saved: vec![record("c", 2), record("e", 1)],
                removed: vec![record("d", 1).key()],
            })
            .await
            .unwrap();
        let mut loaded = store.load_resources().await.unwrap();
        loaded.sort_by_key(ResourceRecord::key);
        assert_eq!(
            loaded,
            vec![record("b", 3), record("c", 2), record("e", 1)],
            "{backend}: an update keeps what it does not name"
        );
        // Applied again (a retried write), the same.
        store
            .update_resources(toolgrid_store::ResourceChanges {
                saved: vec![record("c", 2)],
                removed: vec![record("d", 1).key()],
            })
            .await
            .unwrap();
        let mut again = store.load_resources().await.unwrap();
        again.sort_by_key(ResourceRecord::key);
        assert_eq!(again, loaded, "{backend}");
    }
}

#[tokio::test]
async fn console_sessions_are_shared_touched_deleted_and_purged() {
    use toolgrid_core::auth::{ConsoleSession, Principal, SessionCheck, SessionLimits};
    use toolgrid_core::ids::ObjectKey;
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        // A second opening of the same database: another replica.
        let replica = toolgrid_store::open(&url).await.unwrap();
        let limits = SessionLimits {
            idle: Duration::from_secs(60),
            lifetime: Duration::from_secs(600),
        };
        let t0 = 1_700_000_000_000i64;
        let agent = ConsoleSession::new(
            [7; 32],
            Principal::Agent {
                agent: ObjectKey::new("team", "bot"),
            },
            limits,
            t0,
        );
        let operator = ConsoleSession::new(
            [8; 32],
            Principal::Operator {
                subject: "system:serviceaccount:ops:alice".into(),
            },
            limits,
            t0,
        );
        store.create_console_session(agent.clone()).await.unwrap();
        store
            .create_console_session(operator.clone())
            .await
            .unwrap();
        assert_eq!(
            replica.console_session(&[7; 32]).await.unwrap(),
            Some(agent.clone()),
            "{backend}: another replica reads the session"
        );
        assert_eq!(
            replica.console_session(&[8; 32]).await.unwrap(),
            Some(operator.clone()),
            "{backend}"
        );
        assert_eq!(store.console_session(&[9; 32]).await.unwrap(), None);

        // A use recorded on one replica is seen on the other, and never moves back.
        replica
            .touch_console_session(&[7; 32], t0 + 50_000)
            .await
            .unwrap();
        store
            .touch_console_session(&[7; 32], t0 + 40_000)
            .await
            .unwrap();
        let touched = store.console_session(&[7; 32]).await.unwrap().unwrap();
        assert_eq!(touched.last_seen_ms, t0 + 50_000, "{backend}");
        assert_eq!(
            touched.check(t0 + 100_000),
            SessionCheck::Valid { touch: true },
            "{backend}"
        );

        // Purging at t0 + 70 s: the untouched operator session is idle, the agent's is not.
        assert_eq!(
            store.purge_console_sessions(t0 + 70_000).await.unwrap(),
            1,
            "{backend}"
        );
        assert_eq!(store.console_session(&[8; 32]).await.unwrap(), None);
        assert!(store.console_session(&[7; 32]).await.unwrap().is_some());

        // Logout on one replica: gone on the other at once.
        assert!(replica.delete_console_session(&[7; 32]).await.unwrap());
        assert_eq!(
            store.console_session(&[7; 32]).await.unwrap(),
            None,
            "{backend}"
        );
        assert!(!store.delete_console_session(&[7; 32]).await.unwrap());

        // Past its absolute expiry a session is purged however recently used.
        let busy = ConsoleSession::new([10; 32], operator.principal.clone(), limits, t0);
        store.create_console_session(busy).await.unwrap();
        store
            .touch_console_session(&[10; 32], t0 + 599_000)
            .await
            .unwrap();
        assert_eq!(store.purge_console_sessions(t0 + 599_500).await.unwrap(), 0);
        assert_eq!(
            store.purge_console_sessions(t0 + 600_000).await.unwrap(),
            1,
            "{backend}"
        );
    }
}

#[tokio::test]
async fn concurrent_appends_are_group_committed_in_order_per_call() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = Arc::new(toolgrid_store::SqlStore::open(&url).await.unwrap());
        let calls: u64 = 16;
        let appends_per_call: u64 = 25;
        for i in 0..calls {
            let id = format!("g{i}");
            store
                .create_call(new_call(&id, None, json!({"i": i})))
                .await
                .unwrap();
            store.assign_call(&id, "w").await.unwrap();
        }
        let counters = store.write_counters();
        let before = counters.commits();
        let synced_before = counters.syncs();
        let mut tasks = Vec::new();
        for i in 0..calls {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for n in 0..appends_per_call {
                    store
                        .append_oplog(
                            &format!("g{i}"),
                            1,
                            n,
                            vec![OplogEntry::MonotonicClock(MonotonicClock { ns: n })],
                        )
                        .await
                        .unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        // Group commit: the 16 writers' appends share transactions, so there are far fewer
        // commits than appends; one transaction per append fails here.
        let appends = calls * appends_per_call;
        let commits = counters.commits() - before;
        assert!(
            commits > 0 && commits <= appends / 4,
            "{backend}: {appends} concurrent appends took {commits} commits"
        );
        // Every commit was made durable by a sync: on SQLite one sync of the log makes all
        // the batches committed before it durable, on PostgreSQL each commit is synced.
        let syncs = counters.syncs() - synced_before;
        match backend.as_str() {
            "postgres" => assert_eq!(syncs, commits, "{backend}"),
            _ => assert!(
                syncs > 0 && syncs <= commits,
                "{backend}: {syncs} syncs for {commits} commits"
            ),
        }
        // A lone write is committed and synced on its own.
        let (commits, syncs) = (counters.commits(), counters.syncs());
        store
            .create_call(new_call("lone", None, json!({})))
            .await
            .unwrap();
        assert_eq!(
            (counters.commits(), counters.syncs()),
            (commits + 1, syncs + 1),
            "{backend}"
        );
        for i in 0..calls {
            let oplog = store.oplog(&format!("g{i}")).await.unwrap();
            let ns: Vec<i64> = oplog
                .iter()
                .filter_map(|e| match e.entry() {
                    Ok(OplogEntry::MonotonicClock(MonotonicClock { ns })) => Some(ns as i64),
                    _ => None,
                })
                .collect();
            assert_eq!(
                ns,
                (0..appends_per_call as i64).collect::<Vec<i64>>(),
                "{backend}: call g{i} keeps its order"
            );
            let seqs: Vec<u64> = oplog.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (0..oplog.len() as u64).collect::<Vec<u64>>());
        }
    }
}

#[tokio::test]
async fn committed_calls_survive_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        {
            let store = toolgrid_store::open(&url).await.unwrap();
            store
                .create_call(new_call("d1", Some("durable"), json!({})))
                .await
                .unwrap();
            store.assign_call("d1", "w").await.unwrap();
            store
                .complete_call("d1", 1, 0, vec![], success(json!({"kept": true})))
                .await
                .unwrap();
        }
        let store = toolgrid_store::open(&url).await.unwrap();
        let call = store
            .get_call("d1")
            .await
            .unwrap()
            .expect("the call is still there");
        assert_eq!(call.result, Some(json!({"kept": true})), "{backend}");
        assert_eq!(store.oplog("d1").await.unwrap().len(), 3);
    }
}

#[tokio::test]
async fn admissions_and_assignments_answered_at_their_commit_are_visible_then_durable() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        {
            let store = toolgrid_store::open(&url).await.unwrap();
            let mut call = new_call("e1", Some("early"), json!({}));
            call.assign_to = Some("w".into());
            let (created, durable) = store.create_call_applied(call).await.unwrap();
            let Created::New(record) = created else {
                panic!("{backend}: a new call");
            };
            assert_eq!((record.epoch, record.worker.as_deref()), (1, Some("w")));
            // Committed: every reader sees it, assigned, before the sync answers.
            let read = store.get_call("e1").await.unwrap().expect("visible");
            assert_eq!(
                read.state,
                toolgrid_core::call::CallState::Running,
                "{backend}"
            );
            durable.wait().await.unwrap();
            // The same key, answered early too: the earlier call.
            let (again, durable) = store
                .create_call_applied(new_call("e2", Some("early"), json!({})))
                .await
                .unwrap();
            assert!(
                matches!(again, Created::Existing(ref c) if c.id == "e1"),
                "{backend}"
            );
            durable.wait().await.unwrap();
            // An assignment answered at its commit: visible at once, then durable.
            store
                .create_call(new_call("e3", None, json!({"n": 3})))
                .await
                .unwrap();
            let (epoch, durable) = store.assign_call_applied("e3", "w2").await.unwrap();
            assert_eq!(epoch, 1, "{backend}");
            let read = store.get_call("e3").await.unwrap().expect("visible");
            assert_eq!(
                (read.state, read.worker.as_deref()),
                (toolgrid_core::call::CallState::Running, Some("w2")),
                "{backend}"
            );
            durable.wait().await.unwrap();
        }
        let store = toolgrid_store::open(&url).await.unwrap();
        assert!(store.get_call("e1").await.unwrap().is_some(), "{backend}");
        assert!(store.get_call("e2").await.unwrap().is_none(), "{backend}");
        let kept = store.get_call("e3").await.unwrap().expect("kept");
        assert_eq!(kept.epoch, 1, "{backend}: the assignment kept");
    }
}

/// The schema as it was before versions existed (migration 1), to create an old database.
fn unversioned_schema(blob: &str) -> Vec<String> {
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

/// A plain connection to the database behind a store URL.
async fn raw_connection(backend: &str, url: &str) -> sqlx::AnyConnection {
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let url = match backend {
        "sqlite" => format!("{url}?mode=rwc"),
        _ => url.to_string(),
    };
    sqlx::AnyConnection::connect(&url).await.unwrap()
}

async fn schema_version(conn: &mut sqlx::AnyConnection) -> i64 {
    use sqlx::Row;
    sqlx::query("SELECT version FROM schema_version")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .try_get("version")
        .unwrap()
}

#[tokio::test]
async fn an_old_database_is_upgraded_in_place_and_a_newer_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        {
            let mut conn = raw_connection(&backend, &url).await;
            let blob = if backend == "sqlite" { "BLOB" } else { "BYTEA" };
            for statement in unversioned_schema(blob) {
                sqlx::query(sqlx::AssertSqlSafe(statement))
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
            // A running call written by the old code: one entry, epoch 1.
            sqlx::query(
                "INSERT INTO calls (id, namespace, tool, command, release, release_digest, state, \
                 args_json, spec_json, stdin, idempotency_key, request_hash, epoch, worker, next_seq, \
                 result_json, error_json, created_at_ms, finished_at_ms) VALUES ('old', 'default', \
                 'semver', 'compare', 'semver-1.0.0', 'sha256:00', 'running', '{}', '{\"pool\": \"p\", \
                 \"argv\": [], \"limits\": {\"memoryBytes\": 0, \"cpuTimeMs\": 0, \"outputBytes\": 0, \
                 \"timeoutMs\": 0}, \"effect\": \"read\", \"command\": {\"name\": \"compare\"}}', $1, NULL, \
                 'h', 1, 'w', 2, NULL, NULL, 1, NULL)",
            )
            .bind(b"x".as_slice())
            .execute(&mut conn)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO oplog (call_id, seq, epoch, kind, payload, recorded_at_ms) \
                 VALUES ('old', 0, 0, 'call-started', '{}', 1), ('old', 1, 1, 'assigned', '{}', 1)",
            )
            .execute(&mut conn)
            .await
            .unwrap();
            // Two artifacts, one stored long ago and one an hour from now.
            sqlx::query(
                "INSERT INTO artifacts (digest, size, bytes, created_at_ms) \
                 VALUES ('sha256:old', 1, $1, 1), ('sha256:new', 1, $2, $3)",
            )
            .bind(b"o".as_slice())
            .bind(b"n".as_slice())
            .bind(toolgrid_store::now_ms() + 3_600_000)
            .execute(&mut conn)
            .await
            .unwrap();
        }

        let store = toolgrid_store::open(&url).await.unwrap();
        let mut conn = raw_connection(&backend, &url).await;
        assert_eq!(schema_version(&mut conn).await, SCHEMA_VERSION, "{backend}");
        for (digest, bytes) in [("sha256:old", b"o"), ("sha256:new", b"n")] {
            assert_eq!(
                store.get_artifact(digest).await.unwrap().as_deref(),
                Some(bytes.as_slice()),
                "{backend}: {digest}"
            );
        }
        let old = store.get_call("old").await.unwrap().expect("the old call");
        assert_eq!(old.state, CallState::Running, "{backend}");
        // Its command's definition is still the one in its spec.
        assert_eq!(
            old.spec.command.as_ref().map(|c| c.name.as_str()),
            Some("compare"),
            "{backend}"
        );
        store
            .append_oplog(
                "old",
                1,
                0,
                vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 1 })],
            )
            .await
            .unwrap();
        let done = store
            .complete_call("old", 1, 1, vec![], success(json!("ok")))
            .await
            .unwrap();
        assert_eq!(done.state, CallState::Succeeded);
        assert_eq!(
            done.spec.command.as_ref().map(|c| c.name.as_str()),
            Some("compare"),
            "{backend}"
        );
        assert_eq!(store.oplog("old").await.unwrap().len(), 4, "{backend}");
        drop(store);

        // Opening again changes nothing.
        let store = toolgrid_store::open(&url).await.unwrap();
        assert_eq!(schema_version(&mut conn).await, SCHEMA_VERSION);
        assert_eq!(store.oplog("old").await.unwrap().len(), 4, "{backend}");
        // The artifacts kept their times: retention deletes the one stored long ago.
        let report = store
            .delete_finished_before(toolgrid_store::now_ms(), &HashSet::new())
            .await
            .unwrap();
        assert_eq!(report.artifacts, ["sha256:old"], "{backend}");
        assert!(store.get_artifact("sha256:new").await.unwrap().is_some());
        drop(store);

        // A store written by a newer binary is refused, untouched.
        sqlx::query("UPDATE schema_version SET version = $1")
            .bind(SCHEMA_VERSION + 1)
            .execute(&mut conn)
            .await
            .unwrap();
        let refused = toolgrid_store::open(&url).await.err();
        assert!(
            matches!(refused, Some(StoreError::SchemaTooNew { found, supported })
                if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
            "{backend}: {refused:?}"
        );
        assert_eq!(schema_version(&mut conn).await, SCHEMA_VERSION + 1);
    }
}

/// Two control planes on one PostgreSQL database store the same artifact at once (each
/// found it missing): the second's insert waits for the first's and keeps its row.
#[tokio::test]
async fn an_artifact_stored_by_two_control_planes_at_once_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        if backend != "postgres" {
            continue;
        }
        let store = toolgrid_store::open(&url).await.unwrap();
        // The other control plane's insert, not yet committed: the store does not see it,
        // and its own insert of the same digest waits for it.
        let mut other = raw_connection(&backend, &url).await;
        sqlx::query("BEGIN").execute(&mut other).await.unwrap();
        sqlx::query("INSERT INTO artifacts (digest, size, bytes) VALUES ('sha256:both', 4, $1)")
            .bind(b"both".as_slice())
            .execute(&mut other)
            .await
            .unwrap();
        let put = tokio::spawn({
            let store = store.clone();
            async move { store.put_artifact("sha256:both", b"both".to_vec()).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("COMMIT").execute(&mut other).await.unwrap();
        put.await
            .unwrap()
            .expect("stored once, by whichever came first");
        assert_eq!(
            store.get_artifact("sha256:both").await.unwrap().as_deref(),
            Some(b"both".as_slice())
        );
    }
}

#[tokio::test]
async fn repeated_appends_and_completions_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        store
            .create_call(new_call("i1", None, json!({})))
            .await
            .unwrap();
        assert_eq!(store.assign_call("i1", "w").await.unwrap(), 1);
        let two = || {
            vec![
                OplogEntry::MonotonicClock(MonotonicClock { ns: 0 }),
                OplogEntry::MonotonicClock(MonotonicClock { ns: 1 }),
            ]
        };
        store.append_oplog("i1", 1, 0, two()).await.unwrap();
        // The same append again (its commit's outcome was unknown to the worker).
        store.append_oplog("i1", 1, 0, two()).await.unwrap();
        store
            .append_oplog(
                "i1",
                1,
                2,
                vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 2 })],
            )
            .await
            .unwrap();
        let done = store
            .complete_call(
                "i1",
                1,
                3,
                vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 3 })],
                success(json!(7)),
            )
            .await
            .unwrap();
        // The same completion again returns the ended call; a different one is refused.
        let again = store
            .complete_call(
                "i1",
                1,
                3,
                vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 3 })],
                success(json!(7)),
            )
            .await
            .unwrap();
        assert_eq!(again, done, "{backend}");
        assert!(
            is_stale(
                store
                    .complete_call("i1", 1, 3, vec![], success(json!(8)))
                    .await
            ),
            "{backend}"
        );
        assert!(
            is_stale(
                store
                    .complete_call("i1", 2, 3, vec![], success(json!(7)))
                    .await
            ),
            "{backend}: another epoch"
        );
        let oplog = store.oplog("i1").await.unwrap();
        let ns: Vec<i64> = oplog
            .iter()
            .filter_map(|e| match e.entry() {
                Ok(OplogEntry::MonotonicClock(MonotonicClock { ns })) => Some(ns as i64),
                _ => None,
            })
            .collect();
        assert_eq!(ns, [0, 1, 2, 3], "{backend}: each entry once");
        let seqs: Vec<u64> = oplog.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..7).collect::<Vec<u64>>(), "{backend}: no gaps");
        assert_eq!(oplog.last().unwrap().kind, "outcome");
    }
}

fn failure() -> CallError {
    CallError::new(ErrorKind::Timeout, "too slow")
}

/// A command definition with `description`.
fn command_definition(description: &str) -> toolgrid_core::spec::Command {
    serde_json::from_value(json!({
        "name": "compare",
        "description": description,
        "positional": [
            {"name": "a", "description": "The first version.", "schema": {"type": "string"}, "required": true},
            {"name": "b", "description": "The second version.", "schema": {"type": "string"}, "required": true}
        ],
        "result": {"type": "object", "properties": {"order": {"type": "integer", "enum": [-1, 0, 1]}}},
        "errors": [{"name": "invalid-version", "exitCode": 3, "description": "Not a version."}]
    }))
    .unwrap()
}

async fn count(conn: &mut sqlx::AnyConnection, sql: &'static str) -> i64 {
    use sqlx::Row;
    sqlx::query(sql)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .try_get::<i64, _>(0)
        .unwrap()
}

#[tokio::test]
async fn a_command_definition_is_stored_once_and_read_back_with_each_call() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let long = "Compares two versions by precedence. ".repeat(40);
        let first = Arc::new(command_definition(&long));
        let second = Arc::new(command_definition("Changed."));
        // Three calls of one definition (one answered at its commit), one of another, one
        // of none.
        for (id, command) in [
            ("c1", Some(&first)),
            ("c2", Some(&first)),
            ("c4", Some(&second)),
            ("c5", None),
        ] {
            let mut call = new_call(id, None, json!({"id": id}));
            call.spec.command = command.cloned();
            let Created::New(record) = store.create_call(call).await.unwrap() else {
                panic!("{backend}: {id} not created");
            };
            assert_eq!(record.spec.command.as_ref(), command, "{backend}");
        }
        let mut call = new_call("c3", None, json!({"id": "c3"}));
        call.spec.command = Some(first.clone());
        let (created, durable) = store.create_call_applied(call).await.unwrap();
        durable.wait().await.unwrap();
        assert!(matches!(created, Created::New(_)), "{backend}");

        let mut conn = raw_connection(&backend, &url).await;
        assert_eq!(
            count(&mut conn, "SELECT COUNT(*) FROM call_commands").await,
            2,
            "{backend}"
        );
        // The rows hold no definition, and name theirs.
        assert_eq!(
            count(
                &mut conn,
                "SELECT COUNT(*) FROM calls WHERE spec_json LIKE '%precedence%'                  OR spec_json LIKE '%\"command\":{%'"
            )
            .await,
            0,
            "{backend}"
        );
        assert_eq!(
            count(
                &mut conn,
                "SELECT COUNT(*) FROM calls WHERE command_digest IS NOT NULL"
            )
            .await,
            4,
            "{backend}"
        );

        // Every read brings the definition back: one call, a listing, the unfinished ones,
        // the record a completion answers.
        for (id, command) in [
            ("c1", Some(&first)),
            ("c3", Some(&first)),
            ("c4", Some(&second)),
            ("c5", None),
        ] {
            let record = store.get_call(id).await.unwrap().unwrap();
            assert_eq!(record.spec.command.as_ref(), command, "{backend}: {id}");
        }
        let listed = store.list_calls(&CallFilter::default()).await.unwrap();
        assert_eq!(listed.len(), 5, "{backend}");
        for record in &listed {
            let expected = match record.id.as_str() {
                "c4" => Some(&second),
                "c5" => None,
                _ => Some(&first),
            };
            assert_eq!(record.spec.command.as_ref(), expected, "{backend}");
        }
        let unfinished = store.unfinished_calls().await.unwrap();
        assert_eq!(unfinished.len(), 5, "{backend}");
        assert!(
            unfinished
                .iter()
                .all(|r| r.id == "c5" || r.spec.command.is_some())
        );
        assert_eq!(store.assign_call("c1", "w").await.unwrap(), 1);
        let done = store
            .complete_call("c1", 1, 0, vec![], success(json!({"order": 1})))
            .await
            .unwrap();
        assert_eq!(done.spec.command.as_ref(), Some(&first), "{backend}");

        // Retention: a definition goes with the last call that names it.
        for id in ["c2", "c3", "c4", "c5"] {
            store.fail_call(id, failure()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let cutoff = toolgrid_store::now_ms();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut young = new_call("c6", None, json!({"id": "c6"}));
        young.spec.command = Some(second.clone());
        store.create_call(young).await.unwrap();
        let report = store
            .delete_finished_before(cutoff, &HashSet::new())
            .await
            .unwrap();
        assert_eq!(report.calls, 5, "{backend}");
        // `first` went with c1, c2 and c3; `second` stays for c6.
        assert_eq!(report.commands, 1, "{backend}");
        assert_eq!(
            count(&mut conn, "SELECT COUNT(*) FROM call_commands").await,
            1,
            "{backend}"
        );
        let kept = store.get_call("c6").await.unwrap().unwrap();
        assert_eq!(kept.spec.command.as_ref(), Some(&second), "{backend}");

        // A row whose definition is gone is refused as corrupt, not read without it.
        sqlx::query("DELETE FROM call_commands")
            .execute(&mut conn)
            .await
            .unwrap();
        let missing = store.get_call("c6").await;
        assert!(
            matches!(&missing, Err(StoreError::Corrupt(m)) if m.contains("is missing")),
            "{backend}: {missing:?}"
        );
    }
}

#[tokio::test]
async fn retention_deletes_old_finished_calls_and_unused_artifacts_only() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let with_digest = |id: &str, digest: &str| {
            let mut call = new_call(id, None, json!({"id": id}));
            call.release_digest = digest.into();
            call
        };
        for digest in ["a", "b", "c", "d", "e", "f", "g", "h", "j", "k"] {
            store
                .put_artifact(&format!("sha256:{digest}"), digest.as_bytes().to_vec())
                .await
                .unwrap();
        }
        // Old: a succeeded, b failed, f succeeded (but f is kept); d pending, e running.
        for (id, digest) in [
            ("old-a", "sha256:a"),
            ("old-b", "sha256:b"),
            ("old-f", "sha256:f"),
        ] {
            let mut call = with_digest(id, digest);
            if id == "old-b" {
                call.spec.files = vec![toolgrid_core::artifact::FileRef {
                    path: "/lib/g".into(),
                    digest: "sha256:g".into(),
                    size: 1,
                }];
            }
            store.create_call(call).await.unwrap();
        }
        store.assign_call("old-a", "w").await.unwrap();
        store
            .append_oplog(
                "old-a",
                1,
                0,
                vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 1 })],
            )
            .await
            .unwrap();
        store
            .complete_call("old-a", 1, 1, vec![], success(json!(1)))
            .await
            .unwrap();
        store.fail_call("old-b", failure()).await.unwrap();
        store.fail_call("old-f", failure()).await.unwrap();
        store
            .create_call(with_digest("pending-d", "sha256:d"))
            .await
            .unwrap();
        // running-e mounts file j of its release (its release may be gone meanwhile);
        // old-b mounted g, and has ended.
        let mut running = with_digest("running-e", "sha256:e");
        running.spec.files = vec![toolgrid_core::artifact::FileRef {
            path: "/lib/j".into(),
            digest: "sha256:j".into(),
            size: 1,
        }];
        store.create_call(running).await.unwrap();
        store.assign_call("running-e", "w").await.unwrap();
        // More old calls than one retention batch deletes.
        let many = 450;
        let mut tasks = Vec::new();
        for i in 0..many {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let id = format!("bulk-{i}");
                store
                    .create_call(new_call(&id, None, json!({"i": i})))
                    .await
                    .unwrap();
                store.fail_call(&id, failure()).await.unwrap();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }

        tokio::time::sleep(Duration::from_millis(20)).await;
        let cutoff = toolgrid_store::now_ms();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Young: c succeeded after the cutoff; i stored after the cutoff.
        store
            .create_call(with_digest("young-c", "sha256:c"))
            .await
            .unwrap();
        store.fail_call("young-c", failure()).await.unwrap();
        store.put_artifact("sha256:i", b"i".to_vec()).await.unwrap();
        // k was stored before the cutoff and again after it: storing refreshes its time.
        store.put_artifact("sha256:k", b"k".to_vec()).await.unwrap();

        let keep: HashSet<String> = ["sha256:f", "sha256:h"].map(String::from).into();
        let report = store.delete_finished_before(cutoff, &keep).await.unwrap();
        assert_eq!(report.calls, 3 + many, "{backend}");
        // call-started, assigned, random, outcome; call-started, outcome for the rest.
        assert_eq!(report.oplog_entries, 4 + 2 * (2 + many), "{backend}");
        assert_eq!(
            report.artifacts,
            ["sha256:a", "sha256:b", "sha256:g"],
            "{backend}"
        );
        assert!(store.artifact_purges() > 0);

        for gone in ["old-a", "old-b", "old-f", "bulk-0", "bulk-449"] {
            assert!(
                store.get_call(gone).await.unwrap().is_none(),
                "{backend}: {gone}"
            );
            assert!(
                store.oplog(gone).await.unwrap().is_empty(),
                "{backend}: {gone}"
            );
        }
        for kept in ["pending-d", "running-e", "young-c"] {
            assert!(
                store.get_call(kept).await.unwrap().is_some(),
                "{backend}: {kept}"
            );
            assert!(
                !store.oplog(kept).await.unwrap().is_empty(),
                "{backend}: {kept}"
            );
        }
        for digest in ["a", "b", "g"] {
            let digest = format!("sha256:{digest}");
            assert!(
                store.get_artifact(&digest).await.unwrap().is_none(),
                "{backend}: {digest}"
            );
        }
        for digest in ["c", "d", "e", "f", "h", "i", "j", "k"] {
            let digest = format!("sha256:{digest}");
            assert!(
                store.get_artifact(&digest).await.unwrap().is_some(),
                "{backend}: {digest}"
            );
        }

        // Nothing in flight was touched: the calls go on.
        store
            .append_oplog(
                "running-e",
                1,
                0,
                vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 2 })],
            )
            .await
            .unwrap();
        store
            .complete_call("running-e", 1, 1, vec![], success(json!(2)))
            .await
            .unwrap();
        assert_eq!(store.assign_call("pending-d", "w").await.unwrap(), 1);

        // Again: nothing left to delete but j, which running-e no longer needs once ended.
        let report = store.delete_finished_before(cutoff, &keep).await.unwrap();
        assert_eq!(
            report,
            toolgrid_store::RetentionReport {
                artifacts: vec!["sha256:j".into()],
                ..Default::default()
            },
            "{backend}"
        );
    }
}

#[tokio::test]
async fn writes_wait_out_an_sqlite_lock_held_past_the_busy_timeout() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = toolgrid_store::open_with(
        &format!("sqlite://{}?busy_timeout_ms=200", path.display()),
        OpenOptions {
            retry: RetryPolicy {
                give_up_after: Duration::from_secs(20),
                ..RetryPolicy::default()
            },
            ..OpenOptions::default()
        },
    )
    .await
    .unwrap();
    store
        .create_call(new_call("l1", None, json!({})))
        .await
        .unwrap();
    store.assign_call("l1", "w").await.unwrap();

    let mut holder = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .unwrap();
    let locked_at = Instant::now();
    let writes = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .append_oplog(
                    "l1",
                    1,
                    0,
                    vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 0 })],
                )
                .await?;
            store
                .complete_call(
                    "l1",
                    1,
                    1,
                    vec![OplogEntry::MonotonicClock(MonotonicClock { ns: 1 })],
                    success(json!("done")),
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!writes.is_finished(), "the writes wait for the lock");
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let done = writes
        .await
        .unwrap()
        .expect("the writes succeed once the lock is gone");
    assert!(locked_at.elapsed() >= Duration::from_secs(2));
    assert_eq!(done.state, CallState::Succeeded);
    let ns: Vec<i64> = store
        .oplog("l1")
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match e.entry() {
            Ok(OplogEntry::MonotonicClock(MonotonicClock { ns })) => Some(ns as i64),
            _ => None,
        })
        .collect();
    assert_eq!(ns, [0, 1], "each entry exactly once");

    // A lock that outlasts the retries fails the write by name.
    let short = toolgrid_store::open_with(
        &format!("sqlite://{}?busy_timeout_ms=50", path.display()),
        OpenOptions {
            retry: RetryPolicy {
                first_delay: Duration::from_millis(10),
                max_delay: Duration::from_millis(50),
                give_up_after: Duration::from_millis(400),
            },
            ..OpenOptions::default()
        },
    )
    .await
    .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .unwrap();
    let failed = short.create_call(new_call("l2", None, json!({}))).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable { attempts, .. }) if attempts > 1),
        "{failed:?}"
    );
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    assert!(matches!(
        short.create_call(new_call("l2", None, json!({}))).await,
        Ok(Created::New(_))
    ));
}

#[tokio::test]
async fn appends_across_a_postgres_restart_are_stored_exactly_once() {
    let Some(admin) = postgres_admin_url() else {
        return;
    };
    // Every other case waits while the server restarts.
    let _alone = SERVER.write().await;
    let url = fresh_postgres(&admin).await;
    let store = toolgrid_store::open(&url).await.unwrap();
    store
        .create_call(new_call("r1", None, json!({})))
        .await
        .unwrap();
    store.assign_call("r1", "w").await.unwrap();
    let appends = 60u64;
    let writer = tokio::spawn({
        let store = store.clone();
        async move {
            for n in 0..appends {
                store
                    .append_oplog(
                        "r1",
                        1,
                        n,
                        vec![OplogEntry::MonotonicClock(MonotonicClock { ns: n })],
                    )
                    .await
                    .map_err(|e| format!("append {n}: {e}"))?;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Ok::<_, String>(())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = tokio::task::spawn_blocking(restart_postgres).await.unwrap();
    match restarted {
        Some(result) => result.expect("restart PostgreSQL"),
        None => {
            toolgrid_testkit::require(
                "a PostgreSQL server this test can restart (root, .ci/start-postgres's)",
                false,
            );
        }
    }
    writer.await.unwrap().expect("every append succeeds");
    let ns: Vec<u64> = store
        .oplog("r1")
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match e.entry() {
            Ok(OplogEntry::MonotonicClock(MonotonicClock { ns })) => Some(ns),
            _ => None,
        })
        .collect();
    assert_eq!(
        ns,
        (0..appends).collect::<Vec<u64>>(),
        "each append exactly once"
    );
    // The store keeps working.
    let done = store
        .complete_call("r1", 1, appends, vec![], success(json!("after")))
        .await
        .unwrap();
    assert_eq!(done.state, CallState::Succeeded);
}

// ---- Workspaces -------------------------------------------------------------------------

/// A call acting for `agent` with `filesystem` access to its workspace.
fn agent_call(id: &str, agent: &str, filesystem: Filesystem) -> NewCall {
    let mut call = new_call(id, None, json!({"id": id}));
    call.spec.access = CallAccess {
        agent: Some(agent.into()),
        filesystem,
        ..CallAccess::default()
    };
    call
}

/// A commit of `files` with every blob sent along.
fn commit_of(files: &[(&str, &[u8])]) -> workspace::Commit {
    let rows = files.iter().map(|(path, bytes)| {
        (
            path.to_string(),
            workspace::blob_digest(bytes),
            bytes.len() as u64,
        )
    });
    workspace::Commit {
        tree: workspace::Tree::from_rows(rows).unwrap(),
        blobs: files
            .iter()
            .map(|(_, bytes)| (workspace::blob_digest(bytes), bytes.to_vec()))
            .collect(),
    }
}

fn succeeded_with(commit: workspace::Commit) -> CallOutcome {
    CallOutcome {
        workspace: Some(commit),
        ..success(json!({"ok": true}))
    }
}

async fn assigned(store: &Arc<dyn Store>, call: NewCall) -> u64 {
    let id = call.id.clone();
    store.create_call(call).await.unwrap();
    store.assign_call(&id, "w").await.unwrap()
}

async fn base_of(store: &Arc<dyn Store>, id: &str) -> Option<u64> {
    store.call_workspace(id).await.unwrap().and_then(|w| w.base)
}

#[tokio::test]
async fn a_read_write_call_commits_the_next_version_with_its_success_only() {
    use Filesystem::{ReadOnly, ReadWrite};
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let alice = WorkspaceKey::new("default", "alice");
        let bob = WorkspaceKey::new("default", "bob");
        let head = store.workspace_head(&alice).await.unwrap();
        assert_eq!(
            (head.version, head.tree.len()),
            (0, 0),
            "{backend}: starts empty"
        );

        // Success: version 1, with its blobs, in the same commit as the call's end.
        let epoch = assigned(&store, agent_call("w1", "alice", ReadWrite)).await;
        assert_eq!(base_of(&store, "w1").await, Some(0), "{backend}");
        let commit = commit_of(&[("notes/a.txt", b"hello"), ("b.bin", b"\x00\x01")]);
        let done = store
            .complete_call("w1", epoch, 0, vec![], succeeded_with(commit.clone()))
            .await
            .unwrap();
        assert_eq!(done.state, CallState::Succeeded, "{backend}");
        let head = store.workspace_head(&alice).await.unwrap();
        assert_eq!(head.version, 1, "{backend}");
        assert_eq!(head.tree, commit.tree, "{backend}");
        assert_eq!(head.tree_digest, commit.tree.digest(), "{backend}");
        assert_eq!(head.call_id, "w1", "{backend}");
        let digest = workspace::blob_digest(b"hello");
        assert_eq!(
            store.blobs(std::slice::from_ref(&digest)).await.unwrap(),
            vec![(digest.clone(), b"hello".to_vec())],
            "{backend}"
        );

        // A failed read-write call leaves no trace.
        let epoch = assigned(&store, agent_call("w2", "alice", ReadWrite)).await;
        assert_eq!(base_of(&store, "w2").await, Some(1), "{backend}");
        let failed = CallOutcome {
            result: Err(failure()),
            workspace: Some(commit_of(&[("junk", b"junk")])),
            ..success(json!(null))
        };
        store
            .complete_call("w2", epoch, 0, vec![], failed)
            .await
            .unwrap();
        assert_eq!(store.workspace_head(&alice).await.unwrap().version, 1);
        assert!(
            store
                .blobs(&[workspace::blob_digest(b"junk")])
                .await
                .unwrap()
                .is_empty()
        );

        // Fenced and re-assigned: the base stays where the first assignment found it, and
        // the success commits version 2 once, however often it is reported.
        let epoch = assigned(&store, agent_call("w3", "alice", ReadWrite)).await;
        store.fence_call("w3", epoch, "worker lost").await.unwrap();
        let epoch = store.assign_call("w3", "w-other").await.unwrap();
        assert_eq!(base_of(&store, "w3").await, Some(1), "{backend}");
        let pinned: Vec<Option<u64>> = store
            .oplog("w3")
            .await
            .unwrap()
            .iter()
            .filter_map(|r| match r.entry() {
                Ok(OplogEntry::Assigned(a)) => Some(a.workspace_version),
                _ => None,
            })
            .collect();
        assert_eq!(
            pinned,
            [Some(1), Some(1)],
            "{backend}: both assignments name V"
        );
        let next = commit_of(&[("notes/a.txt", b"hello again")]);
        for _ in 0..2 {
            store
                .complete_call("w3", epoch, 0, vec![], succeeded_with(next.clone()))
                .await
                .unwrap();
        }
        let history = store.workspace_history(&alice).await.unwrap();
        let versions: Vec<u64> = history.iter().map(|v| v.version).collect();
        assert_eq!(versions, [1, 2], "{backend}");
        assert_eq!(history[1].tree, next.tree);
        let v1 = store.workspace_version(&alice, 1).await.unwrap().unwrap();
        assert_eq!(
            v1.tree, commit.tree,
            "{backend}: an old version stays readable"
        );
        assert!(store.workspace_version(&alice, 3).await.unwrap().is_none());
        assert_eq!(
            store
                .workspace_version(&alice, 0)
                .await
                .unwrap()
                .unwrap()
                .tree
                .len(),
            0
        );

        // A read-only call cannot commit, whatever its worker sends.
        let epoch = assigned(&store, agent_call("r1", "alice", ReadOnly)).await;
        assert_eq!(base_of(&store, "r1").await, Some(2), "{backend}");
        let done = store
            .complete_call(
                "r1",
                epoch,
                0,
                vec![],
                succeeded_with(commit_of(&[("x", b"x")])),
            )
            .await
            .unwrap();
        assert_eq!(done.state, CallState::Failed, "{backend}");
        assert_eq!(done.error.unwrap().kind, ErrorKind::WorkspaceInvalid);
        assert_eq!(store.workspace_head(&alice).await.unwrap().version, 2);

        // Another agent's workspace is its own; a call without access sees none.
        let epoch = assigned(&store, agent_call("b1", "bob", ReadWrite)).await;
        assert_eq!(base_of(&store, "b1").await, Some(0), "{backend}");
        store
            .complete_call(
                "b1",
                epoch,
                0,
                vec![],
                succeeded_with(commit_of(&[("mine", b"bob")])),
            )
            .await
            .unwrap();
        assert_eq!(store.workspace_head(&bob).await.unwrap().version, 1);
        assert_eq!(store.workspace_head(&alice).await.unwrap().version, 2);
        let epoch = assigned(&store, agent_call("n1", "alice", Filesystem::None)).await;
        assert!(store.call_workspace("n1").await.unwrap().is_none());
        let _ = epoch;

        // Admission and assignment in one commit pin the base too.
        let mut call = agent_call("w4", "alice", ReadWrite);
        call.assign_to = Some("w".into());
        store.create_call(call).await.unwrap();
        assert_eq!(base_of(&store, "w4").await, Some(2), "{backend}");
    }
}

#[tokio::test]
async fn a_commit_on_a_moved_head_over_the_limit_or_with_bad_blobs_fails_the_call() {
    use Filesystem::ReadWrite;
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let alice = WorkspaceKey::new("default", "alice");
        // Two writers from the same base (the scheduler never does this; the store still
        // refuses the second).
        let e1 = assigned(&store, agent_call("c1", "alice", ReadWrite)).await;
        let e2 = assigned(&store, agent_call("c2", "alice", ReadWrite)).await;
        store
            .complete_call(
                "c1",
                e1,
                0,
                vec![],
                succeeded_with(commit_of(&[("a", b"1")])),
            )
            .await
            .unwrap();
        let done = store
            .complete_call(
                "c2",
                e2,
                0,
                vec![],
                succeeded_with(commit_of(&[("a", b"2")])),
            )
            .await
            .unwrap();
        assert_eq!(
            done.error.map(|e| e.kind),
            Some(ErrorKind::WorkspaceConflict),
            "{backend}"
        );
        assert_eq!(store.workspace_head(&alice).await.unwrap().version, 1);

        let refused = |id: &'static str, commit: workspace::Commit, kind: ErrorKind| {
            let store = store.clone();
            let backend = backend.clone();
            async move {
                let epoch = assigned(&store, agent_call(id, "alice", ReadWrite)).await;
                let done = store
                    .complete_call(id, epoch, 0, vec![], succeeded_with(commit))
                    .await
                    .unwrap();
                assert_eq!(done.error.map(|e| e.kind), Some(kind), "{backend}: {id}");
            }
        };
        // Over the file count (every file the same empty blob).
        let many = (0..=workspace::DEFAULT_MAX_FILES)
            .map(|i| (format!("f{i}"), workspace::blob_digest(b""), 0));
        let too_many = workspace::Commit {
            tree: workspace::Tree::from_rows(many).unwrap(),
            blobs: vec![(workspace::blob_digest(b""), Vec::new())],
        };
        refused("c3", too_many, ErrorKind::WorkspaceLimit).await;
        // Over the byte limit (a size the blob does not need to have to be counted).
        let big = workspace::Tree::from_rows([(
            "big".to_string(),
            workspace::blob_digest(b"1"),
            workspace::DEFAULT_MAX_BYTES + 1,
        )])
        .unwrap();
        refused(
            "c4",
            workspace::Commit {
                tree: big,
                blobs: vec![],
            },
            ErrorKind::WorkspaceLimit,
        )
        .await;
        // A blob whose bytes do not match its digest.
        let mut forged = commit_of(&[("a", b"3")]);
        forged.blobs[0].1 = b"not 3".to_vec();
        refused("c5", forged, ErrorKind::WorkspaceInvalid).await;
        // A digest neither sent nor stored.
        let mut missing = commit_of(&[("a", b"4")]);
        missing.blobs.clear();
        refused("c6", missing, ErrorKind::WorkspaceInvalid).await;
        assert_eq!(
            store.workspace_head(&alice).await.unwrap().version,
            1,
            "{backend}"
        );
        assert!(
            store
                .blobs(&[workspace::blob_digest(b"3")])
                .await
                .unwrap()
                .is_empty()
        );

        // A blob already stored need not be sent again.
        let mut reuse = commit_of(&[("a", b"1"), ("copy", b"1")]);
        reuse.blobs.clear();
        let epoch = assigned(&store, agent_call("c7", "alice", ReadWrite)).await;
        let done = store
            .complete_call("c7", epoch, 0, vec![], succeeded_with(reuse))
            .await
            .unwrap();
        assert_eq!(
            done.state,
            CallState::Succeeded,
            "{backend}: {:?}",
            done.error
        );
        assert_eq!(store.workspace_head(&alice).await.unwrap().version, 2);
    }
}

#[tokio::test]
async fn retention_keeps_every_workspace_version_and_blob() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let alice = WorkspaceKey::new("default", "alice");
        let epoch = assigned(&store, agent_call("w1", "alice", Filesystem::ReadWrite)).await;
        store
            .complete_call(
                "w1",
                epoch,
                0,
                vec![],
                succeeded_with(commit_of(&[("a", b"kept")])),
            )
            .await
            .unwrap();
        let report = store
            .delete_finished_before(toolgrid_store::now_ms() + 60_000, &HashSet::new())
            .await
            .unwrap();
        assert_eq!(
            report.calls, 1,
            "{backend}: the call that committed it is gone"
        );
        let head = store.workspace_head(&alice).await.unwrap();
        assert_eq!(head.version, 1, "{backend}");
        let digest = workspace::blob_digest(b"kept");
        assert_eq!(store.blobs(&[digest]).await.unwrap().len(), 1, "{backend}");
    }
}

// Middleware: rate-limit buckets, repeated calls, dry runs.

#[tokio::test]
async fn rate_buckets_start_full_refuse_when_empty_and_refill() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        // 3 tokens, one back a second; fake time.
        for _ in 0..3 {
            assert_eq!(
                store.take_token("b", 3, 1.0, 1_000).await.unwrap(),
                None,
                "{backend}"
            );
        }
        assert_eq!(
            store.take_token("b", 3, 1.0, 1_000).await.unwrap(),
            Some(1_000),
            "{backend}: empty, one token in a second"
        );
        assert_eq!(
            store.take_token("b", 3, 1.0, 1_600).await.unwrap(),
            Some(400),
            "{backend}"
        );
        assert_eq!(store.take_token("b", 3, 1.0, 2_000).await.unwrap(), None);
        // Another key is another bucket.
        assert_eq!(store.take_token("c", 1, 1.0, 2_000).await.unwrap(), None);
        assert!(
            store
                .take_token("c", 1, 1.0, 2_000)
                .await
                .unwrap()
                .is_some()
        );
        // An hour later the bucket holds `burst`, not more.
        let mut taken = 0;
        for _ in 0..10 {
            if store
                .take_token("b", 3, 1.0, 3_602_000)
                .await
                .unwrap()
                .is_none()
            {
                taken += 1;
            }
        }
        assert_eq!(taken, 3, "{backend}");
        // The bucket is held in the store: a reopened store sees it empty.
        drop(store);
        let store = toolgrid_store::open(&url).await.unwrap();
        assert!(
            store
                .take_token("b", 3, 1.0, 3_602_000)
                .await
                .unwrap()
                .is_some(),
            "{backend}: still empty after reopening"
        );
    }
}

#[tokio::test]
async fn concurrent_takes_across_replicas_take_exactly_burst() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        // Two stores on one database stand for two control-plane replicas.
        let replicas = [
            toolgrid_store::open(&url).await.unwrap(),
            toolgrid_store::open(&url).await.unwrap(),
        ];
        let now = toolgrid_store::now_ms();
        let mut tasks = Vec::new();
        for i in 0..8 {
            let store = replicas[i % 2].clone();
            tasks.push(tokio::spawn(async move {
                let mut taken = 0u32;
                for _ in 0..5 {
                    // Next to no refill: only the burst can be taken.
                    if store
                        .take_token("shared", 12, 1e-9, now)
                        .await
                        .unwrap()
                        .is_none()
                    {
                        taken += 1;
                    }
                }
                taken
            }));
        }
        let mut taken = 0;
        for task in tasks {
            taken += task.await.unwrap();
        }
        assert_eq!(taken, 12, "{backend}: 40 attempts, exactly burst taken");
    }
}

/// An agent's call with `args`, refused as a repeat within `window_ms`.
fn repeatable(
    id: &str,
    agent: &str,
    key: Option<&str>,
    args: serde_json::Value,
    window_ms: i64,
) -> NewCall {
    let mut call = new_call(id, key, args);
    call.spec.access = CallAccess {
        agent: Some(agent.into()),
        ..CallAccess::default()
    };
    call.repeat_window_ms = Some(window_ms);
    call
}

#[tokio::test]
async fn an_agents_identical_call_within_the_window_is_refused_and_nothing_recorded() {
    let dir = tempfile::tempdir().unwrap();
    const HOUR: i64 = 3_600_000;
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let first = store
            .create_call(repeatable("r1", "alice", Some("k1"), json!({"a": 1}), HOUR))
            .await
            .unwrap();
        assert!(matches!(first, Created::New(_)), "{backend}");
        // The same request, no key or another key: refused, pointing at the first call.
        for (id, key) in [("r2", None), ("r3", Some("k2"))] {
            let again = store
                .create_call(repeatable(id, "alice", key, json!({"a": 1}), HOUR))
                .await
                .unwrap();
            let Created::Repeated(earlier) = again else {
                panic!("{backend}: {id} is a repeat: {again:?}")
            };
            assert_eq!(earlier.id, "r1");
            assert!(
                store.get_call(id).await.unwrap().is_none(),
                "nothing recorded"
            );
        }
        assert!(
            store
                .find_call_by_key("default", "alice", "k2")
                .await
                .unwrap()
                .is_none(),
            "{backend}: the refused call's key is not taken"
        );
        // The first call's key returns the first call.
        let same_key = store
            .create_call(repeatable("r4", "alice", Some("k1"), json!({"a": 1}), HOUR))
            .await
            .unwrap();
        assert!(
            matches!(&same_key, Created::Existing(c) if c.id == "r1"),
            "{backend}: {same_key:?}"
        );
        // ... and refuses a different request under it, as ever.
        let conflict = store
            .create_call(repeatable("r5", "alice", Some("k1"), json!({"a": 2}), HOUR))
            .await;
        assert!(matches!(
            conflict,
            Err(StoreError::IdempotencyConflict { .. })
        ));
        // Another request, another agent, another namespace: new calls.
        let other_args = repeatable("r6", "alice", None, json!({"a": 2}), HOUR);
        let other_agent = repeatable("r7", "bob", None, json!({"a": 1}), HOUR);
        let mut other_ns = repeatable("r8", "alice", None, json!({"a": 1}), HOUR);
        other_ns.namespace = "other".into();
        for call in [other_args, other_agent, other_ns] {
            let id = call.id.clone();
            let created = store.create_call(call).await.unwrap();
            assert!(matches!(created, Created::New(_)), "{backend}: {id}");
        }
        // Without a window there is no check.
        let mut unchecked = repeatable("r9", "alice", None, json!({"a": 1}), HOUR);
        unchecked.repeat_window_ms = None;
        assert!(matches!(
            store.create_call(unchecked).await.unwrap(),
            Created::New(_)
        ));
        // Once the window has passed, the same call is new again.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let later = store
            .create_call(repeatable("r10", "alice", None, json!({"a": 1}), 10))
            .await
            .unwrap();
        assert!(matches!(later, Created::New(_)), "{backend}: {later:?}");
    }
}

#[tokio::test]
async fn racing_identical_calls_across_replicas_record_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let replicas = [
            toolgrid_store::open(&url).await.unwrap(),
            toolgrid_store::open(&url).await.unwrap(),
        ];
        let mut tasks = Vec::new();
        for i in 0..8 {
            let store = replicas[i % 2].clone();
            tasks.push(tokio::spawn(async move {
                let call = repeatable(
                    &format!("race-{i}"),
                    "alice",
                    None,
                    json!({"x": 1}),
                    3_600_000,
                );
                store.create_call(call).await.unwrap()
            }));
        }
        let mut new = Vec::new();
        let mut repeated = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Created::New(c) => new.push(c.id),
                Created::Repeated(c) => repeated.push(c.id),
                other => panic!("{backend}: {other:?}"),
            }
        }
        assert_eq!(new.len(), 1, "{backend}: {new:?}");
        assert!(repeated.iter().all(|id| id == &new[0]), "{backend}");
        let listed = replicas[0]
            .list_calls(&CallFilter {
                agent: Some("alice".into()),
                ..CallFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.len(), 1, "{backend}");
    }
}

#[tokio::test]
async fn a_dry_run_is_recorded_succeeded_with_its_result_and_never_assigned() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let mut call = new_call("dry", None, json!({"a": 1}));
        call.spec.effect = toolgrid_core::spec::Effect::Write;
        call.spec.dry_run = true;
        call.started.dry_run = true;
        call.dry_run_result = Some(json!({"would": "delete 3 rows"}));
        let Created::New(record) = store.create_call(call).await.unwrap() else {
            panic!("{backend}: a new call")
        };
        assert_eq!(record.state, CallState::Succeeded, "{backend}");
        assert_eq!(record.result, Some(json!({"would": "delete 3 rows"})));
        assert_eq!(record.finished_at_ms, Some(record.created_at_ms));
        assert_eq!((record.epoch, record.worker.as_deref()), (0, None));
        assert!(record.spec.dry_run);
        assert_eq!(store.get_call("dry").await.unwrap(), Some(record.clone()));
        let oplog = store.oplog("dry").await.unwrap();
        let kinds: Vec<&str> = oplog.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["call-started", "outcome"], "{backend}");
        assert_eq!(oplog[0].payload_json()["dryRun"], json!(true));
        assert_eq!(oplog[1].payload_json(), json!({"state": "succeeded"}));
        for entry in &oplog {
            entry.entry().expect("entries parse");
        }
        assert!(store.unfinished_calls().await.unwrap().is_empty());
        assert!(
            store.assign_call("dry", "w").await.is_err(),
            "{backend}: an ended call is never assigned"
        );
        // A dry run that also names a reserved worker is still never assigned.
        let mut reserved = new_call("dry2", None, json!({"a": 2}));
        reserved.dry_run_result = Some(json!("Operation acknowledged."));
        reserved.assign_to = Some("w".into());
        let Created::New(record) = store.create_call(reserved).await.unwrap() else {
            panic!("{backend}: a new call")
        };
        assert_eq!(record.state, CallState::Succeeded);
        assert_eq!(record.worker, None);
        assert_eq!(store.oplog("dry2").await.unwrap().len(), 2);
    }
}

#[tokio::test]
async fn an_oplog_page_is_read_by_the_query_with_its_limit_capped() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        store
            .create_call(new_call("p1", None, json!({})))
            .await
            .unwrap();
        store
            .create_call(new_call("p2", None, json!({})))
            .await
            .unwrap();
        let epoch = store.assign_call("p1", "w1").await.unwrap();
        // More entries than one page may hold.
        let extra = toolgrid_store::MAX_OPLOG_PAGE_ENTRIES as u64 + 200;
        let entries: Vec<OplogEntry> = (0..extra)
            .map(|ns| OplogEntry::MonotonicClock(MonotonicClock { ns }))
            .collect();
        store.append_oplog("p1", epoch, 0, entries).await.unwrap();
        let all = store.oplog("p1").await.unwrap();
        assert!(all.len() as u64 > extra, "{backend}: {}", all.len());
        let last = all.last().unwrap().seq;

        // From the start, in order, exactly `limit`.
        let first = store.oplog_page("p1", 0, 3).await.unwrap();
        assert_eq!(first, all[..3], "{backend}");
        // From a seq in the middle: that entry first.
        let middle = all[10].seq;
        let page = store.oplog_page("p1", middle, 5).await.unwrap();
        assert_eq!(page, all[10..15], "{backend}");
        // The last entry alone, then nothing after it.
        let tail = store.oplog_page("p1", last, 5).await.unwrap();
        assert_eq!(tail, all[all.len() - 1..], "{backend}");
        assert!(
            store
                .oplog_page("p1", last + 1, 5)
                .await
                .unwrap()
                .is_empty(),
            "{backend}"
        );
        assert!(
            store
                .oplog_page("p1", u64::MAX, 5)
                .await
                .unwrap()
                .is_empty(),
            "{backend}"
        );
        // A limit of 0 reads nothing; a huge one is capped.
        assert!(
            store.oplog_page("p1", 0, 0).await.unwrap().is_empty(),
            "{backend}"
        );
        let capped = store.oplog_page("p1", 0, u32::MAX).await.unwrap();
        assert_eq!(
            capped.len(),
            toolgrid_store::MAX_OPLOG_PAGE_ENTRIES as usize,
            "{backend}"
        );
        assert_eq!(capped, all[..capped.len()], "{backend}");
        // Only the call's own entries, and nothing for a call that does not exist.
        let other = store.oplog_page("p2", 0, 100).await.unwrap();
        assert_eq!(other, store.oplog("p2").await.unwrap(), "{backend}");
        assert!(other.len() < 3, "{backend}: {other:?}");
        assert!(
            store
                .oplog_page("no-such-call", 0, 10)
                .await
                .unwrap()
                .is_empty(),
            "{backend}"
        );
    }
}

#[tokio::test]
async fn rollouts_change_by_compare_and_set_and_releases_are_tallied() {
    use toolgrid_core::ids::ObjectKey;
    use toolgrid_core::rollout::{Phase, Progress, Record, Tally};
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let first = Record {
            binding: ObjectKey::new("default", "b"),
            canary: "semver-1.1.0".into(),
            progress: Progress::start(1_000),
        };
        assert!(store.put_rollout(None, &first).await.unwrap(), "{backend}");
        assert!(
            !store.put_rollout(None, &first).await.unwrap(),
            "{backend}: a second first record is refused"
        );
        let mut next = first.clone();
        next.progress.step = 1;
        next.progress.step_started_ms = 2_000;
        next.progress.canary = Tally {
            calls: 30,
            errors: 1,
        };
        assert!(store.put_rollout(Some(&first), &next).await.unwrap());
        // Another replica that judged the same step a moment later stores nothing.
        let mut late = first.clone();
        late.progress.phase = Phase::Aborted;
        assert!(!store.put_rollout(Some(&first), &late).await.unwrap());
        assert_eq!(
            store.rollouts().await.unwrap(),
            vec![next.clone()],
            "{backend}"
        );

        // Tallies: by release, the release's own failures as errors, refusals not counted.
        let call = |id: &str, release: &str| {
            let mut call = new_call(id, None, json!({"id": id}));
            call.release = release.into();
            call.started.release = release.into();
            call
        };
        for (id, release) in [
            ("s1", "semver-1.0.0"),
            ("s2", "semver-1.0.0"),
            ("c1", "semver-1.1.0"),
            ("c2", "semver-1.1.0"),
            ("c3", "semver-1.1.0"),
        ] {
            store.create_call(call(id, release)).await.unwrap();
        }
        store.assign_call("s1", "w").await.unwrap();
        store
            .complete_call("s1", 1, 1, vec![], success(json!(1)))
            .await
            .unwrap();
        store
            .fail_call("c1", CallError::new(ErrorKind::ToolError, "boom"))
            .await
            .unwrap();
        store
            .fail_call("c2", CallError::new(ErrorKind::Denied, "no"))
            .await
            .unwrap();
        store.assign_call("c3", "w").await.unwrap();
        store
            .complete_call("c3", 1, 1, vec![], success(json!(1)))
            .await
            .unwrap();
        let tallies = store.release_tallies("default", "semver", 0).await.unwrap();
        assert_eq!(
            tallies.get("semver-1.0.0"),
            Some(&Tally {
                calls: 1,
                errors: 0
            }),
            "{backend}: s2 has not ended"
        );
        assert_eq!(
            tallies.get("semver-1.1.0"),
            Some(&Tally {
                calls: 2,
                errors: 1
            }),
            "{backend}: a denial says nothing of the release"
        );
        let later = store
            .release_tallies("default", "semver", i64::MAX)
            .await
            .unwrap();
        assert!(later.is_empty(), "{backend}: nothing ended since");
    }
}
