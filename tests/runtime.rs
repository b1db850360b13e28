//! The worker's wasmtime runtime in-process, on the real example tools: preview 1 modules
//! and preview 2 components, record and replay, the compiled-code cache.

use crate::common;

use common::fixtures;
use common::fixtures::runtime;
use sha2::{Digest, Sha256};
use toolgrid_core::call::OplogEntry;
use toolgrid_core::error::ErrorKind;
use toolgrid_sandbox::RunRequest;
use toolgrid_sandbox::runtime::{CompileError, PrepareError};
use toolgrid_store::RunLimits;

fn example(tool: &str) -> (String, Vec<u8>) {
    let bytes =
        std::fs::read(fixtures::repo().join(format!("examples/tools/{tool}/{tool}.wasm"))).unwrap();
    (
        format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
        bytes,
    )
}

fn limits() -> RunLimits {
    RunLimits {
        memory_bytes: 64 << 20,
        cpu_time_ms: 10_000,
        output_bytes: 1 << 20,
        timeout_ms: 30_000,
        instances: 0,
        request_bytes: 0,
        response_bytes: 0,
        max_timeout_ms: 0,
    }
}

fn request(call_id: &str, argv: &[&str], replay: Vec<OplogEntry>) -> RunRequest {
    RunRequest {
        call_id: call_id.into(),
        attempt: 1,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        stdin: Vec::new(),
        limits: limits(),
        replay,
        repeatable: false,
        egress: Vec::new(),
        sink: None,
        prelude: Vec::new(),
        secrets: Default::default(),
        workspace: None,
        mounts: Vec::new(),
        idle_timeout_ms: 0,
    }
}

#[tokio::test]
async fn a_module_and_a_component_run_with_argv_stdin_and_exit_codes() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, bytes) = example("semver");
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    assert_eq!(compiled.kind(), "module");
    let outcome = runtime
        .run(
            &compiled,
            request("c1", &["semver", "compare", "1.0.0", "1.0.1"], vec![]),
        )
        .await;
    assert_eq!(outcome.exit_code, 0);
    assert!(outcome.failure.is_none());
    let result: serde_json::Value = serde_json::from_slice(&outcome.stdout).unwrap();
    assert_eq!(result["order"], -1);
    let outcome = runtime
        .run(
            &compiled,
            request("c2", &["semver", "compare", "one", "1.0.1"], vec![]),
        )
        .await;
    assert_eq!(outcome.exit_code, 3, "the declared error's exit code");
    assert!(String::from_utf8_lossy(&outcome.stderr_tail).contains("one"));

    let (digest, bytes) = example("textstats");
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let mut with_stdin = request("c3", &["textstats", "count", "--top", "1"], vec![]);
    with_stdin.stdin = b"x y x".to_vec();
    let outcome = runtime.run(&compiled, with_stdin).await;
    let result: serde_json::Value = serde_json::from_slice(&outcome.stdout).unwrap();
    assert_eq!(result["words"], 3);

    let (digest, bytes) = example("uuid");
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    assert_eq!(compiled.kind(), "component");
    let outcome = runtime
        .run(
            &compiled,
            request("c4", &["uuid", "generate", "--count", "2"], vec![]),
        )
        .await;
    assert_eq!(
        outcome.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&outcome.stderr_tail)
    );
    let result: serde_json::Value = serde_json::from_slice(&outcome.stdout).unwrap();
    assert_eq!(result["uuids"].as_array().unwrap().len(), 2);
}

/// A module that prints the bytes at 100 (set by a data segment), 200 (zero) and 3 MiB
/// (zero, past the part of a slot reset in place), then overwrites all three.
const MEMORY_PROBE: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 64)
  (data (i32.const 100) "A")
  (func (export "_start")
    (i32.store8 (i32.const 16) (i32.load8_u (i32.const 100)))
    (i32.store8 (i32.const 17) (i32.load8_u (i32.const 200)))
    (i32.store8 (i32.const 18) (i32.load8_u (i32.const 3145728)))
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 3))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store8 (i32.const 100) (i32.const 66))
    (i32.store8 (i32.const 200) (i32.const 67))
    (i32.store8 (i32.const 3145728) (i32.const 68))))"#;

#[tokio::test]
async fn a_call_sees_none_of_the_memory_an_earlier_call_wrote() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let bytes = wat::parse_str(MEMORY_PROBE).unwrap();
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    // Calls one after another reuse the pool's slot of this module: each starts from the
    // module's own memory (the data segment, zeros), whether the slot was reset in place
    // or given back to the kernel.
    for i in 0..4 {
        let outcome = runtime
            .run(&compiled, request(&format!("m{i}"), &["probe"], vec![]))
            .await;
        assert_eq!(outcome.exit_code, 0, "{:?}", outcome.failure);
        assert_eq!(outcome.stdout[..], b"A\0\0"[..], "call {i}");
    }
}

#[tokio::test]
async fn a_replay_answers_every_host_call_from_the_oplog() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, bytes) = example("uuid");
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let argv = ["uuid", "generate", "--count", "4"];
    let live = runtime.run(&compiled, request("r1", &argv, vec![])).await;
    assert_eq!(live.exit_code, 0);
    let recorded = live.log.take_pending();
    assert!(recorded.iter().any(|e| e.kind().as_str() == "wall-clock"));
    assert!(recorded.iter().any(|e| e.kind().as_str() == "random"));

    // A fresh run with the same oplog prints exactly the same uuids and timestamp, and
    // records nothing new.
    let replayed = runtime
        .run(&compiled, request("r1", &argv, recorded.clone()))
        .await;
    assert!(replayed.failure.is_none(), "{:?}", replayed.failure);
    assert_eq!(replayed.stdout, live.stdout);
    assert!(replayed.log.take_pending().is_empty());
    let (answered, _) = replayed.log.counts();
    assert_eq!(answered, recorded.len());

    // A live run differs (fresh random numbers): the replay really came from the log.
    let another = runtime.run(&compiled, request("r2", &argv, vec![])).await;
    assert_ne!(another.stdout, live.stdout);

    // A prefix of the oplog is replayed, and the rest runs live.
    let prefix: Vec<OplogEntry> = recorded.iter().take(1).cloned().collect();
    let resumed = runtime.run(&compiled, request("r1", &argv, prefix)).await;
    assert!(resumed.failure.is_none(), "{:?}", resumed.failure);
    assert!(
        !resumed.log.take_pending().is_empty(),
        "what was not in the prefix was recorded live"
    );
}

#[tokio::test]
async fn a_replay_that_takes_another_path_is_a_divergence() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, bytes) = example("uuid");
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let argv = ["uuid", "generate"];
    let live = runtime.run(&compiled, request("d1", &argv, vec![])).await;
    let mut recorded = live.log.take_pending();
    // Claim the first host call was a monotonic clock reading.
    recorded.insert(
        0,
        OplogEntry::MonotonicClock(toolgrid_core::call::MonotonicClock { ns: 5 }),
    );
    let outcome = runtime.run(&compiled, request("d1", &argv, recorded)).await;
    let failure = outcome.failure.expect("diverged");
    assert_eq!(failure.kind, ErrorKind::ReplayDivergence);
    assert!(
        failure.message.contains("monotonic-clock"),
        "{}",
        failure.message
    );

    // A run that ends with recorded host calls left over diverged too.
    let (digest, bytes) = example("semver");
    let semver = runtime.compile(&digest, bytes).await.unwrap();
    let extra = vec![OplogEntry::WallClock(toolgrid_core::call::WallClock {
        secs: 1,
        nanos: 0,
    })];
    let outcome = runtime
        .run(
            &semver,
            request("d2", &["semver", "compare", "1.0.0", "1.0.0"], extra),
        )
        .await;
    assert_eq!(
        outcome.failure.expect("diverged").kind,
        ErrorKind::ReplayDivergence
    );
}

#[tokio::test]
async fn compiled_code_is_cached_on_disk_by_digest() {
    let cache = tempfile::tempdir().unwrap();
    let (digest, bytes) = example("semver");
    {
        let runtime = runtime(cache.path());
        let fetched = runtime
            .prepare(&digest, || async { Ok::<_, PrepareError>(bytes.clone()) })
            .await
            .unwrap();
        assert_eq!(fetched.kind(), "module");
        assert!(runtime.compiled_digests().contains(&digest));
    }
    // A new runtime (a restarted worker) finds it without fetching.
    let runtime = runtime(cache.path());
    assert!(runtime.cached_digests().contains(&digest));
    let compiled = runtime
        .prepare(&digest, || async {
            Err::<Vec<u8>, _>(PrepareError::Fetch("must not fetch".into()))
        })
        .await
        .unwrap();
    let outcome = runtime
        .run(
            &compiled,
            request("k", &["semver", "compare", "2.0.0", "1.0.0"], vec![]),
        )
        .await;
    assert_eq!(outcome.exit_code, 0);
}

#[tokio::test]
async fn artifacts_are_checked_before_they_run() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, mut bytes) = example("semver");
    bytes.push(0);
    assert!(matches!(
        runtime.compile(&digest, bytes).await,
        Err(CompileError::DigestMismatch { .. })
    ));
    let junk = b"definitely not wasm".to_vec();
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&junk)));
    assert!(matches!(
        runtime.compile(&digest, junk).await,
        Err(CompileError::Invalid(_))
    ));
    // A module that is valid but not a command.
    let library = wat::parse_str(r#"(module (func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 i32.add))"#).unwrap();
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&library)));
    assert!(matches!(
        runtime.compile(&digest, library.clone()).await,
        Err(CompileError::NotACommand(_))
    ));
    assert!(matches!(
        toolgrid_sandbox::runtime::validate_artifact(&library),
        Err(CompileError::NotACommand(_))
    ));
    let (_, component) = example("uuid");
    assert_eq!(
        toolgrid_sandbox::runtime::validate_artifact(&component).unwrap(),
        "component"
    );
}

/// A preview 1 module that sends the given request documents in order through the
/// `toolgrid` import and prints each response document on its own line.
fn http_module(requests: &[String]) -> Vec<u8> {
    let mut data = String::new();
    let mut calls = String::new();
    let mut offset = 4096u32;
    for request in requests {
        let escaped: String = request.bytes().map(|b| format!("\\{b:02x}")).collect();
        data += &format!("(data (i32.const {offset}) \"{escaped}\")\n");
        calls += &format!(
            r#"
    (call $send (i32.const {offset}) (i32.const {len}) (i32.const 0) (i32.const 4))
    (drop)
    (drop (call $take (i32.load (i32.const 0)) (i32.const 65536) (i32.const 65536)))
    (i32.store (i32.const 8) (i32.const 65536))
    (i32.store (i32.const 12) (i32.load (i32.const 4)))
    (drop (call $fd_write (i32.const 1) (i32.const 8) (i32.const 1) (i32.const 16)))
    (i32.store (i32.const 8) (i32.const 32))
    (i32.store (i32.const 12) (i32.const 1))
    (drop (call $fd_write (i32.const 1) (i32.const 8) (i32.const 1) (i32.const 16)))"#,
            len = request.len()
        );
        offset += request.len() as u32 + 16;
    }
    let wat = format!(
        r#"(module
  (import "toolgrid" "http_send" (func $send (param i32 i32 i32 i32) (result i32)))
  (import "toolgrid" "http_take" (func $take (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (data (i32.const 32) "\0a")
  {data}
  (func (export "_start") {calls}))"#
    );
    wat::parse_str(&wat).expect("valid WAT")
}

fn http_request(run: &RunRequest) -> RunRequest {
    run.clone()
}

#[tokio::test]
async fn outgoing_requests_are_committed_first_carry_keys_and_replay_from_the_oplog() {
    use std::sync::Arc;
    use toolgrid_api::EgressRule;
    use toolgrid_sandbox::runtime::MemorySink;

    let witness = common::witness::Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let requests = vec![
        format!(
            r#"{{"method": "POST", "url": "{}/effects", "body": "one"}}"#,
            witness.base()
        ),
        format!(
            r#"{{"method": "GET", "url": "{}/effects/x"}}"#,
            witness.base()
        ),
    ];
    let bytes = http_module(&requests);
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let egress = vec![EgressRule {
        host: "127.0.0.1".into(),
        ports: vec![witness.addr.port()],
        allow_private: true,
        headers: Default::default(),
    }];
    let sink = Arc::new(MemorySink::default());
    // On arrival, before it is answered, a request's `http-request` entry (with its key) is
    // already in what the worker committed: a worker that sent first and committed after
    // (even in the same append as the response) fails here.
    let committed_so_far = sink.clone();
    witness.set_probe(move |seen| {
        let committed = committed_so_far.entries.lock().unwrap().clone();
        async move {
            let key = seen.key.clone().ok_or("no Idempotency-Key")?;
            if committed.iter().any(|e| {
                matches!(e, OplogEntry::HttpRequest(r) if r.idempotency_key == key)
            }) {
                Ok(())
            } else {
                Err(format!(
                    "its http-request entry ({key}) was not committed when it arrived; committed: {:?}",
                    committed.iter().map(|e| e.kind().as_str()).collect::<Vec<_>>()
                ))
            }
        }
    });
    let mut first = request("h1", &["h"], vec![]);
    first.egress = egress.clone();
    first.sink = Some(sink.clone());
    let live = runtime.run(&compiled, http_request(&first)).await;
    assert!(live.failure.is_none(), "{:?}", live.failure);
    let printed = String::from_utf8_lossy(&live.stdout).to_string();
    assert!(
        printed.lines().all(|l| l.contains("\"status\":200")),
        "{printed}"
    );

    // Each request reached the witness once, with the call's key for its number.
    let seen = witness.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].key.as_deref(), Some("toolgrid-h1-1"));
    assert_eq!(seen[1].key.as_deref(), Some("toolgrid-h1-2"));
    assert_eq!(seen[0].body, "one");
    // The start of each request was committed before it left (the probe); its response
    // after it came.
    witness.assert_probes_passed();
    let committed = sink.entries.lock().unwrap().clone();
    let kinds: Vec<&str> = committed.iter().map(|e| e.kind().as_str()).collect();
    assert_eq!(
        kinds,
        [
            "http-request",
            "http-response",
            "http-request",
            "http-response"
        ]
    );
    assert!(
        matches!(&committed[0], OplogEntry::HttpRequest(r) if r.idempotency_key == "toolgrid-h1-1"),
        "{:?}",
        committed[0]
    );

    // A replay with the full oplog answers both from it: nothing reaches the witness.
    let mut again = first.clone();
    again.replay = committed.clone();
    again.attempt = 2;
    let replayed = runtime.run(&compiled, again).await;
    assert!(replayed.failure.is_none(), "{:?}", replayed.failure);
    assert_eq!(replayed.stdout, live.stdout);
    assert_eq!(witness.seen().len(), 2, "nothing was sent again");

    // Lost after the POST started but before its response was recorded: a write tool
    // must not send it again.
    let in_flight = vec![committed[0].clone()];
    let mut write = first.clone();
    write.replay = in_flight.clone();
    write.attempt = 2;
    write.repeatable = false;
    let outcome = runtime.run(&compiled, write).await;
    let failure = outcome.failure.expect("outcome unknown");
    assert_eq!(failure.kind, ErrorKind::OutcomeUnknown);
    assert!(
        failure.message.contains("request 1 (POST"),
        "{}",
        failure.message
    );
    assert_eq!(witness.seen().len(), 2, "the POST was not repeated");

    // An idempotent tool re-sends it with the same key.
    let mut idempotent = first.clone();
    idempotent.replay = in_flight;
    idempotent.attempt = 2;
    idempotent.repeatable = true;
    let outcome = runtime.run(&compiled, idempotent).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let seen = witness.seen();
    assert_eq!(seen.len(), 4);
    assert_eq!(
        seen[2].key.as_deref(),
        Some("toolgrid-h1-1"),
        "the same key as the first time"
    );
    assert_eq!(seen[2].attempt.as_deref(), Some("2"));
    witness.assert_probes_passed();

    // A replay that sends something else at the same number diverges before sending it.
    let other = http_module(&[format!(
        r#"{{"method": "POST", "url": "{}/other", "body": "one"}}"#,
        witness.base()
    )]);
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&other)));
    let other = runtime.compile(&digest, other).await.unwrap();
    let mut diverging = first.clone();
    diverging.replay = committed;
    let outcome = runtime.run(&other, diverging).await;
    assert_eq!(
        outcome.failure.expect("diverged").kind,
        ErrorKind::ReplayDivergence
    );
    assert_eq!(witness.seen().len(), 4);
}

#[tokio::test]
async fn a_refused_commit_stops_the_guest_before_the_request_leaves() {
    use std::sync::Arc;
    use toolgrid_api::EgressRule;
    use toolgrid_sandbox::http::AppendError;
    use toolgrid_sandbox::http::OplogSink;

    struct Refusing;
    #[async_trait::async_trait]
    impl OplogSink for Refusing {
        async fn append(&self, _: Vec<OplogEntry>) -> Result<(), AppendError> {
            Err(AppendError::Fenced)
        }
    }

    let witness = common::witness::Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let bytes = http_module(&[format!(
        r#"{{"method": "POST", "url": "{}/effects", "body": "x"}}"#,
        witness.base()
    )]);
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let mut fenced = request("f1", &["f"], vec![]);
    fenced.egress = vec![EgressRule {
        host: "127.0.0.1".into(),
        ports: vec![witness.addr.port()],
        allow_private: true,
        headers: Default::default(),
    }];
    fenced.sink = Some(Arc::new(Refusing));
    let outcome = runtime.run(&compiled, fenced).await;
    assert!(outcome.fenced, "the worker abandons the call");
    assert!(witness.seen().is_empty(), "nothing left the sandbox");
}

#[tokio::test]
async fn egress_refusals_reach_the_guest_and_the_oplog() {
    use toolgrid_api::EgressRule;
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let bytes = http_module(&[
        r#"{"url": "http://localhost:9/x"}"#.to_string(),
        r#"{"url": "http://10.11.12.13/x"}"#.to_string(),
        r#"{"url": "https://unlisted.test/x"}"#.to_string(),
        r#"{"url": "not a url"}"#.to_string(),
    ]);
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let mut run = request("e1", &["e"], vec![]);
    run.egress = vec![
        EgressRule {
            host: "localhost".into(),
            ports: vec![9],
            allow_private: false,
            headers: Default::default(),
        },
        EgressRule {
            host: "10.11.12.13".into(),
            ports: vec![],
            allow_private: false,
            headers: Default::default(),
        },
    ];
    let outcome = runtime.run(&compiled, run).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let printed = String::from_utf8_lossy(&outcome.stdout).to_string();
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 4, "{printed}");
    assert!(
        lines[0].contains("egress-denied") && lines[0].contains("loopback"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("egress-denied") && lines[1].contains("private"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("egress-denied") && lines[2].contains("unlisted.test:443"),
        "{}",
        lines[2]
    );
    assert!(lines[3].contains("invalid-request"), "{}", lines[3]);
    let entries = outcome.log.take_pending();
    let denied = entries
        .iter()
        .filter(|e| e.kind().as_str() == "http-denied")
        .count();
    assert_eq!(denied, 3, "each refusal is in the oplog: {entries:?}");
}
