//! A call runs on the release it was admitted with: its digest is fixed at admission, so a
//! release deleted while its calls run does not stop them. Twenty calls of a release are
//! in flight when its manifest is removed; each finishes, on that release's digest, with
//! every one of its requests made once (the witness), while a new call finds no release.

use crate::common;
use common::witness::Witness;
use common::{Platform, fixtures, result_of};
use std::time::Duration;
use toolgrid_proto as proto;

const CALLS: usize = 20;
const STEPS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_deleted_while_its_calls_run_lets_them_finish_on_its_digest() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let wasm = fixtures::repo().join("tests/fixtures/tools/slow/slow.wasm");
    let digest = toolgrid_core::artifact::digest_of(&std::fs::read(&wasm).unwrap());
    std::fs::write(
        dir.join("tool.yaml"),
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\n\
         spec: {replicas: 2, slotsPerWorker: 12}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {name: slow}\n\
         spec:\n  effect: read\n  timeout: 60s\n  repeatWindow: 0s\n  commands:\n    - name: run\n      \
         options:\n        - {name: base, schema: {type: string}, required: true}\n        \
         - {name: run, schema: {type: string}, required: true}\n        \
         - {name: steps, schema: {type: integer}}\n        \
         - {name: sleep-ms, schema: {type: integer}}\n      result: {type: object}\n",
    )
    .unwrap();
    let release = dir.join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "apiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: slow-1.0.0}}\n\
             spec:\n  tool: slow\n  version: 1.0.0\n  artifact: {{file: {}}}\n  \
             network: {{egress: [{{host: 127.0.0.1, ports: [{}], allowPrivate: true}}]}}\n",
            wasm.display(),
            witness.addr.port()
        ),
    )
    .unwrap();
    let platform = Platform::start(root.path(), &dir, &[]);
    platform.ready("tools", "slow").await;

    let base = witness.base();
    let mut calls = Vec::new();
    for i in 0..CALLS {
        let mut client = platform.client().await;
        let request = proto::InvokeRequest {
            tool: "slow".into(),
            argv: [
                "run",
                "--base",
                &base,
                "--run",
                &format!("r{i}"),
                "--steps",
                &STEPS.to_string(),
                "--sleep-ms",
                "1000",
            ]
            .map(String::from)
            .to_vec(),
            ..Default::default()
        };
        calls.push(tokio::spawn(async move {
            client.invoke(request).await.map(|r| r.into_inner())
        }));
    }
    // Every call has made its first request: all twenty are running.
    let first_steps = |seen: &[common::witness::Seen]| {
        (0..CALLS).all(|i| {
            seen.iter().any(|s| {
                s.query
                    .as_deref()
                    .is_some_and(|q| q.contains(&format!("run=r{i}&")))
            })
        })
    };
    assert!(
        witness.wait_for(Duration::from_secs(60), first_steps).await,
        "the calls did not all start\n{}",
        platform.logs()
    );

    // The release goes while they run.
    std::fs::remove_file(&release).unwrap();
    platform
        .eventually("the release to go", Duration::from_secs(30), || async {
            platform.resource("releases", "slow-1.0.0").await.is_none()
        })
        .await;
    // ...before they end (each sleeps a second before each of its requests).
    let ended = (0..CALLS)
        .filter(|i| {
            witness
                .seen()
                .iter()
                .filter(|s| {
                    s.query
                        .as_deref()
                        .is_some_and(|q| q.contains(&format!("run=r{i}&n={STEPS}")))
                })
                .count()
                > 0
        })
        .count();
    assert!(
        ended < CALLS,
        "every call had ended before the release went"
    );
    let refused = platform
        .call("slow", &["run", "--base", &base, "--run", "late"])
        .await;
    assert!(refused.is_err(), "a new call has no release: {refused:?}");

    // Each finishes, on the digest it was admitted with, each request made once.
    for (i, call) in calls.into_iter().enumerate() {
        let call = call.await.unwrap().expect("the call is answered");
        assert_eq!(
            call.state,
            proto::CallState::Succeeded as i32,
            "r{i}: {call:?}\n{}",
            platform.logs()
        );
        assert_eq!(call.release_digest, digest, "r{i}");
        assert_eq!(result_of(&call)["run"], format!("r{i}"));
    }
    let seen = witness.seen();
    for i in 0..CALLS {
        let mut keys: Vec<&str> = seen
            .iter()
            .filter(|s| {
                s.query
                    .as_deref()
                    .is_some_and(|q| q.contains(&format!("run=r{i}&")))
            })
            .filter_map(|s| s.key.as_deref())
            .collect();
        assert_eq!(keys.len(), STEPS, "r{i}: {keys:?}");
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), STEPS, "r{i}: a request was made twice");
    }
    assert!(
        !seen
            .iter()
            .any(|s| s.query.as_deref().is_some_and(|q| q.contains("run=late&")))
    );
}
