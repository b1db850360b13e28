//! Config and secrets reach a tool only as granted: config and revealable secrets as
//! environment variables, readable secrets only by reference (`${secret:NAME}` in a header
//! the release declares on its egress rule, substituted as the request leaves; what the
//! tool writes, `${secret:NAME}` included, is sent as written), and no secret value in the
//! tool's view of a response, its result, the oplog, the store file or the logs. What an
//! agent can do with arguments against this is tests/secret_exfiltration.rs.
//!
//! On the `secrets` fixture (tests/fixtures/tools/secrets, a C tool built with zig) and the
//! loopback witness, which echoes what it received. Three levels: the worker runtime
//! in-process (given the secrets an `Assign` carries), a control plane in-process with real
//! worker processes (secrets resolved at assignment, a worker killed mid-call), and the
//! whole `toolgrid up` from manifests, the agent calling with its own token.

use crate::common;

use common::fixtures::{self, runtime};
use common::witness::Witness;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgrid_api::EgressRule;
use toolgrid_core::call::OplogEntry;
use toolgrid_core::secret::SecretValue;
use toolgrid_sandbox::RunRequest;
use toolgrid_sandbox::runtime::MemorySink;
use toolgrid_sandbox::secrets::header_digest;
use toolgrid_store::RunLimits;

/// The readable secret: only ever used by reference.
const TOKEN: &str = "s3cr3t-value-7Qx9";
/// The revealable secret: the tool reads it from its environment.
const REVEALED: &str = "r3v3aled-K4y-2Lp";
const REGION: &str = "eu-west-1";
/// The readable secret after a rotation.
const ROTATED: &str = "r0tated-t0ken-8Wm3";

fn fixture() -> (String, Vec<u8>) {
    let bytes =
        std::fs::read(fixtures::repo().join("tests/fixtures/tools/secrets/secrets.wasm")).unwrap();
    (
        format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
        bytes,
    )
}

fn granted(token: &str) -> BTreeMap<String, SecretValue> {
    [
        ("api-token".to_string(), SecretValue::new(token)),
        ("signing-key".to_string(), SecretValue::new(REVEALED)),
    ]
    .into()
}

/// What a worker runs for an `Assign` carrying `region` and the revealed `signing-key` in
/// `env`, and both secrets in `secrets`.
fn assigned(
    witness: &Witness,
    args: &[&str],
    secrets: BTreeMap<String, SecretValue>,
) -> RunRequest {
    let mut argv = vec![
        "secrets".to_string(),
        "run".into(),
        "--base".into(),
        witness.base(),
    ];
    argv.extend(args.iter().map(|s| s.to_string()));
    RunRequest {
        call_id: "secret-call".into(),
        attempt: 1,
        argv,
        env: vec![
            ("region".into(), REGION.into()),
            ("signing-key".into(), REVEALED.into()),
        ],
        limits: RunLimits {
            memory_bytes: 64 << 20,
            cpu_time_ms: 10_000,
            output_bytes: 1 << 20,
            timeout_ms: 30_000,
            ..RunLimits::default()
        },
        egress: vec![declared_rule(witness.addr.port())],
        secrets,
        ..RunRequest::default()
    }
}

/// The witness's egress rule, declaring the header that carries the readable secret.
fn declared_rule(port: u16) -> EgressRule {
    EgressRule {
        host: "127.0.0.1".into(),
        ports: vec![port],
        allow_private: true,
        headers: [(
            "authorization".to_string(),
            "Bearer ${secret:api-token}".to_string(),
        )]
        .into(),
    }
}

/// Panics if `text` holds either secret value.
#[track_caller]
fn assert_no_plaintext(what: &str, text: &[u8]) {
    for value in [TOKEN, REVEALED, ROTATED] {
        assert!(
            !text
                .windows(value.len())
                .any(|window| window == value.as_bytes()),
            "{what} holds the plaintext of a secret ({value})"
        );
    }
}

fn payloads(entries: &[OplogEntry]) -> String {
    entries
        .iter()
        .map(|e| format!("{} {}\n", e.kind(), e.payload_text()))
        .collect()
}

fn http_request(entries: &[OplogEntry]) -> toolgrid_core::call::HttpRequest {
    entries
        .iter()
        .find_map(|e| match e {
            OplogEntry::HttpRequest(r) => Some(r.clone()),
            _ => None,
        })
        .expect("an http-request entry")
}

/// Checks what the tool printed: the config, and only references where secrets were.
#[track_caller]
fn assert_result_shows_only_references(stdout: &[u8]) {
    assert_no_plaintext("the tool's result", stdout);
    let result: serde_json::Value = serde_json::from_slice(stdout).unwrap();
    assert_eq!(result["config"], REGION, "{result}");
    assert_eq!(result["revealed"], "${secret:signing-key}", "{result}");
    assert_eq!(result["status"], 200, "{result}");
    let echo: serde_json::Value = serde_json::from_str(result["echo"].as_str().unwrap()).unwrap();
    assert_eq!(
        echo["authorization"], "Bearer ${secret:api-token}",
        "{echo}"
    );
    assert_eq!(echo["query"], "k=${secret:api-token}", "{echo}");
    assert_eq!(echo["revealed"], "${secret:signing-key}", "{echo}");
}

#[tokio::test]
async fn the_destination_sees_the_values_the_tool_and_the_oplog_only_references() {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, bytes) = fixture();
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let sink = Arc::new(MemorySink::default());
    let mut run = assigned(&witness, &[], granted(TOKEN));
    run.sink = Some(sink.clone());
    let outcome = runtime.run(&compiled, run).await;
    assert!(
        outcome.failure.is_none() && outcome.exit_code == 0,
        "{:?} {}",
        outcome.failure,
        String::from_utf8_lossy(&outcome.stderr_tail)
    );

    // The request left with the declared header substituted (replacing the one the tool
    // wrote), and the reference the tool wrote in its URL as written.
    let seen = witness.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/echo");
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert_eq!(seen[0].query.as_deref(), Some("k=${secret:api-token}"));
    assert_eq!(seen[0].revealed.as_deref(), Some(REVEALED));

    // The tool got the response redacted, and its printed revealed value is redacted too.
    assert_result_shows_only_references(&outcome.stdout);
    assert_no_plaintext("stderr", &outcome.stderr_tail);

    // The oplog holds the request as written, credential headers as digests.
    let mut entries = sink.entries.lock().unwrap().clone();
    entries.extend(outcome.log.take_pending());
    assert_no_plaintext("the oplog", payloads(&entries).as_bytes());
    let request = http_request(&entries);
    assert!(
        request.url.ends_with("/echo?k=${secret:api-token}"),
        "{}",
        request.url
    );
    assert_eq!(
        request.headers[1],
        (
            "authorization".to_string(),
            header_digest("Bearer ${secret:api-token}")
        ),
        "the declared header, as the digest of its template"
    );
    assert_eq!(
        request.headers[0],
        (
            "x-revealed".to_string(),
            header_digest("${secret:signing-key}")
        ),
        "a header holding a revealed value is digested as its reference"
    );
    assert_eq!(request.digested, [0, 1]);
}

#[tokio::test]
async fn a_replay_matches_credential_headers_by_digest_across_a_rotation() {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, bytes) = fixture();
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    let sink = Arc::new(MemorySink::default());
    let mut first = assigned(&witness, &[], granted(TOKEN));
    first.sink = Some(sink.clone());
    let live = runtime.run(&compiled, first).await;
    assert_eq!(live.exit_code, 0);
    let mut recorded = sink.entries.lock().unwrap().clone();
    recorded.extend(live.log.take_pending());

    // Another worker replays the whole oplog: request 1 matches on its digests, even though
    // the secret has been rotated since, and nothing is sent again.
    let mut replay = assigned(&witness, &[], granted(ROTATED));
    replay.attempt = 2;
    replay.replay = recorded.clone();
    let replayed = runtime.run(&compiled, replay).await;
    assert!(replayed.failure.is_none(), "{:?}", replayed.failure);
    assert_eq!(replayed.stdout, live.stdout);
    assert_eq!(witness.seen().len(), 1, "answered from the oplog");
    assert_eq!(
        replayed.log.counts(),
        (1, 0),
        "one request replayed, nothing recorded"
    );

    // Killed after the request left but before its response was recorded: the request is
    // re-sent (a GET), with the same key and the real value again.
    let in_flight: Vec<OplogEntry> = recorded
        .iter()
        .filter(|e| !matches!(e, OplogEntry::HttpResponse(_)))
        .cloned()
        .collect();
    let mut resend = assigned(&witness, &[], granted(TOKEN));
    resend.attempt = 2;
    resend.replay = in_flight;
    let resent = runtime.run(&compiled, resend).await;
    assert!(resent.failure.is_none(), "{:?}", resent.failure);
    assert_result_shows_only_references(&resent.stdout);
    let seen = witness.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].key, seen[0].key, "the same idempotency key");
    assert_eq!(seen[1].authorization, seen[0].authorization);
    assert_no_plaintext(
        "the re-sent oplog",
        payloads(&resent.log.take_pending()).as_bytes(),
    );

    // An oplog whose Authorization digest differs (the tool wrote another header before) is
    // a divergence, though method, URL and body match.
    let mut tampered = recorded.clone();
    for entry in &mut tampered {
        if let OplogEntry::HttpRequest(request) = entry {
            for (name, value) in &mut request.headers {
                if name == "authorization" {
                    *value = header_digest("Bearer ${secret:other}");
                }
            }
        }
    }
    let mut diverging = assigned(&witness, &[], granted(TOKEN));
    diverging.attempt = 2;
    diverging.replay = tampered;
    let diverged = runtime.run(&compiled, diverging).await;
    let failure = diverged.failure.expect("a divergence");
    assert_eq!(failure.kind.as_str(), "replay-divergence");
    assert!(
        failure.message.contains("authorization"),
        "{}",
        failure.message
    );
    assert_eq!(witness.seen().len(), 2, "nothing was sent");
}

#[tokio::test]
async fn an_unknown_reference_is_refused_before_it_leaves() {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, bytes) = fixture();
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    // Only `signing-key` is granted; the release's declared header refers to `api-token`
    // (a binding like this is not Ready: UngrantedSecretReference; this is the worker's
    // own check).
    let only_revealed: BTreeMap<String, SecretValue> =
        [("signing-key".to_string(), SecretValue::new(REVEALED))].into();
    let outcome = runtime
        .run(&compiled, assigned(&witness, &[], only_revealed.clone()))
        .await;
    assert_eq!(
        outcome.exit_code,
        4,
        "the tool's `denied` exit: {:?} {}",
        outcome.failure,
        String::from_utf8_lossy(&outcome.stderr_tail)
    );
    let result: serde_json::Value = serde_json::from_slice(&outcome.stdout).unwrap();
    assert_eq!(result["error"]["denied"], true, "{result}");
    let message = result["error"]["message"].as_str().unwrap();
    assert!(message.contains("${secret:api-token}"), "{message}");
    assert!(
        witness.seen().is_empty(),
        "nothing left, not even the reference"
    );

    let entries = outcome.log.take_pending();
    let denied = entries
        .iter()
        .find_map(|e| match e {
            OplogEntry::HttpDenied(d) => Some(d.clone()),
            _ => None,
        })
        .expect("an http-denied entry");
    assert_eq!(denied.kind.map(|k| k.as_str()), Some("unknown-secret"));
    assert_no_plaintext("the oplog", payloads(&entries).as_bytes());

    // A replay of the refusal refuses the same way, without the network.
    let mut replay = assigned(&witness, &[], only_revealed);
    replay.replay = entries;
    replay.attempt = 2;
    let replayed = runtime.run(&compiled, replay).await;
    assert_eq!(replayed.exit_code, 4, "{:?}", replayed.failure);
    assert_eq!(replayed.stdout, outcome.stdout);
    assert!(witness.seen().is_empty());
}

#[tokio::test]
async fn a_response_that_grows_past_its_limit_once_redacted_is_response_limit() {
    let witness = Witness::start().await;
    let cache = tempfile::tempdir().unwrap();
    let runtime = runtime(cache.path());
    let (digest, bytes) = fixture();
    let compiled = runtime.compile(&digest, bytes).await.unwrap();
    // Exactly what the witness answers: within the limit as it arrives, past it once each
    // value is replaced by its (longer) reference.
    let echoed = serde_json::json!({
        "authorization": format!("Bearer {TOKEN}"),
        "query": "k=${secret:api-token}",
        "revealed": REVEALED,
        "body": "",
    })
    .to_string();
    let mut run = assigned(&witness, &[], granted(TOKEN));
    run.limits.response_bytes = echoed.len() as u64;
    let outcome = runtime.run(&compiled, run).await;
    let failure = outcome.failure.expect("response-limit");
    assert_eq!(failure.kind.as_str(), "response-limit");
    assert!(
        failure.message.contains("once secret values are redacted"),
        "{}",
        failure.message
    );
    assert_eq!(
        witness.seen().len(),
        1,
        "the request left; its response was refused"
    );
    assert_no_plaintext("the failure", failure.message.as_bytes());
    assert_no_plaintext(
        "the oplog",
        payloads(&outcome.log.take_pending()).as_bytes(),
    );
}

// ------------------------------------------------------------------------------------------
// A control plane in-process (store, scheduler, worker link) with real `toolgrid worker`
// processes: secret values resolved when the call is assigned, and again when it is
// re-assigned after its worker is killed mid-call.

/// Everything the process logs (the in-process control plane's `tracing`), for grepping.
fn captured_logs() -> Arc<std::sync::Mutex<Vec<u8>>> {
    static LOGS: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info,toolgrid=trace"))
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .try_init();
        buffer
    })
    .clone()
}

struct LogWriter(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A `toolgrid worker` attached to `grpc`, logging at debug to `dir/worker-ID.log`.
/// The join secret of the in-process control plane below.
const JOIN_TOKEN: &str = "join-secret-of-the-secrets-test";

fn start_worker(
    grpc: std::net::SocketAddr,
    id: &str,
    dir: &std::path::Path,
) -> std::process::Child {
    let log = std::fs::File::create(dir.join(format!("worker-{id}.log"))).unwrap();
    std::process::Command::new(common::TOOLGRID)
        .arg("worker")
        .arg("--control-plane")
        .arg(format!("http://{grpc}"))
        .args(["--id", id, "--pool", "default", "--slots", "2"])
        .arg("--cache")
        .arg(dir.join(format!("cache-{id}")))
        .env("TOOLGRID_JOIN_TOKEN", JOIN_TOKEN)
        .env("RUST_LOG", "info,toolgrid=trace")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start toolgrid worker")
}

/// A call of the fixture as the gateway would record it, granted `access`.
fn new_call(
    digest: &str,
    base: &str,
    access: toolgrid_core::call::CallAccess,
) -> toolgrid_store::NewCall {
    let argv: Vec<String> = ["secrets", "run", "--base", base]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let id = uuid::Uuid::now_v7().to_string();
    let timeout_ms = 60_000;
    toolgrid_store::NewCall {
        id: id.clone(),
        namespace: "default".into(),
        tool: "secrets".into(),
        command: "run".into(),
        release: "secrets-1.0.0".into(),
        release_digest: digest.into(),
        args: serde_json::json!({"base": base}),
        spec: toolgrid_core::call::CallSpec {
            pool: "default/default".into(),
            argv: argv.clone(),
            limits: RunLimits {
                memory_bytes: 64 << 20,
                cpu_time_ms: 30_000,
                output_bytes: 1 << 20,
                timeout_ms,
                ..RunLimits::default()
            },
            effect: toolgrid_core::spec::Effect::Read,
            command: Some(serde_json::from_value(serde_json::json!({"name": "run"})).unwrap()),
            deadline_ms: toolgrid_core::call::now_ms() + timeout_ms as i64,
            egress: vec![declared_rule(
                base.rsplit(':').next().unwrap().parse().unwrap(),
            )],
            access,
            ..Default::default()
        },
        stdin: Vec::new(),
        idempotency_key: None,
        request_hash: id.clone(),
        started: toolgrid_core::call::CallStarted {
            namespace: "default".into(),
            tool: "secrets".into(),
            command: "run".into(),
            release: "secrets-1.0.0".into(),
            version: "1.0.0".into(),
            digest: digest.into(),
            args: serde_json::json!({"base": base}),
            argv,
            stdin_bytes: 0,
            idempotency_key: None,
            dry_run: false,
            middleware: Vec::new(),
        },
        assign_to: None,
        repeat_window_ms: None,
        dry_run_result: None,
    }
}

fn reporter_access(readable: &[&str]) -> toolgrid_core::call::CallAccess {
    toolgrid_core::call::CallAccess {
        agent: Some("reporter".into()),
        config: [("region".to_string(), REGION.to_string())].into(),
        secrets_readable: readable.iter().map(|s| s.to_string()).collect(),
        secrets_revealable: vec!["signing-key".into()],
        ..Default::default()
    }
}

/// Every byte of every file under `dir` (the SQLite database, its WAL, the logs).
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_file() {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_resolved_at_each_assignment_and_never_stored_or_logged_across_a_kill() {
    use toolgrid_control_plane::platform::{ControlPlane, Listeners};
    use toolgrid_control_plane::scheduler::{SchedulerConfig, SecretSource, StaticSecrets};

    let logs = captured_logs();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let store = toolgrid_store::open(&format!(
        "sqlite://{}",
        store_dir.join("toolgrid.db").display()
    ))
    .await
    .unwrap();
    let plane = ControlPlane::start(
        store.clone(),
        SchedulerConfig::default(),
        toolgrid_control_plane::gateway::Authenticator::new(),
    )
    .await
    .unwrap();
    // The agent's Secret, as the catalog would hold it; rotated while the call is in flight.
    let api_token = Arc::new(std::sync::Mutex::new(TOKEN.to_string()));
    let current = api_token.clone();
    plane.scheduler.set_secret_source(Arc::new(
        move |namespace: &str, agent: &str, keys: &[String]| {
            StaticSecrets::default()
                .with("default", "reporter", "api-token", &current.lock().unwrap())
                .with("default", "reporter", "signing-key", REVEALED)
                .values(namespace, agent, keys)
        },
    ));
    let listeners = Listeners::bind("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let security = toolgrid_control_plane::platform::Security {
        workers: Arc::new(toolgrid_control_plane::auth::JoinSecret::new(JOIN_TOKEN)),
        tls: None,
        mcp: Default::default(),
    };
    let (grpc, _http, _serving) = plane.serve(listeners, security).unwrap();
    let (digest, bytes) = fixture();
    store.put_artifact(&digest, bytes).await.unwrap();

    // The first worker is killed (SIGKILL) as its request arrives: the request's start is
    // committed, its response never is.
    let mut first = start_worker(grpc, "w1", dir.path());
    let first_pid = first.id() as i32;
    let witness = Witness::start().await;
    witness.set_probe(move |seen| async move {
        if seen.attempt.as_deref() == Some("1") {
            unsafe {
                libc::kill(first_pid, libc::SIGKILL);
            }
        }
        Ok(())
    });
    let attached = |id: &'static str| {
        let scheduler = plane.scheduler.clone();
        async move {
            for _ in 0..600 {
                if scheduler.workers().iter().any(|w| w.id == id) {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            panic!("worker {id} did not attach");
        }
    };
    attached("w1").await;

    let new = new_call(&digest, &witness.base(), reporter_access(&["api-token"]));
    let call_id = new.id.clone();
    let record = store.create_call(new).await.unwrap().record().clone();
    let interface = Arc::new(toolgrid_control_plane::scheduler::interface_of(&record).unwrap());
    plane.scheduler.submit(record, interface.clone());
    assert!(
        witness
            .wait_for(std::time::Duration::from_secs(60), |seen| !seen.is_empty())
            .await,
        "the first attempt's request arrives"
    );
    let _ = first.wait();
    *api_token.lock().unwrap() = ROTATED.to_string();
    let mut second = start_worker(grpc, "w2", dir.path());
    let done = plane
        .gateway
        .wait(&call_id, std::time::Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(
        done.state,
        toolgrid_core::call::CallState::Succeeded,
        "{:?}",
        done.error
    );
    let result = done.result.clone().unwrap();
    assert_result_shows_only_references(result.to_string().as_bytes());

    // Both attempts sent the real value, with the same key: the re-assignment resolved the
    // secret again and got the rotated value, and the replay still matched request 1 on its
    // digest (of the reference, not the value).
    let seen = witness.seen();
    assert_eq!(
        seen.len(),
        2,
        "sent by the killed worker, re-sent by the second"
    );
    for (s, token) in seen.iter().zip([TOKEN, ROTATED]) {
        assert_eq!(
            s.authorization.as_deref(),
            Some(&*format!("Bearer {token}"))
        );
        assert_eq!(s.query.as_deref(), Some("k=${secret:api-token}"));
        assert_eq!(s.revealed.as_deref(), Some(REVEALED));
    }
    assert_eq!(seen[0].key, seen[1].key);
    assert_eq!(seen[1].attempt.as_deref(), Some("2"));

    // The oplog: the replay on w2 matched request 1 on its digests and re-sent it.
    let oplog = store.oplog(&call_id).await.unwrap();
    let entries: Vec<OplogEntry> = oplog.iter().map(|r| r.entry().unwrap()).collect();
    assert!(
        entries
            .iter()
            .any(|e| matches!(e, OplogEntry::Replay(r) if r.worker == "w2"))
    );
    let request = http_request(&entries);
    assert_eq!(
        request.headers[1],
        (
            "authorization".to_string(),
            header_digest("Bearer ${secret:api-token}")
        )
    );
    assert!(matches!(
        entries.last(),
        Some(OplogEntry::Outcome(o)) if o.run.as_ref().is_some_and(|r| r.worker == "w2")
    ));
    assert_no_plaintext(
        "the oplog",
        oplog
            .iter()
            .map(|r| r.payload.clone())
            .collect::<String>()
            .as_bytes(),
    );

    // A call granted a key the agent's Secret lacks fails at assignment, naming the key;
    // nothing runs.
    let missing = new_call(
        &digest,
        &witness.base(),
        reporter_access(&["api-token", "gone-key"]),
    );
    let missing_id = missing.id.clone();
    let record = store.create_call(missing).await.unwrap().record().clone();
    plane.scheduler.submit(record, interface);
    let failed = plane
        .gateway
        .wait(&missing_id, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let error = failed.error.expect("failed");
    assert_eq!(error.kind.as_str(), "secret-unavailable");
    assert!(error.message.contains("gone-key"), "{}", error.message);
    assert_eq!(witness.seen().len(), 2, "the call never ran");

    // No plaintext in the store's files, the workers' logs or this process's logs.
    let _ = second.kill();
    let _ = second.wait();
    for (path, bytes) in files_under(&store_dir)
        .into_iter()
        .chain(files_under(dir.path()))
    {
        assert_no_plaintext(&path.display().to_string(), &bytes);
    }
    let logged = logs.lock().unwrap().clone();
    assert!(
        String::from_utf8_lossy(&logged).contains(&call_id),
        "the control plane's logs were captured"
    );
    assert_no_plaintext("the control plane's logs", &logged);
    let worker_log = std::fs::read_to_string(dir.path().join("worker-w2.log")).unwrap();
    assert!(
        worker_log.contains(&call_id),
        "the worker's logs were captured"
    );
}

// ------------------------------------------------------------------------------------------
// The whole of `toolgrid up`, from manifests: the gateway fills the call's grants from the
// agent's binding (the callers' part of issue 9), the scheduler resolves the values from the
// Secret manifests.

/// The agent's bearer token, from its `tokenSecretRef` Secret.
const AGENT_TOKEN: &str = "reporter-agent-token-5Jd8";

fn manifests(root: &std::path::Path, witness: &Witness) -> std::path::PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let wasm = fixtures::repo().join("tests/fixtures/tools/secrets/secrets.wasm");
    std::fs::write(
        dir.join("secrets.yaml"),
        format!(
            r#"apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: default}}
spec: {{replicas: 1, slotsPerWorker: 2}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: secrets}}
spec:
  effect: read
  timeout: 60s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
      result: {{type: object}}
      errors:
        - {{name: request-failed, exitCode: 3}}
        - {{name: denied, exitCode: 4}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: secrets-1.0.0}}
spec:
  tool: secrets
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
metadata: {{name: reporter-secrets}}
stringData: {{api-token: {TOKEN}, signing-key: {REVEALED}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: reporter-token}}
stringData: {{token: {AGENT_TOKEN}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: reporter-config}}
data: {{region: {REGION}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: reporter}}
spec:
  tokenSecretRef: {{name: reporter-token, key: token}}
  permissions: [{{tools: ["*"], commands: ["*"]}}]
  configMapRef: {{name: reporter-config}}
  secretRef: {{name: reporter-secrets}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: reporter-secrets}}
spec:
  agents: [reporter]
  tool: secrets
  configKeysReadable: [region]
  secretKeysReadable: [api-token]
  secretKeysRevealable: [signing-key]
"#,
            wasm = wasm.display()
        ),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_call_from_manifests_uses_its_secrets_only_as_granted_across_a_kill() {
    use common::{Platform, WorkerProcess};
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &dir, &["--no-workers", "--lease", "1s"]);
    let first = WorkerProcess::start(&platform, "w1", 2, root.path());
    let first_pid = first.pid();
    witness.set_probe(move |seen| async move {
        if seen.attempt.as_deref() == Some("1") {
            unsafe {
                libc::kill(first_pid, libc::SIGKILL);
            }
        }
        Ok(())
    });

    // The agent calls with its own token; the call waits for its end.
    let http = reqwest::Client::new();
    let url = format!(
        "http://{}/v1/namespaces/default/tools/secrets/run:call",
        platform.http
    );
    let mut call = tokio::spawn({
        let http = http.clone();
        let url = url.clone();
        let base = witness.base();
        async move {
            http.post(&url)
                .bearer_auth(AGENT_TOKEN)
                .json(&serde_json::json!({"args": {"base": base}}))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    });
    tokio::select! {
        arrived = witness.wait_for(std::time::Duration::from_secs(60), |seen| !seen.is_empty()) => {
            assert!(arrived, "the first attempt's request arrives");
        }
        body = &mut call => panic!("the call ended before its request arrived: {body:?}"),
    }
    let _second = WorkerProcess::start(&platform, "w2", 2, root.path());
    let body = call.await.unwrap();
    assert_eq!(body["state"], "succeeded", "{body}");
    assert_result_shows_only_references(body["result"].to_string().as_bytes());
    let seen = witness.seen();
    assert_eq!(
        seen.len(),
        2,
        "sent by the killed worker, re-sent by the second"
    );
    for s in &seen {
        assert_eq!(
            s.authorization.as_deref(),
            Some(&*format!("Bearer {TOKEN}"))
        );
        assert_eq!(s.revealed.as_deref(), Some(REVEALED));
    }
    assert_eq!(seen[0].key, seen[1].key);

    // The agent reads its call's oplog: the Authorization header is a digest.
    let id = body["id"].as_str().unwrap();
    let oplog = http
        .get(format!("http://{}/v1/calls/{id}/oplog", platform.http))
        .bearer_auth(AGENT_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        oplog.contains(&header_digest("Bearer ${secret:api-token}")),
        "{oplog}"
    );
    assert_no_plaintext("the oplog", oplog.as_bytes());

    // Nothing under the data directory (the store), nor any log, holds a value.
    drop(_second);
    drop(first);
    for (path, bytes) in files_under(&platform.data)
        .into_iter()
        .chain(files_under(root.path()))
    {
        assert_no_plaintext(&path.display().to_string(), &bytes);
    }
    assert!(
        platform.logs().contains(id),
        "the platform's logs were captured"
    );
}
