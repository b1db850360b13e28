//! Callers: a real `toolgrid up` with agents, Secrets, ConfigMaps and bindings in its
//! manifest directory (the examples' `reporter` plus the ones below), called over gRPC,
//! HTTP and the CLI with the admin token, agent tokens, wrong tokens and none.

use crate::common;

use common::fixtures;
use common::{Platform, result_of};
use serde_json::{Value, json};
use std::time::Duration;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const REPORTER: &str = "reporter-example-token";
const RANGER: &str = "ranger-token-value";
const OTHER: &str = "other-token-value";

/// Agents beside the examples' `reporter`: `ranger` (may call anything; bound to uuid in a
/// range with no release, and to textstats twice: once asking for a key it lacks) and
/// `other` (bound to semver).
const MORE: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: agent-tokens}
stringData: {ranger: ranger-token-value, other: other-token-value}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ranger-config}
data: {region: us-east-1}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: ranger}
spec:
  tokenSecretRef: {name: agent-tokens, key: ranger}
  permissions: [{tools: ["*"]}]
  configMapRef: {name: ranger-config}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: other}
spec:
  tokenSecretRef: {name: agent-tokens, key: other}
  permissions: [{tools: ["*"], commands: ["*"]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: ranger-uuid}
spec: {agents: [ranger], tool: uuid, release: {version: "^2"}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: ranger-textstats}
spec: {agents: [ranger], tool: textstats, configKeysReadable: [region]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: ranger-textstats-zone}
spec: {agents: [ranger], tool: textstats, configKeysReadable: [region, zone]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: other-semver}
spec: {agents: [other], tool: semver}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: ghost-semver}
spec: {agents: [ghost], tool: semver}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: dangling}
spec:
  tokenSecretRef: {name: no-such-secret, key: token}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: ranger-nope}
spec: {agents: [ranger], tool: nope}
---
apiVersion: v1
kind: Secret
metadata: {name: broken}
data: {key: "%%% not base64"}
"#;

fn semver_compare() -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: "semver".into(),
        argv: vec!["compare".into(), "1.2.0".into(), "1.10.0".into()],
        ..Default::default()
    }
}

/// A comparison of other versions: an agent's identical call within the repeat window is
/// refused.
fn semver_compare_of(a: &str, b: &str) -> proto::InvokeRequest {
    proto::InvokeRequest {
        argv: vec!["compare".into(), a.into(), b.into()],
        ..semver_compare()
    }
}

async fn invoke(
    platform: &Platform,
    token: Option<&str>,
    act_as: Option<&str>,
    request: proto::InvokeRequest,
) -> Result<proto::Call, ApiError> {
    let mut client = platform.client_with(token, act_as).await;
    client
        .invoke(request)
        .await
        .map(|r| r.into_inner())
        .map_err(|s| error_of(&s))
}

fn refused<T: std::fmt::Debug>(result: Result<T, ApiError>, kind: ErrorKind, says: &str) {
    let error = result.expect_err("refused");
    assert_eq!(error.kind, kind, "{}", error.message);
    assert!(
        error.message.contains(says),
        "{:?} should say {says:?}",
        error.message
    );
}

/// The call as stored, with the access admission gave it.
async fn stored(platform: &Platform, id: &str) -> toolgrid_store::CallRecord {
    let url = format!("sqlite://{}", platform.data.join("toolgrid.db").display());
    let store = toolgrid_store::open(&url).await.expect("open the store");
    store.get_call(id).await.unwrap().expect("stored call")
}

async fn http_status(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.expect("HTTP");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_authenticated_and_authorized() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    std::fs::write(manifests.join("more-agents.yaml"), MORE).unwrap();
    let platform = Platform::start(root.path(), &manifests, &[]);

    // The admin token was made on first start, for the owner only.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(platform.data.join("admin-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(platform.admin_token().len(), 64);
    }

    // No token, a wrong one: UNAUTHENTICATED on gRPC, 401 on HTTP, nothing recorded.
    refused(
        invoke(&platform, None, None, semver_compare()).await,
        ErrorKind::Unauthenticated,
        "no bearer token",
    );
    refused(
        invoke(&platform, Some("wrong"), None, semver_compare()).await,
        ErrorKind::Unauthenticated,
        "not valid",
    );
    let mut anonymous = platform.client_with(None, None).await;
    let listing = anonymous
        .list_calls(proto::ListCallsRequest::default())
        .await
        .map_err(|s| error_of(&s));
    refused(listing, ErrorKind::Unauthenticated, "bearer");
    let listing = anonymous
        .list_tools(proto::ListToolsRequest::default())
        .await
        .map_err(|s| error_of(&s));
    refused(listing, ErrorKind::Unauthenticated, "bearer");
    let http = reqwest::Client::new();
    let call_url = format!(
        "http://{}/v1/namespaces/default/tools/semver/compare:call",
        platform.http
    );
    let body = json!({"args": {"a": "1.0.0", "b": "2.0.0"}});
    let (status, error) = http_status(http.post(&call_url).json(&body)).await;
    assert_eq!(status, 401);
    assert_eq!(error["error"]["kind"], "unauthenticated");
    // Refused before its body was read: the connection closes, and the answer says so.
    let response = http.post(&call_url).json(&body).send().await.unwrap();
    assert_eq!(response.headers()["connection"], "close");
    let (status, _) = http_status(
        http.post(&call_url)
            .header("authorization", "Bearer wrong")
            .json(&body),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = http_status(http.get(format!("http://{}/v1/calls", platform.http))).await;
    assert_eq!(status, 401);
    // Probes stay open.
    let health = http
        .get(format!("http://{}/healthz", platform.http))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Refusals are counted for operators to alert on; `/metrics` answers operators only.
    let metrics_url = format!("http://{}/metrics", platform.http);
    let (status, error) = http_status(http.get(&metrics_url)).await;
    assert_eq!(status, 401);
    assert_eq!(error["error"]["kind"], "unauthenticated");
    let (status, error) = http_status(http.get(&metrics_url).bearer_auth("wrong")).await;
    assert_eq!(status, 401);
    assert_eq!(error["error"]["kind"], "unauthenticated");
    let (status, error) = http_status(http.get(&metrics_url).bearer_auth(REPORTER)).await;
    assert_eq!(status, 403);
    assert_eq!(error["error"]["kind"], "permission-denied");
    let metrics = http
        .get(&metrics_url)
        .header("authorization", platform.bearer())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = metrics
        .lines()
        .find(|l| {
            l.starts_with("toolgrid_refusals_total{")
                && l.contains("door=\"caller\"")
                && l.contains("kind=\"unauthenticated\"")
        })
        .unwrap_or_else(|| panic!("no refusal counter in:\n{metrics}"));
    let count: f64 = counted.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 3.0, "{counted}");
    let mut admin = platform.client().await;
    let calls = admin
        .list_calls(proto::ListCallsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .calls;
    assert!(
        calls.is_empty(),
        "refused requests recorded calls: {calls:?}"
    );

    // Manifests that reference unknown agents or secrets get conditions.
    let ghost = platform.resource("bindings", "ghost-semver").await.unwrap();
    assert_eq!(
        (ghost.ready.as_str(), ghost.reason.as_str()),
        ("False", "UnknownAgent")
    );
    let dangling = platform.resource("agents", "dangling").await.unwrap();
    assert_eq!(
        (dangling.ready.as_str(), dangling.reason.as_str()),
        ("False", "MissingSecret")
    );
    let nope = platform.resource("bindings", "ranger-nope").await.unwrap();
    assert_eq!(
        (nope.ready.as_str(), nope.reason.as_str()),
        ("False", "UnknownTool")
    );
    // The broken Secret is reported with its file, never with its content.
    let logs = platform.logs();
    assert!(logs.contains("more-agents.yaml"), "{logs}");
    assert!(
        !logs.contains("not base64"),
        "a Secret's data reached the log"
    );

    // An agent bound and permitted: its binding's release, its config key.
    let call = invoke(&platform, Some(REPORTER), None, semver_compare())
        .await
        .unwrap();
    assert_eq!(result_of(&call)["order"], -1);
    assert_eq!(call.release, "semver-1.0.0");
    assert_eq!(call.agent, "reporter");
    let record = stored(&platform, &call.id).await;
    assert_eq!(record.spec.access.agent.as_deref(), Some("reporter"));
    assert_eq!(
        record.spec.access.config,
        [("region".to_string(), "eu-west-1".to_string())].into()
    );
    let reporters_call = call.id.clone();

    // Bound, but the command is not permitted.
    refused(
        invoke(
            &platform,
            Some(REPORTER),
            None,
            proto::InvokeRequest {
                tool: "semver".into(),
                argv: vec!["bump".into(), "1.0.0".into()],
                ..Default::default()
            },
        )
        .await,
        ErrorKind::PermissionDenied,
        "permissions",
    );
    // Not bound at all.
    let uuid = proto::InvokeRequest {
        tool: "uuid".into(),
        argv: vec!["generate".into()],
        ..Default::default()
    };
    refused(
        invoke(&platform, Some(REPORTER), None, uuid.clone()).await,
        ErrorKind::PermissionDenied,
        "no ToolBinding",
    );
    // Bound, but no release in the binding's range.
    refused(
        invoke(&platform, Some(RANGER), None, uuid.clone()).await,
        ErrorKind::PermissionDenied,
        "release range",
    );

    // A binding asking for a key the agent lacks is not Ready, and the key is not given.
    let zone = platform
        .resource("bindings", "ranger-textstats-zone")
        .await
        .unwrap();
    assert_eq!(zone.ready, "False");
    assert_eq!(zone.reason, "MissingConfigKey");
    assert!(zone.message.contains("\"zone\""), "{}", zone.message);
    let call = invoke(
        &platform,
        Some(RANGER),
        None,
        proto::InvokeRequest {
            tool: "textstats".into(),
            argv: vec!["count".into()],
            stdin: Some(b"one two".to_vec()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(result_of(&call)["words"], 2);
    let record = stored(&platform, &call.id).await;
    assert_eq!(record.spec.access.agent.as_deref(), Some("ranger"));
    assert_eq!(
        record.spec.access.config.keys().collect::<Vec<_>>(),
        ["region"],
        "zone is not given"
    );

    // An agent cannot read another agent's call: not found, as if it did not exist.
    let mut other = platform.client_with(Some(OTHER), None).await;
    let read = other
        .get_call(proto::GetCallRequest {
            id: reporters_call.clone(),
            ..Default::default()
        })
        .await
        .map_err(|s| error_of(&s));
    refused(read, ErrorKind::NotFound, "no call");
    let oplog = toolgrid::cli::client::oplog_of(&mut other, &reporters_call)
        .await
        .map_err(|s| error_of(&s));
    refused(oplog, ErrorKind::NotFound, "no call");
    let (status, _) = http_status(
        http.get(format!(
            "http://{}/v1/calls/{reporters_call}",
            platform.http
        ))
        .header("authorization", format!("Bearer {OTHER}")),
    )
    .await;
    assert_eq!(status, 404);
    let (status, mine) = http_status(
        http.get(format!(
            "http://{}/v1/calls/{reporters_call}",
            platform.http
        ))
        .header("authorization", format!("Bearer {REPORTER}")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(mine["id"], reporters_call.as_str());
    assert_eq!(mine["agent"], "reporter");
    // Listings: each agent its own calls; the admin all of them.
    let listed =
        |calls: Vec<proto::Call>| -> Vec<String> { calls.into_iter().map(|c| c.id).collect() };
    let others = listed(
        other
            .list_calls(proto::ListCallsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .calls,
    );
    assert!(others.is_empty(), "{others:?}");
    let all = listed(
        admin
            .list_calls(proto::ListCallsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .calls,
    );
    assert_eq!(all.len(), 2, "{all:?}");

    // Idempotency keys are per agent: the same key by two agents is two calls. (Arguments
    // not used above: reporter's identical call would be refused as a repeat.)
    let keyed = proto::InvokeRequest {
        idempotency_key: "same-key".into(),
        ..semver_compare_of("3.0.0", "3.0.1")
    };
    let by_reporter = invoke(&platform, Some(REPORTER), None, keyed.clone())
        .await
        .unwrap();
    let by_other = invoke(&platform, Some(OTHER), None, keyed.clone())
        .await
        .unwrap();
    assert_ne!(by_reporter.id, by_other.id);
    let again = invoke(&platform, Some(OTHER), None, keyed).await.unwrap();
    assert_eq!(again.id, by_other.id);
    assert!(again.deduplicated);

    // An agent lists only the tools it may call, with the commands it may use.
    let mut reporter = platform.client_with(Some(REPORTER), None).await;
    let tools = reporter
        .list_tools(proto::ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tools;
    let names: Vec<(&str, Vec<&str>)> = tools
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.commands.iter().map(|c| c.name.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("platform__signing-keys", vec!["default"]),
            ("semver", vec!["compare"]),
            ("textstats", vec!["count"])
        ]
    );
    let rows = reporter
        .list_resources(proto::ListResourcesRequest {
            kind: "agents".into(),
            namespace: String::new(),
        })
        .await
        .map_err(|s| error_of(&s));
    refused(rows, ErrorKind::PermissionDenied, "agents may list tools");

    // Operators act as agents; agents may not.
    refused(
        invoke(
            &platform,
            Some(&platform.admin_token()),
            Some("reporter"),
            uuid.clone(),
        )
        .await,
        ErrorKind::PermissionDenied,
        "no ToolBinding",
    );
    let as_reporter = invoke(
        &platform,
        Some(&platform.admin_token()),
        Some("reporter"),
        // Not reporter's earlier call, which would be refused as a repeat.
        semver_compare_of("4.0.0", "4.0.1"),
    )
    .await
    .unwrap();
    assert_eq!(
        stored(&platform, &as_reporter.id)
            .await
            .spec
            .access
            .agent
            .as_deref(),
        Some("reporter")
    );
    refused(
        invoke(&platform, Some(REPORTER), Some("ranger"), semver_compare()).await,
        ErrorKind::PermissionDenied,
        "may not act as another agent",
    );
    let (status, body) = http_status(
        platform
            .http_client()
            .post(format!(
                "http://{}/v1/namespaces/default/tools/uuid/generate:call",
                platform.http
            ))
            .header("toolgrid-as", "reporter")
            .json(&json!({})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["kind"], "permission-denied");
    // The admin itself calls anything, on the tool's newest release, with no access.
    let call = platform.call("uuid", &["generate"]).await.unwrap();
    assert_eq!(call.state, proto::CallState::Succeeded as i32);
    assert_eq!(
        stored(&platform, &call.id).await.spec.access,
        Default::default()
    );

    // The CLI: the admin token by default (the README tour), --token, --as, why.
    let out = platform.cli(&["call", "semver", "compare", "1.2.0", "1.10.0"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = platform.cli(
        &[
            "call", "--token", "wrong", "semver", "compare", "1.2.0", "1.10.0",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unauthenticated"));
    let out = platform.cli(
        &["call", "--as", "reporter", "semver", "bump", "1.0.0"],
        None,
    );
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stderr).contains("permission-denied"));
    let out = platform.cli(&["why", "reporter", "-o", "json"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let why: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = |tool: &str| {
        why["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tool"] == tool)
            .cloned()
            .unwrap_or_else(|| panic!("no {tool} in {why}"))
    };
    assert_eq!(verdict("semver")["allowed"], true);
    assert_eq!(verdict("semver")["release"], "semver-1.0.0");
    assert_eq!(verdict("uuid")["cause"], "no-binding");
    assert_eq!(verdict("fetch")["cause"], "no-binding");
    let out = platform.cli(&["why", "ranger", "uuid", "-o", "json"], None);
    let why: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(why["tools"][0]["cause"], "release-range");
    assert_eq!(why["tools"][0]["reason"], "NoMatchingRelease");
    let out = platform.cli(&["why", "other", "textstats"], None);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no (no-binding)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = platform.cli(&["get", "tools", "--as", "ranger", "-o", "wide"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("cannot call"), "{text}");
    assert!(text.contains("release-range"), "{text}");
    // The same over HTTP.
    let (status, why) = http_status(platform.http_client().get(format!(
        "http://{}/v1/why?agent=ranger&tool=uuid",
        platform.http
    )))
    .await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(why["tools"][0]["cause"], "release-range");
    assert_eq!(why["tools"][0]["binding"], "ranger-uuid");
    // An agent asks only about itself.
    let mut ranger = platform.client_with(Some(RANGER), None).await;
    let mine = ranger
        .why(proto::WhyRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.agent, "ranger");
    let theirs = ranger
        .why(proto::WhyRequest {
            agent: "reporter".into(),
            tool: String::new(),
        })
        .await
        .map_err(|s| error_of(&s));
    refused(theirs, ErrorKind::PermissionDenied, "only about itself");

    // The agent's token changes with its Secret: the old one stops working.
    let more = MORE.replace(OTHER, "rotated-token");
    std::fs::write(manifests.join("more-agents.yaml"), more).unwrap();
    platform
        .eventually("the rotated token", Duration::from_secs(30), || async {
            invoke(
                &platform,
                Some("rotated-token"),
                None,
                semver_compare_of("5.0.0", "5.0.1"),
            )
            .await
            .is_ok()
        })
        .await;
    refused(
        invoke(&platform, Some(OTHER), None, semver_compare()).await,
        ErrorKind::Unauthenticated,
        "not valid",
    );

    // No token reached the log or the store.
    let logs = platform.logs();
    let database = std::fs::read(platform.data.join("toolgrid.db")).unwrap();
    let wal = std::fs::read(platform.data.join("toolgrid.db-wal")).unwrap_or_default();
    for token in [
        REPORTER,
        RANGER,
        OTHER,
        "rotated-token",
        &platform.admin_token(),
    ] {
        assert!(!logs.contains(token), "{token} is in the log");
        for bytes in [&database, &wal] {
            assert!(
                !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                "{token} is in the store"
            );
        }
    }
}
