//! Durable human approval: a real `toolgrid up` with Agents, bindings and approval
//! Middleware. The tool is the `secrets` fixture: it makes one request to the `Witness`
//! (with the call's idempotency key) and prints the variable named by `--config` (here
//! `TOOLGRID_APPROVED_BY`) in its result.

use crate::common;

use common::fixtures;
use common::witness::Witness;
use common::{Platform, error_kind, result_of};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;

const CALLER: &str = "caller-token-value";
const REVIEWER: &str = "reviewer-token-value";
const RUNNER: &str = "runner-token-value";
const BYSTANDER: &str = "bystander-token-value";
const HASTY: &str = "hasty-token-value";
const LENIENT: &str = "lenient-token-value";

/// One pool with one slot (so a waiting call that held it would block every other call),
/// the `secrets` tool, and agents bound through different approval Middleware:
/// `caller` through `needs-ok` (1 h, approver `reviewer`), `hasty` through `quick-deny`,
/// `lenient` through `quick-allow` (2 s each), `runner` through none.
fn manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let wasm = fixtures::repo().join("tests/fixtures/tools/secrets/secrets.wasm");
    let port = witness.addr.port();
    let agent = |name: &str| {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\n\
             spec:\n  tokenSecretRef: {{name: agent-tokens, key: {name}}}\n  \
             permissions: [{{tools: [\"*\"], commands: [\"*\"]}}]\n  \
             secretRef: {{name: shared-secrets}}\n"
        )
    };
    let binding = |agent: &str, middleware: &str| {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: {agent}-secrets}}\n\
             spec:\n  agents: [{agent}]\n  tool: secrets\n  secretKeysReadable: [api-token]\n  \
             middleware: [{middleware}]\n"
        )
    };
    let mut text = format!(
        r#"apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: default}}
spec: {{replicas: 1, slotsPerWorker: 1}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: secrets}}
spec:
  effect: write
  timeout: 60s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: config, schema: {{type: string}}, required: true}}
        - {{name: work, schema: {{type: integer, minimum: 0}}, default: 0}}
      result: {{type: object}}
      errors:
        - {{name: request-failed, exitCode: 3}}
        - {{name: denied, exitCode: 4}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: secrets-1.0.0}}
spec:
  tool: secrets
  version: 1.0.0
  artifact: {{file: {wasm}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
---
apiVersion: v1
kind: Secret
metadata: {{name: shared-secrets}}
stringData: {{api-token: the-api-token}}
---
apiVersion: v1
kind: Secret
metadata: {{name: agent-tokens}}
stringData: {{caller: {CALLER}, reviewer: {REVIEWER}, runner: {RUNNER}, bystander: {BYSTANDER}, hasty: {HASTY}, lenient: {LENIENT}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: needs-ok}}
spec:
  approval: {{timeout: 1h, onTimeout: deny, approvers: [reviewer]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: quick-deny}}
spec:
  approval: {{timeout: 2s, onTimeout: deny}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: quick-allow}}
spec:
  approval: {{timeout: 2s, onTimeout: allow}}
"#,
        wasm = wasm.display()
    );
    for name in [
        "caller",
        "reviewer",
        "runner",
        "bystander",
        "hasty",
        "lenient",
    ] {
        text += &agent(name);
    }
    text += &binding("caller", "needs-ok");
    text += &binding("hasty", "quick-deny");
    text += &binding("lenient", "quick-allow");
    text += "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {name: runner-secrets}\n\
             spec:\n  agents: [runner]\n  tool: secrets\n  secretKeysReadable: [api-token]\n";
    std::fs::write(dir.join("approval.yaml"), text).unwrap();
    dir
}

/// The `secrets run` request: `work` makes otherwise identical calls differ.
fn request(witness: &Witness, work: u64, key: &str) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: "secrets".into(),
        command: "run".into(),
        args_json: json!({"base": witness.base(), "config": "TOOLGRID_APPROVED_BY", "work": work})
            .to_string(),
        idempotency_key: key.into(),
        ..Default::default()
    }
}

fn state(call: &proto::Call) -> proto::CallState {
    proto::CallState::try_from(call.state).unwrap_or(proto::CallState::Unspecified)
}

/// Requests the witness saw from `call_id` (its idempotency keys are `toolgrid-ID-SEQ`).
fn seen_from(witness: &Witness, call_id: &str) -> usize {
    let prefix = format!("toolgrid-{call_id}-");
    witness
        .seen()
        .iter()
        .filter(|s| s.key.as_deref().is_some_and(|k| k.starts_with(&prefix)))
        .count()
}

async fn wait_for_end(platform: &Platform, token: Option<&str>, id: &str) -> proto::Call {
    let mut client = match token {
        Some(token) => platform.client_with(Some(token), None).await,
        None => platform.client().await,
    };
    for _ in 0..30 {
        let call = client
            .get_call(proto::GetCallRequest {
                id: id.into(),
                wait: true,
                ..Default::default()
            })
            .await
            .expect("get call")
            .into_inner();
        if matches!(
            state(&call),
            proto::CallState::Succeeded | proto::CallState::Failed
        ) {
            return call;
        }
    }
    panic!("call {id} did not end; log:\n{}", platform.logs());
}

async fn ready(platform: &Platform) {
    platform
        .eventually(
            "the secrets tool is ready",
            Duration::from_secs(60),
            || async {
                platform
                    .resource("tools", "secrets")
                    .await
                    .is_some_and(|r| r.ready == "True")
            },
        )
        .await;
}

fn refusal(result: Result<tonic::Response<proto::Call>, tonic::Status>) -> ErrorKind {
    match result {
        Ok(call) => panic!("not refused: {:?}", call.into_inner()),
        Err(status) => toolgrid_proto::status::error_of(&status).kind,
    }
}

fn decision(id: &str, reason: &str) -> proto::DecisionRequest {
    proto::DecisionRequest {
        call_id: id.into(),
        reason: reason.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_survives_a_kill_holds_no_slot_and_runs_once_when_approved() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness);
    let mut platform = Platform::start(root.path(), &dir, &["--lease", "1s"]);
    ready(&platform).await;

    // The agent's call comes back at once, waiting.
    let mut caller = platform.client_with(Some(CALLER), None).await;
    let waiting = caller
        .invoke(request(&witness, 1, "first"))
        .await
        .expect("invoke")
        .into_inner();
    assert_eq!(state(&waiting), proto::CallState::AwaitingApproval);
    assert!(waiting.approval_json.contains("needs-ok"), "{waiting:?}");
    let id = waiting.id.clone();
    // The same key returns the same call, still waiting.
    let again = caller
        .invoke(request(&witness, 1, "first"))
        .await
        .expect("invoke again")
        .into_inner();
    assert_eq!(again.id, id);
    assert!(again.deduplicated);
    assert_eq!(state(&again), proto::CallState::AwaitingApproval);

    // Over HTTP too: 202 and the waiting call, not a blocked request.
    let http = reqwest::Client::new();
    let response = http
        .post(format!(
            "http://{}/v1/namespaces/default/tools/secrets/run:call",
            platform.http
        ))
        .bearer_auth(CALLER)
        .json(&json!({"args": {"base": witness.base(), "config": "TOOLGRID_APPROVED_BY", "work": 2}, "idempotencyKey": "over-http"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["state"], "awaiting-approval", "{body}");
    assert_eq!(body["approval"]["wait"]["middleware"], "needs-ok", "{body}");
    let over_http = body["id"].as_str().unwrap().to_string();

    // The CLI says it waits and how to decide it.
    let out = platform.cli(
        &[
            "call",
            "secrets",
            "run",
            "--base",
            &witness.base(),
            "--config",
            "TOOLGRID_APPROVED_BY",
            "--work",
            "3",
            "--token",
            CALLER,
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("waits for approval"), "{stderr}");
    assert!(stderr.contains("toolgrid approve"), "{stderr}");

    // Listed as waiting.
    let out = platform.cli(&["calls", "--awaiting-approval"], None);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}");
    assert!(listed.contains(&id), "{listed}");
    assert!(listed.contains(&over_http), "{listed}");

    // Kill the control plane (its own workers go with it) and start it again.
    platform.restart(libc::SIGKILL);
    ready(&platform).await;
    let mut admin = platform.client().await;
    let still = admin
        .get_call(proto::GetCallRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&still), proto::CallState::AwaitingApproval);
    let waiting_now = admin
        .list_calls(proto::ListCallsRequest {
            awaiting_approval: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .calls;
    assert!(waiting_now.iter().any(|c| c.id == id));

    // The only slot is free: another agent's call runs meanwhile.
    let mut runner = platform.client_with(Some(RUNNER), None).await;
    let ran = runner
        .invoke(request(&witness, 4, "runner-1"))
        .await
        .expect("runner's call")
        .into_inner();
    let result = result_of(&ran);
    assert_eq!(result["config"], Value::Null, "{result}");
    assert_eq!(seen_from(&witness, &ran.id), 1);
    assert_eq!(seen_from(&witness, &id), 0, "the waiting call ran");

    // Approved with the CLI, it runs once, knowing who approved it.
    let out = platform.cli(&["approve", &id, "--reason", "checked the diff"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let approved: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(approved["approval"]["decision"]["approved"], true);
    // `toolgrid calls ID --wait` returns its outcome.
    let out = platform.cli(&["calls", &id, "--wait", "-o", "json"], None);
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(printed["calls"][0]["state"], "succeeded", "{printed}");
    let done = wait_for_end(&platform, Some(CALLER), &id).await;
    let result = result_of(&done);
    let by = result["config"].as_str().unwrap_or_default().to_string();
    assert!(by.starts_with("operator:"), "{result}");
    assert_eq!(seen_from(&witness, &id), 1);

    // The oplog says who, when and why.
    let oplog = platform.oplog(&id).await;
    let entry = oplog
        .iter()
        .find(|e| e.kind == "approval")
        .expect("an approval entry");
    let payload: Value = serde_json::from_str(&entry.payload_json).unwrap();
    assert_eq!(payload["approved"], true, "{payload}");
    assert_eq!(payload["by"], by.as_str(), "{payload}");
    assert_eq!(payload["reason"], "checked the diff", "{payload}");
    assert!(
        payload["atMs"].as_i64().unwrap_or_default() > 0,
        "{payload}"
    );

    // Denied over HTTP: it fails `denied`, naming who and why, and never ran.
    let response = platform
        .http_client()
        .post(format!(
            "http://{}/v1/calls/{over_http}/deny",
            platform.http
        ))
        .json(&json!({"reason": "not today"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let denied: Value = response.json().await.unwrap();
    assert_eq!(denied["state"], "failed", "{denied}");
    assert_eq!(denied["error"]["kind"], "denied", "{denied}");
    let message = denied["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("operator:") && message.contains("not today"),
        "{message}"
    );
    assert_eq!(seen_from(&witness, &over_http), 0);
    // The caller long-polls it and gets the end at once.
    let response = http
        .get(format!(
            "http://{}/v1/calls/{over_http}?wait=5",
            platform.http
        ))
        .bearer_auth(CALLER)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_approvers_decide_never_the_caller_and_only_once() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &dir, &["--lease", "1s"]);
    ready(&platform).await;

    let mut caller = platform.client_with(Some(CALLER), None).await;
    let waiting = caller
        .invoke(request(&witness, 10, "self"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&waiting), proto::CallState::AwaitingApproval);
    let id = waiting.id.clone();

    // A stream ends at once with the waiting call.
    let mut stream = caller
        .invoke_stream(request(&witness, 12, "streamed"))
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(event) = stream.message().await.unwrap() {
        if let Some(proto::invoke_event::Event::Call(call)) = event.event {
            last = Some(call);
        }
    }
    let streamed = last.expect("the stream ends with the call");
    assert_eq!(state(&streamed), proto::CallState::AwaitingApproval);

    // The calling agent may not approve its own call, nor may an operator acting as it.
    assert_eq!(
        refusal(caller.approve(decision(&id, "me")).await),
        ErrorKind::PermissionDenied
    );
    let mut as_caller = platform
        .client_with(Some(&platform.admin_token()), Some("caller"))
        .await;
    assert_eq!(
        refusal(as_caller.approve(decision(&id, "me")).await),
        ErrorKind::PermissionDenied
    );
    let out = platform.cli(&["approve", &id, "--token", CALLER], None);
    assert_eq!(out.status.code(), Some(6));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("permission-denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An agent that is not an approver does not even see the call.
    let mut bystander = platform.client_with(Some(BYSTANDER), None).await;
    assert_eq!(
        refusal(bystander.deny(decision(&id, "no")).await),
        ErrorKind::NotFound
    );
    let theirs = bystander
        .list_calls(proto::ListCallsRequest {
            awaiting_approval: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .calls;
    assert!(theirs.is_empty());

    // The approver sees it among the calls it may decide, and approves it.
    let mut reviewer = platform.client_with(Some(REVIEWER), None).await;
    let theirs = reviewer
        .list_calls(proto::ListCallsRequest {
            awaiting_approval: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .calls;
    assert_eq!(
        theirs.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [id.as_str(), streamed.id.as_str()],
        "oldest first"
    );
    let approved = reviewer
        .approve(decision(&id, "fine by me"))
        .await
        .expect("the approver approves")
        .into_inner();
    assert_ne!(state(&approved), proto::CallState::AwaitingApproval);
    // Deciding twice is refused, whoever tries.
    assert_eq!(
        refusal(reviewer.approve(decision(&id, "again")).await),
        ErrorKind::NotAwaitingApproval
    );
    let mut admin = platform.client().await;
    assert_eq!(
        refusal(admin.deny(decision(&id, "too late")).await),
        ErrorKind::NotAwaitingApproval
    );
    let done = wait_for_end(&platform, None, &id).await;
    assert_eq!(result_of(&done)["config"], "agent:default/reviewer");
    assert_eq!(seen_from(&witness, &id), 1);

    // A call that never waited cannot be decided.
    let mut runner = platform.client_with(Some(RUNNER), None).await;
    let plain = runner
        .invoke(request(&witness, 11, "plain"))
        .await
        .unwrap()
        .into_inner();
    result_of(&plain);
    assert_eq!(
        refusal(admin.approve(decision(&plain.id, "")).await),
        ErrorKind::NotAwaitingApproval
    );
    assert_eq!(
        refusal(admin.approve(decision("no-such-call", "")).await),
        ErrorKind::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_wait_denies_or_allows_as_the_middleware_says() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &dir, &["--lease", "1s"]);
    ready(&platform).await;

    let mut hasty = platform.client_with(Some(HASTY), None).await;
    let denied = hasty
        .invoke(request(&witness, 20, "hasty"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&denied), proto::CallState::AwaitingApproval);
    let mut lenient = platform.client_with(Some(LENIENT), None).await;
    let allowed = lenient
        .invoke(request(&witness, 21, "lenient"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&allowed), proto::CallState::AwaitingApproval);

    let denied = wait_for_end(&platform, Some(HASTY), &denied.id).await;
    assert_eq!(error_kind(&denied), "approval-timeout");
    assert_eq!(seen_from(&witness, &denied.id), 0);
    let oplog = platform.oplog(&denied.id).await;
    let kinds: Vec<&str> = oplog.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["call-started", "approval", "outcome"]);

    let allowed = wait_for_end(&platform, Some(LENIENT), &allowed.id).await;
    assert_eq!(result_of(&allowed)["config"], "timeout");
    assert_eq!(seen_from(&witness, &allowed.id), 1);
}
