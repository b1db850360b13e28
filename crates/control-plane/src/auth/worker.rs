//! Who may attach as a worker. Every `WorkerLink` RPC carries `authorization: Bearer TOKEN`
//! gRPC metadata; the control plane asks its [`WorkerAuthenticator`] about the token before it
//! reads anything else from the worker, and again, once the worker has said which pool it
//! serves, whether that identity may serve that pool.
//!
//! Two authenticators:
//! - [`JoinSecret`] (`toolgrid up`): one random secret per start, handed to the local worker
//!   processes and written to `DATA/join-token`; whoever holds it may serve any pool.
//! - [`ServiceAccountWorkers`] (cluster): the worker pod's projected ServiceAccount token
//!   (audience [`WORKER_AUDIENCE`]) reviewed by the cluster; it may serve only a pool whose
//!   workers run as that ServiceAccount, in the pool's namespace
//!   ([`WorkerPoolSpec::service_account_name`](toolgrid_api::WorkerPoolSpec::service_account_name)).

use super::{BearerError, ReviewError, TokenReviewer, WORKER_AUDIENCE};
use std::sync::Arc;
use toolgrid_catalog::Catalog;
use toolgrid_core::call::ErrorKind;
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::secret::secrets_match;

/// The environment variable a worker reads its join token from (and `toolgrid up` hands it
/// to its local workers in): never a command-line argument of the processes `up` starts.
pub const JOIN_TOKEN_ENV: &str = "TOOLGRID_JOIN_TOKEN";

/// The file under `toolgrid up`'s data directory that holds the current join token (mode
/// 0600), for workers on this machine or another one.
pub const JOIN_TOKEN_FILE: &str = "join-token";

pub use super::MAX_TOKEN_BYTES;

/// An authenticated worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerIdentity {
    /// Holds the join secret of this `toolgrid up`: may serve any pool.
    JoinSecret,
    /// A pod running as this ServiceAccount.
    ServiceAccount(ObjectKey),
}

/// Why a worker is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerAuthError {
    #[error("no worker token: send `authorization: Bearer TOKEN` (the join token)")]
    Missing,
    #[error("the worker token is not accepted")]
    Rejected,
    #[error("the worker token is malformed: {0}")]
    Malformed(&'static str),
    #[error("{identity} may not serve pool {pool}: its workers run as ServiceAccount {expected}")]
    WrongPool {
        identity: String,
        pool: String,
        expected: String,
    },
    #[error("no WorkerPool {0}")]
    UnknownPool(String),
    #[error("cannot review the worker token: {0}")]
    Unavailable(String),
}

impl WorkerAuthError {
    /// The named error a worker sees.
    pub fn kind(&self) -> ErrorKind {
        match self {
            WorkerAuthError::Missing
            | WorkerAuthError::Rejected
            | WorkerAuthError::Malformed(_) => ErrorKind::Unauthenticated,
            WorkerAuthError::WrongPool { .. } | WorkerAuthError::UnknownPool(_) => {
                ErrorKind::PermissionDenied
            }
            WorkerAuthError::Unavailable(_) => ErrorKind::Unavailable,
        }
    }
}

impl From<ReviewError> for WorkerAuthError {
    fn from(error: ReviewError) -> Self {
        match error {
            ReviewError::Unavailable(why) => WorkerAuthError::Unavailable(why),
        }
    }
}

/// The token in an `authorization` header value: `Bearer TOKEN` (the scheme in any case).
pub fn bearer_token(header: &str) -> Result<&str, WorkerAuthError> {
    super::bearer_token(header).map_err(|error| match error {
        BearerError::NoScheme => WorkerAuthError::Malformed("expected `Bearer TOKEN`"),
        BearerError::WrongScheme => WorkerAuthError::Malformed("expected the Bearer scheme"),
        BearerError::Empty => WorkerAuthError::Missing,
        BearerError::TooLong => WorkerAuthError::Malformed("the token is too long"),
    })
}

/// Decides who a worker is, and which pools it may serve.
#[async_trait::async_trait]
pub trait WorkerAuthenticator: Send + Sync {
    /// Who presents `token` (`None`: the worker sent none). Asked first on every
    /// `WorkerLink` RPC, before anything the worker sends is read.
    async fn authenticate(&self, token: Option<&str>) -> Result<WorkerIdentity, WorkerAuthError>;

    /// Whether `identity` may register for `pool` (`namespace/name`).
    fn authorize_pool(&self, identity: &WorkerIdentity, pool: &str) -> Result<(), WorkerAuthError>;
}

/// The join secret of one `toolgrid up` start.
pub struct JoinSecret {
    secret: String,
}

impl JoinSecret {
    /// A fresh random secret (256 bits, hex).
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        JoinSecret {
            secret: hex::encode(bytes),
        }
    }

    pub fn new(secret: impl Into<String>) -> Self {
        JoinSecret {
            secret: secret.into(),
        }
    }

    /// The secret itself, to hand to local workers and write to `DATA/join-token`.
    pub fn expose(&self) -> &str {
        &self.secret
    }
}

impl std::fmt::Debug for JoinSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JoinSecret(..)")
    }
}

#[async_trait::async_trait]
impl WorkerAuthenticator for JoinSecret {
    async fn authenticate(&self, token: Option<&str>) -> Result<WorkerIdentity, WorkerAuthError> {
        let token = token.ok_or(WorkerAuthError::Missing)?;
        if secrets_match(&self.secret, token) {
            Ok(WorkerIdentity::JoinSecret)
        } else {
            Err(WorkerAuthError::Rejected)
        }
    }

    fn authorize_pool(&self, identity: &WorkerIdentity, pool: &str) -> Result<(), WorkerAuthError> {
        match identity {
            WorkerIdentity::JoinSecret => Ok(()),
            WorkerIdentity::ServiceAccount(account) => Err(WorkerAuthError::WrongPool {
                identity: format!("ServiceAccount {account}"),
                pool: pool.to_string(),
                expected: "(none: this control plane takes the join token only)".into(),
            }),
        }
    }
}

/// The ServiceAccount the workers of a pool run as, by pool (`None`: no such pool).
pub type PoolAccounts = Arc<dyn Fn(&ObjectKey) -> Option<String> + Send + Sync>;

/// Cluster workers: a projected ServiceAccount token reviewed by the cluster, for the pool
/// whose workers run as that ServiceAccount.
pub struct ServiceAccountWorkers {
    reviewer: Arc<dyn TokenReviewer>,
    accounts: PoolAccounts,
}

impl ServiceAccountWorkers {
    /// Pools and their ServiceAccounts as the catalog has them now.
    pub fn new(reviewer: Arc<dyn TokenReviewer>, catalog: Arc<Catalog>) -> Self {
        let accounts: PoolAccounts = Arc::new(move |key: &ObjectKey| {
            catalog
                .current()
                .pools
                .get(key)
                .map(|pool| pool.spec.service_account_name(&key.name))
        });
        ServiceAccountWorkers::with_accounts(reviewer, accounts)
    }

    pub fn with_accounts(reviewer: Arc<dyn TokenReviewer>, accounts: PoolAccounts) -> Self {
        ServiceAccountWorkers { reviewer, accounts }
    }
}

/// Whether `identity` may serve `pool`, whose workers run as `expected` (`None`: no such
/// pool) in the pool's namespace.
pub fn may_serve(
    identity: &WorkerIdentity,
    pool: &ObjectKey,
    expected: Option<&str>,
) -> Result<(), WorkerAuthError> {
    let expected = expected.ok_or_else(|| WorkerAuthError::UnknownPool(pool.to_string()))?;
    match identity {
        WorkerIdentity::JoinSecret => Ok(()),
        WorkerIdentity::ServiceAccount(account)
            if account.namespace == pool.namespace && account.name == expected =>
        {
            Ok(())
        }
        WorkerIdentity::ServiceAccount(account) => Err(WorkerAuthError::WrongPool {
            identity: format!("ServiceAccount {account}"),
            pool: pool.to_string(),
            expected: format!("{}/{expected}", pool.namespace),
        }),
    }
}

/// `namespace/name`, or `name` in the default namespace.
fn pool_key(pool: &str) -> ObjectKey {
    match pool.split_once('/') {
        Some((namespace, name)) => ObjectKey::new(namespace, name),
        None => ObjectKey::new(toolgrid_api::DEFAULT_NAMESPACE, pool),
    }
}

#[async_trait::async_trait]
impl WorkerAuthenticator for ServiceAccountWorkers {
    async fn authenticate(&self, token: Option<&str>) -> Result<WorkerIdentity, WorkerAuthError> {
        let token = token.ok_or(WorkerAuthError::Missing)?;
        let reviewed = self
            .reviewer
            .review(token, WORKER_AUDIENCE)
            .await?
            .ok_or(WorkerAuthError::Rejected)?;
        // Only a ServiceAccount is a worker: a user's token, even a valid one, is not.
        let account = reviewed
            .service_account()
            .ok_or(WorkerAuthError::Rejected)?;
        Ok(WorkerIdentity::ServiceAccount(account))
    }

    fn authorize_pool(&self, identity: &WorkerIdentity, pool: &str) -> Result<(), WorkerAuthError> {
        let key = pool_key(pool);
        let expected = (self.accounts)(&key);
        may_serve(identity, &key, expected.as_deref())
    }
}

/// A cluster's workers (their projected ServiceAccount tokens), and, when the controller is
/// given a join secret (`TOOLGRID_JOIN_TOKEN`), workers outside the cluster holding it.
pub struct ClusterWorkers {
    pub join: Option<JoinSecret>,
    pub accounts: ServiceAccountWorkers,
}

#[async_trait::async_trait]
impl WorkerAuthenticator for ClusterWorkers {
    async fn authenticate(&self, token: Option<&str>) -> Result<WorkerIdentity, WorkerAuthError> {
        if let (Some(join), Some(token)) = (&self.join, token)
            && secrets_match(join.expose(), token)
        {
            return Ok(WorkerIdentity::JoinSecret);
        }
        self.accounts.authenticate(token).await
    }

    fn authorize_pool(&self, identity: &WorkerIdentity, pool: &str) -> Result<(), WorkerAuthError> {
        self.accounts.authorize_pool(identity, pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ReviewedToken;
    use std::collections::HashMap;

    /// A cluster that knows a fixed set of tokens, each for one audience.
    struct FakeReviewer {
        tokens: HashMap<String, (String, ReviewedToken)>,
        down: bool,
    }

    #[async_trait::async_trait]
    impl TokenReviewer for FakeReviewer {
        async fn review(
            &self,
            token: &str,
            audience: &str,
        ) -> Result<Option<ReviewedToken>, ReviewError> {
            if self.down {
                return Err(ReviewError::Unavailable("connection refused".into()));
            }
            Ok(self
                .tokens
                .get(token)
                .filter(|(aud, _)| aud == audience)
                .map(|(_, reviewed)| reviewed.clone()))
        }

        async fn is_operator(&self, _: &ReviewedToken, _: &str) -> Result<bool, ReviewError> {
            Ok(false)
        }
    }

    fn user(name: &str) -> ReviewedToken {
        ReviewedToken {
            username: name.into(),
            uid: "uid".into(),
            groups: vec![],
        }
    }

    fn spec(json: serde_json::Value) -> toolgrid_api::WorkerPoolSpec {
        serde_json::from_value(json).expect("a pool spec")
    }

    fn cluster(down: bool) -> ServiceAccountWorkers {
        let tokens = HashMap::from([
            (
                "gpu-token".to_string(),
                (
                    WORKER_AUDIENCE.to_string(),
                    user("system:serviceaccount:team-a:gpu-worker"),
                ),
            ),
            (
                "custom-token".to_string(),
                (
                    WORKER_AUDIENCE.to_string(),
                    user("system:serviceaccount:team-a:runner"),
                ),
            ),
            (
                "caller-token".to_string(),
                (
                    crate::auth::CALLER_AUDIENCE.to_string(),
                    user("system:serviceaccount:team-a:gpu-worker"),
                ),
            ),
            (
                "alice-token".to_string(),
                (WORKER_AUDIENCE.to_string(), user("alice")),
            ),
        ]);
        let specs: HashMap<ObjectKey, toolgrid_api::WorkerPoolSpec> = HashMap::from([
            (ObjectKey::new("team-a", "gpu"), spec(serde_json::json!({}))),
            (
                ObjectKey::new("team-a", "custom"),
                spec(serde_json::json!({"serviceAccount": "runner"})),
            ),
        ]);
        let accounts: PoolAccounts = Arc::new(move |key: &ObjectKey| {
            specs.get(key).map(|s| s.service_account_name(&key.name))
        });
        ServiceAccountWorkers::with_accounts(Arc::new(FakeReviewer { tokens, down }), accounts)
    }

    #[tokio::test]
    async fn the_join_secret_admits_only_its_holder() {
        let secret = JoinSecret::new("s3cret");
        assert_eq!(
            secret.authenticate(Some("s3cret")).await,
            Ok(WorkerIdentity::JoinSecret)
        );
        assert_eq!(
            secret.authenticate(Some("s3cres")).await,
            Err(WorkerAuthError::Rejected)
        );
        assert_eq!(
            secret.authenticate(Some("s3cret-and-more")).await,
            Err(WorkerAuthError::Rejected)
        );
        assert_eq!(
            secret.authenticate(None).await,
            Err(WorkerAuthError::Missing)
        );
        assert_eq!(WorkerAuthError::Missing.kind(), ErrorKind::Unauthenticated);
        assert!(
            secret
                .authorize_pool(&WorkerIdentity::JoinSecret, "default/default")
                .is_ok()
        );
        assert_ne!(
            JoinSecret::generate().expose(),
            JoinSecret::generate().expose()
        );
        assert_eq!(JoinSecret::generate().expose().len(), 64);
        assert!(!format!("{secret:?}").contains("s3cret"));
    }

    #[test]
    fn bearer_tokens_are_parsed_and_bounded() {
        assert_eq!(bearer_token("Bearer abc"), Ok("abc"));
        assert_eq!(bearer_token("bearer  abc "), Ok("abc"));
        assert_eq!(
            bearer_token("Basic abc"),
            Err(WorkerAuthError::Malformed("expected the Bearer scheme"))
        );
        assert!(matches!(
            bearer_token("abc"),
            Err(WorkerAuthError::Malformed(_))
        ));
        assert_eq!(bearer_token("Bearer "), Err(WorkerAuthError::Missing));
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1));
        assert!(matches!(
            bearer_token(&long),
            Err(WorkerAuthError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn a_pool_takes_only_workers_running_as_its_service_account() {
        let workers = cluster(false);
        let gpu = workers.authenticate(Some("gpu-token")).await.unwrap();
        assert_eq!(
            gpu,
            WorkerIdentity::ServiceAccount(ObjectKey::new("team-a", "gpu-worker"))
        );
        assert_eq!(workers.authorize_pool(&gpu, "team-a/gpu"), Ok(()));
        // The same account may not serve another pool, nor the same name elsewhere.
        let refused = workers.authorize_pool(&gpu, "team-a/custom").unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::PermissionDenied);
        assert!(refused.to_string().contains("team-a/runner"), "{refused}");
        assert!(matches!(
            workers.authorize_pool(&gpu, "team-b/gpu"),
            Err(WorkerAuthError::UnknownPool(_))
        ));
        // A pool that names its own ServiceAccount takes that one.
        let custom = workers.authenticate(Some("custom-token")).await.unwrap();
        assert_eq!(workers.authorize_pool(&custom, "team-a/custom"), Ok(()));
        assert!(workers.authorize_pool(&custom, "team-a/gpu").is_err());
    }

    #[tokio::test]
    async fn tokens_the_cluster_does_not_accept_for_workers_are_refused() {
        let workers = cluster(false);
        for token in ["caller-token", "alice-token", "unknown"] {
            assert_eq!(
                workers.authenticate(Some(token)).await,
                Err(WorkerAuthError::Rejected),
                "{token}"
            );
        }
        assert_eq!(
            workers.authenticate(None).await,
            Err(WorkerAuthError::Missing)
        );
        let down = cluster(true).authenticate(Some("gpu-token")).await;
        assert!(
            matches!(&down, Err(e) if e.kind() == ErrorKind::Unavailable),
            "{down:?}"
        );
    }

    #[test]
    fn the_join_secret_identity_serves_any_known_pool_in_cluster_mode_too() {
        let pool = ObjectKey::new("default", "default");
        assert_eq!(
            may_serve(&WorkerIdentity::JoinSecret, &pool, Some("x")),
            Ok(())
        );
        assert!(matches!(
            may_serve(&WorkerIdentity::JoinSecret, &pool, None),
            Err(WorkerAuthError::UnknownPool(_))
        ));
    }
}
