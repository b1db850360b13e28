//! Rate limits: a real `toolgrid up` with two agents bound through `rateLimit` Middleware,
//! called concurrently over gRPC and over HTTP; buckets held in the store across a SIGKILL
//! of the control plane; `key: tool` shared by agents, `key: agent` not.

use crate::common;

use common::{Platform, fixtures};
use std::time::Duration;
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;

const ALPHA: &str = "alpha-token-value";
const BETA: &str = "beta-token-value";

/// How many calls a bucket allows: per hour, so nothing refills during the test.
const N: usize = 3;

/// Agents `alpha` and `beta`, bound to semver through `per-agent` (a bucket each) and to
/// textstats through `per-tool` (one bucket for the tool, shared).
const MANIFESTS: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: limited-tokens}
stringData: {alpha: alpha-token-value, beta: beta-token-value}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: alpha}
spec:
  tokenSecretRef: {name: limited-tokens, key: alpha}
  permissions: [{tools: [semver, textstats]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: beta}
spec:
  tokenSecretRef: {name: limited-tokens, key: beta}
  permissions: [{tools: [semver, textstats]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: per-agent}
spec:
  rateLimit: {requests: 3, per: 1h, key: agent}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: per-tool}
spec:
  rateLimit: {requests: 3, per: 1h, key: tool}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: limited-semver}
spec: {agents: [alpha, beta], tool: semver, middleware: [per-agent]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: limited-textstats}
spec: {agents: [alpha, beta], tool: textstats, middleware: [per-tool]}
"#;

/// A semver comparison that differs per `i` (identical calls would be refused as repeats).
fn compare(i: usize) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: "semver".into(),
        argv: vec!["compare".into(), format!("1.0.{i}"), "2.0.0".into()],
        ..Default::default()
    }
}

fn count(text: &str) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: "textstats".into(),
        command: "count".into(),
        stdin: Some(text.as_bytes().to_vec()),
        ..Default::default()
    }
}

/// Calls as `token`; the raw status on refusal.
async fn invoke(
    platform: &Platform,
    token: &str,
    request: proto::InvokeRequest,
) -> Result<proto::Call, tonic::Status> {
    let mut client = platform.client_with(Some(token), None).await;
    client.invoke(request).await.map(|r| r.into_inner())
}

/// Asserts a refusal as `rate-limited`, RESOURCE_EXHAUSTED with a retry-after within the
/// time one token takes (an hour / 3); returns it.
fn rate_limited(status: &tonic::Status) -> u64 {
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let error = toolgrid_proto::status::error_of(status);
    assert_eq!(error.kind, ErrorKind::RateLimited, "{}", error.message);
    let retry = error.retry_after_ms.expect("retry-after-ms metadata");
    assert!(
        (1..=3_600_000 / N as u64).contains(&retry),
        "retry after {retry} ms"
    );
    retry
}

async fn calls_of(platform: &Platform, token: &str) -> Vec<proto::Call> {
    let mut client = platform.client_with(Some(token), None).await;
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
async fn rate_limits_admit_exactly_the_bucket_and_hold_across_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    std::fs::write(manifests.join("limited.yaml"), MANIFESTS).unwrap();
    let mut platform = Platform::start(root.path(), &manifests, &[]);

    // 8 concurrent callers against one agent's bucket of N: exactly N admitted.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let grpc = platform.grpc.clone();
        tasks.push(tokio::spawn(async move {
            let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
                .unwrap()
                .connect()
                .await
                .expect("connect");
            let mut client = toolgrid::cli::client::client_of(
                channel,
                toolgrid::cli::client::Credentials::new(Some(ALPHA), None).unwrap(),
            );
            client.invoke(compare(i)).await.map(|r| r.into_inner())
        }));
    }
    let mut admitted = 0;
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(call) => {
                assert_eq!(call.state, proto::CallState::Succeeded as i32, "{call:?}");
                admitted += 1;
            }
            Err(status) => {
                rate_limited(&status);
                assert!(status.message().contains("per-agent"), "{status:?}");
                refused += 1;
            }
        }
    }
    assert_eq!((admitted, refused), (N, 8 - N));
    // Refused calls are not recorded.
    assert_eq!(calls_of(&platform, ALPHA).await.len(), N);

    // HTTP: 429 with Retry-After (seconds) and the kind.
    let http = reqwest::Client::new();
    let response = http
        .post(format!(
            "http://{}/v1/namespaces/default/tools/semver/compare:call",
            platform.http
        ))
        .header("authorization", format!("Bearer {ALPHA}"))
        .json(&serde_json::json!({"args": {"a": "9.9.9", "b": "1.0.0"}}))
        .send()
        .await
        .expect("HTTP");
    assert_eq!(response.status().as_u16(), 429);
    let retry_after: u64 = response
        .headers()
        .get("retry-after")
        .expect("Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .expect("seconds");
    assert!((1..=1_200).contains(&retry_after), "{retry_after}");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "rate-limited");
    assert!(body["error"]["retryAfterMs"].as_u64().is_some(), "{body}");
    assert_eq!(calls_of(&platform, ALPHA).await.len(), N);

    // `key: agent`: beta has a bucket of its own.
    for i in 0..N {
        let call = invoke(&platform, BETA, compare(100 + i))
            .await
            .expect("beta's own bucket");
        assert_eq!(call.state, proto::CallState::Succeeded as i32);
    }
    rate_limited(&invoke(&platform, BETA, compare(200)).await.unwrap_err());

    // `key: tool`: one bucket for textstats, whichever agent calls.
    invoke(&platform, ALPHA, count("one")).await.expect("1st");
    invoke(&platform, BETA, count("two")).await.expect("2nd");
    invoke(&platform, ALPHA, count("three")).await.expect("3rd");
    rate_limited(&invoke(&platform, BETA, count("four")).await.unwrap_err());
    rate_limited(&invoke(&platform, ALPHA, count("five")).await.unwrap_err());
    // The operator is not bound, so no chain: not limited.
    platform
        .call("semver", &["compare", "1.0.0", "1.0.1"])
        .await
        .expect("operator");

    // The buckets live in the store: a control plane killed and started again still
    // refuses.
    platform.restart(libc::SIGKILL);
    let mut after = None;
    for _ in 0..100 {
        match invoke(&platform, ALPHA, compare(300)).await {
            Err(status) if status.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            other => {
                after = Some(other);
                break;
            }
        }
    }
    let after = after.expect("the restarted control plane answers");
    rate_limited(&after.expect_err("still rate-limited after the restart"));
    rate_limited(&invoke(&platform, BETA, count("six")).await.unwrap_err());
    assert_eq!(calls_of(&platform, ALPHA).await.len(), N + 2);
}
