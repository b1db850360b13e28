//! Code mode: the built-in `code` tool runs a JavaScript program that calls the agent's
//! tools (`await tools.<tool>.<command>(args)`), each as a child call admitted through the
//! gateway as the same agent and recorded in the program's oplog. Against real processes,
//! with an independent witness (an HTTP server on loopback recording each request's
//! idempotency key) that shows no child ran twice:
//!
//! - a program calls two bound tools together (both requests are committed before either
//!   answer) and an unbound one, whose refusal (`permission-denied`) it catches;
//! - a program calling tools 10,000 times ends at the 257th with `tool-call-limit`, and
//!   the next call is served;
//! - the worker running a program is killed (SIGKILL) between two of its tool calls: the
//!   program is replayed on another worker, the first call is answered again by the same
//!   child call, and each ran once;
//! - a tool call held for approval keeps its program waiting across a control plane kill
//!   and restart, and runs once when approved;
//! - a Python program (`code python`) calls the agent's tools by their Python names
//!   (`tools.delta_one.run(...)` for `delta-one`), searches them, catches an unbound one's
//!   refusal as `ToolError`, and ends at its 257th call with `tool-call-limit`.

use crate::common;

use common::witness::Witness;
use common::{Platform, WorkerProcess, error_kind, fixtures, result_of};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toolgrid_proto as proto;

const CODER: &str = "coder-token";
const PLANNER: &str = "planner-token";

/// An `effects` fixture tool named `name` (requests to the witness, `--run` labels them),
/// bound to the coder through `middleware` unless that is `None`.
fn effects_tool(name: &str, port: u16, middleware: Option<&str>) -> String {
    let wasm = fixtures::repo().join("tests/fixtures/tools/effects/effects.wasm");
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: write
  timeout: 60s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: steps, schema: {{type: integer, minimum: 1}}, default: 1}}
        - {{name: work, schema: {{type: integer, minimum: 0}}, default: 0}}
      result: {{type: object, required: [run]}}
      errors:
        - {{name: request-failed, exitCode: 3}}
        - {{name: egress-denied, exitCode: 4}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: {name}-1.0.0}}
spec:
  tool: {name}
  version: 1.0.0
  artifact: {{file: {wasm}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
{binding}"#,
        wasm = wasm.display(),
        binding = middleware
            .map(|m| format!(
                "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\n\
                 metadata: {{name: coder-{name}}}\n\
                 spec: {{agents: [coder], tool: {name}, middleware: [{m}]}}\n"
            ))
            .unwrap_or_default()
    )
}

/// The agent `coder` bound to `code`, `alpha`, `beta` and `gated` (behind an approval);
/// `gamma` exists but is not bound to it.
fn manifests(root: &Path, witness: &Witness, replicas: u32) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let mut text = format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\n\
         spec: {{replicas: {replicas}, slotsPerWorker: 4}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: coder-token}}\nstringData: {{token: {CODER}}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: coder}}\n\
         spec:\n  tokenSecretRef: {{name: coder-token, key: token}}\n  permissions: [{{tools: [\"*\"]}}]\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: coder-code}}\n\
         spec: {{agents: [coder], tool: code}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: Middleware\nmetadata: {{name: needs-ok}}\n\
         spec:\n  approval: {{timeout: 1h, onTimeout: deny}}\n"
    );
    text += &effects_tool("alpha", port, Some(""));
    text += &effects_tool("beta", port, Some(""));
    text += &effects_tool("gated", port, Some("needs-ok"));
    // gamma: a tool like the others, bound to nobody
    text += &effects_tool("gamma", port, None);
    // delta-one: a bound tool whose name a Python program writes as delta_one
    text += &effects_tool("delta-one", port, Some(""));
    // rogue: the code built-in's own module as a tool that does not declare codeMode
    let code_wasm = fixtures::repo().join("builtins/tools/code/code.wasm");
    text += &format!(
        "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {{name: rogue}}\n\
         spec:\n  effect: write\n  timeout: 60s\n  commands:\n    - name: run\n      \
         options: [{{name: code, schema: {{type: string}}}}]\n      result: {{type: object}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: rogue-1.0.0}}\n\
         spec: {{tool: rogue, version: 1.0.0, artifact: {{file: {}}}}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: coder-rogue}}\n\
         spec: {{agents: [coder], tool: rogue}}\n",
        code_wasm.display()
    );
    // planner: code, alpha only as a tool of its own, beta only from programs
    text += &format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: planner-token}}\nstringData: {{token: {PLANNER}}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: planner}}\n\
         spec:\n  tokenSecretRef: {{name: planner-token, key: token}}\n  permissions: [{{tools: [\"*\"]}}]\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: planner-code}}\n\
         spec: {{agents: [planner], tool: code}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: planner-alpha}}\n\
         spec: {{agents: [planner], tool: alpha, exposure: direct}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: planner-beta}}\n\
         spec: {{agents: [planner], tool: beta, exposure: codemode}}\n"
    );
    std::fs::write(dir.join("code.yaml"), text).unwrap();
    dir
}

async fn ready(platform: &Platform) {
    for tool in [
        "code",
        "alpha",
        "beta",
        "gated",
        "gamma",
        "rogue",
        "delta-one",
    ] {
        platform
            .eventually(
                &format!("{tool} is ready"),
                Duration::from_secs(90),
                || async {
                    platform
                        .resource("tools", tool)
                        .await
                        .is_some_and(|r| r.ready == "True")
                },
            )
            .await;
    }
}

/// Runs `code run --code PROGRAM` as the coder, with `key`.
async fn start_program(platform: &Platform, program: &str, key: &str) -> proto::Call {
    run_program_as(platform, CODER, program, key).await
}

/// Runs `code run --code PROGRAM` as the agent of `token`, with `key`.
async fn run_program_as(platform: &Platform, token: &str, program: &str, key: &str) -> proto::Call {
    let mut coder = platform.client_with(Some(token), None).await;
    let request = proto::InvokeRequest {
        tool: "code".into(),
        argv: vec!["run".into(), "--code".into(), program.into()],
        idempotency_key: key.into(),
        ..Default::default()
    };
    // `invoke` waits for the end; a caller that must act meanwhile runs it on a task.
    coder
        .invoke(request)
        .await
        .expect("invoke code")
        .into_inner()
}

/// Runs `code run --code PROGRAM` as the coder on a task, for a test that acts while it
/// runs.
async fn spawn_program(
    platform: &Platform,
    program: &str,
    key: &str,
) -> tokio::task::JoinHandle<Result<proto::Call, tonic::Status>> {
    let mut client = platform.client_with(Some(CODER), None).await;
    let request = proto::InvokeRequest {
        tool: "code".into(),
        argv: vec!["run".into(), "--code".into(), program.into()],
        idempotency_key: key.into(),
        ..Default::default()
    };
    tokio::spawn(async move { client.invoke(request).await.map(|r| r.into_inner()) })
}

/// The calls that made requests the witness saw labelled `run` (the effects fixture POSTs
/// `{"run": RUN, ...}` to /effects and GETs /effects/RUN), by their idempotency keys
/// (`toolgrid-ID-SEQ`).
fn callers_of(witness: &Witness, run: &str) -> BTreeSet<String> {
    witness
        .seen()
        .iter()
        .filter(|s| {
            s.path == format!("/effects/{run}") || s.body.contains(&format!("\"run\":\"{run}\""))
        })
        .filter_map(|s| s.key.as_deref())
        .map(|k| {
            let k = k.strip_prefix("toolgrid-").unwrap_or(k);
            k.rsplit_once('-')
                .map(|(id, _)| id.to_string())
                .unwrap_or_default()
        })
        .collect()
}

fn entries(oplog: &[proto::OplogRecord], kind: &str) -> Vec<Value> {
    oplog
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| serde_json::from_str(&e.payload_json).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_calls_bound_tools_together_and_sees_an_unbound_ones_refusal() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness, 1);
    let platform = Platform::start(root.path(), &dir, &[]);
    ready(&platform).await;
    let base = witness.base();
    let program = format!(
        r#"async function main() {{
  const [a, b] = await Promise.all([
    tools.alpha.run({{base: "{base}", run: "a-1"}}),
    tools.beta.run({{base: "{base}", run: "b-1"}}),
  ]);
  let refused = null;
  try {{ await tools.gamma.run({{base: "{base}", run: "c-1"}}); }}
  catch (e) {{ refused = {{name: e.name, kind: e.kind, message: e.message}}; }}
  console.log("done");
  return {{a: a.run, b: b.run, refused}};
}}
main()"#
    );
    let mut direct = platform.client_with(Some(CODER), None).await;
    let refused = direct
        .invoke(proto::InvokeRequest {
            tool: "gamma".into(),
            args_json: json!({"base": base, "run": "c-0"}).to_string(),
            ..Default::default()
        })
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let call = start_program(&platform, &program, "parallel").await;
    let result = result_of(&call);
    assert_eq!(
        result["result"]["a"],
        "a-1",
        "{result}\n{}",
        platform.logs()
    );
    assert_eq!(result["result"]["b"], "b-1", "{result}");
    let refused = &result["result"]["refused"];
    assert_eq!(
        refused["name"],
        "ToolError",
        "{result}\n{:#?}",
        platform.oplog(&call.id).await
    );
    assert_eq!(refused["kind"], "permission-denied", "{result}");
    assert_eq!(result["output"], "done\n");

    // Each bound tool ran once, as a child call; the unbound one never ran.
    assert_eq!(callers_of(&witness, "a-1").len(), 1);
    assert_eq!(callers_of(&witness, "b-1").len(), 1);
    assert!(callers_of(&witness, "c-1").is_empty());

    // The program's oplog: both requests committed before either answer (they ran
    // together), each answer naming its child call.
    let oplog = platform.oplog(&call.id).await;
    let kinds: Vec<&str> = oplog
        .iter()
        .map(|e| e.kind.as_str())
        .filter(|k| k.starts_with("tool-"))
        .collect();
    assert_eq!(
        &kinds[..3],
        ["tool-call", "tool-call", "tool-result"],
        "{kinds:?}"
    );
    let calls = entries(&oplog, "tool-call");
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0]["idempotencyKey"], format!("{}/1", call.id));
    let results = entries(&oplog, "tool-result");
    assert_eq!(results.len(), 3);
    let children: Vec<String> = results
        .iter()
        .filter_map(|r| r["call"].as_str().map(String::from))
        .collect();
    assert_eq!(
        children.len(),
        2,
        "the refused call has no child: {results:?}"
    );
    let refusal = results.iter().find(|r| r["call"].is_null()).unwrap();
    assert_eq!(refusal["error"]["kind"], "permission-denied");

    // Only a tool that declares codeMode runs programs that call tools: the same module as
    // another tool is refused, and a program may not start another program.
    let mut coder = platform.client_with(Some(CODER), None).await;
    let rogue = coder
        .invoke(proto::InvokeRequest {
            tool: "rogue".into(),
            argv: vec![
                "run".into(),
                "--code".into(),
                format!(r#"tools.alpha.run({{base: "{base}", run: "rogue-1"}}).then(() => "ran", e => e.kind)"#),
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        result_of(&rogue)["result"],
        "permission-denied",
        "{rogue:?}"
    );
    assert!(callers_of(&witness, "rogue-1").is_empty());
    let nested = start_program(
        &platform,
        r#"tools.code.run({code: "1"}).then(() => "ran", e => e.kind)"#,
        "nested-program",
    )
    .await;
    assert_eq!(
        result_of(&nested)["result"],
        "permission-denied",
        "{nested:?}"
    );

    // The children are the agent's own calls, with the keys the program's oplog names.
    for child in &children {
        let record = coder
            .get_call(proto::GetCallRequest {
                id: child.clone(),
                ..Default::default()
            })
            .await
            .expect("the agent reads its child call")
            .into_inner();
        assert!(record.idempotency_key.starts_with(&format!("{}/", call.id)));
        assert!(callers_of(&witness, result_of(&record)["run"].as_str().unwrap()).contains(child));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposure_decides_what_the_model_lists_and_what_programs_may_call() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness, 1);
    let platform = Platform::start(root.path(), &dir, &[]);
    ready(&platform).await;
    let base = witness.base();

    // The model sees code and alpha; beta only inside code's description, typed.
    let listed: Value = platform
        .http_client()
        .get(format!("http://{}/v1/tools", platform.http))
        .bearer_auth(PLANNER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = listed.to_string();
    let names: BTreeSet<String> = listed["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["alpha".to_string(), "code".to_string()]),
        "{text}"
    );
    let code = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "code")
        .unwrap();
    let description = code["description"].as_str().unwrap();
    assert!(description.contains("  beta: {"), "{description}");
    assert!(description.contains("run(args: {"), "{description}");
    assert!(description.contains("\"run\": string"), "{description}");
    assert!(!description.contains("alpha: {"), "{description}");

    // A direct call of beta is refused, naming why.
    let mut planner = platform.client_with(Some(PLANNER), None).await;
    let refused = planner
        .invoke(proto::InvokeRequest {
            tool: "beta".into(),
            args_json: json!({"base": base, "run": "direct-beta"}).to_string(),
            ..Default::default()
        })
        .await
        .expect_err("beta is code-mode only");
    let error = toolgrid_proto::status::error_of(&refused);
    assert_eq!(
        error.kind,
        toolgrid_core::error::ErrorKind::PermissionDenied
    );
    assert!(
        error.message.contains("only through the code tool"),
        "{}",
        error.message
    );

    // A program finds beta by searching (alpha is not a program's), calls it, and is
    // refused alpha.
    let program = format!(
        r#"async function main() {{
  const found = await tools.search("beta effects", 5);
  const b = await tools.beta.run({{base: "{base}", run: "program-beta"}});
  let a = null;
  try {{ await tools.alpha.run({{base: "{base}", run: "program-alpha"}}); }} catch (e) {{ a = e.kind; }}
  return [found, b.run, a];
}}
main()"#
    );
    let call = run_program_as(&platform, PLANNER, &program, "exposure").await;
    let result = &result_of(&call)["result"];
    assert_eq!(result[1], "program-beta", "{call:?}");
    assert_eq!(result[2], "permission-denied", "{call:?}");
    let found = result[0].as_array().unwrap();
    assert_eq!(found.len(), 1, "{result}");
    assert_eq!(found[0]["tool"], "beta");
    assert_eq!(found[0]["command"], "run");
    assert!(
        found[0]["signature"]
            .as_str()
            .unwrap()
            .starts_with("tools.beta.run(args: {"),
        "{result}"
    );
    assert!(callers_of(&witness, "program-alpha").is_empty());
    assert!(callers_of(&witness, "direct-beta").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_calling_tools_ten_thousand_times_ends_at_the_limit() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness, 1);
    let platform = Platform::start(root.path(), &dir, &[]);
    ready(&platform).await;
    // Refused calls are cheap: the program reaches the limit quickly.
    let program = "async function main() { let n = 0; \
         for (let i = 0; i < 10000; i++) { try { await tools.gamma.run({}); } catch (e) { n++; } } \
         return n; } main()";
    let call = start_program(&platform, program, "flood").await;
    assert_eq!(error_kind(&call), "tool-call-limit", "{call:?}");
    let oplog = platform.oplog(&call.id).await;
    assert_eq!(entries(&oplog, "tool-call").len(), 256);

    // A request that is not `{tool, command, args: {...}}` is refused to the program at
    // once (a TypeError), and admits nothing.
    let call = start_program(
        &platform,
        "let e = null; try { tools.alpha.run(5); } catch (x) { e = x.name; } e",
        "bad-args",
    )
    .await;
    assert_eq!(result_of(&call)["result"], "TypeError", "{call:?}");
    assert!(entries(&platform.oplog(&call.id).await, "tool-call").is_empty());

    // A program that loops forever with a tool call in flight ends with cpu-limit.
    let base = witness.base();
    let call = start_program(
        &platform,
        &format!(r#"tools.alpha.run({{base: "{base}", run: "spin"}}); for (;;) {{}}"#),
        "spin",
    )
    .await;
    assert_eq!(error_kind(&call), "cpu-limit", "{call:?}");

    // The next program is served.
    let call = start_program(
        &platform,
        &format!(r#"tools.alpha.run({{base: "{base}", run: "after"}}).then(r => r.run)"#),
        "after",
    )
    .await;
    assert_eq!(result_of(&call)["result"], "after", "{call:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_replayed_after_its_worker_is_killed_repeats_no_tool_call() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness, 0);
    let platform = Platform::start(root.path(), &dir, &["--no-workers", "--lease", "1s"]);
    let mut workers: Vec<WorkerProcess> = (0..2)
        .map(|i| WorkerProcess::start(&platform, &format!("w{i}"), 4, root.path()))
        .collect();
    ready(&platform).await;
    let base = witness.base();
    // A first tool call, a second or so of CPU (no host calls), a second tool call.
    let program = format!(
        r#"async function main() {{
  const first = await tools.alpha.run({{base: "{base}", run: "kill-1"}});
  let x = 0;
  for (let i = 0; i < 20000000; i++) x += i;
  const second = await tools.beta.run({{base: "{base}", run: "kill-2"}});
  return [first.run, second.run];
}}
main()"#
    );
    let runner = spawn_program(&platform, &program, "killed").await;
    // Once the first tool call has made its request, kill the program's worker.
    assert!(
        witness
            .wait_for(Duration::from_secs(60), |seen| seen
                .iter()
                .any(|s| s.path == "/effects/kill-1"))
            .await,
        "the first tool call never ran; {}",
        platform.logs()
    );
    let parent = the_program(&platform).await;
    let holder = parent.worker.clone();
    let index = workers
        .iter()
        .position(|w| w.id == holder)
        .expect("its worker");
    workers[index].kill();

    let call = match runner.await.unwrap() {
        Ok(call) if call.state == proto::CallState::Succeeded as i32 => call,
        Ok(call) => call,
        Err(status) => panic!("{status:?}"),
    };
    let call = if call.state == proto::CallState::Succeeded as i32 {
        call
    } else {
        // The caller's wait may have ended before the failover finished: wait again.
        ended(&platform, &parent.id).await
    };
    assert_eq!(
        result_of(&call)["result"],
        json!(["kill-1", "kill-2"]),
        "{call:?}\n{}",
        platform.logs()
    );
    let oplog = platform.oplog(&call.id).await;
    assert!(
        oplog.iter().any(|e| e.kind == "replay"),
        "the program was not replayed: {:?}",
        oplog.iter().map(|e| &e.kind).collect::<Vec<_>>()
    );
    // Each tool call ran as one child call, whatever the replay sent again.
    assert_eq!(
        callers_of(&witness, "kill-1").len(),
        1,
        "{:?}",
        witness.seen()
    );
    assert_eq!(callers_of(&witness, "kill-2").len(), 1);
    let results = entries(&oplog, "tool-result");
    let children: BTreeSet<String> = results
        .iter()
        .filter_map(|r| r["call"].as_str().map(String::from))
        .collect();
    assert_eq!(children.len(), 2, "{results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_held_for_approval_waits_across_a_control_plane_restart() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness, 1);
    let mut platform = Platform::start(root.path(), &dir, &["--lease", "1s"]);
    ready(&platform).await;
    let base = witness.base();
    let program =
        format!(r#"tools.gated.run({{base: "{base}", run: "gated-1"}}).then(r => r.run)"#);
    let program_task = spawn_program(&platform, &program, "gated").await;
    // The child waits for approval.
    let child = wait_for_child(&platform, "gated").await;
    // Kill the control plane (its workers go with it) and start it again.
    platform.restart(libc::SIGKILL);
    ready(&platform).await;
    drop(program_task);
    let mut admin = platform.client().await;
    let still = admin
        .get_call(proto::GetCallRequest {
            id: child.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(still.state, proto::CallState::AwaitingApproval as i32);
    assert!(
        callers_of(&witness, "gated-1").is_empty(),
        "it ran before approval"
    );

    // Approved, the child runs once and the program, replayed, ends with its value.
    let out = platform.cli(&["approve", &child, "--reason", "fine"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parent = the_program(&platform).await;
    let done = ended(&platform, &parent.id).await;
    assert_eq!(
        result_of(&done)["result"],
        "gated-1",
        "{done:?}\n{}",
        platform.logs()
    );
    assert_eq!(callers_of(&witness, "gated-1").len(), 1);
    let results = entries(&platform.oplog(&parent.id).await, "tool-result");
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["call"], child.as_str());
}

/// The program's own call (the one call of the `code` tool).
async fn the_program(platform: &Platform) -> proto::Call {
    platform
        .client()
        .await
        .list_calls(proto::ListCallsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .calls
        .into_iter()
        .find(|c| c.tool == "code")
        .expect("the program's call")
}

/// Call `id` once it has ended (or as it is after several long waits).
async fn ended(platform: &Platform, id: &str) -> proto::Call {
    let mut admin = platform.client().await;
    let mut call = proto::Call::default();
    for _ in 0..10 {
        call = admin
            .get_call(proto::GetCallRequest {
                id: id.into(),
                wait: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if call.state == proto::CallState::Succeeded as i32
            || call.state == proto::CallState::Failed as i32
        {
            break;
        }
    }
    call
}

/// The id of the child call of `tool` once it waits for approval.
async fn wait_for_child(platform: &Platform, tool: &str) -> String {
    let mut admin = platform.client().await;
    for _ in 0..600 {
        let calls = admin
            .list_calls(proto::ListCallsRequest {
                awaiting_approval: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .calls;
        if let Some(call) = calls.into_iter().find(|c| c.tool == tool) {
            return call.id;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no call of {tool} waits for approval; {}", platform.logs());
}

/// Runs `code python --code PROGRAM` as the coder, with `key`.
async fn run_python(platform: &Platform, program: &str, key: &str) -> proto::Call {
    let mut coder = platform.client_with(Some(CODER), None).await;
    coder
        .invoke(proto::InvokeRequest {
            tool: "code".into(),
            argv: vec!["python".into(), "--code".into(), program.into()],
            idempotency_key: key.into(),
            ..Default::default()
        })
        .await
        .expect("invoke code python")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_program_calls_the_agents_tools_by_their_python_names() {
    if !toolgrid_testkit::require(
        "the python built-in's runtime (builtins/fetch-python.sh)",
        common::python_runtime_present(),
    ) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness, 1);
    // builtins/python's code (with its python command) replaces the JavaScript-only one;
    // the interpreter compiles once per machine, into a cache every run shares.
    let platform = common::python_platform(root.path(), &dir);
    ready(&platform).await;
    // Until it is compiled a call ends `timeout` (the compile goes on, and is cached).
    common::warm_python(&platform, &["call", "code", "python", "--code", "1"]);
    let base = witness.base();
    let program = format!(
        r#"a = tools.alpha.run(base="{base}", run="py-a")
d = tools.delta_one.run({{"base": "{base}", "run": "py-d"}})
found = [f["tool"] for f in tools.search("delta", 5)]
try:
    tools.gamma.run(base="{base}", run="py-c")
    refused = None
except ToolError as e:
    refused = {{"kind": e.kind, "call": e.call}}
print("done")
{{"a": a["run"], "d": d["run"], "found": found, "refused": refused}}"#
    );
    let call = run_python(&platform, &program, "py-tools").await;
    let result = result_of(&call);
    assert_eq!(
        result["result"],
        json!({"a": "py-a", "d": "py-d", "found": ["delta-one"], "refused": {"kind": "permission-denied", "call": null}}),
        "{result}\n{:#?}",
        platform.oplog(&call.id).await
    );
    assert_eq!(result["output"], "done\n");
    // Each bound tool ran once, as a child call; the unbound one never ran.
    assert_eq!(callers_of(&witness, "py-a").len(), 1);
    assert_eq!(callers_of(&witness, "py-d").len(), 1);
    assert!(callers_of(&witness, "py-c").is_empty());
    // Every request (the search's too) is in the program's oplog, answered in order; the
    // children are the agent's own calls.
    let oplog = platform.oplog(&call.id).await;
    let calls = entries(&oplog, "tool-call");
    let named: Vec<&str> = calls.iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(named, ["alpha", "delta_one", "$search", "gamma"]);
    let results = entries(&oplog, "tool-result");
    assert_eq!(results.len(), 4);
    let child = results[1]["call"].as_str().expect("delta-one's child call");
    let mut coder = platform.client_with(Some(CODER), None).await;
    let record = coder
        .get_call(proto::GetCallRequest {
            id: child.to_string(),
            ..Default::default()
        })
        .await
        .expect("the agent reads its child call")
        .into_inner();
    assert_eq!(record.tool, "delta-one");
    assert_eq!(record.idempotency_key, format!("{}/2", call.id));

    // A program calling tools 10,000 times ends at the 257th with tool-call-limit.
    let flood = "for i in range(10000):\n    try:\n        tools.gamma.run()\n    except ToolError:\n        pass\n";
    let call = run_python(&platform, flood, "py-flood").await;
    assert_eq!(error_kind(&call), "tool-call-limit", "{call:?}");
    assert_eq!(
        entries(&platform.oplog(&call.id).await, "tool-call").len(),
        256
    );
}
