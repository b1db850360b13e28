//! Signed per-call identity for upstreams on a real `toolgrid up`: the JWKS is served
//! without a token at `/.well-known/jwks.json`, the key file in the data directory is the
//! owner's only and kept across starts, and tokens minted with its keys are verified by an
//! independent library (PyJWT with cryptography, `tests/identity/verify_identity.py`) the
//! way an upstream would: the right audience verifies; an expired token, a token for another
//! upstream and a changed payload are refused; a token signed just before a rotation still
//! verifies with the JWKS published after it.

use crate::common;

use common::Platform;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use toolgrid_control_plane::identity::{self, IdentityClaims, KEY_FILE, Plan};

const AUDIENCE_A: &str = "https://upstream-a.example.com/mcp";
const AUDIENCE_B: &str = "https://upstream-b.example.com/api";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `GET /.well-known/jwks.json` without credentials: the status, the headers that matter
/// and the body.
async fn fetch_jwks(platform: &Platform) -> (u16, String, String, Value) {
    let response = reqwest::Client::new()
        .get(format!("http://{}/.well-known/jwks.json", platform.http))
        .send()
        .await
        .expect("GET /.well-known/jwks.json");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (content_type, cache_control) = (header("content-type"), header("cache-control"));
    let status = response.status().as_u16();
    let body = response.json::<Value>().await.expect("a JSON body");
    (status, content_type, cache_control, body)
}

fn claims(issuer: &str, audience: &str) -> IdentityClaims {
    IdentityClaims {
        issuer: issuer.to_string(),
        audience: audience.to_string(),
        namespace: "team-a".into(),
        agent: "triage-bot".into(),
        tool: "tickets".into(),
        call: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_verify_identity_tokens_with_the_published_jwks() {
    let root = tempfile::tempdir().unwrap();
    let manifests = root.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let mut platform = Platform::start(root.path(), &manifests, &["--no-workers"]);

    // Public: no token, JSON, cacheable for five minutes.
    let (status, content_type, cache_control, served) = fetch_jwks(&platform).await;
    assert_eq!(status, 200, "{served}");
    assert_eq!(content_type, "application/json");
    assert_eq!(cache_control, "max-age=300");
    let keys = served["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{served}");
    assert_eq!(keys[0]["kty"], "OKP");
    assert_eq!(keys[0]["crv"], "Ed25519");
    assert_eq!(keys[0]["alg"], "EdDSA");
    assert_eq!(keys[0]["use"], "sig");
    assert!(keys[0].get("d").is_none(), "no private key published");

    // The key file: the owner's only, and what is served.
    let path = platform.data.join(KEY_FILE);
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    }
    let signing = identity::store::load(&path)
        .expect("a readable key file")
        .expect("a key file");
    assert_eq!(identity::jwks(&signing), served);
    assert_eq!(keys[0]["kid"], json!(signing.current.kid));

    // Kept across starts: tokens signed before a restart still verify after it.
    platform.restart(libc::SIGTERM);
    let (status, _, _, again) = fetch_jwks(&platform).await;
    assert_eq!(status, 200);
    assert_eq!(again, served, "the same keys after a restart");

    // Tokens, as the platform will mint them for upstream requests.
    let issuer = format!("http://{}", platform.http);
    let now = now_s();
    let good = identity::mint(&signing, &claims(&issuer, AUDIENCE_A), now);
    let expired = identity::mint(&signing, &claims(&issuer, AUDIENCE_A), now - 600);
    let for_b = identity::mint(&signing, &claims(&issuer, AUDIENCE_B), now);
    // A rotation now: the old key retires but stays published, the new one signs.
    let switch = Plan {
        switch: true,
        ..Plan::default()
    };
    let rotated = signing.clone().advance(switch, now).unwrap();
    let after = identity::mint(&rotated, &claims(&issuer, AUDIENCE_A), now);

    let dir = root.path().join("identity");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("served-jwks.json"), served.to_string()).unwrap();
    std::fs::write(
        dir.join("rotated-jwks.json"),
        identity::jwks(&rotated).to_string(),
    )
    .unwrap();
    let expected = json!({
        "iss": issuer, "aud": AUDIENCE_A, "sub": "team-a/triage-bot", "tenant": "team-a",
        "tool": "tickets", "call": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    });
    let case = |name: &str, jwks: &str, token: &str, audience: &str, expect: &str| {
        json!({"name": name, "jwks": jwks, "token": token, "audience": audience,
            "expect": expect, "claims": if expect == "ok" { expected.clone() } else { json!({}) }})
    };
    let cases = json!({
        "issuer": issuer,
        "tamper": "audience-a",
        "cases": [
            case("audience-a", "served-jwks.json", &good, AUDIENCE_A, "ok"),
            case("expired", "served-jwks.json", &expired, AUDIENCE_A, "ExpiredSignatureError"),
            case("audience-b-at-a", "served-jwks.json", &for_b, AUDIENCE_A, "InvalidAudienceError"),
            case("audience-b-at-b", "served-jwks.json", &for_b, AUDIENCE_B, "ok"),
            case("signed-before-rotation", "rotated-jwks.json", &good, AUDIENCE_A, "ok"),
            case("signed-after-rotation", "rotated-jwks.json", &after, AUDIENCE_A, "ok"),
            case("new-key-not-in-old-jwks", "served-jwks.json", &after, AUDIENCE_A, "unknown-kid"),
        ],
    });
    // The B case's claims name B.
    let mut cases = cases;
    cases["cases"][3]["claims"]["aud"] = json!(AUDIENCE_B);
    std::fs::write(
        dir.join("cases.json"),
        serde_json::to_vec_pretty(&cases).unwrap(),
    )
    .unwrap();

    let Some(run) = common::run_python_check(
        Command::new("python3")
            .arg(repo().join("tests/identity/verify_identity.py"))
            .arg(&dir),
    ) else {
        return;
    };
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr);
    eprintln!("{out}");
    assert!(
        run.status.success(),
        "PyJWT refused what it should accept, or accepted what it should refuse:\n{out}{err}"
    );
    for name in [
        "audience-a",
        "expired",
        "audience-b-at-a",
        "signed-before-rotation",
        "tampered-payload",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("ok   {name}:"))),
            "no passing check {name}:\n{out}"
        );
    }
}
