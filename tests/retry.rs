//! Retries of read and idempotent calls, against a real `toolgrid up` and the `flaky`
//! fixture (tests/fixtures/tools/flaky): `flaky fetch --url URL` GETs the witness once and
//! exits with the declared retryable error `upstream-busy` when it answers 503. The witness
//! answers 503 to the first N requests with a given Idempotency-Key to `/flaky/N/...`, and
//! records every request, so it sees each attempt and the key it carried.

use crate::common;

use common::witness::Witness;
use common::{Platform, error_kind, fixtures, result_of};
use std::path::{Path, PathBuf};
use toolgrid_core::call::OplogEntry;
use toolgrid_proto as proto;

/// A Tool running `flaky fetch` with `effect` and `retry` (a YAML flow mapping, or empty).
fn fetch_tool(name: &str, effect: &str, retry: &str, port: u16) -> String {
    let wasm = fixtures::repo().join("tests/fixtures/tools/flaky/flaky.wasm");
    let retry = if retry.is_empty() {
        String::new()
    } else {
        format!("\n  retry: {retry}")
    };
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: {effect}
  timeout: 60s{retry}
  commands:
    - name: fetch
      options:
        - {{name: url, schema: {{type: string}}, required: true}}
      result: {{type: object, required: [status]}}
      errors:
        - {{name: request-failed, exitCode: 3}}
        - {{name: egress-denied, exitCode: 4}}
        - {{name: upstream-busy, exitCode: 5, retryable: true}}
        - {{name: upstream-failed, exitCode: 6}}
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
}

fn manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let pool = "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\nspec: {replicas: 1, slotsPerWorker: 4}\n";
    let text = [
        pool.to_string(),
        fetch_tool("fetch-read", "read", "{attempts: 3, backoff: 50ms}", port),
        fetch_tool("fetch-write", "write", "{attempts: 3, backoff: 50ms}", port),
        fetch_tool("fetch-idempotent", "idempotent", "", port),
        fetch_tool("fetch-once", "read", "{attempts: 1}", port),
    ]
    .concat();
    std::fs::write(dir.join("tools.yaml"), text).unwrap();
    dir
}

async fn fetch(platform: &Platform, tool: &str, url: &str) -> proto::Call {
    platform
        .call(tool, &["fetch", "--url", url])
        .await
        .expect("the call is admitted")
}

/// The call's oplog entries, parsed.
async fn entries(platform: &Platform, call_id: &str) -> Vec<OplogEntry> {
    platform
        .oplog(call_id)
        .await
        .into_iter()
        .map(|r| OplogEntry::from_text(&r.kind, r.payload_json.as_bytes()).expect("entry parses"))
        .collect()
}

fn retries(entries: &[OplogEntry]) -> Vec<toolgrid_core::call::Retry> {
    entries
        .iter()
        .filter_map(|e| match e {
            OplogEntry::Retry(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn count(entries: &[OplogEntry], kind: toolgrid_core::call::EntryKind) -> usize {
    entries.iter().filter(|e| e.kind() == kind).count()
}

/// The Idempotency-Keys of the witness's requests to `path`, in arrival order.
fn keys_at(witness: &Witness, path: &str) -> Vec<Option<String>> {
    witness
        .seen()
        .into_iter()
        .filter(|s| s.path == path)
        .map(|s| s.key)
        .collect()
}

#[tokio::test]
async fn a_read_call_is_retried_with_the_same_keys_and_a_write_call_runs_once() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let platform = Platform::start(root.path(), &manifests(root.path(), &witness), &[]);
    let base = witness.base();

    // Read: 503 twice, then 200. Three attempts, one key.
    let call = fetch(&platform, "fetch-read", &format!("{base}/flaky/2/read")).await;
    assert_eq!(result_of(&call), serde_json::json!({"status": 200}));
    let key = format!("toolgrid-{}-1", call.id);
    assert_eq!(keys_at(&witness, "/flaky/2/read"), vec![Some(key); 3]);
    let log = entries(&platform, &call.id).await;
    let retried = retries(&log);
    assert_eq!(
        retried.iter().map(|r| r.attempt).collect::<Vec<_>>(),
        [1, 2]
    );
    for retry in &retried {
        assert_eq!(retry.error.kind, toolgrid_core::call::ErrorKind::ToolError);
        assert_eq!(retry.error.name, "upstream-busy");
    }
    assert_eq!(
        retried.iter().map(|r| r.backoff_ms).collect::<Vec<_>>(),
        [50, 100],
        "the backoff doubles"
    );
    // Each attempt was assigned; the oplog keeps every attempt's request.
    assert_eq!(count(&log, toolgrid_core::call::EntryKind::Assigned), 3);
    assert_eq!(count(&log, toolgrid_core::call::EntryKind::HttpRequest), 3);
    assert_eq!(count(&log, toolgrid_core::call::EntryKind::Outcome), 1);

    // Write: the same failure ends the call after one attempt, with one request.
    let call = fetch(&platform, "fetch-write", &format!("{base}/flaky/2/write")).await;
    assert_eq!(error_kind(&call), "tool-error");
    assert_eq!(call.error.as_ref().unwrap().name, "upstream-busy");
    assert_eq!(keys_at(&witness, "/flaky/2/write").len(), 1);
    let log = entries(&platform, &call.id).await;
    assert!(retries(&log).is_empty());
    assert_eq!(count(&log, toolgrid_core::call::EntryKind::Assigned), 1);

    // `retry: {attempts: 1}` turns retries off for a read tool too.
    let call = fetch(&platform, "fetch-once", &format!("{base}/flaky/1/once")).await;
    assert_eq!(error_kind(&call), "tool-error");
    assert_eq!(keys_at(&witness, "/flaky/1/once").len(), 1);
}

#[tokio::test]
async fn attempts_run_out_with_the_last_error_and_the_default_is_three() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let platform = Platform::start(root.path(), &manifests(root.path(), &witness), &[]);
    let base = witness.base();

    // Busy five times: three attempts, all refused; the call ends with the third's error.
    let call = fetch(&platform, "fetch-read", &format!("{base}/flaky/5/out")).await;
    assert_eq!(error_kind(&call), "tool-error");
    let error = call.error.clone().unwrap();
    assert_eq!(error.name, "upstream-busy");
    let key = format!("toolgrid-{}-1", call.id);
    assert_eq!(keys_at(&witness, "/flaky/5/out"), vec![Some(key); 3]);
    let log = entries(&platform, &call.id).await;
    assert_eq!(retries(&log).len(), 2);
    match log.last() {
        Some(OplogEntry::Outcome(outcome)) => {
            assert_eq!(outcome.error.as_ref().unwrap().name, "upstream-busy")
        }
        other => panic!("the last entry is not the outcome: {other:?}"),
    }

    // An idempotent tool without `retry` gets three attempts in all.
    let call = fetch(
        &platform,
        "fetch-idempotent",
        &format!("{base}/flaky/2/idem"),
    )
    .await;
    assert_eq!(result_of(&call), serde_json::json!({"status": 200}));
    assert_eq!(keys_at(&witness, "/flaky/2/idem").len(), 3);
    let call = fetch(
        &platform,
        "fetch-idempotent",
        &format!("{base}/flaky/3/idem"),
    )
    .await;
    assert_eq!(error_kind(&call), "tool-error");
    assert_eq!(keys_at(&witness, "/flaky/3/idem").len(), 3);

    // A failure that is not transient is never retried: the witness is not reached at
    // all (egress refuses another port), and the call ends after one attempt.
    let call = fetch(&platform, "fetch-read", "http://127.0.0.1:9/flaky/1/x").await;
    assert_eq!(error_kind(&call), "tool-error");
    assert_ne!(call.error.as_ref().unwrap().name, "upstream-busy");
    assert!(retries(&entries(&platform, &call.id).await).is_empty());
}
