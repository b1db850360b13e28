//! The MCP server at `/mcp`, against a real `toolgrid up`, driven by clients this project did
//! not write: the official Python SDK (`mcp` 2.x) in its legacy, 2026-07-28 and auto modes,
//! the official TypeScript clients (`@modelcontextprotocol/sdk` 1.x, `@modelcontextprotocol/client`
//! 2.x), and the official conformance suite; plus hostile requests, each refusal asserted
//! exactly.
//!
//! Fixtures: the example manifests and `tests/mcp/fixtures.yaml` (agent `mcp-agent` bound to
//! semver, textstats and compare-{idempotent,write,external}; agent `mcp-other` bound to uuid).

use crate::common;

use common::witness::Witness;
use common::{Platform, fixtures};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const AGENT_TOKEN: &str = "mcp-agent-example-token";
const OTHER_TOKEN: &str = "mcp-other-example-token";
const MODERN: &str = "2026-07-28";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A platform with the example tools and the MCP fixtures.
fn start(root: &Path, witness_port: u16) -> Platform {
    let manifests = manifests(root, witness_port);
    Platform::start(root, &manifests, &[])
}

/// The example manifests, tests/mcp/fixtures.yaml, and `slow` (the progress fixture, its
/// requests allowed to the witness on `witness_port`) bound to `mcp-agent`.
fn manifests(root: &Path, witness_port: u16) -> PathBuf {
    let manifests = fixtures::examples(root);
    std::fs::copy(
        repo().join("tests/mcp/fixtures.yaml"),
        manifests.join("mcp-fixtures.yaml"),
    )
    .unwrap();
    let wasm = repo().join("tests/fixtures/tools/slow/slow.wasm");
    std::fs::write(
        manifests.join("mcp-slow.yaml"),
        format!(
            r#"apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: slow}}
spec:
  description: Steps with progress reports, a request to the witness per step.
  effect: read
  timeout: 120s
  repeatWindow: 0s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: steps, schema: {{type: integer, minimum: 1}}, default: 5}}
        - {{name: sleep-ms, schema: {{type: integer, minimum: 0}}, default: 200}}
      flags:
        - {{name: progress}}
      result: {{type: object}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: slow-1.0.0}}
spec:
  tool: slow
  version: 1.0.0
  artifact: {{file: {wasm}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{witness_port}], allowPrivate: true}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: mcp-agent-slow}}
spec: {{agents: [mcp-agent], tool: slow}}
"#,
            wasm = wasm.display()
        ),
    )
    .unwrap();
    manifests
}

fn mcp_url(platform: &Platform) -> String {
    format!("http://{}/mcp", platform.http)
}

/// The tools `mcp-agent` sees, by model name, with their effects.
fn bound_tools() -> Value {
    json!({
        "semver__compare": "read",
        "semver__bump": "read",
        "textstats": "read",
        "compare-idempotent": "idempotent",
        "compare-write": "write",
        "compare-external": "external",
        "slow": "read",
    })
}

/// What the client scripts do (see tests/mcp/client.py).
fn plan(platform: &Platform, witness: &Witness) -> Value {
    json!({
        "progress": {
            "name": "slow",
            "arguments": {"base": witness.base(), "run": "progress-{tag}", "steps": 3,
                "sleep-ms": 50, "progress": true},
            "min": 3,
        },
        "cancel": {
            "name": "slow",
            "tool": "slow",
            "arguments": {"base": witness.base(), "run": "cancel-{tag}", "steps": 60,
                "sleep-ms": 300, "progress": true},
        },
        "url": mcp_url(platform),
        "api": format!("http://{}", platform.http),
        "token": AGENT_TOKEN,
        "tools": bound_tools(),
        "unbound": "uuid",
        "call": {
            "name": "semver__compare",
            // `{tag}`: each client run's own (build metadata, ignored by the comparison), so
            // no run repeats another's call (the agent would be refused `repeated-call`).
            "arguments": {"a": "1.2.0", "b": "1.10.0+{tag}"},
            "structured": {"order": -1, "a": "1.2.0", "b": "1.10.0+{tag}"},
        },
        "declared_error": {
            "name": "semver__compare",
            "arguments": {"a": "not-a-version", "b": "1.0.0+{tag}"},
            "error": "invalid-version",
        },
        "invalid": {"name": "semver__compare", "arguments": {"a": 5}},
    })
}

fn write_plan(root: &Path, plan: &Value) -> PathBuf {
    let path = root.join("plan.json");
    std::fs::write(&path, serde_json::to_vec_pretty(plan).unwrap()).unwrap();
    path
}

/// Runs a client script; its checks (JSON lines) must all pass.
async fn run_client(what: &str, mut command: Command, platform: &Platform) -> Vec<Value> {
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let summary = lines.iter().find_map(|l| l.get("summary"));
    assert!(
        output.status.success() && summary.is_some_and(|s| s["failed"] == json!([])),
        "{what} failed:\n{stdout}\nstderr:\n{}\nplatform log tail:\n{}",
        String::from_utf8_lossy(&output.stderr),
        tail(&platform.logs()),
    );
    let checks: Vec<&str> = lines.iter().filter_map(|l| l["check"].as_str()).collect();
    for required in [
        "401-status",
        "401-challenge",
        "metadata-resource",
        "sdk-without-token-fails",
        "list-only-bound",
        "annotations:compare-write",
        "annotations:compare-external",
        "annotations:compare-idempotent",
        "annotations:semver__compare",
        "schemas:semver__compare",
        "call-structured",
        "declared-error",
        "invalid-arguments",
        "unbound-tool",
        "progress-notifications",
        "cancelled",
    ] {
        assert!(
            checks.contains(&required),
            "{what}: no check {required}:\n{stdout}"
        );
    }
    lines
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn python_sdk_present() -> bool {
    Command::new("python3")
        .args(["-c", "import mcp, jsonschema, httpx2"])
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_in_each_era() {
    if !common::require("python3 with mcp 2.x and jsonschema", python_sdk_present()) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let platform = start(root.path(), witness.addr.port());
    let plan = write_plan(root.path(), &plan(&platform, &witness));
    for mode in ["legacy", MODERN, "auto"] {
        let mut command = Command::new("python3");
        command
            .arg(repo().join("tests/mcp/client.py"))
            .args(["--mode", mode, "--plan"])
            .arg(&plan);
        let lines = run_client(&format!("python mcp --mode {mode}"), command, &platform).await;
        nothing_after_the_cancel(&lines, &witness).await;
        if mode == MODERN || mode == "auto" {
            // auto probes server/discover and stays modern.
            let era = lines.iter().find(|l| l["check"] == "era").unwrap();
            assert_eq!(era["detail"], MODERN, "{mode}: {era}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_clients() {
    let Some(node) = common::node() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let platform = start(root.path(), witness.addr.port());
    let plan = write_plan(root.path(), &plan(&platform, &witness));
    for (sdk, mode) in [("v1", "legacy"), ("v2", "legacy"), ("v2", "auto")] {
        let mut command = Command::new(&node);
        command
            .arg(repo().join("tests/mcp/client.mjs"))
            .args(["--sdk", sdk, "--mode", mode, "--plan"])
            .arg(&plan)
            .env("TOOLGRID_JS_DIR", common::js_dir());
        let what = format!("node client.mjs --sdk {sdk} --mode {mode}");
        let lines = run_client(&what, command, &platform).await;
        let era = lines.iter().find(|l| l["check"] == "era").unwrap();
        if mode == "auto" {
            assert_eq!(era["detail"], MODERN, "{what}: {era}");
        } else {
            assert_ne!(era["detail"], MODERN, "{what}: {era}");
        }
        nothing_after_the_cancel(&lines, &witness).await;
    }
}

/// The witness saw no step of the cancelled run after its call ended: the count when the
/// client saw the call end stays (the steps are 300 ms apart, 60 of them).
async fn nothing_after_the_cancel(lines: &[Value], witness: &Witness) {
    let line = lines
        .iter()
        .find(|l| l.get("cancelled_run").is_some())
        .expect("the client reports the cancelled run");
    let run = line["cancelled_run"].as_str().unwrap().to_string();
    let steps = |w: &Witness| {
        w.seen()
            .iter()
            .filter(|s| {
                s.query
                    .as_deref()
                    .is_some_and(|q| q.contains(&format!("run={run}&")))
            })
            .count()
    };
    let at_end = steps(witness);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = steps(witness);
    assert_eq!(at_end, later, "run {run}: steps arrived after the cancel");
    assert!(
        later < 60,
        "run {run}: the cancelled call ran all its steps"
    );
}

/// The conformance suite's server scenarios, through a proxy that adds the agent's token
/// (the suite sends none); failures must be exactly those in the baseline
/// (`tests/mcp/conformance-baseline.yml`, explained in `tests/mcp/conformance-baseline.md`):
/// the suite itself fails on an unexpected failure and on a baselined scenario that passes.
#[test]
fn the_conformance_suite_against_its_baseline() {
    let Some(node) = common::node() else {
        return;
    };
    let Some(mut conformance) = common::js_command("conformance") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path(), 9);
    let mut proxy = Command::new(&node)
        .arg(repo().join("tests/mcp/auth-proxy.mjs"))
        .args([platform.http.as_str(), AGENT_TOKEN])
        .stdout(Stdio::piped())
        .spawn()
        .expect("auth proxy");
    let mut line = String::new();
    std::io::BufReader::new(proxy.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().strip_prefix("listening ").expect("proxy port");
    let out = root.path().join("conformance");
    let run = conformance
        .args(["server", "--url", &format!("http://127.0.0.1:{port}/mcp")])
        .arg("--expected-failures")
        .arg(repo().join("tests/mcp/conformance-baseline.yml"))
        .arg("-o")
        .arg(&out)
        .output()
        .expect("conformance");
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(
        run.status.success(),
        "conformance (against tests/mcp/conformance-baseline.yml):\n{}\n{}\nplatform log tail:\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
        tail(&platform.logs()),
    );
}

// ---- hostile requests, raw ----

struct Raw {
    http: reqwest::Client,
    url: String,
}

impl Raw {
    fn new(platform: &Platform) -> Raw {
        common::install_tls();
        Raw {
            http: reqwest::Client::new(),
            url: mcp_url(platform),
        }
    }

    fn post(&self, token: Option<&str>) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request
    }

    /// A 2026-07-28 request with its headers mirroring the body.
    fn modern(&self, token: &str, method: &str, mut params: Value) -> reqwest::RequestBuilder {
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        if let Some(extra) = params.get("_meta").and_then(Value::as_object) {
            for (k, v) in extra {
                meta[k] = v.clone();
            }
        }
        params["_meta"] = meta;
        let mut request = self
            .post(Some(token))
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", method);
        if let Some(name) = params.get("name").and_then(Value::as_str) {
            request = request.header("mcp-name", name);
        }
        request.json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
    }

    async fn initialize(&self, token: &str) -> String {
        let response = self
            .post(Some(token))
            .json(
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(body["result"]["capabilities"]["tools"]["listChanged"], true);
        session
    }
}

/// The body of a response that may be JSON or one SSE event.
async fn message_of(response: reqwest::Response) -> Value {
    let sse = response
        .headers()
        .get("content-type")
        .is_some_and(|c| c.to_str().unwrap_or("").starts_with("text/event-stream"));
    let text = response.text().await.unwrap();
    if sse {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m.get("id").is_some())
            .unwrap_or_else(|| panic!("no response in {text:?}"))
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_requests_are_refused_exactly() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path(), 9);
    let raw = Raw::new(&platform);

    // No token: 401 naming the metadata, which names this resource.
    let response = raw
        .post(None)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // Refused before its body was read: the connection closes, and the answer says so
    // (a client must not send its next request on it).
    assert_eq!(response.headers()["connection"], "close");
    let metadata_url = format!(
        "http://{}/.well-known/oauth-protected-resource/mcp",
        platform.http
    );
    assert_eq!(
        response.headers()["www-authenticate"],
        format!("Bearer resource_metadata=\"{metadata_url}\"").as_str()
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "unauthenticated");
    // A wrong token: the same, saying the token is invalid.
    let response = raw
        .post(Some("not-a-token"))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(
        response.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .ends_with("error=\"invalid_token\"")
    );
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let metadata: Value = raw
            .http
            .get(format!("http://{}{path}", platform.http))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(metadata["resource"], mcp_url(&platform));
        assert_eq!(metadata["bearer_methods_supported"], json!(["header"]));
        assert!(metadata["authorization_servers"].is_array());
    }

    // A browser origin that is not allowed: 403, before anything else.
    let response = raw
        .post(Some(AGENT_TOKEN))
        .header("origin", "http://evil.example.com")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32600);

    // Malformed JSON, a batch, no session and no _meta.
    for (body, status, code) in [
        ("{not json", 400, -32700),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#,
            400,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            400,
            -32600,
        ),
    ] {
        let response = raw.post(Some(AGENT_TOKEN)).body(body).send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{body}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
    }

    // An oversized body: 413 with a JSON-RPC error.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"x":"{}"}}}}"#,
        "a".repeat((1 << 20) + 1024)
    );
    let response = raw.post(Some(AGENT_TOKEN)).body(huge).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32600);

    // 2026-07-28: a modern list works and carries resultType and caching hints.
    let response = raw
        .modern(AGENT_TOKEN, "tools/list", json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["result"]["resultType"], "complete");
    assert_eq!(answer["result"]["cacheScope"], "private");
    assert!(answer["result"]["ttlMs"].is_u64());
    let names: Vec<&str> = answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"semver__compare") && !names.contains(&"uuid"));

    // Mcp-Method that is not the body's method: 400 HeaderMismatch.
    let response = raw
        .modern(AGENT_TOKEN, "tools/list", json!({}))
        .header("mcp-method", "tools/call")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32020, "{answer}");
    // Mcp-Name that is not the tool called: the same.
    let response = raw
        .modern(
            AGENT_TOKEN,
            "tools/call",
            json!({"name": "semver__compare", "arguments": {"a": "1.0.0", "b": "1.0.0"}}),
        )
        .header("mcp-name", "compare-write")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32020, "{answer}");
    // An unsupported version names the supported ones.
    let response = raw
        .post(Some(AGENT_TOKEN))
        .header("mcp-protocol-version", "1900-01-01")
        .header("mcp-method", "tools/list")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "1900-01-01"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32022);
    assert_eq!(answer["error"]["data"]["supported"][0], MODERN);
    // An unknown method: 404 with -32601.
    let response = raw
        .modern(AGENT_TOKEN, "prompts/list", json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32601);
    // A cursor this server did not make: invalid params.
    let response = raw
        .modern(AGENT_TOKEN, "tools/list", json!({"cursor": "bm90LW91cnM"}))
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    // An unbound tool: invalid params, as an unknown one.
    for name in ["uuid", "no-such-tool", "semver__no-such-command"] {
        let response = raw
            .modern(
                AGENT_TOKEN,
                "tools/call",
                json!({"name": name, "arguments": {}}),
            )
            .send()
            .await
            .unwrap();
        let answer = message_of(response).await;
        assert_eq!(answer["error"]["code"], -32602, "{name}: {answer}");
    }
    // A modern call: structured result and resultType, as an SSE response.
    let response = raw
        .modern(
            AGENT_TOKEN,
            "tools/call",
            json!({"name": "compare-write", "arguments": {"a": "2.0.0", "b": "1.0.0"},
                "_meta": {"toolgrid.dev/idempotencyKey": "mcp-hostile-1"}}),
        )
        .send()
        .await
        .unwrap();
    let answer = message_of(response).await;
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(answer["result"]["structuredContent"]["order"], 1);
    assert_eq!(answer["result"]["resultType"], "complete");
    // The idempotency key from _meta reached the call.
    let call_id = answer["result"]["_meta"]["toolgrid.dev/callId"]
        .as_str()
        .unwrap()
        .to_string();
    let call: Value = raw
        .http
        .get(format!("http://{}/v1/calls/{call_id}", platform.http))
        .bearer_auth(AGENT_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(call["idempotencyKey"], "mcp-hostile-1");
    assert_eq!(call["agent"], "mcp-agent");

    // A refusal by middleware (the example agent's policy denies comparing a version with
    // itself) is a tool result with isError, its kind and message; a command its
    // permissions leave out is not listed and is unknown.
    const REPORTER: &str = "reporter-example-token";
    let response = raw
        .modern(
            REPORTER,
            "tools/call",
            json!({"name": "semver__compare", "arguments": {"a": "1.0.0", "b": "1.0.0"}}),
        )
        .send()
        .await
        .unwrap();
    let answer = message_of(response).await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let error = &answer["result"]["_meta"]["toolgrid.dev/error"];
    assert_eq!(error["kind"], "denied", "{answer}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("comparing a version with itself"),
        "{answer}"
    );
    assert!(answer["result"].get("structuredContent").is_none());
    let response = raw
        .modern(REPORTER, "tools/list", json!({}))
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    let names: Vec<&str> = answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"semver__compare") && !names.contains(&"semver__bump"),
        "{names:?}"
    );
    let response = raw
        .modern(
            REPORTER,
            "tools/call",
            json!({"name": "semver__bump", "arguments": {"version": "1.0.0"}}),
        )
        .send()
        .await
        .unwrap();
    let answer = message_of(response).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");

    // Legacy: another agent's session id is not found (404, -32001), as an unknown one.
    let session = raw.initialize(AGENT_TOKEN).await;
    for (token, id) in [
        (OTHER_TOKEN, session.as_str()),
        (AGENT_TOKEN, "0123456789abcdef"),
    ] {
        let response = raw
            .post(Some(token))
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-06-18")
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"]["code"], -32001);
    }
    // Its owner may use it; the other agent cannot end it either.
    let response = raw
        .post(Some(AGENT_TOKEN))
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    assert!(answer["result"].get("resultType").is_none());
    let response = raw
        .http
        .delete(&raw.url)
        .bearer_auth(OTHER_TOKEN)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    // A resource that is another agent's call is not found.
    let other_session = raw.initialize(OTHER_TOKEN).await;
    let response = raw
        .post(Some(OTHER_TOKEN))
        .header("mcp-session-id", &other_session)
        .json(
            &json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read",
            "params": {"uri": format!("toolgrid://calls/{call_id}/result?page=0")}}),
        )
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    // Its owner reads page 0.
    let response = raw
        .post(Some(AGENT_TOKEN))
        .header("mcp-session-id", &session)
        .json(
            &json!({"jsonrpc": "2.0", "id": 5, "method": "resources/read",
            "params": {"uri": format!("toolgrid://calls/{call_id}/result?page=0")}}),
        )
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    let text = answer["result"]["contents"][0]["text"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(text).unwrap()["order"], 1);
    // GET without a session: 405.
    let response = raw
        .http
        .get(&raw.url)
        .bearer_auth(AGENT_TOKEN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
}

/// A legacy session's GET stream hears `notifications/tools/list_changed` when the
/// catalog changes what its agent may call.
#[tokio::test(flavor = "multi_thread")]
async fn list_changed_reaches_the_session_stream() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path(), 9);
    let raw = Raw::new(&platform);
    let session = raw.initialize(OTHER_TOKEN).await;
    let mut stream = raw
        .http
        .get(&raw.url)
        .bearer_auth(OTHER_TOKEN)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    // Bind mcp-other to semver as well.
    std::fs::write(
        platform.manifests.join("mcp-late-binding.yaml"),
        "apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {name: mcp-other-semver}\nspec: {agents: [mcp-other], tool: semver}\n",
    )
    .unwrap();
    let mut seen = String::new();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(chunk) = stream.chunk().await.unwrap() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("notifications/tools/list_changed") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(found, "no list_changed; stream so far: {seen:?}");
    let response = raw
        .post(Some(OTHER_TOKEN))
        .header("mcp-session-id", &session)
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    let names: Vec<&str> = answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"semver__compare"), "{names:?}");
}

// ---- OAuth access tokens ----

mod jwt {
    use base64::Engine as _;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    use serde_json::{Value, json};

    fn enc(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    pub struct Issuer {
        key: EcdsaKeyPair,
    }

    impl Issuer {
        pub fn new() -> Issuer {
            let rng = ring::rand::SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let key =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .unwrap();
            Issuer { key }
        }

        pub fn jwks(&self) -> Value {
            let point = self.key.public_key().as_ref();
            json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "test", "use": "sig",
                "x": enc(&point[1..33]), "y": enc(&point[33..65])}]})
        }

        pub fn token(&self, claims: &Value) -> String {
            let header = enc(br#"{"alg":"ES256","kid":"test","typ":"at+jwt"}"#);
            let signed = format!("{header}.{}", enc(claims.to_string().as_bytes()));
            let rng = ring::rand::SystemRandom::new();
            let signature = self.key.sign(&rng, signed.as_bytes()).unwrap();
            format!("{signed}.{}", enc(signature.as_ref()))
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread")]
async fn oauth_access_tokens_for_this_resource_only() {
    const ISSUER: &str = "https://auth.example.com";
    let root = tempfile::tempdir().unwrap();
    let issuer = jwt::Issuer::new();
    let jwks = root.path().join("jwks.json");
    std::fs::write(&jwks, issuer.jwks().to_string()).unwrap();
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let resource = format!("http://{http}/mcp");
    let manifests = manifests(root.path(), 9);
    // Another tenant's Agent of the same name lists the same subject, and so does a newer
    // Agent of default: neither takes the user over.
    std::fs::write(
        manifests.join("oauth-rivals.yaml"),
        r#"apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: mcp-agent, namespace: team-b}
spec: {oauthSubjects: [mcp-user], permissions: [{tools: ["*"]}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: mcp-zz-rival}
spec: {oauthSubjects: [mcp-user], permissions: [{tools: ["*"]}]}
"#,
    )
    .unwrap();
    let jwks_arg = jwks.to_string_lossy().to_string();
    let platform = Platform::start(
        root.path(),
        &manifests,
        &[
            "--http-listen",
            &http,
            "--oauth-issuer",
            ISSUER,
            "--oauth-jwks",
            &jwks_arg,
            "--oauth-audience",
            &resource,
        ],
    );
    let raw = Raw::new(&platform);
    let metadata: Value = raw
        .http
        .get(format!(
            "http://{}/.well-known/oauth-protected-resource",
            platform.http
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["authorization_servers"], json!([ISSUER]));
    assert_eq!(metadata["resource"], resource);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = |aud: &str, sub: &str, exp: u64| json!({"iss": ISSUER, "aud": aud, "sub": sub, "exp": exp, "iat": now, "client_id": "c"});
    // A token for this resource and a mapped subject: the agent, with its bound tools.
    let good = issuer.token(&claims(&resource, "mcp-user", now + 600));
    let response = raw
        .modern(&good, "tools/list", json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    let names: Vec<&str> = answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"semver__compare") && !names.contains(&"uuid"),
        "{names:?}"
    );
    let rival = platform
        .resource("agents", "mcp-zz-rival")
        .await
        .expect("the rival agent is listed");
    assert_eq!(
        (rival.ready.as_str(), rival.reason.as_str()),
        ("False", "DuplicateOAuthSubject"),
        "{}",
        rival.message
    );
    // The wrong audience, an expired token, an unmapped subject, another issuer's key: all
    // unauthenticated, with the challenge.
    let other = jwt::Issuer::new();
    for (what, token) in [
        (
            "wrong audience",
            issuer.token(&claims(
                "https://other.example.com/mcp",
                "mcp-user",
                now + 600,
            )),
        ),
        (
            "expired",
            issuer.token(&claims(&resource, "mcp-user", now - 600)),
        ),
        (
            "unmapped subject",
            issuer.token(&claims(&resource, "stranger", now + 600)),
        ),
        (
            "another key",
            other.token(&claims(&resource, "mcp-user", now + 600)),
        ),
    ] {
        let response = raw
            .modern(&token, "tools/list", json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
        let challenge = response.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            challenge.starts_with("Bearer resource_metadata=")
                && challenge.contains("invalid_token"),
            "{what}: {challenge}"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["kind"], "unauthenticated", "{what}: {body}");
    }
    // The agent's own toolgrid token still works.
    let response = raw
        .modern(AGENT_TOKEN, "tools/list", json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
