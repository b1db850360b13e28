//! Dry runs and repeated calls against a real `toolgrid up`: an agent's dry run of a
//! `write` command never reaches the witness (an HTTP server the tools call) and answers
//! the command's `dryRunResult`; a dry run of a `read` command runs for real; the agent's
//! identical call within the Tool's `repeatWindow` is refused `repeated-call`, unless the
//! command sets `allowRepeat` or the first call's idempotency key is sent again.

use crate::common;

use common::witness::Witness;
use common::{Platform, fixtures, result_of};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;

const BOT: &str = "bot-token-value";

fn fixture(name: &str) -> PathBuf {
    fixtures::repo().join(format!("tests/fixtures/tools/{name}/{name}.wasm"))
}

/// An `effects` Tool (`run --base --run --steps --work`: HTTP requests to the witness),
/// with `command` extra fields of its one command, and `bot`'s binding to it.
fn effects_tool(name: &str, effect: &str, port: u16, command: &str) -> String {
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: {effect}
  timeout: 60s
  repeatWindow: 1h
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: steps, schema: {{type: integer, minimum: 1}}, default: 1}}
        - {{name: work, schema: {{type: integer, minimum: 0}}, default: 0}}
      result: {{type: object, required: [run]}}{command}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: {name}-1.0.0}}
spec:
  tool: {name}
  version: 1.0.0
  artifact: {{file: {}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: bot-{name}}}
spec: {{agents: [bot], tool: {name}}}
"#,
        fixture("effects").display()
    )
}

const POOL_AND_AGENT: &str = r#"apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {name: default}
spec: {replicas: 1, slotsPerWorker: 4}
---
apiVersion: v1
kind: Secret
metadata: {name: bot-token}
stringData: {token: bot-token-value}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: bot}
spec:
  tokenSecretRef: {name: bot-token, key: token}
  permissions: [{tools: ["*"]}]
"#;

fn manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let mut text = POOL_AND_AGENT.to_string();
    text += &effects_tool(
        "writer",
        "write",
        port,
        "\n      dryRunResult: {run: dry, wouldWrite: true}",
    );
    text += &effects_tool("plain-writer", "write", port, "");
    text += &effects_tool("reader", "read", port, "");
    text += &effects_tool("poller", "read", port, "\n      allowRepeat: true");
    std::fs::write(dir.join("tools.yaml"), text).unwrap();
    dir
}

fn request(tool: &str, base: &str, run: &str) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: tool.into(),
        command: "run".into(),
        args_json: json!({"base": base, "run": run}).to_string(),
        ..Default::default()
    }
}

fn dry(mut request: proto::InvokeRequest) -> proto::InvokeRequest {
    request.dry_run = true;
    request
}

fn keyed(mut request: proto::InvokeRequest, key: &str) -> proto::InvokeRequest {
    request.idempotency_key = key.into();
    request
}

async fn invoke(
    platform: &Platform,
    request: proto::InvokeRequest,
) -> Result<proto::Call, tonic::Status> {
    let mut client = platform.client_with(Some(BOT), None).await;
    client.invoke(request).await.map(|r| r.into_inner())
}

/// The witness's requests of run `run` (its POST bodies and GET paths name it).
fn requests_of(witness: &Witness, run: &str) -> usize {
    let body = format!("\"run\":\"{run}\"");
    witness
        .seen()
        .iter()
        .filter(|s| s.body.contains(&body) || s.path.ends_with(&format!("/{run}")))
        .count()
}

fn succeeded(call: &proto::Call) {
    assert_eq!(
        call.state,
        proto::CallState::Succeeded as i32,
        "{:?}",
        call.error
    );
}

fn repeated(status: &tonic::Status, first: &str) {
    assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
    let error = toolgrid_proto::status::error_of(status);
    assert_eq!(error.kind, ErrorKind::RepeatedCall, "{}", error.message);
    assert!(error.message.contains(first), "{}", error.message);
}

async fn calls_of_bot(platform: &Platform) -> Vec<proto::Call> {
    let mut client = platform.client_with(Some(BOT), None).await;
    client
        .list_calls(proto::ListCallsRequest {
            limit: 1000,
            ..Default::default()
        })
        .await
        .expect("list calls")
        .into_inner()
        .calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_answer_without_running_and_repeats_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let base = witness.base();
    let dir = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &dir, &[]);

    // A dry run of a write command: answered at once with its dryRunResult, recorded
    // succeeded, never assigned, never at the witness.
    let call = invoke(&platform, dry(request("writer", &base, "dry-1")))
        .await
        .expect("dry run");
    succeeded(&call);
    assert!(call.dry_run);
    assert_eq!(result_of(&call), json!({"run": "dry", "wouldWrite": true}));
    assert_eq!((call.worker.as_str(), call.epoch), ("", 0));
    let oplog = platform.oplog(&call.id).await;
    let kinds: Vec<&str> = oplog.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["call-started", "outcome"]);
    let started: Value = serde_json::from_str(&oplog[0].payload_json).unwrap();
    assert_eq!(started["dryRun"], json!(true));
    assert_eq!(requests_of(&witness, "dry-1"), 0);
    // Without a dryRunResult: the acknowledgement.
    let call = invoke(&platform, dry(request("plain-writer", &base, "dry-2")))
        .await
        .expect("dry run");
    succeeded(&call);
    assert_eq!(result_of(&call), json!("Operation acknowledged."));
    assert_eq!(requests_of(&witness, "dry-2"), 0);
    // A dry run is not the real call: the real call after it runs (no repeat).
    let real = invoke(&platform, request("writer", &base, "dry-1"))
        .await
        .expect("the real call");
    succeeded(&real);
    assert!(!real.dry_run);
    assert_eq!(result_of(&real)["run"], "dry-1");
    assert!(requests_of(&witness, "dry-1") > 0);
    // A dry run of a read command runs for real.
    let read = invoke(&platform, dry(request("reader", &base, "dry-read")))
        .await
        .expect("a read dry run");
    succeeded(&read);
    assert!(read.dry_run && !read.worker.is_empty());
    assert_eq!(result_of(&read)["run"], "dry-read");
    assert!(requests_of(&witness, "dry-read") > 0);

    // Repeats: the agent's identical call within the window is refused, over gRPC and HTTP,
    // and nothing is recorded or run.
    let first = invoke(&platform, keyed(request("reader", &base, "rep-1"), "key-1"))
        .await
        .expect("first");
    succeeded(&first);
    let ran = requests_of(&witness, "rep-1");
    assert!(ran > 0);
    let recorded = calls_of_bot(&platform).await.len();
    repeated(
        &invoke(&platform, request("reader", &base, "rep-1"))
            .await
            .unwrap_err(),
        &first.id,
    );
    repeated(
        &invoke(&platform, keyed(request("reader", &base, "rep-1"), "key-2"))
            .await
            .unwrap_err(),
        &first.id,
    );
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/namespaces/default/tools/reader/run:call",
            platform.http
        ))
        .header("authorization", format!("Bearer {BOT}"))
        .json(&json!({"args": {"base": base, "run": "rep-1"}}))
        .send()
        .await
        .expect("HTTP");
    assert_eq!(response.status().as_u16(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "repeated-call", "{body}");
    // The first call's key returns the first call.
    let again = invoke(&platform, keyed(request("reader", &base, "rep-1"), "key-1"))
        .await
        .expect("deduplicated");
    assert!(again.deduplicated);
    assert_eq!(again.id, first.id);
    assert_eq!(calls_of_bot(&platform).await.len(), recorded);
    assert_eq!(requests_of(&witness, "rep-1"), ran, "nothing ran again");
    // Different arguments are a different call.
    succeeded(
        &invoke(&platform, request("reader", &base, "rep-2"))
            .await
            .expect("new"),
    );
    // A command with allowRepeat is called again.
    let one = invoke(&platform, request("poller", &base, "poll"))
        .await
        .expect("1st");
    let two = invoke(&platform, request("poller", &base, "poll"))
        .await
        .expect("2nd");
    succeeded(&one);
    succeeded(&two);
    assert_ne!(one.id, two.id);
    // The operator's calls are not checked for repeats.
    for _ in 0..2 {
        let call = platform
            .invoke(request("reader", &base, "by-operator"))
            .await
            .expect("operator");
        succeeded(&call);
    }

    // The CLI: `--dry-run` says the call did not run; the oplog shows the dry run.
    let args = json!({"base": base, "run": "dry-cli"}).to_string();
    let out = platform.cli(
        &["call", "--dry-run", "--args", &args, "writer", "run"],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let printed: Value = serde_json::from_str(&stdout).expect("the result as JSON");
    assert_eq!(printed, json!({"run": "dry", "wouldWrite": true}));
    assert!(
        stderr.contains("dry run") && stderr.contains("did not run"),
        "{stderr}"
    );
    let out = platform.cli(
        &[
            "call",
            "--dry-run",
            "--output",
            "call",
            "--args",
            &args,
            "writer",
            "run",
        ],
        None,
    );
    let shown: Value = serde_json::from_slice(&out.stdout).expect("the call as JSON");
    assert_eq!(shown["dryRun"], json!(true), "{shown}");
    let id = shown["id"].as_str().expect("id").to_string();
    let out = platform.cli(&["oplog", &id], None);
    let oplog = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{oplog}");
    assert!(oplog.contains("dryRun"), "{oplog}");
    assert!(oplog.contains("outcome"), "{oplog}");
    assert_eq!(requests_of(&witness, "dry-cli"), 0);
}
