//! One test suite for both store backends: SQLite always, PostgreSQL when
//! `TOOLGRID_TEST_POSTGRES_URL` names a server (CI starts one; `.ci/start-postgres`; under
//! `CI=true` its absence is a failure, `common::require`).

mod common;

use serde_json::json;
use std::sync::Arc;
use toolgrid::store::{
    self, CallError, CallFilter, CallOutcome, CallSpec, CallState, Created, NewCall, NewEntry,
    ResourceRecord, Store, StoreError,
};

/// The backends to run a case on: a fresh SQLite file, and a fresh PostgreSQL database.
async fn backends(dir: &tempfile::TempDir) -> Vec<(String, String)> {
    let mut urls = vec![(
        "sqlite".to_string(),
        format!("sqlite://{}", dir.path().join("store.db").display()),
    )];
    match std::env::var("TOOLGRID_TEST_POSTGRES_URL") {
        Ok(admin) => {
            use sqlx::Connection;
            let name = format!("toolgrid_{}", uuid::Uuid::now_v7().simple());
            let mut conn = sqlx::PgConnection::connect(&admin)
                .await
                .expect("connect to PostgreSQL");
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await
                .expect("create database");
            let base = admin
                .rsplit_once('/')
                .map(|(base, _)| base)
                .unwrap_or(&admin);
            urls.push(("postgres".to_string(), format!("{base}/{name}")));
        }
        Err(_) => {
            common::require(
                "PostgreSQL for the store suite (TOOLGRID_TEST_POSTGRES_URL is not set)",
                false,
            );
        }
    }
    urls
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
            effect: "read".into(),
            deadline_ms: 1,
            ..CallSpec::default()
        },
        stdin: b"in".to_vec(),
        idempotency_key: key.map(String::from),
        started: json!({"tool": "semver"}),
    }
}

fn success(value: serde_json::Value) -> CallOutcome {
    CallOutcome {
        result: Ok(value),
        entry: json!({"state": "succeeded"}),
    }
}

fn is_stale(result: Result<impl std::fmt::Debug, StoreError>) -> bool {
    matches!(result, Err(StoreError::StaleEpoch { .. }))
}

#[tokio::test]
async fn calls_move_through_epochs_and_stale_writers_are_fenced() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = store::open(&url).await.unwrap();
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
                vec![NewEntry::new("wall-clock", json!({"secs": 1, "nanos": 2}))],
            )
            .await
            .unwrap();
        assert!(
            is_stale(
                store
                    .append_oplog("c1", 0, vec![NewEntry::new("x", json!(0))])
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
                    .append_oplog("c1", 1, vec![NewEntry::new("x", json!(1))])
                    .await
            ),
            "{backend}"
        );
        assert!(
            is_stale(
                store
                    .complete_call("c1", 1, vec![], success(json!(1)))
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
                vec![NewEntry::new("random", json!({"hex": "00"}))],
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
                    .complete_call("c1", 3, vec![], success(json!(2)))
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
        assert_eq!(oplog[1].payload, json!({"worker": "w1", "epoch": 1}));
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
        let store = store::open(&url).await.unwrap();
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
        assert_eq!(
            store
                .find_call_by_key("default", "key")
                .await
                .unwrap()
                .unwrap()
                .id,
            "k1"
        );
        assert!(
            store
                .find_call_by_key("default", "missing")
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
        let store = store::open(&url).await.unwrap();
        for id in ["a", "b", "c"] {
            store
                .create_call(new_call(id, None, json!({"id": id})))
                .await
                .unwrap();
            // Distinct creation times keep the order stable.
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
        store.assign_call("b", "w").await.unwrap();
        let error = CallError {
            kind: "timeout".into(),
            message: "too slow".into(),
            ..CallError::default()
        };
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
        let store = store::open(&url).await.unwrap();
        let bytes: Vec<u8> = (0..=255u8).cycle().take(3 << 20).collect();
        store.put_artifact("sha256:big", &bytes).await.unwrap();
        store.put_artifact("sha256:big", &bytes).await.unwrap();
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
    }
}

#[tokio::test]
async fn concurrent_appends_are_group_committed_in_order_per_call() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = Arc::new(store::SqlStore::open(&url).await.unwrap());
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
        let before = store.commits();
        let mut tasks = Vec::new();
        for i in 0..calls {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for n in 0..appends_per_call {
                    store
                        .append_oplog(
                            &format!("g{i}"),
                            1,
                            vec![NewEntry::new("random", json!({"n": n}))],
                        )
                        .await
                        .unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        // Group commit: the 16 writers' appends share transactions (one fsync each), so
        // there are far fewer commits than appends; one transaction per append fails here.
        let appends = calls * appends_per_call;
        let commits = store.commits() - before;
        assert!(
            commits > 0 && commits <= appends / 4,
            "{backend}: {appends} concurrent appends took {commits} commits"
        );
        for i in 0..calls {
            let oplog = store.oplog(&format!("g{i}")).await.unwrap();
            let ns: Vec<i64> = oplog
                .iter()
                .filter_map(|e| e.payload.get("n").and_then(|n| n.as_i64()))
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
            let store = store::open(&url).await.unwrap();
            store
                .create_call(new_call("d1", Some("durable"), json!({})))
                .await
                .unwrap();
            store.assign_call("d1", "w").await.unwrap();
            store
                .complete_call("d1", 1, vec![], success(json!({"kept": true})))
                .await
                .unwrap();
        }
        let store = store::open(&url).await.unwrap();
        let call = store
            .get_call("d1")
            .await
            .unwrap()
            .expect("the call is still there");
        assert_eq!(call.result, Some(json!({"kept": true})), "{backend}");
        assert_eq!(store.oplog("d1").await.unwrap().len(), 3);
    }
}
