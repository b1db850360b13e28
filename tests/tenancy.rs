//! Namespaces as walls: a real `toolgrid up` with the examples in `default` and, in
//! `team-b`, an agent with the same name as the examples' `reporter` bound to team-b's own
//! `semver` (the example's manifests again, in team-b). Each lookup that takes a namespace
//! or a key from the request is tried across the wall.

mod common;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_is_a_wall() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    std::fs::write(manifests.join("team-b.yaml"), TEAM_B_MANIFESTS).unwrap();
    for example in ["semver.yaml", "pool.yaml"] {
        let text = std::fs::read_to_string(manifests.join(example)).unwrap();
        let text = text.replace("metadata:\n", "metadata:\n  namespace: team-b\n");
        std::fs::write(manifests.join(format!("team-b-{example}")), text).unwrap();
    }
    let platform = Platform::start(root.path(), &manifests, &[]);
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
