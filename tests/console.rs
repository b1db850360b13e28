//! The console at `/ui`: a real `toolgrid up` with an agent whose binding holds every call
//! for approval. Plain HTTP checks login, cookies, escaping and CSRF; a real browser
//! (headless chromium driven by Selenium, `tests/console/test_console.py`) logs in,
//! approves a waiting call with a reason and follows it to its end.

use crate::common;

use common::Platform;
use common::fixtures;
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

const ASKER: &str = "asker-token-value";
const HOLD: &str = "hold-for-a-person";

/// An agent `asker` whose semver binding goes through an approval Middleware with no
/// `when`: every call waits for a person.
const MANIFESTS: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: asker-token}
stringData: {token: asker-token-value}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: asker}
spec:
  tokenSecretRef: {name: asker-token, key: token}
  permissions: [{tools: ["*"]}]
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: hold-for-a-person}
spec:
  approval: {timeout: 30m}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: asker-semver}
spec: {agents: [asker], tool: semver, middleware: [hold-for-a-person]}
"#;

fn start(root: &std::path::Path) -> Platform {
    let manifests = fixtures::examples(root);
    std::fs::write(manifests.join("console.yaml"), MANIFESTS).unwrap();
    Platform::start(root, &manifests, &[])
}

/// A client that does not follow redirects (to see them) and keeps no cookies.
fn bare_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `application/x-www-form-urlencoded` of `fields`.
fn form(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn post_form(
    client: &reqwest::Client,
    url: String,
    cookie: Option<&str>,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(fields));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    request.send().await.expect("HTTP")
}

/// Starts the agent's semver call over HTTP with its own token, in a task (it may wait
/// until the call is decided), and returns the call's id once it awaits approval.
async fn agent_call(platform: &Platform, a: &str, b: &str) -> String {
    let url = format!(
        "http://{}/v1/namespaces/default/tools/semver/compare:call",
        platform.http
    );
    let body = json!({"args": {"a": a, "b": b}});
    tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(url)
            .header("authorization", format!("Bearer {ASKER}"))
            .json(&body)
            .send()
            .await;
    });
    let admin = platform.http_client();
    let list = format!("http://{}/v1/calls", platform.http);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = admin.get(&list).send().await {
            let calls: Value = response.json().await.unwrap_or(Value::Null);
            let found = calls["calls"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["state"] == "awaiting-approval" && c["args"]["a"] == a)
                .and_then(|c| c["id"].as_str().map(String::from));
            if let Some(id) = found {
                return id;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent's call never awaited approval; log:\n{}",
            platform.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn call_json(platform: &Platform, id: &str) -> Value {
    platform
        .http_client()
        .get(format!("http://{}/v1/calls/{id}", platform.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The session cookie `POST /ui/login` sets for `token`, as `name=value`.
async fn login(platform: &Platform, token: &str) -> String {
    let response = post_form(
        &bare_client(),
        format!("http://{}/ui/login", platform.http),
        None,
        &[("token", token)],
    )
    .await;
    assert_eq!(response.status(), 303, "a good token logs in");
    assert_eq!(response.headers()["location"], "/ui");
    let set_cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    set_cookie.split(';').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_needs_a_session_escapes_everything_and_refuses_forged_forms() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path());
    let http = bare_client();
    let base = format!("http://{}", platform.http);

    // No cookie: every page sends the browser to the login form and shows no data.
    for path in ["/ui", "/ui/calls", "/ui/agents", "/ui/agents/default/asker"] {
        let response = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(response.status(), 303, "{path}");
        assert_eq!(response.headers()["location"], "/ui/login", "{path}");
    }
    let form_page = http.get(format!("{base}/ui/login")).send().await.unwrap();
    assert_eq!(form_page.status(), 200);
    assert!(form_page.text().await.unwrap().contains("name=\"token\""));

    // A bad token is refused at login, and a forged cookie is no session.
    let refused = post_form(
        &http,
        format!("{base}/ui/login"),
        None,
        &[("token", "wrong")],
    )
    .await;
    assert_eq!(refused.status(), 401);
    assert!(refused.headers().get("set-cookie").is_none());
    assert!(refused.text().await.unwrap().contains("unauthenticated"));
    // A login posted from another site's page is refused (no login CSRF).
    let cross_site = http
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", "http://evil.example")
        .body(form(&[("token", &platform.admin_token())]))
        .send()
        .await
        .unwrap();
    assert_eq!(cross_site.status(), 403);
    assert!(cross_site.headers().get("set-cookie").is_none());
    assert!(
        cross_site
            .text()
            .await
            .unwrap()
            .contains("permission-denied")
    );
    let forged = http
        .get(format!("{base}/ui"))
        .header("cookie", format!("toolgrid_console={}", hex_of("wrong")))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 303);
    assert_eq!(forged.headers()["location"], "/ui/login");

    // A hostile argument reaches the page escaped.
    let hostile = "<script>alert(1)</script>";
    let id = agent_call(&platform, hostile, "1.0.0").await;
    let cookie = login(&platform, &platform.admin_token()).await;
    for path in ["/ui".to_string(), format!("/ui/calls/{id}")] {
        let page = http
            .get(format!("{base}{path}"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200, "{path}");
        let csp = page.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'"), "{csp}");
        let html = page.text().await.unwrap();
        assert!(
            !html.contains("<script"),
            "{path} carries a script:\n{html}"
        );
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{path} shows the argument escaped:\n{html}"
        );
        assert!(html.contains(HOLD), "{path} names the middleware");
    }

    // A POST without the CSRF token, or with another session's, is refused, and the call
    // still waits.
    let decide = format!("{base}/ui/calls/{id}/decide");
    let missing = post_form(
        &http,
        decide.clone(),
        Some(&cookie),
        &[("decision", "approve"), ("reason", "forged")],
    )
    .await;
    assert_eq!(missing.status(), 403);
    assert!(missing.text().await.unwrap().contains("permission-denied"));
    let other_session = login(&platform, ASKER).await;
    let others_csrf = csrf_of(&http, &base, &other_session).await;
    let wrong = post_form(
        &http,
        decide.clone(),
        Some(&cookie),
        &[
            ("csrf", &others_csrf),
            ("decision", "deny"),
            ("reason", "forged"),
        ],
    )
    .await;
    assert_eq!(wrong.status(), 403);
    let logout = post_form(&http, format!("{base}/ui/logout"), Some(&cookie), &[]).await;
    assert_eq!(logout.status(), 403, "logging out needs the CSRF token too");
    assert_eq!(
        call_json(&platform, &id).await["state"],
        "awaiting-approval"
    );
    // Without a session, a POST goes to the login form.
    let anonymous = post_form(&http, decide, None, &[("decision", "approve")]).await;
    assert_eq!(anonymous.status(), 303);
    assert_eq!(
        call_json(&platform, &id).await["state"],
        "awaiting-approval"
    );

    // A refused decision is shown with its error kind: the agent may not decide its own
    // call.
    let own = post_form(
        &http,
        decide_url(&base, &id),
        Some(&other_session),
        &[
            ("csrf", &others_csrf),
            ("decision", "approve"),
            ("reason", "mine"),
        ],
    )
    .await;
    assert_eq!(own.status(), 403);
    let own = own.text().await.unwrap();
    assert!(own.contains("id=\"message\">permission-denied: "), "{own}");
    assert_eq!(
        call_json(&platform, &id).await["state"],
        "awaiting-approval"
    );

    // The operator denies it with the session's token; deciding it again is refused as
    // not-awaiting-approval.
    let csrf = csrf_of(&http, &base, &cookie).await;
    let denied = post_form(
        &http,
        decide_url(&base, &id),
        Some(&cookie),
        &[
            ("csrf", &csrf),
            ("decision", "deny"),
            ("reason", "no <b>thanks</b>"),
        ],
    )
    .await;
    assert_eq!(denied.status(), 303);
    assert_eq!(
        denied.headers()["location"].to_str().unwrap(),
        format!("/ui/calls/{id}")
    );
    let call = call_json(&platform, &id).await;
    assert_eq!(call["state"], "failed", "{call}");
    let again = post_form(
        &http,
        decide_url(&base, &id),
        Some(&cookie),
        &[
            ("csrf", &csrf),
            ("decision", "approve"),
            ("reason", "changed my mind"),
        ],
    )
    .await;
    assert_eq!(again.status(), 409);
    let again = again.text().await.unwrap();
    assert!(
        again.contains("id=\"message\">not-awaiting-approval: "),
        "{again}"
    );
    assert!(
        again.contains("denied by operator:admin: no &lt;b&gt;thanks&lt;/b&gt;"),
        "the timeline shows the denial, escaped:\n{again}"
    );

    // The agent sees its own tools and why the others are missing, and not other agents.
    let mine = http
        .get(format!("{base}/ui/agents"))
        .header("cookie", &other_session)
        .send()
        .await
        .unwrap();
    assert_eq!(mine.status(), 303);
    assert_eq!(mine.headers()["location"], "/ui/agents/default/asker");
    let page = http
        .get(format!("{base}/ui/agents/default/asker"))
        .header("cookie", &other_session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("asker-semver"), "{page}");
    assert!(
        page.contains("no-binding"),
        "uuid has no binding for asker:\n{page}"
    );
    let theirs = http
        .get(format!("{base}/ui/agents/default/reporter"))
        .header("cookie", &other_session)
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 403);
    assert!(theirs.text().await.unwrap().contains("permission-denied"));
}

fn decide_url(base: &str, id: &str) -> String {
    format!("{base}/ui/calls/{id}/decide")
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The CSRF token a session's pages carry in their forms.
async fn csrf_of(http: &reqwest::Client, base: &str, cookie: &str) -> String {
    let html = http
        .get(format!("{base}/ui/calls"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let marker = "name=\"csrf\" value=\"";
    let start = html.find(marker).expect("a form with a CSRF token") + marker.len();
    html[start..start + 64].to_string()
}

fn browser_ready() -> bool {
    let python = Command::new("python3")
        .args(["-c", "import selenium"])
        .output()
        .is_ok_and(|o| o.status.success());
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    let driver = std::path::Path::new("/usr/bin/chromedriver").exists();
    common::require(
        &format!(
            "the console's browser test needs python3 selenium ({python}), chromium ({chromium}) \
             and /usr/bin/chromedriver ({driver})"
        ),
        python && chromium && driver,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_approves_a_waiting_call_in_a_real_browser() {
    if !browser_ready() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path());
    let id = agent_call(&platform, "1.2.0", "1.10.0").await;
    let reason = "checked the versions by hand";
    let script = fixtures::repo().join("tests/console/test_console.py");
    let url = format!("http://{}", platform.http);
    let token = platform.admin_token();
    let run = tokio::task::spawn_blocking({
        let id = id.clone();
        move || {
            common::run_python_check(
                Command::new("python3")
                    .arg(script)
                    .args(["--url", &url, "--token", &token, "--call-id", &id])
                    .args(["--middleware", HOLD, "--arg", "1.10.0", "--reason", reason]),
            )
        }
    })
    .await
    .unwrap();
    let Some(run) = run else {
        return;
    };
    assert!(
        run.status.success(),
        "the browser checks failed:\n{}\n{}\nlog:\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
        platform.logs()
    );

    // The call ran after the approval, and its oplog keeps who approved it and why.
    let call = call_json(&platform, &id).await;
    assert_eq!(call["state"], "succeeded", "{call}");
    assert_eq!(call["result"]["order"], -1, "{call}");
    let oplog = platform.oplog(&id).await;
    let approval = oplog
        .iter()
        .find(|e| e.kind == "approval")
        .unwrap_or_else(|| panic!("no approval entry in {oplog:?}"));
    let payload: Value = serde_json::from_str(&approval.payload_json).unwrap();
    assert_eq!(payload["approved"], true, "{payload}");
    assert_eq!(payload["reason"], reason, "{payload}");
    assert!(
        payload["by"]
            .as_str()
            .unwrap_or("")
            .starts_with("operator:"),
        "{payload}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_session_cookie_is_secure() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("a certificate");
    let (cert, key) = (root.path().join("cert.pem"), root.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
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
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let response = post_form(
        &client,
        format!("https://{}/ui/login", platform.http),
        None,
        &[("token", &platform.admin_token())],
    )
    .await;
    assert_eq!(response.status(), 303);
    let set_cookie = response.headers()["set-cookie"].to_str().unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Secure"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
}

/// The session id a `name=value` cookie holds.
fn cookie_value(cookie: &str) -> &str {
    cookie.split_once('=').map(|(_, v)| v).unwrap_or_default()
}

/// `GET /ui` with `cookie`: its status and where it redirects.
async fn front_page(base: &str, cookie: &str) -> (u16, String) {
    let response = bare_client()
        .get(format!("{base}/ui"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    let location = response
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (response.status().as_u16(), location)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_live_in_the_store_end_at_logout_and_are_shared_by_replicas() {
    let root = tempfile::tempdir().unwrap();
    let platform = start(root.path());
    let base = format!("http://{}", platform.http);
    let http = bare_client();
    let admin = platform.admin_token();

    // The cookie is a fresh random id per login: not the token, not derived from it.
    let first = login(&platform, &admin).await;
    let second = login(&platform, &admin).await;
    for cookie in [&first, &second] {
        let value = cookie_value(cookie);
        assert_eq!(value.len(), 64, "{cookie}");
        assert!(value.bytes().all(|b| b.is_ascii_hexdigit()), "{cookie}");
        assert!(!value.contains(&admin), "{cookie}");
        assert!(!value.contains(&hex_of(&admin)), "{cookie}");
    }
    assert_ne!(first, second, "two logins, two sessions");
    assert_eq!(front_page(&base, &first).await.0, 200);

    // A second control plane on the same store accepts the session, and its forms carry
    // the same CSRF token.
    let replica_root = root.path().join("replica");
    std::fs::create_dir_all(&replica_root).unwrap();
    let store = format!("sqlite://{}", platform.data.join("toolgrid.db").display());
    let replica = Platform::start(
        &replica_root,
        &platform.manifests,
        &["--store", &store, "--no-workers"],
    );
    let replica_base = format!("http://{}", replica.http);
    assert_eq!(
        front_page(&replica_base, &first).await.0,
        200,
        "the replica knows the session; log:\n{}",
        replica.logs()
    );
    let csrf = csrf_of(&http, &base, &first).await;
    assert_eq!(csrf_of(&http, &replica_base, &first).await, csrf);

    // Logout on the replica revokes the session on both at once; the replayed cookie is
    // refused (sent to the login form), and the other session lives on.
    let logout = post_form(
        &http,
        format!("{replica_base}/ui/logout"),
        Some(&first),
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(logout.status(), 303);
    assert_eq!(logout.headers()["location"], "/ui/login");
    for base in [&base, &replica_base] {
        assert_eq!(
            front_page(base, &first).await,
            (303, "/ui/login".to_string()),
            "{base}"
        );
    }
    let replayed = post_form(
        &http,
        decide_url(&base, "any"),
        Some(&first),
        &[("csrf", &csrf), ("decision", "approve")],
    )
    .await;
    assert_eq!(replayed.status(), 303, "a replayed cookie decides nothing");
    assert_eq!(front_page(&base, &second).await.0, 200);

    // An agent's session ends when the Agent is removed from the catalog.
    let agent = login(&platform, ASKER).await;
    assert_eq!(front_page(&base, &agent).await.0, 200);
    let without_agent: String = MANIFESTS
        .split("\n---\n")
        .filter(|doc| !doc.contains("kind: Agent") && !doc.contains("kind: Secret"))
        .collect::<Vec<_>>()
        .join("\n---\n");
    std::fs::write(platform.manifests.join("console.yaml"), without_agent).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match front_page(&base, &agent).await {
            (303, location) => {
                assert_eq!(location, "/ui/login");
                break;
            }
            (status, _) => assert_eq!(status, 200),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the removed agent's session still works; log:\n{}",
            platform.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(front_page(&base, &second).await.0, 200, "operators stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_lapse_when_idle_and_at_their_absolute_expiry() {
    let root = tempfile::tempdir().unwrap();
    let manifests = fixtures::examples(root.path());
    let platform = Platform::start(
        root.path(),
        &manifests,
        &[
            "--no-workers",
            "--console-idle-timeout",
            "3s",
            "--console-session-lifetime",
            "8s",
        ],
    );
    let base = format!("http://{}", platform.http);
    let admin = platform.admin_token();

    // Idle: unused for longer than 3 s, the session sends the browser to the login form.
    let idle = login(&platform, &admin).await;
    assert_eq!(front_page(&base, &idle).await.0, 200);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (status, location) = front_page(&base, &idle).await;
    assert_eq!((status, location.as_str()), (303, "/ui/login"), "idle");
    assert_eq!(front_page(&base, &idle).await.0, 303, "and stays refused");

    // Absolute: used every 300 ms it lives on past the idle timeout, then ends at 8 s.
    let busy = login(&platform, &admin).await;
    let logged_in = std::time::Instant::now();
    let mut refused_at = None;
    while logged_in.elapsed() < Duration::from_secs(20) {
        let (status, _) = front_page(&base, &busy).await;
        if status == 303 {
            refused_at = Some(logged_in.elapsed());
            break;
        }
        assert_eq!(status, 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let refused_at = refused_at.expect("the busy session never ended");
    assert!(
        refused_at >= Duration::from_secs(6),
        "a busy session outlived its idle timeout (ended after {refused_at:?})"
    );
}
