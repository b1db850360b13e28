//! An independent witness: an HTTP server on loopback that records every request with its
//! `Idempotency-Key`, attempt and body, so tests can check that no effect ran twice (unless
//! with the same key) and that no effect happened that the oplog does not know. A probe
//! (`set_probe`) runs on each request as it arrives, before it is answered, so a test can
//! check what was already durable when the request left (commit before send).
//!
//! A request to `/echo` is answered with what the witness saw of it, as JSON
//! (`authorization`, `query`, `revealed` from `X-Revealed`, `body`): a destination that
//! echoes credentials back, for the secret-redaction tests.
//!
//! A request to `/echo-all` is answered with the whole request as it arrived, raw and
//! base64-encoded (`{"raw": "METHOD URI\nname: value\n...\n\nbody", "base64": ..}`): an
//! upstream that reflects everything, encoded too, for the exfiltration tests.
//!
//! A request to `/flaky/N/...` is answered 503 while the witness has seen fewer than N
//! earlier requests to the same path with the same `Idempotency-Key` (then as any other):
//! a destination that is briefly unavailable, for the retry tests.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One request as the witness saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    pub attempt: Option<String>,
    pub body: String,
    /// The `Authorization` header, as it arrived.
    pub authorization: Option<String>,
    /// The raw query string.
    pub query: Option<String>,
    /// The `X-Revealed` header.
    pub revealed: Option<String>,
    /// The request target (path and query) as it arrived.
    pub uri: String,
    /// Every header as it arrived, in order.
    pub headers: Vec<(String, String)>,
    pub at: Instant,
    /// What the probe found on arrival (`None` without a probe).
    pub probe: Option<Result<(), String>>,
}

/// A check run on each request as it arrives, before the witness answers it.
pub type Probe = Arc<
    dyn Fn(Seen) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

#[derive(Default)]
struct Inner {
    seen: Mutex<Vec<Seen>>,
    delay: Mutex<Duration>,
    probe: Mutex<Option<Probe>>,
    count: watch::Sender<usize>,
}

/// A running witness; it stops with the test's runtime.
#[derive(Clone)]
pub struct Witness {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
}

impl Witness {
    pub async fn start() -> Witness {
        let inner = Arc::new(Inner::default());
        let app = axum::Router::new()
            .fallback(record)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Witness { addr, inner }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every response waits this long (to widen the window of in-flight requests).
    pub fn set_delay(&self, delay: Duration) {
        *self.inner.delay.lock().unwrap() = delay;
    }

    /// Runs `probe` on every request from now on, before answering it; its verdict is in
    /// [`Seen::probe`].
    pub fn set_probe<F, Fut>(&self, probe: F)
    where
        F: Fn(Seen) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        *self.inner.probe.lock().unwrap() = Some(Arc::new(move |seen| Box::pin(probe(seen))));
    }

    /// Panics unless every request seen so far passed the probe.
    pub fn assert_probes_passed(&self) {
        for seen in self.seen() {
            match &seen.probe {
                Some(Ok(())) => {}
                Some(Err(why)) => panic!(
                    "{} {} ({:?}) failed the witness's probe on arrival: {why}",
                    seen.method, seen.path, seen.key
                ),
                None => panic!(
                    "{} {} arrived before a probe was set",
                    seen.method, seen.path
                ),
            }
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.inner.seen.lock().unwrap().clone()
    }

    /// Waits until `predicate` holds for what was seen, or `limit` passes.
    pub async fn wait_for(&self, limit: Duration, predicate: impl Fn(&[Seen]) -> bool) -> bool {
        let mut count = self.inner.count.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if predicate(&self.seen()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, count.changed())
                .await
                .is_err()
            {
                return predicate(&self.seen());
            }
        }
    }
}

async fn record(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let mut seen = Seen {
        method: method.to_string(),
        path: uri.path().to_string(),
        key: header("idempotency-key"),
        attempt: header("toolgrid-attempt"),
        body: String::from_utf8_lossy(&body).into_owned(),
        authorization: header("authorization"),
        query: uri.query().map(String::from),
        revealed: header("x-revealed"),
        uri: uri.to_string(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        at: Instant::now(),
        probe: None,
    };
    let probe = inner.probe.lock().unwrap().clone();
    if let Some(probe) = probe {
        seen.probe = Some(probe(seen.clone()).await);
    }
    let delay = *inner.delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (total, earlier) = {
        let mut seen_all = inner.seen.lock().unwrap();
        let earlier = seen_all
            .iter()
            .filter(|s| s.path == seen.path && s.key == seen.key)
            .count();
        seen_all.push(seen.clone());
        let prefix = seen.path.clone();
        let total = seen_all
            .iter()
            .filter(|s| {
                s.method == "POST"
                    && prefix.starts_with("/effects/")
                    && s.body.contains(&prefix["/effects/".len()..])
            })
            .count();
        (total, earlier)
    };
    inner.count.send_modify(|c| *c += 1);
    if seen.path == "/echo" {
        let echo = serde_json::json!({
            "authorization": seen.authorization,
            "query": seen.query,
            "revealed": seen.revealed,
            "body": seen.body,
        });
        return (StatusCode::OK, echo.to_string());
    }
    if seen.path == "/echo-all" {
        use base64::Engine as _;
        let mut raw = format!("{} {}\n", seen.method, seen.uri);
        for (name, value) in &seen.headers {
            raw.push_str(&format!("{name}: {value}\n"));
        }
        raw.push('\n');
        raw.push_str(&seen.body);
        let echo = serde_json::json!({
            "raw": raw,
            "base64": base64::engine::general_purpose::STANDARD.encode(&raw),
        });
        return (StatusCode::OK, echo.to_string());
    }
    let failures = seen
        .path
        .strip_prefix("/flaky/")
        .and_then(|rest| rest.split('/').next())
        .and_then(|n| n.parse::<usize>().ok());
    if failures.is_some_and(|n| earlier < n) {
        return (StatusCode::SERVICE_UNAVAILABLE, "{\"busy\": true}".into());
    }
    (
        StatusCode::OK,
        format!("{{\"ok\": true, \"posted\": {total}}}"),
    )
}
