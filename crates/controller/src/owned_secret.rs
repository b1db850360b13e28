//! A Secret the controller makes, keeps and rotates in its own namespace (its self-made TLS
//! CA, [`crate::tls_secret`]; its identity signing keys, [`crate::identity_secret`]): how it
//! is marked as the controller's, and the one conditional read-decide-write loop both use.
//! Writes are conditional (create, or replace at the resourceVersion read), so of two
//! controllers writing at once one wins and the other takes what it wrote; a Secret of that
//! name the controller did not make is never overwritten.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::Duration;

/// The label that marks a Secret as the controller's.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "toolgrid-controller");
/// How often the leader looks at its Secrets again (and at most how late a renewal is).
pub const CHECK_EVERY: Duration = Duration::from_secs(3600);
/// How many times a write that lost a race (another controller wrote first) is retried.
const ATTEMPTS: u32 = 5;

/// Why [`ensure`] gives up on a Secret (each caller names these in its own error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A Secret of that name exists and the controller did not make it.
    NotOurs(String),
    /// It kept changing under us.
    Contended(String),
}

/// What to do with what a Secret holds (or `None`: nothing that reads).
pub enum Step<T> {
    /// It is current.
    Keep(T),
    /// Write this instead.
    Write(T),
}

/// The metadata of the controller's Secret `name`: its name and the [`MANAGED_BY`] label.
pub fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into()),
        ..ObjectMeta::default()
    }
}

/// Whether the controller made `secret`.
fn is_ours(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1)
}

/// What Secret `name` holds, made current: read with `read`, decided by `step`, written
/// (created, or replaced at the version read) with `write` when the step says so.
pub async fn ensure<T, E>(
    api: &Api<Secret>,
    name: &str,
    read: impl Fn(&Secret) -> Option<T>,
    step: impl Fn(Option<T>) -> Result<Step<T>, E>,
    write: impl Fn(&T) -> Secret,
) -> Result<T, E>
where
    E: From<kube::Error> + From<Refusal>,
{
    for _ in 0..ATTEMPTS {
        let stored = api.get_opt(name).await?;
        if let Some(secret) = &stored
            && !is_ours(secret)
        {
            return Err(Refusal::NotOurs(name.to_string()).into());
        }
        let next = match step(stored.as_ref().and_then(&read))? {
            Step::Keep(current) => return Ok(current),
            Step::Write(next) => next,
        };
        let mut secret = write(&next);
        let written = match stored {
            None => api.create(&PostParams::default(), &secret).await,
            Some(stored) => {
                secret.metadata.resource_version = stored.metadata.resource_version;
                api.replace(name, &PostParams::default(), &secret).await
            }
        };
        match written {
            Ok(_) => return Ok(next),
            // Another controller wrote first: read what it wrote.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(Refusal::Contended(name.to_string()).into())
}

/// Unix seconds now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}
