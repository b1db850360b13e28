//! The audit log in both store backends (SQLite always, PostgreSQL when
//! `TOOLGRID_TEST_POSTGRES_URL` names a server; under `CI=true` its absence is a failure):
//! an ended call's record is written with its end, once however often the end is written;
//! refusals are appended; listing filters and orders newest first.

use serde_json::{Value, json};
use toolgrid_core::call::{
    AuditFilter, AuditOptions, AuditOutcome, AuditRecord, CallAccess, CallStarted, ChainRecord,
    ErrorKind, RunSummary,
};
use toolgrid_store::{CallError, CallOutcome, CallSpec, NewCall};
use toolgrid_testkit::postgres::fresh_test_database;

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

fn new_call(id: &str, agent: &str, tool: &str) -> NewCall {
    let args = json!({"version": "1.0.0", "token": "t0p-secret"});
    NewCall {
        id: id.into(),
        namespace: "default".into(),
        tool: tool.into(),
        command: "bump".into(),
        release: format!("{tool}-1.0.0"),
        release_digest: "sha256:00".into(),
        request_hash: format!("hash-of-{id}"),
        args: args.clone(),
        spec: CallSpec {
            pool: "default/default".into(),
            argv: vec![tool.into(), "bump".into()],
            effect: toolgrid_core::spec::Effect::Read,
            deadline_ms: 1,
            access: CallAccess {
                agent: Some(agent.into()),
                ..Default::default()
            },
            caller: format!("agent:default/{agent}"),
            chain: ChainRecord {
                audit: Some(AuditOptions {
                    exclude_args: vec!["token".into()],
                    stdout: false,
                }),
                ..Default::default()
            },
            ..CallSpec::default()
        },
        stdin: vec![],
        idempotency_key: None,
        started: CallStarted {
            namespace: "default".into(),
            tool: tool.into(),
            command: "bump".into(),
            release: format!("{tool}-1.0.0"),
            version: "1.0.0".into(),
            digest: "sha256:00".into(),
            args,
            argv: vec![],
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

fn success(value: Value) -> CallOutcome {
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

fn refusal(id: &str, agent: &str, tool: &str, at_ms: i64) -> AuditRecord {
    AuditRecord {
        call_id: id.into(),
        at_ms,
        namespace: "default".into(),
        agent: agent.into(),
        caller: format!("agent:default/{agent}"),
        tool: tool.into(),
        command: String::new(),
        args: Value::Null,
        decisions: vec![],
        outcome: AuditOutcome::Refused,
        error_kind: Some(ErrorKind::PermissionDenied),
        error_message: "no".into(),
        duration_ms: 0,
        dry_run: false,
    }
}

fn filter() -> AuditFilter {
    AuditFilter {
        limit: 100,
        ..Default::default()
    }
}

#[tokio::test]
async fn each_call_gets_one_audit_record() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, url) in backends(&dir).await {
        let store = toolgrid_store::open(&url).await.unwrap();

        // Completed, then the same completion again, then a late failure: one record.
        store
            .create_call(new_call("a1", "ranger", "semver"))
            .await
            .unwrap();
        assert_eq!(store.assign_call("a1", "w").await.unwrap(), 1);
        let done = store
            .complete_call("a1", 1, 0, vec![], success(json!({"v": 1})))
            .await
            .unwrap();
        let again = store
            .complete_call("a1", 1, 0, vec![], success(json!({"v": 1})))
            .await
            .unwrap();
        assert_eq!(again, done, "{backend}");
        store
            .fail_call("a1", CallError::new(ErrorKind::Timeout, "late"))
            .await
            .unwrap();
        let records = store.list_audit(&filter()).await.unwrap();
        assert_eq!(records.len(), 1, "{backend}: {records:#?}");
        let r = &records[0];
        assert_eq!(r.call_id, "a1");
        assert_eq!(r.outcome, AuditOutcome::Succeeded, "{backend}");
        assert_eq!(r.args, json!({"version": "1.0.0"}), "{backend}: excluded");
        assert_eq!(r.agent, "ranger");
        assert_eq!(r.caller, "agent:default/ranger");
        assert_eq!(Some(r.at_ms), done.finished_at_ms);

        // Failed by the control plane (twice): one record.
        store
            .create_call(new_call("a2", "other", "textstats"))
            .await
            .unwrap();
        store
            .fail_call("a2", CallError::new(ErrorKind::Timeout, "too slow"))
            .await
            .unwrap();
        store
            .fail_call("a2", CallError::new(ErrorKind::Timeout, "too slow"))
            .await
            .unwrap();
        // A refusal, appended (twice: the same id is kept once).
        store
            .append_audit(refusal("r1", "ranger", "uuid", 5))
            .await
            .unwrap();
        store
            .append_audit(refusal("r1", "ranger", "uuid", 5))
            .await
            .unwrap();

        let all = store.list_audit(&filter()).await.unwrap();
        let ids: Vec<&str> = all.iter().map(|r| r.call_id.as_str()).collect();
        assert_eq!(ids.len(), 3, "{backend}: {ids:?}");
        assert_eq!(ids[2], "r1", "{backend}: newest first");
        let a2 = all.iter().find(|r| r.call_id == "a2").unwrap();
        assert_eq!(a2.outcome, AuditOutcome::Failed);
        assert_eq!(a2.error_kind, Some(ErrorKind::Timeout));
        assert_eq!(a2.error_message, "too slow");

        let only = |f: AuditFilter| {
            let store = store.clone();
            async move {
                store
                    .list_audit(&f)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| r.call_id)
                    .collect::<Vec<_>>()
            }
        };
        let ranger = only(AuditFilter {
            agent: Some("ranger".into()),
            ..filter()
        })
        .await;
        assert_eq!(ranger.len(), 2, "{backend}: {ranger:?}");
        let uuid = only(AuditFilter {
            tool: Some("uuid".into()),
            ..filter()
        })
        .await;
        assert_eq!(uuid, ["r1"], "{backend}");
        let recent = only(AuditFilter {
            since_ms: Some(1_000),
            ..filter()
        })
        .await;
        assert_eq!(recent.len(), 2, "{backend}: the refusal at 5 ms is older");
        let elsewhere = only(AuditFilter {
            namespace: Some("other".into()),
            ..filter()
        })
        .await;
        assert!(elsewhere.is_empty(), "{backend}");
        let one = only(AuditFilter {
            limit: 1,
            ..filter()
        })
        .await;
        assert_eq!(one.len(), 1, "{backend}");
    }
}
