//! Status conditions in the Kubernetes shape, shared by every kind.
//!
//! Every kind carries `Ready`. Next to it, the kstatus pair that Flux's health checks (and
//! kpt, cli-utils) read for custom resources: `Reconciling=True` while the object is on its
//! way to Ready (waiting for an artifact, a referenced object, workers), `Stalled=True`
//! when it cannot get there without a change to it (an invalid spec, a digest that does not
//! match). Both are removed once the object is Ready.
//!
//! `lastTransitionTime` moves only when a condition's status changes, so that Argo CD,
//! Flux and `kubectl wait` see stable conditions across repeated reconciles.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The condition every kind carries.
pub const READY: &str = "Ready";
/// kstatus: the object is not Ready yet, and the controller is still working toward it.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: the object cannot become Ready until it (or its artifact) changes.
pub const STALLED: &str = "Stalled";

/// Reasons of `Ready=False` that are a fault of the object itself, so only a change to it
/// helps: kstatus `Stalled`. Every other reason waits for something (an artifact being
/// loaded, a referenced object, workers) and is kstatus `Reconciling`.
const STALLED_REASONS: &[&str] = &[
    "InvalidSpec",
    "DuplicateName",
    "DuplicateVersion",
    "ImmutableRelease",
    "InvalidArtifact",
    "InvalidArtifactSource",
    "InvalidDigest",
    "DigestMismatch",
    "UnsupportedSource",
];

/// One condition as a reconcile decides it, before timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    /// CamelCase, machine-readable.
    pub reason: String,
    pub message: String,
}

impl Desired {
    pub fn ready(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Desired {
            type_: READY,
            status: true,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn not_ready(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Desired {
            type_: READY,
            status: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Merges `desired` into `conditions`: a new status gets `now` as its transition time, an
/// unchanged status keeps the old one while reason, message and generation are refreshed.
pub fn apply(
    conditions: &mut Vec<Condition>,
    desired: &Desired,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = status_str(desired.status);
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = Time(now);
                existing.status = status.to_string();
            }
            existing.reason = desired.reason.clone();
            existing.message = desired.message.clone();
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: desired.type_.to_string(),
            status: status.to_string(),
            reason: desired.reason.clone(),
            message: desired.message.clone(),
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// Merges a `Ready` decision and the kstatus pair that follows from it: `Stalled` or
/// `Reconciling` (with Ready's reason and message) while not Ready, neither once Ready.
pub fn apply_ready(
    conditions: &mut Vec<Condition>,
    ready: &Desired,
    generation: Option<i64>,
    now: Timestamp,
) {
    apply(conditions, ready, generation, now);
    let kstatus = match (
        ready.status,
        STALLED_REASONS.contains(&ready.reason.as_str()),
    ) {
        (true, _) => None,
        (false, true) => Some(STALLED),
        (false, false) => Some(RECONCILING),
    };
    conditions.retain(|c| {
        !(c.type_ == RECONCILING || c.type_ == STALLED) || Some(c.type_.as_str()) == kstatus
    });
    if let Some(type_) = kstatus {
        let desired = Desired {
            type_,
            status: true,
            reason: ready.reason.clone(),
            message: ready.message.clone(),
        };
        apply(conditions, &desired, generation, now);
    }
}

/// The `Ready` condition, if present.
pub fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == READY)
}

/// True when `Ready` is `True`.
pub fn is_ready(conditions: &[Condition]) -> bool {
    ready(conditions).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:02:00Z".parse().unwrap();
        let mut conditions = Vec::new();
        apply(
            &mut conditions,
            &Desired::not_ready("Pending", "waiting"),
            Some(1),
            t0,
        );
        apply(
            &mut conditions,
            &Desired::not_ready("StillPending", "still"),
            Some(2),
            t1,
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, Time(t0));
        assert_eq!(conditions[0].reason, "StillPending");
        assert_eq!(conditions[0].observed_generation, Some(2));
        apply(
            &mut conditions,
            &Desired::ready("Resolved", "ok"),
            Some(2),
            t2,
        );
        assert_eq!(conditions[0].last_transition_time, Time(t2));
        assert!(is_ready(&conditions));
    }

    fn types(conditions: &[Condition]) -> Vec<(&str, &str, &str)> {
        conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect()
    }

    #[test]
    fn ready_carries_the_kstatus_pair() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:02:00Z".parse().unwrap();
        let mut conditions = Vec::new();
        // Waiting for something else: Reconciling.
        let pending = Desired::not_ready("ArtifactPending", "loading");
        apply_ready(&mut conditions, &pending, Some(1), t0);
        assert_eq!(
            types(&conditions),
            [
                ("Ready", "False", "ArtifactPending"),
                ("Reconciling", "True", "ArtifactPending")
            ]
        );
        assert_eq!(conditions[1].message, "loading");
        assert_eq!(conditions[1].observed_generation, Some(1));
        // A fault of the object: Stalled replaces Reconciling; Ready keeps its transition time.
        let bad = Desired::not_ready("DigestMismatch", "sha256:aa is not sha256:bb");
        apply_ready(&mut conditions, &bad, Some(2), t1);
        assert_eq!(
            types(&conditions),
            [
                ("Ready", "False", "DigestMismatch"),
                ("Stalled", "True", "DigestMismatch")
            ]
        );
        assert_eq!(conditions[0].last_transition_time, Time(t0));
        assert_eq!(conditions[1].last_transition_time, Time(t1));
        // Still stalled at the next reconcile: nothing moves.
        apply_ready(&mut conditions, &bad, Some(2), t2);
        assert_eq!(conditions[1].last_transition_time, Time(t1));
        // Ready: both kstatus conditions go.
        apply_ready(
            &mut conditions,
            &Desired::ready("Resolved", "ok"),
            Some(3),
            t2,
        );
        assert_eq!(types(&conditions), [("Ready", "True", "Resolved")]);
    }
}
