//! The one task per resource source that reads ToolSources' upstreams: a source is read
//! when what it asks for (its spec, a refresh request) has no read yet, in the background,
//! so one slow upstream delays no other resource; the resource source resolves again when a
//! read lands. A failed read is tried again after [`RETRY`]; a successful one is kept until
//! the spec changes or a refresh is asked for, so the tools it offers do not change under
//! an agent.

use super::{Document, FailureReason, Offer, SourceFailure, read_offer};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use toolgrid_catalog::Identities;
use toolgrid_catalog::resolve::SourceRead;
use toolgrid_catalog::resolve::tool_source::{
    DocumentRef, HeaderValue, ReadFailure, SourceKind, SourcePlan,
};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::secret::SecretValue;
use toolgrid_core::source::SourceLimits;
use toolgrid_upstream::egress::EgressPolicy;
use toolgrid_upstream::mcp::{Era, McpLimits, McpServer};

/// How long a failed read is served before the source is read again.
pub const RETRY: Duration = Duration::from_secs(30);

/// What a read is for: the spec it reads (by hash) and the refresh request it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub spec_hash: String,
    pub refresh: Option<String>,
}

struct Entry {
    /// What the current read answers.
    read_for: Option<Wanted>,
    read: Option<SourceRead>,
    /// What a read under way is for.
    reading: Option<Wanted>,
    /// A failed read is stale from this moment.
    retry_at: Option<tokio::time::Instant>,
}

/// Reads ToolSources in the background and keeps what they offered.
pub struct SourceReader {
    entries: Mutex<HashMap<ObjectKey, Entry>>,
    /// Notified whenever a read lands (the resource source then resolves again).
    pub landed: Arc<Notify>,
    limits: SourceLimits,
}

/// A source to serve: its plan, what it wants, and what it refers to.
pub struct Request<'a> {
    pub key: ObjectKey,
    pub plan: SourcePlan,
    pub wanted: Wanted,
    /// A read the source's stored status holds for `wanted` (served instead of reading).
    pub stored: Option<SourceRead>,
    /// The manifest's directory, for `spec.openapi.spec.file`.
    pub dir: Option<&'a Path>,
}

impl SourceReader {
    pub fn new(limits: SourceLimits) -> Arc<Self> {
        Arc::new(SourceReader {
            entries: Mutex::default(),
            landed: Arc::new(Notify::new()),
            limits,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reads to resolve with, starting a read for every source whose wanted read is
    /// missing or stale. A source read for an older refresh of the same spec keeps serving
    /// that read until the new one lands; one read for another spec serves nothing.
    pub fn reads(
        self: &Arc<Self>,
        requests: Vec<Request<'_>>,
        identities: &Identities,
        issuer: Option<&crate::identity::Issuer>,
    ) -> HashMap<ObjectKey, SourceRead> {
        let now = tokio::time::Instant::now();
        let mut out = HashMap::new();
        let mut to_start = Vec::new();
        {
            let mut entries = self.lock();
            let keep: std::collections::HashSet<&ObjectKey> =
                requests.iter().map(|r| &r.key).collect();
            entries.retain(|key, _| keep.contains(key));
            for request in &requests {
                let entry = entries.entry(request.key.clone()).or_insert_with(|| Entry {
                    read_for: request.stored.as_ref().map(|_| request.wanted.clone()),
                    read: request.stored.clone(),
                    reading: None,
                    retry_at: None,
                });
                let current = entry.read_for.as_ref() == Some(&request.wanted)
                    && entry.retry_at.is_none_or(|at| now < at);
                if !current && entry.reading.as_ref() != Some(&request.wanted) {
                    entry.reading = Some(request.wanted.clone());
                    to_start.push(request);
                }
                let same_spec = entry
                    .read_for
                    .as_ref()
                    .is_some_and(|w| w.spec_hash == request.wanted.spec_hash);
                if same_spec && let Some(read) = &entry.read {
                    out.insert(request.key.clone(), read.clone());
                }
            }
        }
        for request in to_start {
            // An identity source is listed with a token naming the catalog as its agent.
            let token = issuer.map(|i| {
                let audience = request.plan.endpoint.as_str();
                i.mint_now(
                    audience,
                    &request.key.namespace,
                    "toolgrid-catalog",
                    "tools/list",
                    "",
                )
            });
            let offer = offer_of(&request.plan, &request.key, identities, request.dir, token);
            self.start(
                request.key.clone(),
                request.wanted.clone(),
                request.plan.clone(),
                offer,
            );
        }
        out
    }

    fn start(
        self: &Arc<Self>,
        key: ObjectKey,
        wanted: Wanted,
        plan: SourcePlan,
        offer: Result<Offer, SourceFailure>,
    ) {
        let reader = self.clone();
        tokio::spawn(async move {
            let outcome = match offer {
                Ok(offer) => {
                    read_offer(
                        &key.name,
                        &offer,
                        &plan.filter,
                        &plan.effects,
                        &reader.limits,
                    )
                    .await
                }
                Err(failure) => Err(failure),
            };
            let failed = outcome.is_err();
            if let Err(failure) = &outcome {
                tracing::warn!(source = %key, reason = failure.reason.as_str(), message = %failure.message, "cannot read the tool source");
            } else {
                tracing::info!(source = %key, "tool source read");
            }
            let read = SourceRead {
                refreshed: wanted.refresh.clone(),
                read_at: k8s_openapi::jiff::Timestamp::now().to_string(),
                outcome: outcome.map_err(|failure| ReadFailure {
                    reason: failure.reason.reason(),
                    message: failure.message,
                }),
                refresh_failure: None,
            };
            {
                let mut entries = reader.lock();
                let Some(entry) = entries.get_mut(&key) else {
                    return;
                };
                if entry.reading.as_ref() != Some(&wanted) {
                    return; // asked for something else meanwhile
                }
                entry.reading = None;
                // A failed refresh keeps serving the earlier snapshot of the same spec.
                let keep_earlier = failed
                    && wanted.refresh.is_some()
                    && entry
                        .read_for
                        .as_ref()
                        .is_some_and(|w| w.spec_hash == wanted.spec_hash)
                    && entry.read.as_ref().is_some_and(|r| r.outcome.is_ok());
                if keep_earlier {
                    if let Some(earlier) = &mut entry.read {
                        earlier.refreshed = wanted.refresh.clone();
                        earlier.refresh_failure = read.outcome.err();
                    }
                } else {
                    entry.read = Some(read);
                }
                entry.read_for = Some(wanted);
                entry.retry_at = failed.then(|| tokio::time::Instant::now() + RETRY);
            }
            wake(&reader.landed);
            if failed {
                let landed = reader.landed.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY).await;
                    wake(&landed);
                });
            }
        });
    }

    /// Whether the read of `key` answers `wanted` (done, failed or not).
    pub fn answers(&self, key: &ObjectKey, wanted: &Wanted) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|e| e.read_for.as_ref() == Some(wanted) && e.reading.is_none())
    }

    /// The read of `key` that answers its latest request, as last landed.
    pub fn read_of(&self, key: &ObjectKey) -> Option<SourceRead> {
        self.lock().get(key).and_then(|e| e.read.clone())
    }
}

/// Wakes everyone waiting for a read to land, and the next to wait if no one is.
fn wake(landed: &Notify) {
    landed.notify_waiters();
    landed.notify_one();
}

/// How to read a source: its plan with its Secrets' values, its ConfigMap's document, and
/// (for `auth: {type: identity}`) a token minted for the listing.
pub fn offer_of(
    plan: &SourcePlan,
    key: &ObjectKey,
    identities: &Identities,
    dir: Option<&Path>,
    identity_token: Option<String>,
) -> Result<Offer, SourceFailure> {
    let egress = EgressPolicy {
        allow_http: plan.allow_http,
        allow_private: plan.allow_private,
    };
    let secret = |name: &str, secret_key: &str| -> Result<SecretValue, SourceFailure> {
        identities
            .secrets
            .get(&ObjectKey::new(key.namespace.clone(), name))
            .and_then(|keys| keys.get(secret_key))
            .cloned()
            .ok_or_else(|| {
                SourceFailure::new(
                    FailureReason::UpstreamRefused,
                    format!("Secret {name:?} has no key {secret_key:?}"),
                )
            })
    };
    let mut headers: Vec<(String, SecretValue)> = Vec::new();
    for (name, value) in &plan.headers {
        let value = match value {
            HeaderValue::Literal(text) => SecretValue::new(text.as_bytes().to_vec()),
            HeaderValue::Secret(s) => secret(&s.name, &s.key)?,
        };
        headers.push((name.clone(), value));
    }
    match &plan.auth {
        Some((toolgrid_api::SourceAuthType::Bearer, Some(s))) => {
            let token = secret(&s.name, &s.key)?;
            let token = token.expose_str().ok_or_else(|| {
                SourceFailure::new(
                    FailureReason::UpstreamRefused,
                    "the bearer token is not text",
                )
            })?;
            headers.push((
                "authorization".into(),
                SecretValue::new(format!("Bearer {token}").into_bytes()),
            ));
        }
        Some((toolgrid_api::SourceAuthType::Identity, _)) => {
            if let Some(token) = identity_token {
                headers.push((
                    "authorization".into(),
                    SecretValue::new(format!("Bearer {token}").into_bytes()),
                ));
            }
        }
        _ => {}
    }
    match plan.kind {
        SourceKind::Mcp => Ok(Offer::Mcp(McpServer {
            url: plan.endpoint.to_string(),
            headers,
            egress,
            era: Era::Auto,
            limits: McpLimits {
                timeout: plan.list_timeout,
                ..McpLimits::default()
            },
        })),
        SourceKind::OpenApi => {
            let document = match &plan.document {
                Some(DocumentRef::Url(url)) => Document::Url(url.to_string()),
                Some(DocumentRef::File(file)) => match dir {
                    Some(dir) => Document::File(dir.join(file)),
                    None => {
                        return Err(SourceFailure::new(
                            FailureReason::InvalidDocument,
                            "spec.openapi.spec.file is read only from a manifest directory",
                        ));
                    }
                },
                Some(DocumentRef::ConfigMap(config_map)) => {
                    let data: Option<&BTreeMap<String, String>> = identities.config_maps.get(
                        &ObjectKey::new(key.namespace.clone(), config_map.name.clone()),
                    );
                    let text = data.and_then(|d| d.get(&config_map.key)).ok_or_else(|| {
                        SourceFailure::new(
                            FailureReason::InvalidDocument,
                            format!(
                                "ConfigMap {:?} has no key {:?}",
                                config_map.name, config_map.key
                            ),
                        )
                    })?;
                    Document::Bytes(text.clone().into_bytes())
                }
                None => {
                    return Err(SourceFailure::new(
                        FailureReason::InvalidDocument,
                        "no document",
                    ));
                }
            };
            Ok(Offer::OpenApi { document, egress })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use toolgrid_api::ToolSource;
    use toolgrid_catalog::resolve::check_source;

    /// A 2026-07-28 MCP server on loopback offering `tools`; counts `tools/list` requests.
    async fn server(tools: Value) -> (u16, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let lists = Arc::new(AtomicUsize::new(0));
        let counted = lists.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (tools, counted) = (tools.clone(), counted.clone());
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 1 << 16];
                    let n = stream.read(&mut buffer).await.unwrap_or(0);
                    let text = String::from_utf8_lossy(&buffer[..n]).to_string();
                    let body = text.split("\r\n\r\n").nth(1).unwrap_or("{}");
                    let request: Value = serde_json::from_str(body).unwrap_or_default();
                    let result = if request["method"] == "tools/list" {
                        counted.fetch_add(1, Ordering::SeqCst);
                        json!({"tools": tools, "resultType": "complete"})
                    } else {
                        json!({"resultType": "complete"})
                    };
                    let answer = json!({"jsonrpc": "2.0", "id": request["id"], "result": result})
                        .to_string();
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        (port, lists, task)
    }

    fn plan(port: u16) -> SourcePlan {
        let source: ToolSource = serde_json::from_value(json!({
            "apiVersion": "toolgrid.dev/v1alpha1",
            "kind": "ToolSource",
            "metadata": {"name": "up", "namespace": "default"},
            "spec": {"mcp": {"url": format!("http://127.0.0.1:{port}/mcp"),
                             "allowHttp": true, "allowPrivate": true, "timeout": "2s"}}
        }))
        .unwrap();
        check_source(&source, &ObjectKey::new("default", "up")).unwrap()
    }

    fn request(port: u16, spec_hash: &str, refresh: Option<&str>) -> Request<'static> {
        Request {
            key: ObjectKey::new("default", "up"),
            plan: plan(port),
            wanted: Wanted {
                spec_hash: spec_hash.into(),
                refresh: refresh.map(str::to_string),
            },
            stored: None,
            dir: None,
        }
    }

    /// Asks for `request` until a read answering it is served.
    async fn served(
        reader: &Arc<SourceReader>,
        make: impl Fn() -> Request<'static>,
        answers: impl Fn(&SourceRead) -> bool,
    ) -> SourceRead {
        let key = ObjectKey::new("default", "up");
        for _ in 0..100 {
            let reads = reader.reads(vec![make()], &Identities::default(), None);
            if let Some(read) = reads.get(&key).filter(|r| answers(r)) {
                return read.clone();
            }
            let _ =
                tokio::time::timeout(Duration::from_millis(100), reader.landed.notified()).await;
        }
        panic!("never served");
    }

    fn names(read: &SourceRead) -> Vec<String> {
        read.outcome
            .as_ref()
            .map(|s| s.tools.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn a_source_is_read_once_and_served_until_asked_again() {
        let (port, lists, _server) =
            server(json!([{"name": "one", "inputSchema": {"type": "object"}}])).await;
        let reader = SourceReader::new(SourceLimits::default());
        let key = ObjectKey::new("default", "up");
        // Nothing is served before the first read lands.
        assert!(
            reader
                .reads(
                    vec![request(port, "g1", None)],
                    &Identities::default(),
                    None
                )
                .is_empty()
        );
        let first = served(&reader, || request(port, "g1", None), |_| true).await;
        assert_eq!(names(&first), ["one"]);
        for _ in 0..5 {
            reader.reads(
                vec![request(port, "g1", None)],
                &Identities::default(),
                None,
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(lists.load(Ordering::SeqCst), 1, "read once");
        // A refresh reads again; the earlier read is served until it lands.
        let during = reader.reads(
            vec![request(port, "g1", Some("r1"))],
            &Identities::default(),
            None,
        );
        assert_eq!(during[&key].refreshed, None);
        let after = served(
            &reader,
            || request(port, "g1", Some("r1")),
            |r| r.refreshed.as_deref() == Some("r1"),
        )
        .await;
        assert_eq!(names(&after), ["one"]);
        assert_eq!(lists.load(Ordering::SeqCst), 2);
        // A stored snapshot for what is wanted is served without a read.
        let fresh = SourceReader::new(SourceLimits::default());
        let mut stored = request(port, "g1", Some("r1"));
        stored.stored = Some(after.clone());
        let reads = fresh.reads(vec![stored], &Identities::default(), None);
        assert_eq!(reads[&key], after);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(lists.load(Ordering::SeqCst), 2, "not read again");
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_the_earlier_tools_and_a_new_spec_serves_nothing_until_read() {
        let (port, _lists, server) =
            server(json!([{"name": "one", "inputSchema": {"type": "object"}}])).await;
        let reader = SourceReader::new(SourceLimits::default());
        let key = ObjectKey::new("default", "up");
        served(&reader, || request(port, "g1", None), |_| true).await;
        server.abort();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let failed = served(
            &reader,
            || request(port, "g1", Some("r1")),
            |r| r.refreshed.as_deref() == Some("r1"),
        )
        .await;
        assert_eq!(
            names(&failed),
            ["one"],
            "the earlier tools are still served"
        );
        let failure = failed.refresh_failure.expect("the refresh failed");
        assert_eq!(
            failure.reason,
            toolgrid_api::conditions::Reason::UpstreamUnreachable
        );
        // A new spec: the old snapshot is not served for it; its failed read is.
        let reads = reader.reads(
            vec![request(port, "g2", None)],
            &Identities::default(),
            None,
        );
        assert!(!reads.contains_key(&key));
        let read = served(&reader, || request(port, "g2", None), |_| true).await;
        assert!(read.outcome.is_err());
        // A source no longer declared is forgotten.
        reader.reads(Vec::new(), &Identities::default(), None);
        assert!(reader.read_of(&key).is_none());
    }
}
