//! Hostile guests: nothing a guest or a response does may grow the host's memory without
//! bound. Each one ends as its own named error kind; through a real worker process, the
//! worker's memory stays bounded, other calls on it finish, and it is never restarted.
//!
//! Timing is never a pass/fail criterion here beyond generous timeouts.

use crate::common;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use common::fixtures::runtime;
use common::{Platform, WorkerProcess, error_kind, fixtures, result_of};
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolgrid_sandbox::runtime::{Compiled, RunOutcome};
use toolgrid_sandbox::{RunRequest, Runtime};
use toolgrid_store::RunLimits;

// ---------------------------------------------------------------------------------------
// A loopback server that answers big bodies and records what reached it.

#[derive(Clone, Debug)]
struct Seen {
    path: String,
    host: Option<String>,
    body_bytes: usize,
}

#[derive(Clone)]
struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    async fn start() -> Server {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let app = axum::Router::new()
            .route("/bytes/{n}", axum::routing::any(bytes))
            .route("/stream/{n}", axum::routing::any(stream))
            .route("/slow", axum::routing::any(slow))
            .fallback(small)
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Server { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn note(seen: &Mutex<Vec<Seen>>, path: String, headers: &HeaderMap, body: &[u8]) {
    seen.lock().unwrap().push(Seen {
        path,
        host: headers
            .get("host")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        body_bytes: body.len(),
    });
}

/// Answers `n` bytes with a Content-Length.
async fn bytes(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    UrlPath(n): UrlPath<usize>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Vec<u8> {
    note(&seen, format!("/bytes/{n}"), &headers, &body);
    vec![b'a'; n]
}

/// Answers `n` bytes in 64 KiB chunks, without a Content-Length.
async fn stream(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    UrlPath(n): UrlPath<usize>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Body {
    note(&seen, format!("/stream/{n}"), &headers, &body);
    let chunk = 64 << 10;
    let chunks = (0..n.div_ceil(chunk)).map(move |i| {
        Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![
            b'b';
            chunk.min(n - i * chunk)
        ]))
    });
    Body::from_stream(futures::stream::iter(chunks))
}

/// Answers after a few seconds, long enough to kill the worker that waits for it.
async fn slow(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> &'static str {
    note(&seen, uri.path().to_string(), &headers, &body);
    tokio::time::sleep(Duration::from_secs(5)).await;
    "{\"slow\": true}"
}

async fn small(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> &'static str {
    note(&seen, uri.path().to_string(), &headers, &body);
    "{\"ok\": true}"
}

// ---------------------------------------------------------------------------------------
// Hostile guests, as WAT.

const IMPORTS: &str = r#"
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (import "toolgrid" "http_send" (func $send (param i32 i32 i32 i32) (result i32)))
  (import "toolgrid" "http_take" (func $take (param i32 i32 i32) (result i32)))"#;

/// `bytes` as a WAT string literal.
fn wat_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:02x}")).collect()
}

/// Sends `document` `times` times. With `take`, takes each response and finally prints the
/// last document and exits with the last result code; without, never takes any and prints
/// `{"ok": true}`.
fn sender(document: &str, times: u32, take: bool, pages: u32) -> String {
    let len = document.len();
    let doc = wat_string(document.as_bytes());
    let ok = wat_string(b"{\"ok\": true}");
    let take_it = if take {
        "(drop (call $take (i32.load (i32.const 16)) (i32.const 65536) (i32.load (i32.const 20))))"
    } else {
        ""
    };
    let finish = if take {
        r#"(i32.store (i32.const 0) (i32.const 65536))
    (i32.store (i32.const 4) (i32.load (i32.const 20)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $proc_exit (local.get $code))"#
    } else {
        r#"(i32.store (i32.const 0) (i32.const 512))
    (i32.store (i32.const 4) (i32.const 12))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))"#
    };
    format!(
        r#"(module {IMPORTS}
  (memory (export "memory") {pages})
  (data (i32.const 512) "{ok}")
  (data (i32.const 1024) "{doc}")
  (func (export "_start") (local $i i32) (local $code i32)
    (loop $again
      (local.set $code (call $send (i32.const 1024) (i32.const {len}) (i32.const 16) (i32.const 20)))
      {take_it}
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (i32.const {times}))))
    {finish}))"#
    )
}

/// Builds `{"method": "POST", "url": URL, "body": "aaa..."}` of a `body`-byte body in its
/// memory and sends it once.
fn big_body_sender(url: &str, body: u32) -> String {
    let prefix = format!(r#"{{"method": "POST", "url": "{url}", "body": ""#);
    let plen = prefix.len() as u32;
    let total = plen + body + 2;
    let pages = (1024 + total).div_ceil(65536) + 1;
    format!(
        r#"(module {IMPORTS}
  (memory (export "memory") {pages})
  (data (i32.const 1024) "{}")
  (func (export "_start")
    (memory.fill (i32.const {fill}) (i32.const 97) (i32.const {body}))
    (i32.store8 (i32.const {q}) (i32.const 34))
    (i32.store8 (i32.const {b}) (i32.const 125))
    (drop (call $send (i32.const 1024) (i32.const {total}) (i32.const 16) (i32.const 20)))))"#,
        wat_string(prefix.as_bytes()),
        fill = 1024 + plen,
        q = 1024 + plen + body,
        b = 1024 + plen + body + 1,
    )
}

/// Calls `http_send` with a request of `len` bytes at `ptr`.
fn raw_sender(ptr: u32, len: u32) -> String {
    format!(
        r#"(module {IMPORTS}
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $send (i32.const {ptr}) (i32.const {len}) (i32.const 16) (i32.const 20)))))"#
    )
}

/// Writes `total` bytes to stdout in 64 KiB writes, ignoring every error, then exits 0.
fn printer(total: u64) -> String {
    let writes = total.div_ceil(64 << 10);
    format!(
        r#"(module {IMPORTS}
  (memory (export "memory") 2)
  (func (export "_start") (local $i i32)
    (memory.fill (i32.const 65536) (i32.const 120) (i32.const 65536))
    (i32.store (i32.const 0) (i32.const 65536))
    (i32.store (i32.const 4) (i32.const 65536))
    (loop $again
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (i32.const {writes}))))))"#
    )
}

fn document(url: &str, headers: &[(&str, &str)]) -> String {
    serde_json::json!({"url": url, "headers": headers}).to_string()
}

// ---------------------------------------------------------------------------------------
// In-process runtime.

fn limits() -> RunLimits {
    RunLimits {
        memory_bytes: 64 << 20,
        cpu_time_ms: 60_000,
        output_bytes: 1 << 20,
        timeout_ms: 120_000,
        instances: 0,
        request_bytes: 0,
        response_bytes: 0,
        max_timeout_ms: 0,
    }
}

async fn compile(runtime: &Runtime, wat: &str) -> Compiled {
    let bytes = wat::parse_str(wat).expect("valid WAT");
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    runtime.compile(&digest, bytes).await.expect("compiles")
}

async fn run(runtime: &Runtime, wat: &str, server: &Server, limits: RunLimits) -> RunOutcome {
    let compiled = compile(runtime, wat).await;
    runtime
        .run(
            &compiled,
            RunRequest {
                call_id: format!("hostile-{}", rand_id()),
                attempt: 1,
                argv: vec!["hostile".into()],
                limits,
                egress: vec![toolgrid_api::EgressRule {
                    host: "127.0.0.1".into(),
                    ports: vec![server.addr.port()],
                    allow_private: true,
                    headers: Default::default(),
                }],
                ..Default::default()
            },
        )
        .await
}

fn rand_id() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst).to_string()
}

fn failure_kind(outcome: &RunOutcome) -> &'static str {
    outcome
        .failure
        .as_ref()
        .map(|f| f.kind.as_str())
        .unwrap_or("none")
}

fn message(outcome: &RunOutcome) -> String {
    outcome
        .failure
        .as_ref()
        .map(|f| f.message.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_huge_request_length_is_request_limit_and_a_stray_pointer_traps() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let server = Server::start().await;
    let outcome = run(&runtime, &raw_sender(0, 0xFFFF_FFF0), &server, limits()).await;
    assert_eq!(
        failure_kind(&outcome),
        "request-limit",
        "{}",
        message(&outcome)
    );
    assert!(
        message(&outcome).contains("4294967280"),
        "{}",
        message(&outcome)
    );
    // Within the limit but outside the guest's memory: a trap, not a host allocation.
    let outcome = run(
        &runtime,
        &raw_sender(0xFFFF_0000, 1 << 20),
        &server,
        limits(),
    )
    .await;
    assert_eq!(failure_kind(&outcome), "trap", "{}", message(&outcome));
    assert!(
        message(&outcome).contains("outside the module's memory"),
        "{}",
        message(&outcome)
    );
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn a_huge_declared_body_is_request_limit_and_never_leaves() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let server = Server::start().await;
    let url = server.url("/sink");
    // 9 MiB against the default 8 MiB.
    let outcome = run(&runtime, &big_body_sender(&url, 9 << 20), &server, limits()).await;
    assert_eq!(
        failure_kind(&outcome),
        "request-limit",
        "{}",
        message(&outcome)
    );
    assert!(message(&outcome).contains("limits.requestBytes"));
    // A release's smaller limit counts too; a body within it is sent.
    let small = RunLimits {
        request_bytes: 64 << 10,
        ..limits()
    };
    let outcome = run(&runtime, &big_body_sender(&url, 65 << 10), &server, small).await;
    assert_eq!(
        failure_kind(&outcome),
        "request-limit",
        "{}",
        message(&outcome)
    );
    assert!(server.seen().is_empty(), "{:?}", server.seen());
    let outcome = run(&runtime, &big_body_sender(&url, 64 << 10), &server, small).await;
    assert!(outcome.failure.is_none(), "{}", message(&outcome));
    assert_eq!(server.seen().len(), 1);
    assert_eq!(server.seen()[0].body_bytes, 64 << 10);
}

#[tokio::test]
async fn a_guest_host_header_never_reaches_the_server() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let server = Server::start().await;
    let url = server.url("/h");
    for (name, value) in [
        ("Host", "evil.internal"),
        ("host", "evil.internal"),
        ("Connection", "close"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "websocket"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
        ("Trailer", "x-evil"),
        ("Content-Length", "0"),
    ] {
        let wat = sender(&document(&url, &[(name, value)]), 1, true, 2);
        let outcome = run(&runtime, &wat, &server, limits()).await;
        assert!(outcome.failure.is_none(), "{name}: {}", message(&outcome));
        assert_eq!(
            outcome.exit_code, 2,
            "{name}: the code of an invalid request"
        );
        let answer: serde_json::Value = serde_json::from_slice(&outcome.stdout).unwrap();
        assert_eq!(
            answer["error"]["kind"], "invalid-request",
            "{name}: {answer}"
        );
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(name),
            "{answer}"
        );
    }
    assert!(server.seen().is_empty(), "{:?}", server.seen());
    // Without it, the request goes, with the host the URL names.
    let wat = sender(&document(&url, &[("x-fine", "1")]), 1, true, 2);
    let outcome = run(&runtime, &wat, &server, limits()).await;
    assert_eq!(outcome.exit_code, 0, "{}", message(&outcome));
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].host.as_deref(),
        Some(server.addr.to_string().as_str())
    );
}

#[tokio::test]
async fn a_response_over_the_limit_is_response_limit() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let server = Server::start().await;
    for path in ["/bytes/20971520", "/stream/20971520", "/stream/8388609"] {
        let wat = sender(&document(&server.url(path), &[]), 1, true, 2);
        let outcome = run(&runtime, &wat, &server, limits()).await;
        assert_eq!(
            failure_kind(&outcome),
            "response-limit",
            "{path}: {}",
            message(&outcome)
        );
        assert!(message(&outcome).contains("limits.responseBytes"));
    }
    // A release's own limit, and a response within it.
    let small = RunLimits {
        response_bytes: 1 << 20,
        output_bytes: 4 << 20,
        ..limits()
    };
    let wat = sender(&document(&server.url("/stream/1048577"), &[]), 1, true, 2);
    let outcome = run(&runtime, &wat, &server, small).await;
    assert_eq!(
        failure_kind(&outcome),
        "response-limit",
        "{}",
        message(&outcome)
    );
    let wat = sender(&document(&server.url("/bytes/1048576"), &[]), 1, true, 64);
    let outcome = run(&runtime, &wat, &server, small).await;
    assert!(outcome.failure.is_none(), "{}", message(&outcome));
    assert_eq!(outcome.exit_code, 0);
    let answer: serde_json::Value = serde_json::from_slice(&outcome.stdout).unwrap();
    assert_eq!(answer["body"].as_str().unwrap().len(), 1 << 20);
}

#[tokio::test]
async fn unread_responses_count_against_the_call_memory() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let server = Server::start().await;
    let wat = sender(&document(&server.url("/bytes/4194304"), &[]), 200, false, 1);
    let outcome = run(&runtime, &wat, &server, limits()).await;
    assert_eq!(
        failure_kind(&outcome),
        "memory-limit",
        "{}",
        message(&outcome)
    );
    assert!(
        message(&outcome).contains("held by the host"),
        "{}",
        message(&outcome)
    );
    // 64 MiB holds fewer than 16 unread responses of 4 MiB.
    let sent = server.seen().len();
    assert!((10..=16).contains(&sent), "{sent} requests");
    // Taking each response keeps the call within its memory.
    let wat = sender(&document(&server.url("/bytes/4194304"), &[]), 30, true, 160);
    let printing = RunLimits {
        output_bytes: 8 << 20,
        ..limits()
    };
    let outcome = run(&runtime, &wat, &server, printing).await;
    assert!(outcome.failure.is_none(), "{}", message(&outcome));
    assert_eq!(outcome.exit_code, 0);
}

#[tokio::test]
async fn seventy_mib_of_stdout_under_a_100_mib_limit_is_output_limit() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let server = Server::start().await;
    let limits = RunLimits {
        output_bytes: 100 << 20,
        ..limits()
    };
    let outcome = run(&runtime, &printer(70 << 20), &server, limits).await;
    assert_eq!(
        failure_kind(&outcome),
        "output-limit",
        "{}",
        message(&outcome)
    );
    assert!(message(&outcome).contains(&(16u64 << 20).to_string()));
    assert!(outcome.stdout.len() <= 16 << 20);
}

#[tokio::test]
async fn a_tampered_compiled_cache_entry_is_never_trusted() {
    let cache = tempfile::tempdir().unwrap();
    let wat = fixtures::OK_JSON;
    let bytes = wat::parse_str(wat).unwrap();
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    runtime(cache.path())
        .compile(&digest, bytes.clone())
        .await
        .unwrap();
    let entries: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mut code = std::fs::read(&entries[0]).unwrap();
    let middle = code.len() / 2;
    code[middle] ^= 0xff;
    std::fs::write(&entries[0], &code).unwrap();
    // A restarted worker refuses the entry and compiles the artifact again.
    let runtime = runtime(cache.path());
    let fetched = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let compiled = runtime
        .prepare(&digest, || {
            let fetched = fetched.clone();
            let bytes = bytes.clone();
            async move {
                fetched.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, toolgrid_sandbox::runtime::PrepareError>(bytes)
            }
        })
        .await
        .unwrap();
    assert!(fetched.load(std::sync::atomic::Ordering::SeqCst));
    let outcome = runtime
        .run(
            &compiled,
            RunRequest {
                call_id: "cache".into(),
                limits: limits(),
                ..Default::default()
            },
        )
        .await;
    assert!(outcome.failure.is_none(), "{}", message(&outcome));
    assert_eq!(&outcome.stdout[..], b"{\"ok\": true}");
}

// ---------------------------------------------------------------------------------------
// Through a real worker process.

fn release(name: &str, wasm: &str, limits: &str, port: u16) -> String {
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec: {{effect: read, timeout: 120s, commands: [{{name: default}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: {name}-1.0.0}}
spec:
  tool: {name}
  version: 1.0.0
  artifact: {{file: ../bin/{wasm}}}
  limits: {limits}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
"#
    )
}

/// A `VmRSS:`/`VmHWM:` line of `/proc/PID/status`, in bytes.
fn proc_status_bytes(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_on_a_real_worker_keep_it_bounded_and_serving() {
    let server = Server::start().await;
    let port = server.addr.port();
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&manifests).unwrap();
    let unread = sender(&document(&server.url("/bytes/4194304"), &[]), 200, false, 1);
    let big = sender(&document(&server.url("/stream/20971520"), &[]), 1, true, 2);
    let host = sender(
        &document(&server.url("/evil"), &[("Host", "evil.internal")]),
        1,
        true,
        2,
    );
    fixtures::write_wat(&bin, "unread.wasm", &unread);
    fixtures::write_wat(&bin, "big.wasm", &big);
    fixtures::write_wat(&bin, "host.wasm", &host);
    fixtures::write_wat(&bin, "flood.wasm", &printer(70 << 20));
    fixtures::write_wat(&bin, "hugelen.wasm", &raw_sender(0, 0xFFFF_FFF0));
    fixtures::write_wat(&bin, "ok.wasm", fixtures::OK_JSON);
    let mut text = String::from(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\nspec: {replicas: 1, slotsPerWorker: 4}\n",
    );
    text += &release("unread", "unread.wasm", "{}", port);
    text += &release("big", "big.wasm", "{}", port);
    text += &release("host", "host.wasm", "{}", port);
    text += &release("flood", "flood.wasm", "{outputBytes: 100Mi}", port);
    text += &release("hugelen", "hugelen.wasm", "{}", port);
    text += &release("ok", "ok.wasm", "{}", port);
    text += &release("zero", "../../../../../../../../dev/zero", "{}", port);
    std::fs::write(manifests.join("tools.yaml"), text).unwrap();
    let platform = Platform::start(root.path(), &manifests, &["--no-workers"]);
    let worker = WorkerProcess::start(&platform, "hostile", 4, root.path());
    let pid = worker.pid();
    platform
        .eventually("an attached worker", Duration::from_secs(60), || async {
            platform
                .resource("pools", "default")
                .await
                .is_some_and(|row| {
                    row.columns
                        .iter()
                        .any(|c| c.name == "Attached" && c.value == "1")
                })
        })
        .await;
    // The release says its output limit is clamped.
    let flood = platform.resource("releases", "flood-1.0.0").await.unwrap();
    assert_eq!(flood.ready, "True", "{}", flood.message);
    assert!(
        flood.message.contains("limits.outputBytes 100Mi")
            && flood.message.contains("limited to 16Mi"),
        "{}",
        flood.message
    );
    // A device is not an artifact: refused with a clear condition, never read.
    let zero = platform.resource("releases", "zero-1.0.0").await.unwrap();
    assert_eq!(zero.ready, "False");
    assert_eq!(zero.reason, "InvalidArtifactFile", "{}", zero.message);
    assert!(
        zero.message
            .contains("not a regular file (it is a character device)"),
        "{}",
        zero.message
    );
    let ok = || async {
        let call = platform.call("ok", &[]).await.unwrap();
        assert_eq!(result_of(&call), serde_json::json!({"ok": true}));
    };
    ok().await;

    for (tool, expected) in [
        ("unread", "memory-limit"),
        ("big", "response-limit"),
        ("flood", "output-limit"),
        ("hugelen", "request-limit"),
        ("host", "tool-error"),
    ] {
        // Each hostile call runs beside healthy ones on the same worker.
        let (hostile, a, b) = tokio::join!(platform.call(tool, &[]), ok(), ok());
        let ((), ()) = (a, b);
        let call = hostile.unwrap();
        assert_eq!(error_kind(&call), expected, "{tool}: {:?}", call.error);
        let hwm = proc_status_bytes(pid, "VmHWM:");
        let rss = proc_status_bytes(pid, "VmRSS:");
        eprintln!("after {tool}: worker VmRSS {rss} bytes, VmHWM {hwm} bytes");
        // Unbounded, 200 unread responses of 4 MiB alone would hold 800 MiB.
        assert!(
            hwm > 0 && hwm < 512 << 20,
            "{tool}: worker VmHWM {hwm} bytes"
        );
    }
    assert!(
        !server
            .seen()
            .iter()
            .any(|s| s.path == "/evil" || s.host.as_deref() == Some("evil.internal")),
        "the Host header reached the server"
    );
    // The same worker process served everything: it never died or restarted.
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .is_ok_and(|s| !s.contains("State:\tZ")),
        "the worker is gone; log:\n{}",
        worker.logs()
    );
    let logs = worker.logs();
    assert!(!logs.contains("panicked"), "{logs}");
    ok().await;
}

/// Draws `draws` random blocks of `block` bytes (each its own oplog entry: a clock reading
/// between them stops them coalescing), then GETs `fast` (committing all of it first), then
/// GETs `slow`, then prints `{"ok": true}`.
fn big_oplog(draws: u32, block: u32, fast: &str, slow: &str) -> String {
    let (fast_len, slow_len) = (fast.len(), slow.len());
    let (fast, slow) = (wat_string(fast.as_bytes()), wat_string(slow.as_bytes()));
    let ok = wat_string(b"{\"ok\": true}");
    let pages = (block + 65536).div_ceil(65536);
    format!(
        r#"(module {IMPORTS}
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (memory (export "memory") {pages})
  (data (i32.const 512) "{ok}")
  (data (i32.const 1024) "{fast}")
  (data (i32.const 4096) "{slow}")
  (func (export "_start") (local $i i32)
    (loop $draws
      (drop (call $random (i32.const 65536) (i32.const {block})))
      (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 32)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $draws (i32.lt_u (local.get $i) (i32.const {draws}))))
    (drop (call $send (i32.const 1024) (i32.const {fast_len}) (i32.const 16) (i32.const 20)))
    (drop (call $send (i32.const 4096) (i32.const {slow_len}) (i32.const 16) (i32.const 20)))
    (i32.store (i32.const 0) (i32.const 512))
    (i32.store (i32.const 4) (i32.const 12))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#
    )
}

/// A call whose oplog outgrows one message of the worker link (64 MiB): its commits go in
/// link-sized appends, and when its worker dies its replay goes to the next worker in
/// chunks; it still finishes, and neither stream breaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oplog_larger_than_a_link_message_commits_and_replays_in_chunks() {
    let server = Server::start().await;
    let port = server.addr.port();
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&manifests).unwrap();
    let wat = big_oplog(
        5,
        2 << 20,
        &document(&server.url("/fast"), &[]),
        &document(&server.url("/slow"), &[]),
    );
    fixtures::write_wat(&bin, "big-oplog.wasm", &wat);
    let mut text = String::from(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\nspec: {replicas: 1, slotsPerWorker: 2}\n",
    );
    text += &release("bigoplog", "big-oplog.wasm", "{cpuTime: 60s}", port);
    std::fs::write(manifests.join("tools.yaml"), text).unwrap();
    // A killed worker is noticed by its stream closing; the lease only has to outlast a
    // debug build busy with tens of MiB of entries on a loaded machine.
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "20s"]);
    let mut first = WorkerProcess::start(&platform, "first", 2, root.path());
    let call = {
        let platform_call = platform.call("bigoplog", &[]);
        tokio::pin!(platform_call);
        // The worker is waiting for /slow: everything before it is durable. Kill it.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            tokio::select! {
                done = &mut platform_call => panic!("the call ended before its worker was killed: {done:?}"),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            if server.seen().iter().any(|s| s.path == "/slow") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the call never reached /slow; worker log:\n{}\ncontrol plane log:\n{}",
                first.logs(),
                platform.logs()
            );
        }
        first.kill();
        let second = WorkerProcess::start(&platform, "second", 2, root.path());
        let call = platform_call.await.unwrap();
        (call, second)
    };
    let (call, second) = call;
    assert_eq!(
        result_of(&call),
        serde_json::json!({"ok": true}),
        "{:?}\nworker log:\n{}",
        call.error,
        second.logs()
    );
    let oplog = platform.oplog(&call.id).await;
    let payload_bytes: usize = oplog.iter().map(|e| e.payload_json.len()).sum();
    assert!(
        payload_bytes > 64 << 20,
        "the oplog is larger than one link message: {payload_bytes} bytes"
    );
    let replay = oplog
        .iter()
        .find(|e| e.kind == "replay")
        .expect("the second worker replayed the call");
    assert!(
        replay.payload_json.contains("\"worker\":\"second\""),
        "{}",
        replay.payload_json
    );
    // Over HTTP the same oplog comes in pages, each under a gRPC client's default limit.
    let http = platform.http_client();
    let (mut from, mut pages, mut seqs) = (0u64, 0, Vec::new());
    loop {
        let page: serde_json::Value = http
            .get(format!(
                "http://{}/v1/calls/{}/oplog?fromSeq={from}",
                platform.http, call.id
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        pages += 1;
        let entries = page["entries"].as_array().unwrap();
        seqs.extend(entries.iter().map(|e| e["seq"].as_u64().unwrap()));
        if page["more"] != true {
            break;
        }
        from = page["nextSeq"].as_u64().unwrap();
    }
    assert!(pages > 1, "an 80 MiB oplog takes more than one page");
    assert_eq!(
        seqs,
        oplog.iter().map(|e| e.seq).collect::<Vec<_>>(),
        "the pages hold every entry once, in order"
    );
    // The fast request was answered from the oplog; only the in-flight slow GET was re-sent.
    let fast = server.seen().iter().filter(|s| s.path == "/fast").count();
    assert_eq!(fast, 1, "the recorded request was not sent again");
}
