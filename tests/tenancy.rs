//! Namespaces as walls: a real `toolgrid up` with the examples in `default` and, in
//! `team-b`, an agent with the same name as the examples' `reporter` bound to team-b's own
//! `semver` (the example's manifests again, in team-b). Each lookup that takes a namespace
//! or a key from the request is tried across the wall.

use crate::common;

use common::Platform;
use common::fixtures;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const REPORTER: &str = "reporter-example-token";
const TEAM_B: &str = "team-b-reporter-token";

const TEAM_B_MANIFESTS: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: reporter-token, namespace: team-b}
stringData: {token: team-b-reporter-token}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: reporter, namespace: team-b}
spec:
  tokenSecretRef: {name: reporter-token, key: token}
  permissions: [{tools: ["*"]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: reporter-semver, namespace: team-b}
spec: {agents: [reporter], tool: semver}
"#;

fn semver_compare(namespace: &str, key: &str) -> proto::InvokeRequest {
    proto::InvokeRequest {
        namespace: namespace.into(),
        tool: "semver".into(),
        argv: vec!["compare".into(), "1.2.0".into(), "1.10.0".into()],
        idempotency_key: key.into(),
        ..Default::default()
    }
}

fn refused<T: std::fmt::Debug>(result: Result<T, ApiError>, kind: ErrorKind) -> ApiError {
    let error = result.expect_err("refused across the namespace wall");
    assert_eq!(error.kind, kind, "{}", error.message);
    error
}

/// The examples in `default`, and team-b with its own `reporter` and `semver`.
fn two_tenants() -> (tempfile::TempDir, Platform) {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    std::fs::write(manifests.join("team-b.yaml"), TEAM_B_MANIFESTS).unwrap();
    for example in ["semver.yaml", "pool.yaml"] {
        let text = std::fs::read_to_string(manifests.join(example)).unwrap();
        let text = text.replace("metadata:\n", "metadata:\n  namespace: team-b\n");
        std::fs::write(manifests.join(format!("team-b-{example}")), text).unwrap();
    }
    let platform = Platform::start(root.path(), &manifests, &[]);
    (root, platform)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_is_a_wall() {
    let (_root, platform) = two_tenants();
    let mut a = platform.client_with(Some(REPORTER), None).await;
    let mut b = platform.client_with(Some(TEAM_B), None).await;

    // default/reporter makes a call with a key team-b's reporter can guess.
    let call = a
        .invoke(semver_compare("", "guessable-key"))
        .await
        .expect("default/reporter calls semver")
        .into_inner();
    assert_eq!(call.namespace, "default");

    // By key, naming the other namespace: the same agent name is another agent.
    let by_key = b
        .get_call(proto::GetCallRequest {
            namespace: "default".into(),
            idempotency_key: "guessable-key".into(),
            ..Default::default()
        })
        .await
        .map_err(|s| error_of(&s));
    let error = refused(by_key, ErrorKind::NotFound);
    assert!(
        !error.message.contains(&call.id),
        "the refusal names the call: {}",
        error.message
    );
    // The owner still finds it by key.
    let own = a
        .get_call(proto::GetCallRequest {
            idempotency_key: "guessable-key".into(),
            ..Default::default()
        })
        .await
        .expect("the owner finds its call by key")
        .into_inner();
    assert_eq!(own.id, call.id);

    // By id, its oplog, a listing of the other namespace.
    let by_id = b
        .get_call(proto::GetCallRequest {
            id: call.id.clone(),
            ..Default::default()
        })
        .await
        .map_err(|s| error_of(&s));
    refused(by_id, ErrorKind::NotFound);
    let oplog = b
        .get_oplog(proto::GetOplogRequest {
            call_id: call.id.clone(),
            ..Default::default()
        })
        .await
        .map_err(|s| error_of(&s));
    refused(oplog, ErrorKind::NotFound);
    let listed = b
        .list_calls(proto::ListCallsRequest {
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .expect("a listing of another namespace is empty, not an error")
        .into_inner();
    assert!(listed.calls.is_empty(), "{:?}", listed.calls);

    // team-b's reporter uses the same key in its own namespace: its own call, not default's.
    let b_call = b
        .invoke(semver_compare("", "guessable-key"))
        .await
        .expect("team-b/reporter calls its own semver")
        .into_inner();
    assert_eq!(b_call.namespace, "team-b");
    assert_ne!(b_call.id, call.id);
    let b_own = b
        .get_call(proto::GetCallRequest {
            idempotency_key: "guessable-key".into(),
            ..Default::default()
        })
        .await
        .expect("team-b finds its call by key")
        .into_inner();
    assert_eq!(b_own.id, b_call.id);

    // team-b's binding names `semver`: team-b's, never default's of the same name.
    let tools = b
        .list_tools(proto::ListToolsRequest {
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .expect("list tools")
        .into_inner();
    assert!(
        tools.tools.is_empty(),
        "team-b's agent sees default's tools: {:?}",
        tools.tools.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    let crossing = b
        .invoke(semver_compare("default", "guessable-key"))
        .await
        .map_err(|s| error_of(&s));
    refused(crossing, ErrorKind::PermissionDenied);
    let own_tools = b
        .list_tools(proto::ListToolsRequest::default())
        .await
        .expect("list own tools")
        .into_inner();
    let names: Vec<_> = own_tools
        .tools
        .iter()
        .map(|t| format!("{}/{}", t.namespace, t.name))
        .collect();
    assert_eq!(names, ["team-b/semver"]);

    // The HTTP door: the same walls, as HTTP statuses with the error's kind.
    let http = reqwest::Client::new();
    let get = |path: String| {
        http.get(format!("http://{}{path}", platform.http))
            .header("authorization", format!("Bearer {TEAM_B}"))
    };
    for path in [
        format!("/v1/calls/{}", call.id),
        format!("/v1/calls/{}/oplog", call.id),
        format!("/v1/calls/{}/result", call.id),
    ] {
        let response = get(path.clone()).send().await.expect("HTTP");
        assert_eq!(response.status().as_u16(), 404, "{path}");
        let body: serde_json::Value = response.json().await.expect("an error body");
        assert_eq!(body["error"]["kind"], "not-found", "{path}: {body}");
    }
    let listed: serde_json::Value = get("/v1/namespaces/default/tools".into())
        .send()
        .await
        .expect("HTTP")
        .json()
        .await
        .expect("a listing");
    assert_eq!(listed["tools"], serde_json::json!([]), "{listed}");
    let response = http
        .post(format!(
            "http://{}/v1/namespaces/default/tools/semver/compare:call",
            platform.http
        ))
        .header("authorization", format!("Bearer {TEAM_B}"))
        .json(&serde_json::json!({"args": {"a": "1.2.0", "b": "1.10.0"}, "idempotencyKey": "guessable-key"}))
        .send()
        .await
        .expect("HTTP");
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.expect("an error body");
    assert_eq!(
        (status, &body["error"]["kind"]),
        (403, &serde_json::json!("permission-denied")),
        "{body}"
    );
}

/// A JSON-RPC answer from `/mcp`: the JSON body, or the last message of an event stream.
async fn answer(request: reqwest::RequestBuilder) -> serde_json::Value {
    let text = request
        .send()
        .await
        .expect("MCP")
        .text()
        .await
        .expect("a body");
    let json = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .next_back()
        .unwrap_or(&text);
    serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The error kind of an HTTP refusal, with its status.
async fn http_refusal(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.expect("an error body");
    (
        status,
        body["error"]["kind"].as_str().unwrap_or_default().into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_refuses_the_other_tenant() {
    use serde_json::{Value, json};
    let (_root, platform) = two_tenants();
    let mut a = platform.client_with(Some(REPORTER), None).await;
    let mut b = platform.client_with(Some(TEAM_B), None).await;
    let call = a
        .invoke(semver_compare("", "default-key"))
        .await
        .expect("default/reporter calls semver")
        .into_inner();
    let b_call = b
        .invoke(semver_compare("", "team-b-key"))
        .await
        .expect("team-b/reporter calls its semver")
        .into_inner();
    let secret_of_a = &call.id;

    // gRPC: deciding, cancelling, streaming, why, audit, resources and the workspace.
    for (what, result) in [
        (
            "approve",
            b.approve(proto::DecisionRequest {
                call_id: call.id.clone(),
                reason: "x".into(),
            })
            .await
            .map(|_| ()),
        ),
        (
            "deny",
            b.deny(proto::DecisionRequest {
                call_id: call.id.clone(),
                reason: "x".into(),
            })
            .await
            .map(|_| ()),
        ),
        (
            "cancel",
            b.cancel(proto::CancelRequest {
                call_id: call.id.clone(),
            })
            .await
            .map(|_| ()),
        ),
    ] {
        let error = refused(result.map_err(|s| error_of(&s)), ErrorKind::NotFound);
        assert!(
            !error.message.contains("reporter-example"),
            "{what}: {error:?}"
        );
    }
    let stream = b
        .invoke_stream(semver_compare("default", "stream-key"))
        .await;
    let refusal = match stream {
        Err(status) => error_of(&status),
        Ok(stream) => {
            use futures::StreamExt as _;
            let mut stream = stream.into_inner();
            match stream.next().await {
                Some(Err(status)) => error_of(&status),
                other => panic!("a stream across the wall: {other:?}"),
            }
        }
    };
    assert_eq!(
        refusal.kind,
        ErrorKind::PermissionDenied,
        "{}",
        refusal.message
    );
    let why = b
        .why(proto::WhyRequest {
            agent: "default/reporter".into(),
            ..Default::default()
        })
        .await
        .map_err(|s| error_of(&s));
    refused(why, ErrorKind::PermissionDenied);
    let own_why = b
        .why(proto::WhyRequest::default())
        .await
        .expect("an agent asks about itself")
        .into_inner();
    let explained = format!("{own_why:?}");
    assert!(
        !explained.contains("uuid") && !explained.contains("textstats"),
        "{explained}"
    );
    let audit = b
        .list_audit(proto::ListAuditRequest {
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .map_err(|s| error_of(&s));
    refused(audit, ErrorKind::PermissionDenied);
    for kind in ["agents", "bindings", "releases", "middleware", "pools"] {
        let listed = b
            .list_resources(proto::ListResourcesRequest {
                kind: kind.into(),
                namespace: "default".into(),
            })
            .await
            .map_err(|s| error_of(&s));
        refused(listed, ErrorKind::PermissionDenied);
    }
    let tools = b
        .list_resources(proto::ListResourcesRequest {
            kind: "tools".into(),
            namespace: "default".into(),
        })
        .await
        .expect("tools are listed")
        .into_inner();
    assert!(tools.rows.is_empty(), "{:?}", tools.rows);
    {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", platform.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let credentials =
            toolgrid::cli::client::Credentials::new(Some(TEAM_B), None).expect("credentials");
        let mut workspaces =
            proto::workspaces_client::WorkspacesClient::with_interceptor(channel, credentials);
        let version = workspaces
            .list_workspace_versions(proto::ListWorkspaceVersionsRequest {
                namespace: "default".into(),
                agent: "reporter".into(),
            })
            .await
            .map_err(|s| error_of(&s));
        refused(version, ErrorKind::PermissionDenied);
    }

    // HTTP: the same lookups, as statuses with the error's kind.
    let http = reqwest::Client::new();
    let base = format!("http://{}", platform.http);
    let as_b = |request: reqwest::RequestBuilder| request.bearer_auth(TEAM_B);
    for (path, status, kind) in [
        (format!("/v1/calls/{}/approve", call.id), 404, "not-found"),
        (format!("/v1/calls/{}/deny", call.id), 404, "not-found"),
        (format!("/v1/calls/{}/cancel", call.id), 404, "not-found"),
    ] {
        let response = as_b(
            http.post(format!("{base}{path}"))
                .json(&json!({"reason": "x"})),
        )
        .send()
        .await
        .unwrap();
        assert_eq!(
            http_refusal(response).await,
            (status, kind.into()),
            "{path}"
        );
    }
    for (path, status, kind) in [
        (
            "/v1/why?agent=default/reporter".to_string(),
            403,
            "permission-denied",
        ),
        (
            "/v1/audit?namespace=default".to_string(),
            403,
            "permission-denied",
        ),
    ] {
        let response = as_b(http.get(format!("{base}{path}")))
            .send()
            .await
            .unwrap();
        assert_eq!(
            http_refusal(response).await,
            (status, kind.into()),
            "{path}"
        );
    }
    let listed: Value = as_b(http.get(format!("{base}/v1/calls?namespace=default")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        !listed.to_string().contains(secret_of_a.as_str()),
        "{listed}"
    );
    let mine: Value = as_b(http.get(format!("{base}/v1/calls")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        mine.to_string().contains(&b_call.id) && !mine.to_string().contains(secret_of_a.as_str()),
        "{mine}"
    );

    // MCP: team-b's reporter lists and calls team-b's semver, never reads default's result.
    let mcp = format!("{base}/mcp");
    let modern = |method: &str, params: Value| {
        let mut params = params;
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "tenancy", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        if let Some(extra) = params.get("_meta").and_then(Value::as_object) {
            for (k, v) in extra {
                meta[k] = v.clone();
            }
        }
        params["_meta"] = meta;
        let mut request = http
            .post(&mcp)
            .bearer_auth(TEAM_B)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method);
        if let Some(name) = params.get("name").and_then(Value::as_str) {
            request = request.header("mcp-name", name.to_string());
        }
        request.json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
    };
    let listed = answer(modern("tools/list", json!({}))).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .expect("a tool list")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with("semver__")) && !names.is_empty(),
        "{names:?}"
    );
    let called = answer(modern(
        "tools/call",
        json!({"name": "semver__compare", "arguments": {"a": "1.0.0", "b": "2.0.0"},
               "_meta": {"toolgrid/idempotencyKey": "default-key"}}),
    ))
    .await;
    assert!(
        !called.to_string().contains(secret_of_a.as_str()),
        "default's key gave team-b default's call: {called}"
    );
    let read = answer(modern(
        "resources/read",
        json!({"uri": format!("toolgrid://calls/{}/result?page=0", call.id)}),
    ))
    .await;
    assert!(read["error"].is_object(), "{read}");
    assert!(!read.to_string().contains("\"order\""), "{read}");

    // The console: a team-b session sees neither default's call nor its agent.
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = bare
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={TEAM_B}"))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status().as_u16(), 303);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    for path in [
        format!("/ui/calls/{}", call.id),
        "/ui/agents/default/reporter".to_string(),
    ] {
        let page = bare
            .get(format!("{base}{path}"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        let status = page.status().as_u16();
        let text = page.text().await.unwrap();
        assert!(matches!(status, 403 | 404), "{path}: {status}");
        assert!(
            !text.contains("1.10.0"),
            "{path} shows default's call: {text}"
        );
    }
    let calls = bare
        .get(format!("{base}/ui/calls"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!calls.contains(secret_of_a.as_str()), "{calls}");

    // The CLI, with team-b's token: each lookup refused by name.
    for (args, kind) in [
        (vec!["oplog", call.id.as_str()], "not-found"),
        (vec!["why", "default/reporter"], "permission-denied"),
        (vec!["audit"], "permission-denied"),
        (
            vec!["workspace", "history", "reporter", "-n", "default"],
            "permission-denied",
        ),
    ] {
        let mut full = args.clone();
        full.extend(["--token", TEAM_B]);
        let out = platform.cli(&full, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(kind), "{args:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("1.10.0"),
            "{args:?}"
        );
    }
    let out = platform.cli(&["get", "calls", "--token", TEAM_B], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&b_call.id) && !stdout.contains(secret_of_a.as_str()),
        "{stdout}"
    );
}
