//! Result policies on a 1 MiB result, against a real `toolgrid up`: what a model-facing
//! front door returns (`?view=model`, the `modelResult` MCP returns too), the pages of
//! `GET /v1/calls/{id}/result?page=N`, the file in the agent's workspace, and the full
//! result still in the call record. The `flaky` fixture's `big --bytes N` prints about N
//! bytes of JSON full of multi-byte characters.

use crate::common;

use common::{Platform, fixtures};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const ALICE_TOKEN: &str = "alice-token-0123456789";
const BOB_TOKEN: &str = "bob-token-0123456789";
const MIB: u64 = 1 << 20;

/// A Tool running `flaky big` with `resultPolicy` (a YAML flow mapping).
fn big_tool(name: &str, policy: &str) -> String {
    let wasm = fixtures::repo().join("tests/fixtures/tools/flaky/flaky.wasm");
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: read
  timeout: 60s
  resultPolicy: {policy}
  commands:
    - name: big
      options:
        - {{name: bytes, schema: {{type: integer, minimum: 1}}, required: true}}
      result: {{type: object, required: [bytes, items]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: {name}-1.0.0}}
spec:
  tool: {name}
  version: 1.0.0
  artifact: {{file: {wasm}}}
  limits: {{outputBytes: 4Mi}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: {name}-agents}}
spec: {{agents: [alice, bob], tool: {name}}}
"#,
        wasm = wasm.display()
    )
}

fn agent(name: &str, token: &str) -> String {
    format!(
        r#"---
apiVersion: v1
kind: Secret
metadata: {{name: {name}-token}}
stringData: {{token: {token}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: {name}}}
spec:
  tokenSecretRef: {{name: {name}-token, key: token}}
  permissions: [{{tools: ["*"], commands: ["*"]}}]
"#
    )
}

fn manifests(root: &Path) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let pool = "---\napiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\nspec: {replicas: 1, slotsPerWorker: 4}\n";
    let text = [
        pool.to_string(),
        big_tool("big-inline", "{overflow: inline}"),
        big_tool("big-page", "{maxInlineBytes: 100000, overflow: page}"),
        big_tool("big-file", "{overflow: file}"),
        big_tool("big-truncate", "{overflow: truncate}"),
        agent("alice", ALICE_TOKEN),
        agent("bob", BOB_TOKEN),
    ]
    .concat();
    std::fs::write(dir.join("tools.yaml"), text).unwrap();
    dir
}

/// `GET path` on the platform's HTTP port with `token` (none: no authorization).
async fn get(platform: &Platform, token: Option<&str>, path: &str) -> (u16, Value) {
    let mut request = reqwest::Client::new().get(format!("http://{}{path}", platform.http));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Calls `tool big --bytes N` over HTTP with `?view=model` as the holder of `token`.
async fn call_big(platform: &Platform, token: &str, tool: &str, bytes: u64) -> Value {
    let url = format!(
        "http://{}/v1/namespaces/default/tools/{tool}/big:call?view=model",
        platform.http
    );
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(&json!({"args": {"bytes": bytes}}))
        .send()
        .await
        .unwrap();
    let call: Value = response.json().await.unwrap();
    assert_eq!(call["state"], "succeeded", "{}", short(&call));
    call
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    text.chars().take(2000).collect()
}

fn error_kind(body: &Value) -> &str {
    body["error"]["kind"].as_str().unwrap_or_default()
}

/// The full result of a call as its record holds it (`GET /v1/calls/{id}`).
async fn recorded(platform: &Platform, token: &str, id: &str) -> Value {
    let (status, call) = get(platform, Some(token), &format!("/v1/calls/{id}")).await;
    assert_eq!(status, 200);
    call["result"].clone()
}

#[tokio::test]
async fn each_policy_shapes_a_one_mebibyte_result_and_the_record_keeps_it_whole() {
    let root = tempfile::tempdir().unwrap();
    let platform = Platform::start(root.path(), &manifests(root.path()), &[]);

    // inline: the whole result, structured and as text, however large.
    let call = call_big(&platform, ALICE_TOKEN, "big-inline", MIB).await;
    let result = call["result"].clone();
    let text = result.to_string();
    assert!(text.len() as u64 >= MIB);
    let model = &call["modelResult"];
    assert_eq!(model["structured"], result);
    assert_eq!(
        serde_json::from_str::<Value>(model["text"].as_str().unwrap()).unwrap(),
        result
    );
    assert_eq!(model["truncated"], false);

    // truncate: cut at 32 KiB on a character boundary, flagged, with a note.
    let call = call_big(&platform, ALICE_TOKEN, "big-truncate", MIB).await;
    let result = call["result"].clone();
    let text = result.to_string();
    let model = &call["modelResult"];
    assert_eq!(model["truncated"], true);
    assert!(model.get("structured").is_none());
    let shown = model["text"].as_str().unwrap();
    let (cut, note) = shown
        .split_once("\n[truncated:")
        .expect("a note follows the cut");
    assert!(
        cut.len() <= 32 * 1024 && cut.len() > 32 * 1024 - 4,
        "{}",
        cut.len()
    );
    assert!(text.starts_with(cut));
    assert!(note.contains(&format!("of {} bytes", text.len())), "{note}");
    let id = call["id"].as_str().unwrap();
    assert_eq!(recorded(&platform, ALICE_TOKEN, id).await, result);

    // file: the whole result in alice's workspace, and a summary naming it.
    let call = call_big(&platform, ALICE_TOKEN, "big-file", MIB).await;
    let result = call["result"].clone();
    let id = call["id"].as_str().unwrap();
    let path = format!("tool-results/{id}.json");
    let model = &call["modelResult"];
    assert_eq!(model["file"], path);
    let summary: Value = serde_json::from_str(model["text"].as_str().unwrap()).unwrap();
    assert_eq!(summary["file"], path);
    assert_eq!(summary["bytes"], result.to_string().len());
    assert_eq!(summary["keys"], json!(["bytes", "items"]));
    assert!(model["text"].as_str().unwrap().len() < 1024);
    let out = platform.cli(&["workspace", "cat", "alice", &path], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, result.to_string().into_bytes());
    // Asked again (MCP may), the head already has the file: no new version.
    let history = |platform: &Platform| {
        let out = platform.cli(&["workspace", "history", "alice", "-o", "json"], None);
        serde_json::from_slice::<Vec<Value>>(&out.stdout)
            .unwrap()
            .len()
    };
    let versions = history(&platform);
    let (_, again) = get(
        &platform,
        Some(ALICE_TOKEN),
        &format!("/v1/calls/{id}?view=model"),
    )
    .await;
    assert_eq!(again["modelResult"]["file"], path);
    assert_eq!(history(&platform), versions);
    // Bob's workspace has no such file.
    let out = platform.cli(&["workspace", "cat", "bob", &path], None);
    assert!(!out.status.success());
    assert_eq!(recorded(&platform, ALICE_TOKEN, id).await, result);

    // An operator's call has no workspace: the file policy falls back to pages.
    let url = format!(
        "http://{}/v1/namespaces/default/tools/big-file/big:call?view=model",
        platform.http
    );
    let call: Value = platform
        .http_client()
        .post(url)
        .json(&json!({"args": {"bytes": MIB}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(call["state"], "succeeded");
    assert!(call["modelResult"].get("file").is_none());
    assert_eq!(call["modelResult"]["page"]["page"], 0);
    assert!(call["modelResult"]["page"]["pages"].as_u64().unwrap() > 1);
}

#[tokio::test]
async fn a_paged_result_reads_back_whole_and_only_by_its_caller() {
    let root = tempfile::tempdir().unwrap();
    let platform = Platform::start(root.path(), &manifests(root.path()), &[]);

    let call = call_big(&platform, ALICE_TOKEN, "big-page", MIB).await;
    let result = call["result"].clone();
    let id = call["id"].as_str().unwrap().to_string();
    let model = &call["modelResult"];
    assert!(model.get("structured").is_none());
    let first = model["text"].as_str().unwrap().to_string();
    assert!(first.len() <= 100_000);
    let pages = model["page"]["pages"].as_u64().unwrap();
    assert!(
        pages >= 11,
        "{pages} pages of at most 100000 bytes for 1 MiB"
    );
    assert_eq!(model["page"]["page"], 0);
    assert_eq!(
        model["page"]["next"],
        format!("toolgrid://calls/{id}/result?page=1")
    );

    // Every page over HTTP: they concatenate to exactly the result's JSON text.
    let mut text = String::new();
    let mut next = Some(format!("/v1/calls/{id}/result?page=0"));
    let mut seen: u64 = 0;
    while let Some(path) = next.take() {
        let (status, page) = get(&platform, Some(ALICE_TOKEN), &path).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["page"], seen);
        assert_eq!(page["pages"], pages);
        let chunk = page["text"].as_str().unwrap();
        assert!(chunk.len() <= 100_000);
        if seen == 0 {
            assert_eq!(chunk, first, "page 0 is the model's first page");
        }
        text.push_str(chunk);
        seen += 1;
        next = page["next"].as_str().map(|uri| {
            let (call, n) = toolgrid_control_plane::gateway::results::parse_page_uri(uri).unwrap();
            assert_eq!(call, id);
            format!("/v1/calls/{call}/result?page={n}")
        });
    }
    assert_eq!(seen, pages);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), result);
    assert_eq!(text.len(), result.to_string().len());

    // A page past the end, a page that is no number, another agent, no token.
    let (status, body) = get(
        &platform,
        Some(ALICE_TOKEN),
        &format!("/v1/calls/{id}/result?page={pages}"),
    )
    .await;
    assert_eq!((status, error_kind(&body)), (404, "not-found"), "{body}");
    for bad in ["x", "-1", "1.5", "99999999999"] {
        let (status, body) = get(
            &platform,
            Some(ALICE_TOKEN),
            &format!("/v1/calls/{id}/result?page={bad}"),
        )
        .await;
        assert_eq!(
            (status, error_kind(&body)),
            (400, "invalid-argument"),
            "{bad}: {body}"
        );
    }
    let (status, body) = get(
        &platform,
        Some(BOB_TOKEN),
        &format!("/v1/calls/{id}/result?page=0"),
    )
    .await;
    assert_eq!((status, error_kind(&body)), (404, "not-found"), "{body}");
    let (status, body) = get(&platform, None, &format!("/v1/calls/{id}/result?page=0")).await;
    assert_eq!(
        (status, error_kind(&body)),
        (401, "unauthenticated"),
        "{body}"
    );
    let (status, body) = get(
        &platform,
        Some(ALICE_TOKEN),
        "/v1/calls/no-such-call/result?page=0",
    )
    .await;
    assert_eq!((status, error_kind(&body)), (404, "not-found"), "{body}");

    // A view that is neither `model` nor `call` is refused by name.
    let (status, body) = get(
        &platform,
        Some(ALICE_TOKEN),
        &format!("/v1/calls/{id}?view=bogus"),
    )
    .await;
    assert_eq!(
        (status, error_kind(&body)),
        (400, "invalid-argument"),
        "{body}"
    );

    // The record keeps the whole result, over HTTP and gRPC.
    assert_eq!(recorded(&platform, ALICE_TOKEN, &id).await, result);
    let mut client = platform.client().await;
    let got = client
        .get_call(toolgrid_proto::GetCallRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_str::<Value>(&got.result_json).unwrap(),
        result
    );
}
