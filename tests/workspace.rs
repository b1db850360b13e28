//! Workspaces: each agent's versioned file tree, preopened at `/workspace`.
//!
//! The first half runs the `workspace` fixture (tests/fixtures/tools/workspace, a preview 1
//! module and a preview 2 component) in the worker's runtime in-process, on a copy of a
//! given version, and checks the tree it leaves. The store's half (commit with success only,
//! the base pinned across re-assignment, limits) is in `tests/store.rs`, the scheduler's
//! one-writer rule in `crates/core/src/scheduler/mod.rs`.
//!
//! The second half runs real control planes and workers: `through_the_platform` writes calls
//! with a given access straight into the store (to control exactly when a worker dies), and
//! `end_to_end` drives `toolgrid up` with Agents, agent tokens and ToolBindings granting
//! filesystem access, through the gateway.

use crate::common;

use common::fixtures::{self, runtime};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use toolgrid_core::call::ErrorKind;
use toolgrid_core::workspace::{self, Limits, Tree};
use toolgrid_sandbox::workspace::{WorkspaceMount, materialize, scan};
use toolgrid_sandbox::{Compiled, RunOutcome, RunRequest, Runtime};
use toolgrid_store::RunLimits;

fn fixture(name: &str) -> (String, Vec<u8>) {
    let bytes =
        std::fs::read(fixtures::repo().join(format!("tests/fixtures/tools/{name}/{name}.wasm")))
            .unwrap();
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
        ..RunLimits::default()
    }
}

/// Version "V": two files, as the store would hand them to a worker.
fn version_v() -> (Tree, HashMap<String, Vec<u8>>) {
    let files: [(&str, &[u8]); 2] = [("notes/todo.txt", b"buy milk"), ("readme", b"hello")];
    let tree = Tree::from_rows(
        files
            .iter()
            .map(|(p, b)| (p.to_string(), workspace::blob_digest(b), b.len() as u64)),
    )
    .unwrap();
    let blobs = files
        .iter()
        .map(|(_, b)| (workspace::blob_digest(b), b.to_vec()))
        .collect();
    (tree, blobs)
}

/// A fresh copy of `tree` in a new directory, as a worker makes one per call.
fn copy_of(tree: &Tree, blobs: &HashMap<String, Vec<u8>>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    materialize(dir.path(), tree, blobs).unwrap();
    dir
}

async fn run(
    runtime: &Runtime,
    compiled: &Compiled,
    argv: &[&str],
    dir: Option<(&Path, bool)>,
) -> RunOutcome {
    runtime
        .run(
            compiled,
            RunRequest {
                call_id: format!("ws-{}", argv.join("-")),
                attempt: 1,
                argv: std::iter::once("workspace")
                    .chain(argv.iter().copied())
                    .map(String::from)
                    .collect(),
                limits: limits(),
                workspace: dir.map(|(dir, writable)| WorkspaceMount {
                    dir: dir.to_path_buf(),
                    writable,
                }),
                ..Default::default()
            },
        )
        .await
}

fn stderr(outcome: &RunOutcome) -> String {
    String::from_utf8_lossy(&outcome.stderr_tail).into_owned()
}

fn json(outcome: &RunOutcome) -> serde_json::Value {
    assert_eq!(outcome.exit_code, 0, "{}", stderr(outcome));
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    serde_json::from_slice(&outcome.stdout).expect("JSON on stdout")
}

/// Both builds of the fixture: (name, compiled, exit code of a failure other than 0).
async fn builds(runtime: &Runtime) -> Vec<(&'static str, Compiled, Option<i32>)> {
    let mut out = Vec::new();
    for (name, kind) in [("workspace", "module"), ("workspace-p2", "component")] {
        let (digest, bytes) = fixture(name);
        let compiled = runtime.compile(&digest, bytes).await.unwrap();
        assert_eq!(compiled.kind(), kind);
        // A preview 2 command exits 0 or 1 only.
        let code = (kind == "module").then_some(3);
        out.push((name, compiled, code));
    }
    out
}

#[tokio::test]
async fn a_read_write_run_sees_version_v_and_leaves_the_next_tree_in_its_copy_only() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (v, blobs) = version_v();
    for (name, compiled, _) in builds(&runtime).await {
        let copy = copy_of(&v, &blobs);
        let read = json(
            &run(
                &runtime,
                &compiled,
                &["read", "--path", "notes/todo.txt"],
                Some((copy.path(), true)),
            )
            .await,
        );
        assert_eq!(read["text"], "buy milk", "{name}");
        let wrote = json(
            &run(
                &runtime,
                &compiled,
                &["write", "--path", "notes/new/day.txt", "--text", "sunny"],
                Some((copy.path(), true)),
            )
            .await,
        );
        assert_eq!(wrote["bytes"], 5, "{name}");
        let listed = json(&run(&runtime, &compiled, &["ls"], Some((copy.path(), true))).await);
        assert_eq!(
            listed["files"],
            serde_json::json!(["notes/new/day.txt", "notes/todo.txt", "readme"]),
            "{name}"
        );
        let scanned = scan(copy.path(), &Limits::default()).unwrap();
        let changes: Vec<(String, char)> = workspace::diff(&v, &scanned.tree)
            .into_iter()
            .map(|c| (c.path.to_string(), c.kind.letter()))
            .collect();
        assert_eq!(changes, [("notes/new/day.txt".to_string(), 'A')], "{name}");
        assert_eq!(
            scanned.new_blobs(&v),
            vec![(workspace::blob_digest(b"sunny"), b"sunny".to_vec())],
            "{name}: only the new blob goes back"
        );
        // Version V itself is untouched: a fresh copy still holds exactly V.
        let fresh = copy_of(&v, &blobs);
        assert_eq!(scan(fresh.path(), &Limits::default()).unwrap().tree, v);
    }
}

#[tokio::test]
async fn a_read_only_run_cannot_write_and_leaves_the_tree_unchanged() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (v, blobs) = version_v();
    for (name, compiled, code) in builds(&runtime).await {
        let copy = copy_of(&v, &blobs);
        let read = json(
            &run(
                &runtime,
                &compiled,
                &["read", "--path", "readme"],
                Some((copy.path(), false)),
            )
            .await,
        );
        assert_eq!(read["text"], "hello", "{name}: reading is allowed");
        for argv in [
            &["write", "--path", "readme", "--text", "changed"][..],
            &["write", "--path", "new.txt", "--text", "x"],
        ] {
            let outcome = run(&runtime, &compiled, argv, Some((copy.path(), false))).await;
            assert_ne!(outcome.exit_code, 0, "{name}: {argv:?}");
            if let Some(code) = code {
                assert_eq!(outcome.exit_code, code, "{name}: the declared write-failed");
            }
            assert!(
                stderr(&outcome).contains("write-failed"),
                "{name}: {}",
                stderr(&outcome)
            );
        }
        assert_eq!(
            scan(copy.path(), &Limits::default()).unwrap().tree,
            v,
            "{name}: nothing changed"
        );
    }
}

#[tokio::test]
async fn without_filesystem_access_there_is_no_workspace_at_all() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    for (name, compiled, _) in builds(&runtime).await {
        let outcome = run(&runtime, &compiled, &["ls"], None).await;
        assert_ne!(outcome.exit_code, 0, "{name}");
        assert!(
            stderr(&outcome).contains("not-found"),
            "{name}: {}",
            stderr(&outcome)
        );
        let outcome = run(
            &runtime,
            &compiled,
            &["write", "--path", "x", "--text", "y"],
            None,
        )
        .await;
        assert!(stderr(&outcome).contains("write-failed"), "{name}");
    }
}

#[tokio::test]
async fn two_runs_from_the_same_version_leave_the_same_tree() {
    // What a replay after failover relies on: a re-run starts from a fresh copy of the same
    // version V, so the tree it commits is the one the interrupted run would have.
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (v, blobs) = version_v();
    let (digest, bytes) = fixture("workspace");
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let mut digests = Vec::new();
    for _ in 0..2 {
        let copy = copy_of(&v, &blobs);
        let argv = [
            "write", "--path", "readme", "--text", "again", "--work", "1000",
        ];
        json(&run(&runtime, &compiled, &argv, Some((copy.path(), true))).await);
        digests.push(scan(copy.path(), &Limits::default()).unwrap().tree.digest());
    }
    assert_eq!(digests[0], digests[1]);
    assert_ne!(digests[0], v.digest());
}

#[tokio::test]
async fn a_run_that_grows_the_workspace_past_its_limit_is_refused_by_name() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (v, blobs) = version_v();
    let (digest, bytes) = fixture("workspace");
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let copy = copy_of(&v, &blobs);
    let text = "x".repeat(64);
    json(
        &run(
            &runtime,
            &compiled,
            &["write", "--path", "big", "--text", &text],
            Some((copy.path(), true)),
        )
        .await,
    );
    let tight = Limits {
        max_bytes: v.total_bytes() + 63,
        max_files: 100,
    };
    let error = scan(copy.path(), &tight).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::WorkspaceLimit, "{error}");
    let few = Limits {
        max_bytes: 1 << 20,
        max_files: 2,
    };
    assert_eq!(
        scan(copy.path(), &few).unwrap_err().kind(),
        ErrorKind::WorkspaceLimit
    );
}

// ---- The CLI over the Workspaces service ---------------------------------------------------

/// Commits `files` as the next version of `agent`'s workspace the way a succeeded call does.
async fn commit_through_a_call(
    store: &std::sync::Arc<dyn toolgrid_store::Store>,
    id: &str,
    agent: &str,
    files: &[(&str, &[u8])],
) {
    use toolgrid_core::call::{CallAccess, CallStarted, Filesystem, RunSummary};
    use toolgrid_store::{CallOutcome, CallSpec, NewCall};
    let call = NewCall {
        id: id.into(),
        namespace: "default".into(),
        tool: "workspace".into(),
        command: "write".into(),
        release: "workspace-1.0.0".into(),
        release_digest: "sha256:00".into(),
        args: serde_json::json!({}),
        spec: CallSpec {
            pool: "default/default".into(),
            access: CallAccess {
                agent: Some(agent.into()),
                filesystem: Filesystem::ReadWrite,
                ..CallAccess::default()
            },
            ..CallSpec::default()
        },
        stdin: Vec::new(),
        idempotency_key: None,
        request_hash: id.into(),
        started: CallStarted {
            namespace: "default".into(),
            tool: "workspace".into(),
            command: "write".into(),
            release: "workspace-1.0.0".into(),
            version: "1.0.0".into(),
            digest: "sha256:00".into(),
            args: serde_json::json!({}),
            argv: Vec::new(),
            stdin_bytes: 0,
            idempotency_key: None,
            dry_run: false,
            middleware: Vec::new(),
        },
        assign_to: Some("test".into()),
        repeat_window_ms: None,
        dry_run_result: None,
    };
    store.create_call(call).await.unwrap();
    let commit = workspace::Commit {
        tree: Tree::from_rows(
            files
                .iter()
                .map(|(p, b)| (p.to_string(), workspace::blob_digest(b), b.len() as u64)),
        )
        .unwrap(),
        blobs: files
            .iter()
            .map(|(_, b)| (workspace::blob_digest(b), b.to_vec()))
            .collect(),
    };
    let outcome = CallOutcome {
        result: Ok(serde_json::json!({})),
        run: RunSummary {
            exit_code: 0,
            stdout_bytes: 2,
            run_micros: 1,
            epoch: 1,
            worker: "test".into(),
            replayed: 0,
        },
        workspace: Some(commit),
    };
    let done = store
        .complete_call(id, 1, 0, vec![], outcome)
        .await
        .unwrap();
    assert!(done.error.is_none(), "{:?}", done.error);
}

#[tokio::test]
async fn the_cli_lists_prints_and_diffs_versions_and_refuses_hostile_paths() {
    let root = tempfile::tempdir().unwrap();
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let platform = common::Platform::start(root.path(), &manifests, &["--no-workers"]);
    let url = format!("sqlite://{}", platform.data.join("toolgrid.db").display());
    let store = toolgrid_store::open(&url).await.unwrap();
    commit_through_a_call(
        &store,
        "c1",
        "alice",
        &[("notes/a.txt", b"one"), ("b", b"bee")],
    )
    .await;
    commit_through_a_call(
        &store,
        "c2",
        "alice",
        &[("notes/a.txt", b"two"), ("c", b"sea")],
    )
    .await;
    commit_through_a_call(&store, "c3", "bob", &[("bob.txt", b"bob's")]).await;

    let run = |args: &[&str]| {
        let mut all = vec!["workspace"];
        all.extend_from_slice(args);
        platform.cli(&all, None)
    };
    let text = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let history: Vec<serde_json::Value> =
        serde_json::from_str(&text(run(&["history", "alice", "-o", "json"]))).unwrap();
    let versions: Vec<u64> = history
        .iter()
        .map(|v| v["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [1, 2]);
    assert_eq!(history[1]["callId"], "c2");
    assert_eq!(text(run(&["cat", "alice", "notes/a.txt"])), "two");
    assert_eq!(
        text(run(&["cat", "alice", "notes/a.txt", "-v", "1"])),
        "one"
    );
    let listed = text(run(&["ls", "alice"]));
    assert!(
        listed.contains("notes/a.txt") && listed.contains("c") && !listed.contains("bob.txt"),
        "{listed}"
    );
    let under: serde_json::Value =
        serde_json::from_str(&text(run(&["ls", "alice", "notes", "-o", "json"]))).unwrap();
    assert_eq!(under["files"].as_array().unwrap().len(), 1);
    assert_eq!(
        text(run(&["diff", "alice", "1", "2"])),
        "D b\nA c\nM notes/a.txt\n"
    );
    assert_eq!(
        text(run(&["diff", "alice", "0", "1"])),
        "A b\nA notes/a.txt\n"
    );
    assert_eq!(text(run(&["cat", "bob", "bob.txt"])), "bob's");

    for (args, kind) in [
        (&["cat", "alice", "../bob/bob.txt"][..], "invalid-argument"),
        (&["cat", "alice", "/etc/passwd"], "invalid-argument"),
        (&["cat", "alice", "bob.txt"], "not-found"),
        (&["cat", "alice", "b", "-v", "9"], "not-found"),
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(kind), "{args:?}: {stderr}");
    }
}

// ---- Through the platform: real control plane, workers, link and store ----------------------
//
// These tests write calls with the access a binding would grant straight into the store of a
// `toolgrid up` started with `--no-workers`, restart it so it recovers them, and let real
// worker processes run them: the test decides when each worker dies.

mod through_the_platform {
    use super::common::{Platform, WorkerProcess};
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use toolgrid_core::call::{CallAccess, CallStarted, CallState, Filesystem};
    use toolgrid_core::workspace::WorkspaceKey;
    use toolgrid_store::{CallRecord, CallSpec, NewCall, Store};

    const TOOL: &str = r#"
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: workspace}
spec:
  effect: write
  timeout: 120s
  commands:
    - name: write
      options:
        - {name: path, schema: {type: string}, required: true}
        - {name: text, schema: {type: string}, required: true}
        - {name: work, schema: {type: integer, minimum: 0}, default: 0}
      errors:
        - {name: write-failed, exitCode: 3}
    - name: read
      options:
        - {name: path, schema: {type: string}, required: true}
      errors:
        - {name: not-found, exitCode: 4}
    - name: ls
      errors:
        - {name: not-found, exitCode: 4}
    - name: fail-after-write
      options:
        - {name: path, schema: {type: string}, required: true}
        - {name: text, schema: {type: string}, required: true}
      errors:
        - {name: failed-on-purpose, exitCode: 5}
        - {name: write-failed, exitCode: 3}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {name: workspace-1.0.0}
spec: {tool: workspace, version: 1.0.0, artifact: {file: workspace.wasm}}
"#;

    struct Setup {
        root: tempfile::TempDir,
        platform: Platform,
        store: Arc<dyn Store>,
        digest: String,
    }

    async fn setup() -> Setup {
        let root = tempfile::tempdir().unwrap();
        let manifests = root.path().join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let (digest, bytes) = fixture("workspace");
        std::fs::write(manifests.join("workspace.wasm"), bytes).unwrap();
        std::fs::write(manifests.join("workspace.yaml"), TOOL).unwrap();
        let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
        let url = format!("sqlite://{}", platform.data.join("toolgrid.db").display());
        let store = toolgrid_store::open(&url).await.unwrap();
        assert!(
            store.get_artifact(&digest).await.unwrap().is_some(),
            "the catalog stored the release's artifact"
        );
        Setup {
            root,
            platform,
            store,
            digest,
        }
    }

    fn command(name: &str) -> Option<toolgrid_api::Command> {
        let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(TOOL)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let command = docs[0]["spec"]["commands"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"].as_str() == Some(name))
            .unwrap()
            .clone();
        let command: toolgrid_api::Command = serde_yaml::from_value(command).unwrap();
        Some(command)
    }

    /// Records a pending call of `workspace COMMAND ARGS...` acting for `agent` with
    /// `filesystem`, as admission does once bindings grant access.
    async fn admit(setup: &Setup, id: &str, agent: &str, filesystem: Filesystem, argv: &[&str]) {
        let argv: Vec<String> = std::iter::once("workspace")
            .chain(argv.iter().copied())
            .map(String::from)
            .collect();
        let call = NewCall {
            id: id.into(),
            namespace: "default".into(),
            tool: "workspace".into(),
            command: argv[1].clone(),
            release: "workspace-1.0.0".into(),
            release_digest: setup.digest.clone(),
            args: serde_json::json!({}),
            spec: CallSpec {
                pool: "default/default".into(),
                argv: argv.clone(),
                limits: RunLimits {
                    memory_bytes: 64 << 20,
                    cpu_time_ms: 60_000,
                    output_bytes: 1 << 20,
                    timeout_ms: 120_000,
                    ..RunLimits::default()
                },
                effect: toolgrid_core::spec::Effect::Write,
                command: command(&argv[1]).map(std::sync::Arc::new),
                deadline_ms: toolgrid_store::now_ms() + 600_000,
                access: CallAccess {
                    agent: Some(agent.into()),
                    filesystem,
                    ..CallAccess::default()
                },
                ..CallSpec::default()
            },
            stdin: Vec::new(),
            idempotency_key: None,
            request_hash: id.into(),
            started: CallStarted {
                namespace: "default".into(),
                tool: "workspace".into(),
                command: argv[1].clone(),
                release: "workspace-1.0.0".into(),
                version: "1.0.0".into(),
                digest: setup.digest.clone(),
                args: serde_json::json!({}),
                argv,
                stdin_bytes: 0,
                idempotency_key: None,
                dry_run: false,
                middleware: Vec::new(),
            },
            assign_to: None,
            repeat_window_ms: None,
            dry_run_result: None,
        };
        setup.store.create_call(call).await.unwrap();
        // Recovered oldest first: keep creation times apart.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    async fn ended(setup: &Setup, id: &str) -> CallRecord {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(180) {
            if let Some(call) = setup.store.get_call(id).await.unwrap()
                && call.state.is_terminal()
            {
                return call;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("call {id} did not end; log:\n{}", setup.platform.logs());
    }

    fn succeeded(call: &CallRecord) -> serde_json::Value {
        assert_eq!(
            call.state,
            CallState::Succeeded,
            "{}: {:?}",
            call.id,
            call.error
        );
        call.result.clone().unwrap()
    }

    fn failed(call: &CallRecord) -> (ErrorKind, String) {
        assert_eq!(
            call.state,
            CallState::Failed,
            "{}: {:?}",
            call.id,
            call.result
        );
        let error = call.error.clone().unwrap();
        (error.kind, error.name)
    }

    async fn head(setup: &Setup, agent: &str) -> workspace::Version {
        setup
            .store
            .workspace_head(&WorkspaceKey::new("default", agent))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn workspaces_are_per_agent_read_only_cannot_write_and_failures_leave_no_trace() {
        use Filesystem::{ReadOnly, ReadWrite};
        let mut setup = setup().await;
        admit(
            &setup,
            "a1",
            "alice",
            ReadWrite,
            &["write", "--path", "notes/a.txt", "--text", "one"],
        )
        .await;
        admit(
            &setup,
            "b1",
            "bob",
            ReadWrite,
            &["write", "--path", "bob.txt", "--text", "bob's"],
        )
        .await;
        setup.platform.restart(libc::SIGTERM);
        let _worker = WorkerProcess::start(&setup.platform, "w1", 4, setup.root.path());
        succeeded(&ended(&setup, "a1").await);
        succeeded(&ended(&setup, "b1").await);
        let alice = head(&setup, "alice").await;
        assert_eq!(alice.version, 1);
        let paths: Vec<String> = alice.tree.files.keys().map(|p| p.to_string()).collect();
        assert_eq!(
            paths,
            ["notes/a.txt"],
            "alice's workspace holds only her file"
        );

        admit(
            &setup,
            "a2",
            "alice",
            ReadWrite,
            &[
                "fail-after-write",
                "--path",
                "notes/a.txt",
                "--text",
                "junk",
            ],
        )
        .await;
        admit(
            &setup,
            "a3",
            "alice",
            ReadOnly,
            &["write", "--path", "notes/a.txt", "--text", "ro"],
        )
        .await;
        admit(
            &setup,
            "a4",
            "alice",
            ReadOnly,
            &["read", "--path", "notes/a.txt"],
        )
        .await;
        admit(&setup, "b2", "bob", ReadOnly, &["ls"]).await;
        admit(&setup, "n1", "alice", Filesystem::None, &["ls"]).await;
        setup.platform.restart(libc::SIGTERM);
        assert_eq!(
            failed(&ended(&setup, "a2").await),
            (ErrorKind::ToolError, "failed-on-purpose".into())
        );
        assert_eq!(
            failed(&ended(&setup, "a3").await),
            (ErrorKind::ToolError, "write-failed".into())
        );
        assert_eq!(succeeded(&ended(&setup, "a4").await)["text"], "one");
        assert_eq!(
            succeeded(&ended(&setup, "b2").await)["files"],
            serde_json::json!(["bob.txt"]),
            "bob sees only his own files"
        );
        assert_eq!(
            failed(&ended(&setup, "n1").await),
            (ErrorKind::ToolError, "not-found".into())
        );
        let after = head(&setup, "alice").await;
        assert_eq!(
            after.version, 1,
            "neither the failed nor the read-only calls committed"
        );
        assert_eq!(after.tree, alice.tree);
    }

    #[tokio::test]
    async fn a_write_killed_mid_call_and_replayed_elsewhere_commits_what_an_uninterrupted_run_would()
     {
        use Filesystem::ReadWrite;
        let mut setup = setup().await;
        // The same version 1 for both agents.
        let base: &[(&str, &[u8])] = &[("out/old.txt", b"old"), ("keep", b"kept")];
        commit_through_a_call(&setup.store, "base-alice", "alice", base).await;
        commit_through_a_call(&setup.store, "base-bob", "bob", base).await;
        let argv = [
            "write",
            "--path",
            "out/old.txt",
            "--text",
            "new",
            "--work",
            "1500000000",
        ];

        // Bob's run, uninterrupted.
        admit(&setup, "bob-run", "bob", ReadWrite, &argv).await;
        setup.platform.restart(libc::SIGTERM);
        let mut w0 = WorkerProcess::start(&setup.platform, "w0", 1, setup.root.path());
        succeeded(&ended(&setup, "bob-run").await);
        w0.kill();

        // Alice's, its worker killed mid-call, replayed on another.
        admit(&setup, "alice-run", "alice", ReadWrite, &argv).await;
        setup.platform.restart(libc::SIGTERM);
        let mut w1 = WorkerProcess::start(&setup.platform, "w1", 1, setup.root.path());
        let log = w1.log.clone();
        setup
            .platform
            .eventually(
                "alice's call starts on w1",
                Duration::from_secs(120),
                move || {
                    let log = log.clone();
                    async move {
                        std::fs::read_to_string(&log)
                            .unwrap_or_default()
                            .contains("call started")
                    }
                },
            )
            .await;
        w1.signal(libc::SIGKILL);
        w1.kill();
        let _w2 = WorkerProcess::start(&setup.platform, "w2", 1, setup.root.path());
        succeeded(&ended(&setup, "alice-run").await);
        let oplog = setup.store.oplog("alice-run").await.unwrap();
        assert!(
            oplog.iter().any(|e| e.kind == "fenced"),
            "the first run was taken back: {:?}",
            oplog.iter().map(|e| &e.kind).collect::<Vec<_>>()
        );
        let history = setup
            .store
            .workspace_history(&WorkspaceKey::new("default", "alice"))
            .await
            .unwrap();
        let versions: Vec<u64> = history.iter().map(|v| v.version).collect();
        assert_eq!(versions, [1, 2], "V+1, not V+2");
        assert_eq!(history[1].call_id, "alice-run");
        let bob = head(&setup, "bob").await;
        assert_eq!(bob.version, 2);
        assert_eq!(
            history[1].tree_digest, bob.tree_digest,
            "the same tree as the uninterrupted run"
        );
        assert_ne!(history[1].tree_digest, history[0].tree_digest);
    }

    #[tokio::test]
    async fn a_call_that_grows_the_workspace_past_its_limit_fails_by_name_and_commits_nothing() {
        let mut setup = setup().await;
        // A version at the file limit already (every file the same empty blob).
        let names: Vec<String> = (0..workspace::DEFAULT_MAX_FILES)
            .map(|i| format!("f/{i}"))
            .collect();
        let files: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b""[..])).collect();
        commit_through_a_call(&setup.store, "full", "alice", &files).await;
        admit(
            &setup,
            "one-more",
            "alice",
            Filesystem::ReadWrite,
            &["write", "--path", "g", "--text", "x"],
        )
        .await;
        setup.platform.restart(libc::SIGTERM);
        let _worker = WorkerProcess::start(&setup.platform, "w1", 1, setup.root.path());
        let (kind, _) = failed(&ended(&setup, "one-more").await);
        assert_eq!(kind, ErrorKind::WorkspaceLimit);
        assert_eq!(head(&setup, "alice").await.version, 1);
    }
}

// ---- End to end: agents call through the gateway with their own tokens -------------------

mod end_to_end {
    use super::common::{Platform, WorkerProcess};
    use super::*;
    use serde_json::{Value, json};

    const ALICE_TOKEN: &str = "alice-token-0123456789";
    const BOB_TOKEN: &str = "bob-token-0123456789";

    /// Agents alice and bob (tokens from Secrets), the `workspace` tool, and a binding per
    /// agent and access: `workspace` (readWrite) and `workspace-ro` (readOnly, the same
    /// artifact under another Tool name).
    fn manifests(root: &Path) -> std::path::PathBuf {
        let dir = root.join("manifests");
        std::fs::create_dir_all(&dir).unwrap();
        let (_, bytes) = fixture("workspace");
        std::fs::write(dir.join("workspace.wasm"), bytes).unwrap();
        let tool = |name: &str| {
            format!(
                r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: write
  timeout: 60s
  commands:
    - name: write
      options:
        - {{name: path, schema: {{type: string}}, required: true}}
        - {{name: text, schema: {{type: string}}, required: true}}
        - {{name: work, schema: {{type: integer, minimum: 0}}, default: 0}}
      errors:
        - {{name: write-failed, exitCode: 3}}
    - name: read
      options:
        - {{name: path, schema: {{type: string}}, required: true}}
      errors:
        - {{name: not-found, exitCode: 4}}
    - name: ls
      errors:
        - {{name: not-found, exitCode: 4}}
    - name: fail-after-write
      options:
        - {{name: path, schema: {{type: string}}, required: true}}
        - {{name: text, schema: {{type: string}}, required: true}}
      errors:
        - {{name: failed-on-purpose, exitCode: 5}}
        - {{name: write-failed, exitCode: 3}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: {name}-1.0.0}}
spec: {{tool: {name}, version: 1.0.0, artifact: {{file: workspace.wasm}}}}
"#
            )
        };
        let agent = |name: &str, token: &str| {
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
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: {name}-workspace}}
spec: {{agents: [{name}], tool: workspace, filesystemAccess: readWrite}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: {name}-workspace-ro}}
spec: {{agents: [{name}], tool: workspace-ro, filesystemAccess: readOnly}}
"#
            )
        };
        let pool = "---\napiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\nspec: {replicas: 1, slotsPerWorker: 4}\n".to_string();
        let text = [
            pool,
            tool("workspace"),
            tool("workspace-ro"),
            agent("alice", ALICE_TOKEN),
            agent("bob", BOB_TOKEN),
        ]
        .concat();
        std::fs::write(dir.join("workspace.yaml"), text).unwrap();
        dir
    }

    /// Calls `tool command` over HTTP as the agent holding `token`.
    async fn call(
        platform: &Platform,
        token: &str,
        tool: &str,
        command: &str,
        args: Value,
    ) -> Value {
        let url = format!(
            "http://{}/v1/namespaces/default/tools/{tool}/{command}:call",
            platform.http
        );
        let response = reqwest::Client::new()
            .post(url)
            .bearer_auth(token)
            .json(&json!({ "args": args }))
            .send()
            .await
            .unwrap();
        response.json().await.unwrap()
    }

    fn error_kind(call: &Value) -> String {
        assert_eq!(call["state"], "failed", "{call}");
        call["error"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// `toolgrid workspace ARGS...` as an operator (the admin token of `toolgrid up`).
    fn cli(platform: &Platform, args: &[&str]) -> String {
        let mut all = vec!["workspace"];
        all.extend_from_slice(args);
        let out = platform.cli(&all, None);
        assert!(
            out.status.success(),
            "toolgrid workspace {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn head_version(platform: &Platform, agent: &str) -> u64 {
        let history = cli(platform, &["history", agent, "-o", "json"]);
        let versions: Vec<Value> = serde_json::from_str(&history).unwrap();
        versions
            .last()
            .and_then(|v| v["version"].as_u64())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn two_agents_cannot_see_each_others_files() {
        let root = tempfile::tempdir().unwrap();
        let platform = Platform::start(root.path(), &manifests(root.path()), &[]);
        let wrote = call(
            &platform,
            ALICE_TOKEN,
            "workspace",
            "write",
            json!({"path": "secret.txt", "text": "alice only"}),
        )
        .await;
        assert_eq!(wrote["state"], "succeeded", "{wrote}");
        let bob = call(
            &platform,
            BOB_TOKEN,
            "workspace",
            "read",
            json!({"path": "secret.txt"}),
        )
        .await;
        assert_eq!(error_kind(&bob), "tool-error");
        assert_eq!(bob["error"]["name"], "not-found");
        let listed = call(&platform, BOB_TOKEN, "workspace", "ls", json!({})).await;
        assert_eq!(listed["result"]["files"], json!([]));
        assert_eq!(
            cli(&platform, &["cat", "alice", "secret.txt"]),
            "alice only"
        );
        // Bob's token does not read alice's workspace through the CLI either.
        let out = platform.cli(&["workspace", "ls", "alice", "--token", BOB_TOKEN], None);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("permission-denied"), "{stderr}");
    }

    #[tokio::test]
    async fn a_read_only_call_cannot_write_and_a_failed_call_leaves_no_trace() {
        let root = tempfile::tempdir().unwrap();
        let platform = Platform::start(root.path(), &manifests(root.path()), &[]);
        let first = call(
            &platform,
            ALICE_TOKEN,
            "workspace",
            "write",
            json!({"path": "a", "text": "1"}),
        )
        .await;
        assert_eq!(first["state"], "succeeded", "{first}");
        assert_eq!(head_version(&platform, "alice"), 1);

        let ro = call(
            &platform,
            ALICE_TOKEN,
            "workspace-ro",
            "write",
            json!({"path": "a", "text": "2"}),
        )
        .await;
        assert_eq!(error_kind(&ro), "tool-error");
        assert_eq!(ro["error"]["name"], "write-failed");
        let read = call(
            &platform,
            ALICE_TOKEN,
            "workspace-ro",
            "read",
            json!({"path": "a"}),
        )
        .await;
        assert_eq!(read["result"]["text"], "1");

        let failed = call(
            &platform,
            ALICE_TOKEN,
            "workspace",
            "fail-after-write",
            json!({"path": "a", "text": "3"}),
        )
        .await;
        assert_eq!(failed["error"]["name"], "failed-on-purpose");
        assert_eq!(
            head_version(&platform, "alice"),
            1,
            "no version for a failed call"
        );
        assert_eq!(cli(&platform, &["cat", "alice", "a"]), "1");
    }

    #[tokio::test]
    async fn a_write_killed_mid_call_and_replayed_commits_what_an_uninterrupted_run_would() {
        let root = tempfile::tempdir().unwrap();
        let platform = Platform::start(
            root.path(),
            &manifests(root.path()),
            &["--no-workers", "--lease", "1s"],
        );
        let mut first = WorkerProcess::start(&platform, "w1", 2, root.path());
        // Bob's uninterrupted run, for comparison.
        let args = json!({"path": "out/log.txt", "text": "done", "work": 1_500_000_000u64});
        let uninterrupted = call(&platform, BOB_TOKEN, "workspace", "write", args.clone()).await;
        assert_eq!(uninterrupted["state"], "succeeded", "{uninterrupted}");

        let http = platform.http.clone();
        let pending = tokio::spawn(async move {
            let url = format!("http://{http}/v1/namespaces/default/tools/workspace/write:call");
            reqwest::Client::new()
                .post(url)
                .bearer_auth(ALICE_TOKEN)
                .json(&json!({ "args": args }))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        });
        let log = first.log.clone();
        platform
            .eventually(
                "alice's call runs on w1",
                std::time::Duration::from_secs(60),
                move || {
                    let log = log.clone();
                    async move {
                        std::fs::read_to_string(&log)
                            .unwrap_or_default()
                            .contains("call started")
                    }
                },
            )
            .await;
        first.signal(libc::SIGKILL);
        first.kill();
        let _second = WorkerProcess::start(&platform, "w2", 2, root.path());
        let replayed = pending.await.unwrap();
        assert_eq!(replayed["state"], "succeeded", "{replayed}");
        assert_eq!(head_version(&platform, "alice"), 1, "V+1, not V+2");
        let history = |agent: &str| -> Vec<Value> {
            serde_json::from_str(&cli(&platform, &["history", agent, "-o", "json"])).unwrap()
        };
        assert_eq!(
            history("alice")[0]["treeDigest"],
            history("bob")[0]["treeDigest"],
            "the same tree as the uninterrupted run"
        );
    }

    #[tokio::test]
    async fn a_workspace_over_its_limit_fails_the_call_by_name() {
        let root = tempfile::tempdir().unwrap();
        let platform = Platform::start(root.path(), &manifests(root.path()), &[]);
        // Version 1 at the file limit already, committed as a succeeded call would.
        let url = format!("sqlite://{}", platform.data.join("toolgrid.db").display());
        let store = toolgrid_store::open(&url).await.unwrap();
        let names: Vec<String> = (0..workspace::DEFAULT_MAX_FILES)
            .map(|i| format!("f/{i}"))
            .collect();
        let files: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b""[..])).collect();
        commit_through_a_call(&store, "full", "alice", &files).await;
        let result = call(
            &platform,
            ALICE_TOKEN,
            "workspace",
            "write",
            json!({"path": "one-more", "text": ""}),
        )
        .await;
        assert_eq!(error_kind(&result), "workspace-limit");
        assert_eq!(head_version(&platform, "alice"), 1);
    }
}
