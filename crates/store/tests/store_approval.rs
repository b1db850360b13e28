//! The store's side of durable approval, on both backends: SQLite always, PostgreSQL when
//! `TOOLGRID_TEST_POSTGRES_URL` names a server (under `CI=true` its absence is a failure).

use serde_json::json;
use std::sync::Arc;
use toolgrid_core::call::{
    ApprovalDecision, ApprovalWait, CallStarted, ChainRecord, ErrorKind, OplogEntry, TimeoutAction,
};
use toolgrid_store::{
    CallError, CallFilter, CallSpec, CallState, Created, NewCall, RunLimits, Store, StoreError,
};
use toolgrid_testkit::postgres::fresh_test_database;

/// The backends to run a case on: a fresh SQLite file, and a fresh PostgreSQL database.
async fn backends(dir: &tempfile::TempDir) -> Vec<(String, String)> {
    let mut urls = vec![(
        "sqlite".to_string(),
        format!("sqlite://{}", dir.path().join("store.db").display()),
    )];
    if let Some(url) = fresh_test_database().await {
        urls.push(("postgres".to_string(), url));
    }
    urls
}

fn waiting_call(id: &str, key: Option<&str>) -> NewCall {
    NewCall {
        id: id.into(),
        namespace: "default".into(),
        tool: "semver".into(),
        command: "compare".into(),
        release: "semver-1.0.0".into(),
        release_digest: "sha256:00".into(),
        request_hash: format!("hash-of-{id}"),
        args: json!({}),
        spec: CallSpec {
            pool: "default/default".into(),
            argv: vec!["semver".into(), "compare".into()],
            effect: toolgrid_core::spec::Effect::Write,
            deadline_ms: 1,
            limits: RunLimits {
                timeout_ms: 60_000,
                ..RunLimits::default()
            },
            chain: ChainRecord {
                approval: Some(ApprovalWait {
                    middleware: "needs-ok".into(),
                    approvers: vec!["reviewer".into()],
                    deadline_ms: 5,
                    on_timeout: TimeoutAction::Deny,
                }),
                ..ChainRecord::default()
            },
            ..CallSpec::default()
        },
        stdin: Vec::new(),
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
            stdin_bytes: 0,
            idempotency_key: key.map(String::from),
            dry_run: false,
            middleware: Vec::new(),
        },
        assign_to: None,
        repeat_window_ms: None,
        dry_run_result: None,
    }
}

fn decision(approved: bool, by: &str) -> ApprovalDecision {
    ApprovalDecision {
        approved,
        by: by.into(),
        at_ms: 1234,
        reason: "looked at it".into(),
    }
}

async fn create(store: &Arc<dyn Store>, call: NewCall) -> toolgrid_store::CallRecord {
    match store.create_call(call).await.unwrap() {
        Created::New(record) => record,
        other => panic!("not created: {other:?}"),
    }
}

fn approvals(oplog: &[toolgrid_store::OplogRecord]) -> Vec<ApprovalDecision> {
    oplog
        .iter()
        .filter_map(|r| match r.entry() {
            Ok(OplogEntry::Approval(d)) => Some(d),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_waiting_call_is_recorded_unassigned_and_never_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        let waiting = create(&store, waiting_call("w1", Some("k1"))).await;
        assert_eq!(waiting.state, CallState::AwaitingApproval, "{backend}");
        assert_eq!(waiting.worker, None, "{backend}");
        assert_eq!(waiting.epoch, 0, "{backend}");
        let mut plain = waiting_call("p1", None);
        plain.spec.chain = ChainRecord::default();
        create(&store, plain).await;

        // A control plane that restarts queues only pending and running calls.
        let unfinished: Vec<String> = store
            .unfinished_calls()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(unfinished, ["p1"], "{backend}");
        // It cannot be assigned while it waits.
        assert!(
            store.assign_call("w1", "worker-1").await.is_err(),
            "{backend}"
        );

        // Listing by state.
        let listed: Vec<String> = store
            .list_calls(&CallFilter {
                state: Some(CallState::AwaitingApproval),
                ..CallFilter::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(listed, ["w1"], "{backend}");
        let all = store.list_calls(&CallFilter::default()).await.unwrap();
        assert_eq!(all.len(), 2, "{backend}");

        // The same key returns the same waiting call.
        match store
            .create_call(waiting_call("w1-again", Some("k1")))
            .await
        {
            Err(StoreError::IdempotencyConflict { .. }) => {}
            Ok(Created::Existing(r)) => assert_eq!(r.id, "w1", "{backend}"),
            other => panic!("{backend}: {other:?}"),
        }
        let mut same = waiting_call("w1-retry", Some("k1"));
        same.request_hash = "hash-of-w1".into();
        match store.create_call(same).await.unwrap() {
            Created::Existing(r) => {
                assert_eq!(r.id, "w1", "{backend}");
                assert_eq!(r.state, CallState::AwaitingApproval, "{backend}");
            }
            other => panic!("{backend}: {other:?}"),
        }

        // A dry run answered without running never waits.
        let mut dry = waiting_call("d1", None);
        dry.dry_run_result = Some(json!("ok"));
        let dry = create(&store, dry).await;
        assert_ne!(dry.state, CallState::AwaitingApproval, "{backend}");
    }
}

#[tokio::test]
async fn an_approval_queues_the_call_with_a_fresh_deadline_once() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        create(&store, waiting_call("a1", None)).await;
        let before = toolgrid_store::now_ms();
        let approved = store
            .decide_approval("a1", decision(true, "operator:admin"), None)
            .await
            .unwrap();
        assert_eq!(approved.state, CallState::Pending, "{backend}");
        assert_eq!(
            approved.spec.chain.approved,
            Some(decision(true, "operator:admin")),
            "{backend}"
        );
        assert!(approved.spec.chain.approval.is_some(), "{backend}");
        assert!(
            approved.spec.deadline_ms >= before + 60_000,
            "{backend}: deadline {} not reset",
            approved.spec.deadline_ms
        );
        let oplog = store.oplog("a1").await.unwrap();
        assert_eq!(
            approvals(&oplog),
            [decision(true, "operator:admin")],
            "{backend}"
        );
        let seqs: Vec<u64> = oplog.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [0, 1], "{backend}");

        // Now it is an ordinary pending call: reloaded at a restart, assignable.
        let unfinished = store.unfinished_calls().await.unwrap();
        assert_eq!(unfinished.len(), 1, "{backend}");
        let epoch = store.assign_call("a1", "worker-1").await.unwrap();
        assert_eq!(epoch, 1, "{backend}");
        let seqs: Vec<u64> = store
            .oplog("a1")
            .await
            .unwrap()
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs, [0, 1, 2], "{backend}");

        // Deciding again is refused, whatever the decision.
        for again in [true, false] {
            match store
                .decide_approval("a1", decision(again, "operator:other"), None)
                .await
            {
                Err(StoreError::NotAwaiting { call_id, state }) => {
                    assert_eq!(call_id, "a1");
                    assert_eq!(state, CallState::Running, "{backend}");
                }
                other => panic!("{backend}: {other:?}"),
            }
        }
        assert!(matches!(
            store
                .decide_approval("nope", decision(true, "operator:admin"), None)
                .await,
            Err(StoreError::NotFound(_))
        ));
    }
}

#[tokio::test]
async fn a_denial_ends_the_call_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        create(&store, waiting_call("d1", None)).await;
        let error = CallError::new(ErrorKind::ApprovalTimeout, "nobody approved");
        let denied = store
            .decide_approval("d1", decision(false, "timeout"), Some(error.clone()))
            .await
            .unwrap();
        assert_eq!(denied.state, CallState::Failed, "{backend}");
        assert_eq!(denied.error, Some(error.clone()), "{backend}");
        assert!(denied.finished_at_ms.is_some(), "{backend}");
        let oplog = store.oplog("d1").await.unwrap();
        let kinds: Vec<&str> = oplog.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(kinds, ["call-started", "approval", "outcome"], "{backend}");
        assert!(store.unfinished_calls().await.unwrap().is_empty());
        assert!(matches!(
            store
                .decide_approval("d1", decision(true, "operator:admin"), None)
                .await,
            Err(StoreError::NotAwaiting {
                state: CallState::Failed,
                ..
            })
        ));
    }
}

#[tokio::test]
async fn of_concurrent_decisions_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        // Two stores over one database: two control planes (or replicas) deciding at once.
        let first = toolgrid_store::open(&url).await.unwrap();
        let second = toolgrid_store::open(&url).await.unwrap();
        for round in 0..5 {
            let id = format!("c{round}");
            create(&first, waiting_call(&id, None)).await;
            let (a, b) = tokio::join!(
                first.decide_approval(&id, decision(true, "operator:a"), None),
                second.decide_approval(
                    &id,
                    decision(false, "operator:b"),
                    Some(CallError::new(ErrorKind::Denied, "no"))
                ),
            );
            let wins = [a.is_ok(), b.is_ok()];
            assert_eq!(
                wins.iter().filter(|w| **w).count(),
                1,
                "{backend}: {a:?} / {b:?}"
            );
            for lost in [a, b].into_iter().filter_map(Result::err) {
                assert!(
                    matches!(lost, StoreError::NotAwaiting { .. }),
                    "{backend}: {lost:?}"
                );
            }
            let oplog = first.oplog(&id).await.unwrap();
            assert_eq!(approvals(&oplog).len(), 1, "{backend}");
        }
    }
}

#[tokio::test]
async fn failing_a_waiting_call_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();
        create(&store, waiting_call("f1", None)).await;
        let failed = store
            .fail_call("f1", CallError::new(ErrorKind::Internal, "gone"))
            .await
            .unwrap();
        assert_eq!(failed.state, CallState::Failed, "{backend}");
    }
}
