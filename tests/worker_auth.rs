//! The worker link against an attacker: a real `toolgrid up`, a real worker process, and a
//! rogue that speaks `WorkerLink` with a raw tonic client. Without the join token nothing
//! attaches; with it, a rogue still cannot touch a call it does not hold, nor evict a live
//! worker by reusing its id. And every port speaks TLS with a certificate made here.

use crate::common;

use common::witness::Witness;
use common::{Platform, WorkerProcess, fixtures, result_of};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use toolgrid_core::error::ErrorKind;
use toolgrid_proto::worker_link_client::WorkerLinkClient;
use toolgrid_proto::{self as proto, ControlEvent, WorkerEvent, control_event, worker_event};

fn effects_manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let wasm = fixtures::repo().join("tests/fixtures/tools/effects/effects.wasm");
    let port = witness.addr.port();
    let text = format!(
        r#"apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: default}}
spec: {{replicas: 1, slotsPerWorker: 4}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: effects}}
spec:
  effect: idempotent
  timeout: 120s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: steps, schema: {{type: integer, minimum: 1}}, default: 1}}
        - {{name: work, schema: {{type: integer, minimum: 0}}, default: 0}}
      result: {{type: object, required: [run]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: effects-1.0.0}}
spec:
  tool: effects
  version: 1.0.0
  artifact: {{file: {}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
"#,
        wasm.display()
    );
    std::fs::write(dir.join("tools.yaml"), text).unwrap();
    dir
}

/// A witness whose answers wait until the gate opens: a call stays running on its worker
/// as long as the test wants.
fn gated(witness: &Witness) -> watch::Sender<bool> {
    let (open, gate) = watch::channel(false);
    witness.set_probe(move |_| {
        let mut gate = gate.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            Ok(())
        }
    });
    open
}

/// One session of a hand-made worker.
struct Rogue {
    tx: mpsc::Sender<WorkerEvent>,
    inbound: tonic::Streaming<ControlEvent>,
    registered: proto::Registered,
}

fn register(id: &str, resume: &str) -> proto::Register {
    proto::Register {
        worker_id: id.into(),
        pool: "default/default".into(),
        slots: 1,
        resume_secret: resume.into(),
        ..Default::default()
    }
}

async fn channel(platform: &Platform) -> Channel {
    Channel::from_shared(format!("http://{}", platform.grpc))
        .unwrap()
        .connect()
        .await
        .expect("connect to the worker port")
}

/// Opens an `Attach` stream presenting `authorization` (the header's whole value) and
/// sends `register`; the session, or the status it was refused with.
async fn attach(
    platform: &Platform,
    authorization: Option<&str>,
    register: proto::Register,
) -> Result<Rogue, tonic::Status> {
    let mut client = WorkerLinkClient::new(channel(platform).await);
    let (tx, rx) = mpsc::channel(16);
    tx.send(WorkerEvent {
        event: Some(worker_event::Event::Register(register)),
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    let mut inbound = client.attach(request).await?.into_inner();
    let first = inbound.message().await?.expect("an answer to Register");
    match first.event {
        Some(control_event::Event::Registered(registered)) => Ok(Rogue {
            tx,
            inbound,
            registered,
        }),
        other => panic!("expected Registered, got {other:?}"),
    }
}

impl Rogue {
    async fn send(&self, event: worker_event::Event) {
        self.tx
            .send(WorkerEvent { event: Some(event) })
            .await
            .expect("the stream is open");
    }

    /// The next control event that `pick` accepts, skipping others.
    async fn next<T>(&mut self, mut pick: impl FnMut(control_event::Event) -> Option<T>) -> T {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(30), self.inbound.message())
                .await
                .expect("an answer in time")
                .expect("the stream is healthy")
                .expect("the stream is open");
            if let Some(found) = message.event.and_then(&mut pick) {
                return found;
            }
        }
    }
}

/// The status of a request that must be refused.
#[track_caller]
fn refusal<T>(result: Result<T, tonic::Status>, what: &str) -> tonic::Status {
    match result {
        Ok(_) => panic!("{what}: accepted"),
        Err(status) => status,
    }
}

fn kind_of(status: &tonic::Status) -> ErrorKind {
    toolgrid_proto::status::error_of(status).kind
}

/// Starts `effects run` for `run` over InvokeStream; returns its id once a worker runs it,
/// with that worker, and a receiver of the final call.
async fn start_held_call(
    platform: &Platform,
    witness: &Witness,
    run: &str,
) -> (String, String, tokio::sync::oneshot::Receiver<proto::Call>) {
    let mut client = platform.client().await;
    let request = proto::InvokeRequest {
        tool: "effects".into(),
        command: "run".into(),
        args_json: serde_json::json!({"base": witness.base(), "run": run}).to_string(),
        ..Default::default()
    };
    let mut stream = client
        .invoke_stream(request)
        .await
        .expect("invoke")
        .into_inner();
    let (mut id, mut worker) = (String::new(), String::new());
    while worker.is_empty() {
        let event = stream
            .message()
            .await
            .expect("the call's stream")
            .expect("the call runs");
        if let Some(proto::invoke_event::Event::Progress(p)) = event.event {
            if p.stage == "accepted" {
                id = p.call_id;
            } else if p.stage == "running" {
                worker = p.worker;
            }
        }
    }
    let (done_tx, done) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        while let Ok(Some(event)) = stream.message().await {
            if let Some(proto::invoke_event::Event::Call(call)) = event.event {
                let _ = done_tx.send(call);
                return;
            }
        }
    });
    (id, worker, done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_without_the_join_token_cannot_attach() {
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = effects_manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers"]);
    let token = platform.join_token();
    assert_eq!(token.len(), 64, "a 256-bit secret in hex");

    let mut wrong = token.clone();
    wrong.replace_range(..1, if token.starts_with('a') { "b" } else { "a" });
    let refusals = [
        ("no token", None),
        ("a wrong token", Some(format!("Bearer {wrong}"))),
        (
            "a token of another length",
            Some(format!("Bearer {token}0")),
        ),
        ("another scheme", Some(format!("Basic {token}"))),
        ("an empty token", Some("Bearer ".to_string())),
    ];
    for (what, authorization) in &refusals {
        let refused = refusal(
            attach(&platform, authorization.as_deref(), register("rogue", "")).await,
            what,
        );
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{what}");
        assert_eq!(kind_of(&refused), ErrorKind::Unauthenticated, "{what}");

        // Artifact downloads are refused too.
        let mut client = WorkerLinkClient::new(channel(&platform).await);
        let mut request = tonic::Request::new(proto::FetchArtifactRequest {
            digest: "sha256:00".into(),
        });
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        let refused = refusal(client.fetch_artifact(request).await, what);
        assert_eq!(kind_of(&refused), ErrorKind::Unauthenticated, "{what}");
    }
    // With the token, a Register still has to be well-formed and bounded.
    let bearer = format!("Bearer {token}");
    let long = "x".repeat(600);
    let refused = refusal(
        attach(&platform, Some(&bearer), register(&long, "")).await,
        "a 600-byte worker id",
    );
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    let refused = refusal(
        attach(&platform, Some(&bearer), register("", "")).await,
        "an empty worker id",
    );
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    // Nothing was registered: no rogue worker, and calls wait for a real one.
    let logs = platform.logs();
    assert!(!logs.contains("worker=rogue"), "{logs}");

    // The real token works, through the file a worker on this machine reads.
    let worker = WorkerProcess::start(&platform, "real", 2, root.path());
    let call = tokio::time::timeout(Duration::from_secs(120), async {
        platform
            .invoke(proto::InvokeRequest {
                tool: "effects".into(),
                command: "run".into(),
                args_json: serde_json::json!({"base": witness.base(), "run": "after"}).to_string(),
                ..Default::default()
            })
            .await
    })
    .await
    .expect("the call ends")
    .expect("the call is admitted");
    let call = if call.state == proto::CallState::Succeeded as i32 {
        call
    } else {
        let mut client = platform.client().await;
        client
            .get_call(proto::GetCallRequest {
                id: call.id.clone(),
                wait: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
    };
    assert_eq!(result_of(&call)["run"], "after");
    assert_eq!(call.worker, "real");

    // The token file is its owner's only, and the secret is in no log.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(platform.join_token_file())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        !platform.logs().contains(&token),
        "the secret is in the log"
    );
    assert!(
        !worker.logs().contains(&token),
        "the secret is in the worker's log"
    );
    assert!(
        platform.logs().contains("--join-token-file"),
        "the log tells how to attach another worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_authenticated_rogue_cannot_append_to_or_complete_a_call_it_does_not_hold() {
    let witness = Witness::start().await;
    let open = gated(&witness);
    let root = tempfile::tempdir().unwrap();
    let manifests = effects_manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "30s"]);
    let _real = WorkerProcess::start(&platform, "real", 2, root.path());
    let (call_id, worker, done) = start_held_call(&platform, &witness, "genuine").await;
    assert_eq!(worker, "real");

    // The rogue holds the join token: it attaches, but holds no call.
    let token = platform.join_token();
    let mut rogue = attach(
        &platform,
        Some(&format!("Bearer {token}")),
        register("rogue", ""),
    )
    .await
    .expect("the join token attaches");
    assert!(!rogue.registered.session_secret.is_empty());

    rogue
        .send(worker_event::Event::Append(proto::OplogAppend {
            call_id: call_id.clone(),
            epoch: 1,
            request_id: 7,
            entries: vec![proto::OplogEntry {
                kind: "log".into(),
                payload: br#"{"forged": true}"#.to_vec(),
            }],
            sync: true,
            first_wseq: 0,
        }))
        .await;
    let ack = rogue
        .next(|event| match event {
            control_event::Event::Ack(ack) if ack.request_id == 7 => Some(ack),
            _ => None,
        })
        .await;
    assert!(!ack.ok);
    assert_eq!(ack.error, "not-held");

    rogue
        .send(worker_event::Event::Result(proto::CallResult {
            call_id: call_id.clone(),
            epoch: 1,
            exit_code: 0,
            stdout: br#"{"run": "forged"}"#.to_vec(),
            ..Default::default()
        }))
        .await;
    let ack = rogue
        .next(|event| match event {
            control_event::Event::ResultAck(ack) => Some(ack),
            _ => None,
        })
        .await;
    assert_eq!(ack.call_id, call_id);
    assert!(!ack.ok && !ack.retry, "refused for good");
    assert_eq!(ack.error, "not-held");

    // Nor can it give the call up or report on it: the call stays with its worker.
    rogue
        .send(worker_event::Event::Progress(proto::WorkerProgress {
            call_id: call_id.clone(),
            epoch: 1,
            stage: "forged".into(),
            message: String::new(),
        }))
        .await;
    rogue
        .send(worker_event::Event::Abandoned(proto::Abandoned {
            call_id: call_id.clone(),
            epoch: 1,
            reason: "forged".into(),
        }))
        .await;

    // Artifacts: only the digest of a call running in a pool it may serve (the join
    // secret serves every pool); any other digest is not found, whether it exists or not.
    let held = platform
        .client()
        .await
        .get_call(proto::GetCallRequest {
            id: call_id.clone(),
            ..Default::default()
        })
        .await
        .expect("the held call")
        .into_inner();
    let fetch = |digest: String| {
        let token = token.clone();
        let platform = &platform;
        async move {
            let mut request = tonic::Request::new(proto::FetchArtifactRequest { digest });
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            let mut stream = WorkerLinkClient::new(channel(platform).await)
                .fetch_artifact(request)
                .await?
                .into_inner();
            let mut bytes = 0;
            while let Some(chunk) = stream.message().await? {
                bytes += chunk.data.len();
            }
            Ok::<usize, tonic::Status>(bytes)
        }
    };
    assert!(
        fetch(held.release_digest.clone())
            .await
            .expect("a running call's artifact")
            > 0
    );
    let not_running = platform
        .resources("releases")
        .await
        .into_iter()
        .flat_map(|row| row.columns)
        .filter(|c| c.value.starts_with("sha256:"))
        .map(|c| c.value)
        .find(|digest| *digest != held.release_digest);
    for digest in not_running
        .into_iter()
        .chain([format!("sha256:{}", "0".repeat(64))])
    {
        let refused = refusal(fetch(digest.clone()).await, &digest);
        assert_eq!(
            kind_of(&refused),
            ErrorKind::NotFound,
            "{digest}: {refused:?}"
        );
    }

    open.send_replace(true);
    let call = tokio::time::timeout(Duration::from_secs(120), done)
        .await
        .expect("the call ends")
        .expect("the call's stream");
    assert_eq!(result_of(&call)["run"], "genuine", "the real result wins");
    // Its call ended: the same artifact, which the store still holds, is no longer given.
    let refused = refusal(
        fetch(held.release_digest.clone()).await,
        "an ended call's artifact",
    );
    assert_eq!(kind_of(&refused), ErrorKind::NotFound, "{refused:?}");
    assert_eq!(call.worker, "real");
    let oplog = platform.oplog(&call_id).await;
    assert!(
        oplog.iter().all(|e| !e.payload_json.contains("forged")),
        "{oplog:?}"
    );
    assert!(
        oplog.iter().all(|e| e.kind != "fenced"),
        "the rogue's Abandoned fenced the call: {oplog:?}"
    );
    assert_eq!(
        oplog.iter().filter(|e| e.kind == "assigned").count(),
        1,
        "the call ran once, on its worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rogue_with_the_id_of_a_live_worker_does_not_evict_it() {
    let witness = Witness::start().await;
    let open = gated(&witness);
    let root = tempfile::tempdir().unwrap();
    let manifests = effects_manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "30s"]);
    let real = WorkerProcess::start(&platform, "real", 2, root.path());
    let (call_id, worker, done) = start_held_call(&platform, &witness, "kept").await;
    assert_eq!(worker, "real");
    let bearer = format!("Bearer {}", platform.join_token());

    for resume in ["", "not-the-secret"] {
        let refused = refusal(
            attach(&platform, Some(&bearer), register("real", resume)).await,
            &format!("resume {resume:?}: replacing the real worker"),
        );
        assert_eq!(refused.code(), tonic::Code::AlreadyExists);
        assert_eq!(kind_of(&refused), ErrorKind::WorkerIdInUse);
    }

    open.send_replace(true);
    let call = tokio::time::timeout(Duration::from_secs(120), done)
        .await
        .expect("the call ends")
        .expect("the call's stream");
    assert_eq!(call.id, call_id);
    assert_eq!(result_of(&call)["run"], "kept");
    assert_eq!(call.worker, "real");
    assert_eq!(
        real.logs().matches("attached to").count(),
        1,
        "the real worker was never pushed off:\n{}",
        real.logs()
    );

    // The worker itself, presenting its session secret, does replace its session.
    let mut first = attach(&platform, Some(&bearer), register("twin", ""))
        .await
        .expect("a new id attaches");
    let secret = first.registered.session_secret.clone();
    let refused = refusal(
        attach(&platform, Some(&bearer), register("twin", "")).await,
        "no secret, no replacement",
    );
    assert_eq!(kind_of(&refused), ErrorKind::WorkerIdInUse);
    let second = attach(&platform, Some(&bearer), register("twin", &secret))
        .await
        .expect("the session secret proves the same worker");
    assert_ne!(second.registered.session_secret, secret);
    // The replaced session's stream ends.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match first.inbound.message().await {
                Ok(Some(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the replaced session's stream did not end");
}

/// A self-signed certificate for `localhost` and 127.0.0.1: (cert.pem, key.pem).
/// `toolgrid up` (like `toolgrid controller`: the same `ControlPlane::serve`) warns for every
/// port it serves without TLS on an address other than loopback, and for no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_on_a_non_loopback_address_is_warned_about() {
    const WARNING: &str = "without TLS on a non-loopback address";
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let (exposed_root, local_root) = (root.path().join("exposed"), root.path().join("local"));
    std::fs::create_dir_all(&exposed_root).unwrap();
    std::fs::create_dir_all(&local_root).unwrap();
    let exposed = Platform::start(&exposed_root, &manifests, &["--http-listen", "0.0.0.0:0"]);
    let logs = exposed.logs();
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(
        warnings.len(),
        1,
        "HTTP only (gRPC is on 127.0.0.1): {logs}"
    );
    assert!(
        warnings[0].contains("HTTP") && warnings[0].contains("0.0.0.0:"),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    let local = Platform::start(&local_root, &manifests, &[]);
    let logs = local.logs();
    assert!(logs.contains("toolgrid is ready:"), "{logs}");
    assert!(!logs.contains(WARNING), "{logs}");
}

fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("a certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_port_speaks_tls_with_a_certificate_made_here() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let (cert, key) = certificate(root.path());
    let platform = Platform::start(
        root.path(),
        &manifests,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let https = format!("https://{}", platform.grpc);

    // The CLI over TLS; the call runs on a local worker, which attached over TLS too.
    let out = platform.cli(
        &[
            "call",
            "--endpoint",
            &https,
            "--tls-ca",
            cert.to_str().unwrap(),
            "semver",
            "compare",
            "1.2.0",
            "1.10.0",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        platform.logs()
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["order"], -1);

    // Plaintext against the TLS port fails; so does TLS without trusting the certificate.
    let plain = platform.cli(&["call", "semver", "compare", "1.2.0", "1.10.0"], None);
    assert!(!plain.status.success(), "plaintext reached a TLS port");
    let untrusted = platform.cli(
        &[
            "call",
            "--endpoint",
            &https,
            "semver",
            "compare",
            "1.2.0",
            "1.10.0",
        ],
        None,
    );
    assert!(
        !untrusted.status.success(),
        "an untrusted certificate was accepted"
    );
    let plain_link = match Channel::from_shared(format!("http://{}", platform.grpc))
        .unwrap()
        .connect()
        .await
    {
        Err(_) => true,
        Ok(plain) => {
            let (tx, rx) = mpsc::channel(1);
            drop(tx);
            WorkerLinkClient::new(plain)
                .attach(ReceiverStream::new(rx))
                .await
                .is_err()
        }
    };
    assert!(plain_link, "a plaintext worker reached the TLS port");

    // HTTP too.
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let health = client
        .get(format!("https://{}/healthz", platform.http))
        .send()
        .await
        .expect("HTTPS answers");
    assert!(health.status().is_success());
    let call = client
        .post(format!(
            "https://{}/v1/namespaces/default/tools/semver/compare:call",
            platform.http
        ))
        .bearer_auth(platform.admin_token())
        .json(&serde_json::json!({"args": {"a": "2.0.0", "b": "2.0.0-rc.1"}}))
        .send()
        .await
        .expect("HTTPS answers")
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(call["result"]["order"], 1, "{call}");
    assert!(
        reqwest::Client::new()
            .get(format!("http://{}/healthz", platform.http))
            .send()
            .await
            .is_err(),
        "plaintext HTTP reached a TLS port"
    );
}

/// A cluster that accepts a fixed set of tokens, each for one audience.
struct FakeCluster {
    tokens: Vec<(&'static str, &'static str, &'static str)>,
}

#[async_trait::async_trait]
impl toolgrid_control_plane::auth::TokenReviewer for FakeCluster {
    async fn review(
        &self,
        token: &str,
        audience: &str,
    ) -> Result<
        Option<toolgrid_control_plane::auth::ReviewedToken>,
        toolgrid_control_plane::auth::ReviewError,
    > {
        Ok(self
            .tokens
            .iter()
            .find(|(t, a, _)| *t == token && *a == audience)
            .map(|(_, _, user)| toolgrid_control_plane::auth::ReviewedToken {
                username: user.to_string(),
                uid: "uid".into(),
                groups: vec![],
            }))
    }

    async fn is_operator(
        &self,
        _: &toolgrid_control_plane::auth::ReviewedToken,
        _: &str,
    ) -> Result<bool, toolgrid_control_plane::auth::ReviewError> {
        Ok(false)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_workers_attach_only_for_the_pool_of_their_service_account() {
    use std::sync::Arc;
    use toolgrid_control_plane::auth::worker::PoolAccounts;
    use toolgrid_control_plane::auth::{ServiceAccountWorkers, WORKER_AUDIENCE};
    use toolgrid_control_plane::platform::{ControlPlane, Listeners, Security};
    use toolgrid_core::ids::ObjectKey;

    let root = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", root.path().join("db").display());
    let store = toolgrid_store::open(&url).await.unwrap();
    let control_plane = ControlPlane::start(
        store,
        Default::default(),
        toolgrid_control_plane::gateway::Authenticator::new(),
    )
    .await
    .unwrap();
    let cluster = FakeCluster {
        tokens: vec![
            (
                "gpu",
                WORKER_AUDIENCE,
                "system:serviceaccount:team-a:gpu-worker",
            ),
            (
                "caller",
                "toolgrid",
                "system:serviceaccount:team-a:gpu-worker",
            ),
            ("alice", WORKER_AUDIENCE, "alice"),
        ],
    };
    // Pools as the catalog would give them: team-a/gpu runs as the default `gpu-worker`.
    let accounts: PoolAccounts = Arc::new(|pool: &ObjectKey| {
        (pool == &ObjectKey::new("team-a", "gpu")).then(|| format!("{}-worker", pool.name))
    });
    let security = Security {
        workers: Arc::new(ServiceAccountWorkers::with_accounts(
            Arc::new(cluster),
            accounts,
        )),
        tls: None,
        mcp: Default::default(),
    };
    let listeners = Listeners::bind("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let (grpc, _, _server) = control_plane.serve(listeners, security).unwrap();

    let attempt = |token: &'static str, pool: &'static str| async move {
        let channel = Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(4);
        tx.send(WorkerEvent {
            event: Some(worker_event::Event::Register(proto::Register {
                worker_id: format!("{token}-{pool}"),
                pool: pool.into(),
                slots: 1,
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let mut inbound = WorkerLinkClient::new(channel)
            .attach(request)
            .await?
            .into_inner();
        let first = inbound.message().await?;
        drop(tx);
        Ok::<_, tonic::Status>(matches!(
            first.and_then(|m| m.event),
            Some(control_event::Event::Registered(_))
        ))
    };
    assert_eq!(attempt("gpu", "team-a/gpu").await.ok(), Some(true));
    for (token, pool, kind) in [
        ("gpu", "team-a/other", ErrorKind::PermissionDenied),
        ("gpu", "team-b/gpu", ErrorKind::PermissionDenied),
        ("caller", "team-a/gpu", ErrorKind::Unauthenticated),
        ("alice", "team-a/gpu", ErrorKind::Unauthenticated),
        ("forged", "team-a/gpu", ErrorKind::Unauthenticated),
    ] {
        let refused = refusal(attempt(token, pool).await, &format!("{token} for {pool}"));
        assert_eq!(kind_of(&refused), kind, "{token} for {pool}: {refused:?}");
    }
}
