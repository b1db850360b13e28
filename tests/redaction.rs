//! Redaction on every door an agent can read, on a real `toolgrid up`.
//!
//! One tool (`leaky`, a WAT module) reports progress, makes one outgoing request whose
//! response echoes a secret-looking token, and prints a result with another: three
//! `sk-...` strings, one per channel. Its binding's redact Middleware removes them. As the
//! AGENT, every door is read (gRPC GetCall / GetOplog / InvokeStream, HTTP call / oplog /
//! result page / event stream, MCP tools/call with progress and resources/read, the
//! console's call page, the CLI's `toolgrid oplog`) and no secret appears anywhere, not
//! even base64-encoded. As the OPERATOR the raw oplog (what a replay uses) still holds them.
//!
//! The platform runs with every full oplog read failing (`TOOLGRID_FAULTS=oplog:...`): the
//! doors must read through the paged store query, or they fail.

use crate::common;

use base64::Engine as _;
use common::witness::Witness;
use common::{Platform, fixtures, result_of};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const AGENT_TOKEN: &str = "leaky-reader-token-value";

/// What the tool reports as progress, what the witness echoes back in the response body,
/// and what the tool prints as its result.
const PROGRESS_SECRET: &str = "sk-progress-aaa111";
const RESPONSE_SECRET: &str = "sk-response-bbb222";
const RESULT_SECRET: &str = "sk-result-ccc333";
const SECRETS: [&str; 3] = [PROGRESS_SECRET, RESPONSE_SECRET, RESULT_SECRET];

/// `text` for a WAT string literal.
fn wat_string(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Reports [`PROGRESS_SECRET`], POSTs [`RESPONSE_SECRET`] to the witness's `/echo` (which
/// answers with it in the body), then prints `{"note": RESULT_SECRET}`.
fn leaky_wat(echo_url: &str) -> String {
    let progress = format!("fetched {PROGRESS_SECRET}");
    let request = json!({
        "method": "POST",
        "url": echo_url,
        "headers": [["content-type", "text/plain"]],
        "body": RESPONSE_SECRET,
    })
    .to_string();
    let result = json!({"note": RESULT_SECRET}).to_string();
    format!(
        r#"(module
  (import "toolgrid" "progress" (func $progress (param i32 i32) (result i32)))
  (import "toolgrid" "http_send" (func $send (param i32 i32 i32 i32) (result i32)))
  (import "toolgrid" "http_take" (func $take (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 1024) "{progress}")
  (data (i32.const 2048) "{request}")
  (data (i32.const 4096) "{result}")
  (func (export "_start")
    (drop (call $progress (i32.const 1024) (i32.const {progress_len})))
    (drop (call $send (i32.const 2048) (i32.const {request_len}) (i32.const 16) (i32.const 20)))
    (drop (call $take (i32.load (i32.const 16)) (i32.const 65536) (i32.load (i32.const 20))))
    (i32.store (i32.const 32) (i32.const 4096))
    (i32.store (i32.const 36) (i32.const {result_len}))
    (drop (call $fd_write (i32.const 1) (i32.const 32) (i32.const 1) (i32.const 40)))))"#,
        progress = wat_string(&progress),
        request = wat_string(&request),
        result = wat_string(&result),
        progress_len = progress.len(),
        request_len = request.len(),
        result_len = result.len(),
    )
}

fn manifests(root: &Path, witness: &Witness) -> std::path::PathBuf {
    let manifests = fixtures::examples(root);
    let wasm = fixtures::write_wat(
        root,
        "leaky.wasm",
        &leaky_wat(&format!("{}/echo", witness.base())),
    );
    let port = witness.addr.port();
    let text = format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: leaky}}
spec:
  effect: read
  timeout: 30s
  repeatWindow: 0s
  commands: [{{name: default, result: {{type: object}}}}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: leaky-1.0.0}}
spec:
  tool: leaky
  version: 1.0.0
  artifact: {{file: {wasm}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
---
apiVersion: v1
kind: Secret
metadata: {{name: leaky-tokens}}
stringData: {{reader: {AGENT_TOKEN}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: reader}}
spec:
  tokenSecretRef: {{name: leaky-tokens, key: reader}}
  permissions: [{{tools: ["*"], commands: ["*"]}}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: hide-keys}}
spec:
  redact:
    patterns: ['sk-[a-z0-9-]+']
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: reader-leaky}}
spec: {{agents: [reader], tool: leaky, middleware: [hide-keys]}}
"#,
        wasm = wasm.display()
    );
    std::fs::write(manifests.join("leaky.yaml"), text).unwrap();
    manifests
}

/// `text`, and the decoding of every run of base64 in it (oplog bodies travel as
/// `bodyBase64`): a secret hidden by an encoding is still a secret.
fn visible(text: &str) -> String {
    let mut all = text.to_string();
    let is_b64 = |c: char| c.is_ascii_alphanumeric() || c == '+' || c == '/' || c == '=';
    for run in text.split(|c: char| !is_b64(c)).filter(|r| r.len() >= 16) {
        let trimmed = run.trim_end_matches('=');
        for cut in 0..4.min(trimmed.len()) {
            let candidate = &trimmed[cut..];
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD_NO_PAD.decode(candidate) {
                all.push('\n');
                all.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
    all
}

/// Asserts that no secret can be read in what `door` returned.
fn assert_clean(door: &str, text: &str) {
    let seen = visible(text);
    for secret in SECRETS {
        assert!(
            !seen.contains(secret),
            "{door} shows {secret} to the agent:\n{text}"
        );
    }
}

/// The whole oplog of `call_id` over gRPC with `client`, as text.
async fn grpc_oplog(client: &mut toolgrid::cli::client::Client, call_id: &str) -> String {
    let oplog = toolgrid::cli::client::oplog_of(client, call_id)
        .await
        .expect("oplog");
    assert!(!oplog.entries.is_empty());
    oplog
        .entries
        .iter()
        .map(|e| format!("{} {} {}\n", e.seq, e.kind, e.payload_json))
        .collect()
}

fn mcp_post(http: &reqwest::Client, platform: &Platform) -> reqwest::RequestBuilder {
    http.post(format!("http://{}/mcp", platform.http))
        .bearer_auth(AGENT_TOKEN)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reads_no_secret_through_any_door_and_the_operator_reads_the_raw_oplog() {
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start_with_env(
        root.path(),
        &manifests,
        &[],
        &[("TOOLGRID_FAULTS", "oplog:1000000")],
    );
    let http = reqwest::Client::new();
    let base = format!("http://{}", platform.http);
    let mut agent = platform.client_with(Some(AGENT_TOKEN), None).await;

    // gRPC Invoke: the result is redacted.
    let call = agent
        .invoke(proto::InvokeRequest {
            tool: "leaky".into(),
            ..Default::default()
        })
        .await
        .expect("invoke")
        .into_inner();
    assert_eq!(result_of(&call), json!({"note": "[REDACTED]"}));
    assert_clean("gRPC Invoke", &format!("{call:?}"));
    let id = call.id.clone();

    // The OPERATOR's raw oplog holds all that the tool saw and said: the secrets are there
    // (so the checks below can fail), the body as recorded for replay.
    let mut admin = platform.client().await;
    let raw = visible(&grpc_oplog(&mut admin, &id).await);
    assert!(raw.contains(PROGRESS_SECRET), "{raw}");
    assert!(raw.contains(RESPONSE_SECRET), "{raw}");
    let raw_http: Value = platform
        .http_client()
        .get(format!("{base}/v1/calls/{id}/oplog"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        visible(&raw_http.to_string()).contains(RESPONSE_SECRET),
        "{raw_http}"
    );

    // gRPC GetCall and GetOplog.
    let got = agent
        .get_call(proto::GetCallRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("get call")
        .into_inner();
    assert_clean("gRPC GetCall", &format!("{got:?}"));
    let oplog = grpc_oplog(&mut agent, &id).await;
    assert!(oplog.contains("[REDACTED]"), "{oplog}");
    assert!(oplog.contains("http-response"), "{oplog}");
    assert_clean("gRPC GetOplog", &oplog);

    // gRPC InvokeStream: progress events and the call at the end.
    let mut stream = agent
        .invoke_stream(proto::InvokeRequest {
            tool: "leaky".into(),
            ..Default::default()
        })
        .await
        .expect("invoke stream")
        .into_inner();
    let mut events = String::new();
    let mut progress = Vec::new();
    while let Some(event) = stream.message().await.expect("stream") {
        if let Some(proto::invoke_event::Event::Progress(p)) = &event.event
            && p.stage == "progress"
        {
            progress.push(p.message.clone());
        }
        events += &format!("{event:?}\n");
    }
    assert_eq!(progress, ["fetched [REDACTED]"], "{events}");
    assert_clean("gRPC InvokeStream", &events);

    // HTTP: the call, its oplog, its result page.
    for path in [
        format!("/v1/calls/{id}"),
        format!("/v1/calls/{id}/oplog"),
        format!("/v1/calls/{id}/result?page=0"),
    ] {
        let response = http
            .get(format!("{base}{path}"))
            .bearer_auth(AGENT_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_clean(&format!("HTTP {path}"), &response.text().await.unwrap());
    }
    // HTTP with an event stream: progress events, then the result.
    let response = http
        .post(format!(
            "{base}/v1/namespaces/default/tools/leaky/default:call"
        ))
        .bearer_auth(AGENT_TOKEN)
        .header("accept", "text/event-stream")
        .json(&json!({"args": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let sse = response.text().await.unwrap();
    assert!(sse.contains("fetched [REDACTED]"), "{sse}");
    assert_clean("HTTP event stream", &sse);

    // MCP: tools/call with a progress token (notifications, then the result), and the
    // result as a resource.
    let response = mcp_post(&http, &platform)
        .json(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "redaction", "version": "0"}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mcp = |body: Value| {
        mcp_post(&http, &platform)
            .header("mcp-session-id", session.clone())
            .header("mcp-protocol-version", "2025-06-18")
            .json(&body)
    };
    let called = mcp(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "leaky", "arguments": {}, "_meta": {"progressToken": "p1"}}}),
    )
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(called.contains("notifications/progress"), "{called}");
    assert!(called.contains("[REDACTED]"), "{called}");
    assert_clean("MCP tools/call", &called);
    let read = mcp(
        json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
        "params": {"uri": format!("toolgrid://calls/{id}/result?page=0")}}),
    )
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(read.contains("[REDACTED]"), "{read}");
    assert_clean("MCP resources/read", &read);

    // The console's call page (its timeline is the oplog).
    let login = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={AGENT_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303, "the agent logs in to the console");
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = http
        .get(format!("{base}/ui/calls/{id}"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains("fetched [REDACTED]"), "{page}");
    assert_clean("the console's call page", &page);

    // The CLI with the agent's token.
    let out = Command::new(env!("CARGO_BIN_EXE_toolgrid"))
        .args(["oplog", &id, "-o", "json"])
        .env("TOOLGRID_ENDPOINT", &platform.grpc)
        .env("TOOLGRID_TOKEN", AGENT_TOKEN)
        .env_remove("TOOLGRID_DATA")
        .output()
        .expect("run toolgrid oplog");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("http-response"), "{printed}");
    assert_clean("toolgrid oplog", &printed);

    // The audit log is not an agent's to read at all.
    let mut agent = platform.client_with(Some(AGENT_TOKEN), None).await;
    let refused = agent
        .list_audit(proto::ListAuditRequest::default())
        .await
        .expect_err("agents may not read the audit log");
    assert_eq!(error_of(&refused).kind, ErrorKind::PermissionDenied);
}
