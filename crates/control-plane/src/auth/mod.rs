//! Who is calling: the identities behind bearer tokens, and the cluster's answers about
//! them. The gateway authenticates callers (`Principal`), the worker link authenticates
//! workers; both ask a [`TokenReviewer`] about ServiceAccount tokens in a cluster.

pub mod oauth;
pub mod worker;

use toolgrid_core::ids::ObjectKey;
pub use worker::{
    JoinSecret, ServiceAccountWorkers, WorkerAuthError, WorkerAuthenticator, WorkerIdentity,
};

/// The audience of the tokens callers present in a cluster.
pub const CALLER_AUDIENCE: &str = "toolgrid";
/// The audience of the projected tokens worker pods present.
pub const WORKER_AUDIENCE: &str = "toolgrid-worker";

/// The longest bearer token accepted anywhere (Kubernetes tokens are a few KiB); longer ones
/// are refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 << 10;

/// Why an `authorization` value is not a usable bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BearerError {
    /// Not `SCHEME TOKEN`.
    NoScheme,
    /// A scheme other than `Bearer`.
    WrongScheme,
    Empty,
    /// Longer than [`MAX_TOKEN_BYTES`].
    TooLong,
}

/// The token of an `authorization` value `Bearer TOKEN` (the scheme in any case; the token
/// trimmed), for callers and workers alike.
pub fn bearer_token(authorization: &str) -> Result<&str, BearerError> {
    let (scheme, token) = authorization.split_once(' ').ok_or(BearerError::NoScheme)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(BearerError::WrongScheme);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(BearerError::Empty);
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(BearerError::TooLong);
    }
    Ok(token)
}

/// What the cluster says about a token it accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewedToken {
    /// `system:serviceaccount:NAMESPACE:NAME` for a ServiceAccount.
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl ReviewedToken {
    /// The ServiceAccount behind the token, when it is one.
    pub fn service_account(&self) -> Option<ObjectKey> {
        let rest = self.username.strip_prefix("system:serviceaccount:")?;
        let (namespace, name) = rest.split_once(':')?;
        (!namespace.is_empty() && !name.is_empty()).then(|| ObjectKey::new(namespace, name))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The cluster could not be asked (the API server is down, RBAC forbids the review).
    #[error("cannot review the token: {0}")]
    Unavailable(String),
}

/// The cluster's authority on tokens and permissions (TokenReview and SubjectAccessReview);
/// absent in `toolgrid up`.
#[async_trait::async_trait]
pub trait TokenReviewer: Send + Sync {
    /// Who holds `token`, for `audience`; `Ok(None)` when the cluster does not accept it
    /// (expired, wrong audience, unknown, revoked).
    async fn review(
        &self,
        token: &str,
        audience: &str,
    ) -> Result<Option<ReviewedToken>, ReviewError>;

    /// Whether Kubernetes RBAC lets `user` operate toolgrid in `namespace` (may call any
    /// tool and read every call).
    async fn is_operator(&self, user: &ReviewedToken, namespace: &str)
    -> Result<bool, ReviewError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_username_names_its_account() {
        let token = ReviewedToken {
            username: "system:serviceaccount:team-a:reporter".into(),
            uid: "u".into(),
            groups: vec![],
        };
        assert_eq!(
            token.service_account(),
            Some(ObjectKey::new("team-a", "reporter"))
        );
        let user = ReviewedToken {
            username: "alice".into(),
            ..token
        };
        assert_eq!(user.service_account(), None);
    }
}
