//! The console: a few server-rendered pages at `/ui` on the HTTP port for people who watch
//! and steer calls: calls waiting for approval (approve or deny with a reason), recent
//! calls, a call's timeline, and the tools an agent has and why it lacks the others.
//!
//! - Login: `GET /ui/login` is a form for a token (the admin token or an agent's);
//!   `POST /ui/login` checks it with [`Gateway::authenticate`], exactly like a bearer token,
//!   opens a server-side session ([`ConsoleSession`]: who the caller is, never the token)
//!   and sets the cookie [`COOKIE`] (`HttpOnly; SameSite=Strict; Path=/ui`, and `Secure`
//!   on an HTTPS port) to the session's id: 32 random bytes (hex), not derived from the
//!   token. The store keeps only the id's SHA-256, so every replica on the store knows the
//!   session. Every other page looks the session up per request; a session idle longer
//!   than its idle timeout, past its absolute expiry, deleted, or of an Agent that no
//!   longer exists sends the browser to the login form and shows no data.
//!   `POST /ui/logout` deletes the session: its cookie is refused everywhere at once.
//! - CSRF: besides `SameSite=Strict`, every form carries a token derived from the session's
//!   id by HMAC-SHA256 (so any replica computes it, and the store, holding only the id's
//!   hash, cannot); a POST without the right one is refused (403, `permission-denied`),
//!   and so is any POST (the login's too) whose `Origin` names another site.
//! - What a caller sees is what the API gives it: operators everything, an agent its own
//!   calls and its own tools.
//! - Pages carry no script; every value is escaped ([`pages::escape`]); responses say
//!   `Cache-Control: no-store` and a `Content-Security-Policy` that allows no script.

pub mod pages;
pub mod timeline;

use super::Gateway;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use toolgrid_core::auth::{ConsoleSession, Principal, SessionCheck};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::secret::sha256;

/// The session cookie's name.
pub const COOKIE: &str = "toolgrid_console";

/// Marks a request that came over TLS (the platform layers it on its HTTPS router), so the
/// session cookie is `Secure`.
#[derive(Clone, Copy, Debug)]
pub struct Tls;

#[derive(Clone)]
struct Console {
    gateway: Arc<Gateway>,
}

/// The console's routes (all under `/ui`), for merging into the HTTP router.
pub fn routes(gateway: Arc<Gateway>) -> axum::Router {
    let console = Console { gateway };
    axum::Router::new()
        .route("/ui", get(awaiting_page))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/calls", get(calls_page))
        .route("/ui/calls/{id}", get(call_page))
        .route("/ui/calls/{id}/decide", post(decide))
        .route("/ui/agents", get(agents_page))
        .route("/ui/agents/{ns}/{name}", get(agent_page))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console)
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it a browser sends `Origin: null` with the console's own
    // form POSTs, which `same_origin` refuses.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    let mut inner_pad = [0x36u8; 64];
    let mut outer_pad = [0x5cu8; 64];
    for (i, byte) in key.iter().enumerate() {
        inner_pad[i] ^= byte;
        outer_pad[i] ^= byte;
    }
    let inner = Sha256::new()
        .chain_update(inner_pad)
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(outer_pad)
        .chain_update(inner)
        .finalize()
        .into()
}

/// A session id: 32 bytes from the operating system's CSPRNG.
type SessionId = [u8; 32];

fn new_session_id() -> SessionId {
    let mut id = [0u8; 32];
    rand::fill(&mut id);
    id
}

/// The CSRF token of the session `id`.
fn csrf_token(id: &SessionId) -> String {
    hex::encode(hmac_sha256(id, b"toolgrid-console-csrf"))
}

/// Whether a form's CSRF token is the session's (constant time).
fn csrf_matches(expected: &str, given: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    expected.len() == given.len() && bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

/// Whether a POST comes from the console's own pages: a browser's `Origin` (sent with
/// every form POST) must name the host the request was sent to. A request without
/// `Origin` (not from a browser form) passes; `Origin: null` does not.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = origin
        .to_str()
        .ok()
        .and_then(|o| url::Url::parse(o).ok())
        .and_then(|url| {
            let host = url.host_str()?.to_string();
            Some(match url.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            })
        });
    matches!((origin, host), (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(host))
}

/// The refusal of a POST from another site's page.
fn cross_site(message: &str) -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::page(
            "Refused",
            None,
            Some(&format!(
                "permission-denied: {message}: the form was posted from another site"
            )),
            "",
        ),
    )
}

/// The session id a request's cookie holds, if any (a cookie that is not 32 bytes in hex
/// is no session).
fn cookie_session(headers: &HeaderMap) -> Option<SessionId> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .and_then(|(_, value)| hex::decode(value.trim()).ok())
        .and_then(|bytes| SessionId::try_from(bytes.as_slice()).ok())
}

/// The `Set-Cookie` value for the session `id`, kept by the browser for `max_age_s`
/// (`None`: clears it).
fn session_cookie(id: Option<(&SessionId, u64)>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match id {
        Some((id, max_age_s)) => format!(
            "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age={max_age_s}{secure}",
            hex::encode(id)
        ),
        None => format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0{secure}"),
    }
}

/// A redirect to the login form that also clears the session cookie.
fn to_login(secure: bool) -> Response {
    let mut response = Redirect::to("/ui/login").into_response();
    if let Ok(cookie) = HeaderValue::from_str(&session_cookie(None, secure)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// A signed-in caller.
struct Session {
    /// SHA-256 of the session's id.
    id_hash: [u8; 32],
    principal: Principal,
    who: String,
    csrf: String,
}

impl Session {
    fn chrome(&self) -> pages::Chrome<'_> {
        pages::Chrome {
            who: &self.who,
            csrf: &self.csrf,
        }
    }

    /// The refusal of a form whose CSRF token is not this session's, or that another
    /// site's page posted (`None`: neither).
    fn refuse_forged(&self, headers: &HeaderMap, given: &str) -> Option<Response> {
        if !same_origin(headers) {
            return Some(cross_site("refused"));
        }
        if csrf_matches(&self.csrf, given) {
            return None;
        }
        let error = ApiError::new(
            ErrorKind::PermissionDenied,
            "the form's CSRF token is missing or wrong: reload the page and try again",
        );
        Some(self.error_page("Refused", &error))
    }

    /// A page showing `error` with its kind, with the error kind's HTTP status.
    fn error_page(&self, title: &str, error: &ApiError) -> Response {
        let message = format!("{}: {}", error.kind.as_str(), error.message);
        html(
            status_of(error.kind),
            pages::page(title, Some(&self.chrome()), Some(&message), ""),
        )
    }
}

fn status_of(kind: ErrorKind) -> StatusCode {
    super::http_error::http_status(kind)
}

fn html(status: StatusCode, body: String) -> Response {
    (status, Html(body)).into_response()
}

/// Why a stored session is no longer accepted at `now_ms` (`None`: it is, and whether to
/// record this use). An Agent's session ends when the Agent is gone from the catalog.
fn session_refusal(
    session: &ConsoleSession,
    agent_exists: impl Fn(&toolgrid_core::ids::ObjectKey) -> bool,
    now_ms: i64,
) -> Result<bool, &'static str> {
    match session.check(now_ms) {
        SessionCheck::Expired => Err("past its absolute expiry"),
        SessionCheck::Idle => Err("idle too long"),
        SessionCheck::Valid { touch } => match &session.principal {
            Principal::Agent { agent } if !agent_exists(agent) => Err("its agent no longer exists"),
            _ => Ok(touch),
        },
    }
}

impl Console {
    /// The session of a request: its cookie's id looked up in the store; a redirect to the
    /// login form (clearing the cookie) without a valid one.
    async fn session(
        &self,
        headers: &HeaderMap,
        extensions: &axum::http::Extensions,
    ) -> Result<Session, Response> {
        let secure = extensions.get::<Tls>().is_some();
        let Some(id) = cookie_session(headers) else {
            return Err(to_login(secure));
        };
        let id_hash = sha256(&id);
        let store = &self.gateway.store;
        let stored = match store.console_session(&id_hash).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return Err(to_login(secure)),
            Err(error) => {
                let error = ApiError::new(
                    ErrorKind::Unavailable,
                    format!("cannot read the session: {error}"),
                );
                return Err(html(
                    status_of(error.kind),
                    pages::login(Some(&format!("{}: {}", error.kind.as_str(), error.message))),
                ));
            }
        };
        let snapshot = self.gateway.catalog.current();
        let now = toolgrid_store::now_ms();
        match session_refusal(&stored, |agent| snapshot.agents.contains_key(agent), now) {
            Ok(touch) => {
                if touch && let Err(error) = store.touch_console_session(&id_hash, now).await {
                    tracing::warn!(%error, "cannot record a console session's use");
                }
                Ok(Session {
                    id_hash,
                    who: super::caller_name(&stored.principal),
                    csrf: csrf_token(&id),
                    principal: stored.principal,
                })
            }
            Err(why) => {
                tracing::debug!(why, "console session refused");
                if let Err(error) = store.delete_console_session(&id_hash).await {
                    tracing::warn!(%error, "cannot delete a lapsed console session");
                }
                Err(to_login(secure))
            }
        }
    }
}

async fn login_form() -> Html<String> {
    Html(pages::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

async fn login(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    axum::Form(form): axum::Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return cross_site("login refused");
    }
    let token = form.token.trim();
    let authorization = format!("Bearer {token}");
    let peer = super::authn::peer_of(&extensions);
    let refused = |error: ApiError| {
        html(
            status_of(error.kind),
            pages::login(Some(&format!("{}: {}", error.kind.as_str(), error.message))),
        )
    };
    match console
        .gateway
        .authenticate(Some(&authorization), None, peer)
        .await
    {
        Ok(principal) => {
            let secure = extensions.get::<Tls>().is_some();
            let limits = console.gateway.console_limits();
            let id = new_session_id();
            let session =
                ConsoleSession::new(sha256(&id), principal, limits, toolgrid_store::now_ms());
            if let Err(error) = console.gateway.store.create_console_session(session).await {
                return refused(ApiError::new(
                    ErrorKind::Unavailable,
                    format!("cannot open a session: {error}"),
                ));
            }
            let mut response = Redirect::to("/ui").into_response();
            let cookie = session_cookie(Some((&id, limits.lifetime.as_secs())), secure);
            if let Ok(cookie) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            response
        }
        Err(error) => html(
            status_of(error.kind),
            pages::login(Some(&format!("{}: {}", error.kind.as_str(), error.message))),
        ),
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    let session = match console.session(&headers, &extensions).await {
        Ok(session) => session,
        Err(redirect) => return redirect,
    };
    if let Some(refused) = session.refuse_forged(&headers, &form.csrf) {
        return refused;
    }
    if let Err(error) = console
        .gateway
        .store
        .delete_console_session(&session.id_hash)
        .await
    {
        let error = ApiError::new(
            ErrorKind::Unavailable,
            format!("the session was not ended: {error}"),
        );
        return session.error_page("Logout failed", &error);
    }
    to_login(extensions.get::<Tls>().is_some())
}

#[derive(Deserialize)]
struct NamespaceQuery {
    #[serde(default)]
    namespace: String,
}

/// `/ui`: the calls waiting for approval.
async fn awaiting_page(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Query(query): Query<NamespaceQuery>,
) -> Response {
    let session = match console.session(&headers, &extensions).await {
        Ok(session) => session,
        Err(redirect) => return redirect,
    };
    let title = "Calls awaiting approval";
    match console
        .gateway
        .awaiting_approval(&session.principal, &query.namespace)
        .await
    {
        Ok(calls) => html(
            StatusCode::OK,
            pages::page(
                title,
                Some(&session.chrome()),
                None,
                &pages::awaiting(&calls, &session.csrf),
            ),
        ),
        Err(error) => session.error_page(title, &error),
    }
}

/// `/ui/calls`: recent calls.
async fn calls_page(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Query(query): Query<NamespaceQuery>,
) -> Response {
    let session = match console.session(&headers, &extensions).await {
        Ok(session) => session,
        Err(redirect) => return redirect,
    };
    match console
        .gateway
        .list_calls(&session.principal, &query.namespace, "", 100)
        .await
    {
        Ok(calls) => html(
            StatusCode::OK,
            pages::page(
                "Recent calls",
                Some(&session.chrome()),
                None,
                &pages::calls(&calls),
            ),
        ),
        Err(error) => session.error_page("Recent calls", &error),
    }
}

/// Renders a call's page, with `message` (an error kind and text) on top.
async fn render_call(
    console: &Console,
    session: &Session,
    id: &str,
    status: StatusCode,
    message: Option<&str>,
) -> Response {
    let title = format!("Call {id}");
    let record = match console.gateway.get_call(&session.principal, id).await {
        Ok(record) => record,
        Err(error) => return session.error_page(&title, &error),
    };
    // The first page of the oplog (the CLI and the API read the rest).
    let (oplog, next) = match console.gateway.oplog_page(&session.principal, id, 0).await {
        Ok(page) => page,
        Err(error) => return session.error_page(&title, &error),
    };
    let mut lines = timeline::timeline(record.created_at_ms, &oplog);
    if let Some(next) = next {
        lines.push(timeline::more(next, lines.last()));
    }
    html(
        status,
        pages::page(
            &title,
            Some(&session.chrome()),
            message,
            &pages::call(&record, &lines, &session.csrf),
        ),
    )
}

/// `/ui/calls/{id}`: a call and its timeline.
async fn call_page(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Path(id): Path<String>,
) -> Response {
    match console.session(&headers, &extensions).await {
        Ok(session) => render_call(&console, &session, &id, StatusCode::OK, None).await,
        Err(redirect) => redirect,
    }
}

#[derive(Deserialize)]
struct DecideForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    reason: String,
}

/// The decision a form names.
fn approves(decision: &str) -> Result<bool, ApiError> {
    match decision {
        "approve" => Ok(true),
        "deny" => Ok(false),
        other => Err(ApiError::new(
            ErrorKind::InvalidArgument,
            format!("decision must be approve or deny, not {other:?}"),
        )),
    }
}

/// `POST /ui/calls/{id}/decide`: approve or deny, then the call's page.
async fn decide(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<DecideForm>,
) -> Response {
    let session = match console.session(&headers, &extensions).await {
        Ok(session) => session,
        Err(redirect) => return redirect,
    };
    if let Some(refused) = session.refuse_forged(&headers, &form.csrf) {
        return refused;
    }
    let decided = match approves(&form.decision) {
        Ok(approve) => {
            console
                .gateway
                .decide(&session.principal, &id, approve, form.reason.trim())
                .await
        }
        Err(error) => Err(error),
    };
    match decided {
        Ok(_) => Redirect::to(&format!("/ui/calls/{}", pages::path_segment(&id))).into_response(),
        Err(error) => {
            let message = format!("{}: {}", error.kind.as_str(), error.message);
            render_call(
                &console,
                &session,
                &id,
                status_of(error.kind),
                Some(&message),
            )
            .await
        }
    }
}

/// `/ui/agents`: every agent for an operator; an agent goes to its own page.
async fn agents_page(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Response {
    let session = match console.session(&headers, &extensions).await {
        Ok(session) => session,
        Err(redirect) => return redirect,
    };
    if let Principal::Agent { agent } = &session.principal {
        return Redirect::to(&format!(
            "/ui/agents/{}/{}",
            pages::path_segment(&agent.namespace),
            pages::path_segment(&agent.name)
        ))
        .into_response();
    }
    match console
        .gateway
        .list_resources(&session.principal, "agents", "")
    {
        Ok(rows) => {
            let rows: Vec<_> = rows
                .into_iter()
                .map(|r| (r.namespace, r.name, r.ready, r.message))
                .collect();
            html(
                StatusCode::OK,
                pages::page(
                    "Agents",
                    Some(&session.chrome()),
                    None,
                    &pages::agents(&rows),
                ),
            )
        }
        Err(error) => session.error_page("Agents", &error),
    }
}

/// `/ui/agents/{ns}/{name}`: the tools an agent has, and why not the others.
async fn agent_page(
    State(console): State<Console>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let session = match console.session(&headers, &extensions).await {
        Ok(session) => session,
        Err(redirect) => return redirect,
    };
    let title = format!("Agent {ns}/{name}");
    match console
        .gateway
        .why(&session.principal, &format!("{ns}/{name}"), "")
    {
        Ok((_, access)) => html(
            StatusCode::OK,
            pages::page(
                &title,
                Some(&session.chrome()),
                None,
                &pages::access(&access),
            ),
        ),
        Err(error) => session.error_page(&title, &error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_shape() {
        // RFC 4231 test case 2 uses a 4-byte key; ours is always 32 bytes, zero-padded to
        // the block like any short key, so the same vector holds with the key padded.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex::encode(hmac_sha256(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn csrf_tokens_belong_to_one_session() {
        let a = csrf_token(&[7u8; 32]);
        assert_eq!(a, csrf_token(&[7u8; 32]), "any replica computes it");
        assert_ne!(a, csrf_token(&[8u8; 32]));
        assert_ne!(a, hex::encode(sha256(&[7u8; 32])), "not the stored hash");
        assert!(csrf_matches(&a, &a));
        assert!(!csrf_matches(&a, ""));
        assert!(!csrf_matches(&a, &a[1..]));
    }

    #[test]
    fn the_cookie_holds_a_random_session_id_and_is_read_back() {
        let id = new_session_id();
        assert_ne!(id, new_session_id(), "every login draws a new id");
        let cookie = session_cookie(Some((&id, 3600)), true);
        assert!(cookie.contains("HttpOnly"));
        assert!(cookie.contains("SameSite=Strict"));
        assert!(cookie.contains("Path=/ui"));
        assert!(cookie.contains("Max-Age=3600"));
        assert!(cookie.ends_with("; Secure"));
        assert!(!session_cookie(Some((&id, 1)), false).contains("Secure"));
        let value = cookie.split(';').next().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {value}")).unwrap(),
        );
        assert_eq!(cookie_session(&headers), Some(id));
        for bad in [
            "toolgrid_console=zz",
            "toolgrid_console=abcd",
            "toolgrid_console=",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::COOKIE, HeaderValue::from_static(bad));
            assert_eq!(cookie_session(&headers), None, "{bad}");
        }
        assert!(session_cookie(None, false).contains("Max-Age=0"));
    }

    #[test]
    fn a_session_is_refused_when_lapsed_or_its_agent_is_gone() {
        use std::time::Duration;
        use toolgrid_core::auth::SessionLimits;
        use toolgrid_core::ids::ObjectKey;
        let limits = SessionLimits {
            idle: Duration::from_secs(60),
            lifetime: Duration::from_secs(600),
        };
        let bot = ObjectKey::new("team", "bot");
        let session =
            ConsoleSession::new([1; 32], Principal::Agent { agent: bot.clone() }, limits, 0);
        let exists = |agent: &ObjectKey| *agent == bot;
        assert_eq!(session_refusal(&session, exists, 1_000), Ok(false));
        assert_eq!(session_refusal(&session, exists, 30_000), Ok(true));
        assert!(session_refusal(&session, exists, 60_000).is_err(), "idle");
        assert!(
            session_refusal(&session, |_| false, 1_000).is_err(),
            "agent gone"
        );
        let busy = ConsoleSession {
            last_seen_ms: 599_000,
            ..session
        };
        assert!(session_refusal(&busy, exists, 600_000).is_err(), "expired");
        let operator = ConsoleSession::new(
            [2; 32],
            Principal::Operator {
                subject: "admin".into(),
            },
            limits,
            0,
        );
        assert_eq!(session_refusal(&operator, |_| false, 1_000), Ok(false));
    }

    #[test]
    fn a_post_from_another_origin_is_refused() {
        let with = |origin: Option<&'static str>, host: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static(host));
            if let Some(origin) = origin {
                headers.insert(header::ORIGIN, HeaderValue::from_static(origin));
            }
            same_origin(&headers)
        };
        assert!(with(None, "127.0.0.1:7071"));
        assert!(with(Some("http://127.0.0.1:7071"), "127.0.0.1:7071"));
        assert!(with(Some("https://Console.example"), "console.example"));
        assert!(!with(Some("http://evil.example"), "127.0.0.1:7071"));
        assert!(!with(Some("http://127.0.0.1:7072"), "127.0.0.1:7071"));
        assert!(!with(Some("null"), "127.0.0.1:7071"));
    }

    #[test]
    fn a_decision_is_approve_or_deny() {
        assert!(approves("approve").unwrap());
        assert!(!approves("deny").unwrap());
        assert_eq!(
            approves("maybe").unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }
}
