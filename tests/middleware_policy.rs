//! Policy middleware: a real `toolgrid up` with the examples plus an agent (`pol`) whose
//! bindings pass through policies written in CEL: allow, deny with the message the caller
//! sees, rewrites (checked again as the rewritten call), a policy that does not compile
//! (fails closed), and an `enforce: true` policy every binding of the namespace gets.
//! Operators' own calls do not pass through the chain.

use crate::common;

use common::{Platform, fixtures, result_of};
use serde_json::{Value, json};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const POL: &str = "pol-token-value";

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: pol-token}
stringData: {token: pol-token-value}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: pol}
spec:
  tokenSecretRef: {name: pol-token, key: token}
  permissions:
    - {tools: [semver, textstats, uuid]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: semver-policy}
spec:
  policy:
    rules:
      - when: 'call.args.a == "0.0.0"'
        action: deny
        message: zero is not a version we compare
      - when: 'call.args.b == "latest"'
        action: rewrite
        rewrite:
          set: {b: '"9.9.9"'}
      - when: 'call.args.a == "1.0.0-bump"'
        action: rewrite
        rewrite:
          command: bump
          set: {version: '"1.0.0"'}
          remove: [a, b]
      - when: 'call.args.a == "1.0.0-break"'
        action: rewrite
        rewrite:
          set: {b: '42'}
      - when: 'call.agent == "pol" && call.tool == "semver" && call.effect == "read"'
        action: allow
    default: deny
    message: only pol compares versions here
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: bad-cel}
spec:
  policy:
    rules:
      - {when: 'call.tool ==', action: deny}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: few-uuids}
spec:
  enforce: true
  policy:
    rules:
      - when: 'call.tool == "uuid" && call.args.count > 3'
        action: deny
        message: at most 3 uuids at a time
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: pol-semver}
spec: {agents: [pol], tool: semver, commands: [compare], middleware: [semver-policy]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: pol-textstats}
spec: {agents: [pol], tool: textstats, middleware: [bad-cel]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: pol-uuid}
spec: {agents: [pol], tool: uuid}
"#;

async fn invoke(
    platform: &Platform,
    token: Option<&str>,
    tool: &str,
    argv: &[&str],
) -> Result<proto::Call, ApiError> {
    let mut client = platform.client_with(token, None).await;
    client
        .invoke(proto::InvokeRequest {
            tool: tool.into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
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

async fn calls_of(platform: &Platform, tool: &str) -> Vec<proto::Call> {
    let mut admin = platform.client().await;
    admin
        .list_calls(proto::ListCallsRequest {
            tool: tool.into(),
            ..Default::default()
        })
        .await
        .expect("list calls")
        .into_inner()
        .calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_allow_deny_and_rewrite_calls() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    std::fs::write(manifests.join("policy.yaml"), MANIFESTS).unwrap();
    let platform = Platform::start(root.path(), &manifests, &[]);

    // A policy that does not compile: not Ready with the compiler's message; so is the
    // binding that names it, and its calls are refused without running.
    let bad = platform.resource("middlewares", "bad-cel").await.unwrap();
    assert_eq!(
        (bad.ready.as_str(), bad.reason.as_str()),
        ("False", "InvalidExpression")
    );
    assert!(
        bad.message.starts_with("spec.policy.rules[0].when: "),
        "{}",
        bad.message
    );
    let binding = platform
        .resource("bindings", "pol-textstats")
        .await
        .unwrap();
    assert_eq!(
        (binding.ready.as_str(), binding.reason.as_str()),
        ("False", "MiddlewareNotReady")
    );
    assert!(binding.message.contains("bad-cel"), "{}", binding.message);
    refused(
        invoke(&platform, Some(POL), "textstats", &["count"]).await,
        ErrorKind::PermissionDenied,
        "bad-cel",
    );
    assert!(calls_of(&platform, "textstats").await.is_empty());

    // The chain, in order, per binding (enforced first).
    for (name, chain) in [
        // The examples' enforced example-audit comes first too (enforced ones by name).
        ("pol-semver", "example-audit,few-uuids,semver-policy"),
        ("pol-textstats", "example-audit,few-uuids,bad-cel"),
        ("pol-uuid", "example-audit,few-uuids"),
        (
            "reporter-semver",
            "example-audit,few-uuids,reporter-rate,reporter-policy",
        ),
    ] {
        let row = platform.resource("bindings", name).await.unwrap();
        let column = row
            .columns
            .iter()
            .find(|c| c.name == "Middleware")
            .map(|c| c.value.as_str());
        assert_eq!(column, Some(chain), "{name}");
    }
    let out = platform.cli(&["get", "bindings", "-o", "wide"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("MIDDLEWARE"), "{table}");
    assert!(table.contains("few-uuids,semver-policy"), "{table}");

    // Allowed: the call runs as asked.
    let call = invoke(
        &platform,
        Some(POL),
        "semver",
        &["compare", "1.2.0", "1.10.0"],
    )
    .await
    .unwrap();
    assert_eq!(
        result_of(&call),
        json!({"order": -1, "a": "1.2.0", "b": "1.10.0"})
    );

    // Denied: the rule's message, kind `denied`, over gRPC and HTTP; nothing runs.
    let before = calls_of(&platform, "semver").await.len();
    refused(
        invoke(
            &platform,
            Some(POL),
            "semver",
            &["compare", "0.0.0", "1.0.0"],
        )
        .await,
        ErrorKind::Denied,
        "zero is not a version we compare",
    );
    let response = platform
        .http_client()
        .post(format!(
            "http://{}/v1/namespaces/default/tools/semver/compare:call",
            platform.http
        ))
        .header("authorization", format!("Bearer {POL}"))
        .json(&json!({"args": {"a": "0.0.0", "b": "1.0.0"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "denied");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("zero is not a version we compare"),
        "{body}"
    );

    // Rewritten: the call that runs has the new arguments.
    let call = invoke(
        &platform,
        Some(POL),
        "semver",
        &["compare", "1.2.0", "latest"],
    )
    .await
    .unwrap();
    assert_eq!(
        result_of(&call),
        json!({"order": -1, "a": "1.2.0", "b": "9.9.9"})
    );
    let args: Value = serde_json::from_str(&call.args_json).unwrap();
    assert_eq!(args, json!({"a": "1.2.0", "b": "9.9.9"}));

    // A rewrite to a command the binding does not allow (the agent's permissions do):
    // refused as the rewritten call.
    refused(
        invoke(
            &platform,
            Some(POL),
            "semver",
            &["compare", "1.0.0-bump", "1.0.0"],
        )
        .await,
        ErrorKind::PermissionDenied,
        "lists none of the commands bump",
    );
    // A rewrite the schema refuses.
    refused(
        invoke(
            &platform,
            Some(POL),
            "semver",
            &["compare", "1.0.0-break", "1.0.0"],
        )
        .await,
        ErrorKind::InvalidArgument,
        "semver-policy",
    );
    // Nothing refused was recorded: only the allowed and the rewritten call ran.
    assert_eq!(calls_of(&platform, "semver").await.len(), before + 1);

    // `default: deny` applies to what no rule matches: reporter's binding does not name
    // the policy, so it is not affected; the operator's call is not either.
    let call = invoke(
        &platform,
        Some("reporter-example-token"),
        "semver",
        &["compare", "0.0.0", "1.0.0"],
    )
    .await
    .unwrap();
    assert_eq!(result_of(&call)["order"], -1);

    // An enforced policy applies to a binding that does not name it...
    refused(
        invoke(&platform, Some(POL), "uuid", &["generate", "--count", "5"]).await,
        ErrorKind::Denied,
        "at most 3 uuids at a time",
    );
    let call = invoke(&platform, Some(POL), "uuid", &["generate", "--count", "2"])
        .await
        .unwrap();
    assert_eq!(result_of(&call)["uuids"].as_array().map(Vec::len), Some(2));
    // ... but not to an operator's own call, which no binding carries.
    let call = invoke(
        &platform,
        Some(&platform.admin_token()),
        "uuid",
        &["generate", "--count", "5"],
    )
    .await
    .unwrap();
    assert_eq!(result_of(&call)["uuids"].as_array().map(Vec::len), Some(5));
    // Nor does the failing policy stop the operator's textstats call.
    let call = invoke(
        &platform,
        Some(&platform.admin_token()),
        "textstats",
        &["count"],
    )
    .await
    .unwrap();
    assert!(result_of(&call).is_object());
}
