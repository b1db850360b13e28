//! The Ed25519 keys the control plane signs per-call identity tokens for upstreams with
//! ([`toolgrid_control_plane::identity`]), kept in a Secret of the controller's namespace so
//! that a restarted or newly elected controller signs with, and publishes at
//! `/.well-known/jwks.json`, the same keys, and rotated by the leader on the keys' own plan
//! ([`identity::plan`]: a successor published a day before it signs, a retired key published
//! a day after): the new set is signed with and published from the next call on
//! ([`IdentityKeys::replace`]). Like the self-signed CA ([`crate::tls_secret`]).
//!
//! The Secret (type `Opaque`, labelled as the controller's) holds one key, [`DATA_KEY`]: the
//! document `toolgrid up` keeps in its data directory
//! ([`toolgrid_control_plane::identity::store::to_file`]). A Secret of that name the
//! controller did not make is never overwritten: start-up fails and says so.

use crate::owned_secret::{self, CHECK_EVERY, MANAGED_BY, Refusal, Step, unix_now};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use std::collections::BTreeMap;
use toolgrid_control_plane::identity::keys::KeyError;
use toolgrid_control_plane::identity::store::{from_file, to_file};
use toolgrid_control_plane::identity::{self, IdentityKeys, SigningKeys};

/// The Secret's one data key.
pub const DATA_KEY: &str = "keys.json";
/// Why the Secret cannot be made or kept.
#[derive(Debug, thiserror::Error)]
pub enum IdentitySecretError {
    #[error("the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(
        "Secret {0:?} exists and was not made by the controller (no label {label}={value}); \
         name another with --identity-secret or delete it",
        label = MANAGED_BY.0,
        value = MANAGED_BY.1
    )]
    NotOurs(String),
    #[error("Secret {0:?} kept changing under us; giving up for now")]
    Contended(String),
}

/// `keys` as the Secret `name` (with no resourceVersion).
pub fn to_secret(name: &str, keys: &SigningKeys) -> Secret {
    Secret {
        metadata: owned_secret::metadata(name),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            DATA_KEY.to_string(),
            ByteString(to_file(keys)),
        )])),
        ..Secret::default()
    }
}

/// The key set `secret` holds; `None` when it holds none that reads (rotation then starts
/// over with a fresh set).
pub fn from_secret(secret: &Secret) -> Option<SigningKeys> {
    let bytes = secret.data.as_ref()?.get(DATA_KEY)?;
    match from_file(&bytes.0) {
        Ok(keys) => Some(keys),
        Err(message) => {
            let name = secret.metadata.name.as_deref().unwrap_or_default();
            tracing::warn!(secret = name, %message, "the identity key set does not read; making a new one");
            None
        }
    }
}

/// The key set in Secret `name` made current at `now` (unix seconds): read, created when
/// absent, rotated when [`identity::plan`] says so. Writes are conditional (create, or
/// replace at the resourceVersion read), so of two controllers writing at once one wins
/// and the other takes what it wrote.
pub async fn ensure(
    api: &Api<Secret>,
    name: &str,
    now: i64,
) -> Result<SigningKeys, IdentitySecretError> {
    owned_secret::ensure(
        api,
        name,
        from_secret,
        |keys: Option<SigningKeys>| {
            let plan = identity::plan(keys.as_ref(), now);
            let next = match keys {
                Some(keys) if plan.is_keep() => return Ok(Step::Keep(keys)),
                Some(keys) => keys.advance(plan, now)?,
                None => SigningKeys::fresh(now)?,
            };
            tracing::info!(secret = name, ?plan, signing = %next.current.kid, "writing the identity signing keys");
            Ok(Step::Write(next))
        },
        |keys| to_secret(name, keys),
    )
    .await
}

impl From<Refusal> for IdentitySecretError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::NotOurs(name) => IdentitySecretError::NotOurs(name),
            Refusal::Contended(name) => IdentitySecretError::Contended(name),
        }
    }
}

/// Keeps `keys` current with Secret `name` every [`CHECK_EVERY`] until aborted: what
/// [`ensure`] answers is swapped in when it differs. A failed check is logged and tried
/// again at the next (the set held keeps signing).
pub async fn rotate(api: Api<Secret>, name: String, keys: IdentityKeys) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        match ensure(&api, &name, unix_now()).await {
            Ok(current) if current == keys.snapshot() => {}
            Ok(current) => {
                tracing::info!(secret = %name, signing = %current.current.kid, "signing with rotated identity keys");
                keys.replace(current);
            }
            Err(error) => {
                tracing::warn!(%error, secret = %name, "cannot check the identity signing keys")
            }
        }
    }
}
