//! An agent cannot get a reference-only secret's value back through a tool's arguments.
//!
//! The attack: the agent passes `${secret:api-token}` as an argument and on stdin to a tool
//! that puts its input into the outgoing URL, a header (`authorization` among them) and the
//! body, and shows whatever comes back in its result, a progress report and an error. The
//! upstream (the loopback witness's `/echo-all`) reflects the whole request, raw and
//! base64-encoded. Before, the host substituted the caller's reference as the request left,
//! and the echo carried the value back (base64 got past the redaction of exact values).
//!
//! Now: only the headers the release declares on its egress rule are substituted, so the
//! upstream gets the caller's text as written; the declared header still delivers the value
//! (the witness sees it) and a tool header of that name does not replace it; and what the
//! declared value brings back, raw or encoded, is scrubbed from everything the agent reads
//! (result, progress events, error). All through `toolgrid up` from manifests, the agent
//! calling over HTTP with its own token.

use crate::common;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use common::Platform;
use common::fixtures;
use common::witness::Witness;

/// The readable secret: usable by reference, never seen by the tool or the agent.
const TOKEN: &str = "s3cr3t-value-7Qx9-exfil";
/// The agent's bearer token.
const AGENT_TOKEN: &str = "exfil-agent-token-9Kq2";
/// What the agent smuggles in.
const SMUGGLED: &str = "${secret:api-token}";

/// Every form of the value an agent could decode back: the value, hex, base64 and
/// base64url of it alone and inside the echoed request (at each alignment), and its
/// percent-encoding.
fn forms_of_the_value() -> Vec<String> {
    let mut forms = vec![
        TOKEN.to_string(),
        hex::encode(TOKEN),
        hex::encode_upper(TOKEN),
    ];
    for prefix in ["", "a", "ab", "Bearer "] {
        let whole = format!("{prefix}{TOKEN}");
        for encoded in [STANDARD.encode(&whole), URL_SAFE_NO_PAD.encode(&whole)] {
            // The characters that depend on the value alone.
            let skip = (8 * prefix.len()).div_ceil(6);
            let end = (8 * whole.len()) / 6;
            forms.push(encoded[skip..end].to_string());
        }
    }
    forms
}

#[track_caller]
fn assert_no_value(what: &str, text: &str) {
    for form in forms_of_the_value() {
        assert!(
            !text.contains(&form),
            "{what} holds the secret's value or an encoding of it ({form}):\n{text}"
        );
    }
}

fn manifests(root: &std::path::Path, witness: &Witness) -> std::path::PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let wasm = fixtures::repo().join("tests/fixtures/tools/secrets/secrets.wasm");
    std::fs::write(
        dir.join("exfil.yaml"),
        format!(
            r#"apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: default}}
spec: {{replicas: 1, slotsPerWorker: 2}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: relay}}
spec:
  effect: read
  timeout: 60s
  repeatWindow: 0s
  commands:
    - name: relay
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: text, schema: {{type: string}}}}
      flags:
        - {{name: fail}}
      stdin: {{schema: {{type: string}}}}
      result: {{type: object}}
      errors:
        - {{name: request-failed, exitCode: 3}}
        - {{name: denied, exitCode: 4}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: relay-1.0.0}}
spec:
  tool: relay
  version: 1.0.0
  artifact: {{file: {wasm}}}
  network:
    egress:
    - host: 127.0.0.1
      ports: [{port}]
      allowPrivate: true
      headers: {{authorization: "Bearer ${{secret:api-token}}"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: agent-secrets}}
stringData: {{api-token: {TOKEN}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: agent-token}}
stringData: {{token: {AGENT_TOKEN}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: mallory}}
spec:
  tokenSecretRef: {{name: agent-token, key: token}}
  permissions: [{{tools: ["*"], commands: ["*"]}}]
  secretRef: {{name: agent-secrets}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: mallory-relay}}
spec:
  agents: [mallory]
  tool: relay
  secretKeysReadable: [api-token]
"#,
            wasm = wasm.display()
        ),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_get_a_secret_back_through_arguments_even_encoded_by_an_echo() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &dir, &[]);
    let http = reqwest::Client::new();
    let url = format!(
        "http://{}/v1/namespaces/default/tools/relay/relay:call",
        platform.http
    );

    // 1. Succeeding: the result and the progress events, as the agent streams them.
    let streamed = http
        .post(&url)
        .bearer_auth(AGENT_TOKEN)
        .header("accept", "text/event-stream")
        .json(&serde_json::json!({
            "args": {"base": witness.base(), "text": SMUGGLED},
            "stdin": format!("stdin says {SMUGGLED}"),
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    let streamed = streamed.text().await.unwrap();
    assert!(
        streamed.contains("event: progress") && streamed.contains("relayed:"),
        "the progress report reached the agent: {streamed}"
    );
    assert!(
        streamed.contains("succeeded") && streamed.contains("[secret]"),
        "the call succeeded, its echo scrubbed: {streamed}"
    );
    assert_no_value("what the agent streamed (result and progress)", &streamed);

    // 2. Failing: the echo goes to stderr, the call ends `request-failed`.
    let failed = http
        .post(&url)
        .bearer_auth(AGENT_TOKEN)
        .json(&serde_json::json!({
            "args": {"base": witness.base(), "text": SMUGGLED, "fail": true},
            "stdin": SMUGGLED,
        }))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let failed_call: serde_json::Value = serde_json::from_str(&failed).unwrap();
    assert_eq!(failed_call["state"], "failed", "{failed}");
    assert_eq!(failed_call["error"]["kind"], "tool-error", "{failed}");
    assert_eq!(
        failed_call["error"]["name"], "request-failed",
        "the tool's declared error: {failed}"
    );
    assert!(
        failed_call["error"]["stderrTail"]
            .as_str()
            .is_some_and(|tail| tail.contains("base64") && tail.contains("[secret]")),
        "the echo reached the error, scrubbed: {failed}"
    );
    assert_no_value("the failed call's answer", &failed);

    // 3. What the agent reads back afterwards: each call as stored.
    for id in [
        streamed_call_id(&streamed),
        failed_call["id"].as_str().unwrap().to_string(),
    ] {
        let call = http
            .get(format!("http://{}/v1/calls/{id}", platform.http))
            .bearer_auth(AGENT_TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(call.contains(&id), "{call}");
        assert_no_value("the stored call the agent reads", &call);
        // The oplog keeps the echoed responses raw (a replay returns them as recorded):
        // the operator reads the value in them, the agent reads them scrubbed.
        let oplog = |token: String| {
            let http = http.clone();
            let url = format!("http://{}/v1/calls/{id}/oplog", platform.http);
            async move {
                let answer = http.get(url).bearer_auth(token).send().await.unwrap();
                assert_eq!(answer.status(), 200);
                let oplog: serde_json::Value = answer.json().await.unwrap();
                with_bodies_decoded(&oplog)
            }
        };
        let raw = oplog(platform.admin_token()).await;
        assert!(
            raw.contains("http-response")
                && forms_of_the_value().iter().any(|form| raw.contains(form)),
            "the operator's raw oplog holds the echoed value (encoded as echoed): {raw}"
        );
        let agents = oplog(AGENT_TOKEN.to_string()).await;
        assert!(
            agents.contains("http-response") && agents.contains("[secret]"),
            "the agent's oplog holds the echo, scrubbed: {agents}"
        );
        assert_no_value("the oplog the agent reads", &agents);
    }

    // The upstream: the caller's text arrived as written wherever the tool put it (URL,
    // x-input, body), never substituted; the declared header delivered the value, and the
    // tool's own `authorization: Bearer ${secret:api-token}` did not replace it.
    let seen = witness.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for request in &seen {
        assert_eq!(request.path, "/echo-all");
        assert!(
            request.uri.contains(SMUGGLED) && !request.uri.contains(TOKEN),
            "the URL as written: {}",
            request.uri
        );
        let headers = |name: &str| -> Vec<&str> {
            request
                .headers
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(headers("x-input"), [SMUGGLED], "the header as written");
        assert_eq!(
            headers("authorization"),
            [format!("Bearer {TOKEN}").as_str()],
            "the declared header, once, with the value"
        );
        assert!(
            request.body.starts_with(&format!("{SMUGGLED}\n"))
                && request.body.ends_with(SMUGGLED)
                && !request.body.contains(TOKEN),
            "the body as written: {}",
            request.body
        );
    }
}

/// The call's id in a `text/event-stream` answer (its `result` event, the call record).
fn streamed_call_id(body: &str) -> String {
    body.split("\n\n")
        .filter(|block| block.lines().any(|line| line.trim() == "event: result"))
        .find_map(|block| {
            block
                .lines()
                .find_map(|line| line.strip_prefix("data:"))
                .and_then(|data| serde_json::from_str::<serde_json::Value>(data.trim()).ok())
                .and_then(|call| call["id"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| panic!("no result event in the stream: {body}"))
}

/// `oplog` as text, followed by every recorded response body (`bodyBase64`) decoded: what
/// the reader can see once it decodes what it was given.
fn with_bodies_decoded(oplog: &serde_json::Value) -> String {
    fn bodies(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("bodyBase64", serde_json::Value::String(body)) => {
                            let bytes = STANDARD.decode(body).expect("bodyBase64 is base64");
                            out.push('\n');
                            out.push_str(&String::from_utf8_lossy(&bytes));
                        }
                        _ => bodies(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| bodies(v, out)),
            _ => {}
        }
    }
    let mut text = oplog.to_string();
    bodies(oplog, &mut text);
    text
}
