//! Cancellation on a real `toolgrid up`: `toolgrid cancel`, `POST /v1/calls/{id}/cancel`
//! and the gRPC `Cancel` RPC. A running call stops at once and the witness sees no request
//! of it that was not committed before the cancel was acknowledged; a `write` call that
//! made requests ends `outcome-unknown`, a `read` one `cancelled`; a queued call ends at
//! once; an ended call is `not-cancellable`; another agent's call is `not-found`; no token
//! is `unauthenticated`.
//!
//! The tool is the `slow` fixture: one request to the witness per step (200 ms apart).

use crate::common;

use common::fixtures;
use common::witness::Witness;
use common::{Platform, error_kind};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const ALICE: &str = "alice-token-value";
const BOB: &str = "bob-token-value";
const CAROL: &str = "carol-token-value";

/// `slow-write` (effect write) and `slow-read` (effect read), both the slow fixture with a
/// timeout of 2 minutes; agents alice and bob bound to both; one worker with two slots.
fn manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let wasm = fixtures::repo().join("tests/fixtures/tools/slow/slow.wasm");
    let tool = |name: &str, effect: &str| {
        format!(
            r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: {effect}
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
metadata: {{name: {name}-1.0.0}}
spec:
  tool: {name}
  version: 1.0.0
  artifact: {{file: {wasm}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: {name}-agents}}
spec:
  agents: [alice, bob]
  tool: {name}
"#,
            wasm = wasm.display()
        )
    };
    let agent = |name: &str| {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\n\
             spec:\n  tokenSecretRef: {{name: agent-tokens, key: {name}}}\n  \
             permissions: [{{tools: [\"*\"], commands: [\"*\"]}}]\n"
        )
    };
    let mut text = format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\n\
         spec: {{replicas: 1, slotsPerWorker: 2}}\n---\napiVersion: v1\nkind: Secret\n\
         metadata: {{name: agent-tokens}}\nstringData: {{alice: {ALICE}, bob: {BOB}, carol: {CAROL}}}\n"
    );
    text += &agent("alice");
    text += &agent("bob");
    // carol's calls wait for approval.
    text += &agent("carol");
    text += "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Middleware\nmetadata: {name: needs-ok}\n\
             spec:\n  approval: {timeout: 1h, onTimeout: deny}\n---\n\
             apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {name: carol-write}\n\
             spec:\n  agents: [carol]\n  tool: slow-write\n  middleware: [needs-ok]\n";
    text += &tool("slow-write", "write");
    text += &tool("slow-read", "read");
    std::fs::write(dir.join("cancel.yaml"), text).unwrap();
    dir
}

fn request(tool: &str, witness: &Witness, run: &str, steps: u32) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: tool.into(),
        command: "run".into(),
        args_json: json!({"base": witness.base(), "run": run, "steps": steps, "progress": true})
            .to_string(),
        ..Default::default()
    }
}

/// Starts a call with `InvokeStream` as `token` and returns its id (from the `accepted`
/// event) and the task that drains the rest of the stream.
async fn start(
    platform: &Platform,
    token: Option<&str>,
    request: proto::InvokeRequest,
) -> (String, tokio::task::JoinHandle<Option<proto::Call>>) {
    let mut client = match token {
        Some(token) => platform.client_with(Some(token), None).await,
        None => platform.client().await,
    };
    let mut stream = client
        .invoke_stream(request)
        .await
        .expect("invoke stream")
        .into_inner();
    let first = stream.message().await.expect("stream").expect("an event");
    let Some(proto::invoke_event::Event::Progress(accepted)) = first.event else {
        panic!("the first event is not progress: {first:?}");
    };
    assert_eq!(accepted.stage, "accepted");
    let rest = tokio::spawn(async move {
        let mut last = None;
        while let Ok(Some(event)) = stream.message().await {
            if let Some(proto::invoke_event::Event::Call(call)) = event.event {
                last = Some(call);
            }
        }
        last
    });
    (accepted.call_id, rest)
}

fn seen_of(witness: &Witness, run: &str) -> Vec<common::witness::Seen> {
    let query = format!("run={run}&");
    witness
        .seen()
        .into_iter()
        .filter(|s| s.query.as_deref().is_some_and(|q| q.starts_with(&query)))
        .collect()
}

async fn http_cancel(platform: &Platform, token: Option<&str>, id: &str) -> (u16, Value) {
    let mut request =
        reqwest::Client::new().post(format!("http://{}/v1/calls/{id}/cancel", platform.http));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("cancel request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn state_of(platform: &Platform, id: &str) -> proto::Call {
    let mut client = platform.client().await;
    client
        .get_call(proto::GetCallRequest {
            id: id.into(),
            ..Default::default()
        })
        .await
        .expect("get call")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_stop_at_once_and_nothing_leaves_after_the_acknowledgement() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let platform = Platform::start(root.path(), &manifests(root.path(), &witness), &[]);
    platform
        .eventually(
            "the releases to be ready",
            Duration::from_secs(60),
            || async {
                platform
                    .resource("ToolRelease", "slow-read-1.0.0")
                    .await
                    .is_some_and(|r| r.ready == "True")
                    && platform
                        .resource("ToolRelease", "slow-write-1.0.0")
                        .await
                        .is_some_and(|r| r.ready == "True")
            },
        )
        .await;

    // Two long calls take both slots: alice's write and the operator's read.
    let (write_id, write_stream) = start(
        &platform,
        Some(ALICE),
        request("slow-write", &witness, "w", 500),
    )
    .await;
    let (read_id, read_stream) =
        start(&platform, None, request("slow-read", &witness, "r", 500)).await;
    assert!(
        witness
            .wait_for(Duration::from_secs(60), |_| {
                seen_of(&witness, "w").len() >= 2 && seen_of(&witness, "r").len() >= 2
            })
            .await,
        "both calls run"
    );

    // A third call queues (no free slot); cancelling it ends it at once, `cancelled`.
    let (queued_id, queued_stream) = start(
        &platform,
        Some(ALICE),
        request("slow-write", &witness, "q", 1),
    )
    .await;
    assert_eq!(
        state_of(&platform, &queued_id).await.state,
        proto::CallState::Pending as i32
    );
    let output = platform.cli(&["cancel", &queued_id], None);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Value = serde_json::from_slice(&output.stdout).expect("the call as JSON");
    assert_eq!(printed["error"]["kind"], "cancelled", "{printed}");
    let queued = state_of(&platform, &queued_id).await;
    assert_eq!(error_kind(&queued), "cancelled");
    let ended = queued_stream
        .await
        .unwrap()
        .expect("the stream ends with the call");
    assert_eq!(error_kind(&ended), "cancelled");
    assert!(
        seen_of(&witness, "q").is_empty(),
        "the queued call never ran"
    );

    // A call waiting for approval ends at once too, and never runs.
    let mut carol = platform.client_with(Some(CAROL), None).await;
    let waiting = carol
        .invoke(request("slow-write", &witness, "a", 1))
        .await
        .expect("invoke")
        .into_inner();
    assert_eq!(waiting.state, proto::CallState::AwaitingApproval as i32);
    let (status, body) = http_cancel(&platform, Some(CAROL), &waiting.id).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["error"]["kind"], "cancelled");
    assert_eq!(
        error_kind(&state_of(&platform, &waiting.id).await),
        "cancelled"
    );

    // Cancelling it again is refused: it has ended (CLI exit 2, HTTP 409, gRPC).
    let output = platform.cli(&["cancel", &queued_id], None);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not-cancellable"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (status, body) = http_cancel(&platform, Some(&platform.admin_token()), &queued_id).await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["kind"], "not-cancellable");
    let error = carol
        .cancel(proto::CancelRequest {
            call_id: waiting.id.clone(),
        })
        .await
        .map_err(|s| error_of(&s))
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::NotCancellable);
    assert_eq!(
        error_kind(&state_of(&platform, &queued_id).await),
        "cancelled",
        "a refused cancel changes nothing"
    );

    // Another agent's call is not found; no token is unauthenticated.
    let mut bob = platform.client_with(Some(BOB), None).await;
    let error = bob
        .cancel(proto::CancelRequest {
            call_id: write_id.clone(),
        })
        .await
        .map_err(|s| error_of(&s))
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::NotFound);
    let (status, body) = http_cancel(&platform, Some(BOB), &write_id).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (404, Some("not-found"))
    );
    let (status, body) = http_cancel(&platform, None, &write_id).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (401, Some("unauthenticated"))
    );
    let mut anonymous = platform.client_with(None, None).await;
    let error = anonymous
        .cancel(proto::CancelRequest {
            call_id: write_id.clone(),
        })
        .await
        .map_err(|s| error_of(&s))
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Unauthenticated);
    let (status, _) = http_cancel(&platform, Some("not-a-token"), &write_id).await;
    assert_eq!(status, 401);
    assert_eq!(
        state_of(&platform, &write_id).await.state,
        proto::CallState::Running as i32,
        "refused cancels change nothing"
    );

    // Alice cancels her running write call over HTTP: it made requests, so its outcome is
    // unknown. Once that answer is in, nothing of the call leaves that was not committed
    // before it.
    let (status, body) = http_cancel(&platform, Some(ALICE), &write_id).await;
    let acknowledged = Instant::now();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "failed");
    assert_eq!(body["error"]["kind"], "outcome-unknown", "{body}");
    let ended = write_stream
        .await
        .unwrap()
        .expect("the stream ends with the call");
    assert_eq!(error_kind(&ended), "outcome-unknown");

    // The operator cancels the read call over gRPC: `cancelled`.
    let mut client = platform.client().await;
    let call = client
        .cancel(proto::CancelRequest {
            call_id: read_id.clone(),
        })
        .await
        .expect("cancel")
        .into_inner();
    assert_eq!(error_kind(&call), "cancelled");
    assert_eq!(
        error_kind(&read_stream.await.unwrap().expect("ended")),
        "cancelled"
    );

    // Give a call that was not stopped every chance to send more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let recorded: HashSet<String> = platform
        .oplog(&write_id)
        .await
        .into_iter()
        .filter(|e| e.kind == "http-request")
        .map(|e| {
            let payload: Value = serde_json::from_str(&e.payload_json).unwrap();
            payload["idempotencyKey"].as_str().unwrap().to_string()
        })
        .collect();
    let seen = seen_of(&witness, "w");
    assert!(!seen.is_empty());
    for request in &seen {
        let key = request.key.clone().expect("an idempotency key");
        assert!(
            recorded.contains(&key),
            "the witness saw {key} (at {:?} after the cancel was acknowledged) that the \
             oplog never committed",
            request.at.checked_duration_since(acknowledged)
        );
    }
    let after: Vec<_> = seen.iter().filter(|s| s.at > acknowledged).collect();
    assert!(
        after.len() <= 1,
        "requests after the cancel was acknowledged: {after:?}"
    );
    // Nothing more of either call arrives, and the slots are free again: a new call runs.
    assert!(
        seen_of(&witness, "a").is_empty(),
        "the call awaiting approval never ran"
    );
    let count = (seen_of(&witness, "w").len(), seen_of(&witness, "r").len());
    let call = platform
        .invoke(request("slow-read", &witness, "after", 1))
        .await
        .expect("a call after the cancels");
    assert_eq!(call.state, proto::CallState::Succeeded as i32);
    assert_eq!(
        (seen_of(&witness, "w").len(), seen_of(&witness, "r").len()),
        count
    );
    // The oplog ends with the cancel's outcome.
    let oplog = platform.oplog(&write_id).await;
    let last = oplog.last().expect("entries");
    assert_eq!(last.kind, "outcome");
    assert!(
        last.payload_json.contains("cancelled by agent:"),
        "{}",
        last.payload_json
    );
}
