//! [`KubeReviewer`]: the cluster's answers about tokens (TokenReview) and about what their
//! holders may do (SubjectAccessReview), for the gateway (callers) and the worker link
//! (worker pods).
//!
//! Building the reviews and reading their answers are plain functions ([`token_review`],
//! [`reviewed`], [`access_review`], [`allowed`]); the reviewer only sends them and keeps
//! the answers briefly ([`AnswerCache`], keyed by digests: never a token).
//!
//! **Who is an operator.** A subject is an operator of a namespace when Kubernetes RBAC
//! lets it `update` `tools` in group `toolgrid.dev` there ([`OPERATOR_VERB`],
//! [`OPERATOR_RESOURCE`]): whoever may change the tools may operate them, so may call any
//! tool and read every call. Grant it with a Role such as
//! `{apiGroups: [toolgrid.dev], resources: [tools], verbs: [update]}`.

use super::review_cache::{AnswerCache, DEFAULT_CAPACITY, DEFAULT_TTL, digest_key};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::Client;
use kube::api::{Api, PostParams};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use toolgrid_control_plane::auth::{ReviewError, ReviewedToken, TokenReviewer};

/// The API group whose RBAC decides who operates toolgrid.
pub const OPERATOR_GROUP: &str = "toolgrid.dev";
/// The resource of [`OPERATOR_GROUP`] an operator may change.
pub const OPERATOR_RESOURCE: &str = "tools";
/// What an operator may do to [`OPERATOR_RESOURCE`].
pub const OPERATOR_VERB: &str = "update";
/// The longest token reviewed: a larger one is refused without asking the cluster.
pub use toolgrid_control_plane::auth::MAX_TOKEN_BYTES;

/// The TokenReview asking who holds `token`, for `audience`.
pub fn token_review(token: &str, audience: &str) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: Some(vec![audience.to_string()]),
        },
        ..TokenReview::default()
    }
}

/// The identity a TokenReview's answer grants, if any: only an authenticated token whose
/// answer names `audience` among its audiences (an authenticator that ignores audiences
/// answers without them, and its answer is no proof for ours) and a user name.
pub fn reviewed(status: Option<&TokenReviewStatus>, audience: &str) -> Option<ReviewedToken> {
    let status = status?;
    if status.authenticated != Some(true) {
        return None;
    }
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == audience))
    {
        return None;
    }
    let user = status.user.as_ref()?;
    let username = user.username.clone().filter(|u| !u.is_empty())?;
    Some(ReviewedToken {
        username,
        uid: user.uid.clone().unwrap_or_default(),
        groups: user.groups.clone().unwrap_or_default(),
    })
}

/// The SubjectAccessReview asking whether `user` may operate toolgrid in `namespace`
/// (an empty namespace asks about every namespace).
pub fn access_review(user: &ReviewedToken, namespace: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(OPERATOR_GROUP.into()),
                resource: Some(OPERATOR_RESOURCE.into()),
                verb: Some(OPERATOR_VERB.into()),
                namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// Whether a SubjectAccessReview's answer allows: only an explicit `allowed` that no
/// authorizer `denied`. An evaluation error without `allowed` is a refusal.
pub fn allowed(status: Option<&SubjectAccessReviewStatus>) -> bool {
    status.is_some_and(|s| s.allowed && s.denied != Some(true))
}

/// Why the cluster could not be asked, for [`ReviewError::Unavailable`] (no token in it:
/// the API server's message names the review, never its spec).
fn unavailable(what: &str, error: kube::Error) -> ReviewError {
    let detail = match &error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    };
    ReviewError::Unavailable(format!("{what}: {detail}"))
}

/// The [`TokenReviewer`] of a cluster: TokenReview and SubjectAccessReview through the
/// controller's client, each answer (yes or no; never an error) believed for a short while.
pub struct KubeReviewer {
    client: Client,
    tokens: Mutex<AnswerCache<Option<ReviewedToken>>>,
    operators: Mutex<AnswerCache<bool>>,
}

impl KubeReviewer {
    /// A reviewer believing answers for [`DEFAULT_TTL`], at most [`DEFAULT_CAPACITY`] of
    /// each kind.
    pub fn new(client: Client) -> Self {
        Self::with_cache(client, DEFAULT_TTL, DEFAULT_CAPACITY)
    }

    pub fn with_cache(client: Client, ttl: Duration, capacity: usize) -> Self {
        KubeReviewer {
            client,
            tokens: Mutex::new(AnswerCache::new(ttl, capacity)),
            operators: Mutex::new(AnswerCache::new(ttl, capacity)),
        }
    }
}

#[async_trait::async_trait]
impl TokenReviewer for KubeReviewer {
    async fn review(
        &self,
        token: &str,
        audience: &str,
    ) -> Result<Option<ReviewedToken>, ReviewError> {
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Ok(None);
        }
        let key = digest_key(&[token, audience]);
        if let Some(answer) = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key, Instant::now())
        {
            return Ok(answer);
        }
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &token_review(token, audience))
            .await
            .map_err(|e| unavailable("TokenReview", e))?;
        let identity = reviewed(answer.status.as_ref(), audience);
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, identity.clone(), Instant::now());
        Ok(identity)
    }

    async fn is_operator(
        &self,
        user: &ReviewedToken,
        namespace: &str,
    ) -> Result<bool, ReviewError> {
        let mut parts = vec![user.username.as_str(), user.uid.as_str(), namespace];
        let mut groups: Vec<&str> = user.groups.iter().map(String::as_str).collect();
        groups.sort_unstable();
        parts.extend(groups);
        let key = digest_key(&parts);
        if let Some(answer) = self
            .operators
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key, Instant::now())
        {
            return Ok(answer);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &access_review(user, namespace))
            .await
            .map_err(|e| unavailable("SubjectAccessReview", e))?;
        let allowed = allowed(answer.status.as_ref());
        self.operators
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, allowed, Instant::now());
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::mock::{expect, expect_nothing, mock_client};
    use super::*;
    use http::{Method, StatusCode};
    use serde_json::{Value, json};
    use std::sync::Arc;
    use toolgrid_control_plane::auth::{CALLER_AUDIENCE, WORKER_AUDIENCE};

    const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
    const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

    fn answered(request: &Value, status: Value) -> Value {
        let mut object = request.clone();
        object["status"] = status;
        object
    }

    fn reviewer() -> (Arc<KubeReviewer>, super::super::mock::Handle) {
        let (client, handle) = mock_client();
        (Arc::new(KubeReviewer::new(client)), handle)
    }

    fn sa_user(namespace: &str, name: &str) -> Value {
        json!({
            "username": format!("system:serviceaccount:{namespace}:{name}"),
            "uid": "sa-uid",
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}")],
        })
    }

    #[tokio::test]
    async fn a_valid_service_account_token_maps_to_its_account_and_is_asked_once() {
        let (reviewer, mut handle) = reviewer();
        let task = tokio::spawn({
            let reviewer = reviewer.clone();
            async move { reviewer.review("sa-token", CALLER_AUDIENCE).await }
        });
        let request = expect(
            &mut handle,
            Method::POST,
            TOKEN_REVIEWS,
            &[],
            StatusCode::CREATED,
            |body| {
                answered(
                    body,
                    json!({"authenticated": true, "audiences": ["toolgrid"],
                           "user": sa_user("team-a", "reporter")}),
                )
            },
        )
        .await;
        assert_eq!(request["kind"], "TokenReview");
        assert_eq!(request["spec"]["token"], "sa-token");
        assert_eq!(request["spec"]["audiences"], json!(["toolgrid"]));
        let token = task.await.unwrap().expect("reviewed").expect("accepted");
        assert_eq!(
            token.service_account(),
            Some(toolgrid_core::ids::ObjectKey::new("team-a", "reporter"))
        );
        assert_eq!(token.uid, "sa-uid");
        assert_eq!(token.groups.len(), 2);

        // The same token again: the answer is remembered, the API is not asked.
        let again = reviewer.review("sa-token", CALLER_AUDIENCE).await.unwrap();
        assert_eq!(again, Some(token));
        expect_nothing(&mut handle).await;
    }

    #[tokio::test]
    async fn an_expired_or_wrong_audience_token_is_no_one() {
        let (reviewer, mut handle) = reviewer();
        let cases = [
            // Expired (or unknown, or revoked): the API server says so.
            json!({"authenticated": false, "error": "token has expired"}),
            // Issued for another audience: the authenticator names only that one.
            json!({"authenticated": true, "audiences": ["other"], "user": sa_user("t", "a")}),
            // An authenticator that ignores audiences proves nothing about ours.
            json!({"authenticated": true, "user": sa_user("t", "a")}),
            // Authenticated, but without a user name.
            json!({"authenticated": true, "audiences": ["toolgrid-worker"], "user": {}}),
        ];
        for (i, status) in cases.into_iter().enumerate() {
            let token = format!("token-{i}");
            let task = tokio::spawn({
                let reviewer = reviewer.clone();
                async move { reviewer.review(&token, WORKER_AUDIENCE).await }
            });
            expect(
                &mut handle,
                Method::POST,
                TOKEN_REVIEWS,
                &[],
                StatusCode::CREATED,
                |body| answered(body, status.clone()),
            )
            .await;
            assert_eq!(
                task.await.unwrap().expect("reviewed"),
                None,
                "case {i}: {status}"
            );
        }
        // A refusal is remembered too: a flood of one bad token costs one review.
        assert_eq!(
            reviewer.review("token-0", WORKER_AUDIENCE).await.unwrap(),
            None
        );
        // An empty or oversized token is refused without asking.
        assert_eq!(reviewer.review("", WORKER_AUDIENCE).await.unwrap(), None);
        let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert_eq!(reviewer.review(&huge, WORKER_AUDIENCE).await.unwrap(), None);
        expect_nothing(&mut handle).await;
    }

    #[tokio::test]
    async fn an_api_error_is_unavailable_never_an_identity_and_is_not_remembered() {
        let (reviewer, mut handle) = reviewer();
        for (code, reason) in [
            (StatusCode::FORBIDDEN, "Forbidden"),
            (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        ] {
            let task = tokio::spawn({
                let reviewer = reviewer.clone();
                async move { reviewer.review("sa-token", CALLER_AUDIENCE).await }
            });
            expect(&mut handle, Method::POST, TOKEN_REVIEWS, &[], code, |_| {
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": "tokenreviews is forbidden", "reason": reason, "code": code.as_u16()})
            })
            .await;
            let error = task.await.unwrap().expect_err("no answer");
            let ReviewError::Unavailable(message) = &error;
            assert!(message.contains("TokenReview"), "{message}");
            assert!(!message.contains("sa-token"), "no token in errors");
        }
        // Errors were not remembered: the next review asks again, and may succeed.
        let task = tokio::spawn({
            let reviewer = reviewer.clone();
            async move { reviewer.review("sa-token", CALLER_AUDIENCE).await }
        });
        expect(
            &mut handle,
            Method::POST,
            TOKEN_REVIEWS,
            &[],
            StatusCode::CREATED,
            |body| {
                answered(
                    body,
                    json!({"authenticated": true, "audiences": ["toolgrid"], "user": sa_user("a", "b")}),
                )
            },
        )
        .await;
        assert!(task.await.unwrap().unwrap().is_some());
    }

    fn alice() -> ReviewedToken {
        ReviewedToken {
            username: "alice".into(),
            uid: "alice-uid".into(),
            groups: vec!["devs".into(), "system:authenticated".into()],
        }
    }

    #[tokio::test]
    async fn operators_are_whom_rbac_lets_update_tools() {
        let (reviewer, mut handle) = reviewer();
        let task = tokio::spawn({
            let reviewer = reviewer.clone();
            async move { reviewer.is_operator(&alice(), "team-a").await }
        });
        let request = expect(
            &mut handle,
            Method::POST,
            ACCESS_REVIEWS,
            &[],
            StatusCode::CREATED,
            |body| answered(body, json!({"allowed": true})),
        )
        .await;
        assert_eq!(request["kind"], "SubjectAccessReview");
        assert_eq!(request["spec"]["user"], "alice");
        assert_eq!(request["spec"]["uid"], "alice-uid");
        assert_eq!(
            request["spec"]["groups"],
            json!(["devs", "system:authenticated"])
        );
        assert_eq!(
            request["spec"]["resourceAttributes"],
            json!({"group": "toolgrid.dev", "resource": "tools", "verb": "update", "namespace": "team-a"})
        );
        assert!(task.await.unwrap().unwrap(), "allowed");
        // Remembered for the same subject and namespace.
        assert!(reviewer.is_operator(&alice(), "team-a").await.unwrap());
        expect_nothing(&mut handle).await;

        // Another namespace is another question; denied, or not allowed, is no operator.
        for (i, status) in [
            json!({"allowed": false, "denied": true, "reason": "no"}),
            json!({"allowed": false}),
            json!({"allowed": false, "evaluationError": "webhook down"}),
        ]
        .into_iter()
        .enumerate()
        {
            let namespace = format!("ns-{i}");
            let task = tokio::spawn({
                let reviewer = reviewer.clone();
                async move { reviewer.is_operator(&alice(), &namespace).await }
            });
            expect(
                &mut handle,
                Method::POST,
                ACCESS_REVIEWS,
                &[],
                StatusCode::CREATED,
                |body| answered(body, status.clone()),
            )
            .await;
            assert!(!task.await.unwrap().unwrap(), "{status}");
        }

        // The API refuses the review: unavailable, not an operator.
        let task = tokio::spawn({
            let reviewer = reviewer.clone();
            async move { reviewer.is_operator(&alice(), "elsewhere").await }
        });
        expect(
            &mut handle,
            Method::POST,
            ACCESS_REVIEWS,
            &[],
            StatusCode::FORBIDDEN,
            |_| {
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "forbidden", "reason": "Forbidden", "code": 403})
            },
        )
        .await;
        assert!(matches!(
            task.await.unwrap(),
            Err(ReviewError::Unavailable(_))
        ));
    }

    #[test]
    fn only_an_explicit_allow_without_a_deny_allows() {
        let status = |allowed, denied| SubjectAccessReviewStatus {
            allowed,
            denied,
            ..SubjectAccessReviewStatus::default()
        };
        assert!(allowed(Some(&status(true, None))));
        assert!(allowed(Some(&status(true, Some(false)))));
        assert!(!allowed(Some(&status(true, Some(true)))));
        assert!(!allowed(Some(&status(false, None))));
        assert!(!allowed(None));
    }
}
