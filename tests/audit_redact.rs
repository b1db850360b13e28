//! Redact and audit middleware on a real `toolgrid up`: results and error text redacted (by
//! pattern and by JSON pointer) before a caller sees them and before they are stored, one
//! audit record per call (refused ones included) with excluded arguments left out, read
//! over the CLI, HTTP and gRPC, and copied to stdout as JSON lines.

use crate::common;

use common::fixtures;
use common::{Platform, result_of};
use serde_json::{Value, json};
use std::time::Duration;
use toolgrid_core::call::{AuditOutcome, AuditRecord};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const AUDITOR: &str = "auditor-token-value";

/// Words that only the tools' results contain: textstats folds `ZEBRACORN` (its input) to
/// `zebracorn`, semver bumps `7770777.0.0` (its input) to `7770777.0.1`.
const RESULT_WORD: &str = "zebracorn";
const RESULT_VERSION: &str = "7770777.0.1";

const MORE: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: audit-tokens}
stringData: {auditor: auditor-token-value}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: auditor}
spec:
  tokenSecretRef: {name: audit-tokens, key: auditor}
  permissions: [{tools: ["*"], commands: ["*"]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: hide-words}
spec:
  redact:
    patterns: ['zebra\w+', 'not a semantic version']
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: hide-version}
spec:
  redact:
    paths: [/version]
    replacement: "<hidden>"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: audit-all}
spec:
  audit:
    excludeArgs: [version]
    stdout: true
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: bad-regex}
spec:
  redact:
    patterns: ['fine', '(unclosed']
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: deny-fetch}
spec:
  policy:
    rules: [{action: deny, message: no fetching}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: auditor-fetch}
spec: {agents: [auditor], tool: fetch, middleware: [audit-all, deny-fetch]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: auditor-textstats}
spec: {agents: [auditor], tool: textstats, middleware: [hide-words, audit-all]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: auditor-semver}
spec: {agents: [auditor], tool: semver, middleware: [hide-version, hide-words, audit-all]}
"#;

async fn invoke(
    platform: &Platform,
    request: proto::InvokeRequest,
) -> Result<proto::Call, ApiError> {
    let mut client = platform.client_with(Some(AUDITOR), None).await;
    client
        .invoke(request)
        .await
        .map(|r| r.into_inner())
        .map_err(|s| error_of(&s))
}

/// The audit records `toolgrid audit -o json ARGS` prints.
fn audit_cli(platform: &Platform, args: &[&str]) -> Vec<AuditRecord> {
    let mut all = vec!["audit", "-o", "json"];
    all.extend_from_slice(args);
    let out = platform.cli(&all, None);
    assert!(
        out.status.success(),
        "toolgrid audit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "toolgrid audit -o json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_and_errors_are_redacted_and_every_call_is_audited_once() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    std::fs::write(manifests.join("audit-redact.yaml"), MORE).unwrap();
    let platform = Platform::start(root.path(), &manifests, &[]);

    // A pattern that does not compile makes its Middleware not Ready, naming the field.
    let bad = platform.resource("middlewares", "bad-regex").await.unwrap();
    assert_eq!(bad.ready, "False", "{bad:?}");
    assert!(
        bad.message.contains("spec.redact.patterns[1]"),
        "{}",
        bad.message
    );
    let good = platform
        .resource("middlewares", "hide-words")
        .await
        .unwrap();
    assert_eq!(good.ready, "True", "{good:?}");

    // By pattern, over gRPC: the folded word is in the result only, redacted.
    let counted = invoke(
        &platform,
        proto::InvokeRequest {
            tool: "textstats".into(),
            argv: vec!["count".into(), "--ignore-case".into()],
            stdin: Some(b"ZEBRACORN ZEBRACORN apple".to_vec()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let result = result_of(&counted);
    assert_eq!(result["words"], 3);
    assert_eq!(result["top"][0], json!({"word": "[REDACTED]", "count": 2}));
    assert_eq!(result["top"][1], json!({"word": "apple", "count": 1}));

    // By pointer, over HTTP.
    let http = reqwest::Client::new();
    let response = http
        .post(format!(
            "http://{}/v1/namespaces/default/tools/semver/bump:call",
            platform.http
        ))
        .bearer_auth(AUDITOR)
        .json(&json!({"args": {"version": "7770777.0.0", "part": "patch"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let bumped: Value = response.json().await.unwrap();
    assert_eq!(bumped["state"], "succeeded", "{bumped}");
    assert_eq!(bumped["result"], json!({"version": "<hidden>"}));
    let bumped_id = bumped["id"].as_str().unwrap().to_string();
    // Read back later, the stored call says the same.
    let again: Value = http
        .get(format!("http://{}/v1/calls/{}", platform.http, counted.id))
        .bearer_auth(platform.admin_token())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["result"]["top"][0]["word"], "[REDACTED]", "{again}");

    // Error text: the message and the stderr tail. The semver binding's chain has two
    // redact steps: the first one's replacement stands for both.
    let failed = invoke(
        &platform,
        proto::InvokeRequest {
            tool: "semver".into(),
            argv: vec!["compare".into(), "1.2.x".into(), "1.0.0".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(failed.state, proto::CallState::Failed as i32);
    let error = failed.error.clone().expect("an error");
    let text = format!("{} {}", error.message, error.stderr_tail);
    assert!(!text.contains("not a semantic version"), "{text}");
    assert!(text.contains("<hidden>"), "{text}");

    // A refused call: the agent has no binding to uuid.
    let refused = invoke(
        &platform,
        proto::InvokeRequest {
            tool: "uuid".into(),
            argv: vec!["generate".into()],
            ..Default::default()
        },
    )
    .await
    .expect_err("refused");
    assert_eq!(
        refused.kind,
        ErrorKind::PermissionDenied,
        "{}",
        refused.message
    );

    // A call refused by a middleware step, after the chain was known. (The policy denies;
    // a policy step that cannot decide refuses too, as middleware-failed.)
    let by_policy = invoke(
        &platform,
        proto::InvokeRequest {
            tool: "fetch".into(),
            argv: vec!["get".into(), "http://127.0.0.1:9/".into()],
            ..Default::default()
        },
    )
    .await
    .expect_err("refused by the policy");
    assert_eq!(by_policy.kind, ErrorKind::Denied, "{by_policy:?}");

    // Nothing of the results reached the store's files (which do hold the calls' input).
    let mut everything = Vec::new();
    for name in ["toolgrid.db", "toolgrid.db-wal", "toolgrid.db-shm"] {
        let path = platform.data.join(name);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        everything.extend_from_slice(&bytes);
        for secret in [RESULT_WORD, RESULT_VERSION] {
            assert!(
                !contains(&bytes, secret),
                "{secret:?} is in {}",
                path.display()
            );
        }
    }
    assert!(
        contains(&everything, "ZEBRACORN"),
        "the stored stdin is read"
    );
    assert!(
        contains(&everything, "7770777.0.0"),
        "the stored arguments are read"
    );

    // One audit record per call, the refused one included.
    let records = audit_cli(&platform, &["--agent", "auditor"]);
    assert_eq!(records.len(), 5, "{records:#?}");
    for id in [&counted.id, &bumped_id, &failed.id] {
        assert_eq!(
            records.iter().filter(|r| &r.call_id == id).count(),
            1,
            "call {id}: {records:#?}"
        );
    }
    let by_id = |id: &str| records.iter().find(|r| r.call_id == id).unwrap().clone();
    let counted_record = by_id(&counted.id);
    assert_eq!(counted_record.outcome, AuditOutcome::Succeeded);
    assert_eq!(counted_record.caller, "agent:default/auditor");
    assert_eq!(counted_record.tool, "textstats");
    assert!(
        counted_record
            .decisions
            .iter()
            .any(|d| d.middleware == "hide-words"),
        "{counted_record:?}"
    );
    let bumped_record = by_id(&bumped_id);
    assert_eq!(bumped_record.command, "bump");
    assert!(bumped_record.args.get("version").is_none(), "excluded");
    assert_eq!(bumped_record.args["part"], "patch");
    let failed_record = by_id(&failed.id);
    assert_eq!(failed_record.outcome, AuditOutcome::Failed);
    assert!(failed_record.error_kind.is_some());
    assert!(
        !failed_record
            .error_message
            .contains("not a semantic version")
    );
    let refused_record = records
        .iter()
        .find(|r| r.outcome == AuditOutcome::Refused && r.tool == "uuid")
        .expect("the refusal's record");
    assert_eq!(refused_record.tool, "uuid");
    assert_eq!(refused_record.agent, "auditor");
    assert_eq!(refused_record.error_kind, Some(ErrorKind::PermissionDenied));
    assert_eq!(refused_record.duration_ms, 0);
    let policy_record = records
        .iter()
        .find(|r| r.outcome == AuditOutcome::Refused && r.tool == "fetch")
        .expect("the policy refusal's record")
        .clone();
    assert_eq!(policy_record.error_kind, Some(by_policy.kind));
    // The record names the command and arguments as admission read them from argv.
    assert_eq!(policy_record.command, "get", "{policy_record:?}");
    assert_eq!(
        policy_record.args.get("url").and_then(|v| v.as_str()),
        Some("http://127.0.0.1:9/"),
        "{policy_record:?}"
    );
    assert!(
        policy_record
            .decisions
            .iter()
            .any(|d| d.middleware == "deny-fetch"),
        "{policy_record:?}"
    );
    // Newest first.
    assert!(records.windows(2).all(|w| w[0].at_ms >= w[1].at_ms));

    // Filters: tool, since.
    let semver = audit_cli(&platform, &["--agent", "auditor", "--tool", "semver"]);
    assert_eq!(semver.len(), 2, "{semver:#?}");
    assert!(semver.iter().all(|r| r.tool == "semver"));
    let recent = audit_cli(&platform, &["--since", "10m", "--agent", "auditor"]);
    assert_eq!(recent.len(), 5);
    let future = audit_cli(&platform, &["--since", "2999-01-01T00:00:00Z"]);
    assert!(future.is_empty(), "{future:#?}");
    let nobody = audit_cli(&platform, &["--agent", "nobody"]);
    assert!(nobody.is_empty());
    let table = platform.cli(&["audit", "--agent", "auditor"], None);
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.starts_with("TIME"), "{table}");
    assert!(table.contains("MIDDLEWARE"), "{table}");
    assert!(table.contains("permission-denied"), "{table}");

    // HTTP and gRPC: operators read the log; agents are refused.
    let listed: Value = http
        .get(format!(
            "http://{}/v1/audit?agent=auditor&tool=textstats&since=1h",
            platform.http
        ))
        .bearer_auth(platform.admin_token())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = listed["records"].as_array().expect("records");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["callId"], counted.id.as_str());
    let denied = http
        .get(format!("http://{}/v1/audit", platform.http))
        .bearer_auth(AUDITOR)
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status().as_u16(), 403);
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "permission-denied");
    let bad_since = http
        .get(format!("http://{}/v1/audit?since=yesterday", platform.http))
        .bearer_auth(platform.admin_token())
        .send()
        .await
        .unwrap();
    assert_eq!(bad_since.status().as_u16(), 400);
    let mut agent = platform.client_with(Some(AUDITOR), None).await;
    let status = agent
        .list_audit(proto::ListAuditRequest::default())
        .await
        .expect_err("agents may not read the audit log");
    assert_eq!(
        error_of(&status).kind,
        ErrorKind::PermissionDenied,
        "{status:?}"
    );
    let mut admin = platform.client().await;
    let grpc = admin
        .list_audit(proto::ListAuditRequest {
            agent: "auditor".into(),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc.records_json.len(), 2);

    // `stdout: true`: each record is one JSON line on the control plane's stdout, the
    // policy's refusal included (the uuid refusal came before any chain, so it is not).
    let ids = [
        counted.id.clone(),
        bumped_id.clone(),
        failed.id.clone(),
        policy_record.call_id.clone(),
    ];
    platform
        .eventually("audit lines on stdout", Duration::from_secs(20), || {
            let logs = platform.logs();
            let ids = ids.clone();
            async move {
                let lines: Vec<AuditRecord> = logs
                    .lines()
                    .filter(|l| l.starts_with('{'))
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                ids.iter()
                    .all(|id| lines.iter().filter(|r| &r.call_id == id).count() == 1)
            }
        })
        .await;
    let logs = platform.logs();
    assert!(
        !logs.contains(RESULT_WORD),
        "a redacted result reached the log"
    );
    assert!(
        !logs.contains(&format!("\"callId\":\"{}\"", refused_record.call_id)),
        "a refusal without a chain is not copied to stdout"
    );
}
