//! `--tls-self-signed`: the controller's own CA and serving certificate
//! ([`toolgrid_control_plane::platform::ca`]) kept in a Secret of its namespace, so that a
//! restarted or newly elected controller serves the same chain and workers keep trusting
//! it, and rotated by the leader before anything expires: the new certificate is served
//! from the next handshake on ([`ServerTls::replace`]) and the new trust reaches worker
//! Deployments at their next reconcile ([`WorkerCa`]).
//!
//! The Secret (type `kubernetes.io/tls`, labelled as the controller's) holds `tls.crt`,
//! `tls.key` and `ca.crt` (every CA workers trust) for anyone who mounts it, and the CAs'
//! own certificates and keys and the dates rotation decides on. A Secret of that name the
//! controller did not make is never overwritten: start-up fails and says so.

use crate::deployment::WorkerCa;
use crate::owned_secret::{self, CHECK_EVERY, MANAGED_BY, Refusal, Step, unix_now};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toolgrid_control_plane::platform::ca::{self, Authority, Bundle, CaError};
use toolgrid_control_plane::platform::tls::ServerTls;
use toolgrid_core::secret::SecretValue;

/// Why the Secret cannot be made or kept.
#[derive(Debug, thiserror::Error)]
pub enum TlsSecretError {
    #[error("the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Ca(#[from] CaError),
    #[error(
        "Secret {0:?} exists and was not made by the controller (no label {label}={value}); \
         name another with --tls-self-signed-secret or delete it",
        label = MANAGED_BY.0,
        value = MANAGED_BY.1
    )]
    NotOurs(String),
    #[error("Secret {0:?} kept changing under us; giving up for now")]
    Contended(String),
    #[error("the serving certificate does not load: {0}")]
    Serve(#[from] toolgrid_proto::tls::TlsError),
}

/// The dates and names rotation decides on, as the Secret keeps them (`bundle.json`).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dates {
    names: Vec<String>,
    cert_not_after: i64,
    ca: Option<Named>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next: Option<Named>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<Named>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Named {
    name: String,
    not_after: i64,
}

const DATES: &str = "bundle.json";

/// `bundle` as the Secret `name` (with no resourceVersion).
pub fn to_secret(name: &str, bundle: &Bundle) -> Secret {
    let mut data = BTreeMap::new();
    let mut put = |key: &str, bytes: &[u8]| {
        data.insert(key.to_string(), ByteString(bytes.to_vec()));
    };
    put("tls.crt", bundle.cert_pem.as_bytes());
    put("tls.key", bundle.key_pem.expose());
    put("ca.crt", bundle.trust_pem().as_bytes());
    let mut authority = |prefix: &str, a: &Authority| {
        put(&format!("{prefix}.crt"), a.cert_pem.as_bytes());
        if let Some(key) = &a.key_pem {
            put(&format!("{prefix}.key"), key.expose());
        }
        Named {
            name: a.name.clone(),
            not_after: a.not_after,
        }
    };
    let dates = Dates {
        names: bundle.names.clone(),
        cert_not_after: bundle.cert_not_after,
        ca: Some(authority("ca-signing", &bundle.ca)),
        next: bundle.next.as_ref().map(|a| authority("ca-next", a)),
        previous: bundle
            .previous
            .as_ref()
            .map(|a| authority("ca-previous", a)),
    };
    put(
        DATES,
        serde_json::to_string(&dates).unwrap_or_default().as_bytes(),
    );
    Secret {
        metadata: owned_secret::metadata(name),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The bundle `secret` holds; `None` when a part is missing or does not read (rotation then
/// starts over with a fresh CA).
pub fn from_secret(secret: &Secret) -> Option<Bundle> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    let dates: Dates = serde_json::from_slice(&data.get(DATES)?.0).ok()?;
    let authority = |prefix: &str, named: &Named, key: bool| -> Option<Authority> {
        Some(Authority {
            name: named.name.clone(),
            cert_pem: text(&format!("{prefix}.crt"))?,
            key_pem: if key {
                Some(SecretValue::new(text(&format!("{prefix}.key"))?))
            } else {
                None
            },
            not_after: named.not_after,
        })
    };
    Some(Bundle {
        ca: authority("ca-signing", dates.ca.as_ref()?, true)?,
        next: match &dates.next {
            Some(named) => Some(authority("ca-next", named, true)?),
            None => None,
        },
        previous: match &dates.previous {
            Some(named) => Some(authority("ca-previous", named, false)?),
            None => None,
        },
        cert_pem: text("tls.crt")?,
        key_pem: SecretValue::new(text("tls.key")?),
        cert_not_after: dates.cert_not_after,
        names: dates.names,
    })
}

/// The bundle in Secret `name` made current for `names` at `now` (unix seconds): read,
/// created when absent, rotated when [`ca::plan`] says so. Writes are conditional (create,
/// or replace at the resourceVersion read), so of two controllers writing at once one
/// wins and the other takes what it wrote.
pub async fn ensure(
    api: &Api<Secret>,
    name: &str,
    names: &[String],
    now: i64,
) -> Result<Bundle, TlsSecretError> {
    owned_secret::ensure(
        api,
        name,
        from_secret,
        |bundle: Option<Bundle>| {
            let plan = ca::plan(bundle.as_ref(), names, now);
            let next = match bundle {
                Some(bundle) if plan.is_keep() => return Ok(Step::Keep(bundle)),
                Some(bundle) => bundle.advance(plan, names, now)?,
                None => Bundle::fresh(names, now)?,
            };
            tracing::info!(
                secret = name,
                ?plan,
                "writing the control plane's CA and certificate"
            );
            Ok(Step::Write(next))
        },
        |bundle| to_secret(name, bundle),
    )
    .await
}

impl From<Refusal> for TlsSecretError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::NotOurs(name) => TlsSecretError::NotOurs(name),
            Refusal::Contended(name) => TlsSecretError::Contended(name),
        }
    }
}

/// Keeps `tls` and `workers` current with Secret `name` every [`CHECK_EVERY`], from
/// `served` (the bundle served now), until aborted. A failed check is logged and tried
/// again at the next.
pub async fn rotate(
    api: Api<Secret>,
    name: String,
    names: Vec<String>,
    tls: ServerTls,
    workers: WorkerCa,
    mut served: Bundle,
) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        match ensure(&api, &name, &names, unix_now()).await {
            Ok(bundle) if bundle == served => {}
            Ok(bundle) => {
                if let Err(error) = tls.replace(bundle.cert_pem.as_bytes(), bundle.key_pem.expose())
                {
                    tracing::error!(%error, "the rotated certificate does not load; serving the old one");
                    continue;
                }
                workers.set(bundle.trust_pem());
                tracing::info!(secret = %name, ca = %bundle.ca.name, "serving a rotated certificate");
                served = bundle;
            }
            Err(error) => {
                tracing::warn!(%error, secret = %name, "cannot check the control plane's certificate")
            }
        }
    }
}
