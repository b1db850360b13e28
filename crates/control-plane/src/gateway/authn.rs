//! Authentication: who is behind a request's bearer token.
//!
//! Every Tools RPC and every `/v1` HTTP route carries `authorization: Bearer TOKEN`. The
//! token is, in order:
//! 1. the admin token of `toolgrid up` ([`Principal::Operator`]);
//! 2. an Agent's `tokenSecretRef` token ([`Principal::Agent`]); only SHA-256 digests are
//!    kept, compared in constant time;
//! 3. with a [`TokenReviewer`] (a cluster): a token the cluster accepts for the audience
//!    [`CALLER_AUDIENCE`]: a ServiceAccount that an Agent names in `spec.serviceAccount`
//!    is that Agent; otherwise a subject RBAC lets operate toolgrid is an Operator.
//!    The cluster's answers are remembered by the token's SHA-256, acceptances for
//!    [`REVIEW_TTL`] and refusals for [`REFUSAL_TTL`]; a client address may have at most
//!    [`REVIEW_BURST`] tokens reviewed at once (refilled at [`REVIEWS_PER_SECOND`]),
//!    beyond which a token not remembered is refused as [`ErrorKind::RateLimited`]
//!    without asking the cluster.
//!
//! 4. with an [`OAuthIssuer`]: a JWT that names it as its issuer is an OAuth access token
//!    (checked before 3, so it is never sent to the cluster): it must be signed by the
//!    issuer for this resource, and its subject is the Agent that lists it in
//!    `spec.oauthSubjects` in the namespace the issuer is trusted for
//!    ([`crate::auth::oauth::NamespaceTrust`]); Agents of other namespaces are never
//!    considered (a valid token of no Agent, a wrong audience, an expired one:
//!    unauthenticated). Any other JWT (a ServiceAccount token names the cluster as its
//!    issuer) goes on to 3, so ServiceAccount agents, RBAC operators and OAuth users work
//!    side by side.
//!
//! Anything else is [`ErrorKind::Unauthenticated`]. An operator may then act as an agent
//! (`toolgrid-as: AGENT` or `NAMESPACE/AGENT`); an agent that asks to is refused.

use crate::auth::oauth::OAuthIssuer;
use crate::auth::{BearerError, CALLER_AUDIENCE, ReviewedToken, TokenReviewer};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolgrid_catalog::Snapshot;
use toolgrid_core::auth::Principal;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::secret::{digests_equal, sha256};

/// The header (gRPC metadata key, HTTP header) carrying the bearer token.
pub const AUTHORIZATION: &str = "authorization";
/// The header by which an operator acts as an agent (HTTP: `Toolgrid-As`).
pub const ACT_AS: &str = "toolgrid-as";
pub use crate::auth::MAX_TOKEN_BYTES;
/// How long the cluster's answer about a token is reused before it is asked again (a
/// revoked token keeps working at most this long).
pub const REVIEW_TTL: Duration = Duration::from_secs(10);
/// How long the cluster's refusal of a token is reused (a token the cluster starts
/// accepting works after at most this long).
pub const REFUSAL_TTL: Duration = Duration::from_secs(5);
/// Most reviewed tokens remembered at once; beyond it the oldest answers are dropped.
pub const REVIEW_CACHE_ENTRIES: usize = 1024;
/// Reviews one client address may have at once (its token bucket's capacity).
pub const REVIEW_BURST: u32 = 20;
/// Reviews a client address gets back per second.
pub const REVIEWS_PER_SECOND: f64 = 1.0;
/// Most client addresses whose review buckets are remembered at once; beyond it full
/// buckets are forgotten first, then the longest unused.
pub const REVIEW_CLIENTS: usize = 4096;

/// Where the authenticator reads the time (injectable for tests).
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// Review token buckets per client address (a request of no known address shares one).
#[derive(Default)]
struct ReviewLimiter {
    buckets: Mutex<HashMap<Option<IpAddr>, (f64, Instant)>>,
}

impl ReviewLimiter {
    /// Takes a review from `peer`'s bucket: `Err(ms)` when it is empty (one is back in `ms`).
    fn take(&self, peer: Option<IpAddr>, now: Instant) -> Result<(), u64> {
        use toolgrid_core::middleware::bucket::take;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = |at: Instant| {
            i64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(i64::MAX)
        };
        if buckets.len() >= REVIEW_CLIENTS && !buckets.contains_key(&peer) {
            // Forget the buckets that are full again: they hold nothing a new one would not.
            buckets.retain(|_, (tokens, at)| {
                take(*tokens, 0, REVIEW_BURST, REVIEWS_PER_SECOND, elapsed(*at)).tokens + 1.0
                    < f64::from(REVIEW_BURST)
            });
            if buckets.len() >= REVIEW_CLIENTS
                && let Some(oldest) = buckets
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| *k)
            {
                buckets.remove(&oldest);
            }
        }
        let (tokens, at) = buckets
            .get(&peer)
            .copied()
            .unwrap_or((f64::from(REVIEW_BURST), now));
        let taken = take(tokens, 0, REVIEW_BURST, REVIEWS_PER_SECOND, elapsed(at));
        // A refused take changes nothing: keep the bucket's own time.
        if taken.retry_after_ms.is_none() {
            buckets.insert(peer, (taken.tokens, now));
        } else {
            buckets.insert(peer, (tokens, at));
        }
        match taken.retry_after_ms {
            None => Ok(()),
            Some(ms) => Err(ms),
        }
    }
}

/// The cluster's recent answers, by the SHA-256 of the token (never the token).
#[derive(Default)]
struct ReviewCache {
    entries: Mutex<HashMap<[u8; 32], Reviewed>>,
}

#[derive(Clone)]
struct Reviewed {
    at: Instant,
    /// Who the cluster says holds the token; `None`: it refused the token.
    token: Option<ReviewedToken>,
    /// `is_operator`'s answer, once asked.
    operator: Option<bool>,
}

impl Reviewed {
    /// Whether the answer may still be used at `now`.
    fn fresh(&self, now: Instant) -> bool {
        let ttl = if self.token.is_some() {
            REVIEW_TTL
        } else {
            REFUSAL_TTL
        };
        now.saturating_duration_since(self.at) < ttl
    }
}

impl ReviewCache {
    fn get(&self, digest: &[u8; 32], now: Instant) -> Option<Reviewed> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(digest).filter(|r| r.fresh(now)).cloned()
    }

    fn put(&self, digest: [u8; 32], reviewed: Reviewed) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= REVIEW_CACHE_ENTRIES && !entries.contains_key(&digest) {
            let now = reviewed.at;
            entries.retain(|_, r| r.fresh(now));
            if entries.len() >= REVIEW_CACHE_ENTRIES
                && let Some(oldest) = entries.iter().min_by_key(|(_, r)| r.at).map(|(k, _)| *k)
            {
                entries.remove(&oldest);
            }
        }
        entries.insert(digest, reviewed);
    }
}

/// How the gateway authenticates callers.
#[derive(Clone, Default)]
pub struct Authenticator {
    /// SHA-256 of the admin token (`toolgrid up`).
    admin: Option<[u8; 32]>,
    reviewer: Option<Arc<dyn TokenReviewer>>,
    /// Where `is_operator` asks RBAC about reviewed subjects (the controller's namespace).
    operator_namespace: String,
    reviews: Arc<ReviewCache>,
    limiter: Arc<ReviewLimiter>,
    /// `None`: the system's monotonic clock.
    clock: Option<Clock>,
    oauth: Option<Arc<OAuthIssuer>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("admin", &self.admin.is_some())
            .field("reviewer", &self.reviewer.is_some())
            .field("operator_namespace", &self.operator_namespace)
            .finish()
    }
}

impl Authenticator {
    /// Accepts only Agent tokens until an admin token or a reviewer is added.
    pub fn new() -> Self {
        Authenticator::default()
    }

    /// Accepts `token` as an operator's (the admin token of `toolgrid up`).
    pub fn with_admin_token(mut self, token: &str) -> Self {
        self.admin = Some(sha256(token.as_bytes()));
        self
    }

    /// Asks `reviewer` about tokens that are neither the admin's nor an Agent's; subjects
    /// that are no Agent's ServiceAccount are operators when RBAC allows them in
    /// `operator_namespace`.
    pub fn with_reviewer(
        mut self,
        reviewer: Arc<dyn TokenReviewer>,
        operator_namespace: impl Into<String>,
    ) -> Self {
        self.reviewer = Some(reviewer);
        self.operator_namespace = operator_namespace.into();
        self
    }

    /// Reads the time from `clock` (tests: a fake one).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    fn now(&self) -> Instant {
        match &self.clock {
            Some(clock) => clock(),
            None => Instant::now(),
        }
    }

    /// Accepts OAuth access tokens `issuer` signed (see [`crate::auth::oauth`]).
    pub fn with_oauth(mut self, issuer: OAuthIssuer) -> Self {
        self.oauth = Some(Arc::new(issuer));
        self
    }

    /// The caller behind `authorization` (the header's value), acting as `act_as` if given;
    /// `peer` is the client's address (reviews are rate-limited per address).
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        act_as: Option<&str>,
        peer: Option<IpAddr>,
        snapshot: &Snapshot,
    ) -> Result<Principal, ApiError> {
        let token = bearer_token(authorization)?;
        let principal = match match_token(token, self.admin.as_ref(), snapshot) {
            Some(principal) => principal,
            None => match &self.oauth {
                Some(issuer) if issuer.claims_to_be_mine(token) => {
                    oauth_agent(issuer, token, snapshot)?
                }
                _ => self.review(token, peer, snapshot).await?,
            },
        };
        apply_act_as(principal, act_as)
    }

    /// Asks the cluster (or its answer of the last [`REVIEW_TTL`], its refusal of the last
    /// [`REFUSAL_TTL`]) who holds `token`. A token not remembered is reviewed only while
    /// `peer`'s review bucket has a token: otherwise [`ErrorKind::RateLimited`].
    async fn review(
        &self,
        token: &str,
        peer: Option<IpAddr>,
        snapshot: &Snapshot,
    ) -> Result<Principal, ApiError> {
        let Some(reviewer) = &self.reviewer else {
            return Err(unknown_token());
        };
        let digest = sha256(token.as_bytes());
        let mut cached = match self.reviews.get(&digest, self.now()) {
            Some(cached) => cached,
            None => {
                if let Err(ms) = self.limiter.take(peer, self.now()) {
                    return Err(ApiError::new(
                        ErrorKind::RateLimited,
                        "too many unknown bearer tokens from this address: try again later",
                    )
                    .with_retry_after(ms));
                }
                let token = reviewer
                    .review(token, CALLER_AUDIENCE)
                    .await
                    .map_err(|e| ApiError::new(ErrorKind::Unavailable, e.to_string()))?;
                let reviewed = Reviewed {
                    at: self.now(),
                    token,
                    operator: None,
                };
                self.reviews.put(digest, reviewed.clone());
                reviewed
            }
        };
        let Some(reviewed) = cached.token.clone() else {
            return Err(unknown_token());
        };
        if let Some(agent) = agent_of_service_account(&reviewed, snapshot) {
            return Ok(Principal::Agent { agent });
        }
        let operator = match cached.operator {
            Some(operator) => operator,
            None => {
                let operator = reviewer
                    .is_operator(&reviewed, &self.operator_namespace)
                    .await
                    .map_err(|e| ApiError::new(ErrorKind::Unavailable, e.to_string()))?;
                cached.operator = Some(operator);
                self.reviews.put(digest, cached);
                operator
            }
        };
        if operator {
            Ok(Principal::Operator {
                subject: reviewed.username,
            })
        } else {
            Err(ApiError::new(
                ErrorKind::Unauthenticated,
                format!(
                    "{} is neither an Agent's ServiceAccount nor allowed to operate toolgrid",
                    reviewed.username
                ),
            ))
        }
    }
}

/// The client's address of an HTTP request (its connection's, which the server records).
pub fn peer_of(extensions: &axum::http::Extensions) -> Option<std::net::IpAddr> {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip())
}

fn unknown_token() -> ApiError {
    ApiError::new(ErrorKind::Unauthenticated, "the bearer token is not valid")
}

/// The token of an `authorization` value `Bearer TOKEN` (the scheme in any case).
pub fn bearer_token(authorization: Option<&str>) -> Result<&str, ApiError> {
    let Some(value) = authorization else {
        return Err(ApiError::new(
            ErrorKind::Unauthenticated,
            "no bearer token: send `authorization: Bearer TOKEN` (the CLI: --token or TOOLGRID_TOKEN)",
        ));
    };
    crate::auth::bearer_token(value).map_err(|error| {
        let message = match error {
            BearerError::NoScheme | BearerError::WrongScheme => {
                "the authorization header is not `Bearer TOKEN`"
            }
            BearerError::Empty | BearerError::TooLong => "the bearer token is empty or too long",
        };
        ApiError::new(ErrorKind::Unauthenticated, message)
    })
}

/// The admin or an Agent, when `token` is the admin token or an Agent's token. Compares
/// SHA-256 digests, each in constant time, against every candidate.
pub fn match_token(
    token: &str,
    admin: Option<&[u8; 32]>,
    snapshot: &Snapshot,
) -> Option<Principal> {
    let digest = sha256(token.as_bytes());
    let mut found = None;
    if let Some(admin) = admin
        && digests_equal(admin, &digest)
    {
        found = Some(Principal::Operator {
            subject: "admin".into(),
        });
    }
    for agent in snapshot.agents.values() {
        if let Some(expected) = &agent.token_digest
            && digests_equal(expected, &digest)
            && found.is_none()
        {
            found = Some(Principal::Agent {
                agent: agent.key.clone(),
            });
        }
    }
    found
}

/// The Agent an OAuth access token is: its subject listed in `oauthSubjects` by an Agent of
/// the namespace the issuer is trusted for. The catalog keeps a subject to one Agent per
/// namespace (a later Agent listing it again is not Ready), so there is at most one.
fn oauth_agent(
    issuer: &OAuthIssuer,
    token: &str,
    snapshot: &Snapshot,
) -> Result<Principal, ApiError> {
    let verified = issuer
        .verify(token, toolgrid_core::call::now_ms() / 1000)
        .map_err(|e| {
            ApiError::new(
                ErrorKind::Unauthenticated,
                format!("access token refused: {e}"),
            )
        })?;
    let subject = &verified.subject.0;
    snapshot
        .agents
        .values()
        .find(|a| {
            a.key.namespace == verified.namespace && a.spec.oauth_subjects.contains(subject)
        })
        .map(|agent| Principal::Agent {
            agent: agent.key.clone(),
        })
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::Unauthenticated,
                format!(
                    "access token refused: no Agent of namespace {:?} lists subject {subject:?} in oauthSubjects",
                    verified.namespace
                ),
            )
        })
}

/// The Agent whose `spec.serviceAccount` is the reviewed ServiceAccount (same namespace).
pub fn agent_of_service_account(
    reviewed: &ReviewedToken,
    snapshot: &Snapshot,
) -> Option<ObjectKey> {
    let account = reviewed.service_account()?;
    snapshot
        .agents
        .values()
        .find(|a| {
            a.key.namespace == account.namespace
                && a.spec.service_account.as_deref() == Some(account.name.as_str())
        })
        .map(|a| a.key.clone())
}

/// Applies `toolgrid-as`: an operator becomes the named agent (`NAME` in the default
/// namespace, or `NAMESPACE/NAME`); an agent may not act as anyone.
pub fn apply_act_as(principal: Principal, act_as: Option<&str>) -> Result<Principal, ApiError> {
    let Some(name) = act_as.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(principal);
    };
    match principal {
        Principal::Agent { agent } => Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!("agent {agent} may not act as another agent (only operators may use --as)"),
        )),
        Principal::Operator { .. } => {
            let (namespace, agent) = name
                .split_once('/')
                .unwrap_or((toolgrid_api::DEFAULT_NAMESPACE, name));
            if namespace.is_empty() || agent.is_empty() || agent.contains('/') {
                return Err(ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("{ACT_AS}: {name:?} is not AGENT or NAMESPACE/AGENT"),
                ));
            }
            Ok(Principal::Agent {
                agent: ObjectKey::new(namespace, agent),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ReviewError;
    use std::collections::BTreeMap;
    use toolgrid_catalog::ResolvedAgent;

    fn agent(name: &str, token: Option<&str>, service_account: Option<&str>) -> ResolvedAgent {
        ResolvedAgent {
            key: ObjectKey::new("default", name),
            spec: toolgrid_api::AgentSpec {
                service_account: service_account.map(String::from),
                token_secret_ref: None,
                oauth_subjects: vec![],
                permissions: vec![],
                config_map_ref: None,
                secret_ref: None,
                exposure: None,
            },
            token_digest: token.map(|t| sha256(t.as_bytes())),
            config: BTreeMap::new(),
            secrets: BTreeMap::new(),
        }
    }

    fn snapshot() -> Snapshot {
        let mut snapshot = Snapshot::default();
        for a in [
            agent("reporter", Some("reporter-token"), None),
            agent("robot", None, Some("robot-sa")),
        ] {
            snapshot.agents.insert(a.key.clone(), Arc::new(a));
        }
        snapshot
    }

    #[derive(Default)]
    struct FakeReviewer {
        reviews: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl TokenReviewer for FakeReviewer {
        async fn review(
            &self,
            token: &str,
            audience: &str,
        ) -> Result<Option<ReviewedToken>, ReviewError> {
            self.reviews
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if audience != CALLER_AUDIENCE {
                return Ok(None);
            }
            let username = match token {
                "sa-robot" => "system:serviceaccount:default:robot-sa",
                "sa-other" => "system:serviceaccount:default:other",
                "alice" => "alice",
                "down" => return Err(ReviewError::Unavailable("api server down".into())),
                // Every JWT that reaches the cluster here is robot's ServiceAccount token.
                jwt if jwt.starts_with("eyJ") => "system:serviceaccount:default:robot-sa",
                _ => return Ok(None),
            };
            Ok(Some(ReviewedToken {
                username: username.into(),
                uid: "u".into(),
                groups: vec![],
            }))
        }

        async fn is_operator(
            &self,
            user: &ReviewedToken,
            namespace: &str,
        ) -> Result<bool, ReviewError> {
            Ok(user.username == "alice" && namespace == "toolgrid")
        }
    }

    fn kind<T: std::fmt::Debug>(result: Result<T, ApiError>) -> ErrorKind {
        result.expect_err("refused").kind
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        assert_eq!(bearer_token(Some("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer_token(Some("bearer abc")).unwrap(), "abc");
        assert_eq!(kind(bearer_token(None)), ErrorKind::Unauthenticated);
        assert_eq!(
            kind(bearer_token(Some("Basic abc"))),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            kind(bearer_token(Some("Bearer "))),
            ErrorKind::Unauthenticated
        );
        assert_eq!(kind(bearer_token(Some("abc"))), ErrorKind::Unauthenticated);
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(kind(bearer_token(Some(&long))), ErrorKind::Unauthenticated);
    }

    #[test]
    fn tokens_match_the_admin_or_an_agent() {
        let snapshot = snapshot();
        let admin = sha256(b"admin-token");
        assert!(matches!(
            match_token("admin-token", Some(&admin), &snapshot),
            Some(Principal::Operator { .. })
        ));
        assert_eq!(
            match_token("reporter-token", Some(&admin), &snapshot),
            Some(Principal::Agent {
                agent: ObjectKey::new("default", "reporter")
            })
        );
        assert_eq!(match_token("wrong", Some(&admin), &snapshot), None);
        assert_eq!(match_token("admin-token", None, &snapshot), None);
    }

    #[test]
    fn only_operators_act_as_agents() {
        let operator = Principal::Operator {
            subject: "admin".into(),
        };
        assert_eq!(
            apply_act_as(operator.clone(), Some("reporter")).unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("default", "reporter")
            }
        );
        assert_eq!(
            apply_act_as(operator.clone(), Some("team/bot")).unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("team", "bot")
            }
        );
        assert_eq!(apply_act_as(operator.clone(), None).unwrap(), operator);
        assert_eq!(
            kind(apply_act_as(operator, Some("a/b/c"))),
            ErrorKind::InvalidArgument
        );
        let agent = Principal::Agent {
            agent: ObjectKey::new("default", "reporter"),
        };
        assert_eq!(
            kind(apply_act_as(agent, Some("robot"))),
            ErrorKind::PermissionDenied
        );
    }

    #[tokio::test]
    async fn reviewed_tokens_map_to_agents_or_operators() {
        let snapshot = snapshot();
        let auth = Authenticator::new()
            .with_admin_token("admin-token")
            .with_reviewer(Arc::new(FakeReviewer::default()), "toolgrid");
        let who = |token: &'static str| {
            let auth = auth.clone();
            let header = format!("Bearer {token}");
            let snapshot = &snapshot;
            async move { auth.authenticate(Some(&header), None, None, snapshot).await }
        };
        assert_eq!(
            who("sa-robot").await.unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("default", "robot")
            }
        );
        assert_eq!(
            who("alice").await.unwrap(),
            Principal::Operator {
                subject: "alice".into()
            }
        );
        assert_eq!(kind(who("sa-other").await), ErrorKind::Unauthenticated);
        assert_eq!(kind(who("expired").await), ErrorKind::Unauthenticated);
        assert_eq!(kind(who("down").await), ErrorKind::Unavailable);
        assert!(matches!(
            who("admin-token").await.unwrap(),
            Principal::Operator { .. }
        ));
        // Without a reviewer, an unknown token is refused without asking anyone.
        let local = Authenticator::new().with_admin_token("admin-token");
        assert_eq!(
            kind(
                local
                    .authenticate(Some("Bearer sa-robot"), None, None, &snapshot)
                    .await
            ),
            ErrorKind::Unauthenticated
        );
    }

    /// A clock the test moves by hand.
    fn fake_clock() -> (Clock, Arc<Mutex<Instant>>) {
        let now = Arc::new(Mutex::new(Instant::now()));
        let read = now.clone();
        let clock: Clock = Arc::new(move || *read.lock().unwrap());
        (clock, now)
    }

    fn advance(now: &Mutex<Instant>, by: Duration) {
        let mut now = now.lock().unwrap();
        *now += by;
    }

    fn peer(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[tokio::test]
    async fn the_clusters_answers_and_refusals_are_reused_for_their_ttls() {
        let snapshot = snapshot();
        let reviewer = Arc::new(FakeReviewer::default());
        let (clock, now) = fake_clock();
        let auth = Authenticator::new()
            .with_reviewer(reviewer.clone(), "toolgrid")
            .with_clock(clock);
        let count = || reviewer.reviews.load(std::sync::atomic::Ordering::SeqCst);
        let who = |token: &str| {
            let header = format!("Bearer {token}");
            let (auth, snapshot) = (&auth, &snapshot);
            async move {
                auth.authenticate(Some(&header), None, peer(1), snapshot)
                    .await
            }
        };
        for _ in 0..3 {
            who("alice").await.unwrap();
        }
        assert_eq!(count(), 1, "one TokenReview for repeated calls");
        for _ in 0..5 {
            assert_eq!(kind(who("expired").await), ErrorKind::Unauthenticated);
        }
        assert_eq!(count(), 2, "a refusal is remembered too");
        advance(&now, REFUSAL_TTL - Duration::from_millis(1));
        assert_eq!(kind(who("expired").await), ErrorKind::Unauthenticated);
        assert_eq!(count(), 2, "within its TTL");
        advance(&now, Duration::from_millis(1));
        assert_eq!(kind(who("expired").await), ErrorKind::Unauthenticated);
        assert_eq!(count(), 3, "asked again once the refusal's TTL passed");
        who("alice").await.unwrap();
        assert_eq!(count(), 3, "the acceptance lives longer");
        advance(&now, REVIEW_TTL);
        who("alice").await.unwrap();
        assert_eq!(count(), 4, "asked again once the acceptance's TTL passed");
    }

    #[tokio::test]
    async fn a_flood_of_bad_tokens_from_one_address_is_rate_limited() {
        let snapshot = snapshot();
        let reviewer = Arc::new(FakeReviewer::default());
        let (clock, now) = fake_clock();
        let auth = Authenticator::new()
            .with_admin_token("admin-token")
            .with_reviewer(reviewer.clone(), "toolgrid")
            .with_clock(clock);
        let count = || reviewer.reviews.load(std::sync::atomic::Ordering::SeqCst);
        let from = |token: String, address| {
            let (auth, snapshot) = (&auth, &snapshot);
            async move {
                auth.authenticate(Some(&format!("Bearer {token}")), None, address, snapshot)
                    .await
            }
        };
        // A good token, reviewed and remembered before the flood.
        from("alice".into(), peer(1)).await.unwrap();
        let mut limited = None;
        for i in 0..200 {
            match from(format!("bad-{i}"), peer(1)).await {
                Err(error) if error.kind == ErrorKind::RateLimited => {
                    limited = Some(error);
                    break;
                }
                other => assert_eq!(kind(other), ErrorKind::Unauthenticated),
            }
        }
        let limited = limited.expect("the flood was never limited");
        let retry = limited.retry_after_ms.expect("a retry-after");
        assert!(retry > 0 && retry <= 1000, "{retry}");
        assert_eq!(
            count(),
            REVIEW_BURST as usize,
            "at most the bucket reviewed"
        );
        for i in 0..50 {
            assert_eq!(
                kind(from(format!("more-{i}"), peer(1)).await),
                ErrorKind::RateLimited
            );
        }
        assert_eq!(count(), REVIEW_BURST as usize, "no review while limited");
        // The cached good token, the admin token and an Agent's token still work.
        from("alice".into(), peer(1)).await.unwrap();
        from("admin-token".into(), peer(1)).await.unwrap();
        from("reporter-token".into(), peer(1)).await.unwrap();
        // A remembered refusal is still answered as such, not as rate-limited.
        assert_eq!(
            kind(from("bad-0".into(), peer(1)).await),
            ErrorKind::Unauthenticated
        );
        // Another address is still reviewed.
        assert_eq!(
            kind(from("bad-other".into(), peer(2)).await),
            ErrorKind::Unauthenticated
        );
        assert_eq!(count(), REVIEW_BURST as usize + 1);
        // The bucket refills with time.
        advance(&now, Duration::from_millis(retry));
        assert_eq!(
            kind(from("late".into(), peer(1)).await),
            ErrorKind::Unauthenticated
        );
        assert_eq!(count(), REVIEW_BURST as usize + 2);
    }

    #[test]
    fn the_limiters_map_is_bounded() {
        let limiter = ReviewLimiter::default();
        let start = Instant::now();
        for i in 0..(REVIEW_CLIENTS as u32 + 100) {
            let address = IpAddr::from(std::net::Ipv4Addr::from(i));
            assert!(limiter.take(Some(address), start).is_ok());
        }
        let held = limiter.buckets.lock().unwrap().len();
        assert!(held <= REVIEW_CLIENTS, "{held}");
    }

    fn with_oauth_subject(snapshot: &mut Snapshot, namespace: &str, name: &str, subject: &str) {
        let mut a = agent(name, None, None);
        a.key = ObjectKey::new(namespace, name);
        a.spec.oauth_subjects = vec![subject.into()];
        snapshot.agents.insert(a.key.clone(), Arc::new(a));
    }

    const ISS: &str = "https://auth.example.com";
    const AUD: &str = "https://tools.example.com/mcp";

    fn token(key: &ring::signature::EcdsaKeyPair, claims: serde_json::Value) -> String {
        let mut claims = claims;
        claims["exp"] = serde_json::json!(toolgrid_core::call::now_ms() / 1000 + 600);
        crate::auth::oauth::test_tokens::sign(key, &claims)
    }

    #[tokio::test]
    async fn an_oauth_subject_is_an_agent_of_the_trusted_namespace_only() {
        use crate::auth::oauth::{NamespaceTrust, test_tokens};
        use serde_json::json;
        let key = test_tokens::keypair();
        let mut snapshot = snapshot();
        // team-b's agent lists the same subject as team-a's: it captures nobody.
        with_oauth_subject(&mut snapshot, "team-a", "alice-agent", "alice");
        with_oauth_subject(&mut snapshot, "team-b", "thief", "alice");
        let issuer = OAuthIssuer::new(ISS, AUD, &test_tokens::jwks(&key)).unwrap();
        let fixed = Authenticator::new().with_oauth(
            issuer
                .clone()
                .with_trust(NamespaceTrust::Namespace("team-a".into())),
        );
        let alice = token(&key, json!({"iss": ISS, "aud": AUD, "sub": "alice"}));
        let bearer = format!("Bearer {alice}");
        assert_eq!(
            fixed
                .authenticate(Some(&bearer), None, None, &snapshot)
                .await
                .unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("team-a", "alice-agent")
            }
        );
        // Trusted for team-b, the issuer's alice is team-b's agent, never team-a's.
        let for_b = Authenticator::new().with_oauth(
            issuer
                .clone()
                .with_trust(NamespaceTrust::Namespace("team-b".into())),
        );
        assert_eq!(
            for_b
                .authenticate(Some(&bearer), None, None, &snapshot)
                .await
                .unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("team-b", "thief")
            }
        );
        // By claim: the token names its namespace; without the claim it is refused.
        let by_claim = Authenticator::new()
            .with_oauth(issuer.with_trust(NamespaceTrust::Claim("tenant".into())));
        let in_a = token(
            &key,
            json!({"iss": ISS, "aud": AUD, "sub": "alice", "tenant": "team-a"}),
        );
        assert_eq!(
            by_claim
                .authenticate(Some(&format!("Bearer {in_a}")), None, None, &snapshot)
                .await
                .unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("team-a", "alice-agent")
            }
        );
        assert_eq!(
            kind(
                by_claim
                    .authenticate(Some(&bearer), None, None, &snapshot)
                    .await
            ),
            ErrorKind::Unauthenticated
        );
        let in_c = token(
            &key,
            json!({"iss": ISS, "aud": AUD, "sub": "alice", "tenant": "team-c"}),
        );
        let refused = by_claim
            .authenticate(Some(&format!("Bearer {in_c}")), None, None, &snapshot)
            .await
            .expect_err("no agent of team-c lists alice");
        assert_eq!(refused.kind, ErrorKind::Unauthenticated);
        assert!(refused.message.contains("team-c"), "{}", refused.message);
    }

    #[tokio::test]
    async fn oauth_and_service_account_tokens_work_side_by_side() {
        use crate::auth::oauth::test_tokens;
        use serde_json::json;
        let key = test_tokens::keypair();
        let mut snapshot = snapshot();
        with_oauth_subject(&mut snapshot, "default", "mcp-user", "alice");
        let reviewer = Arc::new(FakeReviewer::default());
        let auth = Authenticator::new()
            .with_reviewer(reviewer.clone(), "toolgrid")
            .with_oauth(OAuthIssuer::new(ISS, AUD, &test_tokens::jwks(&key)).unwrap());
        let reviews = || reviewer.reviews.load(std::sync::atomic::Ordering::SeqCst);
        let who = |token: String| {
            let auth = auth.clone();
            let snapshot = &snapshot;
            async move {
                auth.authenticate(Some(&format!("Bearer {token}")), None, None, snapshot)
                    .await
            }
        };
        // The issuer's token is OAuth's, and is never sent to the cluster.
        let oauth = token(&key, json!({"iss": ISS, "aud": AUD, "sub": "alice"}));
        assert_eq!(
            who(oauth).await.unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("default", "mcp-user")
            }
        );
        let stranger = token(&key, json!({"iss": ISS, "aud": AUD, "sub": "mallory"}));
        assert_eq!(kind(who(stranger).await), ErrorKind::Unauthenticated);
        assert_eq!(
            reviews(),
            0,
            "the issuer's tokens are not reviewed by the cluster"
        );
        // A ServiceAccount token (a JWT the cluster issued) still reaches the cluster.
        let service_account = token(
            &key,
            json!({"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:default:robot-sa"}),
        );
        assert_eq!(
            who(service_account).await.unwrap(),
            Principal::Agent {
                agent: ObjectKey::new("default", "robot")
            }
        );
        assert_eq!(reviews(), 1);
        // And so do an operator's and the admin's.
        assert!(matches!(
            who("alice".into()).await.unwrap(),
            Principal::Operator { .. }
        ));
    }
}
