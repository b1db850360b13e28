//! Fair share between agents on a real `toolgrid up` (`--max-queued-per-agent 4`, one
//! worker with one slot): alice floods the pool with slow calls, yet bob's single call
//! starts right after the call that was running and the next one of alice's, ahead of the
//! rest of her queue (read from the `assigned` entries of the oplogs, not the wall clock);
//! alice's call past her cap is refused `queue-full` (HTTP 429 with `Retry-After`, gRPC
//! RESOURCE_EXHAUSTED) and not recorded, so its idempotency key works once her queue drains.
//!
//! The tool is the `slow` fixture: one request to the witness per step.

use crate::common;

use common::fixtures;
use common::witness::Witness;
use common::{Platform, result_of};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

const ALICE: &str = "alice-token-value";
const BOB: &str = "bob-token-value";
/// The platform's `--max-queued-per-agent`.
const CAP: usize = 4;

/// `slow-read` (the slow fixture, effect read, no repeat window); agents alice and bob
/// bound to it; one worker with one slot.
fn manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let wasm = fixtures::repo().join("tests/fixtures/tools/slow/slow.wasm");
    let agent = |name: &str| {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\n\
             spec:\n  tokenSecretRef: {{name: agent-tokens, key: {name}}}\n  \
             permissions: [{{tools: [\"*\"], commands: [\"*\"]}}]\n"
        )
    };
    let mut text = format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\n\
         spec: {{replicas: 1, slotsPerWorker: 1}}\n---\napiVersion: v1\nkind: Secret\n\
         metadata: {{name: agent-tokens}}\nstringData: {{alice: {ALICE}, bob: {BOB}}}\n"
    );
    text += &agent("alice");
    text += &agent("bob");
    text += &format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: slow-read}}
spec:
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
metadata: {{name: slow-read-1.0.0}}
spec:
  tool: slow-read
  version: 1.0.0
  artifact: {{file: {wasm}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: slow-read-agents}}
spec:
  agents: [alice, bob]
  tool: slow-read
"#,
        wasm = wasm.display()
    );
    std::fs::write(dir.join("fairness.yaml"), text).unwrap();
    dir
}

fn args(witness: &Witness, run: &str, steps: u32, sleep_ms: u32) -> serde_json::Value {
    json!({"base": witness.base(), "run": run, "steps": steps, "sleep-ms": sleep_ms})
}

fn request(args: serde_json::Value, key: &str) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: "slow-read".into(),
        command: "run".into(),
        args_json: args.to_string(),
        idempotency_key: key.into(),
        ..Default::default()
    }
}

/// Starts a call with `InvokeStream` as `token`: its id once it is accepted (recorded),
/// and the task that drains the rest of the stream to the call's end.
async fn start(
    platform: &Platform,
    token: &str,
    request: proto::InvokeRequest,
) -> (String, tokio::task::JoinHandle<Option<proto::Call>>) {
    let mut client = platform.client_with(Some(token), None).await;
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

/// When the store recorded the call's first assignment (its `assigned` entry).
async fn assigned_at(platform: &Platform, id: &str) -> i64 {
    platform
        .oplog(id)
        .await
        .iter()
        .find(|e| e.kind == "assigned")
        .unwrap_or_else(|| panic!("call {id} has no assigned entry"))
        .recorded_at_ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agents_flood_does_not_starve_another_and_its_queue_is_capped() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let platform = Platform::start(
        root.path(),
        &manifests(root.path(), &witness),
        &["--max-queued-per-agent", &CAP.to_string()],
    );
    platform
        .eventually(
            "the release to be ready",
            Duration::from_secs(60),
            || async {
                platform
                    .resource("ToolRelease", "slow-read-1.0.0")
                    .await
                    .is_some_and(|r| r.ready == "True")
            },
        )
        .await;
    // Warm up: the worker attaches and compiles the release before the flood.
    let warm = platform
        .client_with(Some(BOB), None)
        .await
        .invoke(request(args(&witness, "warm", 1, 0), ""))
        .await
        .expect("warm-up call")
        .into_inner();
    result_of(&warm);

    // alice's first call takes the only slot for a few seconds; CAP more of hers queue.
    let mut alice = Vec::new();
    alice.push(
        start(
            &platform,
            ALICE,
            request(args(&witness, "a0", 10, 300), "a0"),
        )
        .await,
    );
    for i in 1..=CAP {
        let run = format!("a{i}");
        alice.push(
            start(
                &platform,
                ALICE,
                request(args(&witness, &run, 3, 250), &run),
            )
            .await,
        );
    }

    // One more of alice's is refused, over HTTP and gRPC alike, and not recorded.
    let over = args(&witness, "over", 1, 0);
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/namespaces/default/tools/slow-read/run:call",
            platform.http
        ))
        .bearer_auth(ALICE)
        .header("idempotency-key", "over")
        .json(&json!({"args": over}))
        .send()
        .await
        .expect("HTTP call");
    assert_eq!(response.status().as_u16(), 429);
    let retry_after: u64 = response
        .headers()
        .get("retry-after")
        .expect("a Retry-After header")
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry_after >= 1, "{retry_after}");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "queue-full", "{body}");
    let status = platform
        .client_with(Some(ALICE), None)
        .await
        .invoke(request(over.clone(), "over"))
        .await
        .expect_err("alice's queue is full");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(error_of(&status).kind, ErrorKind::QueueFull);

    // bob's single call, queued behind all of alice's.
    let bob = start(&platform, BOB, request(args(&witness, "b0", 1, 0), "b0")).await;

    let mut alice_ids = Vec::new();
    for (id, rest) in alice {
        let call = tokio::time::timeout(Duration::from_secs(90), rest)
            .await
            .expect("alice's call ends")
            .unwrap()
            .expect("alice's call record");
        result_of(&call);
        alice_ids.push(id);
    }
    let (bob_id, rest) = bob;
    let call = tokio::time::timeout(Duration::from_secs(90), rest)
        .await
        .expect("bob's call ends")
        .unwrap()
        .expect("bob's call record");
    result_of(&call);

    // bob's call went to the worker after alice's running call and at most one of her
    // queued ones (her turn came first), ahead of the other CAP - 1.
    let bob_at = assigned_at(&platform, &bob_id).await;
    let mut before = Vec::new();
    let mut order = vec![(bob_at, "b0".to_string())];
    for (i, id) in alice_ids.iter().enumerate() {
        let at = assigned_at(&platform, id).await;
        order.push((at, format!("a{i}")));
        if at < bob_at {
            before.push(format!("a{i}"));
        }
    }
    order.sort();
    assert!(
        before.len() <= 2,
        "bob's call started after {} of alice's {} calls: {before:?} (order {order:?})",
        before.len(),
        alice_ids.len()
    );
    eprintln!("assigned in order: {order:?}");

    // The refused call was not recorded: alice has exactly her CAP + 1 calls, and the key
    // she was refused under makes a new call now that her queue has drained.
    let calls = platform
        .client()
        .await
        .list_calls(proto::ListCallsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .calls;
    let keyed_over = calls.iter().filter(|c| c.idempotency_key == "over").count();
    assert_eq!(keyed_over, 0, "a refused call was recorded: {calls:?}");
    let of_alice = calls.iter().filter(|c| c.agent == "alice").count();
    assert_eq!(of_alice, CAP + 1, "{calls:?}");
    let again = platform
        .client_with(Some(ALICE), None)
        .await
        .invoke(request(over, "over"))
        .await
        .expect("the refused key, tried again")
        .into_inner();
    result_of(&again);
}
