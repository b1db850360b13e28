//! The worker's wasmtime runtime in-process, on the real example tools: preview 1 modules
//! and preview 2 components, record and replay, the compiled-code cache.

mod common;

use common::fixtures;
use sha2::{Digest, Sha256};
use toolgrid::error::ErrorKind;
use toolgrid::store::{NewEntry, RunLimits};
use toolgrid::worker::runtime::{CompileError, PrepareError};
use toolgrid::worker::{RunRequest, Runtime, RuntimeConfig};

fn example(tool: &str) -> (String, Vec<u8>) {
    let bytes =
        std::fs::read(fixtures::repo().join(format!("examples/tools/{tool}/{tool}.wasm"))).unwrap();
    (
        format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
        bytes,
    )
}

fn runtime(cache: &std::path::Path) -> Runtime {
    Runtime::new(&RuntimeConfig {
        cache_dir: cache.to_path_buf(),
        slots: 4,
        max_memory_bytes: 1 << 30,
        pooling: true,
    })
    .unwrap()
}

fn limits() -> RunLimits {
    RunLimits {
        memory_bytes: 64 << 20,
        cpu_time_ms: 10_000,
        output_bytes: 1 << 20,
        timeout_ms: 30_000,
        instances: 0,
    }
}

fn request(call_id: &str, argv: &[&str], replay: Vec<NewEntry>) -> RunRequest {
    RunRequest {
        call_id: call_id.into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        stdin: Vec::new(),
        limits: limits(),
        replay,
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
    assert!(recorded.iter().any(|e| e.kind == "wall-clock"));
    assert!(recorded.iter().any(|e| e.kind == "random"));

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
    let prefix: Vec<NewEntry> = recorded.iter().take(1).cloned().collect();
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
        NewEntry::new("monotonic-clock", serde_json::json!({"ns": 5})),
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
    let extra = vec![NewEntry::new(
        "wall-clock",
        serde_json::json!({"secs": 1, "nanos": 0}),
    )];
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
        toolgrid::worker::runtime::validate_artifact(&library),
        Err(CompileError::NotACommand(_))
    ));
    let (_, component) = example("uuid");
    assert_eq!(
        toolgrid::worker::runtime::validate_artifact(&component).unwrap(),
        "component"
    );
}
