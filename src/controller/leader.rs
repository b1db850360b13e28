//! Leader election with a `coordination.k8s.io` Lease: only the leader reconciles and
//! schedules; a standby takes over when the leader stops renewing.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use std::time::Duration;
use tokio::sync::watch;

/// Who is electing, and how.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// This replica (its pod name).
    pub identity: String,
    /// A lease not renewed for this long can be taken over.
    pub duration: Duration,
    /// How often the leader renews (and a standby tries).
    pub renew_every: Duration,
}

/// What to do about the lease.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nobody holds it: create it, held by us.
    Create(Lease),
    /// We hold it: renew it.
    Renew(Lease),
    /// Its holder stopped renewing: take it over.
    TakeOver(Lease),
    /// Someone else holds it.
    Follow { holder: String },
}

fn held_by(
    settings: &LeaseSettings,
    now: Timestamp,
    transitions: i32,
    acquired: Option<MicroTime>,
    meta: ObjectMeta,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(settings.name.clone()),
            namespace: Some(settings.namespace.clone()),
            ..meta
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(settings.identity.clone()),
            lease_duration_seconds: Some(settings.duration.as_secs().max(1) as i32),
            acquire_time: acquired.or(Some(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

/// Decides from the lease as it is (None when absent) and the time now.
pub fn decide(current: Option<&Lease>, settings: &LeaseSettings, now: Timestamp) -> Decision {
    let Some(current) = current else {
        return Decision::Create(held_by(settings, now, 0, None, ObjectMeta::default()));
    };
    let spec = current.spec.clone().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == settings.identity {
        return Decision::Renew(held_by(
            settings,
            now,
            transitions,
            spec.acquire_time,
            current.metadata.clone(),
        ));
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let renewed = spec
        .renew_time
        .map(|t| t.0)
        .or(spec.acquire_time.map(|t| t.0));
    let expired = holder.is_empty() || renewed.is_none_or(|t| t + duration < now);
    if expired {
        Decision::TakeOver(held_by(
            settings,
            now,
            transitions + 1,
            None,
            current.metadata.clone(),
        ))
    } else {
        Decision::Follow { holder }
    }
}

/// Runs the election against the API.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, settings: LeaseSettings) -> Self {
        LeaderElector { api, settings }
    }

    /// One round: acquires or renews the lease if it can; true while we lead.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.settings.name).await?;
        let decision = decide(current.as_ref(), &self.settings, Timestamp::now());
        let written = match decision {
            Decision::Follow { holder } => {
                tracing::debug!(%holder, "another replica leads");
                return Ok(false);
            }
            Decision::Create(lease) => self.api.create(&PostParams::default(), &lease).await,
            Decision::Renew(lease) | Decision::TakeOver(lease) => {
                self.api
                    .replace(&self.settings.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(true),
            // Another replica wrote first: it leads this round.
            Err(error) if is_conflict(&error) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Gives the lease up (on shutdown), so a successor need not wait for it to expire.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(current) = self.api.get_opt(&self.settings.name).await? else {
            return Ok(());
        };
        let mut spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        let released = Lease {
            metadata: current.metadata.clone(),
            spec: Some(spec),
        };
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &released)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if is_conflict(&error) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Campaigns forever; the receiver says whether we lead. A leader that cannot renew
    /// for a whole lease duration steps down.
    pub fn run(self: std::sync::Arc<Self>) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let mut last_renewed: Option<std::time::Instant> = None;
            loop {
                match self.try_lead().await {
                    Ok(true) => {
                        if !*tx.borrow() {
                            tracing::info!(identity = %self.settings.identity, lease = %self.settings.name, "became the leader");
                        }
                        last_renewed = Some(std::time::Instant::now());
                        tx.send_replace(true);
                    }
                    Ok(false) => {
                        if *tx.borrow() {
                            tracing::warn!("lost the lease to another replica");
                        }
                        last_renewed = None;
                        tx.send_replace(false);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot reach the lease");
                        if last_renewed.is_some_and(|t| t.elapsed() >= self.settings.duration) {
                            tracing::warn!("could not renew the lease in time; stepping down");
                            tx.send_replace(false);
                        }
                    }
                }
                tokio::time::sleep(self.settings.renew_every).await;
            }
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(identity: &str) -> LeaseSettings {
        LeaseSettings {
            name: "toolgrid-controller".into(),
            namespace: "toolgrid".into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }

    fn lease(holder: &str, renewed: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("toolgrid-controller".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn decisions() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let me = settings("pod-a");
        let Decision::Create(created) = decide(None, &me, now) else {
            panic!("create")
        };
        assert_eq!(
            created.spec.unwrap().holder_identity.as_deref(),
            Some("pod-a")
        );

        let Decision::Renew(renewed) =
            decide(Some(&lease("pod-a", "2026-01-01T00:00:55Z")), &me, now)
        else {
            panic!("renew")
        };
        assert_eq!(
            renewed.metadata.resource_version.as_deref(),
            Some("7"),
            "optimistic concurrency"
        );
        assert_eq!(renewed.spec.unwrap().renew_time, Some(MicroTime(now)));

        assert_eq!(
            decide(Some(&lease("pod-b", "2026-01-01T00:00:50Z")), &me, now),
            Decision::Follow {
                holder: "pod-b".into()
            }
        );
        let Decision::TakeOver(taken) =
            decide(Some(&lease("pod-b", "2026-01-01T00:00:30Z")), &me, now)
        else {
            panic!("take over an expired lease")
        };
        let spec = taken.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("pod-a"));
        assert_eq!(spec.lease_transitions, Some(3));
    }
}
