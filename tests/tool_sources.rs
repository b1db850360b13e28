//! ToolSources end to end through `toolgrid up`: real upstreams are imported, bound to an
//! agent and called by real worker processes under the same rules as wasm tools.
//!
//! - MCP: a server written with the official Python SDK (PyPI `mcp` 2.x, the 2026-07-28
//!   era, `tests/fixtures/mcp/upstream_server.py`) and the reference
//!   `@modelcontextprotocol/server-everything` (TypeScript SDK 1.x, sessions of the legacy
//!   era): list, bind, call, a structured result, an upstream error, effects from
//!   annotations and overrides, a worker SIGKILLed in the middle of a call with the upstream
//!   counting requests by idempotency key, a refused private address, `toolgrid refresh`.
//! - OpenAPI: a FastAPI app (its `/openapi.json` is 3.1) and the 3.0 petstore document of
//!   `@readme/oas-examples` served by Stoplight's Prism mock (which validates requests):
//!   each method's effect, path/query/header/body parameters, a non-2xx as a tool error,
//!   a bearer token from a Secret.
//! - Identity: an upstream receives a signed identity token (never the agent's own), which
//!   PyJWT verifies against the published JWKS; a token for one upstream is refused by
//!   another.
//!
//! Without python3 (`mcp`, `fastapi`, `pyjwt`) or Node 22 the tests skip with the reason,
//! except under `CI=true`, where they fail.

use crate::common;

use common::witness::Witness;
use common::{ChildGuard, free_port, wait_for_port};
use common::{Platform, WorkerProcess, error_kind, result_of};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use toolgrid_proto as proto;
use toolgrid_testkit::mcp_upstream::McpUpstream;

const AGENT_TOKEN: &str = "tg-agent-sources-0123456789abcdef";
const PETSTORE_TOKEN: &str = "petstore-oauth-token-5f1e";
const ECHO_TOKEN: &str = "echo-bearer-token-91c3d7";

/// The agent, its token, and a pool the test's worker processes serve.
fn agent_and_pool() -> String {
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: default}}
spec: {{replicas: 2, slotsPerWorker: 4}}
---
apiVersion: v1
kind: Secret
metadata: {{name: bot-token}}
stringData: {{token: {AGENT_TOKEN}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: bot}}
spec:
  tokenSecretRef: {{name: bot-token, key: token}}
  permissions: [{{tools: ["*"], commands: ["*"]}}]
"#
    )
}

fn binding(tool: &str) -> String {
    format!(
        "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: bot-{}}}\nspec: {{tool: {tool}, agents: [bot]}}\n",
        tool.replace('_', "-")
    )
}

async fn agent_try(
    platform: &Platform,
    tool: &str,
    args: Value,
    key: &str,
) -> Result<proto::Call, tonic::Status> {
    let mut client = platform.client_with(Some(AGENT_TOKEN), None).await;
    client
        .invoke(proto::InvokeRequest {
            tool: tool.into(),
            args_json: args.to_string(),
            idempotency_key: key.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

async fn agent_call(platform: &Platform, tool: &str, args: Value, key: &str) -> proto::Call {
    agent_try(platform, tool, args, key)
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e:?}"))
}

/// The error kind a refused request is answered with.
fn refused_kind(status: &tonic::Status) -> String {
    status
        .metadata()
        .get("toolgrid-error-kind")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The source's row once its Ready condition has the status `ready`.
async fn source_row(platform: &Platform, name: &str, ready: &str) -> proto::ResourceRow {
    platform
        .eventually(
            &format!("ToolSource {name} Ready={ready}"),
            Duration::from_secs(60),
            || async {
                platform
                    .resource("sources", name)
                    .await
                    .is_some_and(|r| r.ready == ready)
            },
        )
        .await;
    platform.resource("sources", name).await.unwrap()
}

fn snapshot_of(row: &proto::ResourceRow) -> Value {
    let status: Value = serde_json::from_str(&row.status_json).unwrap();
    status["snapshot"].clone()
}

fn effect_in(snapshot: &Value, tool: &str) -> String {
    snapshot["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == tool)
        .unwrap_or_else(|| panic!("{tool} in {snapshot}"))["effect"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The fixture server's counts of `slow_record`/`record` calls by idempotency key.
fn counts(upstream: &McpUpstream) -> serde_json::Map<String, Value> {
    std::fs::read_to_string(&upstream.counts)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// Starts `tool` with `args` as the agent in the background, waits until the fixture server
/// has counted a new key (the request is at the upstream), and SIGKILLs the worker running
/// it. Answers the call as it ended, and the key the upstream counted.
async fn kill_mid_call(
    platform: &Platform,
    workers: &mut [WorkerProcess],
    upstream: &McpUpstream,
    tool: &str,
    args: Value,
    key: &str,
) -> (proto::Call, String) {
    let before = counts(upstream);
    let invoke = {
        let mut client = platform.client_with(Some(AGENT_TOKEN), None).await;
        let request = proto::InvokeRequest {
            tool: tool.into(),
            args_json: args.to_string(),
            idempotency_key: key.into(),
            ..Default::default()
        };
        tokio::spawn(async move { client.invoke(request).await.map(|r| r.into_inner()) })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let upstream_key = loop {
        let now = counts(upstream);
        if let Some(k) = now.keys().find(|k| !before.contains_key(*k)) {
            break k.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut agent = platform.client_with(Some(AGENT_TOKEN), None).await;
    let running = agent
        .get_call(proto::GetCallRequest {
            namespace: "default".into(),
            idempotency_key: key.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let worker = workers
        .iter_mut()
        .find(|w| w.id == running.worker)
        .unwrap_or_else(|| panic!("the call runs on {:?}", running.worker));
    worker.kill();
    let call = invoke.await.unwrap().expect("the call ends");
    (call, upstream_key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_servers_become_bindable_tools_that_fail_over_exactly_once() {
    let Some(python) = McpUpstream::start() else {
        return;
    };
    let Some(mut everything) = common::js_command("mcp-server-everything") else {
        return;
    };
    let everything_port = free_port();
    let _everything = ChildGuard(
        everything
            .arg("streamableHttp")
            .env("PORT", everything_port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("server-everything"),
    );
    wait_for_port(everything_port);

    let root = tempfile::tempdir().unwrap();
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let url = python.url();
    let mut text = agent_and_pool();
    text += &format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: py}}
spec:
  mcp: {{url: "{url}", allowHttp: true, allowPrivate: true}}
  effects: {{slow_record: idempotent}}
  callTimeout: 60s
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: pyw}}
spec:
  mcp: {{url: "{url}", allowHttp: true, allowPrivate: true, allowTools: [slow_record]}}
  callTimeout: 60s
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: private}}
spec:
  mcp: {{url: "{url}", allowHttp: true}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: everything}}
spec:
  mcp:
    url: "http://127.0.0.1:{everything_port}/mcp"
    allowHttp: true
    allowPrivate: true
    allowTools: [echo, get-sum]
"#
    );
    for tool in [
        "py__add",
        "py__fail",
        "py__slow_record",
        "py__grow",
        "py__grown",
        "pyw__slow_record",
        "everything__echo",
    ] {
        text += &binding(tool);
    }
    std::fs::write(manifests.join("sources.yaml"), text).unwrap();
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    let mut workers: Vec<WorkerProcess> = (0..2)
        .map(|i| WorkerProcess::start(&platform, &format!("s{i}"), 4, root.path()))
        .collect();

    // Listed and snapshotted: effects from annotations, an override, the filter.
    let py = source_row(&platform, "py", "True").await;
    let snapshot = snapshot_of(&py);
    assert_eq!(effect_in(&snapshot, "add"), "read");
    assert_eq!(effect_in(&snapshot, "set_value"), "idempotent");
    assert_eq!(effect_in(&snapshot, "record"), "write");
    assert_eq!(
        effect_in(&snapshot, "slow_record"),
        "idempotent",
        "the override"
    );
    assert_eq!(snapshot["era"], "modern");
    let pyw = snapshot_of(&source_row(&platform, "pyw", "True").await);
    assert_eq!(effect_in(&pyw, "slow_record"), "write");
    assert!(
        pyw["leftOut"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["reason"] == "NotAllowed"),
        "{pyw}"
    );
    let everything_row = source_row(&platform, "everything", "True").await;
    assert_eq!(snapshot_of(&everything_row)["era"], "legacy");
    // A private address without allowPrivate: refused, named, and nothing else affected.
    let private = source_row(&platform, "private", "False").await;
    assert_eq!(private.reason, "UpstreamRefused", "{}", private.message);

    // `toolgrid get sources` shows them.
    let listed = platform.cli(&["get", "sources"], None);
    let out = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && out.contains("everything"),
        "{out}"
    );

    // The agent sees exactly what it is bound to.
    let mut client = platform.client_with(Some(AGENT_TOKEN), None).await;
    let tools = client
        .list_tools(proto::ListToolsRequest {
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = tools.tools.iter().map(|t| t.name.as_str()).collect();
    for bound in ["py__add", "py__fail", "everything__echo"] {
        assert!(names.contains(&bound), "{bound} in {names:?}");
    }
    assert!(!names.contains(&"py__set_value"), "not bound: {names:?}");

    // A structured result, through a worker.
    let sum = agent_call(&platform, "py__add", json!({"a": 2, "b": 3.5}), "add-1").await;
    assert_eq!(result_of(&sum)["sum"].as_f64(), Some(5.5), "{sum:?}");
    // An upstream error is the tool's error, with the upstream's message.
    let failed = agent_call(&platform, "py__fail", json!({"reason": "nope"}), "fail-1").await;
    assert_eq!(error_kind(&failed), "tool-error");
    let error = failed.error.clone().unwrap();
    assert_eq!(error.name, "upstream-error");
    assert!(
        error.message.contains("upstream refused: nope"),
        "{error:?}"
    );
    // Arguments are checked against the upstream's schema before anything leaves.
    let invalid = agent_try(&platform, "py__add", json!({"a": "two"}), "add-bad")
        .await
        .unwrap_err();
    assert_eq!(refused_kind(&invalid), "invalid-argument", "{invalid:?}");
    // The legacy-era server, in a session.
    let echoed = agent_call(
        &platform,
        "everything__echo",
        json!({"message": "hello from toolgrid"}),
        "echo-1",
    )
    .await;
    assert!(
        result_of(&echoed)
            .to_string()
            .contains("hello from toolgrid"),
        "{echoed:?}"
    );
    // Its oplog holds the session's three exchanges, committed before each left.
    let oplog = platform.oplog(&echoed.id).await;
    let starts = oplog.iter().filter(|e| e.kind == "http-request").count();
    assert_eq!(starts, 3, "initialize, initialized, tools/call: {oplog:?}");

    // An idempotent call whose worker dies mid-call is re-sent by another worker with the
    // same key, and finishes once.
    let (call, key) = kill_mid_call(
        &platform,
        &mut workers,
        &python,
        "py__slow_record",
        json!({"event": "idem", "seconds": 3}),
        "slow-idem",
    )
    .await;
    let value = result_of(&call);
    assert!(value.to_string().contains(&key), "{value}");
    let seen = counts(&python);
    assert_eq!(
        seen[&key], 2,
        "sent, and re-sent with the same key: {seen:?}"
    );
    assert!(key.starts_with(&format!("toolgrid-{}-", call.id)), "{key}");

    // A write whose worker dies mid-call is never sent again: its outcome is unknown.
    let survivor_ids: Vec<String> = workers.iter().map(|w| w.id.clone()).collect();
    let fresh = WorkerProcess::start(&platform, "s2", 4, root.path());
    workers.push(fresh);
    let (call, key) = kill_mid_call(
        &platform,
        &mut workers,
        &python,
        "pyw__slow_record",
        json!({"event": "write", "seconds": 3}),
        "slow-write",
    )
    .await;
    assert_eq!(error_kind(&call), "outcome-unknown", "{:?}", call.error);
    // Give a (wrong) re-send time to arrive before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(counts(&python)[&key], 1, "{survivor_ids:?}");

    // The snapshot changes only when asked: the upstream grows a tool, the source keeps
    // serving what it read until `toolgrid refresh`.
    let grown = agent_call(&platform, "py__grow", json!({}), "grow-1").await;
    result_of(&grown);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let unchanged = snapshot_of(&platform.resource("sources", "py").await.unwrap());
    assert!(!unchanged.to_string().contains("\"grown\""), "{unchanged}");
    let refreshed = platform.cli(&["refresh", "py"], None);
    let out = String::from_utf8_lossy(&refreshed.stdout);
    assert!(
        refreshed.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&refreshed.stderr)
    );
    assert!(out.contains("+ grown"), "{out}");
    let upper = agent_call(&platform, "py__grown", json!({"text": "abc"}), "grown-1").await;
    assert_eq!(result_of(&upper)["result"], "ABC", "{upper:?}");
    // A refresh of a source that does not exist is refused by name.
    let missing = platform.cli(&["refresh", "nope"], None);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("not-found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    // An agent may not refresh.
    let mut agent = platform.client_with(Some(AGENT_TOKEN), None).await;
    let refused = agent
        .refresh_source(proto::RefreshSourceRequest {
            namespace: "default".into(),
            name: "py".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
}

/// `oplog` as text, followed by every recorded response body (`bodyBase64`) decoded.
fn with_bodies_decoded(oplog: &Value) -> String {
    use base64::Engine as _;
    fn bodies(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("bodyBase64" | "base64", Value::String(body)) => {
                            let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(body)
                            else {
                                continue; // scrubbed: no longer base64
                            };
                            let text = String::from_utf8_lossy(&bytes).to_string();
                            out.push('\n');
                            out.push_str(&text);
                            // A reflected body may hold base64 of its own.
                            if let Ok(inner) = serde_json::from_str::<Value>(&text) {
                                bodies(&inner, out);
                            }
                        }
                        _ => bodies(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| bodies(v, out)),
            _ => {}
        }
    }
    let mut text = oplog.to_string();
    bodies(oplog, &mut text);
    text
}

/// The FastAPI fixture serving on a free port, or `None` (a failure under CI) without it.
fn fastapi() -> Option<(ChildGuard, u16)> {
    let have = std::process::Command::new("python3")
        .args(["-c", "import fastapi, uvicorn"])
        .status()
        .is_ok_and(|s| s.success());
    if !toolgrid_testkit::require("python3 with fastapi and uvicorn", have) {
        return None;
    }
    let port = free_port();
    let child = std::process::Command::new("python3")
        .arg(common::fixtures::repo().join("tests/fixtures/openapi/fastapi_app.py"))
        .args(["--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 runs");
    let upstream = ChildGuard(child);
    wait_for_port(port);
    Some((upstream, port))
}

/// Prism mocking the petstore document, or `None` (a failure under CI) without it.
fn prism(document: &Path) -> Option<(ChildGuard, u16)> {
    let mut command = common::js_command("prism")?;
    let port = free_port();
    let child = command
        .args(["mock", "-h", "127.0.0.1", "-p", &port.to_string()])
        .arg(document)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prism runs");
    let upstream = ChildGuard(child);
    wait_for_port(port);
    Some((upstream, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn openapi_operations_become_tools_with_their_methods_effects_and_parameters() {
    let Some((_fastapi, shop_port)) = fastapi() else {
        return;
    };
    let petstore =
        common::js_dir().join("node_modules/@readme/oas-examples/3.0/json/petstore.json");
    if !toolgrid_testkit::require("@readme/oas-examples in tests/js", petstore.is_file()) {
        return;
    }
    let Some((_prism, pet_port)) = prism(&petstore) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::copy(&petstore, manifests.join("petstore.json")).unwrap();
    let mut text = agent_and_pool();
    text += &format!(
        r#"---
apiVersion: v1
kind: Secret
metadata: {{name: petstore-auth}}
stringData: {{token: {PETSTORE_TOKEN}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: shop}}
spec:
  openapi:
    spec: {{url: "http://127.0.0.1:{shop_port}/openapi.json"}}
    allowHttp: true
    allowPrivate: true
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: pets}}
spec:
  openapi:
    spec: {{file: petstore.json}}
    baseUrl: "http://127.0.0.1:{pet_port}"
    auth: {{type: bearer, secretRef: {{name: petstore-auth, key: token}}}}
    headers: [{{name: api_key, value: special-key}}]
    allowHttp: true
    allowPrivate: true
"#
    );
    for tool in [
        "shop__create_order",
        "shop__get_order",
        "shop__list_orders",
        "shop__replace_order",
        "shop__patch_order",
        "shop__delete_order",
        "pets__getPetById",
        "pets__findPetsByStatus",
        "pets__addPet",
        "pets__deletePet",
    ] {
        text += &binding(tool);
    }
    std::fs::write(manifests.join("sources.yaml"), text).unwrap();
    let platform = Platform::start(root.path(), &manifests, &[]);

    let shop = snapshot_of(&source_row(&platform, "shop", "True").await);
    for (tool, effect) in [
        ("get_order", "read"),
        ("list_orders", "read"),
        ("create_order", "write"),
        ("replace_order", "idempotent"),
        ("patch_order", "write"),
        ("delete_order", "idempotent"),
    ] {
        assert_eq!(effect_in(&shop, tool), effect, "{tool}");
    }
    let pets = snapshot_of(&source_row(&platform, "pets", "True").await);
    assert_eq!(effect_in(&pets, "getPetById"), "read");
    assert_eq!(effect_in(&pets, "deletePet"), "idempotent");
    assert_eq!(effect_in(&pets, "addPet"), "write");

    // A body (POST), then path, query and header parameters (GET).
    let created = agent_call(
        &platform,
        "shop__create_order",
        json!({"body": {"item": "tea", "quantity": 2, "ship_to": {"street": "1 Main", "city": "Oslo"}}}),
        "create-1",
    )
    .await;
    let order = result_of(&created);
    assert_eq!(order["item"], "tea", "{order}");
    let id = order["id"].as_i64().unwrap();
    let got = agent_call(
        &platform,
        "shop__get_order",
        json!({"order_id": id, "verbose": true, "x-trace-id": "trace-7"}),
        "get-1",
    )
    .await;
    assert_eq!(result_of(&got)["quantity"], 2);
    let seen: Value = reqwest::get(format!("http://127.0.0.1:{shop_port}/_seen"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        seen,
        json!({"order_id": id, "verbose": true, "x_trace_id": "trace-7"})
    );
    let listed = agent_call(
        &platform,
        "shop__list_orders",
        json!({"limit": 5}),
        "list-1",
    )
    .await;
    assert_eq!(result_of(&listed).as_array().map(Vec::len), Some(1));
    // PUT, PATCH, DELETE (204: no body).
    let replaced = agent_call(
        &platform,
        "shop__replace_order",
        json!({"order_id": id, "body": {"item": "coffee", "quantity": 1, "ship_to": {"street": "2 Side", "city": "Bergen"}}}),
        "put-1",
    )
    .await;
    assert_eq!(result_of(&replaced)["item"], "coffee");
    let patched = agent_call(
        &platform,
        "shop__patch_order",
        json!({"order_id": id, "body": {"quantity": 9}}),
        "patch-1",
    )
    .await;
    assert_eq!(result_of(&patched)["quantity"], 9);
    let deleted = agent_call(
        &platform,
        "shop__delete_order",
        json!({"order_id": id}),
        "del-1",
    )
    .await;
    assert_eq!(result_of(&deleted), Value::Null);
    // A non-2xx answer is the tool's error with the upstream's text.
    let gone = agent_call(
        &platform,
        "shop__get_order",
        json!({"order_id": id}),
        "get-2",
    )
    .await;
    assert_eq!(error_kind(&gone), "tool-error");
    let error = gone.error.clone().unwrap();
    assert_eq!(error.name, "upstream-error");
    assert!(
        error.message.contains("404") && error.message.contains(&format!("no order {id}")),
        "{error:?}"
    );
    // A missing required parameter never leaves.
    let incomplete = agent_try(&platform, "shop__get_order", json!({}), "get-3")
        .await
        .unwrap_err();
    assert_eq!(
        refused_kind(&incomplete),
        "invalid-argument",
        "{incomplete:?}"
    );

    // The petstore through Prism, which refuses requests its document does not allow: the
    // header of the source, the bearer token from the Secret, a path parameter.
    let pet = agent_call(&platform, "pets__getPetById", json!({"petId": 12}), "pet-1").await;
    assert!(result_of(&pet)["name"].is_string(), "{pet:?}");
    let found = agent_call(
        &platform,
        "pets__findPetsByStatus",
        json!({"status": ["available"]}),
        "pet-2",
    )
    .await;
    assert!(result_of(&found).is_array(), "{found:?}");
    // The document declares only 405 for addPet: Prism answers it, a tool error.
    let added = agent_call(
        &platform,
        "pets__addPet",
        json!({"body": {"name": "rex", "photoUrls": []}}),
        "pet-3",
    )
    .await;
    assert_eq!(error_kind(&added), "tool-error");
    assert!(
        added.error.clone().unwrap().message.contains("405"),
        "{added:?}"
    );
    // The bearer token never shows in what the agent reads of the call.
    let oplog = platform.oplog(&pet.id).await;
    let mut agent = platform.client_with(Some(AGENT_TOKEN), None).await;
    let agent_oplog = agent
        .get_oplog(proto::GetOplogRequest {
            call_id: found.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for text in [format!("{oplog:?}"), format!("{agent_oplog:?}")] {
        assert!(!text.contains(PETSTORE_TOKEN), "the token leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_gets_a_signed_identity_it_can_verify_and_no_agent_token() {
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let document = json!({
        "openapi": "3.0.3",
        "info": {"title": "who", "version": "1"},
        "paths": {
            "/echo": {"get": {"operationId": "whoami", "responses": {"200": {"description": "ok"}}}},
            "/echo-all": {"get": {"operationId": "reflect", "responses": {"200": {"description": "ok"}}}}
        }
    });
    std::fs::write(manifests.join("who.json"), document.to_string()).unwrap();
    let base = witness.base();
    let mut text = agent_and_pool();
    text += &format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: who}}
spec:
  openapi:
    spec: {{file: who.json}}
    baseUrl: "{base}"
    auth: {{type: identity}}
    allowHttp: true
    allowPrivate: true
"#
    );
    text += &format!(
        r#"---
apiVersion: v1
kind: Secret
metadata: {{name: echo-auth}}
stringData: {{token: {ECHO_TOKEN}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolSource
metadata: {{name: echoing}}
spec:
  openapi:
    spec: {{file: who.json}}
    baseUrl: "{base}"
    auth: {{type: bearer, secretRef: {{name: echo-auth, key: token}}}}
    allowHttp: true
    allowPrivate: true
"#
    );
    text += &binding("who__whoami");
    text += &binding("echoing__reflect");
    std::fs::write(manifests.join("sources.yaml"), text).unwrap();
    let platform = Platform::start(root.path(), &manifests, &[]);
    source_row(&platform, "who", "True").await;
    source_row(&platform, "echoing", "True").await;

    // A source's own bearer token, reflected by its upstream (as sent, and base64-encoded),
    // reaches neither the agent's result nor the oplog the agent reads (the operator's raw
    // oplog holds the encoded form, as recorded for replay).
    let echoed = agent_call(&platform, "echoing__reflect", json!({}), "echo-1").await;
    assert!(!result_of(&echoed).to_string().contains(ECHO_TOKEN));
    let http = platform.http_client();
    let oplog = |token: String| {
        let url = format!("http://{}/v1/calls/{}/oplog", platform.http, echoed.id);
        let http = http.clone();
        async move {
            let answer = http.get(url).bearer_auth(token).send().await.unwrap();
            assert_eq!(answer.status(), 200);
            with_bodies_decoded(&answer.json().await.unwrap())
        }
    };
    let raw = oplog(platform.admin_token()).await;
    assert!(
        raw.contains(ECHO_TOKEN),
        "the operator's oplog is raw: {raw}"
    );
    let read = oplog(AGENT_TOKEN.to_string()).await;
    assert!(read.contains("http-response"), "{read}");
    assert!(
        !read.contains(ECHO_TOKEN),
        "the agent's oplog leaks the source's token: {read}"
    );
    let call = agent_call(&platform, "who__whoami", json!({}), "who-1").await;
    let answer = result_of(&call);
    let seen = witness.seen();
    let request = seen
        .iter()
        .find(|s| s.path == "/echo")
        .expect("the request");
    let authorization = request
        .authorization
        .clone()
        .expect("an Authorization header");
    let token = authorization
        .strip_prefix("Bearer ")
        .expect("a bearer token");
    assert!(!authorization.contains(AGENT_TOKEN));
    assert_eq!(token.split('.').count(), 3, "{token}");
    // What the upstream echoed back is redacted in the agent's result.
    assert!(!answer.to_string().contains(token), "{answer}");

    // PyJWT verifies it against the published JWKS; another upstream refuses it.
    let jwks = reqwest::get(format!("http://{}/.well-known/jwks.json", platform.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dir = root.path().join("verify");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("jwks.json"), jwks).unwrap();
    let audience = format!("{}/", base.trim_end_matches('/'));
    let cases = json!({
        "issuer": format!("http://{}", platform.http),
        "tamper": "ok",
        "cases": [
            {"name": "ok", "jwks": "jwks.json", "token": token, "audience": audience,
             "expect": "ok",
             "claims": {"sub": "default/bot", "tenant": "default", "tool": "who__whoami",
                        "call": call.id}},
            {"name": "another upstream", "jwks": "jwks.json", "token": token,
             "audience": "https://billing.example.com/", "expect": "InvalidAudienceError"}
        ]
    });
    std::fs::write(dir.join("cases.json"), cases.to_string()).unwrap();
    let script = common::fixtures::repo().join("tests/identity/verify_identity.py");
    let output =
        common::run_python_check(std::process::Command::new("python3").arg(script).arg(&dir));
    let Some(output) = output else { return };
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `examples/manifests/platform.yaml`: the example ToolSource imports toolgrid up's own open
/// endpoints from an OpenAPI file next to the manifest, so it is served with no network.
/// Its base URL names up's default HTTP port; the test moves it to the port it listens on.
#[tokio::test(flavor = "multi_thread")]
async fn the_example_tool_source_is_served_offline_by_toolgrid_up() {
    let root = tempfile::tempdir().unwrap();
    let manifests = common::fixtures::examples(root.path());
    let port = free_port();
    let example = manifests.join("platform.yaml");
    let text = std::fs::read_to_string(&example).unwrap();
    assert!(text.contains("baseUrl: http://127.0.0.1:7071"), "{text}");
    std::fs::write(
        &example,
        text.replace("127.0.0.1:7071", &format!("127.0.0.1:{port}")),
    )
    .unwrap();
    let http = format!("127.0.0.1:{port}");
    let platform = Platform::start(root.path(), &manifests, &["--http-listen", &http]);

    let row = source_row(&platform, "platform", "True").await;
    let snapshot = snapshot_of(&row);
    assert_eq!(effect_in(&snapshot, "signing-keys"), "read");
    assert_eq!(effect_in(&snapshot, "mcp-metadata"), "read");

    // The example agent is bound to one of the two by the example's ToolBinding, and
    // calls it with the CLI as the example's comment shows.
    let published: Value = platform
        .http_client()
        .get(format!("http://{http}/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!published["keys"].as_array().unwrap().is_empty());
    let out = platform.cli(
        &[
            "call",
            "--token",
            "reporter-example-token",
            "platform__signing-keys",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed, published);

    // The imported tool is under the same rules as any: the same call again within the
    // Tool's repeat window is refused, and the unbound one is not the agent's.
    let mut reporter = platform
        .client_with(Some("reporter-example-token"), None)
        .await;
    let invoke = |tool: &str| proto::InvokeRequest {
        tool: tool.into(),
        args_json: "{}".into(),
        ..Default::default()
    };
    let repeated = reporter
        .invoke(invoke("platform__signing-keys"))
        .await
        .unwrap_err();
    assert_eq!(refused_kind(&repeated), "repeated-call", "{repeated:?}");
    let refused = reporter
        .invoke(invoke("platform__mcp-metadata"))
        .await
        .unwrap_err();
    assert_eq!(refused_kind(&refused), "permission-denied", "{refused:?}");
}
