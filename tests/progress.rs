//! Tool progress: the `toolgrid.progress` import (preview 1) and the
//! `toolgrid:tool/progress` WIT interface (components), the idle deadline progress restarts
//! up to `maxTimeout`, and progress reaching callers (gRPC `InvokeStream`, HTTP
//! `text/event-stream`, the oplog, `toolgrid call --progress`).
//!
//! The tool is the `slow` fixture (tests/fixtures/tools/slow): per step it reports progress
//! (with `--progress`), sleeps, and makes one request to the witness. Tests assert outcome
//! kinds and what callers saw, never durations: the margins (steps of 0.4 s against a
//! timeout of 2.5 s) leave a noisy machine plenty of room.

use crate::common;

use common::fixtures;
use common::witness::Witness;
use common::{Platform, error_kind, result_of};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toolgrid_core::call::OplogEntry;
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;
use toolgrid_sandbox::RunRequest;
use toolgrid_sandbox::runtime::MemorySink;
use toolgrid_store::RunLimits;

fn slow_wasm() -> PathBuf {
    fixtures::repo().join("tests/fixtures/tools/slow/slow.wasm")
}

fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

// ---------------------------------------------------------------------------------------
// In-process runtime: the import, its caps, replay, and the worker's idle timer.

fn slow_request(witness: &Witness, args: &[&str], sink: Arc<MemorySink>) -> RunRequest {
    let mut argv: Vec<String> = ["slow", "run", "--base", &witness.base(), "--run", "r1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(args.iter().map(|s| s.to_string()));
    RunRequest {
        call_id: "progress-call".into(),
        attempt: 1,
        argv,
        limits: RunLimits {
            memory_bytes: 64 << 20,
            cpu_time_ms: 60_000,
            output_bytes: 1 << 20,
            timeout_ms: 60_000,
            max_timeout_ms: 60_000,
            ..RunLimits::default()
        },
        repeatable: true,
        egress: vec![toolgrid_api::EgressRule {
            host: "127.0.0.1".into(),
            ports: vec![witness.addr.port()],
            allow_private: true,
            headers: Default::default(),
        }],
        sink: Some(sink),
        idle_timeout_ms: 60_000,
        ..RunRequest::default()
    }
}

async fn compiled_slow(runtime: &toolgrid_sandbox::Runtime) -> toolgrid_sandbox::Compiled {
    let bytes = std::fs::read(slow_wasm()).unwrap();
    runtime.compile(&digest_of(&bytes), bytes).await.unwrap()
}

fn progress_entries(entries: &[OplogEntry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| match e {
            OplogEntry::Progress(p) => Some(p.message.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_module_reports_progress_that_is_recorded_streamed_bounded_and_replayed() {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = fixtures::runtime(cache.path());
    let compiled = compiled_slow(&runtime).await;
    let sink = Arc::new(MemorySink::default());
    let request = slow_request(
        &witness,
        &[
            "--steps",
            "3",
            "--sleep-ms",
            "0",
            "--progress",
            "--long",
            "--flood",
            "1000",
        ],
        sink.clone(),
    );
    let outcome = runtime.run(&compiled, request.clone()).await;
    assert!(
        outcome.failure.is_none(),
        "{:?} {}",
        outcome.failure,
        String::from_utf8_lossy(&outcome.stderr_tail)
    );
    let result: Value = serde_json::from_slice(&outcome.stdout).unwrap();
    // 1000 floods, one long message and 3 steps: the cap of 1000 keeps the floods only.
    assert_eq!(result["dropped"], 4, "{result}");
    let streamed = sink.progress.lock().unwrap().clone();
    assert_eq!(streamed.len(), 1000);
    assert_eq!(streamed[0], "flood 1");
    assert_eq!(streamed[999], "flood 1000");
    // Everything streamed is recorded, in order (committed before the requests, the rest
    // buffered with the result).
    let mut recorded = sink.entries.lock().unwrap().clone();
    recorded.extend(outcome.log.take_pending());
    assert_eq!(progress_entries(&recorded), streamed);

    // A replay of that oplog answers every report from it: nothing is streamed again.
    let replay: Vec<OplogEntry> = recorded
        .into_iter()
        .filter(|e| e.kind().is_host())
        .collect();
    let again = Arc::new(MemorySink::default());
    let mut replayed = request.clone();
    replayed.sink = Some(again.clone());
    replayed.replay = replay;
    replayed.attempt = 2;
    let outcome = runtime.run(&compiled, replayed).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert!(again.progress.lock().unwrap().is_empty());
    assert!(again.entries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_long_message_is_cut_to_1_kib_and_a_different_report_in_replay_diverges() {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = fixtures::runtime(cache.path());
    let compiled = compiled_slow(&runtime).await;
    let sink = Arc::new(MemorySink::default());
    let request = slow_request(
        &witness,
        &["--steps", "1", "--sleep-ms", "0", "--long"],
        sink.clone(),
    );
    let outcome = runtime.run(&compiled, request.clone()).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let streamed = sink.progress.lock().unwrap().clone();
    assert_eq!(streamed, ["L".repeat(1024)]);

    // The recorded run reported "step 1 of 1"; this one reports the long message instead.
    let recorded = vec![OplogEntry::Progress(toolgrid_core::call::ProgressReport {
        message: "step 1 of 1".into(),
    })];
    let mut replayed = request;
    replayed.replay = recorded;
    replayed.sink = Some(Arc::new(MemorySink::default()));
    let outcome = runtime.run(&compiled, replayed).await;
    let failure = outcome.failure.expect("diverged");
    assert_eq!(
        failure.kind,
        ErrorKind::ReplayDivergence,
        "{}",
        failure.message
    );
}

/// Runs `slow` for 8 steps of 400 ms (3.2 s in all) with an idle timeout of 2.5 s.
async fn timed_run(progress: bool, max_ms: u64, repeatable: bool) -> toolgrid_sandbox::RunOutcome {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = fixtures::runtime(cache.path());
    let compiled = compiled_slow(&runtime).await;
    let mut args = vec!["--steps", "8", "--sleep-ms", "400"];
    if progress {
        args.push("--progress");
    }
    let mut request = slow_request(&witness, &args, Arc::new(MemorySink::default()));
    request.limits.timeout_ms = 2_500;
    request.limits.max_timeout_ms = max_ms;
    request.idle_timeout_ms = 2_500;
    request.repeatable = repeatable;
    runtime.run(&compiled, request).await
}

#[tokio::test]
async fn the_worker_timer_restarts_on_progress_up_to_max_timeout_and_no_further() {
    // Reporting progress every step, it outlives its timeout.
    let outcome = timed_run(true, 60_000, true).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert_eq!(outcome.exit_code, 0);
    // The same without progress is cut at the timeout.
    let outcome = timed_run(false, 60_000, true).await;
    assert_eq!(
        outcome.failure.map(|f| f.kind),
        Some(ErrorKind::Timeout),
        "no progress"
    );
    // With progress but a maxTimeout shorter than the run: cut at the maxTimeout.
    let outcome = timed_run(true, 2_600, true).await;
    assert_eq!(
        outcome.failure.map(|f| f.kind),
        Some(ErrorKind::Timeout),
        "past maxTimeout"
    );
    // A write tool cut off after its requests went out: its outcome is unknown.
    let outcome = timed_run(false, 60_000, false).await;
    assert_eq!(
        outcome.failure.map(|f| f.kind),
        Some(ErrorKind::OutcomeUnknown)
    );
}

/// A component that imports `toolgrid:tool/progress@0.1.0` (`wit/tool.wit`) and reports
/// "hello" then "world" from its `wasi:cli/run` export.
const PROGRESS_COMPONENT: &str = r#"(component
  (import "toolgrid:tool/progress@0.1.0" (instance $progress
    (export "report" (func (param "message" string)))))
  (core module $memory (memory (export "memory") 1))
  (core instance $mem (instantiate $memory))
  (alias core export $mem "memory" (core memory $m))
  (alias export $progress "report" (func $report))
  (core func $report_lowered (canon lower (func $report) (memory $m)))
  (core instance $host (export "report" (func $report_lowered)))
  (core module $tool
    (import "host" "report" (func $report (param i32 i32)))
    (import "env" "memory" (memory 1))
    (data (i32.const 16) "hello")
    (data (i32.const 32) "world")
    (func (export "run") (result i32)
      (call $report (i32.const 16) (i32.const 5))
      (call $report (i32.const 32) (i32.const 5))
      (i32.const 0)))
  (core instance $i (instantiate $tool (with "host" (instance $host)) (with "env" (instance $mem))))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $run_instance (export "run" (func $run)))
  (export "wasi:cli/run@0.2.0" (instance $run_instance)))"#;

#[tokio::test]
async fn a_component_reports_progress_through_the_wit_interface() {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = fixtures::runtime(cache.path());
    let bytes = wat::parse_str(PROGRESS_COMPONENT).unwrap();
    let compiled = runtime.compile(&digest_of(&bytes), bytes).await.unwrap();
    assert_eq!(compiled.kind(), "component");
    let sink = Arc::new(MemorySink::default());
    let outcome = runtime
        .run(&compiled, slow_request(&witness, &[], sink.clone()))
        .await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(*sink.progress.lock().unwrap(), ["hello", "world"]);
    assert_eq!(
        progress_entries(&outcome.log.take_pending()),
        ["hello", "world"]
    );
    // The published WIT names the interface the runtime links.
    let wit = std::fs::read_to_string(fixtures::repo().join("wit/tool.wit")).unwrap();
    assert!(wit.contains("package toolgrid:tool@0.1.0;"));
    assert!(wit.contains("interface progress"));
    assert!(wit.contains("report: func(message: string);"));
    assert_eq!(
        toolgrid_sandbox::runtime::PROGRESS_INTERFACE,
        "toolgrid:tool/progress@0.1.0"
    );
}

// ---------------------------------------------------------------------------------------
// A real platform: the scheduler's deadline, and progress reaching callers.

/// `slow` (effect read) with a timeout of 2.5 s and a maxTimeout of 20 s, and `slow-capped`
/// (the same with a maxTimeout of 2.6 s); one worker with two slots.
fn manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let wasm = slow_wasm();
    let tool = |name: &str, max: &str| {
        format!(
            r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: read
  timeout: 2500ms
  maxTimeout: {max}
  repeatWindow: 0s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: steps, schema: {{type: integer, minimum: 1}}, default: 5}}
        - {{name: sleep-ms, schema: {{type: integer, minimum: 0}}, default: 100}}
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
"#,
            wasm = wasm.display()
        )
    };
    let mut text =
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\n\
                    spec: {replicas: 1, slotsPerWorker: 2}\n"
            .to_string();
    text += &tool("slow", "20s");
    text += &tool("slow-capped", "2600ms");
    std::fs::write(dir.join("slow.yaml"), text).unwrap();
    dir
}

fn request(
    tool: &str,
    witness: &Witness,
    run: &str,
    steps: u32,
    progress: bool,
) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: tool.into(),
        command: "run".into(),
        args_json: json!({
            "base": witness.base(), "run": run, "steps": steps, "sleep-ms": 400,
            "progress": progress,
        })
        .to_string(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_extends_the_deadline_up_to_max_timeout_and_reaches_every_caller() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let platform = Platform::start(root.path(), &manifests(root.path(), &witness), &[]);
    platform
        .eventually(
            "the releases to be ready",
            Duration::from_secs(60),
            || async {
                platform
                    .resource("ToolRelease", "slow-capped-1.0.0")
                    .await
                    .is_some_and(|r| r.ready == "True")
            },
        )
        .await;

    // gRPC InvokeStream: 20 steps of 0.4 s (8 s) against a timeout of 2.5 s succeed
    // because each step reports progress: the worker's timer restarts, and so does the
    // scheduler's deadline (without it the call would be failed at 2.5 s + the 5 s grace).
    // The stream carries each report.
    let mut client = platform.client().await;
    let mut stream = client
        .invoke_stream(request("slow", &witness, "grpc", 20, true))
        .await
        .expect("invoke stream")
        .into_inner();
    let mut reports = Vec::new();
    let mut last = None;
    while let Some(event) = stream.message().await.expect("stream") {
        match event.event {
            Some(proto::invoke_event::Event::Progress(p)) if p.stage == "progress" => {
                reports.push(p.message)
            }
            Some(proto::invoke_event::Event::Call(call)) => last = Some(call),
            _ => {}
        }
    }
    let call = last.expect("the call at the end of the stream");
    assert_eq!(result_of(&call)["steps"], 20);
    let expected: Vec<String> = (1..=20).map(|i| format!("step {i} of 20")).collect();
    assert_eq!(reports, expected);
    // And the oplog records them.
    let recorded: Vec<String> = platform
        .oplog(&call.id)
        .await
        .into_iter()
        .filter(|e| e.kind == "progress")
        .map(|e| {
            let payload: Value = serde_json::from_str(&e.payload_json).unwrap();
            payload["message"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(recorded, expected);

    // The same run without progress is cut at its timeout.
    let call = platform
        .invoke(request("slow", &witness, "quiet", 8, false))
        .await
        .expect("invoke");
    assert_eq!(error_kind(&call), "timeout");
    // With progress, but past a maxTimeout of 2.6 s: cut too.
    let call = platform
        .invoke(request("slow-capped", &witness, "capped", 8, true))
        .await
        .expect("invoke");
    assert_eq!(error_kind(&call), "timeout");

    // HTTP with Accept: text/event-stream: `progress` events, then `result`.
    let response = platform
        .http_client()
        .post(format!(
            "http://{}/v1/namespaces/default/tools/slow/run:call",
            platform.http
        ))
        .header("accept", "text/event-stream")
        .json(
            &json!({"args": {"base": witness.base(), "run": "sse", "steps": 3,
                               "sleep-ms": 50, "progress": true}}),
        )
        .send()
        .await
        .expect("SSE request");
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = parse_sse(&response.text().await.unwrap());
    let progress: Vec<String> = events
        .iter()
        .filter(|(event, _)| event == "progress")
        .filter(|(_, data)| data["stage"] == "progress")
        .map(|(_, data)| data["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(progress, ["step 1 of 3", "step 2 of 3", "step 3 of 3"]);
    let (last_event, record) = events.last().expect("events");
    assert_eq!(last_event, "result");
    assert_eq!(record["state"], "succeeded", "{record}");
    assert_eq!(record["result"]["steps"], 3);

    // A refused call is one `error` event with the envelope.
    let response = platform
        .http_client()
        .post(format!(
            "http://{}/v1/namespaces/default/tools/slow/run:call",
            platform.http
        ))
        .header("accept", "text/event-stream")
        .json(&json!({"args": {"run": "no-base"}}))
        .send()
        .await
        .unwrap();
    let events = parse_sse(&response.text().await.unwrap());
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "error");
    assert_eq!(events[0].1["error"]["kind"], "invalid-argument");
    // Unauthenticated: 401 before any stream.
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/namespaces/default/tools/slow/run:call",
            platform.http
        ))
        .header("accept", "text/event-stream")
        .json(&json!({"args": {"base": witness.base(), "run": "x"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);

    // `toolgrid call --progress` prints the tool's reports on stderr (the tool's own
    // `--progress` flag goes after `--`, where every word is the tool's).
    let base = witness.base();
    let output = platform.cli(
        &[
            "call",
            "slow",
            "run",
            "--progress",
            "--",
            "--base",
            &base,
            "--run",
            "cli",
            "--steps",
            "2",
            "--sleep-ms",
            "0",
            "--progress",
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("toolgrid: progress: step 1 of 2"),
        "{stderr}"
    );
    assert!(
        stderr.contains("toolgrid: progress: step 2 of 2"),
        "{stderr}"
    );
}

/// The events of a `text/event-stream` body: (event name, data as JSON).
fn parse_sse(body: &str) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    for block in body.split("\n\n") {
        let mut name = String::from("message");
        let mut data = String::new();
        for line in block.lines() {
            if let Some(value) = line.strip_prefix("event:") {
                name = value.trim().to_string();
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push_str(value.trim_start());
            }
        }
        if !data.is_empty() {
            events.push((name, serde_json::from_str(&data).expect("data is JSON")));
        }
    }
    events
}
