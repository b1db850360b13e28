//! Config and secrets reach a tool only as granted: config and revealable secrets as
//! environment variables, readable secrets only by reference (`${secret:NAME}` in an
//! outgoing request, substituted as it leaves), and no secret value in the tool's view of a
//! response, its result, the oplog, the store file or the logs.
//!
//! On the `secrets` fixture (tests/fixtures/tools/secrets, a C tool built with zig) and the
//! loopback witness, which echoes what it received. Three levels: the worker runtime
//! in-process (given the secrets an `Assign` carries), a control plane in-process with real
//! worker processes (secrets resolved at assignment, a worker killed mid-call), and the
//! whole `toolgrid up` from manifests (needs the callers' part: ignored until then).

mod common;

use common::fixtures::{self, runtime};
use common::witness::Witness;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgrid::api::EgressRule;
use toolgrid::call::{OplogEntry, SecretValue};
use toolgrid::store::RunLimits;
use toolgrid::worker::RunRequest;
use toolgrid::worker::runtime::MemorySink;
use toolgrid::worker::secrets::header_digest;

/// The readable secret: only ever used by reference.
const TOKEN: &str = "s3cr3t-value-7Qx9";
/// The revealable secret: the tool reads it from its environment.
const REVEALED: &str = "r3v3aled-K4y-2Lp";
const REGION: &str = "eu-west-1";

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
        egress: vec![EgressRule {
            host: "127.0.0.1".into(),
            ports: vec![witness.addr.port()],
            allow_private: true,
        }],
        secrets,
        ..RunRequest::default()
    }
}

/// Panics if `text` holds either secret value.
#[track_caller]
fn assert_no_plaintext(what: &str, text: &[u8]) {
    for value in [TOKEN, REVEALED] {
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

fn http_request(entries: &[OplogEntry]) -> toolgrid::call::HttpRequest {
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

    // The request left with the values substituted.
    let seen = witness.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/echo");
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert_eq!(seen[0].query.as_deref(), Some(&*format!("k={TOKEN}")));
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
        request.headers[0],
        (
            "authorization".to_string(),
            header_digest("Bearer ${secret:api-token}")
        )
    );
    assert_eq!(
        request.headers[1],
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
    let mut replay = assigned(&witness, &[], granted("r0tated-t0ken-value"));
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
            request.headers[0].1 = header_digest("Bearer ${secret:other}");
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
    // Only `signing-key` is granted; the tool refers to `api-token`.
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
