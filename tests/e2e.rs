//! End to end: `toolgrid up` as a separate process with two worker processes, called over
//! gRPC, HTTP and the CLI.

use crate::common;

use common::fixtures::{self, tool_manifest, write_wat};
use common::{Platform, error_kind, result_of};
use serde_json::{Value, json};
use std::time::Duration;
use toolgrid_core::error::ErrorKind;
use toolgrid_proto as proto;

fn kinds(entries: &[proto::OplogRecord]) -> Vec<&str> {
    entries.iter().map(|e| e.kind.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_run_over_grpc_http_and_the_cli() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let platform = Platform::start(root.path(), &manifests, &[]);

    // Both workers of the default pool attach.
    platform
        .eventually("two attached workers", Duration::from_secs(30), || async {
            platform
                .resource("pools", "default")
                .await
                .is_some_and(|row| {
                    row.ready == "True"
                        && row
                            .columns
                            .iter()
                            .any(|c| c.name == "Attached" && c.value == "2")
                })
        })
        .await;

    // A preview 1 module with positionals and a result schema.
    let call = platform
        .call("semver", &["compare", "1.2.0", "1.10.0"])
        .await
        .unwrap();
    assert_eq!(
        result_of(&call),
        json!({"order": -1, "a": "1.2.0", "b": "1.10.0"})
    );
    assert_eq!(call.tool, "semver");
    assert_eq!(call.command, "compare");
    assert_eq!(call.release, "semver-1.0.0");
    assert!(call.release_digest.starts_with("sha256:"));

    // Options with defaults and enums.
    let call = platform
        .call("semver", &["bump", "1.4.2", "--part", "minor"])
        .await
        .unwrap();
    assert_eq!(result_of(&call)["version"], "1.5.0");
    let call = platform.call("semver", &["bump", "1.4.2"]).await.unwrap();
    assert_eq!(
        result_of(&call)["version"],
        "1.4.3",
        "the default --part is patch"
    );

    // stdin, an option and a flag.
    let call = platform
        .invoke(proto::InvokeRequest {
            tool: "textstats".into(),
            argv: vec!["--top".into(), "1".into(), "--ignore-case".into()],
            stdin: Some(b"The cat saw the dog.\nthe end\n".to_vec()),
            ..Default::default()
        })
        .await
        .unwrap();
    let stats = result_of(&call);
    assert_eq!(stats["lines"], 2);
    assert_eq!(stats["words"], 7);
    assert_eq!(stats["top"], json!([{"word": "the", "count": 3}]));

    // A declared error: the exit code maps to its name.
    let call = platform
        .call("semver", &["compare", "1.2", "1.0.0"])
        .await
        .unwrap();
    assert_eq!(error_kind(&call), "tool-error");
    let error = call.error.clone().unwrap();
    assert_eq!(
        (error.name.as_str(), error.exit_code),
        ("invalid-version", 3)
    );
    assert!(error.message.contains("1.2"), "{}", error.message);

    // A preview 2 component that reads the clock and random numbers: both are in the oplog.
    let call = platform
        .call("uuid", &["generate", "--count", "3"])
        .await
        .unwrap();
    let uuids = result_of(&call)["uuids"].as_array().unwrap().clone();
    assert_eq!(uuids.len(), 3);
    let oplog = platform.oplog(&call.id).await;
    let kinds = kinds(&oplog);
    assert_eq!(kinds.first(), Some(&"call-started"));
    assert_eq!(kinds[1], "assigned");
    assert_eq!(kinds.last(), Some(&"outcome"));
    assert!(kinds.contains(&"wall-clock"), "{kinds:?}");
    assert!(kinds.contains(&"random"), "{kinds:?}");
    let started: Value = serde_json::from_str(&oplog[0].payload_json).unwrap();
    assert_eq!(started["tool"], "uuid");
    assert_eq!(started["digest"], call.release_digest);
    assert_eq!(started["argv"], json!(["uuid", "generate", "--count", "3"]));
    let seqs: Vec<u64> = oplog.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (0..oplog.len() as u64).collect::<Vec<_>>(),
        "sequence numbers are dense"
    );
    // Random draws are recorded as one byte stream: at least 16 bytes for each uuid.
    let random_bytes: usize = oplog
        .iter()
        .filter(|e| e.kind == "random")
        .map(|e| {
            serde_json::from_str::<Value>(&e.payload_json).unwrap()["hex"]
                .as_str()
                .unwrap()
                .len()
                / 2
        })
        .sum();
    assert!(
        random_bytes >= 3 * 16,
        "{random_bytes} random bytes recorded"
    );
    let outcome: Value = serde_json::from_str(&oplog.last().unwrap().payload_json).unwrap();
    assert_eq!(outcome["state"], "succeeded");

    // A component's own exit code reaches its declared error: fetch ends with
    // wasi:cli/exit.exit-with-code(3) when egress is refused (the release allows a few
    // public hosts, not loopback), and the refusal is in the oplog.
    let call = platform
        .call("fetch", &["get", "http://127.0.0.1:9/"])
        .await
        .unwrap();
    assert_eq!(error_kind(&call), "tool-error");
    let error = call.error.clone().unwrap();
    assert_eq!(
        (error.name.as_str(), error.exit_code),
        ("egress-denied", 3),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("HTTP-request-denied"),
        "{}",
        error.message
    );
    let oplog = platform.oplog(&call.id).await;
    let denied: Vec<&str> = oplog.iter().map(|e| e.kind.as_str()).collect();
    assert!(denied.contains(&"http-denied"), "{denied:?}");
    // A header HTTP does not take is exit code 2, its own declared error.
    let call = platform
        .call(
            "fetch",
            &["get", "https://example.com/", "--header", "Host: a"],
        )
        .await
        .unwrap();
    let error = call.error.clone().unwrap();
    assert_eq!(
        (error.name.as_str(), error.exit_code),
        ("invalid-argument", 2),
        "{}",
        error.message
    );

    // Idempotency over gRPC: the same key returns the same call and runs nothing again.
    let request = proto::InvokeRequest {
        tool: "uuid".into(),
        argv: vec!["generate".into()],
        idempotency_key: "key-1".into(),
        ..Default::default()
    };
    let first = platform.invoke(request.clone()).await.unwrap();
    let second = platform.invoke(request.clone()).await.unwrap();
    assert_eq!(first.id, second.id);
    assert!(!first.deduplicated);
    assert!(second.deduplicated);
    assert_eq!(
        first.result_json, second.result_json,
        "the same uuid, not a new one"
    );
    let assigned = platform
        .oplog(&first.id)
        .await
        .iter()
        .filter(|e| e.kind == "assigned")
        .count();
    assert_eq!(assigned, 1, "the tool ran once");
    // The same key for a different request is refused.
    let mut other = request.clone();
    other.argv.extend(["--count".into(), "2".into()]);
    let conflict = platform.invoke(other).await.unwrap_err();
    assert_eq!(conflict.kind, ErrorKind::IdempotencyConflict);
    // A call can be found again by its key.
    let mut client = platform.client().await;
    let found = client
        .get_call(proto::GetCallRequest {
            idempotency_key: "key-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.id, first.id);

    // HTTP: the same operation as JSON, with the key in a header.
    let http = platform.http_client();
    let url = format!(
        "http://{}/v1/namespaces/default/tools/semver/compare:call",
        platform.http
    );
    let response = http
        .post(&url)
        .header("Idempotency-Key", "http-1")
        .json(&json!({"args": {"a": "2.0.0", "b": "2.0.0-rc.1"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["state"], "succeeded");
    assert_eq!(body["result"]["order"], 1);
    let again: Value = http
        .post(&url)
        .header("Idempotency-Key", "http-1")
        .json(&json!({"args": {"a": "2.0.0", "b": "2.0.0-rc.1"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["id"], body["id"]);
    assert_eq!(again["deduplicated"], true);
    // Bad arguments over HTTP: 400 with the kind and the argument named.
    let response = http
        .post(&url)
        .json(&json!({"args": {"a": "1.0.0"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "invalid-argument");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("<b>"),
        "{body}"
    );
    // A body that is not JSON, or not a call: 400 in the same envelope, never a plain-text
    // rejection; an approval with a malformed body too.
    let approve_url = format!("http://{}/v1/calls/no-such-call/approve", platform.http);
    for (target, bad) in [
        (&url, "{\"args\": "),
        (&url, "[1, 2]"),
        (&url, "{\"args\": {}, \"unknown\": true}"),
        (&approve_url, "{\"reason\": 7}"),
    ] {
        let response = http
            .post(target.as_str())
            .header("content-type", "application/json")
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{bad}");
        let body: Value = response.json().await.expect("a JSON error envelope");
        assert_eq!(body["error"]["kind"], "invalid-argument", "{bad}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("request body:"),
            "{body}"
        );
    }
    // A tool's own failure: 422 with the declared error.
    let response = http
        .post(&url)
        .json(&json!({"args": {"a": "one", "b": "1.0.0"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["name"], "invalid-version");
    // The call and its oplog over HTTP.
    let id = body["id"].as_str().unwrap();
    let fetched: Value = http
        .get(format!("http://{}/v1/calls/{id}", platform.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(fetched["state"], "failed");
    let oplog: Value = http
        .get(format!("http://{}/v1/calls/{id}/oplog", platform.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(oplog["entries"][0]["kind"], "call-started");
    let unknown = http
        .post(format!(
            "http://{}/v1/namespaces/default/tools/nope/x:call",
            platform.http
        ))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    // The CLI: result JSON on stdout and exit 0; one line on stderr and non-zero otherwise.
    let out = platform.cli(&["call", "semver", "compare", "1.0.0", "1.0.1"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["order"], -1);
    let out = platform.cli(
        &["call", "textstats", "count", "--stdin", "-", "--top", "1"],
        Some(b"b a b\n"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["top"], json!([{"word": "b", "count": 2}]));
    let out = platform.cli(&["call", "semver", "compare", "x", "1.0.0"], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("toolgrid: tool-error invalid-version:"),
        "{stderr}"
    );
    let out = platform.cli(&["call", "semver", "bump", "1.0.0", "--part", "huge"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("option --part"));
    let out = platform.cli(&["call", "nope"], None);
    assert_eq!(out.status.code(), Some(4));
    let out = platform.cli(
        &["call", "uuid", "generate", "--idempotency-key", "cli-1"],
        None,
    );
    let again = platform.cli(
        &["call", "uuid", "generate", "--idempotency-key", "cli-1"],
        None,
    );
    assert!(out.status.success());
    assert_eq!(
        out.stdout, again.stdout,
        "the same key prints the same result"
    );

    // `toolgrid get` lists what is live; `get calls` puts the call id first.
    let out = platform.cli(&["get", "tools"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    for tool in ["semver", "textstats", "uuid"] {
        assert!(
            text.lines().any(|l| l.contains(tool) && l.contains("True")),
            "{text}"
        );
    }
    let out = platform.cli(&["get", "calls"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("ID")
            && header.contains("TOOL")
            && header.contains("STATE")
            && header.contains("DURATION")
    );
    assert!(text.lines().any(|l| l.starts_with(&call.id)), "{text}");
    let out = platform.cli(&["oplog", &call.id], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("call-started"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_own_error_and_the_platform_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    write_wat(&bin, "loop.wasm", fixtures::LOOP);
    write_wat(&bin, "bomb.wasm", fixtures::MEMORY_BOMB);
    write_wat(&bin, "flood.wasm", fixtures::OUTPUT_FLOOD);
    write_wat(&bin, "trap.wasm", fixtures::TRAP);
    write_wat(&bin, "ok.wasm", fixtures::OK_JSON);
    std::fs::write(bin.join("junk.wasm"), b"this is not WebAssembly").unwrap();
    let mut runaway = String::new();
    runaway += &tool_manifest("spin", "../bin/loop.wasm", "60s", "{cpuTime: 300ms}");
    runaway += &tool_manifest("hang", "../bin/loop.wasm", "1s", "{cpuTime: 60s}");
    runaway += &tool_manifest("bomb", "../bin/bomb.wasm", "60s", "{memory: 8Mi}");
    runaway += &tool_manifest("flood", "../bin/flood.wasm", "60s", "{outputBytes: 200Ki}");
    runaway += &tool_manifest("crash", "../bin/trap.wasm", "60s", "{}");
    runaway += &tool_manifest("junk", "../bin/junk.wasm", "60s", "{}");
    std::fs::write(manifests.join("runaway.yaml"), runaway).unwrap();
    // An invalid manifest beside valid ones: a schema break, a dangling reference, a
    // duplicate name.
    std::fs::write(
        manifests.join("invalid.yaml"),
        r#"
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: broken}
spec: {effect: read, commands: [{name: run, options: [{name: level, schema: {type: integer}, default: high}]}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {name: orphan-1.0.0}
spec: {tool: ghost, version: 1.0.0, artifact: {file: ../bin/ok.wasm}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: typo}
spec: {effect: read, comands: []}
---
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {name: default}
spec: {replicas: 1}
"#,
    )
    .unwrap();
    let platform = Platform::start(root.path(), &manifests, &[]);

    let healthy = || async {
        let call = platform
            .call("semver", &["compare", "1.0.0", "2.0.0"])
            .await
            .unwrap();
        assert_eq!(result_of(&call)["order"], -1, "the platform keeps serving");
    };

    // Invalid resources are Ready=False with a reason and a message naming file and field.
    let broken = platform.resource("tools", "broken").await.unwrap();
    assert_eq!(
        (broken.ready.as_str(), broken.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(
        broken
            .message
            .contains("spec.commands[0].options[0].default"),
        "{}",
        broken.message
    );
    assert!(
        broken.message.contains("invalid.yaml"),
        "{}",
        broken.message
    );
    let typo = platform.resource("tools", "typo").await.unwrap();
    assert_eq!(typo.reason, "InvalidSpec");
    assert!(typo.message.contains("comands"), "{}", typo.message);
    let orphan = platform.resource("releases", "orphan-1.0.0").await.unwrap();
    assert_eq!(
        (orphan.ready.as_str(), orphan.reason.as_str()),
        ("False", "UnknownTool")
    );
    assert!(orphan.message.contains("ghost"));
    let pool = platform.resource("pools", "default").await.unwrap();
    assert_eq!(pool.reason, "DuplicateName");
    assert!(
        pool.message.contains("pool.yaml") && pool.message.contains("invalid.yaml"),
        "{}",
        pool.message
    );
    // Invalid wasm: the release says why, and a call says the tool is unavailable.
    let junk = platform.resource("releases", "junk-1.0.0").await.unwrap();
    assert_eq!(
        (junk.ready.as_str(), junk.reason.as_str()),
        ("False", "InvalidArtifact")
    );
    let error = platform.call("junk", &[]).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Unavailable);
    assert!(
        error.message.contains("InvalidArtifact"),
        "{}",
        error.message
    );
    let error = platform.call("broken", &["run"]).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Unavailable);

    // The duplicate pool is not served, so fix it and the examples' pool comes back.
    std::fs::write(manifests.join("invalid.yaml"), "# emptied\n").unwrap();
    platform
        .eventually(
            "the default pool with workers",
            Duration::from_secs(30),
            || async {
                platform
                    .resource("pools", "default")
                    .await
                    .is_some_and(|r| r.ready == "True")
            },
        )
        .await;
    healthy().await;

    // Unknown tools and commands, and arguments that break the schema.
    let error = platform.call("nope", &[]).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::UnknownTool);
    assert!(
        error.message.contains("semver"),
        "lists the tools there are: {}",
        error.message
    );
    let error = platform.call("semver", &["frobnicate"]).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::UnknownCommand);
    for (argv, expected) in [
        (vec!["compare", "1.0.0"], "missing positional argument <b>"),
        (
            vec!["compare", "1.0.0", "1.0.0", "1.0.0"],
            "unexpected argument",
        ),
        (vec!["bump", "1.0.0", "--part", "all"], "option --part"),
        (vec!["bump", "1.0.0", "--bogus"], "unknown option --bogus"),
    ] {
        let error = platform.call("semver", &argv).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument, "{argv:?}");
        assert!(
            error.message.contains(expected),
            "{argv:?}: {}",
            error.message
        );
    }
    let error = platform
        .invoke(proto::InvokeRequest {
            tool: "textstats".into(),
            argv: vec!["--top".into(), "1000".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidArgument);
    assert!(error.message.contains("--top"), "{}", error.message);
    let error = platform
        .invoke(proto::InvokeRequest {
            tool: "semver".into(),
            argv: vec!["compare".into(), "1.0.0".into(), "1.0.0".into()],
            stdin: Some(b"unexpected".to_vec()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidArgument);
    assert!(
        error.message.contains("reads no stdin"),
        "{}",
        error.message
    );
    healthy().await;

    // Runaway guests: each stops with its own kind, and the workers keep serving.
    for (tool, expected) in [
        ("spin", "cpu-limit"),
        ("hang", "timeout"),
        ("bomb", "memory-limit"),
        ("flood", "output-limit"),
        ("crash", "trap"),
    ] {
        let call = platform.call(tool, &[]).await.unwrap();
        assert_eq!(error_kind(&call), expected, "{tool}: {:?}", call.error);
        healthy().await;
    }
    // Two at once, and a healthy call beside them.
    let (a, b, c) = tokio::join!(
        platform.call("spin", &[]),
        platform.call("bomb", &[]),
        platform.call("semver", &["compare", "3.0.0", "2.0.0"])
    );
    assert_eq!(error_kind(&a.unwrap()), "cpu-limit");
    assert_eq!(error_kind(&b.unwrap()), "memory-limit");
    assert_eq!(result_of(&c.unwrap())["order"], 1);

    // Adding a manifest makes a new tool callable without a restart; removing it removes it.
    std::fs::write(
        manifests.join("late.yaml"),
        tool_manifest("late", "../bin/ok.wasm", "10s", "{}"),
    )
    .unwrap();
    platform
        .eventually("the new tool", Duration::from_secs(30), || async {
            platform
                .resource("tools", "late")
                .await
                .is_some_and(|r| r.ready == "True")
        })
        .await;
    let call = platform.call("late", &[]).await.unwrap();
    assert_eq!(result_of(&call), json!({"ok": true}));
    std::fs::remove_file(manifests.join("late.yaml")).unwrap();
    platform
        .eventually("the tool to go", Duration::from_secs(30), || async {
            platform.resource("tools", "late").await.is_none()
        })
        .await;
    assert_eq!(
        platform.call("late", &[]).await.unwrap_err().kind,
        ErrorKind::UnknownTool
    );

    // A changed manifest bumps the generation the status reports.
    let semver = platform.resource("tools", "semver").await.unwrap();
    assert_eq!(semver.generation, 1);
    let path = manifests.join("semver.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("timeout: 10s", "timeout: 11s");
    std::fs::write(&path, text).unwrap();
    platform
        .eventually("generation 2", Duration::from_secs(30), || async {
            platform
                .resource("tools", "semver")
                .await
                .is_some_and(|r| r.generation == 2 && r.observed_generation == 2)
        })
        .await;
    healthy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_calls_survive_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    // The store's writer sleeping at once when out of writes (every other test runs the
    // default idle poll).
    let mut platform = Platform::start(root.path(), &manifests, &["--store-idle-poll", "0s"]);
    let request = proto::InvokeRequest {
        tool: "uuid".into(),
        argv: vec!["generate".into(), "--count".into(), "2".into()],
        idempotency_key: "before-restart".into(),
        ..Default::default()
    };
    let call = platform.invoke(request.clone()).await.unwrap();
    let result = result_of(&call);
    let oplog = platform.oplog(&call.id).await;

    platform.restart(libc::SIGKILL);

    let mut client = platform.client().await;
    let again = client
        .get_call(proto::GetCallRequest {
            id: call.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result_of(&again), result);
    assert_eq!(platform.oplog(&call.id).await, oplog);
    // The key still returns the answered call rather than running the tool again.
    let deduplicated = platform.invoke(request).await.unwrap();
    assert_eq!(deduplicated.id, call.id);
    assert!(deduplicated.deduplicated);
    assert_eq!(result_of(&deduplicated), result);
    // And the restarted platform takes new calls.
    let fresh = platform
        .call("semver", &["compare", "1.0.0", "1.0.0"])
        .await
        .unwrap();
    assert_eq!(result_of(&fresh)["order"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_is_saved_and_a_restart_resumes_from_it() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    write_wat(&bin, "ok.wasm", fixtures::OK_JSON);
    let late = manifests.join("late.yaml");
    std::fs::write(&late, tool_manifest("late", "../bin/ok.wasm", "10s", "{}")).unwrap();
    let mut platform = Platform::start(root.path(), &manifests, &[]);
    assert_eq!(generation(&platform, "tools", "late").await, Some(1));

    // Two changes to one tool, each saved by a reload that writes what it changed.
    let path = manifests.join("semver.yaml");
    for (from, to, expected) in [
        ("timeout: 10s", "timeout: 11s", 2),
        ("timeout: 11s", "timeout: 12s", 3),
    ] {
        let text = std::fs::read_to_string(&path).unwrap().replace(from, to);
        std::fs::write(&path, text).unwrap();
        platform
            .eventually("the next generation", Duration::from_secs(30), || async {
                generation(&platform, "tools", "semver").await == Some(expected)
            })
            .await;
    }
    // A removed tool's record goes with it.
    std::fs::remove_file(&late).unwrap();
    platform
        .eventually("the tool to go", Duration::from_secs(30), || async {
            generation(&platform, "tools", "late").await.is_none()
        })
        .await;

    // Stopped, the tool comes back with another spec: had its old record stayed, it would
    // be its generation 2.
    platform.kill(libc::SIGKILL);
    std::fs::write(&late, tool_manifest("late", "../bin/ok.wasm", "12s", "{}")).unwrap();
    platform.restart(libc::SIGKILL);
    assert_eq!(
        generation(&platform, "tools", "semver").await,
        Some(3),
        "the last change was saved"
    );
    assert_eq!(
        generation(&platform, "tools", "late").await,
        Some(1),
        "the removal was saved"
    );
    assert_eq!(
        generation(&platform, "tools", "uuid").await,
        Some(1),
        "what did not change"
    );
    let call = platform.call("late", &[]).await.unwrap();
    assert_eq!(result_of(&call), json!({"ok": true}));
}

/// A resource's generation as the platform reports it (None: no such resource).
async fn generation(platform: &Platform, kind: &str, name: &str) -> Option<i64> {
    platform.resource(kind, name).await.map(|r| r.generation)
}

/// The pids of a process's children.
fn children(pid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                pids.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    pids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_worker_that_dies_is_restarted() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let platform = Platform::start(root.path(), &manifests, &[]);
    let attached = |n: &'static str| {
        let platform = &platform;
        move || async move {
            platform
                .resource("pools", "default")
                .await
                .is_some_and(|row| {
                    row.columns
                        .iter()
                        .any(|c| c.name == "Attached" && c.value == n)
                })
        }
    };
    platform
        .eventually("two workers", Duration::from_secs(30), attached("2"))
        .await;
    let workers = children(platform.pid());
    assert_eq!(
        workers.len(),
        2,
        "toolgrid up runs its two workers: {workers:?}"
    );
    unsafe {
        libc::kill(workers[0] as i32, libc::SIGKILL);
    }
    platform
        .eventually("a replacement worker", Duration::from_secs(30), || async {
            let now = children(platform.pid());
            now.len() == 2 && !now.contains(&workers[0])
        })
        .await;
    platform
        .eventually("two workers again", Duration::from_secs(30), attached("2"))
        .await;
    let call = platform
        .call("semver", &["compare", "1.0.0", "1.0.0"])
        .await
        .unwrap();
    assert_eq!(result_of(&call)["order"], 0);
}
